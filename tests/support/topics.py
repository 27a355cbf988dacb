"""Setting up test data on the real broker: one way to create a topic (rig.topics, librdkafka's admin: no JVM) and
fill it (kafka-python); and one way to read back what a group committed."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from kafka import KafkaProducer

from rig.topics import create_topic as create_topic

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient


def produce_values(bootstrap: str, topic: str, records: Iterable[tuple[int, bytes | None, bytes]],
                   **config: Any) -> None:
    """Send (partition, key, value) records in order and wait until the broker has them all."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, **config)
    try:
        for partition, key, value in records:
            producer.send(topic, key=key, value=value, partition=partition)
        producer.flush(120)
    finally:
        producer.close()


def committed_offsets(admin: AdminClient, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offset per partition of ``topic``, read from the broker (-1001: none). ``admin`` is
    the caller's, configured for the listener it reads through (plain, SASL...)."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    request = [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in range(partitions)])]
    found = admin.list_consumer_group_offsets(request)[group].result(30)
    return {tp.partition: tp.offset for tp in found.topic_partitions}
