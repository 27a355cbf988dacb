"""Setting up test data on the real broker with kafka-python: one way to create a topic and fill it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic


def create_topic(bootstrap: str, name: str, partitions: int = 1) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="sluice-test-admin")
    try:
        admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
    finally:
        admin.close()


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
