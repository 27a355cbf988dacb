"""Reading a topic through a confluent-kafka consumer with any client settings (TLS, SASL): the values, in order,
within a bounded time."""

from __future__ import annotations

import time
import uuid
from typing import Any

from confluent_kafka import Consumer


def consume_values(conf: dict[str, Any], topic: str, count: int, deadline_s: float = 60.0) -> list[bytes]:
    """Up to ``count`` values of ``topic`` from the beginning, in a new group; fewer if the deadline passes."""
    consumer = Consumer({**conf, "log_level": 0, "group.id": f"g-{uuid.uuid4().hex[:6]}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + deadline_s
    try:
        while len(got) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got.append(msg.value())
    finally:
        consumer.close()
    return got
