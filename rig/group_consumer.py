"""A real client consumer in a group, as a subprocess that reports everything it receives: for the tests and
benches of cooperative consumption (proxy/policies/sharing/), which kill consumers (-9) and compare what each
received with what was produced and committed.

    python -m rig.group_consumer --client confluent --bootstrap 127.0.0.1:19092 --topic t --group g \\
        --client-id c1 [--work-ms 1] [--strategy range]

stdout, one JSON object per line, flushed as written (so a consumer killed with -9 has reported every poll it
processed before it died):

- ``{"assigned": [[topic, partition], ...]}`` after each rebalance (the client's own view);
- ``{"paused": [[topic, partition], ...]}`` with ``--paused-until PATH``: the partitions it holds now paused (it
  stays in the group and fetches none of them until the file PATH exists, then resumes them and says
  ``{"resumed": [...]}``);
- ``{"join_left_unread": n}`` with ``--unread-joins PATH`` (kafka-python): a finished join left unread while the file
  PATH held n > 0 (see :func:`_leave_joins_unread`);
- ``{"rs": [[partition, offset, key, value], ...]}`` per poll, its records in delivery order (key and value as
  text), once they are all processed;
- ``{"committing": {"<partition>": offset}}`` just before a synchronous commit, and ``{"commit": {...}}`` after
  it succeeded: every record reported before a ``commit``, of those partitions, below those offsets, is committed;
  the records between a ``committing`` and a killed consumer's end may or may not be (the commit may have landed
  before the kill); ``{"commit_failed": "<error>"}`` when the client said the commit failed (the positions stay
  pending: the next commit carries those of partitions the client still holds). librdkafka's ``commit`` reports
  the positions the client says it committed.

Every call into a client is bounded (``CALL_TIMEOUT_S``): a client that cannot get an answer fails with its own
error on stderr, and the process exits non-zero, rather than retrying for ever (kafka-python's ``position()`` and
``commit()`` without a timeout retry a retriable error while the heartbeat thread keeps the member in the group).
The positions committed are the ones the records reported say (last offset + 1), as the client's own commit
would take them, so no call beyond poll and commit is needed.

:class:`ConsumerProcess` runs one (or another tool printing records) and collects what it reports, for tests and
benches.

Commits are synchronous, after each poll's records are processed (``--work-ms`` per record, a wait as an I/O-bound
job's call would be), or at most every ``--commit-interval-s``. SIGTERM: the consumer closes (leaving
the group) and the process exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Self

CLIENTS = ("kafka-python", "confluent", "aiokafka")
#: Go clients, one program (rig/go/consumer/, built by `make install` into the venv, or the one SLUICE_GO_CONSUMER
#: names: a build of another checkout's) reporting the same lines
GO_CLIENTS = ("franz-go", "kafka-go", "sarama")
GO_CONSUMER = Path(os.environ.get("SLUICE_GO_CONSUMER") or Path(sys.prefix) / "bin" / "sluice-go-consumer")
#: the bound of each call into a client other than poll (commit, close): above the clients' request timeouts
#: (30 s by default), so a bounded call that fails is the client's own failure, with its own error
CALL_TIMEOUT_S = 45.0


def _emit(obj: dict[str, Any]) -> None:
    # "at": when the consumer reported it, on the machine's monotonic clock (CLOCK_MONOTONIC, one for every process):
    # comparable between consumers, where the time the test's reader thread got the line is not (a busy machine
    # delays one pipe's reader more than another's)
    sys.stdout.write(json.dumps({**obj, "at": time.monotonic()}) + "\n")
    sys.stdout.flush()


def _text(b: bytes | None) -> str | None:
    return None if b is None else b.decode("utf-8", "replace")


class _Stop:
    def __init__(self) -> None:
        self.stopped = False
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, *_: Any) -> None:
        self.stopped = True


def _fetch_settings(a: argparse.Namespace, isolation: str, rack: str) -> dict[str, str]:
    """``--isolation-level`` as the client's ``isolation`` setting (none given: the client's own default;
    librdkafka reads read_committed, kafka-python, aiokafka and the Go clients read_uncommitted) and
    ``--client-rack`` as its ``rack`` setting (KIP-392: fetch from a replica in that rack)."""
    return {**({isolation: a.isolation_level} if a.isolation_level else {}),
            **({rack: a.client_rack} if a.client_rack else {})}


def _login(a: argparse.Namespace, librdkafka: bool = False) -> dict[str, str]:
    """``--sasl-user``/``--sasl-password`` as the client's SASL/SCRAM-SHA-512 login over plaintext (a locked-down
    cluster's, passed through Sluice): librdkafka's property names, or kafka-python's and aiokafka's (the same)."""
    if not a.sasl_user:
        return {}
    if librdkafka:
        return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
                "sasl.username": a.sasl_user, "sasl.password": a.sasl_password}
    return {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_plain_username": a.sasl_user, "sasl_plain_password": a.sasl_password}


def _work(ms: float) -> None:
    if ms > 0:
        time.sleep(ms / 1000)


class _Pacer:
    """Synchronous commits at most every ``interval_s`` (0: after every poll) of the positions consumed since the
    last one (``pending``, partition -> next offset)."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.pending: dict[str, int] = {}
        self._next = 0.0

    def due(self) -> bool:
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + self.interval_s
        return True

    def done(self) -> dict[str, int]:
        """The positions just committed; none pending any more."""
        done, self.pending = self.pending, {}
        return done


class _Gate:
    """``--paused-until``: the partitions the consumer holds stay paused (it stays in the group, heartbeating and
    answering rebalances, and fetches none of them) until the file ``path`` exists, so a bench can produce a backlog
    to a settled group and time its consumption alone. Checked once per poll; the client's own pause and resume
    (``pause``/``resume`` take and ``held`` gives the partitions in the client's form)."""

    def __init__(self, path: str | None, held: Callable[[], Any], pause: Callable[[Any], None],
                 resume: Callable[[Any], None]) -> None:
        self.open = path is None
        self._path = path
        self._held, self._pause, self._resume = held, pause, resume
        self._paused: Any = set()

    def check(self) -> None:
        if self.open:
            return
        held = set(self._held())
        assert self._path is not None
        if os.path.exists(self._path):
            self.open = True
            self._resume(held)
            _emit({"resumed": sorted([tp.topic, tp.partition] for tp in held)})
        elif held != self._paused:
            self._pause(held)
            self._paused = held
            _emit({"paused": sorted([tp.topic, tp.partition] for tp in held)})


def _leave_joins_unread(coordinator: Any, path: str) -> None:
    """``--unread-joins``: while the file ``path`` holds a count above 0, each finished JoinGroup and SyncGroup of
    kafka-python's ``coordinator`` is left unread (the count lowered by one) and the client joins again at once. This
    is what kafka-python 3.0.12 itself does, now and then, with a join that finished after poll()'s timeout ran out:
    BaseCoordinator.join_group_async schedules a new join when the one it left in flight is done, and the finished
    one's assignment is never taken up. Its coordinator, and Sluice, see the same requests either way."""
    from kafka.errors import RebalanceInProgressError

    join = coordinator._do_join_and_sync_async

    async def join_maybe_unread() -> Any:
        assignment = await join()
        counter = Path(path)
        left = int(counter.read_text() or 0) if counter.exists() else 0
        if left <= 0:
            return assignment
        counter.write_text(str(left - 1))
        _emit({"join_left_unread": left})
        raise RebalanceInProgressError("rig.group_consumer --unread-joins: the finished join left unread")

    coordinator._do_join_and_sync_async = join_maybe_unread


def _assign(a: argparse.Namespace, assign: Callable[[list[Any]], Any], partition: Callable[[str, int], Any]) -> None:
    """``--assign``: the client assigned partitions 0..N-1 of the topic (each made by its own ``partition`` type), from
    their committed offsets (else its offset reset), as a subscribed consumer starts; reported as a rebalance is."""
    assign([partition(a.topic, p) for p in range(a.assign)])
    _emit({"assigned": [[a.topic, p] for p in range(a.assign)]})


def _process(polled: Iterable[Iterable[Any]], work_ms: float) -> list[list[Any]]:
    """A poll's records (kafka-python's and aiokafka's ``ConsumerRecord``), each "processed" in turn."""
    done = []
    for msgs in polled:
        for m in msgs:
            _work(work_ms)
            done.append([m.partition, m.offset, _text(m.key), _text(m.value)])
    return done


def _next_offsets(records: list[list[Any]]) -> dict[str, int]:
    """partition -> the offset after the last record reported of it (what a commit of these records stores)."""
    return {str(partition): offset + 1 for partition, offset, _, _ in records}


def run_kafka_python(a: argparse.Namespace, stop: _Stop) -> None:
    from kafka import KafkaConsumer
    from kafka.consumer.subscription_state import ConsumerRebalanceListener
    from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
    from kafka.coordinator.assignors.range import RangePartitionAssignor
    from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

    assignors = {"range": RangePartitionAssignor, "roundrobin": RoundRobinPartitionAssignor,
                 "cooperative-sticky": CooperativeStickyAssignor}
    consumer = KafkaConsumer(bootstrap_servers=a.bootstrap, group_id=a.group, client_id=a.client_id,
                             enable_auto_commit=False, auto_offset_reset="earliest", fetch_max_wait_ms=200,
                             session_timeout_ms=a.session_timeout_ms, heartbeat_interval_ms=500,
                             max_poll_records=a.max_poll_records,
                             **_fetch_settings(a, "isolation_level", "client_rack"), **_login(a),
                             partition_assignment_strategy=[assignors[a.strategy]])

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked: Any) -> None:
            pass

        def on_partitions_assigned(self, assigned: Any) -> None:
            _emit({"assigned": sorted([tp.topic, tp.partition] for tp in assigned)})
            _work(a.assign_ms)  # --assign-ms: the application's work on an assignment, its heartbeat thread going on

    if a.assign:
        from kafka import TopicPartition

        _assign(a, consumer.assign, TopicPartition)
    else:
        consumer.subscribe([a.topic], listener=Listener())
        # The subscribed topic's metadata before the first join (a metadata request, bounded by the client's request
        # timeout). Without it, a kafka-python 3.0.12 leader joins before its first metadata of the topic, assigns
        # nothing, and rejoins when the metadata comes (ConsumerCoordinator.need_rejoin: the assignment snapshot !=
        # the metadata snapshot); when poll()'s timeout runs out while that rejoin is in flight (the coordinator
        # holds the JoinGroup until the other members rejoin), the assignment it then makes sets the snapshots
        # equal, so the next polls find no rejoin needed and never take the finished join
        # (BaseCoordinator.ensure_active_group_async loops only while need_rejoin()): no assignment, heartbeats left
        # disabled, the member expelled after its session timeout and never back. Seen with a member straight to the
        # broker as well (its SyncGroup answer read, then only "need_rejoin: False"): the client's, not Sluice's.
        consumer.partitions_for_topic(a.topic)
    if a.unread_joins:
        _leave_joins_unread(consumer._coordinator, a.unread_joins)
    from kafka import TopicPartition as KafkaTopicPartition
    from kafka.errors import KafkaError
    from kafka.structs import OffsetAndMetadata

    pacer = _Pacer(a.commit_interval_s)
    gate = _Gate(a.paused_until, consumer.assignment, lambda tps: consumer.pause(*tps),
                 lambda tps: consumer.resume(*tps))
    try:
        while not stop.stopped:
            gate.check()
            batch = consumer.poll(timeout_ms=200)
            if not batch:
                continue
            records = _process(batch.values(), a.work_ms)
            _emit({"rs": records})
            pacer.pending.update(_next_offsets(records))
            if pacer.due():
                _emit({"committing": dict(pacer.pending)})
                offsets = {KafkaTopicPartition(a.topic, int(p)): OffsetAndMetadata(o, "", -1)
                           for p, o in pacer.pending.items()}
                try:
                    consumer.commit(offsets, timeout_ms=int(CALL_TIMEOUT_S * 1000))
                except KafkaError as e:  # a rebalance (CommitFailedError), a timeout: the next commit carries them
                    _emit({"commit_failed": repr(e)})
                    continue
                _emit({"commit": pacer.done()})
    finally:
        consumer.close(timeout_ms=int(CALL_TIMEOUT_S * 1000))


def run_confluent(a: argparse.Namespace, stop: _Stop) -> None:
    from confluent_kafka import Consumer, KafkaException

    def on_assign(c: Any, parts: Any) -> None:
        if a.group_protocol == "classic":
            _emit({"assigned": sorted([p.topic, p.partition] for p in parts)})
        else:
            # KIP-848 rebalances are incremental: the callback names the partitions added; the whole assignment is
            # reported (what the consumer holds already, and those)
            _emit({"assigned": sorted({(p.topic, p.partition) for p in (*c.assignment(), *parts)})})
        # --assign-ms: the application's own work on an assignment (restoring state for its partitions, say), while
        # librdkafka waits for the assign call (join-state WAIT_ASSIGN_CALL) and keeps heartbeating
        _work(a.assign_ms)

    def on_revoke(c: Any, parts: Any) -> None:
        gone = {(p.topic, p.partition) for p in parts}
        _emit({"assigned": sorted({(p.topic, p.partition) for p in c.assignment()} - gone)})

    # KIP-848 (group.protocol=consumer): the broker assigns and times the group, so librdkafka refuses the classic
    # protocol's session, heartbeat and assignor settings
    group = ({"session.timeout.ms": a.session_timeout_ms, "heartbeat.interval.ms": 500,
              "partition.assignment.strategy": a.strategy} if a.group_protocol == "classic"
             else {"group.protocol": a.group_protocol})
    # SLUICE_RDKAFKA_DEBUG=cgrp (librdkafka's debug contexts): its own account on stderr, for a hunt
    debug = {"debug": os.environ["SLUICE_RDKAFKA_DEBUG"]} if os.environ.get("SLUICE_RDKAFKA_DEBUG") else {}
    consumer = Consumer({"bootstrap.servers": a.bootstrap, "group.id": a.group, "client.id": a.client_id,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest", "fetch.wait.max.ms": 200,
                         **group, **debug, **_fetch_settings(a, "isolation.level", "client.rack"),
                         **_login(a, librdkafka=True)})
    if a.assign:
        from confluent_kafka import TopicPartition

        _assign(a, consumer.assign, TopicPartition)
    else:
        consumer.subscribe([a.topic], on_assign=on_assign,
                           **({"on_revoke": on_revoke} if a.group_protocol != "classic" else {}))
    pacer = _Pacer(a.commit_interval_s)
    gate = _Gate(a.paused_until, consumer.assignment, lambda tps: consumer.pause(list(tps)),
                 lambda tps: consumer.resume(list(tps)))
    try:
        while not stop.stopped:
            gate.check()
            msgs = consumer.consume(a.max_poll_records, 0.2)
            if not msgs:
                continue
            done: dict[int, int] = {}
            records = []
            for m in msgs:
                if m.error():
                    raise KafkaException(m.error())
                partition, offset = m.partition(), m.offset()
                assert partition is not None and offset is not None
                _work(a.work_ms)
                records.append([partition, offset, _text(m.key()), _text(m.value())])
                done[partition] = offset + 1
            _emit({"rs": records})
            pacer.pending.update({str(p): o for p, o in done.items()})
            if not pacer.due():
                continue
            _emit({"committing": dict(pacer.pending)})
            try:
                committed = consumer.commit(asynchronous=False)
            except KafkaException as e:
                _emit({"commit_failed": str(e)})
                continue
            # librdkafka commits the positions it stored for the partitions assigned now, not those pending here: a
            # partition leaving the assignment drops what was stored for it (rdkafka_assignment.c,
            # rd_kafka_assignment_remove), so positions a commit that failed before a rebalance left pending are
            # not in it. Reported: what it says it committed
            pacer.done()
            _emit({"commit": {str(tp.partition): tp.offset for tp in committed or ()
                              if tp.error is None and tp.offset >= 0}})
    finally:
        consumer.close()


def run_aiokafka(a: argparse.Namespace, stop: _Stop) -> None:
    from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
    from aiokafka.coordinator.assignors.range import RangePartitionAssignor
    from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
    from aiokafka.errors import KafkaError

    assignors = {"range": RangePartitionAssignor, "roundrobin": RoundRobinPartitionAssignor}

    class Listener(ConsumerRebalanceListener):
        async def on_partitions_revoked(self, revoked: Any) -> None:
            pass

        async def on_partitions_assigned(self, assigned: Any) -> None:
            _emit({"assigned": sorted([tp.topic, tp.partition] for tp in assigned)})
            # --assign-ms: the application's work on an assignment (awaited, as its I/O would be: heartbeats go on)
            await asyncio.sleep(a.assign_ms / 1000)

    async def main() -> None:
        consumer = AIOKafkaConsumer(bootstrap_servers=a.bootstrap, group_id=a.group, client_id=a.client_id,
                                    enable_auto_commit=False, auto_offset_reset="earliest", fetch_max_wait_ms=200,
                                    session_timeout_ms=a.session_timeout_ms, heartbeat_interval_ms=500,
                                    max_poll_records=a.max_poll_records,
                                    **_fetch_settings(a, "isolation_level", "client_rack"), **_login(a),
                                    partition_assignment_strategy=(assignors[a.strategy],))
        if a.assign:
            _assign(a, consumer.assign, TopicPartition)
        else:
            consumer.subscribe([a.topic], listener=Listener())
        await asyncio.wait_for(consumer.start(), CALL_TIMEOUT_S)
        pacer = _Pacer(a.commit_interval_s)
        gate = _Gate(a.paused_until, consumer.assignment, lambda tps: consumer.pause(*tps),
                     lambda tps: consumer.resume(*tps))
        try:
            while not stop.stopped:
                gate.check()
                batch = await consumer.getmany(timeout_ms=200)
                if not batch:
                    continue
                records = _process(batch.values(), a.work_ms)
                _emit({"rs": records})
                pacer.pending.update(_next_offsets(records))
                if pacer.due():
                    _emit({"committing": dict(pacer.pending)})
                    offsets = {TopicPartition(a.topic, int(p)): o for p, o in pacer.pending.items()}
                    try:
                        await asyncio.wait_for(consumer.commit(offsets), CALL_TIMEOUT_S)
                    except (KafkaError, TimeoutError) as e:  # a rebalance, a timeout: the next commit carries them
                        _emit({"commit_failed": repr(e)})
                        continue
                    _emit({"commit": pacer.done()})
        finally:
            await asyncio.wait_for(consumer.stop(), CALL_TIMEOUT_S)

    asyncio.run(main())


def latest(events: list[dict[str, Any]], field: str) -> Any:
    """The last value ``events`` (a consumer's, as reported) gave ``field`` (None: none did)."""
    values = [e[field] for e in events if field in e]
    return values[-1] if values else None


class ConsumerProcess:
    """A consumer subprocess (this module's, or any that prints one record per line: ``parse`` turns a line into an
    event like this module's, or None to skip it) and every event it reported, with when: the consumer's own
    "at" where it says (this module's), else when the line arrived.

    Its stderr is kept in a file (``stderr_path``, drained from the pipe as written, so a chatty client never
    blocks on a full pipe); :meth:`check_alive` fails, naming the consumer, its exit code and its stderr, once the
    process has ended without being told to; :meth:`describe` says where each one is, for a failing test."""

    def __init__(self, proc: subprocess.Popen[str], parse: Callable[[str], dict[str, Any] | None] = json.loads,
                 name: str = "", *, dumps_stacks: bool = False) -> None:
        self.proc = proc
        self.name = name
        #: SIGUSR1 makes it write every thread's stack to stderr (this module's consumers: :func:`main`)
        self.dumps_stacks = dumps_stacks
        self.events: list[tuple[float, dict[str, Any]]] = []
        #: the end was asked for (:meth:`kill`, :meth:`stop`): not a failure
        self.ended = False
        self._lock = threading.Lock()
        self._parse = parse
        fd, path = tempfile.mkstemp(prefix=f"consumer-{name}-", suffix=".stderr")
        os.close(fd)
        self.stderr_path = Path(path)
        self._readers = [threading.Thread(target=self._read, name=f"consumer-{name}", daemon=True)]
        if proc.stderr is not None:
            self._readers.append(threading.Thread(target=self._keep_stderr, name=f"consumer-{name}-stderr",
                                                  daemon=True))
        for t in self._readers:
            t.start()

    @classmethod
    def spawn(cls, client: str, bootstrap: str, topic: str, group: str, client_id: str, *extra: str,
              cwd: str | None = None) -> Self:
        """``python -m rig.group_consumer`` with these arguments (and ``extra`` ones); the Go consumer for a Go
        client."""
        program = [str(GO_CONSUMER)] if client in GO_CLIENTS else [sys.executable, "-m", "rig.group_consumer"]
        proc = subprocess.Popen(
            [*program, "--client", client, "--bootstrap", bootstrap,
             "--topic", topic, "--group", group, "--client-id", client_id, *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            cwd=cwd or str(Path(__file__).resolve().parent.parent))
        return cls(proc, name=client_id, dumps_stacks=client not in GO_CLIENTS)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            event = self._parse(line)
            if event is not None:
                at = event.pop("at", None)  # this module's consumers say when (_emit); others are timed here
                with self._lock:
                    self.events.append((at if isinstance(at, float) else time.monotonic(), event))

    def _keep_stderr(self) -> None:
        assert self.proc.stderr is not None
        with self.stderr_path.open("a") as out:
            for line in self.proc.stderr:
                out.write(line)
                out.flush()

    def _drained(self) -> None:
        """Once the process has ended: until its pipes are read to the end (bounded), so what it wrote last is
        there to show."""
        if self.proc.poll() is not None:
            for t in self._readers:
                t.join(5)

    def stderr_text(self, lines: int = 40) -> str:
        """The last ``lines`` lines the process wrote to stderr."""
        self._drained()
        if not self.stderr_path.exists():  # removed once the consumer was stopped
            return ""
        return "\n".join(self.stderr_path.read_text(errors="replace").splitlines()[-lines:])

    def check_alive(self) -> None:
        """AssertionError naming this consumer if its process ended without being told to."""
        code = self.proc.poll()
        if code is not None and not self.ended:
            raise AssertionError(f"consumer {self.name} exited with {code}:\n{self.stderr_text()}")

    def describe(self) -> str:
        """Where this consumer is: running or its exit code, what it reported last, its last assignments (and other
        reports but records and commits), its stderr's end (for a running consumer of this module, ending with every
        thread's stack: where a stalled client waits)."""
        code = self.proc.poll()
        if code is None and self.dumps_stacks:
            self._dump_stacks()
        state = "running" if code is None else f"exited {code}" + (" (asked to)" if self.ended else "")
        self._drained()
        events = self.timed_events()
        last = json.dumps(events[-1][1])[:300] if events else "nothing"
        now = time.monotonic()  # the clock the consumers' "at" is on (_emit)
        story = [f"{now - at:.1f}s ago: {json.dumps(e)[:200]}" for at, e in self.group_events()[-8:]]
        return (f"consumer {self.name}: {state}; {len(events)} events, the last {last}"
                + "".join(f"\n  {line}" for line in story)
                + f"\nstderr ({self.stderr_path}):\n{self.stderr_text(60)}")

    def _dump_stacks(self) -> None:
        """SIGUSR1, then until the dump has reached the stderr file (bounded: a diagnosis, not a synchronisation)."""
        size = self.stderr_path.stat().st_size if self.stderr_path.exists() else 0
        self.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and self.proc.poll() is None:
            if self.stderr_path.exists() and self.stderr_path.stat().st_size > size:
                time.sleep(0.2)  # the rest of the dump, written in one go
                return
            time.sleep(0.05)

    def reported(self) -> list[dict[str, Any]]:
        with self._lock:
            return [e for _, e in self.events]

    def timed_events(self) -> list[tuple[float, dict[str, Any]]]:
        """(when it was reported, event) for every event, in order (see the class's docstring for "when")."""
        with self._lock:
            return list(self.events)

    def group_events(self) -> list[tuple[float, dict[str, Any]]]:
        """(when, event) for every event but records and commits: its assignments, pauses, failed commits..."""
        return [(t, e) for t, e in self.timed_events() if not e.keys() & {"rs", "committing", "commit"}]

    def latest(self, field: str) -> Any:
        """The last value this consumer's events gave ``field`` (None: none did): :func:`latest`."""
        return latest(self.reported(), field)

    @property
    def assignment(self) -> list[Any] | None:
        """The last assignment it reported (None: none yet)."""
        return self.latest("assigned")

    def assignments(self) -> list[tuple[float, list[Any]]]:
        """(when, assignment) for each assignment it reported, in order."""
        return [(t, e["assigned"]) for t, e in self.timed_events() if "assigned" in e]

    def timed_records(self) -> list[tuple[float, list[Any]]]:
        """(when it was reported, [partition, offset, key, value]) for every record, in order."""
        with self._lock:
            return [(t, r) for t, e in self.events for r in e.get("rs", ())]

    def kill(self) -> None:
        self.ended = True
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        """SIGTERM (the consumer leaves its group), wait, then SIGKILL."""
        stop_all([self])


def stop_all(consumers: Iterable[ConsumerProcess], timeout: float = 40.0, *, keep_stderr: bool = False) -> None:
    """Stop ``consumers`` together: SIGTERM to every one (each leaves its group), then wait for them all within
    one ``timeout``, and SIGKILL those still running (one at a time, a group of six took up to six times as long).
    Their stderr files are removed unless ``keep_stderr`` (a failed test's, for a look at the whole of them)."""
    consumers = list(consumers)
    for c in consumers:
        c.ended = True
        if c.proc.poll() is None:
            c.proc.terminate()
    deadline = time.monotonic() + timeout
    for c in consumers:
        try:
            c.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            c.proc.kill()
            c.proc.wait(10)
    if not keep_stderr:
        for c in consumers:
            c._drained()
            c.stderr_path.unlink(missing_ok=True)


RUNNERS: dict[str, Callable[[argparse.Namespace, _Stop], None]] = {
    "kafka-python": run_kafka_python, "confluent": run_confluent, "aiokafka": run_aiokafka}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rig.group_consumer", description=__doc__.split("\n\n")[0])
    p.add_argument("--client", choices=CLIENTS, required=True)
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--client-id", required=True)
    p.add_argument("--strategy", default="range",
                   help="range, roundrobin, cooperative-sticky (kafka-python, confluent)")
    p.add_argument("--work-ms", type=float, default=0.0, help="per-record work, a wait")
    p.add_argument("--assign-ms", type=float, default=0.0,
                   help="the time its callback on an assignment takes (the application's work on it)")
    p.add_argument("--max-poll-records", type=int, default=100)
    p.add_argument("--commit-interval-s", type=float, default=0.0,
                   help="commit at most this often (0: after every poll)")
    p.add_argument("--session-timeout-ms", type=int, default=6000)
    p.add_argument("--group-protocol", choices=("classic", "consumer"), default="classic",
                   help="group.protocol: consumer is KIP-848's (confluent)")
    p.add_argument("--assign", type=int, default=0, metavar="PARTITIONS",
                   help="assign() partitions 0..PARTITIONS-1 instead of subscribing "
                        "(kafka-python, confluent, aiokafka)")
    p.add_argument("--isolation-level", choices=("read_uncommitted", "read_committed"),
                   help="KIP-98's isolation level (default: the client's own)")
    p.add_argument("--client-rack", help="KIP-392: the client's rack, to fetch from a replica in it")
    p.add_argument("--sasl-user", help="a SASL/SCRAM-SHA-512 login over plaintext (as rig/go/consumer's)")
    p.add_argument("--sasl-password", help="the --sasl-user's password")
    p.add_argument("--paused-until", metavar="PATH",
                   help="hold the partitions assigned paused until the file PATH exists (a bench's backlog)")
    p.add_argument("--unread-joins", metavar="PATH",
                   help="kafka-python: while the file PATH holds a count above 0, leave that many finished joins "
                        "unread and join again, as kafka-python 3.0.12 does now and then")
    a = p.parse_args(argv)
    if a.unread_joins and a.client != "kafka-python":
        p.error("--unread-joins: kafka-python only")
    # the client's own account (joins, assignments, heartbeats, retries) on stderr, kept in a file by
    # ConsumerProcess and shown when a test fails: where a consumer stopped is then in its own words
    # (SLUICE_CONSUMER_LOG_LEVEL=DEBUG: every request and response the client sends and reads, for a hunt)
    logging.basicConfig(level=os.environ.get("SLUICE_CONSUMER_LOG_LEVEL", "INFO"), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # SIGUSR1: every thread's stack on stderr (ConsumerProcess.describe asks a stalled consumer where it waits)
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    stop = _Stop()
    RUNNERS[a.client](a, stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
