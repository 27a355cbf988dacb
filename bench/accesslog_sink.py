"""What the access log costs the proxy per request, with and without its Kafka sink ([logging.access_log_kafka]).

``python -m bench.accesslog_sink [--records 100000] [--repeats 5]``

``AccessLog.record()`` is timed on the proxy's side only (what the event loop pays per request), in one run,
against a real broker from rig/ for the sink cases: one JSON line per case, ``{"bench": "accesslog_sink", "case",
"us_per_record"}`` (the best of ``--repeats`` runs of ``--records`` calls), then a summary with every case.

Cases: ``off``; ``file`` (a file, as today); ``kafka`` (destination off, the sink on: the line is formatted and
handed to librdkafka's queue); ``file+kafka``; ``kafka_buffer_full`` (the sink's buffer full, the broker stopped:
every event is dropped and counted - the cost during an outage).

The summary carries what the run checked (bench/support/verdict.py), line by line (each record offered has its own
correlation id): the file holds the lines offered to it, each once, in order; the topic (read by offset to its end,
before the broker stops) the lines offered to the two healthy sinks, each once (``lost``, ``duplicated``,
``out_of_order``, ``unexpected``); the healthy sinks dropped none, and the full one counted every line it dropped
in ``sluice_access_log_dropped_total``. The exit status is 1 when any of it failed. No goal is set (``"goals":
{}``). ``--smoke``: 2,000 records, 2 repeats.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bench.support.verdict import Delivery, add_options, delivery, emit, exit_status, summary
from proxy.accesslog import AccessLog, configure_logging
from proxy.accesslog_kafka import KafkaAccessLogSink
from proxy.app import load_settings
from proxy.metrics import Metrics
from rig.kafka import KafkaBroker, read_topic

TOPIC = "bench-access-log"
FIELDS: dict[str, Any] = dict(
    conn_id=12, client_id="consumer-orders-1", api="Fetch", api_key=1, version=15, correlation_id=4711,
    bytes_client_to_proxy=120, bytes_proxy_to_upstream=120, bytes_upstream_to_proxy=1_048_700,
    bytes_proxy_to_client=1_048_700, latency_ms=0.734, error_codes=[], listener="broker-1",
    upstream="10.0.0.1:9092", decoded=False,
)


class Case:
    """The records one case offers, each its own correlation id (from ``first`` on, built before the timing: a call
    costs what ``record(**FIELDS)`` does), so the lines can be checked one by one."""

    def __init__(self, first: int, records: int, repeats: int) -> None:
        self.calls = [[{**FIELDS, "correlation_id": first + r * records + i} for i in range(records)]
                      for r in range(repeats)]
        self.ids = [c["correlation_id"] for calls in self.calls for c in calls]

    def time(self, log: AccessLog) -> float:
        """The best run's microseconds per record."""
        best = float("inf")
        record = log.record
        for calls in self.calls:
            started = time.perf_counter()
            for fields in calls:
                record(**fields)
            best = min(best, time.perf_counter() - started)
        return best / len(self.calls[0]) * 1e6


def _dropped(metrics: Metrics) -> int:
    """Lines the sinks counted as dropped in ``metrics``, for any reason."""
    return int(sum(sample.value for family in metrics.access_log_dropped.collect() for sample in family.samples
                   if sample.name.endswith("_total")))


def _ids(lines: Iterable[bytes | str | None]) -> list[int]:
    """The correlation ids of access-log lines, in order (a line that is not one of the cases' counts as -1)."""
    return [int(json.loads(line).get("correlation_id", -1)) if line else -1 for line in lines]


async def _run(records: int, repeats: int, broker: KafkaBroker, tmp: Path
               ) -> tuple[dict[str, float], Delivery, dict[str, bool]]:
    """Each case's microseconds per record; what the file and the topic hold of the lines offered to them, line by
    line (the file in order; the topic each once); the drop counts' checks."""
    base = load_settings(None, env={})
    sink_settings = base.with_overrides({
        "logging.access_log_kafka.enabled": True,
        "logging.access_log_kafka.bootstrap_servers": [broker.bootstrap],
        "logging.access_log_kafka.topic": TOPIC,
        # room for every record of every repeat: the healthy cases never drop
        "logging.access_log_kafka.buffer_events": records * repeats + 1,
        "logging.access_log_kafka.buffer_bytes": 2**31 - 1,
    }).logging.access_log_kafka
    offered = records * repeats  # lines per case
    cases = {name: Case(i * offered, records, repeats)
             for i, name in enumerate(("off", "file", "kafka", "file+kafka", "kafka_buffer_full"))}
    loop = asyncio.get_running_loop()
    results: dict[str, float] = {}
    results["off"] = cases["off"].time(AccessLog("off"))
    path = tmp / "access.jsonl"
    file_log = AccessLog(str(path))
    results["file"] = cases["file"].time(file_log)
    healthy = Metrics()  # the two healthy sinks' drops
    sink = KafkaAccessLogSink(sink_settings, [], healthy)
    sink.start(loop)
    kafka_log = AccessLog("off")
    kafka_log.attach_sink(sink)
    results["kafka"] = cases["kafka"].time(kafka_log)
    kafka_log.detach_sink()
    await sink.close(60)
    sink = KafkaAccessLogSink(sink_settings, [], healthy)
    sink.start(loop)
    file_log.attach_sink(sink)
    results["file+kafka"] = cases["file+kafka"].time(file_log)
    file_log.detach_sink()
    file_log.close()
    await sink.close(60)
    # the file and file+kafka cases write the file, in order; the two healthy sinks the topic, each line once
    in_file = delivery({0: cases["file"].ids + cases["file+kafka"].ids}, {0: _ids(path.read_bytes().splitlines())})
    topic = read_topic(broker.bootstrap, TOPIC)
    in_topic = delivery({0: cases["kafka"].ids + cases["file+kafka"].ids},
                        {0: sorted(_ids(value for p in topic.values() for _, _, value in p))})
    healthy_dropped = _dropped(healthy)
    broker.stop()
    outage = Metrics()
    full = KafkaAccessLogSink(sink_settings.model_copy(update={"buffer_events": 1}), [], outage)
    full.start(loop)
    full_log = AccessLog("off")
    full_log.attach_sink(full)
    full.offer("{}\n")  # fills the buffer of one
    results["kafka_buffer_full"] = cases["kafka_buffer_full"].time(full_log)
    full_log.detach_sink()
    await full.close(0)
    return results, in_file + in_topic, {
        "healthy_sinks_dropped_none": healthy_dropped == 0,
        # every line, and the one that filled the buffer (stopped at close)
        "full_sink_counted_every_drop": _dropped(outage) == offered + 1}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    add_options(parser, "2,000 records, 2 repeats")
    args = parser.parse_args(argv)
    if args.smoke:
        args.records, args.repeats = 2000, 2
    # the sink's operational events go to stderr: stdout carries only the JSON lines
    configure_logging(load_settings(None, env={}).logging.model_copy(update={"access_log": "off"}))
    with KafkaBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        results, check, checks = asyncio.run(_run(args.records, args.repeats, broker, Path(tmp)))
    for case, us in results.items():
        emit({"bench": "accesslog_sink", "case": case, "us_per_record": round(us, 3)})
    # what turning the sink on adds to a proxy that already writes a file; no goal is set for it
    line = summary("accesslog_sink", {**{k: round(v, 3) for k, v in results.items()},
                                      "kafka_added_us": round(results["file+kafka"] - results["file"], 3)}, {},
                   check=check, checks=checks)
    emit(line)
    return exit_status(line, args.check)


if __name__ == "__main__":
    sys.exit(main())
