"""No partition starves behind a hot one: partition 0 holds a 50 MiB backlog, partitions 1-3 hold 1 MiB each,
and the budget is 1 MiB. A client that never rotates its partition list (a raw fetch loop) and librdkafka both
get records from every partition within 10 fetches through Sluice. Directly against the broker, the same raw
loop starves partitions 1-3 (Kafka fills partitions in request order): that is what Sluice's rotation fixes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer

from proxy.policies.size_limit import policy as size_limit
from proxy.wire.records import walk_batches
from rig.kafka import KafkaBroker
from rig.proxy_thread import ProxyThread
from rig.raw import RawClient
from tests.support.topics import create_topic, produce_values

pytestmark = pytest.mark.broker

RECORD = 100 * 1024
BACKLOG = {0: 50 << 20, 1: 1 << 20, 2: 1 << 20, 3: 1 << 20}
BUDGET = 1 << 20


@pytest.fixture(scope="module")
def topic(kafka_broker: KafkaBroker) -> Iterator[str]:
    name = f"starvation-{int(time.time() * 1000)}"
    create_topic(kafka_broker.bootstrap, name, 4)
    payload = b"x" * RECORD
    produce_values(kafka_broker.bootstrap, name,
                   ((p, None, payload) for p, size in BACKLOG.items() for _ in range(size // RECORD)),
                   batch_size=1, linger_ms=0, acks=1, max_request_size=2 * RECORD)
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


def test_raw_loop_that_never_rotates(kafka_broker: KafkaBroker, topic: str) -> None:
    direct = fetch_loop(kafka_broker.port, topic, 10)
    assert set(direct) == {0}, f"the broker alone should starve partitions 1-3 here: {direct}"
    with ProxyThread(kafka_broker.bootstrap, **{"size_limit.budgets": [
            {"client_id": "*", "fetch_max_bytes": BUDGET}]}) as sluice:
        first = fetch_loop(sluice.proxy.bootstrap_port, topic, 10)
    assert set(first) == set(BACKLOG), f"partitions that delivered within 10 fetches: {first}"


def test_librdkafka(kafka_broker: KafkaBroker, topic: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Which partitions each budgeted Fetch response carried records for, as Sluice sent them, collected or streamed
    # (counting at the client instead would include librdkafka's prefetching): what the rotation learns of each.
    served: list[list[int]] = []
    learn = size_limit.Fairness.served

    def spy(fairness: size_limit.Fairness, keys: Any) -> None:
        keys = list(keys)
        served.append([key[1] for key in keys])
        learn(fairness, keys)

    monkeypatch.setattr(size_limit.Fairness, "served", spy)
    with ProxyThread(kafka_broker.bootstrap, **{"size_limit.budgets": [
            {"client_id": "*", "fetch_max_bytes": BUDGET}]}) as sluice:
        consumer = Consumer({"bootstrap.servers": sluice.bootstrap, "group.id": f"starve-{time.time()}",
                             "auto.offset.reset": "earliest", "enable.auto.commit": False,
                             "fetch.max.bytes": 50 << 20})
        consumer.subscribe([topic])
        seen: set[int] = set()
        deadline = time.monotonic() + 60
        try:
            while len(seen) < len(BACKLOG) and time.monotonic() < deadline:
                m = consumer.poll(0.2)
                partition = None if m is None or m.error() else m.partition()
                if partition is not None:
                    seen.add(partition)
        finally:
            consumer.close()
    assert seen == set(BACKLOG), f"partitions the consumer saw: {seen}"
    first = {p: next(i for i, parts in enumerate(served, 1) if p in parts) for p in BACKLOG}
    assert max(first.values()) <= 10, f"fetch response that first carried each partition's records: {first}"
