"""Consumers that run in a thread while a test breaks something (a broker, Sluice, a client), and the bounded waits
the fault tests are built from.

The readers consume by assignment from the beginning, without a consumer group: their positions live in the
client, so a record delivered twice or skipped is the doing of the path under test (Sluice, the broker), never
of a rebalance resetting positions to committed offsets. Each keeps (partition, offset, value) in delivery order.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from confluent_kafka import OFFSET_BEGINNING, Consumer
from confluent_kafka import TopicPartition as CkTopicPartition
from kafka import KafkaConsumer
from kafka import TopicPartition as KpTopicPartition

from tests.support.consume import ReadTo

#: poll interval of the bounded waits below (a real condition is re-checked this often, never waited for blindly)
POLL_S = 0.05


def wait_until(condition: Callable[[], bool], timeout: float, what: str | Callable[[], str]) -> None:
    """Return as soon as ``condition()`` holds; AssertionError naming ``what`` if it does not within ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {what() if callable(what) else what}")
        time.sleep(POLL_S)  # bounded poll of a real condition


class Reader:
    """A consumer of ``topic``'s ``partitions`` in a thread, until it is stopped or, once told the topic's end
    offsets (:meth:`finish`), has read each partition to its end: by offset, never a count, so a record stored
    twice at the end of the log is read too."""

    kind = "?"

    def __init__(self, bootstrap: str, topic: str, partitions: int, *, client_id: str) -> None:
        self.bootstrap, self.topic, self.partitions = bootstrap, topic, partitions
        self.client_id = client_id
        self.got: list[tuple[int, int, str]] = []
        self.position = ReadTo()
        self.errors: list[str] = []  # what the client reported along the way (expected during a fault)
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._guarded, name=f"reader-{self.kind}", daemon=True)
        self._thread.start()

    @property
    def count(self) -> int:
        return len(self.got)

    def _guarded(self) -> None:
        try:
            self._run()
        except BaseException as e:  # reported by finish()
            self.failure = e

    def _run(self) -> None:
        raise NotImplementedError

    def _got(self, partition: int, offset: int, value: str) -> None:
        self.got.append((partition, offset, value))
        self.position.read(partition, offset)

    def _more(self) -> bool:
        return not self.position.at_end() and not self._stop.is_set()

    def finish(self, timeout: float, ends: dict[int, int]) -> list[tuple[int, int, str]]:
        """Wait (bounded) until the reader has read each partition to its end offset in ``ends`` (the topic's,
        asked of the broker once everything was produced: rig.kafka.end_offsets), stop it, and return what it
        read."""
        self.position.ends = ends
        wait_until(lambda: self.position.at_end() or not self._thread.is_alive(), timeout,
                   lambda: f"{self.kind} read to {self.position.next}, not to {ends}; errors: {self.errors[-5:]}")
        self.stop()
        return self.got

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        if self.failure is not None:
            raise AssertionError(f"{self.kind} reader failed: {self.failure!r}") from self.failure
        assert not self._thread.is_alive(), f"{self.kind} reader did not stop"


class KafkaPythonReader(Reader):
    """kafka-python: fetch sessions (KIP-227) of its own."""

    kind = "kafka-python"

    def _run(self) -> None:
        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, client_id=self.client_id, group_id=None,
                                 enable_auto_commit=False, auto_offset_reset="earliest", fetch_max_wait_ms=100,
                                 reconnect_backoff_max_ms=1000, request_timeout_ms=30_000)
        try:
            consumer.assign([KpTopicPartition(self.topic, p) for p in range(self.partitions)])
            while self._more():
                for msgs in consumer.poll(timeout_ms=200).values():
                    for m in msgs:
                        self._got(m.partition, m.offset, m.value.decode())
        finally:
            consumer.close()


class ConfluentReader(Reader):
    """confluent-kafka (librdkafka): session-less, every fetch lists every partition."""

    kind = "confluent-kafka"

    def _run(self) -> None:
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "client.id": self.client_id,
                             "group.id": f"unused-{self.client_id}", "enable.auto.commit": False,
                             "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100,
                             "reconnect.backoff.max.ms": 1000,
                             "error_cb": lambda e: self.errors.append(str(e))})
        try:
            consumer.assign([CkTopicPartition(self.topic, p, OFFSET_BEGINNING) for p in range(self.partitions)])
            while self._more():
                m = consumer.poll(0.2)
                if m is None:
                    continue
                if m.error():
                    self.errors.append(str(m.error()))
                    continue
                partition, offset, value = m.partition(), m.offset(), m.value()
                assert partition is not None and offset is not None and value is not None
                self._got(partition, offset, value.decode())
        finally:
            consumer.close()
