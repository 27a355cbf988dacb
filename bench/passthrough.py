"""Passthrough benchmark: what does putting Sluice between clients and a broker cost?

``python -m bench.passthrough [--mib 400] [--latency-records 2000]``

One run, one rig broker (started and stopped here), one Sluice subprocess (``python -m proxy run``, access log
off) in front of it. Measured against the same broker and the same data:

- consume throughput, direct vs through Sluice: Kafka's Java ConsumerPerformance (Fetch v17, fetch sessions)
  and confluent-kafka (librdkafka, Python), over ``--mib`` MiB of 1 KiB records produced once, directly, by the
  Java ProducerPerformance. Runs are ordered ABBA (direct, Sluice, Sluice, direct), twice, so drift cancels;
  the figure per path is the mean of its runs, after one unmeasured warm-up run per path;
- produce latency, direct vs through Sluice: confluent-kafka sending small records one at a time (acks=1,
  linger 0, each awaited with flush()); direct and proxied sends alternate record by record; p50/p99;
- Sluice's CPU seconds per GiB relayed (psutil user+system time of the Sluice process across the proxied consume
  runs, divided by the bytes it wrote to clients, from its own sluice_bytes_total).

Prints one JSON line per measurement; the last line is
``{"summary": "passthrough", "consume_ratio": ..., "added_p50_ms": ..., "cpu_s_per_gib": ...}`` where
consume_ratio is proxied/direct MB/s of the Java consumer (the issue's goal: >= 0.9) and added_p50_ms is the
p50 produce latency through Sluice minus direct (goal: <= 0.1 ms). Sized for a 2-core machine: well under
5 minutes end to end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import psutil
from confluent_kafka import Consumer, Producer, TopicPartition

from rig.java_tools import JavaTools
from rig.kafka import KafkaBroker
from rig.sluice_process import SluiceProcess

RECORD_SIZE = 1024
PARTITIONS = 3
GIB = float(1 << 30)
ROUNDS = 2  # ABBA rounds per client: 2 x 2 measured runs per path
BUDGET_S = 280.0  # the whole bench must stay below 5 minutes


def emit(line: dict[str, Any]) -> None:
    print(json.dumps(line), flush=True)


class Budget:
    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def check(self, what: str) -> None:
        if self.left() <= 0:
            raise SystemExit(f"bench.passthrough: over its {BUDGET_S:.0f} s budget before {what}")


class CpuMeter:
    """Sluice's CPU seconds and client-bound bytes across the measured (proxied) runs."""

    def __init__(self, sluice: SluiceProcess) -> None:
        self.sluice = sluice
        self.proc = psutil.Process(sluice.pid)
        self.cpu_s = 0.0
        self.bytes = 0.0

    def _sample(self) -> tuple[float, float]:
        t = self.proc.cpu_times()
        return t.user + t.system, self.sluice.metric("sluice_bytes_total", {"direction": "proxy_to_client"})

    def measure(self, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        cpu0, b0 = self._sample()
        result = fn()
        cpu1, b1 = self._sample()
        self.cpu_s += cpu1 - cpu0
        self.bytes += b1 - b0
        result["sluice_cpu_s"] = round(cpu1 - cpu0, 3)
        result["sluice_bytes_to_client"] = int(b1 - b0)
        if b1 > b0:
            result["sluice_cpu_s_per_gib"] = round((cpu1 - cpu0) / ((b1 - b0) / GIB), 3)
        return result


# -------------------------------------------------------------------------------------------- consumers


def java_consume(tools: JavaTools, bootstrap: str, topic: str, records: int) -> dict[str, Any]:
    r = tools.consumer_perf(bootstrap, topic, messages=records, group=f"perf-{uuid.uuid4().hex[:8]}",
                            timeout=120)
    if r.records < records:
        raise SystemExit(f"ConsumerPerformance read {r.records} of {records} records:\n{r.stderr[-2000:]}")
    # fetch.MB.sec excludes the group join (rebalance) time: the figure that is about moving bytes.
    return {"mb_per_s": r.metrics.get("fetch_MB_sec", r.mb_per_sec), "total_mb_per_s": r.mb_per_sec,
            "records": r.records, "mb": r.metrics.get("data_consumed_in_MB")}


def confluent_consume(bootstrap: str, topic: str, records: int, deadline_s: float) -> dict[str, Any]:
    """Read every record from the beginning with explicit assignment (no group: nothing but fetching)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                  "enable.auto.commit": False, "fetch.wait.max.ms": 100})
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    got = 0
    nbytes = 0
    start: float | None = None
    deadline = time.monotonic() + deadline_s
    try:
        while got < records and time.monotonic() < deadline:
            for m in c.consume(num_messages=10_000, timeout=1.0):
                if m.error() is not None:
                    continue
                if start is None:
                    start = time.perf_counter()
                got += 1
                nbytes += len(m.value() or b"")
        end = time.perf_counter()
    finally:
        c.close()
    if got < records or start is None:
        raise SystemExit(f"confluent-kafka read {got} of {records} records in {deadline_s:.0f} s")
    # From the first record to the last: connection and metadata set-up are not throughput.
    return {"mb_per_s": nbytes / (1 << 20) / (end - start), "records": got, "mb": nbytes / (1 << 20)}


def abba(direct: Callable[[], dict[str, Any]], proxied: Callable[[], dict[str, Any]], meter: CpuMeter,
         client: str, budget: Budget) -> tuple[float, float]:
    """One unmeasured warm-up run per path (JIT, page cache, connections), then ROUNDS x (direct, proxied,
    proxied, direct); emit each; return the mean MB/s (direct, proxied)."""
    figures: dict[str, list[float]] = {"direct": [], "sluice": []}
    for path, fn in (("direct", direct), ("sluice", proxied)):
        budget.check(f"{client} warm-up")
        result = fn()
        emit({"bench": "passthrough", "measure": "warmup", "client": client, "path": path,
              "mb_per_s": round(result["mb_per_s"], 3)})
    for run, path in enumerate(("direct", "sluice", "sluice", "direct") * ROUNDS, start=1):
        budget.check(f"{client} consume run {run}")
        result = meter.measure(proxied) if path == "sluice" else direct()
        figures[path].append(result["mb_per_s"])
        emit({"bench": "passthrough", "measure": "consume", "client": client, "path": path, "run": run,
              **{k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}})
    d, s = statistics.fmean(figures["direct"]), statistics.fmean(figures["sluice"])
    emit({"bench": "passthrough", "measure": "consume", "client": client, "direct_mb_per_s": round(d, 2),
          "sluice_mb_per_s": round(s, 2), "ratio": round(s / d, 3)})
    return d, s


# ---------------------------------------------------------------------------------------- produce latency


def produce_latency(direct_bootstrap: str, sluice_bootstrap: str, topic: str, records: int,
                    warmup: int, budget: Budget) -> tuple[dict[str, float], dict[str, float]]:
    """Alternate direct and proxied synchronous sends; latency percentiles (ms) of each path."""
    config = {"acks": "1", "linger.ms": 0, "batch.num.messages": 1, "enable.idempotence": False}
    producers = {"direct": Producer({"bootstrap.servers": direct_bootstrap, **config}),
                 "sluice": Producer({"bootstrap.servers": sluice_bootstrap, **config})}
    samples: dict[str, list[float]] = {"direct": [], "sluice": []}
    value = b"v" * 100
    errors: list[object] = []

    def on_delivery(err: object, _msg: object) -> None:
        if err is not None:
            errors.append(err)

    for i in range(warmup + records):
        if i % 200 == 0:
            budget.check("produce latency")
        for path in (("direct", "sluice") if i % 2 == 0 else ("sluice", "direct")):
            p = producers[path]
            t0 = time.perf_counter()
            p.produce(topic, value=value, key=b"k%d" % i, partition=0, on_delivery=on_delivery)
            if p.flush(10) != 0:
                raise SystemExit(f"{path} producer: record {i} not delivered within 10 s")
            if i >= warmup:
                samples[path].append((time.perf_counter() - t0) * 1000.0)
    if errors:
        raise SystemExit(f"delivery errors: {errors[:5]}")

    def pct(xs: list[float]) -> dict[str, float]:
        q = statistics.quantiles(xs, n=100, method="inclusive")
        return {"p50_ms": round(statistics.median(xs), 4), "p99_ms": round(q[98], 4),
                "mean_ms": round(statistics.fmean(xs), 4), "records": len(xs)}

    return pct(samples["direct"]), pct(samples["sluice"])


# ------------------------------------------------------------------------------------------------- main


def sluice_api_counts(sluice: SluiceProcess) -> dict[str, Any]:
    """Fetch/Produce request counts by version and rewritten-response counts, from Sluice's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    requests: dict[str, int] = {}
    rewritten: dict[str, int] = {}
    for family in text_string_to_metric_families(sluice.metrics_text()):
        for sample in family.samples:
            api = sample.labels.get("api")
            if sample.name == "sluice_requests_total" and api in ("Fetch", "Produce"):
                requests[f"{api} v{sample.labels['version']}"] = int(sample.value)
            elif sample.name == "sluice_responses_rewritten_total" and api in ("Fetch", "Produce"):
                rewritten[api] = int(sample.value)
    return {"requests": requests, "rewritten": rewritten}



def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.passthrough", description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=400, help="MiB of 1 KiB records to consume per run (default 400)")
    ap.add_argument("--latency-records", type=int, default=2000, help="measured sends per path (default 2000)")
    args = ap.parse_args(argv)
    budget = Budget(BUDGET_S)
    records = args.mib * (1 << 20) // RECORD_SIZE
    t_start = time.monotonic()

    tools = JavaTools()
    with KafkaBroker() as broker:
        emit({"bench": "passthrough", "event": "broker_started", "bootstrap": broker.bootstrap,
              "start_s": round(broker.last_start_seconds or 0.0, 2)})
        topic = f"bench-{uuid.uuid4().hex[:8]}"
        tools.create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
        produced = tools.producer_perf(broker.bootstrap, topic, num_records=records, record_size=RECORD_SIZE,
                                       producer_props={"acks": 1, "linger.ms": 20, "batch.size": 262144,
                                                       "compression.type": "none"}, timeout=150)
        emit({"bench": "passthrough", "event": "produced", "records": produced.records,
              "mb_per_s": produced.mb_per_sec, "mib": args.mib})

        with SluiceProcess(broker.bootstrap) as sluice:
            meter = CpuMeter(sluice)
            java_d, java_s = abba(
                lambda: java_consume(tools, broker.bootstrap, topic, records),
                lambda: java_consume(tools, sluice.bootstrap, topic, records),
                meter, "java-consumer-perf", budget)
            left = max(10.0, budget.left() / 2)
            abba(
                lambda: confluent_consume(broker.bootstrap, topic, records, left),
                lambda: confluent_consume(sluice.bootstrap, topic, records, left),
                meter, "confluent-kafka", budget)
            cpu_s_per_gib = meter.cpu_s / (meter.bytes / GIB) if meter.bytes else float("nan")
            emit({"bench": "passthrough", "measure": "sluice_cpu", "cpu_s": round(meter.cpu_s, 3),
                  "gib_relayed": round(meter.bytes / GIB, 3), "cpu_s_per_gib": round(cpu_s_per_gib, 3)})

            lat_topic = f"bench-lat-{uuid.uuid4().hex[:8]}"
            tools.create_topic(broker.bootstrap, lat_topic, partitions=1)
            direct, proxied = produce_latency(broker.bootstrap, sluice.bootstrap, lat_topic,
                                              args.latency_records, warmup=200, budget=budget)
            emit({"bench": "passthrough", "measure": "produce_latency", "client": "confluent-kafka",
                  "path": "direct", **direct})
            emit({"bench": "passthrough", "measure": "produce_latency", "client": "confluent-kafka",
                  "path": "sluice", **proxied})
            added_p50 = proxied["p50_ms"] - direct["p50_ms"]
            added_p99 = proxied["p99_ms"] - direct["p99_ms"]
            emit({"bench": "passthrough", "measure": "produce_latency", "added_p50_ms": round(added_p50, 4),
                  "added_p99_ms": round(added_p99, 4)})
            emit({"bench": "passthrough", "measure": "sluice_requests", "note": "APIs/versions the clients used; "
                  "rewritten = responses Sluice decoded and re-encoded instead of streaming",
                  **sluice_api_counts(sluice)})
            code = sluice.stop()
            if code != 0:
                raise SystemExit(f"sluice exited with {code}:\n{sluice.stderr_text()[-3000:]}")
    tools.close()
    emit({"bench": "passthrough", "event": "done", "elapsed_s": round(time.monotonic() - t_start, 1)})
    emit({"summary": "passthrough", "consume_ratio": round(java_s / java_d, 3), "added_p50_ms": round(added_p50, 4),
          "cpu_s_per_gib": round(cpu_s_per_gib, 3)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
