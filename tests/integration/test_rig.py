"""The rig itself: a real broker that real clients (kafka-python, Kafka's Java tools) can use, and restart."""

from __future__ import annotations

import time
from collections import defaultdict

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic

from rig.java_tools import JavaTools
from rig.kafka import KafkaBroker, RigError, metadata_brokers
from rig.kafka_python_group import wait_partitions_known

pytestmark = pytest.mark.broker


def _create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="rig-test-admin")
    try:
        admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    finally:
        admin.close()


def _produce(bootstrap: str, topic: str, count: int, partitions: int) -> None:
    """`count` records, value = str(i), sent to partition i % partitions; every send acknowledged (acks=all)."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    try:
        futures = [
            producer.send(topic, key=f"k{i}".encode(), value=str(i).encode(), partition=i % partitions)
            for i in range(count)
        ]
        producer.flush(timeout=30)
        for future in futures:
            future.get(timeout=30)
    finally:
        producer.close(timeout=10)


def _consume_all(consumer: KafkaConsumer, expected: int, deadline_s: float = 30.0) -> dict[int, list[tuple[int, int]]]:
    """Poll until `expected` records arrived (or the deadline); per partition, [(offset, int(value))]."""
    got: dict[int, list[tuple[int, int]]] = defaultdict(list)
    total = 0
    deadline = time.monotonic() + deadline_s
    while total < expected and time.monotonic() < deadline:
        for tp, records in consumer.poll(timeout_ms=500).items():
            for rec in records:
                got[tp.partition].append((rec.offset, int(rec.value)))
                total += 1
    return got


def test_broker_serves_metadata(kafka_broker: KafkaBroker) -> None:
    assert kafka_broker.is_running
    assert kafka_broker.bootstrap == f"127.0.0.1:{kafka_broker.port}"
    brokers = metadata_brokers("127.0.0.1", kafka_broker.port)
    assert brokers == [(kafka_broker.node_id, "127.0.0.1", kafka_broker.port)]
    assert kafka_broker.log_path.is_file()


def test_kafka_python_round_trip_three_partitions(kafka_broker: KafkaBroker, unique_topic: str) -> None:
    _create_topic(kafka_broker.bootstrap, unique_topic, partitions=3)
    _produce(kafka_broker.bootstrap, unique_topic, count=100, partitions=3)

    consumer = KafkaConsumer(
        bootstrap_servers=kafka_broker.bootstrap,
        group_id=f"g-{unique_topic}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    try:
        consumer.subscribe([unique_topic])
        wait_partitions_known(consumer, unique_topic, 3)
        got = _consume_all(consumer, expected=100)
    finally:
        consumer.close()

    values = sorted(v for recs in got.values() for _, v in recs)
    assert values == list(range(100)), "every record exactly once"
    assert sorted(got) == [0, 1, 2]
    for partition, recs in got.items():
        # in order within the partition: offsets 0.. without gaps, values in send order
        assert [off for off, _ in recs] == list(range(len(recs)))
        assert [v for _, v in recs] == [i for i in range(100) if i % 3 == partition]


def test_java_console_round_trip(kafka_broker: KafkaBroker, java_tools: JavaTools, unique_topic: str) -> None:
    lines = [f"k{i}:value {i}" for i in range(5)]
    java_tools.console_produce(kafka_broker.bootstrap, unique_topic, lines, key_separator=":")
    got = java_tools.console_consume(
        kafka_broker.bootstrap, unique_topic, max_messages=len(lines), print_key=True, key_separator="|"
    )
    assert got == [f"k{i}|value {i}" for i in range(5)]


def test_java_topics_and_perf_tools(kafka_broker: KafkaBroker, java_tools: JavaTools, unique_topic: str) -> None:
    java_tools.create_topic(kafka_broker.bootstrap, unique_topic, partitions=2)
    assert unique_topic in java_tools.list_topics(kafka_broker.bootstrap)
    assert "PartitionCount: 2" in java_tools.describe_topic(kafka_broker.bootstrap, unique_topic)

    produced = java_tools.producer_perf(kafka_broker.bootstrap, unique_topic, num_records=2000, record_size=100)
    assert produced.records == 2000
    assert produced.records_per_sec > 0
    consumed = java_tools.consumer_perf(kafka_broker.bootstrap, unique_topic, messages=2000)
    assert consumed.records == 2000


def test_restart_keeps_ports_and_data(kafka_broker: KafkaBroker, unique_topic: str) -> None:
    _create_topic(kafka_broker.bootstrap, unique_topic, partitions=1)
    _produce(kafka_broker.bootstrap, unique_topic, count=20, partitions=1)
    port, pid = kafka_broker.port, kafka_broker.pid

    kafka_broker.restart()

    assert kafka_broker.port == port
    assert kafka_broker.pid != pid
    consumer = KafkaConsumer(bootstrap_servers=kafka_broker.bootstrap, enable_auto_commit=False)
    try:
        tp = TopicPartition(unique_topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        got = _consume_all(consumer, expected=20)
    finally:
        consumer.close()
    assert got[0] == [(i, i) for i in range(20)]


def test_start_failure_reports_the_broker_error() -> None:
    broker = KafkaBroker(overrides={"num.io.threads": "not-a-number"}, startup_timeout=30)
    with pytest.raises(RigError, match=r"num\.io\.threads"):
        broker.start()
    broker.close()
    assert not broker.is_running
