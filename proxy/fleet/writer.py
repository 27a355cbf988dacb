"""A change of the fleet written (confluent-kafka; blocking, run in a worker thread by proxy/fleet/control.py).

One transactional producer per write, with the fleet's one ``transactional.id``. ``init_transactions`` fences
every other writer of the fleet (KIP-98: the coordinator bumps the producer epoch, and a writer fenced between its
check and its commit fails with PRODUCER_FENCED / INVALID_PRODUCER_EPOCH, its transaction aborted) and completes
any transaction left open. The writer then reads the control topic to its end (``read_committed``), checks the
revision the change is based on against the section's latest (records.py ``check_based_on``), produces the control
record, learns its offset (its revision: records.py), produces the history record naming that revision and who
made the change (history.py), and commits both in one transaction: the history has every change and nothing
else. So two operators' changes based on the same revision cannot both be committed: the second writer either
reads the first's record (Conflict: HTTP 409) or is fenced before committing (refused, 409 too). A writer that
bypasses Sluice (produces without the transactional id) is not fenced; its record still gets a revision of its
own (its offset) and is folded by the same rules on every instance alike.

A dry run reads and checks as a write does and writes nothing: no producer, so no fencing either (that would
write the transaction log).

Refused for want of a permission, the answer names the ACL (proxy/kafka_acls.py): the transactional id from
``init_transactions``' error, the topics from the cluster's authorized operations (KIP-430), since a refused
transaction does not say which of its partitions it was.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from ..accesslog import get_logger
from ..config import FleetSettings
from ..kafka_acls import AclReporter
from ..reconfigure import ChangeRefused, Written
from .history import Entry
from .records import Change, Conflict, FleetState, Skipped, Validate, check_based_on, encode, revision_of
from .topics import (
    AUTHORIZATION,
    HISTORY_TOPIC_CONFIG,
    Denied,
    code_of,
    create_missing,
    read_to_end,
    write_permissions,
)

__all__ = ["FleetWriter", "WriteRefused", "now_iso"]

log = get_logger("sluice.fleet")

_FENCED = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH})


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class WriteRefused(ChangeRefused):
    """A change not written: ``status`` 409 (conflict), 403 (not authorized), 404 (no such revision), 503
    (control cluster)."""


class _Again(Exception):
    """Start the write again with a new producer."""


class FleetWriter:
    """Writes the fleet's changes (see the module docstring) with ``conf`` (librdkafka's properties)."""

    def __init__(self, conf: dict[str, Any], fleet: FleetSettings, sections: tuple[str, ...], validate: Validate,
                 reporter: AclReporter, instance: Callable[[], str],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.conf, self.fleet, self.sections, self.validate = conf, fleet, sections, validate
        self.reporter, self.instance, self.clock = reporter, instance, clock
        self.name = fleet.name
        self._history_ready = False

    # ------------------------------------------------------------------------------------------ reading

    def read_state(self, timeout: float) -> FleetState:
        """The control topic folded from its beginning to its end, as committed now."""
        state = FleetState(self.name, self.sections, self.validate)
        for key, value, offset in read_to_end(self.conf, self.fleet.control, self.fleet.transactional_id, timeout,
                                              self._denied, self.clock):
            with contextlib.suppress(Skipped):
                state.offer(key, value, offset)
        return state

    def history(self, timeout: float) -> list[Entry]:
        """Every change of the fleet in the history topic (none yet: the topic does not exist)."""
        try:
            records = read_to_end(self.conf, self.fleet.history, self.fleet.transactional_id, timeout,
                                  self._denied, self.clock)
        except KafkaException as exc:
            if code_of(exc) == KafkaError.UNKNOWN_TOPIC_OR_PART:
                return []
            raise
        return [e for _, value, _ in records if (e := Entry.decode(value)) is not None and e.fleet == self.name]

    def _denied(self, denied: Denied) -> None:
        self.reporter.missing(denied.resource, denied.name, denied.operation, "[fleet] changes", denied.error)

    # ------------------------------------------------------------------------------------------ writing

    def write(self, section: str, values: dict[str, Any], based_on: int | None, principal: str, timeout: float, *,
              dry_run: bool = False, rollback_of: int | None = None) -> Written:
        """Write ``values`` (validated by the caller) as the fleet's ``section``, or (``dry_run``) check that it
        could be. :class:`WriteRefused`."""
        deadline = self.clock() + timeout
        if dry_run:
            try:
                state = self.read_state(timeout)
                check_based_on(state, section, based_on)
            except Conflict as conflict:
                raise WriteRefused(409, str(conflict), conflict.current) from None
            except Denied as denied:
                raise self._refused(denied) from None
            except KafkaException as exc:
                raise WriteRefused(503, f"the control topic {self.fleet.control} could not be read "
                                        f"({exc.args[0] if exc.args else exc}); nothing changed") from None
            return Written(section, None, state.revision(section), values)
        while True:
            try:
                return self._write_once(section, values, based_on, principal, rollback_of, deadline)
            except _Again:
                # CONCURRENT_TRANSACTIONS: the previous write's transaction is still being completed by its
                # coordinator (markers written); Kafka's own producer retries InitProducerId then (KIP-98).
                if self.clock() >= deadline:
                    raise WriteRefused(503, f"the control topic {self.fleet.control}: the previous change is still "
                                            "being committed; nothing changed, retry") from None
                time.sleep(0.1)  # in a worker thread; bounded by the deadline

    def _write_once(self, section: str, values: dict[str, Any], based_on: int | None, principal: str,
                    rollback_of: int | None, deadline: float) -> Written:
        fleet = self.fleet
        timeout = max(1.0, deadline - self.clock())
        producer = Producer({**self.conf, "transactional.id": fleet.transactional_id,
                             "transaction.timeout.ms": max(1000, int(timeout * 1000))})
        committing = False
        delivered: list[tuple[KafkaError | None, int | None]] = []
        try:
            try:  # fences the fleet's other writers (KIP-98)
                _retrying(producer.init_transactions, deadline, self.clock)
            except KafkaException as exc:
                code = code_of(exc)
                if code == KafkaError.CONCURRENT_TRANSACTIONS:
                    raise _Again from None
                if code == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
                    raise Denied("TransactionalId", fleet.transactional_id, "Write", str(exc.args[0])) from None
                raise
            if not self._history_ready:
                create_missing(AdminClient(self.conf), {fleet.history: HISTORY_TOPIC_CONFIG},
                               fleet.replication_factor, max(1.0, deadline - self.clock()), _created)
                self._history_ready = True
            # What is left of the write's deadline, not a fresh timeout: the whole write ends by write_timeout_s,
            # before the caller gives up on it and answers "nothing changed" (a late commit would make that false)
            state = self.read_state(max(0.1, deadline - self.clock()))
            try:
                check_based_on(state, section, based_on)
            except Conflict as conflict:
                raise WriteRefused(409, str(conflict), conflict.current) from None
            current = state.revision(section)
            change = Change(self.name, section, current + 1, values, principal, now_iso())
            key, value = encode(change)
            producer.begin_transaction()
            producer.produce(fleet.control, value, key,
                             on_delivery=lambda err, msg: delivered.append((err, -1 if err else msg.offset())))
            committing = True
            # The control record's offset is its revision; the history record names it, in the same transaction.
            try:
                _retrying(producer.flush, deadline, self.clock)
            except SystemError:
                # confluent-kafka 2.16's flush() raises SystemError when the producer went fatal (fenced by
                # another writer) while it served the delivery report; the transactional API names the error.
                producer.abort_transaction(1.0)
                raise KafkaException(KafkaError(KafkaError._FAIL, "the transaction failed while flushing")) from None
            if not delivered or delivered[0][0] is not None:
                raise KafkaException(delivered[0][0] if delivered else
                                     KafkaError(KafkaError._TIMED_OUT, "the control record was not acknowledged"))
            revision = revision_of(delivered[0][1] or 0)
            entry = Entry(self.name, section, revision, values, principal, change.changed_at, current or None,
                          "rollback" if rollback_of is not None else "set", rollback_of, self.instance())
            history_key, history_value = entry.encode()
            producer.produce(fleet.history, history_value, history_key)
            # Logged before the commit: no instance can read the record earlier (bench/fleet.py times from here)
            log.info("fleet_committing", fleet=self.name, section=section, revision=revision)
            _retrying(producer.commit_transaction, deadline, self.clock)
            log.info("fleet_written", fleet=self.name, section=section, revision=revision, principal=principal)
            return Written(section, revision, current, values)
        except Denied as denied:
            with contextlib.suppress(KafkaException):
                producer.abort_transaction(1.0)
            raise self._refused(denied) from None
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            code = err.code() if isinstance(err, KafkaError) else None
            with contextlib.suppress(KafkaException):
                producer.abort_transaction(1.0)
            if code in AUTHORIZATION:
                raise self._refused_topics(str(err), max(1.0, deadline - self.clock())) from None
            if code in _FENCED:
                raise WriteRefused(409, f"[{section}] another writer changed the fleet meanwhile ({err}); read it "
                                        "again and retry") from None
            outcome = ("the commit's outcome is unknown: read the section again before retrying" if committing
                       else "nothing changed")
            raise WriteRefused(503, f"the control topic {fleet.control} could not be written ({err}); "
                                    f"{outcome}") from None
        finally:
            # Closed now, not when garbage-collected: a producer left alive (its frame held by the exception's
            # traceback) would go on retrying InitProducerId once the cluster answers, and fence the next writer.
            with contextlib.suppress(Exception):
                producer.purge()
            with contextlib.suppress(Exception):
                producer.close()
            del producer

    def settings_at(self, section: str, revision: int, timeout: float) -> dict[str, Any]:
        """The settings ``section`` had at ``revision``: from the history, else from the control topic (a
        change made before the history was kept, still the latest). WriteRefused 404 if neither has it."""
        try:
            for entry in self.history(timeout):
                if (entry.section, entry.revision) == (section, revision):
                    return entry.settings
            applied = self.read_state(timeout).applied.get(section)
        except Denied as denied:
            raise self._refused(denied) from None
        if applied is not None and applied[0].revision == revision and applied[0].settings is not None:
            return applied[0].settings
        raise WriteRefused(404, f"[{section}] has no revision {revision} in the fleet's history "
                                f"({self.fleet.history}); `sluice fleet history {section}` lists them")

    def _refused(self, denied: Denied) -> WriteRefused:
        text = self.reporter.missing(denied.resource, denied.name, denied.operation, "[fleet] changes", denied.error)
        return WriteRefused(403, f"not authorized to change the fleet: {text} (the Kafka ACLs Sluice needs: "
                                 f"docs/security.md, Kafka ACLs); nothing changed")

    def _refused_topics(self, error: str, timeout: float) -> WriteRefused:
        """A transaction refused on a topic: which, as the cluster's authorized operations say."""
        fleet = self.fleet
        try:
            topics = write_permissions(AdminClient(self.conf), [fleet.control, fleet.history], timeout)
        except KafkaException:
            topics = []
        missing = [self.reporter.missing("Topic", t, "Write", "[fleet] changes", error) for t in topics]
        text = "; ".join(missing) or f"{error} (the cluster did not say which permission)"
        return WriteRefused(403, f"not authorized to change the fleet: {text} (the Kafka ACLs Sluice needs: "
                                 f"docs/security.md, Kafka ACLs); nothing changed")


def _created(topic: str, replication_factor: int) -> None:
    log.info("fleet_topic_created", topic=topic, replication_factor=replication_factor)


def _retrying(call: Callable[[float], object], deadline: float, clock: Callable[[], float]) -> None:
    """``call(timeout)`` again while it fails with a retriable error (librdkafka's transactional API: "retriable
    errors: call again") until ``deadline``."""
    while True:
        try:
            left = call(max(0.1, deadline - clock()))
            if isinstance(left, int) and left > 0:  # flush(): messages still queued at its timeout
                raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"{left} record(s) not acknowledged"))
            return
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if not (isinstance(err, KafkaError) and err.retriable()) or clock() >= deadline:
                raise
            time.sleep(0.05)  # in a worker thread; the deadline bounds the retries
