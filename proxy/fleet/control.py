"""The fleet's I/O: the control topic followed, changes written, the instance's status published (confluent-kafka;
its blocking calls run in threads, never on the proxy's event loop). The rules are proxy/fleet/records.py's.

Start-up (:meth:`FleetControl.start`, before any listener opens): the topics are created if missing (compacted
control topic, one partition, replication factor min(3, brokers) unless ``[fleet] replication_factor``), the
control topic is read from its beginning to its end (``read_committed``: a writer's aborted record is never
applied) and every section's latest record is applied. Then a thread follows the topic and hands each record to
the event loop in topic order (``call_soon_threadsafe`` keeps the order), where it is folded and applied through
``Proxy.apply_dynamic``, the path of the admin API's PUT. If the control cluster does not answer within
``startup_timeout_s``, the instance serves with its local settings and applies the fleet's when it answers.

Writes (:meth:`FleetControl.write`, the admin API's PUT with the fleet on): one transactional producer per write,
with the fleet's one ``transactional.id``. ``init_transactions`` fences every other writer of the fleet (KIP-98:
the coordinator bumps the producer epoch, and a writer fenced between its check and its commit fails with
PRODUCER_FENCED / INVALID_PRODUCER_EPOCH, its transaction aborted) and completes any transaction left open. The
writer then reads the topic to its end (``read_committed``), checks the revision the change is based on against
the one it read (records.py ``next_revision``) and produces + commits the record in one transaction. So two
operators' changes based on the same revision cannot both be committed: the second writer either reads the
first's record (Conflict: HTTP 409) or is fenced before committing (refused, 409 too). What remains: a writer
that bypasses Sluice (produces without the transactional id) is not fenced; its record is still folded by the same
rules (``stale`` if its revision is not above the applied one) on every instance alike.

Control cluster down: the follower thread probes the cluster's metadata every :data:`PROBE_INTERVAL_S` while no
record arrives, and at once when librdkafka reports a connection failure (the probe decides, not the report, which
may be stale); ``sluice_fleet_control_reachable`` says 0 and one log event says so at each transition, the
instance keeps serving with what it applied, ``/readyz`` is unaffected, and librdkafka resumes fetching from its
position when the cluster is back (the changes made meanwhile arrive in order).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client import CollectorRegistry, Counter, Gauge

from ..accesslog import get_logger
from ..config import ConfigError
from ..metrics import sluice_version
from ..reconfigure import ChangeRefused
from .kafka_config import client_config
from .records import SKIP_REASONS, Change, Conflict, FleetState, Skipped, encode, next_revision
from .status import StatusRecord

if TYPE_CHECKING:
    from ..server import Proxy

__all__ = ["FleetControl", "FleetMetrics", "WriteRefused", "read_to_end"]

log = get_logger("sluice.fleet")

#: how often the follower asks the control cluster for metadata while no record arrives (reachability)
PROBE_INTERVAL_S = 2.0
#: librdkafka's poll timeout in the follower thread: how soon it notices stop()
_POLL_S = 0.2
_AUTHORIZATION = frozenset({KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                            KafkaError.CLUSTER_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED})
_FENCED = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH})


class FleetMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.applied = Counter("sluice_fleet_records_applied", "Control records applied, per section.",
                               ["section"], registry=registry)
        self.skipped = Counter("sluice_fleet_records_skipped", "Control records skipped (not applied), per reason: "
                               "garbage, schema, fleet, section, stale, invalid, tombstone.",
                               ["reason"], registry=registry)
        for reason in SKIP_REASONS:
            self.skipped.labels(reason)
        self.revision = Gauge("sluice_fleet_revision", "The fleet revision of each section this instance applied "
                              "(0: never set by the fleet).", ["section"], registry=registry)
        self.reachable = Gauge("sluice_fleet_control_reachable", "1 while the control cluster answers, 0 while "
                               "it does not (the instance serves with the settings applied last).",
                               registry=registry)
        self.writes = Counter("sluice_fleet_writes", "Changes this instance wrote to the control topic, per "
                              "outcome: written, conflict, refused, failed.", ["outcome"], registry=registry)
        self.status_published = Counter("sluice_fleet_status_published", "Status records this instance "
                                        "published.", registry=registry)


class WriteRefused(ChangeRefused):
    """A change not written: ``status`` 409 (conflict), 403 (not authorized), 503 (control cluster)."""


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class FleetControl:
    """One instance's part of the fleet (see the module docstring). Lives on the proxy's event loop."""

    def __init__(self, proxy: Proxy, clock: Callable[[], float] = time.monotonic) -> None:
        self.proxy = proxy
        self.settings = fleet = proxy.settings.fleet
        self.clock = clock
        self.name = fleet.name
        self.topic, self.status_topic = fleet.control, fleet.status
        self.metrics = FleetMetrics(proxy.metrics.registry)
        sections = tuple(proxy.settings.dynamic_sections)
        self.state = FleetState(fleet.name, sections, self._validate)
        for section in sections:  # every series exported from the start (the dashboard's panels show 0, not nothing)
            self.metrics.revision.labels(section).set(0)
            self.metrics.applied.labels(section)
        for outcome in ("written", "conflict", "refused", "failed"):
            self.metrics.writes.labels(outcome)
        self._conf = client_config(fleet, proxy.settings.upstream, f"sluice-fleet-{fleet.name}")
        self.instance_id = fleet.instance_id
        self.host = socket.gethostname()
        self.started_at = _now_iso()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._caught_up = asyncio.Event()
        self._applied_event = asyncio.Event()  # set (and replaced) whenever a record has been folded
        self._reachable: bool | None = None
        self._write_lock = asyncio.Lock()
        self._status_task: asyncio.Task[None] | None = None
        self._status_producer: Producer | None = None
        try:  # made now: librdkafka checks the properties (files, mechanisms) before anything listens
            self._status_conf = {**self._conf, "enable.idempotence": True, "linger.ms": 0,
                                 "message.timeout.ms": max(1000, int(fleet.status_interval_s * 3000))}
            self._status_producer_ready = Producer(self._status_conf)
        except (KafkaException, ValueError, TypeError) as exc:
            key = "fleet.tls" if fleet.credentials == "fleet" else "upstream.tls"
            raise ConfigError(key, f"the fleet's Kafka clients refuse the settings: {exc}") from None

    # ------------------------------------------------------------------------------------- what GET shows

    def revision(self, section: str) -> int:
        return self.state.revision(section)

    def overlay(self, settings: Any) -> Any:
        """``settings`` with the fleet's sections over them (a SIGHUP re-reads the file: the fleet still wins)."""
        sections = self.state.settings_of()
        return settings.with_overrides(dict(sections)) if sections else settings

    def _validate(self, section: str, values: dict[str, Any]) -> Any:
        return getattr(self.proxy.settings.with_overrides({section: values}), section)

    # ------------------------------------------------------------------------------------------ start-up

    async def start(self) -> None:
        """Create the topics if missing, read the control topic to its end and apply it: before serving. Bounded
        by ``startup_timeout_s``; past it the instance serves with its local settings (logged)."""
        self._loop = asyncio.get_running_loop()
        timeout = self.settings.startup_timeout_s
        self._thread = threading.Thread(target=self._follow, name="sluice-fleet-follower", daemon=True)
        self._thread.start()
        try:
            await asyncio.wait_for(self._caught_up.wait(), timeout)
        except TimeoutError:
            log.warning("fleet_start_without_control", fleet=self.name, topic=self.topic, timeout_s=timeout,
                        using="the local settings until the control topic answers")
        else:
            log.info("fleet_caught_up", fleet=self.name, topic=self.topic, revisions=self.state.revisions())

    def serving(self) -> None:
        """The listeners are open: publish this instance's status from now on."""
        if self._loop is None:
            return
        if not self.instance_id:
            self.instance_id = f"{self.host}:{self.proxy.bootstrap_port}"
        self._status_producer = self._status_producer_ready
        self._status_task = self._loop.create_task(self._publish_status())

    async def stop(self) -> None:
        """A clean stop: the status tombstone (bounded), the follower thread ended."""
        if self._status_task is not None:
            self._status_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._status_task
        producer = self._status_producer
        if producer is not None and self.instance_id:
            with contextlib.suppress(KafkaException, BufferError):
                producer.produce(self.status_topic, None, self.instance_id.encode())
            await asyncio.to_thread(producer.flush, 5.0)
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10.0)

    # ------------------------------------------------------------------------------------ the follower

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(fn, *args)

    def _follow(self) -> None:
        """The follower thread: topics ensured, partitions assigned from the beginning, records posted to the loop
        in order, the end of each partition noted, reachability probed."""
        # A connection failure librdkafka reports (error_cb) only asks for a probe now; the probe's answer is what
        # reachability says. The report is served by poll(), possibly long after the failure: the failures queued
        # while a probe waited arrive after the probe that found the cluster back, and set as such they would say
        # "unreachable" (gauge and log) about a cluster that answers.
        suspect = threading.Event()
        consumer = Consumer({
            **self._conf, "group.id": f"sluice-fleet-{self.name}", "enable.auto.commit": False,
            "enable.auto.offset.store": False, "isolation.level": "read_committed", "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            "error_cb": lambda err: suspect.set() if err.code() in (
                KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT, KafkaError._RESOLVE) else None,
        })  # fmt: skip
        try:
            partitions = self._assign(consumer)
            if partitions is None:
                return
            at_end: set[int] = set()
            last_probe = self.clock()
            while not self._stop.is_set():
                msg = consumer.poll(_POLL_S)
                if msg is None:
                    if suspect.is_set() or self.clock() - last_probe >= PROBE_INTERVAL_S:
                        suspect.clear()
                        last_probe = self.clock()
                        self._probe(consumer)
                    continue
                last_probe = self.clock()
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        at_end.add(msg.partition() or 0)
                        self._post(self._set_reachable, True, "")
                        if at_end >= partitions:
                            self._post(self._caught_up.set)
                    else:
                        self._post(self._set_reachable, False, str(err))
                    continue
                self._post(self._on_record, msg.key(), msg.value(), msg.partition(), msg.offset())
        except Exception as exc:  # the thread must not die silently: the instance would stop following
            log.error("fleet_follower_failed", fleet=self.name, error=repr(exc))
        finally:
            with contextlib.suppress(Exception):
                consumer.close()

    def _assign(self, consumer: Consumer) -> set[int] | None:
        """Ensure the topics exist and assign the control topic's partitions from the beginning; retried until
        the cluster answers or stop(). None on stop."""
        while not self._stop.is_set():
            try:
                self._ensure_topics()
                meta = consumer.list_topics(self.topic, timeout=PROBE_INTERVAL_S)
                topic = meta.topics.get(self.topic)
                if topic is None or topic.error is not None or not topic.partitions:
                    raise KafkaException(topic.error if topic is not None and topic.error else
                                         KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
                partitions = set(topic.partitions)
                consumer.assign([TopicPartition(self.topic, p, 0) for p in sorted(partitions)])
                # Offset 0, not OFFSET_BEGINNING: identical on a fresh topic, and the compacted log keeps offsets
                # (an offset below the log start is reset by auto.offset.reset = earliest).
                self._post(self._set_reachable, True, "")
                return partitions
            except KafkaException as exc:
                self._post(self._set_reachable, False, str(exc.args[0] if exc.args else exc))
                self._stop.wait(PROBE_INTERVAL_S)
        return None

    def _ensure_topics(self) -> None:
        """Create the control topic (compacted) and the status topic (compacted, records expire) if missing."""
        admin = AdminClient(self._conf)
        existing = admin.list_topics(timeout=PROBE_INTERVAL_S * 2).topics
        brokers = len(admin.list_topics(timeout=PROBE_INTERVAL_S * 2).brokers)
        rf = self.settings.replication_factor or min(3, max(1, brokers))
        wanted = []
        if self.topic not in existing:
            # One partition: the whole fleet's changes in one order. Compacted: the latest record per section
            # is kept forever (Kafka's cleanup.policy=compact; min.compaction.lag keeps recent history readable).
            wanted.append(NewTopic(self.topic, 1, rf, config={"cleanup.policy": "compact",
                                                               "min.insync.replicas": str(min(2, rf))}))
        if self.status_topic not in existing:
            # Compacted and deleted: the latest status per instance, and a silent instance's record ages out.
            wanted.append(NewTopic(self.status_topic, 1, rf, config={"cleanup.policy": "compact,delete",
                                                                      "retention.ms": str(7 * 86_400_000)}))
        if not wanted:
            return
        for topic, future in admin.create_topics(wanted, request_timeout=PROBE_INTERVAL_S * 5).items():
            try:
                future.result()
                log.info("fleet_topic_created", topic=topic, replication_factor=rf)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # another instance was first
                    raise

    def _probe(self, consumer: Consumer) -> None:
        try:
            consumer.list_topics(self.topic, timeout=PROBE_INTERVAL_S)
        except KafkaException as exc:
            self._post(self._set_reachable, False, str(exc.args[0] if exc.args else exc))
        else:
            self._post(self._set_reachable, True, "")

    # ---------------------------------------------------------------------------- on the event loop

    def _set_reachable(self, reachable: bool, error: str) -> None:
        self.metrics.reachable.set(1 if reachable else 0)
        if reachable != self._reachable:
            if reachable:
                log.info("fleet_control_reachable", fleet=self.name, topic=self.topic)
            elif self._reachable is not None or error:
                log.warning("fleet_control_unreachable", fleet=self.name, topic=self.topic, error=error,
                            serving="with the settings applied last")
            self._reachable = reachable

    def _on_record(self, key: bytes | None, value: bytes | None, partition: int, offset: int) -> None:
        self._set_reachable(True, "")
        try:
            change, validated = self.state.offer(key, value)
        except Skipped as skip:
            self.metrics.skipped.labels(skip.reason).inc()
            log.warning("fleet_record_skipped", fleet=self.name, topic=self.topic, partition=partition,
                        offset=offset, reason=skip.reason, detail=skip.detail)
        else:
            self.proxy.apply_dynamic(self.proxy.settings.model_copy(update={change.section: validated}))
            self.metrics.applied.labels(change.section).inc()
            self.metrics.revision.labels(change.section).set(change.revision)
            log.info("fleet_applied", fleet=self.name, section=change.section, revision=change.revision,
                     changed_by=change.changed_by, changed_at=change.changed_at, offset=offset)
            self._publish_once()  # the fleet's status shows the new revision now, not at the next interval
        event, self._applied_event = self._applied_event, asyncio.Event()
        event.set()

    async def _wait_applied(self, section: str, revision: int, timeout: float) -> bool:
        deadline = self.clock() + timeout
        while self.state.revision(section) < revision:
            left = deadline - self.clock()
            if left <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._applied_event.wait(), left)
        return True

    # ------------------------------------------------------------------------------------------- writes

    async def write(self, section: str, values: dict[str, Any], based_on: int | None, changed_by: str) -> int:
        """Write ``values`` (validated by the caller) as the fleet's ``section``; the new revision once this
        instance applied it (or once written, if that takes longer than ``write_timeout_s``). WriteRefused."""
        timeout = self.settings.write_timeout_s
        async with self._write_lock:  # this instance's writers one at a time (the fencing is for the fleet's)
            try:
                revision = await asyncio.wait_for(
                    asyncio.to_thread(self._write_blocking, section, values, based_on, changed_by, timeout),
                    timeout + 5.0)
            except TimeoutError:
                self.metrics.writes.labels("failed").inc()
                raise WriteRefused(503, f"the control topic {self.topic} did not answer within {timeout:.0f} s; "
                                        "nothing changed") from None
            except WriteRefused as refused:
                self.metrics.writes.labels({409: "conflict", 403: "refused"}.get(refused.status, "failed")).inc()
                raise
        self.metrics.writes.labels("written").inc()
        if not await self._wait_applied(section, revision, timeout):
            log.warning("fleet_write_not_applied_yet", section=section, revision=revision, timeout_s=timeout)
        return revision

    def _write_blocking(self, section: str, values: dict[str, Any], based_on: int | None, changed_by: str,
                        timeout: float) -> int:
        deadline = self.clock() + timeout
        while True:
            try:
                return self._write_once(section, values, based_on, changed_by, timeout, deadline)
            except _Again:
                # CONCURRENT_TRANSACTIONS: the previous write's transaction is still being completed by its
                # coordinator (markers written); Kafka's own producer retries InitProducerId then (KIP-98).
                if self.clock() >= deadline:
                    raise WriteRefused(503, f"the control topic {self.topic}: the previous change is still being "
                                            "committed; nothing changed, retry") from None
                time.sleep(0.1)  # in a worker thread; bounded by the deadline

    def _write_once(self, section: str, values: dict[str, Any], based_on: int | None, changed_by: str,
                    timeout: float, deadline: float) -> int:
        producer = Producer({**self._conf, "transactional.id": f"sluice-fleet-{self.name}",
                             "transaction.timeout.ms": max(1000, int(timeout * 1000))})
        committing = False
        try:
            try:  # fences the fleet's other writers (KIP-98)
                _retrying(producer.init_transactions, deadline, self.clock)
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if isinstance(err, KafkaError) and err.code() == KafkaError.CONCURRENT_TRANSACTIONS:
                    raise _Again from None
                raise
            # What is left of the write's deadline, not a fresh timeout: the whole write ends by write_timeout_s,
            # before write() gives up on it and answers "nothing changed" (a late commit would make that false)
            state = self._read_to_end(max(0.1, deadline - self.clock()))
            try:
                revision = next_revision(state, section, based_on)
            except Conflict as conflict:
                raise WriteRefused(409, str(conflict), conflict.current) from None
            change = Change(self.name, section, revision, values, changed_by, _now_iso())
            key, value = encode(change)
            producer.begin_transaction()
            producer.produce(self.topic, value, key)
            committing = True
            # Logged before the commit: no instance can read the record earlier (bench/fleet.py times from here)
            log.info("fleet_committing", fleet=self.name, section=section, revision=revision)
            _retrying(producer.commit_transaction, deadline, self.clock)
            log.info("fleet_written", fleet=self.name, section=section, revision=revision, changed_by=changed_by)
            return revision
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            code = err.code() if isinstance(err, KafkaError) else None
            with contextlib.suppress(KafkaException):
                producer.abort_transaction(1.0)
            if code in _AUTHORIZATION:
                raise WriteRefused(403, f"not authorized to change the fleet: Sluice's principal may not write "
                                        f"the control topic {self.topic} (transactional id "
                                        f"sluice-fleet-{self.name}): {err}") from None
            if code in _FENCED:
                raise WriteRefused(409, f"[{section}] another writer changed the fleet meanwhile ({err}); read it "
                                        "again and retry") from None
            outcome = ("the commit's outcome is unknown: read the section again before retrying" if committing
                       else "nothing changed")
            raise WriteRefused(503, f"the control topic {self.topic} could not be written ({err}); {outcome}") from None
        finally:
            # Closed now, not when garbage-collected: a producer left alive (its frame held by the exception's
            # traceback) would go on retrying InitProducerId once the cluster answers, and fence the next writer.
            with contextlib.suppress(Exception):
                producer.purge()
            with contextlib.suppress(Exception):
                producer.close()
            del producer

    def _read_to_end(self, timeout: float) -> FleetState:
        """The control topic folded from its beginning to its end, as committed now (a fresh consumer)."""
        state = FleetState(self.name, self.state.sections, self._validate)
        for key, value in read_to_end(self._conf, self.topic, timeout, self.clock):
            with contextlib.suppress(Skipped):
                state.offer(key, value)
        return state

    # ------------------------------------------------------------------------------------------- status

    def status_record(self) -> StatusRecord:
        ports = self.proxy.listener_ports()
        return StatusRecord(
            fleet=self.name, instance=self.instance_id, host=self.host, pid=os.getpid(),
            version=sluice_version(), started_at=self.started_at, published_at=_now_iso(),
            listeners={"bootstrap" if n is None else f"broker-{n}": p for n, p in ports.items()},
            revisions=self.state.revisions(), control_reachable=bool(self._reachable),
        )  # fmt: skip

    def _publish_once(self) -> None:
        producer = self._status_producer
        if producer is None or not self.instance_id:
            return
        key, value = self.status_record().encode()
        try:
            producer.produce(self.status_topic, value, key)
            self.metrics.status_published.inc()
        except (KafkaException, BufferError) as exc:  # the control cluster down: the next one will say it
            log.debug("fleet_status_not_published", error=str(exc))
        producer.poll(0)

    async def _publish_status(self) -> None:
        while True:
            self._publish_once()
            await asyncio.sleep(self.settings.status_interval_s)


class _Again(Exception):
    """Start the write again with a new producer."""


def _retrying(call: Callable[[float], object], deadline: float, clock: Callable[[], float]) -> None:
    """``call(timeout)`` again while it fails with a retriable error (librdkafka's transactional API: "retriable
    errors: call again") until ``deadline``."""
    while True:
        try:
            call(max(0.1, deadline - clock()))
            return
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if not (isinstance(err, KafkaError) and err.retriable()) or clock() >= deadline:
                raise
            time.sleep(0.05)  # in a worker thread; the deadline bounds the retries


def read_to_end(conf: dict[str, Any], topic: str, timeout: float,
                clock: Callable[[], float] = time.monotonic) -> list[tuple[bytes | None, bytes | None]]:
    """Every committed record of ``topic`` from its beginning to its end now, (key, value) in partition order (a
    fresh consumer, no group: nothing is committed). Blocking; KafkaException (authorization, timeout...)."""
    consumer = Consumer({**conf, "group.id": "sluice-fleet-reader", "enable.auto.commit": False,
                         "isolation.level": "read_committed", "enable.partition.eof": True,
                         "auto.offset.reset": "earliest"})
    out: list[tuple[bytes | None, bytes | None]] = []
    try:
        meta = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        if meta is None or meta.error is not None:
            raise KafkaException(meta.error if meta is not None and meta.error else
                                 KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
        partitions = set(meta.partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        at_end: set[int] = set()
        deadline = clock() + timeout
        while at_end < partitions:
            if clock() > deadline:
                raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"reading {topic} to its end"))
            msg = consumer.poll(_POLL_S)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    at_end.add(msg.partition() or 0)
                elif err.fatal() or err.code() in _AUTHORIZATION:
                    raise KafkaException(err)
                continue
            out.append((msg.key(), msg.value()))
        return out
    finally:
        consumer.close()
