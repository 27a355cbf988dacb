"""Clients and checks for the cluster tests (tests/cluster): readers of every kind running in the background through
Sluice, the Java verifiable producer's acknowledgements, and which ports a client process talks to."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable

import psutil

from rig.java_tools import VERIFIABLE_PRODUCER
from rig.sluice_process import SluiceProcess
from tests.support.consume import ReadTo

__all__ = ["VERIFIABLE_PRODUCER", "Reader", "acked_records", "check_at_least_once_in_order", "check_exactly",
           "remote_ports", "sluice_node_ports"]

Record = tuple[int, int, str]  # (partition, offset, value)


def acked_records(lines: Iterable[str]) -> tuple[list[Record], list[str]]:
    """VerifiableProducer's stdout: the records the cluster acknowledged (``producer_send_success``: partition,
    offset, value) and the send errors it reported (``producer_send_error``)."""
    acked: list[Record] = []
    errors: list[str] = []
    for line in lines:
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if event.get("name") == "producer_send_success":
                acked.append((int(event["partition"]), int(event["offset"]), str(event["value"])))
            elif event.get("name") == "producer_send_error":
                errors.append(line)
    return acked, errors


def by_partition(records: Iterable[Record]) -> dict[int, list[tuple[int, str]]]:
    out: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for p, offset, value in records:
        out[p].append((offset, value))
    return out


def _expected(acked: list[Record], partitions: int) -> dict[int, dict[int, str]]:
    """The acknowledged records of each of the topic's partitions, offset -> value (a partition nothing was
    acknowledged to must deliver nothing: a sticky partitioner may leave one out), at offsets 0.. without a gap;
    and something was acknowledged at all, or there is nothing to check."""
    assert acked, "harness: nothing acknowledged, nothing to check"
    want: dict[int, dict[int, str]] = {p: {} for p in range(partitions)}
    for p, offset, value in acked:
        assert p in want, f"harness: acknowledged to partition {p} of a {partitions}-partition topic"
        want[p][offset] = value
    for p, records in want.items():
        assert sorted(records) == list(range(len(records))), \
            f"harness: partition {p} acknowledged offsets with gaps: {sorted(records)[:5]}..."
    return want


def _counts(want: dict[int, dict[int, str]], have: dict[int, list[tuple[int, str]]]) -> str:
    return ", ".join(f"partition {p}: {len(have.get(p, []))} of {len(records)}" for p, records in want.items())


def check_exactly(got: list[Record], acked: list[Record], who: str, partitions: int) -> None:
    """Every acknowledged record consumed once, in offset order per partition, its value unchanged (nothing else
    was produced to the topic, so the log holds exactly the acknowledged records), in each of the ``partitions``
    partitions: checked over what was sent, so a partition that delivered nothing fails it."""
    want = _expected(acked, partitions)
    have = by_partition(got)
    assert set(have) <= set(want), f"{who}: records from partitions of another topic: {set(have) - set(want)}"
    for p, records in want.items():
        consumed, expected = have.get(p, []), sorted(records.items())
        assert consumed == expected, (
            f"{who}, partition {p}: consumed {len(consumed)} records, acknowledged {len(expected)} "
            f"({_counts(want, have)}); first difference at "
            f"{next((i for i, (a, b) in enumerate(zip(consumed, expected, strict=False)) if a != b), None)}")


def check_at_least_once_in_order(got: list[Record], acked: list[Record], who: str, partitions: int) -> None:
    """A group member's view: as :func:`check_exactly`, except that after a rebalance a partition may be read again
    from its last committed offset (Kafka's at-least-once): a record delivered again must be the very record
    at that offset, and each partition's first deliveries are in offset order. Checked over what was sent."""
    want = _expected(acked, partitions)
    have = by_partition(got)
    assert set(have) <= set(want), f"{who}: records from partitions of another topic: {set(have) - set(want)}"
    for p, records in want.items():
        first_seen: list[int] = []
        seen: set[int] = set()
        for offset, value in have.get(p, []):
            assert records.get(offset) == value, f"{who}, partition {p} offset {offset}: {value!r} changed"
            if offset not in seen:
                seen.add(offset)
                first_seen.append(offset)
        assert seen == set(records), (f"{who}, partition {p}: {len(set(records) - seen)} acknowledged records "
                                      f"missing ({_counts(want, have)})")
        assert first_seen == sorted(first_seen), f"{who}, partition {p}: out of order"


# ---------------------------------------------------------------------------------------------- readers


class Reader:
    """A consumer of one kind reading every partition of ``topic`` from the beginning (assigned, no group: so a
    broker's death costs no rebalance and every record arrives exactly once), in a thread, until it is told the
    topic's end offsets and has read each partition to its end (:meth:`join`: by offset, never a count, so a record
    stored twice at the end of the log is read too) or ``deadline_s`` has passed."""

    KINDS = ("kafka-python", "confluent-kafka", "aiokafka")

    def __init__(self, kind: str, bootstrap: str, topic: str, partitions: int, deadline_s: float = 180.0) -> None:
        self.kind, self.bootstrap, self.topic, self.partitions = kind, bootstrap, topic, partitions
        self.records: list[Record] = []
        self.position = ReadTo()
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._deadline = time.monotonic() + deadline_s
        run: Callable[[], None] = {"kafka-python": self._kafka_python, "confluent-kafka": self._confluent,
                                   "aiokafka": lambda: asyncio.run(self._aiokafka())}[kind]
        self._thread = threading.Thread(target=self._guard, args=(run,), name=f"reader-{kind}", daemon=True)
        self._thread.start()

    def _add(self, partition: int, offset: int, value: str) -> None:
        self.records.append((partition, offset, value))
        self.position.read(partition, offset)

    def _going(self) -> bool:
        return not self.position.at_end() and not self._stop.is_set() and time.monotonic() < self._deadline

    def _guard(self, run: Callable[[], None]) -> None:
        try:
            run()
        except BaseException as exc:  # reported by join()
            self.error = exc

    def _kafka_python(self) -> None:
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, client_id="sluice-test-failover-kafka-python",
                                 enable_auto_commit=False, fetch_max_wait_ms=200)
        try:
            tps = [TopicPartition(self.topic, p) for p in range(self.partitions)]
            consumer.assign(tps)
            consumer.seek_to_beginning(*tps)
            while self._going():
                for tp, msgs in consumer.poll(timeout_ms=200).items():
                    for m in msgs:
                        self._add(tp.partition, m.offset, m.value.decode())
        finally:
            consumer.close()

    def _confluent(self) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "unused-assign-only",
                             "client.id": "sluice-test-failover-confluent", "enable.auto.commit": False,
                             "fetch.wait.max.ms": 200})
        try:
            consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in range(self.partitions)])
            while self._going():
                msg = consumer.poll(0.2)
                if msg is None:
                    continue
                error = msg.error()
                if error is not None:
                    if error.fatal():
                        raise RuntimeError(str(error))
                    continue  # transient (a broker down): librdkafka retries by itself
                partition, offset, value = msg.partition(), msg.offset(), msg.value()
                assert partition is not None and offset is not None and value is not None
                self._add(partition, offset, value.decode())
        finally:
            consumer.close()

    async def _aiokafka(self) -> None:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, client_id="sluice-test-failover-aiokafka",
                                    enable_auto_commit=False, fetch_max_wait_ms=200)
        await consumer.start()
        try:
            tps = [TopicPartition(self.topic, p) for p in range(self.partitions)]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            while self._going():
                batches = await consumer.getmany(timeout_ms=200)
                for tp, msgs in batches.items():
                    for m in msgs:
                        self._add(tp.partition, m.offset, m.value.decode())
        finally:
            await consumer.stop()

    def join(self, timeout: float, ends: dict[int, int]) -> list[Record]:
        """Read to ``ends`` (the topic's end offsets, asked of the cluster once everything was produced), bounded
        by ``timeout``; what was read."""
        self.position.ends = ends
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join(30)
        if self.error is not None:
            raise AssertionError(f"{self.kind} reader failed: {self.error!r}") from self.error
        return self.records


# ---------------------------------------------------------------------------------------------- addresses


def sluice_node_ports(sluice: SluiceProcess) -> dict[int, int]:
    """Broker node id -> the port Sluice serves it on, from its ``listening`` log events."""
    return {e["node_id"]: e["port"] for e in sluice.log_events()
            if e.get("event") == "listening" and e.get("role") == "broker"}


def remote_ports(pid: int) -> set[int]:
    """The remote ports of a process's TCP connections to 127.0.0.1 (every broker and Sluice listens there; a JVM's
    dual-stack sockets show it as ::ffff:127.0.0.1)."""
    return {c.raddr.port for c in psutil.Process(pid).net_connections(kind="tcp")
            if c.raddr and c.raddr.ip in ("127.0.0.1", "::ffff:127.0.0.1")}
