"""Reading a topic through a confluent-kafka consumer with any client settings (TLS, SASL): every record up to the
topic's end offsets, in the order delivered, within a bounded time."""

from __future__ import annotations

import time
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition


class ReadTo:
    """A reader's positions (the offset after the highest it read, per partition) against the topic's end offsets
    once they are known (``ends``, asked of the broker once everything was produced): it has read to the end by
    offset, never by a count, so a record stored twice after the last one sent is read too."""

    def __init__(self) -> None:
        self.ends: dict[int, int] | None = None
        self.next: dict[int, int] = {}

    def read(self, partition: int, offset: int) -> None:
        self.next[partition] = max(self.next.get(partition, 0), offset + 1)

    def at_end(self) -> bool:
        return self.ends is not None and all(self.next.get(p, 0) >= end for p, end in self.ends.items())


def consume(conf: dict[str, Any], topic: str, deadline_s: float = 60.0) -> list[Message]:
    """Every record of ``topic`` from the beginning, in a new group, until each partition has been read to the end
    offset it had when called (asked through ``conf``: the path under test): by offset, never a count, so a record
    stored twice after the last one sent is read too. Fewer if the deadline passes; KafkaException on an error."""
    consumer = Consumer({**conf, "log_level": 0, "group.id": f"g-{uuid.uuid4().hex[:6]}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    got: list[Message] = []
    deadline = time.monotonic() + deadline_s
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in partitions}
        next_offset = dict.fromkeys(ends, 0)
        consumer.subscribe([topic])
        while any(next_offset[p] < end for p, end in ends.items()) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                raise KafkaException(msg.error())
            partition, offset = msg.partition(), msg.offset()
            assert partition is not None and offset is not None, msg
            got.append(msg)
            next_offset[partition] = max(next_offset[partition], offset + 1)
    finally:
        consumer.close()
    return got


def consume_values(conf: dict[str, Any], topic: str, deadline_s: float = 60.0) -> list[bytes]:
    """The values of :func:`consume`, in order."""
    values = [m.value() for m in consume(conf, topic, deadline_s)]
    assert all(v is not None for v in values), "a record without a value"
    return [v for v in values if v is not None]
