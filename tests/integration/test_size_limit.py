"""KIP-74 budgets through Sluice against the real broker, with real clients.

Records are 10 KiB, one per batch (kafka-python with batch_size=1), ~100 per partition on 3 partitions.
Budgets: 100 KB, one batch, and smaller than a single record. Every client must still receive every record
once, in order; a raw fetch through Sluice must never see more record bytes than max(budget, first batch).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer
from kafka import KafkaConsumer

from proxy.wire.records import walk_batches
from rig.java_tools import JavaTools
from rig.kafka import KafkaBroker
from rig.kafka_python_group import wait_partitions_known
from rig.proxy_thread import ProxyThread
from rig.raw import RawClient
from tests.support.topics import create_topic, produce_values

pytestmark = pytest.mark.broker

PARTITIONS = 3
PER_PARTITION = 100
VALUE = 10 * 1024


def value_for(key: str) -> bytes:
    return ((key + "|") * (VALUE // (len(key) + 1) + 1)).encode()[:VALUE]


@pytest.fixture(scope="module")
def backlog(kafka_broker: KafkaBroker) -> Iterator[str]:
    topic = f"size-limit-{int(time.time() * 1000)}"
    create_topic(kafka_broker.bootstrap, topic, PARTITIONS)
    keys = [(p, f"p{p}-{i:04d}") for i in range(PER_PARTITION) for p in range(PARTITIONS)]
    produce_values(kafka_broker.bootstrap, topic, ((p, k.encode(), value_for(k)) for p, k in keys),
                   batch_size=1, linger_ms=0, acks=1, max_in_flight_requests_per_connection=1)
    yield topic


def budget_proxy(kafka_broker: KafkaBroker, fetch_max_bytes: int) -> ProxyThread:
    return ProxyThread(kafka_broker.bootstrap, **{
        "size_limit.budgets": [{"client_id": "*", "fetch_max_bytes": fetch_max_bytes}]})


def check_keys(pairs: list[tuple[str, bytes]]) -> None:
    """Every record once, unchanged, in order within its partition."""
    seen: dict[str, list[int]] = {}
    for key, value in pairs:
        assert value == value_for(key), f"value of {key} changed"
        p, i = key.split("-")
        seen.setdefault(p, []).append(int(i))
    assert sorted(seen) == [f"p{p}" for p in range(PARTITIONS)]
    for p, idx in seen.items():
        assert idx == list(range(PER_PARTITION)), f"{p}: {idx[:10]}... ({len(idx)} records)"


ONE_BATCH = 10_300  # a 10 KiB record in its own batch is ~10,330 bytes: this budget is below one batch
BUDGETS = {"100KB": 100_000, "one_batch": ONE_BATCH, "below_one_record": 1_000}


@pytest.mark.parametrize("name", list(BUDGETS))
def test_raw_fetch_never_exceeds_budget_or_first_batch(kafka_broker: KafkaBroker, backlog: str, name: str) -> None:
    budget = BUDGETS[name]
    with budget_proxy(kafka_broker, budget) as sluice, RawClient("127.0.0.1", sluice.proxy.bootstrap_port) as c:
        offsets = {p: 0 for p in range(PARTITIONS)}
        fetches = 0
        while any(o < PER_PARTITION for o in offsets.values()) and fetches < 2000:
            view = c.fetch(12, backlog, {p: o for p, o in offsets.items() if o < PER_PARTITION})
            fetches += 1
            first_batch = 0
            total = 0
            for _, part in view.partitions():
                assert part.error_code == 0
                walk = walk_batches(part.records or b"")
                assert walk.truncated == 0, "Sluice cut inside a batch"
                if walk.batches and not first_batch:
                    first_batch = walk.batches[0].size
                total += walk.complete_size
                if walk.batches:
                    offsets[part.partition_index] = walk.batches[-1].next_offset
            assert total <= max(budget, first_batch), f"{total} record bytes for a {budget} budget"
        assert all(o == PER_PARTITION for o in offsets.values())


@pytest.mark.parametrize("name", list(BUDGETS))
def test_clients_receive_every_record_once_in_order(kafka_broker: KafkaBroker, backlog: str, java_tools: JavaTools,
                                                   name: str) -> None:
    total = PARTITIONS * PER_PARTITION
    with budget_proxy(kafka_broker, BUDGETS[name]) as sluice:
        # kafka-python (fetch sessions)
        kc = KafkaConsumer(backlog, bootstrap_servers=sluice.bootstrap, group_id=f"kp-{name}-{time.time()}",
                           auto_offset_reset="earliest", enable_auto_commit=False)
        got: list[tuple[str, bytes]] = []
        wait_partitions_known(kc, backlog, PARTITIONS)
        deadline = time.monotonic() + 90
        while len(got) < total and time.monotonic() < deadline:
            for msgs in kc.poll(timeout_ms=500).values():
                got += [(m.key.decode(), m.value) for m in msgs]
        kc.close()
        check_keys(got)
        # confluent-kafka (librdkafka, session-less)
        cc = Consumer({"bootstrap.servers": sluice.bootstrap, "group.id": f"ck-{name}-{time.time()}",
                       "auto.offset.reset": "earliest", "enable.auto.commit": False})
        cc.subscribe([backlog])
        got = []
        deadline = time.monotonic() + 90
        while len(got) < total and time.monotonic() < deadline:
            m = cc.poll(0.5)
            if m is not None and not m.error():
                key, value = m.key(), m.value()
                assert key is not None and value is not None, m
                got.append((key.decode(), value))
        cc.close()
        check_keys(got)
        # the Java consumer (Fetch v17+, sessions)
        lines = java_tools.console_consume(sluice.bootstrap, backlog, max_messages=total, print_key=True,
                                           group=f"java-{name}-{time.time()}", timeout=120)
        check_keys([(k, v.encode()) for k, v in (line.split("\t", 1) for line in lines)])
    # The budget was in force for all three clients: no fetch response carried more than max(budget, one
    # batch), so draining the backlog took at least this many fetches per client.
    per_response = max(BUDGETS[name], ONE_BATCH + 100)
    assert sluice.total("sluice_requests_total", api="Fetch") >= 3 * (total * VALUE // per_response)

