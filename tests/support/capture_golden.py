"""Capture golden frames: real clients through Sluice to a real Kafka 4.x broker, frames saved to tests/data.

    .venv/bin/python -m tests.support.capture_golden          # rewrites tests/data/golden/

Requests come from kafka-python, aiokafka, confluent-kafka (librdkafka) and the Java console tools; responses
from the broker. Each file is one frame without its 4-byte size prefix, named
``<Api>-v<version>-<request|response>-<n>.bin``; at most ``PER_KEY`` frames are kept per (api, version,
direction) and none over ``MAX_BYTES``, so the set stays small but covers every version the clients speak.
tests/property/test_golden.py checks that each one decodes and re-encodes byte-exact.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
from collections import defaultdict, deque
from pathlib import Path

from proxy.core.connection import Connection
from proxy.wire.messages import api_name, peek_request_header, response_correlation_id
from rig.java_tools import JavaTools
from rig.kafka import KafkaBroker
from rig.proxy_thread import ProxyThread
from tests.support.records import make_records

OUT = Path(__file__).resolve().parents[1] / "data" / "golden"
PER_KEY = 2
MAX_BYTES = 256 * 1024


class Tap:
    """Records request frames as the proxy reads them and response frames as upstream sends them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.frames: dict[tuple[str, int, str], list[bytes]] = defaultdict(list)
        self.expect: dict[int, deque[tuple[int, int, int]]] = defaultdict(deque)  # upstream id -> (key, ver, corr)
        self.buffers: dict[int, bytearray] = defaultdict(bytearray)

    def keep(self, key: int, version: int, direction: str, frame: bytes) -> None:
        if len(frame) > MAX_BYTES:
            return
        with self.lock:
            bucket = self.frames[(api_name(key), version, direction)]
            if len(bucket) < PER_KEY and frame not in bucket:
                bucket.append(frame)

    def install(self) -> None:
        tap = self
        orig_on_request = Connection._on_request
        orig_data = Connection.upstream_data

        def on_request(self: Connection, frame: bytes, now: float | None, wire: bytes | None) -> None:
            h = peek_request_header(frame)
            tap.keep(h.api_key, h.api_version, "request", frame)
            before = len(self.awaiting)
            orig_on_request(self, frame, now, wire)
            if len(self.awaiting) > before:
                tap.expect[id(self)].append((h.api_key, h.api_version, h.correlation_id))

        def upstream_data(self: Connection, data: bytes) -> None:
            buf = tap.buffers[id(self)]
            buf += data
            while len(buf) >= 4:
                size = int.from_bytes(buf[:4], "big")
                if len(buf) < 4 + size:
                    break
                frame = bytes(buf[4 : 4 + size])
                del buf[: 4 + size]
                queue = tap.expect[id(self)]
                if queue:
                    key, version, corr = queue.popleft()
                    if response_correlation_id(frame) == corr:
                        tap.keep(key, version, "response", frame)
            orig_data(self, data)

        Connection._on_request = on_request  # type: ignore[method-assign]
        Connection.upstream_data = upstream_data  # type: ignore[method-assign]


def drive_clients(bootstrap: str, java: JavaTools) -> None:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
    from kafka.admin import NewTopic as KNewTopic

    from rig.kafka_python_group import wait_partitions_known

    recs = make_records(30, 3, value_size=64, tag="golden")
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([KNewTopic("golden-kp", num_partitions=3, replication_factor=1)])
    admin.list_topics()
    admin.close()
    prod = KafkaProducer(bootstrap_servers=bootstrap, compression_type="gzip")
    for r in recs:
        prod.send("golden-kp", key=r.key, value=r.value, headers=list(r.headers), partition=r.partition)
    prod.flush()
    prod.close()
    cons = KafkaConsumer("golden-kp", bootstrap_servers=bootstrap, group_id="golden-kp-g",
                         auto_offset_reset="earliest", enable_auto_commit=True, consumer_timeout_ms=4000)
    wait_partitions_known(cons, "golden-kp", 3)  # kafka-python's join bug: see the helper
    list(cons)
    cons.commit()
    cons.close()

    ck_admin = AdminClient({"bootstrap.servers": bootstrap})  # keep the handle alive until the future resolves
    ck_admin.create_topics([NewTopic("golden-ck", num_partitions=3, replication_factor=1)])["golden-ck"].result(30)
    p = Producer({"bootstrap.servers": bootstrap, "compression.type": "zstd"})
    for r in recs:
        p.produce("golden-ck", key=r.key, value=r.value, headers=list(r.headers), partition=r.partition)
    p.flush(30)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "golden-ck-g", "auto.offset.reset": "earliest"})
    c.subscribe(["golden-ck"])
    got = 0
    for _ in range(40):
        m = c.poll(0.5)
        if m is not None and not m.error():
            got += 1
        if got >= len(recs):
            break
    c.commit(asynchronous=False)
    c.close()

    async def aio() -> None:
        from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

        ap = AIOKafkaProducer(bootstrap_servers=bootstrap, compression_type="lz4")
        await ap.start()
        for r in recs[:10]:
            await ap.send_and_wait("golden-kp", key=r.key, value=r.value, partition=r.partition)
        await ap.stop()
        ac = AIOKafkaConsumer("golden-kp", bootstrap_servers=bootstrap, group_id="golden-aio-g",
                              auto_offset_reset="earliest")
        await ac.start()
        await ac.getmany(timeout_ms=3000)
        await ac.commit()
        await ac.stop()

    asyncio.run(aio())

    java.create_topic(bootstrap, "golden-java", partitions=3)
    java.console_produce(bootstrap, "golden-java", [f"k{i}:v{i}" for i in range(20)], key_separator=":",
                         producer_props={"compression.type": "snappy"})
    java.console_consume(bootstrap, "golden-java", max_messages=20, from_beginning=True, group="golden-java-g")
    java.list_topics(bootstrap)


def main() -> None:
    tap = Tap()
    tap.install()
    with KafkaBroker() as broker, ProxyThread(broker.bootstrap) as proxy:
        java = JavaTools()
        try:
            drive_clients(proxy.bootstrap, java)
        finally:
            java.close()
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    count = 0
    for (api, version, direction), frames in sorted(tap.frames.items()):
        for i, frame in enumerate(frames):
            (OUT / f"{api}-v{version}-{direction}-{i}.bin").write_bytes(frame)
            count += 1
    print(f"wrote {count} frames to {OUT}")




if __name__ == "__main__":
    main()
