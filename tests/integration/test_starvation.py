"""No partition starves behind a hot one: partition 0 holds a 50 MiB backlog, partitions 1-3 hold 1 MiB each,
and the budget is 1 MiB. A client that never rotates its partition list (a raw fetch loop) and librdkafka both
get records from every partition within 10 fetches through Sluice. Directly against the broker, the same raw
loop starves partitions 1-3 (Kafka fills partitions in request order): that is what Sluice's rotation fixes."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic
from prometheus_client import REGISTRY

from proxy.wire.records import walk_batches
from tests.support.proxy import ProxyThread
from tests.support.raw import RawClient

pytestmark = pytest.mark.broker

RECORD = 100 * 1024
BACKLOG = {0: 50 << 20, 1: 1 << 20, 2: 1 << 20, 3: 1 << 20}
BUDGET = 1 << 20


@pytest.fixture(scope="module")
def topic(kafka_broker) -> Iterator[str]:  # type: ignore[no-untyped-def]
    name = f"starvation-{int(time.time() * 1000)}"
    admin = KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap)
    admin.create_topics([NewTopic(name, num_partitions=4, replication_factor=1)])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, batch_size=1, linger_ms=0, acks=1,
                             max_request_size=2 * RECORD)
    payload = b"x" * RECORD
    for p, size in BACKLOG.items():
        for _ in range(size // RECORD):
            producer.send(name, value=payload, partition=p)
    producer.flush(120)
    producer.close()
    yield name


def fetch_loop(port: int, topic: str, fetches: int) -> dict[int, int]:
    """Fixed partition order [0, 1, 2, 3], every time; returns the fetch number at which each partition first
    delivered records."""
    first: dict[int, int] = {}
    offsets = dict.fromkeys(BACKLOG, 0)
    with RawClient("127.0.0.1", port) as c:
        for n in range(1, fetches + 1):
            view = c.fetch(12, topic, offsets, max_bytes=BUDGET)
            for _, part in view.partitions():
                batches = walk_batches(part.records or b"").batches
                if batches:
                    first.setdefault(part.partition_index, n)
                    offsets[part.partition_index] = batches[-1].next_offset
    return first


def test_raw_loop_that_never_rotates(kafka_broker, topic: str) -> None:  # type: ignore[no-untyped-def]
    direct = fetch_loop(kafka_broker.port, topic, 10)
    assert set(direct) == {0}, f"the broker alone should starve partitions 1-3 here: {direct}"
    with ProxyThread(kafka_broker.bootstrap, **{"size_limit.budgets": [
            {"client_id": "*", "fetch_max_bytes": BUDGET}]}) as sluice:
        first = fetch_loop(sluice.proxy.bootstrap_port, topic, 10)
    assert set(first) == set(BACKLOG), f"partitions that delivered within 10 fetches: {first}"


def fetch_count() -> float:
    return sum(s.value for m in REGISTRY.collect() if m.name == "sluice_requests"
               for s in m.samples if s.name == "sluice_requests_total" and s.labels.get("api") == "Fetch")


def test_librdkafka(kafka_broker, topic: str) -> None:  # type: ignore[no-untyped-def]
    with ProxyThread(kafka_broker.bootstrap, **{"size_limit.budgets": [
            {"client_id": "*", "fetch_max_bytes": BUDGET}]}) as sluice:
        consumer = Consumer({"bootstrap.servers": sluice.bootstrap, "group.id": f"starve-{time.time()}",
                             "auto.offset.reset": "earliest", "enable.auto.commit": False,
                             "fetch.max.bytes": 50 << 20})
        consumer.subscribe([topic])
        start: float | None = None
        first: dict[int, float] = {}
        deadline = time.monotonic() + 60
        try:
            while len(first) < len(BACKLOG) and time.monotonic() < deadline:
                m = consumer.poll(0.2)
                if m is None or m.error():
                    continue
                if start is None:
                    start = fetch_count() - 1  # the fetch that brought this first record
                first.setdefault(m.partition(), fetch_count() - start)
        finally:
            consumer.close()
    assert set(first) == set(BACKLOG), f"partitions seen: {first}"
    assert max(first.values()) <= 10, f"fetches until each partition's first record: {first}"
