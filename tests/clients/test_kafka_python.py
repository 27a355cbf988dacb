"""kafka-python (uses fetch sessions, Fetch <= v10-ish, its own compression codecs) through Sluice."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic

from rig.kafka import KafkaBroker
from rig.kafka_python_group import wait_partitions_known
from rig.proxy_thread import ProxyThread
from tests.support.records import Rec, assert_same_records, make_records
from tests.support.topics import create_topic

pytestmark = pytest.mark.broker


def produce(bootstrap: str, topic: str, records: list[Rec], **config: object) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks="all", **config)
    try:
        for r in records:
            producer.send(topic, key=r.key, value=r.value, headers=list(r.headers), partition=r.partition,
                          timestamp_ms=r.timestamp_ms)
        producer.flush(timeout=60)
    finally:
        producer.close(timeout=10)


def consume(consumer: KafkaConsumer, n: int, deadline_s: float = 60.0, commit: bool = False) -> list[Rec]:
    out: list[Rec] = []
    deadline = time.monotonic() + deadline_s
    while len(out) < n and time.monotonic() < deadline:
        for _tp, msgs in consumer.poll(timeout_ms=500).items():
            for m in msgs:
                out.append(Rec(m.partition, m.key, m.value, tuple((k, v) for k, v in m.headers), m.timestamp))
        if commit:
            consumer.commit()
    return out


@pytest.fixture(scope="module")
def sluice(kafka_broker: KafkaBroker) -> Iterator[ProxyThread]:
    with ProxyThread(kafka_broker.bootstrap) as p:
        yield p


@pytest.mark.parametrize("compression", [None, "gzip", "snappy", "lz4", "zstd"])
def test_produce_consume_three_partitions(sluice: ProxyThread, unique_topic: str, compression: str | None) -> None:
    create_topic(sluice.bootstrap, unique_topic, 3)
    records = make_records(150, 3, tag=str(compression))
    produce(sluice.bootstrap, unique_topic, records, compression_type=compression)
    consumer = KafkaConsumer(unique_topic, bootstrap_servers=sluice.bootstrap, group_id=f"g-{unique_topic}",
                             auto_offset_reset="earliest", enable_auto_commit=False)
    try:
        wait_partitions_known(consumer, unique_topic, 3)
        got = consume(consumer, len(records))
    finally:
        consumer.close()
    assert_same_records(records, got, stored_in=(sluice.bootstrap, unique_topic))


def test_group_of_two_rebalances_and_commits_survive_restart(sluice: ProxyThread, unique_topic: str) -> None:
    create_topic(sluice.bootstrap, unique_topic, 4)
    records = make_records(400, 4)
    produce(sluice.bootstrap, unique_topic, records)
    group = f"g-{unique_topic}"

    def member() -> KafkaConsumer:
        return KafkaConsumer(unique_topic, bootstrap_servers=sluice.bootstrap, group_id=group,
                             auto_offset_reset="earliest", enable_auto_commit=False, max_poll_records=50,
                             heartbeat_interval_ms=500, session_timeout_ms=10_000)

    a = member()
    wait_partitions_known(a, unique_topic, 4)
    got = consume(a, 100, commit=True)  # a alone owns all 4 partitions
    assert len(got) >= 100
    b = member()  # joining triggers a rebalance; a commits before every poll, so nothing is redelivered
    wait_partitions_known(b, unique_topic, 4)
    deadline = time.monotonic() + 90
    while len(got) < len(records) and time.monotonic() < deadline:
        got += consume(a, 1, deadline_s=0.5, commit=True)
        got += consume(b, 1, deadline_s=0.5, commit=True)
    assert a.assignment() and b.assignment(), "both members should own partitions after the rebalance"
    assert not (a.assignment() & b.assignment())
    a.close()
    b.close()
    assert_same_records(records, got, stored_in=(sluice.bootstrap, unique_topic))

    # A new member of the same group reads the committed offsets back: the end of every partition.
    c = KafkaConsumer(bootstrap_servers=sluice.bootstrap, group_id=group, enable_auto_commit=False)
    try:
        tps = [TopicPartition(unique_topic, p) for p in range(4)]
        committed = {tp.partition: c.committed(tp) for tp in tps}
        ends = {tp.partition: off for tp, off in c.end_offsets(tps).items()}
        assert committed == ends == {p: 100 for p in range(4)}
    finally:
        c.close()


def test_admin_creates_and_lists_topics(sluice: ProxyThread, unique_topic: str) -> None:
    admin = KafkaAdminClient(bootstrap_servers=sluice.bootstrap)
    try:
        admin.create_topics([NewTopic(unique_topic, num_partitions=2, replication_factor=1)])
        deadline = time.monotonic() + 30
        while unique_topic not in admin.list_topics() and time.monotonic() < deadline:
            time.sleep(0.1)  # topic creation propagates asynchronously; bounded poll of the real condition
        assert unique_topic in admin.list_topics()
        [desc] = admin.describe_topics([unique_topic])
        assert len(desc["partitions"]) == 2
    finally:
        admin.close()
