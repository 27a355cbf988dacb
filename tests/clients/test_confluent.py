"""confluent-kafka (librdkafka: sessionless fetches, ApiVersions v3 first, its own compression) through Sluice."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from rig.proxy_thread import ProxyThread
from tests.support.records import Rec, assert_same_records, make_records

pytestmark = pytest.mark.broker


@pytest.fixture(scope="module")
def sluice(kafka_broker):  # type: ignore[no-untyped-def]
    with ProxyThread(kafka_broker.bootstrap) as p:
        yield p


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)]).values():
        fut.result(30)


def produce(bootstrap: str, topic: str, records: list[Rec], **config: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all", **config})
    errors: list[object] = []
    for r in records:
        producer.produce(topic, value=r.value, key=r.key, partition=r.partition, timestamp=r.timestamp_ms,
                         headers=list(r.headers), on_delivery=lambda err, _m: errors.append(err) if err else None)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert not errors


def consume(bootstrap: str, topic: str, group: str, n: int, deadline_s: float = 60.0) -> list[Rec]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.subscribe([topic])
    out: list[Rec] = []
    deadline = time.monotonic() + deadline_s
    try:
        while len(out) < n and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is None:
                continue
            if m.error():
                raise KafkaException(m.error())
            out.append(Rec(m.partition(), m.key(), m.value(), tuple(m.headers() or ()), m.timestamp()[1]))
    finally:
        consumer.close()
    return out


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_produce_consume_three_partitions(sluice: ProxyThread, unique_topic: str, compression: str) -> None:
    create_topic(sluice.bootstrap, unique_topic, 3)
    records = make_records(150, 3, tag=compression)
    produce(sluice.bootstrap, unique_topic, records, **{"compression.type": compression})
    got = consume(sluice.bootstrap, unique_topic, f"g-{unique_topic}", len(records))
    assert_same_records(records, got)


def test_admin_lists_topics_and_brokers_through_sluice(sluice: ProxyThread, unique_topic: str,
                                                       kafka_broker) -> None:  # type: ignore[no-untyped-def]
    create_topic(sluice.bootstrap, unique_topic, 2)
    md = AdminClient({"bootstrap.servers": sluice.bootstrap}).list_topics(timeout=30)
    assert unique_topic in md.topics and len(md.topics[unique_topic].partitions) == 2
    # The client only ever learns Sluice's listeners, never the broker's real port.
    ports = {b.port for b in md.brokers.values()}
    assert kafka_broker.port not in ports
    assert ports == {sluice.proxy.router.port_for(kafka_broker.node_id)}
