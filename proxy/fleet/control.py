"""The fleet's I/O on an instance: the control topic followed, changes written (writer.py), the instance's status
published (confluent-kafka; its blocking calls run in threads, never on the proxy's event loop). The rules are
proxy/fleet/records.py's.

Start-up (:meth:`FleetControl.start`, before any listener opens): the control and status topics are created if
missing (topics.py: the settings the design relies on), the control topic's settings are checked, and the topic
is read from its beginning to its end (``read_committed``: a writer's aborted record is never applied) into a fresh
:class:`~proxy.fleet.records.FleetState`, applied at the end in one step. Then the follower thread hands each
record to the event loop in topic order (``call_soon_threadsafe`` keeps the order), where it is folded and applied
through ``Proxy.apply_dynamic``, the path of the admin API's PUT. If the control cluster does not answer within
``startup_timeout_s``, ``[fleet] on_unreachable`` decides: ``serve-local`` serves with the local settings and
applies the fleet's when it answers; ``wait`` opens no listener (and ``/readyz`` says not ready) until it has
read the topic.

**Read again from the beginning** (a *refold*: into a fresh state, applied at the end, as at start-up) when the
topic was created again (its id changed, KIP-516, or its offsets went back: the revisions start again) and when
the control cluster answers again after being unreachable (a tombstone written meanwhile may have been compacted
away: a refold finds the section gone all the same). Sections the fresh state no longer sets go back to the
instance's own settings (file, environment, state file), as a tombstone does.

Control cluster down: the follower thread probes the topic every :data:`PROBE_INTERVAL_S` while no record
arrives, and at once when librdkafka reports a connection failure (the probe decides, not the report, which may be
stale); ``sluice_fleet_control_reachable`` says 0 and one log event says so at each transition, the instance keeps
serving with what it applied, and the changes made meanwhile arrive when the cluster is back.

Refused for want of a permission, the follower, the status and a write log one ``kafka_not_authorized`` event per
missing ACL (proxy/kafka_acls.py), never "unreachable".
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from prometheus_client import CollectorRegistry, Counter, Gauge

from ..accesslog import get_logger
from ..config import ConfigError
from ..kafka_acls import AclReporter, principal_name
from ..metrics import sluice_version
from ..reconfigure import Written
from .history import Entry
from .kafka_config import client_config
from .records import SKIP_REASONS, Change, FleetState, Skipped
from .status import StatusRecord
from .topics import (
    CONTROL_TOPIC_CONFIG,
    STATUS_TOPIC_CONFIG,
    Denied,
    config_drift,
    create_missing,
    describe_configs,
    topic_id,
)
from .writer import FleetWriter, WriteRefused, now_iso

if TYPE_CHECKING:
    from ..server import Proxy

__all__ = ["FleetControl", "FleetMetrics", "WriteRefused"]

log = get_logger("sluice.fleet")

#: how often the follower asks the control cluster about the topic while no record arrives (reachability, id)
PROBE_INTERVAL_S = 2.0
#: librdkafka's poll timeout in the follower thread: how soon it notices stop()
_POLL_S = 0.2
_TRANSPORT = frozenset({KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT, KafkaError._RESOLVE})
_CHECKED_SETTINGS = ("cleanup.policy", "unclean.leader.election.enable", "delete.retention.ms")


class FleetMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.applied = Counter("sluice_fleet_records_applied", "Control records applied, per section (a "
                               "tombstone: the section back to the local settings).", ["section"], registry=registry)
        self.skipped = Counter("sluice_fleet_records_skipped", "Control records skipped (not applied), per reason: "
                               "garbage, schema, fleet, section, stale, invalid.", ["reason"], registry=registry)
        for reason in SKIP_REASONS:
            self.skipped.labels(reason)
        self.revision = Gauge("sluice_fleet_revision", "The revision of each section's latest control record this "
                              "instance folded (0: none).", ["section"], registry=registry)
        self.reachable = Gauge("sluice_fleet_control_reachable", "1 while the control cluster answers, 0 while "
                               "it does not (the instance serves with the settings applied last).",
                               registry=registry)
        self.writes = Counter("sluice_fleet_writes", "Changes this instance wrote to the control topic, per "
                              "outcome: written, conflict, refused, failed.", ["outcome"], registry=registry)
        self.status_published = Counter("sluice_fleet_status_published", "Status records this instance "
                                        "published.", registry=registry)
        self.refolds = Counter("sluice_fleet_refolds", "Times the control topic was read again from its "
                               "beginning: the topic created again, or the control cluster back.", registry=registry)
        self.topic_setting = Gauge("sluice_fleet_control_topic_setting_unexpected", "1 when a setting of the control "
                                   "topic is not what the fleet relies on (an operator changed it), per setting.",
                                   ["setting"], registry=registry)
        for setting in _CHECKED_SETTINGS:
            self.topic_setting.labels(setting).set(0)


class FleetControl:
    """One instance's part of the fleet (see the module docstring). Lives on the proxy's event loop."""

    def __init__(self, proxy: Proxy, clock: Callable[[], float] = time.monotonic) -> None:
        self.proxy = proxy
        self.settings = fleet = proxy.settings.fleet
        self.clock = clock
        self.name = fleet.name
        self.scope = f"fleet {fleet.name}"
        self.topic, self.status_topic = fleet.control, fleet.status
        self.metrics = FleetMetrics(proxy.metrics.registry)
        sections = tuple(proxy.settings.dynamic_sections)
        #: the settings of the sections without the fleet's (file, environment, state file): what a section the
        #: fleet no longer sets goes back to
        self.local = proxy.settings
        self.state = FleetState(fleet.name, sections, self._validate)
        #: a read from the beginning in progress (start-up, refold): folded here, applied at its end
        self._pending: FleetState | None = FleetState(fleet.name, sections, self._validate)
        #: per partition, the highest offset folded (a refold does not count or log a record twice)
        self._folded: dict[int, int] = {}
        for section in sections:  # every series exported from the start (the dashboard's panels show 0, not nothing)
            self.metrics.revision.labels(section).set(0)
            self.metrics.applied.labels(section)
        for outcome in ("written", "conflict", "refused", "failed"):
            self.metrics.writes.labels(outcome)
        creds = (proxy.settings.upstream.tls, proxy.settings.upstream.sasl) if fleet.credentials == "upstream" else (
            fleet.tls, fleet.sasl)
        self.acls = AclReporter(principal_name(creds[1].username if creds[1].mechanism else "", creds[0].cert_file),
                                log.warning)
        self._conf = client_config(fleet, proxy.settings.upstream, f"sluice-fleet-{fleet.name}")
        self.instance_id = fleet.instance_id
        self.host = socket.gethostname()
        self.version = sluice_version()  # read once: a package metadata lookup, ~1 ms, each status record
        self.started_at = now_iso()
        self.writer = FleetWriter(self._conf, fleet, sections, self._validate, self.acls, lambda: self.instance_id,
                                  clock)
        self.topic_id = ""
        self._missing_said = False
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
        """``settings`` (the file's, on SIGHUP) with the fleet's sections over them: the fleet still wins; the
        rest becomes what a section the fleet no longer sets goes back to."""
        self.local = settings
        sections = self.state.settings_of()
        return settings.with_overrides(dict(sections)) if sections else settings

    def ready(self) -> bool:
        """/readyz's part of the fleet: with ``on_unreachable = "wait"``, not before the control topic was read."""
        return self.settings.on_unreachable == "serve-local" or self._caught_up.is_set()

    def _validate(self, section: str, values: dict[str, Any]) -> Any:
        return getattr(self.proxy.settings.with_overrides({section: values}), section)

    # ------------------------------------------------------------------------------------------ start-up

    async def start(self) -> None:
        """Create the topics if missing, read the control topic to its end and apply it: before serving. Past
        ``startup_timeout_s``, ``on_unreachable`` decides (see the module docstring)."""
        self._loop = asyncio.get_running_loop()
        timeout = self.settings.startup_timeout_s
        self._thread = threading.Thread(target=self._follow, name="sluice-fleet-follower", daemon=True)
        self._thread.start()
        try:
            await asyncio.wait_for(self._caught_up.wait(), timeout)
        except TimeoutError:
            if self.settings.on_unreachable == "serve-local":
                log.warning("fleet_start_without_control", fleet=self.name, topic=self.topic, timeout_s=timeout,
                            using="the local settings until the control topic answers")
                return
            log.warning("fleet_waiting_for_control", fleet=self.name, topic=self.topic, timeout_s=timeout,
                        listeners="closed, /readyz not ready, until the control topic was read")
            await self._caught_up.wait()
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

    def _denied(self, denied: Denied, needed_by: str) -> None:
        self._post(self._report_denied, denied, needed_by)

    def _report_denied(self, denied: Denied, needed_by: str) -> None:
        self.acls.missing(denied.resource, denied.name, denied.operation, needed_by, denied.error)

    def _follow(self) -> None:
        """The follower thread: topics ensured and checked, partitions assigned from the beginning, records posted
        to the loop in order, the end of the partition noted, reachability and the topic's id probed."""
        # A connection failure librdkafka reports (error_cb) only asks for a probe now; the probe's answer is what
        # reachability says. The report is served by poll(), possibly long after the failure: the failures queued
        # while a probe waited arrive after the probe that found the cluster back, and set as such they would say
        # "unreachable" (gauge and log) about a cluster that answers.
        suspect = threading.Event()
        # A group id although nothing is committed: confluent-kafka's Consumer needs one, and librdkafka then looks
        # its coordinator up (Describe on the group: proxy/kafka_acls.py).
        consumer = Consumer({
            **self._conf, "group.id": self.settings.transactional_id, "enable.auto.commit": False,
            "enable.auto.offset.store": False, "isolation.level": "read_committed", "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            "error_cb": lambda err: suspect.set() if err.code() in _TRANSPORT else None,
        })  # fmt: skip
        admin = AdminClient(self._conf)
        try:
            assigned = self._assign(consumer, admin)
            if assigned is None:
                return
            partitions, known_id = assigned
            at_end: set[int] = set()
            last: dict[int, int] = {}
            last_probe = self.clock()
            cut_off = False
            while not self._stop.is_set():
                msg = consumer.poll(_POLL_S)
                if msg is None:
                    if suspect.is_set() or self.clock() - last_probe >= PROBE_INTERVAL_S:
                        suspect.clear()
                        last_probe = self.clock()
                        answered, tid = self._probe(admin)
                        if not answered:
                            cut_off = True
                        elif cut_off or (tid and tid != known_id):
                            # back after an outage, or the topic created again: read it again from its beginning
                            self._refold(consumer, partitions, tid, new_topic=bool(tid and tid != known_id))
                            known_id = tid or known_id
                            cut_off = False
                            at_end.clear()
                            last.clear()
                    continue
                last_probe = self.clock()
                err = msg.error()
                partition = msg.partition() or 0
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        at_end.add(partition)
                        self._post(self._set_reachable, True, "")
                        if at_end >= partitions:
                            self._post(self._at_end)
                    elif err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
                        self._denied(Denied("Group", self.settings.transactional_id, "Describe", err.str()),
                                     "[fleet]: following the control topic")
                    elif err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                        self._denied(Denied("Topic", self.topic, "Read", err.str()),
                                     "[fleet]: following the control topic")
                    elif err.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
                        self._post(self._topic_missing, err.str())  # deleted; created again, it is read again
                    else:
                        self._post(self._set_reachable, False, str(err))
                    continue
                offset = msg.offset() or 0
                if offset <= last.get(partition, -1):
                    # Offsets went back: the topic was created again (librdkafka reset to its beginning); what
                    # follows is the new topic, read from its beginning.
                    self._post(self._begin_refold, True, "")
                    at_end.clear()
                    last.clear()
                last[partition] = offset
                self._post(self._on_record, msg.key(), msg.value(), partition, offset)
        except Exception as exc:  # the thread must not die silently: the instance would stop following
            log.error("fleet_follower_failed", fleet=self.name, error=repr(exc))
        finally:
            with contextlib.suppress(Exception):
                consumer.close()

    def _assign(self, consumer: Consumer, admin: AdminClient) -> tuple[set[int], str] | None:
        """Ensure the topics exist, check the control topic's settings and assign its partitions from the
        beginning; retried until the cluster answers or stop(). (The partitions, the topic's id); None on stop."""
        timeout = PROBE_INTERVAL_S * 2
        created: list[str] = []
        while not self._stop.is_set():
            try:
                try:
                    created += create_missing(admin, {self.topic: CONTROL_TOPIC_CONFIG,
                                                      self.status_topic: STATUS_TOPIC_CONFIG},
                                              self.settings.replication_factor, timeout, self._created)
                except Denied as denied:  # pre-created topics need no Create: reading tells whether they exist
                    self._denied(denied, "[fleet]: the fleet's topics created when missing")
                try:
                    self._post(self._check_settings, describe_configs(admin, self.topic, timeout))
                except Denied as denied:
                    self._denied(denied, "[fleet]: the control topic's settings checked")
                meta = consumer.list_topics(self.topic, timeout=timeout)
                topic = meta.topics.get(self.topic)
                if topic is None or topic.error is not None or not topic.partitions:
                    error = topic.error if topic is not None and topic.error else KafkaError(
                        KafkaError.UNKNOWN_TOPIC_OR_PART)
                    if error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                        raise Denied("Topic", self.topic, "Read", error.str())
                    raise KafkaException(error)
                tid = ""
                with contextlib.suppress(Denied):
                    tid = topic_id(admin, self.topic, timeout)
                self._post(self._set_topic_id, tid)
                partitions = set(topic.partitions)
                # Offset 0, not OFFSET_BEGINNING: identical on a fresh topic, and the compacted log keeps offsets
                # (an offset below the log start is reset by auto.offset.reset = earliest).
                consumer.assign([TopicPartition(self.topic, p, 0) for p in sorted(partitions)])
                self._post(self._set_reachable, True, "")
                return partitions, tid
            except Denied as denied:
                self._denied(denied, "[fleet]: following the control topic")
                self._stop.wait(PROBE_INTERVAL_S)
            except KafkaException as exc:
                error = exc.args[0] if exc.args else exc
                if isinstance(error, KafkaError) and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                    # The cluster answered: the topic is not there. Just created, its metadata is on its way to
                    # every broker: asked again shortly. Else (not creatable here) said once, asked again later.
                    self._post(self._set_reachable, True, "")
                    if self.topic in created:
                        self._stop.wait(_POLL_S)
                        continue
                    self._post(self._topic_missing, error.str(), True)
                else:
                    self._post(self._set_reachable, False, str(error))
                self._stop.wait(PROBE_INTERVAL_S)
        return None

    def _refold(self, consumer: Consumer, partitions: set[int], tid: str, new_topic: bool) -> None:
        self._post(self._begin_refold, new_topic, tid)
        consumer.assign([TopicPartition(self.topic, p, 0) for p in sorted(partitions)])

    def _probe(self, admin: AdminClient) -> tuple[bool, str]:
        """(whether the cluster answered, the control topic's id as it says)."""
        try:
            tid = topic_id(admin, self.topic, PROBE_INTERVAL_S)
        except Denied as denied:
            self._denied(denied, "[fleet]: following the control topic")
            self._post(self._set_reachable, True, "")
            return True, ""
        except KafkaException as exc:
            self._post(self._set_reachable, False, str(exc.args[0] if exc.args else exc))
            return False, ""
        self._post(self._set_reachable, True, "")
        return True, tid

    @staticmethod
    def _created(topic: str, replication_factor: int) -> None:
        log.info("fleet_topic_created", topic=topic, replication_factor=replication_factor)

    # ---------------------------------------------------------------------------- on the event loop

    def _check_settings(self, found: dict[str, str]) -> None:
        drift = {setting: (expected, value) for setting, expected, value in config_drift(found)}
        for setting in _CHECKED_SETTINGS:
            self.metrics.topic_setting.labels(setting).set(1 if setting in drift else 0)
        for setting, (expected, value) in sorted(drift.items()):
            log.warning("fleet_control_topic_setting", topic=self.topic, setting=setting, expected=expected,
                        found=value)

    def _set_topic_id(self, tid: str) -> None:
        self.topic_id = tid

    def _topic_missing(self, error: str, starting: bool = False) -> None:
        """The control topic is not there (deleted; or, ``starting``, neither there nor created): said once."""
        if self.topic_id or (starting and not self._missing_said):
            log.warning("fleet_control_topic_missing", fleet=self.name, topic=self.topic, error=error,
                        serving="with the settings applied last; read again when it is created")
            self.topic_id = ""
            self._missing_said = True

    def _set_reachable(self, reachable: bool, error: str) -> None:
        self.metrics.reachable.set(1 if reachable else 0)
        if reachable != self._reachable:
            if reachable:
                log.info("fleet_control_reachable", fleet=self.name, topic=self.topic)
            elif self._reachable is not None or error:
                log.warning("fleet_control_unreachable", fleet=self.name, topic=self.topic, error=error,
                            serving="with the settings applied last")
            self._reachable = reachable

    def _begin_refold(self, new_topic: bool, tid: str) -> None:
        self.metrics.refolds.inc()
        log.info("fleet_reading_again", fleet=self.name, topic=self.topic,
                 why="the topic was created again" if new_topic else "the control cluster answers again")
        if new_topic:
            self._folded.clear()
        if tid:
            self.topic_id = tid
        self._pending = FleetState(self.name, self.state.sections, self._validate)

    def _on_record(self, key: bytes | None, value: bytes | None, partition: int, offset: int) -> None:
        self._set_reachable(True, "")
        seen = offset <= self._folded.get(partition, -1)  # folded before this refold: counted and logged then
        self._folded[partition] = max(offset, self._folded.get(partition, -1))
        state = self._pending if self._pending is not None else self.state
        try:
            change, validated = state.offer(key, value, offset)
        except Skipped as skip:
            if not seen:
                self.metrics.skipped.labels(skip.reason).inc()
                log.warning("fleet_record_skipped", fleet=self.name, topic=self.topic, partition=partition,
                            offset=offset, reason=skip.reason, detail=skip.detail)
        else:
            if self._pending is None:
                self._apply(change, validated, offset)
        if self._pending is None:
            self._folded_event()

    def _at_end(self) -> None:
        """The end of the topic: a read from the beginning (start-up, refold) is applied now, in one step."""
        fresh, self._pending = self._pending, None
        if fresh is not None:
            before, self.state = self.state, fresh
            for section in fresh.sections:
                old, new = before.applied.get(section), fresh.applied.get(section)
                if old != new:
                    if new is not None:
                        self._apply(new[0], new[1], None)
                    else:
                        self._apply(Change(self.name, section, fresh.revision(section), None), None, None)
                self.metrics.revision.labels(section).set(fresh.revision(section))
            self._folded_event()
        self._caught_up.set()

    def _apply(self, change: Change, validated: Any, offset: int | None) -> None:
        section = change.section
        value = validated if validated is not None else getattr(self.local, section)
        self.proxy.apply_dynamic(self.proxy.settings.model_copy(update={section: value}))
        self.metrics.applied.labels(section).inc()
        self.metrics.revision.labels(section).set(self.state.revision(section))
        log.info("fleet_applied", fleet=self.name, section=section, revision=change.revision,
                 source="fleet" if validated is not None else "local", changed_by=change.changed_by,
                 changed_at=change.changed_at, offset=offset)
        self._publish_once()  # the fleet's status shows the new revision now, not at the next interval

    def _folded_event(self) -> None:
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

    async def write(self, section: str, values: dict[str, Any], based_on: int | None, changed_by: str, *,
                    dry_run: bool = False, rollback_of: int | None = None) -> Written:
        """Write ``values`` (validated by the caller) as the fleet's ``section`` (or check that it could be:
        ``dry_run``); once this instance applied it (or once written, if that takes longer than
        ``write_timeout_s``). WriteRefused."""
        timeout = self.settings.write_timeout_s
        async with self._write_lock:  # this instance's writers one at a time (the fencing is for the fleet's)
            try:
                written = await asyncio.wait_for(asyncio.to_thread(
                    self.writer.write, section, values, based_on, changed_by, timeout, dry_run=dry_run,
                    rollback_of=rollback_of), timeout + 5.0)
            except TimeoutError:
                self.metrics.writes.labels("failed").inc()
                raise WriteRefused(503, f"the control topic {self.topic} did not answer within {timeout:.0f} s; "
                                        "nothing changed") from None
            except WriteRefused as refused:
                if not dry_run:
                    outcome = {409: "conflict", 403: "refused"}.get(refused.status, "failed")
                    self.metrics.writes.labels(outcome).inc()
                raise
        if written.revision is None:
            return written
        self.metrics.writes.labels("written").inc()
        if not await self._wait_applied(section, written.revision, timeout):
            log.warning("fleet_write_not_applied_yet", section=section, revision=written.revision, timeout_s=timeout)
        return written

    async def settings_at(self, section: str, revision: int) -> dict[str, Any]:
        """The settings ``section`` had at ``revision`` (the history): what a rollback writes again."""
        try:
            return await asyncio.to_thread(self.writer.settings_at, section, revision, self.settings.write_timeout_s)
        except KafkaException as exc:
            raise WriteRefused(503, f"the history topic {self.settings.history} could not be read "
                                    f"({exc.args[0] if exc.args else exc})") from None

    async def history(self) -> list[Entry]:
        return await asyncio.to_thread(self.writer.history, self.settings.write_timeout_s)

    # ------------------------------------------------------------------------------------------- status

    def status_record(self) -> StatusRecord:
        ports = self.proxy.listener_ports()
        return StatusRecord(
            fleet=self.name, instance=self.instance_id, host=self.host, pid=os.getpid(),
            version=self.version, started_at=self.started_at, published_at=now_iso(),
            listeners={"bootstrap" if n is None else f"broker-{n}": p for n, p in ports.items()},
            revisions=self.state.revisions(), hashes=self.state.hashes(), topic_id=self.topic_id,
            control_reachable=bool(self._reachable), interval_s=self.settings.status_interval_s,
        )  # fmt: skip

    def _publish_once(self) -> None:
        producer = self._status_producer
        if producer is None or not self.instance_id:
            return
        key, value = self.status_record().encode()
        try:
            producer.produce(self.status_topic, value, key, on_delivery=self._status_delivered)
            self.metrics.status_published.inc()
        except (KafkaException, BufferError) as exc:  # the control cluster down: the next one will say it
            log.debug("fleet_status_not_published", error=str(exc))
        producer.poll(0)

    def _status_delivered(self, err: KafkaError | None, _msg: Any) -> None:
        if err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            self.acls.missing("Topic", self.status_topic, "Write", "[fleet]: the instance's status records",
                              err.str())

    async def _publish_status(self) -> None:
        while True:
            self._publish_once()
            await asyncio.sleep(self.settings.status_interval_s)
