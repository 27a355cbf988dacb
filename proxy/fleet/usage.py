"""The fleet's usage exchange, the I/O of a quota shared by the whole fleet: every ``[fleet] usage_interval_s`` this
instance publishes its usage report to the usage topic, and it reads every instance's (its own too) back. What a
report says and how shares follow from them is the policy's (proxy/policies/quota/shares.py, sans-IO); this module
only moves bytes (confluent-kafka; the reading in a thread, never on the proxy's event loop).

A policy takes part by having the :class:`UsageSource` methods (the quota policy); nothing runs, and no topic is
created, until one of them wants it (a fleet-scoped quota: checked at every interval, so a ``PUT /quotas`` that
makes one starts it). The topic (``sluice-fleet-<name>-usage``, one partition, records kept a minute: a report is
stale after a few seconds) is created if missing, as the control topic is. Reading starts
:data:`LOOKBACK_S` back (``offsets_for_times``), so a new or restarted instance knows the live instances and their
demand from its first interval. The consumer never joins a group nor commits: the principal needs Describe, Read
and Write on the topic only (and Create if Sluice creates it).

When the topic cannot be written or read, nothing here retries beyond librdkafka's own: this instance's reports
stop coming back, and the policy falls back (shares.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from confluent_kafka import OFFSET_END, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from ..accesslog import get_logger
from .kafka_config import client_config

if TYPE_CHECKING:
    from .control import FleetControl

__all__ = ["FleetUsage", "UsageSource"]

log = get_logger("sluice.fleet.usage")

#: how far back a new reader starts: enough for every live instance's last reports
LOOKBACK_S = 10.0
#: records of the usage topic are deleted after this long (a report is stale after a few intervals)
RETENTION_MS = 60_000
_POLL_S = 0.2


@runtime_checkable
class UsageSource(Protocol):
    """A policy sharing a quota over the fleet (proxy/policies/quota/policy.py)."""

    def fleet_wanted(self) -> bool:
        """Whether it shares anything over the fleet now."""

    def fleet_report(self, instance: str, interval_s: float) -> bytes | None:
        """This instance's report for the interval just ended (None: nothing to publish)."""

    def fleet_offer(self, instance: str, value: bytes | None) -> None:
        """A report read from the usage topic (this instance's own too)."""


class FleetUsage:
    """One instance's part of the usage exchange (see the module docstring). Lives on the proxy's event loop."""

    def __init__(self, fleet: FleetControl) -> None:
        self.fleet = fleet
        settings = fleet.settings
        self.topic = settings.usage
        self.interval_s = settings.usage_interval_s
        self.sources = [p for p in fleet.proxy.chain.policies if isinstance(p, UsageSource)]
        self._conf = client_config(settings, fleet.proxy.settings.upstream, f"sluice-fleet-{fleet.name}-usage")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._caught_up = threading.Event()
        self._producer: Producer | None = None

    def _wanted(self) -> bool:
        return any(s.fleet_wanted() for s in self.sources)

    async def start(self) -> None:
        """Start the intervals; if a source wants the exchange now, read the recent reports first (bounded)."""
        self._loop = asyncio.get_running_loop()
        if self._wanted():
            self._begin()
            wait = max(5.0, 3 * self.interval_s)
            if not await asyncio.to_thread(self._caught_up.wait, wait):
                log.warning("quota_fleet_usage_not_read", topic=self.topic, timeout_s=wait,
                            using="the shares of the instances known so far")
        self._task = self._loop.create_task(self._intervals())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10.0)
        if self._producer is not None:
            await asyncio.to_thread(self._producer.flush, 1.0)

    def _begin(self) -> None:
        if self._thread is not None:
            return
        self._producer = Producer({**self._conf, "linger.ms": 0, "acks": 1, "enable.idempotence": False,
                                   "message.timeout.ms": max(1000, int(3000 * self.interval_s))})
        self._thread = threading.Thread(target=self._read, name="sluice-fleet-usage", daemon=True)
        self._thread.start()
        log.info("quota_fleet_usage_started", topic=self.topic, interval_s=self.interval_s)

    async def _intervals(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            if not self._wanted():
                continue  # kept running once started: a quota made instance-scoped again costs a report a second
            self._begin()
            instance = self.fleet.instance_id
            for source in self.sources:
                value = source.fleet_report(instance, self.interval_s)
                if value is None or not instance or self._producer is None:
                    continue
                try:
                    self._producer.produce(self.topic, value, instance.encode())
                except (KafkaException, BufferError) as exc:  # the topic unreachable: the policy notices
                    log.debug("quota_fleet_usage_not_published", error=str(exc))
            if self._producer is not None:
                self._producer.poll(0)

    # ------------------------------------------------------------------------------------ the reader

    def _post(self, key: bytes | None, value: bytes | None) -> None:
        loop = self._loop
        if loop is None or loop.is_closed() or key is None:
            return
        instance = key.decode(errors="replace")
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            for source in self.sources:
                loop.call_soon_threadsafe(source.fleet_offer, instance, value)

    def _read(self) -> None:
        consumer = Consumer({**self._conf, "group.id": f"sluice-fleet-{self.fleet.name}-usage",
                             "enable.auto.commit": False, "enable.auto.offset.store": False,
                             "enable.partition.eof": True, "auto.offset.reset": "latest"})
        try:
            while not self._stop.is_set():
                try:
                    self._assign(consumer)
                    break
                except KafkaException as exc:
                    log.debug("quota_fleet_usage_not_assigned", topic=self.topic, error=str(exc))
                    self._stop.wait(self.interval_s)
            while not self._stop.is_set():
                msg = consumer.poll(_POLL_S)
                if msg is None:
                    continue
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        self._caught_up.set()
                    continue
                self._post(msg.key(), msg.value())
        except Exception as exc:  # the thread must not die silently: the shares would fall back for good
            log.error("quota_fleet_usage_reader_failed", topic=self.topic, error=repr(exc))
        finally:
            with contextlib.suppress(Exception):
                consumer.close()

    def _assign(self, consumer: Consumer) -> None:
        """The topic ensured, its partitions assigned from :data:`LOOKBACK_S` ago."""
        self._ensure_topic()
        meta = consumer.list_topics(self.topic, timeout=5.0).topics.get(self.topic)
        if meta is None or meta.error is not None or not meta.partitions:
            raise KafkaException(meta.error if meta is not None and meta.error else
                                 KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
        since = int((time.time() - LOOKBACK_S) * 1000)
        wanted = [TopicPartition(self.topic, p, since) for p in sorted(meta.partitions)]
        found = consumer.offsets_for_times(wanted, timeout=5.0)
        consumer.assign([TopicPartition(self.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_END)
                         for tp in found])

    def _ensure_topic(self) -> None:
        admin = AdminClient(self._conf)
        meta = admin.list_topics(timeout=5.0)
        if self.topic in meta.topics:
            return
        rf = self.fleet.settings.replication_factor or min(3, max(1, len(meta.brokers)))
        topic = NewTopic(self.topic, 1, rf, config={"cleanup.policy": "delete", "retention.ms": str(RETENTION_MS),
                                                    "segment.ms": str(RETENTION_MS)})
        for future in admin.create_topics([topic], request_timeout=10.0).values():
            try:
                future.result()
                log.info("fleet_topic_created", topic=self.topic, replication_factor=rf)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # another instance was first
                    raise
