"""What the access log costs the proxy per request, with and without its Kafka sink ([logging.access_log_kafka]).

``python -m bench.accesslog_sink [--records 100000] [--repeats 5]``

``AccessLog.record()`` is timed on the proxy's side only (what the event loop pays per request), in one run,
against a real broker from rig/ for the sink cases: one JSON line per case, ``{"bench": "accesslog_sink", "case",
"us_per_record"}`` (the best of ``--repeats`` runs of ``--records`` calls), then a summary with every case.

Cases: ``off``; ``file`` (a file, as today); ``kafka`` (destination off, the sink on: the line is formatted and
handed to librdkafka's queue); ``file+kafka``; ``kafka_buffer_full`` (the sink's buffer full, the broker stopped:
every event is dropped and counted - the cost during an outage).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from proxy.accesslog import AccessLog, configure_logging
from proxy.accesslog_kafka import KafkaAccessLogSink
from proxy.config import load_settings
from proxy.metrics import Metrics
from rig.kafka import KafkaBroker

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


async def _run(records: int, repeats: int, broker: KafkaBroker, tmp: Path) -> dict[str, float]:
    base = load_settings(None, env={})
    sink_settings = base.with_overrides({
        "logging.access_log_kafka.enabled": True,
        "logging.access_log_kafka.bootstrap_servers": [broker.bootstrap],
        "logging.access_log_kafka.topic": "bench-access-log",
        # room for every record of every repeat: the healthy cases never drop
        "logging.access_log_kafka.buffer_events": records * repeats + 1,
        "logging.access_log_kafka.buffer_bytes": 2**31 - 1,
    }).logging.access_log_kafka
    loop = asyncio.get_running_loop()
    results: dict[str, float] = {}
    results["off"] = _time(AccessLog("off"), records, repeats)
    file_log = AccessLog(str(tmp / "access.jsonl"))
    results["file"] = _time(file_log, records, repeats)
    metrics = Metrics()
    sink = KafkaAccessLogSink(sink_settings, [], metrics)
    sink.start(loop)
    kafka_log = AccessLog("off")
    kafka_log.attach_sink(sink)
    results["kafka"] = _time(kafka_log, records, repeats)
    await sink.close(60)
    sink = KafkaAccessLogSink(sink_settings, [], Metrics())
    sink.start(loop)
    file_log.attach_sink(sink)
    results["file+kafka"] = _time(file_log, records, repeats)
    file_log.detach_sink()
    file_log.close()
    await sink.close(60)
    broker.stop()
    full = KafkaAccessLogSink(sink_settings.model_copy(update={"buffer_events": 1}), [], metrics)
    full.start(loop)
    full_log = AccessLog("off")
    full_log.attach_sink(full)
    full.offer("{}\n")  # fills the buffer of one
    results["kafka_buffer_full"] = _time(full_log, records, repeats)
    await full.close(0)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    # the sink's operational events go to stderr: stdout carries only the JSON lines
    configure_logging(load_settings(None, env={}).logging.model_copy(update={"access_log": "off"}))
    with KafkaBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        results = asyncio.run(_run(args.records, args.repeats, broker, Path(tmp)))
    for case, us in results.items():
        print(json.dumps({"bench": "accesslog_sink", "case": case, "us_per_record": round(us, 3)}))
    # what turning the sink on adds to a proxy that already writes a file
    added = results["file+kafka"] - results["file"]
    print(json.dumps({"summary": "accesslog_sink", **{k: round(v, 3) for k, v in results.items()},
                      "kafka_added_us": round(added, 3)}))


if __name__ == "__main__":
    main()
