"""Upstream offload of ``[sessions] mode = "terminate"``: a session-less client (confluent-kafka / librdkafka)
idly polling many partitions, bytes per second on the Sluice<->broker link, with and without Sluice's own
fetch session.

``python -m bench.sessions [--partitions 1000] [--busy 3] [--seconds 10]``

One rig broker, ``--partitions`` partitions (one topic, or topics of 5,000: KRaft refuses larger CreateTopics
batches); a background producer writes a small record to each of ``--busy`` partitions every 50 ms. A
confluent-kafka consumer is assigned every partition (from the end, no group) and polls for ``--seconds`` after a
warm-up, twice in the same run, each time through a fresh in-process Sluice:

- ``direct``: Sluice in passthrough mode. It relays Fetch requests and responses byte for byte (the stream
  path), so its upstream bytes (``sluice_bytes_total{direction="proxy_to_upstream"|"upstream_to_proxy"}``) are
  exactly what the same client exchanges with the broker directly;
- ``terminate``: Sluice in terminate mode; the upstream bytes are what the Sluice<->broker link carries.

Bytes are counted over the measured window only: after the warm-up (at least ``--warmup`` seconds and 5 Fetch
requests, so it includes the first, full fetch).
The proxy's CPU is its event-loop thread's CPU time (psutil, by native thread id) per Fetch request.

JSON lines per mode; last line ``{"summary": "sessions", "partitions": ..., "upstream_ratio": ...}`` where
upstream_ratio = upstream bytes/s in terminate mode / upstream bytes/s in direct mode (requests + responses).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from typing import Any

import psutil
from confluent_kafka import Consumer, Producer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic

from proxy import metrics
from rig.kafka import KafkaBroker
from tests.support.proxy import ProxyThread


def emit(line: dict[str, Any]) -> None:
    print(json.dumps(line), flush=True)


def snapshot() -> dict[str, float]:
    out: dict[str, float] = {d: metrics.total("sluice_bytes_total", direction=d) for d in metrics.DIRECTIONS}
    out["fetches"] = metrics.total("sluice_requests_total", api="Fetch")
    out["full"] = metrics.total("sluice_upstream_fetch_requests_total", kind="full")
    out["incremental"] = metrics.total("sluice_upstream_fetch_requests_total", kind="incremental")
    return out


class Traffic:
    """A few busy partitions: one small record each every ``period`` seconds until stopped."""

    def __init__(self, bootstrap: str, topic: str, partitions: list[int], period: float = 0.05) -> None:
        self._stop = threading.Event()
        self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
        self._thread = threading.Thread(target=self._run, args=(topic, partitions, period), daemon=True)
        self._thread.start()

    def _run(self, topic: str, partitions: list[int], period: float) -> None:
        i = 0
        while not self._stop.wait(period):  # a producer's pace, not synchronisation
            for p in partitions:
                self._producer.produce(topic, value=f"v{i}".encode(), partition=p)
            self._producer.poll(0)
            i += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._producer.flush(10)


def thread_cpu(native_id: int | None) -> float:
    for t in psutil.Process().threads():
        if t.id == native_id:
            return float(t.user_time + t.system_time)
    return 0.0


PER_TOPIC = 5000
MAX_WARMUP_S = 300.0
WARM_FETCHES = 5


def layout(prefix: str, partitions: int) -> list[tuple[str, int]]:
    """(topic, partition count) covering ``partitions`` partitions."""
    return [(f"{prefix}-{i}", min(PER_TOPIC, partitions - i * PER_TOPIC))
            for i in range((partitions + PER_TOPIC - 1) // PER_TOPIC)]


def run_mode(mode: str, broker: KafkaBroker, topics: list[tuple[str, int]], partitions: int, warmup: float,
             seconds: float) -> dict[str, Any]:
    with ProxyThread(broker.bootstrap, **{"sessions.mode": "terminate" if mode == "terminate" else "passthrough"}
                     ) as sluice:
        consumer = Consumer({"bootstrap.servers": sluice.bootstrap, "group.id": f"bench-{mode}",
                             "enable.auto.commit": False, "fetch.wait.max.ms": 500})
        consumer.assign([TopicPartition(t, p, -1) for t, n in topics for p in range(n)])  # -1: from the end
        records = 0
        # warm-up: at least ``warmup`` seconds and until the consumer fetches steadily (with 10,000 partitions
        # librdkafka first spends a while on metadata and offset lookups), bounded
        start, fetches0 = time.monotonic(), metrics.total("sluice_requests_total", api="Fetch")
        while time.monotonic() - start < MAX_WARMUP_S and (
                time.monotonic() - start < warmup
                or metrics.total("sluice_requests_total", api="Fetch") - fetches0 < WARM_FETCHES):
            if (m := consumer.poll(0.1)) is not None and not m.error():
                records += 1
        before, cpu0, t0 = snapshot(), thread_cpu(sluice._thread.native_id), time.monotonic()
        end = t0 + seconds
        while time.monotonic() < end:
            if (m := consumer.poll(0.1)) is not None and not m.error():
                records += 1
        after, cpu1, t1 = snapshot(), thread_cpu(sluice._thread.native_id), time.monotonic()
        consumer.close()
    d = {k: after[k] - before[k] for k in after}
    span = t1 - t0
    fetches = max(d["fetches"], 1.0)
    line = {"mode": mode, "partitions": partitions, "seconds": round(span, 2), "fetches": int(d["fetches"]),
            "records": records,
            "upstream_bytes_per_s": round((d["proxy_to_upstream"] + d["upstream_to_proxy"]) / span),
            "upstream_request_bytes_per_s": round(d["proxy_to_upstream"] / span),
            "upstream_response_bytes_per_s": round(d["upstream_to_proxy"] / span),
            "client_bytes_per_s": round((d["client_to_proxy"] + d["proxy_to_client"]) / span),
            "upstream_full_fetches": int(d["full"]), "upstream_incremental_fetches": int(d["incremental"]),
            "proxy_cpu_ms_per_fetch": round((cpu1 - cpu0) * 1000 / fetches, 3)}
    emit(line)
    return line


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partitions", type=int, default=1000)
    ap.add_argument("--busy", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    args = ap.parse_args(argv)
    with KafkaBroker() as broker:
        topics = layout(f"sessions-bench-{args.partitions}", args.partitions)
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=300_000)
        for topic, n in topics:
            admin.create_topics([NewTopic(topic, num_partitions=n, replication_factor=1)], timeout_ms=300_000)
        admin.close()
        first, first_n = topics[0]
        busy = [p * (first_n // max(args.busy, 1)) for p in range(args.busy)]
        traffic = Traffic(broker.bootstrap, first, busy)
        try:
            direct = run_mode("direct", broker, topics, args.partitions, args.warmup, args.seconds)
            term = run_mode("terminate", broker, topics, args.partitions, args.warmup, args.seconds)
        finally:
            traffic.stop()
    ratio = term["upstream_bytes_per_s"] / max(direct["upstream_bytes_per_s"], 1)
    emit({"summary": "sessions", "partitions": args.partitions, "upstream_ratio": round(ratio, 4)})


if __name__ == "__main__":
    main()
