"""What the access log costs the proxy per request, with and without its Kafka sink ([logging.access_log_kafka]).

``python -m bench.accesslog_sink [--records 100000] [--repeats 5]``

``AccessLog.record()`` is timed on the proxy's side only (what the event loop pays per request), in one run,
against a real broker from rig/ for the sink cases: one JSON line per case, ``{"bench": "accesslog_sink", "case",
"us_per_record"}`` (the best of ``--repeats`` runs of ``--records`` calls), then a summary with every case.

Cases: ``off``; ``file`` (a file, as today); ``kafka`` (destination off, the sink on: the line is formatted and
handed to librdkafka's queue); ``file+kafka``; ``kafka_buffer_full`` (the sink's buffer full, the broker stopped:
every event is dropped and counted - the cost during an outage).

The summary carries what the run checked (``"lost": 0``), and the bench exits 1 before it otherwise: the file
holds one line per record offered to it (each a JSON object with the record's fields), and each sink accounts for
every line offered to it: delivered (the topic's end offsets, counted before the broker stops) or dropped and
counted in ``sluice_access_log_dropped_total``; the healthy sinks drop none, the full one drops every line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from proxy.accesslog import AccessLog, configure_logging
from proxy.accesslog_kafka import KafkaAccessLogSink
from proxy.app import load_settings
from proxy.metrics import Metrics
from rig.kafka import KafkaBroker, end_offsets

TOPIC = "bench-access-log"
FIELDS: dict[str, Any] = dict(
    conn_id=12, client_id="consumer-orders-1", api="Fetch", api_key=1, version=15, correlation_id=4711,
    bytes_client_to_proxy=120, bytes_proxy_to_upstream=120, bytes_upstream_to_proxy=1_048_700,
    bytes_proxy_to_client=1_048_700, latency_ms=0.734, error_codes=[], listener="broker-1",
    upstream="10.0.0.1:9092", decoded=False,
)


def _time(log: AccessLog, records: int, repeats: int) -> float:
    best = float("inf")
    record = log.record
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(records):
            record(**FIELDS)
        best = min(best, time.perf_counter() - started)
    return best / records * 1e6


def _dropped(metrics: Metrics) -> int:
    """Lines the sinks counted as dropped in ``metrics``, for any reason."""
    return int(sum(sample.value for family in metrics.access_log_dropped.collect() for sample in family.samples
                   if sample.name.endswith("_total")))


def _file_lines(path: Path) -> int:
    """Lines of the access-log file that hold the records' fields (each one JSON object)."""
    lines = path.read_text().splitlines()
    return sum(1 for line in lines if json.loads(line).get("correlation_id") == FIELDS["correlation_id"])


async def _run(records: int, repeats: int, broker: KafkaBroker, tmp: Path) -> tuple[dict[str, float], list[str]]:
    """Each case's microseconds per record, and what the checks found wrong (nothing, when all is well)."""
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
    loop = asyncio.get_running_loop()
    results: dict[str, float] = {}
    results["off"] = _time(AccessLog("off"), records, repeats)
    path = tmp / "access.jsonl"
    file_log = AccessLog(str(path))
    results["file"] = _time(file_log, records, repeats)
    healthy = Metrics()  # the two healthy sinks' drops
    sink = KafkaAccessLogSink(sink_settings, [], healthy)
    sink.start(loop)
    kafka_log = AccessLog("off")
    kafka_log.attach_sink(sink)
    results["kafka"] = _time(kafka_log, records, repeats)
    kafka_log.detach_sink()
    await sink.close(60)
    sink = KafkaAccessLogSink(sink_settings, [], healthy)
    sink.start(loop)
    file_log.attach_sink(sink)
    results["file+kafka"] = _time(file_log, records, repeats)
    file_log.detach_sink()
    file_log.close()
    await sink.close(60)
    wrong: list[str] = []
    in_file = _file_lines(path)
    if in_file != 2 * offered:  # the file and file+kafka cases write the same file
        wrong.append(f"file: {in_file} lines of {2 * offered} offered")
    delivered = sum(end_offsets(broker.bootstrap, TOPIC).values())
    if delivered != 2 * offered or _dropped(healthy):
        wrong.append(f"kafka, file+kafka: {delivered} delivered and {_dropped(healthy)} dropped "
                     f"of {2 * offered} offered")
    broker.stop()
    outage = Metrics()
    full = KafkaAccessLogSink(sink_settings.model_copy(update={"buffer_events": 1}), [], outage)
    full.start(loop)
    full_log = AccessLog("off")
    full_log.attach_sink(full)
    full.offer("{}\n")  # fills the buffer of one
    results["kafka_buffer_full"] = _time(full_log, records, repeats)
    full_log.detach_sink()
    await full.close(0)
    if _dropped(outage) != offered + 1:  # every line, and the one that filled the buffer (stopped at close)
        wrong.append(f"kafka_buffer_full: {_dropped(outage)} dropped of {offered + 1} offered")
    return results, wrong


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    # the sink's operational events go to stderr: stdout carries only the JSON lines
    configure_logging(load_settings(None, env={}).logging.model_copy(update={"access_log": "off"}))
    with KafkaBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        results, wrong = asyncio.run(_run(args.records, args.repeats, broker, Path(tmp)))
    for case, us in results.items():
        print(json.dumps({"bench": "accesslog_sink", "case": case, "us_per_record": round(us, 3)}))
    if wrong:
        print(json.dumps({"bench": "accesslog_sink", "error": "lines lost", "wrong": wrong}), flush=True)
        sys.exit(1)
    # what turning the sink on adds to a proxy that already writes a file
    added = results["file+kafka"] - results["file"]
    print(json.dumps({"summary": "accesslog_sink", "lost": 0, **{k: round(v, 3) for k, v in results.items()},
                      "kafka_added_us": round(added, 3)}))


if __name__ == "__main__":
    main()
