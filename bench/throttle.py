"""Throttle accuracy: the byte rate a throttled fetcher gets through Sluice, per second and over Kafka's 11 s
quota window, for leader throttles of 1, 5 and 20 MB/s (KIP-73 policy, proxy/policies/throttle.py).

``python -m bench.throttle [--seconds 30] [--throttles 1,5,20] [--mib 64]``

One rig broker, one topic (4 partitions, ``--mib`` MiB of 16 KiB records produced once, directly). For each
throttle a fresh Sluice subprocess starts with ``[throttle] leader_rate_bytes`` = the throttle, the topic listed
with ``replicas = "*"`` and ``[[throttle.consumers]] client_id = "bench-*"``. A raw session-less fetch loop
(one connection, Fetch v12, responses of at most max(64 KiB, throttle / 8)) reads the topic for ``--seconds``,
starting again at offset 0 when it reaches the end, and timestamps the record bytes of every response.

JSON lines: one per second per throttle (``target_bytes_s``, ``measured_bytes_s``), one per throttle
(``mean_bytes_s``, ``worst_window_error``); last line ``{"summary": "throttle", "worst_window_error": ...}``:
the maximum over throttles and over every 11 s window (sliding by 1 s) of |achieved / target - 1|.
Goal: <= 0.10.
"""

from __future__ import annotations

import argparse
import json
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

from proxy.wire.records import walk_batches
from rig.kafka import KafkaBroker
from rig.sluice_process import SluiceProcess
from tests.support.raw import RawClient

PARTITIONS = 4
RECORD = 16 * 1024
MB = 1_000_000
WINDOW = 11  # seconds: Kafka's replication quota window (11 samples x 1 s)


def emit(line: dict[str, Any]) -> None:
    print(json.dumps(line), flush=True)


def produce(bootstrap: str, topic: str, mib: int) -> dict[int, int]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, batch_size=RECORD + 512, acks=1)
    payload = b"t" * RECORD
    n = mib * (1 << 20) // RECORD
    for i in range(n):
        producer.send(topic, value=payload, partition=i % PARTITIONS)
    producer.flush(300)
    producer.close()
    return {p: n // PARTITIONS + (1 if p < n % PARTITIONS else 0) for p in range(PARTITIONS)}


def drain(port: int, topic: str, ends: dict[int, int], seconds: float, max_bytes: int) -> list[tuple[float, int]]:
    """(time since start, record bytes) per response, for ``seconds``."""
    samples: list[tuple[float, int]] = []
    offsets = {p: 0 for p in ends}
    with RawClient("127.0.0.1", port, client_id="bench-throttle") as c:
        c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        start = time.monotonic()
        while (now := time.monotonic() - start) < seconds:
            view = c.fetch(12, topic, offsets, max_bytes=max_bytes, partition_max_bytes=max_bytes,
                           max_wait_ms=500)
            got = 0
            for _, part in view.partitions():
                walk = walk_batches(part.records or b"")
                if walk.batches:
                    offsets[part.partition_index] = walk.batches[-1].next_offset
                got += walk.complete_size
                if offsets[part.partition_index] >= ends[part.partition_index]:
                    offsets[part.partition_index] = 0  # wrap around: the bench only needs bytes
            if got:
                samples.append((time.monotonic() - start, got))
            del now
    return samples


def run_throttle(broker: KafkaBroker, topic: str, ends: dict[int, int], target: int, seconds: int,
                 tmp: Path) -> float:
    config = tmp / f"sluice-{target}.toml"
    config.write_text(f'[throttle]\nleader_rate_bytes = {target}\n[[throttle.topics]]\ntopic = "{topic}"\n'
                      f'replicas = "*"\n[[throttle.consumers]]\nclient_id = "bench-*"\n')
    with SluiceProcess(broker.bootstrap, extra_env={"SLUICE_CONFIG": str(config)}) as sluice:
        samples = drain(sluice.bootstrap_port, topic, ends, seconds, max(64 * 1024, min(1 << 20, target // 8)))
        sluice.stop()
    per_second = [0] * seconds
    for t, n in samples:
        if int(t) < seconds:
            per_second[int(t)] += n
    for i, n in enumerate(per_second):
        emit({"throttle_mb_s": target / MB, "second": i, "target_bytes_s": target, "measured_bytes_s": n})
    errors = [abs(sum(per_second[s : s + WINDOW]) / WINDOW / target - 1)
              for s in range(0, max(1, seconds - WINDOW + 1))]
    worst = max(errors)
    emit({"throttle_mb_s": target / MB, "mean_bytes_s": sum(per_second) / seconds,
          "windows": len(errors), "worst_window_error": round(worst, 4)})
    return worst


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.throttle", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=30, help="measured seconds per throttle (default 30)")
    ap.add_argument("--throttles", default="1,5,20", help="MB/s, comma-separated (default 1,5,20)")
    ap.add_argument("--mib", type=int, default=64, help="MiB of records in the topic (default 64)")
    args = ap.parse_args(argv)
    if args.seconds < WINDOW:
        ap.error(f"--seconds must be at least one quota window ({WINDOW})")
    throttles = [int(float(x) * MB) for x in args.throttles.split(",")]
    with KafkaBroker() as broker, tempfile.TemporaryDirectory(prefix="bench-throttle-") as tmp:
        topic = f"bench-throttle-{int(time.time() * 1000)}"
        ends = produce(broker.bootstrap, topic, args.mib)
        worst = max(run_throttle(broker, topic, ends, t, args.seconds, Path(tmp)) for t in throttles)
    emit({"summary": "throttle", "seconds": args.seconds, "throttles_mb_s": [t / MB for t in throttles],
          "worst_window_error": round(worst, 4)})


if __name__ == "__main__":
    main()
