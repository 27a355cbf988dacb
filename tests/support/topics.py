"""Setting up test data on the real broker: one way to create a topic (rig.topics, librdkafka's admin: no JVM) and
fill it (kafka-python); and one way to read back what a group committed."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from kafka import KafkaProducer

from rig.topics import create_topic as create_topic
from tests.support.faults import wait_until

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


def topic_id(admin: AdminClient, topic: str) -> object:
    """``topic``'s id (KIP-516) as the broker describes it; None while there is no such topic."""
    from confluent_kafka import KafkaError, KafkaException, TopicCollection

    try:
        return admin.describe_topics(TopicCollection([topic]))[topic].result(30).topic_id
    except KafkaException as e:
        if e.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
            raise
        return None


def created_again(admin: AdminClient, bootstrap: str, topic: str, partitions: int, old_id: object) -> bool:
    """One try at creating ``topic`` again after its deletion: whether it now exists as a new topic (an id other
    than ``old_id``), created here or by a client's own lookup (kafka-python's Metadata requests ask for
    auto-creation, allow_auto_create_topics or not, straight to the broker as through Sluice). False while the
    deletion is not applied yet."""
    from confluent_kafka import KafkaError, KafkaException

    try:
        create_topic(bootstrap, topic, partitions)
    except KafkaException as e:
        if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise
        return topic_id(admin, topic) not in (None, old_id)
    return True


def committed_offsets(admin: AdminClient, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offset per partition of ``topic``, read from the broker (-1001: none). ``admin`` is
    the caller's, configured for the listener it reads through (plain, SASL...)."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    request = [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in range(partitions)])]
    found = admin.list_consumer_group_offsets(request)[group].result(30)
    return {tp.partition: tp.offset for tp in found.topic_partitions}


def wait_group_coordinator(bootstrap: str, group: str, timeout: float = 60.0) -> None:
    """Return once the broker answers an OffsetFetch of ``group`` without error. A fresh cluster creates
    __consumer_offsets at the first group lookup and answers NOT_COORDINATOR (16) or COORDINATOR_LOAD_IN_PROGRESS
    (14) until its partitions are loaded, and librdkafka's consumer in assign mode stops at that answer: its
    committed offsets never fetched, no Fetch ever sent (seen with Kafka 4.3 directly, without Sluice). A cluster
    in service has had its offsets topic all along; a test whose consumer may be a fresh broker's first group
    waits for this first. kafka-python's admin asks, not librdkafka's: librdkafka 2.x crashes (SIGSEGV in
    rd_kafka_cgrp_op) on a ListConsumerGroupOffsets answered NOT_COORDINATOR."""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="sluice-test-coordinator")
    last: list[str] = ["no answer yet"]

    def answered() -> bool:
        try:
            admin.list_group_offsets(group)
            return True
        except KafkaError as exc:
            last[0] = repr(exc)
            return False

    try:
        wait_until(answered, timeout, lambda: f"the group coordinator of {group} ({last[0]})")
    finally:
        admin.close()
