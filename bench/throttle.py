"""Throttle accuracy seen by the client: the byte rate a throttled consumer actually receives through Sluice's
leader throttle (KIP-73 policy, proxy/policies/throttle/), per second and over Kafka's 11 s quota window, for
clients that use incremental fetch sessions (KIP-227) and for session-less ones, in both session modes.

``python -m bench.throttle [--seconds 33] [--rate 1] [--mib 512] [--modes passthrough,terminate]
[--clients kafka-python,java,confluent,java-share] [--share]``

``--share`` runs a Java share consumer (KIP-932, ``java-share``, kind ``share``) alone: Sluice holds it on
the request side (ShareFetch MaxBytes, muting), never by trimming a response; same figures, same goal.

Goal: for every client and mode, every 11 s window after the first within +/-5% of the throttle
(``worst_window_error`` <= 0.05).

Setup: one rig broker (real Kafka 4.x, KRaft), one topic of 4 partitions holding ``--mib`` MiB of 16 KiB records
(no key, 16,384-byte values), produced once, directly to the broker. For each mode of ``--modes`` and each client
of ``--clients``, a fresh Sluice subprocess (rig/sluice_process.py) starts with ``[throttle] leader_rate_bytes``
= ``--rate`` MB/s, the topic listed with ``replicas = "*"``, ``[[throttle.consumers]] client_id = "bench-throttle-*"``
and ``[sessions] mode`` = the mode; the client, with client.id ``bench-throttle-<client>-<mode>``, reads the topic
from the beginning through it. Clients:

- ``kafka-python`` (kind ``session``): ``KafkaConsumer`` with assigned partitions; it runs an incremental fetch
  session, so after the first fetch each request lists only the partitions whose position changed;
- ``java`` (kind ``session``): Kafka's own Java consumer (Fetch v17, incremental sessions), as the
  ``ConsoleConsumer`` tool from the rig's jars (rig/java_tools.py), in a consumer group of its own;
- ``confluent`` (kind ``sessionless``): confluent-kafka (librdkafka) ``Consumer`` with assigned partitions; every
  fetch lists every partition.

What is measured, from the client only (never Sluice's metrics): the time each record is handed to the
application and its size, the key + value bytes (here 16,384 per record; the quota also counts batch and record
headers, ~70 bytes per 16 KiB record here, so the client sees ~0.4% less than the quota meters).

- Python clients: the ``time.monotonic()`` at which ``poll()`` / ``consume()`` returns the record, and its
  key + value bytes (kafka-python's serialized sizes, confluent-kafka's ``len(key) + len(value)``);
- Java: the console consumer prints every record (``Partition:P<tab>Offset:O<tab><value>``) as its ``poll()``
  hands it over; the bench reads the pipe raw and times a record when the last byte of its value arrives (the
  tool's stdout is an 8 KiB buffered stream, which a 16 KiB value goes through at once, prefix first). Its size
  is the value's, 16,384 bytes (no key). ConsumerPerformance is no use here: it prints its cumulative bytes at most
  once per poll (at the first record, its interval being >= 1 ms), so the rest of a poll's records would be
  timed at the next poll.

Time 0 of a run is the client's first record (client start-up, JVM and group join are not the throttle's
doing); the run lasts ``--seconds`` after it, or until the client has read the whole backlog.

The figures: the bytes received in each whole second; a window is 11 such seconds (Kafka's replication quota
window, 11 samples x 1 s). The first window, seconds 0-10, is warm-up: the quota has no history yet. The windows
that count start at second 11 or later and slide by 1 s (``--seconds 33``: windows [11, 22) ... [22, 33), 12 of
them). Per run:

- ``mean_bytes_s``: bytes per second over the counted span, seconds 11 to the end;
- ``ratio`` = mean_bytes_s / target;
- ``worst_window_error``: the maximum over the counted windows of |window bytes / 11 s / target - 1|.

The backlog must outlast the run, or a fast client's last windows are empty and its figures meaningless: a
client held to the target reads ``--rate`` x ``--seconds`` MB, and ``--mib`` must hold at least 1.25 times that
(checked before anything starts). The defaults, 1 MB/s for 33 s and 512 MiB (~20 s to produce), leave room for
a client running at 16 times the target: the Java consumer, not held back at all, reads ~8 MB/s here. A client
that still reaches the end of the backlog (the throttle not holding) stops there; its run line says
``backlog_exhausted_at_s``, its windows are those that end before that second, and if none does,
``mean_bytes_s`` and ``worst_window_error`` are over the whole run until the backlog ran out (``"basis":
"until_backlog_end"``): reading the whole backlog that early is itself a rate far above the target.

JSON lines on stdout (logs on stderr): per run and second ``{"bench": "throttle", "mode", "client", "kind",
"second", "target_bytes_s", "measured_bytes_s"}``; per run ``{"bench": "throttle", "mode", "client", "kind",
"target_bytes_s", "mean_bytes_s", "ratio", "worst_window_error", "windows", ...}``; last line ``{"summary":
"throttle", "worst_window_error": <max over every run, both kinds of client>, "by_kind": {kind: {mode:
{"worst_window_error", "ratio": {client: ratio}}}}, "out_of_order": ..., "goals", "met",
"each_partition_once_in_order", "errors": [], "correct", ...}`` (bench/support/verdict.py). Its check: every client
read each partition's records once, in order, from offset 0 (``out_of_order`` counts the records that were not their
partition's next), and every client got records (``errors``); the bench exits 1 otherwise, and with ``--check`` also
when the goal is missed. ``--smoke``: 3 s runs of confluent-kafka and kafka-python (a client of each kind, no JVM
to start) in both modes (with ``--share``, the share consumer), 16 MiB.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaTopicPartition

from bench.support import verdict
from rig.java_tools import (
    CONFIG_COMMAND,
    CONSOLE_CONSUMER,
    CONSOLE_SHARE_CONSUMER,
    FEATURE_COMMAND,
    PERF_JVM_OPTS,
    JavaTools,
)
from rig.kafka import KafkaBroker, RigError
from rig.sluice_process import SluiceProcess
from rig.topics import create_topic

PARTITIONS = 4
RECORD = 16 * 1024  # value bytes per record (no key)
MB = 1_000_000
MiB = 1 << 20
WINDOW = 11  # seconds: Kafka's replication quota window (11 samples x 1 s)
GOAL = 0.05  # every counted window within +/-5% of the target
BACKLOG_MARGIN = 1.25  # backlog >= 1.25 x what a client held to the target reads in a run
MODES = ("passthrough", "terminate")
CLIENT_ID_PREFIX = "bench-throttle-"
START_TIMEOUT_S = 90.0  # until the first record: JVM start, group join, metadata
GRACE_S = 0.25  # past the run's end: the Java tool's records of its last second still cross a pipe
MAX_POLLS = 5_000_000  # safety bound on any poll loop; the time bounds above are the real ones
POLL_S = 0.1


def emit(line: dict[str, Any]) -> None:
    print(json.dumps(line), flush=True)


def log(message: str) -> None:
    print(f"bench.throttle: {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------------------------
# What the client received
# --------------------------------------------------------------------------------------------------------------


@dataclass
class Arrivals:
    """Records handed to the application: (monotonic time, key + value bytes), and whether the backlog ended."""

    ends: dict[int, int]  # partition -> end offset of the backlog
    samples: list[tuple[float, int]] = field(default_factory=list)
    positions: dict[int, int] = field(default_factory=dict)  # partition -> next offset
    records: int = 0
    #: records that were not the next of their partition (a gap, a repeat or a step back): the throttle only
    #: delays records, so every client reads each partition's records once, in order, from offset 0
    out_of_order: int = 0
    exhausted_at: float | None = None  # monotonic time the last record of the backlog arrived

    @property
    def first(self) -> float | None:
        return self.samples[0][0] if self.samples else None

    def record(self, now: float, partition: int, offset: int, size: int) -> None:
        self.samples.append((now, size))
        self.records += 1
        if offset != self.positions.get(partition, 0):
            self.out_of_order += 1
        self.positions[partition] = max(self.positions.get(partition, 0), offset + 1)
        if self.exhausted_at is None and all(self.positions.get(p, 0) >= end for p, end in self.ends.items()):
            self.exhausted_at = now


@dataclass(frozen=True)
class RunStats:
    per_second: list[int]  # bytes received in each whole second since the first record
    mean_bytes_s: float
    worst_window_error: float
    windows: int
    basis: str  # "windows": over the counted windows; "until_backlog_end": whole run, backlog ran out first


def analyse(samples: Sequence[tuple[float, int]], seconds: int, target: float,
            exhausted_at: float | None = None) -> RunStats:
    """Per-second bytes and window figures; ``samples`` and ``exhausted_at`` in seconds since the first record.

    Only whole seconds are counted: the run's end, or the second the backlog ran out in (partly empty) excluded.
    """
    observed = float(seconds) if exhausted_at is None else min(float(seconds), exhausted_at)
    full = int(observed)
    per_second = [0] * full
    for t, n in samples:
        if 0 <= t < full:
            per_second[int(t)] += n
    starts = range(WINDOW, full - WINDOW + 1)  # windows after the first, wholly before the end
    if starts:
        errors = [abs(sum(per_second[s : s + WINDOW]) / WINDOW / target - 1) for s in starts]
        mean = sum(per_second[WINDOW:]) / (full - WINDOW)
        return RunStats(per_second, mean, max(errors), len(errors), "windows")
    # The backlog ran out before a counted window ended: the rate over the whole run until then
    span = max(observed, 1e-3)
    mean = sum(n for t, n in samples if t < span) / span
    return RunStats(per_second, mean, abs(mean / target - 1), 0, "until_backlog_end")


# --------------------------------------------------------------------------------------------------------------
# Clients
# --------------------------------------------------------------------------------------------------------------


class Client(Protocol):
    def poll(self, arrivals: Arrivals) -> None:
        """Wait up to ~0.1 s for records; add each one handed over to ``arrivals``."""

    def close(self) -> None: ...


class KafkaPythonClient:
    """kafka-python: one incremental fetch session per broker (KIP-227)."""

    def __init__(self, bootstrap: str, topic: str, client_id: str, ends: dict[int, int], tmp: Path) -> None:
        self._consumer = KafkaConsumer(bootstrap_servers=bootstrap, client_id=client_id, group_id=None,
                                       enable_auto_commit=False, auto_offset_reset="earliest")
        self._consumer.assign([KafkaTopicPartition(topic, p) for p in ends])
        self._consumer.seek_to_beginning()

    def poll(self, arrivals: Arrivals) -> None:
        batches = self._consumer.poll(timeout_ms=int(POLL_S * 1000), max_records=1000)
        now = time.monotonic()  # the moment the records are handed to the application
        for msgs in batches.values():
            for m in msgs:
                arrivals.record(now, m.partition, m.offset,
                                max(m.serialized_key_size, 0) + max(m.serialized_value_size, 0))

    def close(self) -> None:
        self._consumer.close()


class ConfluentClient:
    """confluent-kafka (librdkafka): session-less, every fetch lists every assigned partition."""

    def __init__(self, bootstrap: str, topic: str, client_id: str, ends: dict[int, int], tmp: Path) -> None:
        # group.id only because the Consumer insists; assign() uses no group
        self._consumer = Consumer({"bootstrap.servers": bootstrap, "client.id": client_id, "group.id": client_id,
                                   "enable.auto.commit": False, "enable.partition.eof": False})
        self._consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        self._errors = 0

    def poll(self, arrivals: Arrivals) -> None:
        msgs = self._consumer.consume(num_messages=1000, timeout=POLL_S)
        now = time.monotonic()  # the moment the records are handed to the application
        for m in msgs:
            err = m.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF and self._errors < 10:  # a few, not a flood
                    log(f"confluent: {err}")
                self._errors += 1
                continue
            key, value = m.key(), m.value()
            partition, offset = m.partition(), m.offset()
            if partition is not None and offset is not None:
                arrivals.record(now, partition, offset, len(key or b"") + len(value or b""))

    def close(self) -> None:
        self._consumer.close()


_PRINTED = re.compile(rb"\n?Partition:(\d+)\tOffset:(\d+)\t")


class PrintedRecords:
    """Incremental parser of ConsoleConsumer's output with print.partition and print.offset:
    ``Partition:P\tOffset:O\t<value>\n`` per record, every value ``value_size`` bytes (the bench's records).

    A record counts as arrived once its whole value is in, without waiting for its newline: the tool's stdout is
    a buffered stream (8 KiB) that a 16 KiB value write goes through at once, flushing the prefix before it,
    while the newline waits in the buffer for the next record.
    """

    def __init__(self, value_size: int) -> None:
        self._size = value_size
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, int]]:
        """(partition, offset) of every record completed by ``data``."""
        self._buf += data
        done: list[tuple[int, int]] = []
        while (m := _PRINTED.match(self._buf)) is not None and len(self._buf) >= m.end() + self._size:
            done.append((int(m[1]), int(m[2])))
            del self._buf[: m.end() + self._size]
        if not _PRINTED.match(self._buf) and len(self._buf) > 64:  # not a prefix still arriving
            raise ValueError(f"unexpected ConsoleConsumer output: {bytes(self._buf[:80])!r}")
        return done


class JavaClient:
    """The Java consumer, as Kafka's ConsoleConsumer printing every record (see the module docstring)."""

    def __init__(self, bootstrap: str, topic: str, client_id: str, ends: dict[int, int], tmp: Path) -> None:
        self._tools = JavaTools()
        # Exits by itself once it has printed the whole backlog; else the bench stops it. Its own group,
        # so a rerun against the same broker starts from the beginning again.
        self._proc = self._tools.spawn(*self._command(bootstrap, topic, client_id, ends), jvm_opts=PERF_JVM_OPTS)
        self._arrived: queue.SimpleQueue[tuple[float, int, int] | None] = queue.SimpleQueue()
        self._stderr: collections.deque[str] = collections.deque(maxlen=40)
        self._failure: str | None = None
        self._threads = [threading.Thread(target=self._read_stdout, daemon=True),
                         threading.Thread(target=self._read_stderr, daemon=True)]
        for t in self._threads:
            t.start()

    def _command(self, bootstrap: str, topic: str, client_id: str, ends: dict[int, int]) -> tuple[str, list[str]]:
        return CONSOLE_CONSUMER, [
            "--bootstrap-server", bootstrap, "--topic", topic, "--from-beginning",
            "--group", f"{client_id}-{int(time.time() * 1000)}", "--max-messages", str(sum(ends.values())),
            "--property", "print.partition=true", "--property", "print.offset=true",
            "--consumer-property", f"client.id={client_id}", "--consumer-property", "enable.auto.commit=false",
        ]  # fmt: skip

    def _read_stdout(self) -> None:
        # Raw reads of the pipe (spawn's text wrapper is never used): a record is timed when its value is in
        assert self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        parser = PrintedRecords(RECORD)
        try:
            while data := os.read(fd, 1 << 16):
                now = time.monotonic()
                for partition, offset in parser.feed(data):
                    self._arrived.put((now, partition, offset))
        except (OSError, ValueError) as exc:
            self._failure = str(exc)
        self._arrived.put(None)  # the tool has exited (or its output is unreadable)

    def _read_stderr(self) -> None:
        # Drained so the tool never blocks on a full pipe; the tail explains a failure
        assert self._proc.stderr is not None
        for line in self._proc.stderr:
            self._stderr.append(line.rstrip())

    def poll(self, arrivals: Arrivals) -> None:
        try:
            items = [self._arrived.get(timeout=POLL_S)]
        except queue.Empty:
            return
        while True:
            try:
                items.append(self._arrived.get_nowait())
            except queue.Empty:
                break
        for item in items:
            if item is None:
                if arrivals.exhausted_at is None:
                    self._proc.wait(10)
                    raise RigError(f"ConsoleConsumer exited ({self._proc.returncode}) before reading the backlog"
                                   f" ({self._failure or 'EOF'}):\n" + "\n".join(self._stderr))
                continue
            now, partition, offset = item
            arrivals.record(now, partition, offset, RECORD)  # printed value = the record's value, no key

    def close(self) -> None:
        try:
            if self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(15)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait(5)
            for t in self._threads:
                t.join(5)
        finally:
            self._tools.close()


class JavaShareClient(JavaClient):
    """A Java share consumer (KIP-932 KafkaShareConsumer, as Kafka's ConsoleShareConsumer), alone in a share group
    of its own that starts at the earliest offset. Sluice holds it on the request side only (a ShareFetch response
    is never trimmed: proxy/policies/throttle/share.py), by MaxBytes and by muting the connection; its acquired
    records stay acknowledged in time (the mute is capped at half the acquisition lock). It prints every record
    as the Java consumer does; an offset delivered again (a lapsed lock) counts again, as the client got it."""

    def _command(self, bootstrap: str, topic: str, client_id: str, ends: dict[int, int]) -> tuple[str, list[str]]:
        group = f"{client_id}-{int(time.time() * 1000)}"
        # share.version=1: a new cluster's default from Kafka 4.2, set on 4.1; a no-op when set
        self._tools.run(FEATURE_COMMAND, ["--bootstrap-server", bootstrap, "upgrade", "--feature", "share.version=1"])
        self._tools.run(CONFIG_COMMAND, ["--bootstrap-server", bootstrap, "--alter", "--entity-type", "groups",
                                         "--entity-name", group, "--add-config", "share.auto.offset.reset=earliest"])
        return CONSOLE_SHARE_CONSUMER, [
            "--bootstrap-server", bootstrap, "--topic", topic, "--group", group,
            "--max-messages", str(sum(ends.values())),
            "--property", "print.partition=true", "--property", "print.offset=true",
            "--consumer-property", f"client.id={client_id}",
        ]  # fmt: skip


@dataclass(frozen=True)
class ClientSpec:
    kind: str  # "session" / "sessionless"
    make: Callable[[str, str, str, dict[int, int], Path], Client]


CLIENTS: dict[str, ClientSpec] = {
    "kafka-python": ClientSpec("session", KafkaPythonClient),
    "java": ClientSpec("session", JavaClient),
    "confluent": ClientSpec("sessionless", ConfluentClient),
    "java-share": ClientSpec("share", JavaShareClient),
}
#: what runs without --clients: the consumers of ordinary groups (--share runs the share consumer)
DEFAULT_CLIENTS = ("kafka-python", "java", "confluent")


# --------------------------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------------------------


def produce(bootstrap: str, topic: str, mib: int) -> dict[int, int]:
    """Create the topic and fill it with ``mib`` MiB of 16 KiB records, round-robin; the end offset per partition."""
    create_topic(bootstrap, topic, partitions=PARTITIONS)
    # Idempotent, so no retry duplicates a record: the end offsets are exactly the counts sent. batch.size just
    # above one record: one record per batch, so the throttle's unit (a batch) is 16 KiB, not a 1 MB batch.
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5,
                         "batch.size": RECORD + 512})
    failed: list[str] = []

    def delivered(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            failed.append(str(err))

    n = mib * MiB // RECORD
    value = b"t" * RECORD
    for i in range(n):
        for _ in range(3000):  # bounded: the local queue is full only until the broker acknowledges
            try:
                producer.produce(topic, value=value, partition=i % PARTITIONS, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.1)
        else:
            raise RuntimeError("producer queue stayed full for 300 s")
        producer.poll(0)
    left = producer.flush(300)
    if left or failed:
        raise RuntimeError(f"{left} records undelivered, {len(failed)} failed: {failed[:3]}")
    return {p: n // PARTITIONS + (1 if p < n % PARTITIONS else 0) for p in range(PARTITIONS)}


def sluice_config(topic: str, target: int, mode: str) -> str:
    # json.dumps quotes a string the way TOML's basic strings do (topic names are plain ASCII)
    return (f"[throttle]\nleader_rate_bytes = {target}\n"
            f"[[throttle.topics]]\ntopic = {json.dumps(topic)}\nreplicas = \"*\"\n"
            f"[[throttle.consumers]]\nclient_id = {json.dumps(CLIENT_ID_PREFIX + '*')}\n"
            f"[sessions]\nmode = {json.dumps(mode)}\n")


def consume(client: Client, arrivals: Arrivals, seconds: int) -> None:
    """Poll until ``seconds`` after the first record, the end of the backlog, or the start timeout."""
    polls = 0
    deadline = time.monotonic() + START_TIMEOUT_S
    while arrivals.first is None and time.monotonic() < deadline and polls < MAX_POLLS:
        client.poll(arrivals)
        polls += 1
    if arrivals.first is None:
        return
    end = arrivals.first + seconds + GRACE_S
    while time.monotonic() < end and arrivals.exhausted_at is None and polls < MAX_POLLS:
        client.poll(arrivals)
        polls += 1


def run(bootstrap: str, topic: str, ends: dict[int, int], mode: str, name: str, target: int, seconds: int,
        tmp: Path) -> dict[str, Any]:
    spec = CLIENTS[name]
    client_id = f"{CLIENT_ID_PREFIX}{name}-{mode}"
    config = tmp / f"sluice-{name}-{mode}.toml"
    config.write_text(sluice_config(topic, target, mode))
    arrivals = Arrivals(ends)
    log(f"{mode} / {name}: {seconds} s at {target / MB:g} MB/s")
    with SluiceProcess(bootstrap, extra_env={"SLUICE_CONFIG": str(config)}) as sluice:
        started = time.monotonic()
        client = spec.make(sluice.bootstrap, topic, client_id, ends, tmp)
        try:
            consume(client, arrivals, seconds)
        finally:
            client.close()
    base: dict[str, Any] = {"bench": "throttle", "mode": mode, "client": name, "kind": spec.kind}
    first = arrivals.first
    if first is None:
        # Nothing in START_TIMEOUT_S: the client got 0 bytes/s
        line = {**base, "target_bytes_s": target, "mean_bytes_s": 0, "ratio": 0.0, "worst_window_error": 1.0,
                "windows": 0, "records": 0, "error": f"no record within {START_TIMEOUT_S:.0f} s"}
        emit(line)
        return line
    exhausted = None if arrivals.exhausted_at is None else arrivals.exhausted_at - first
    stats = analyse([(t - first, n) for t, n in arrivals.samples], seconds, target, exhausted)
    for i, n in enumerate(stats.per_second):
        emit({**base, "second": i, "target_bytes_s": target, "measured_bytes_s": n})
    line = {**base, "target_bytes_s": target, "mean_bytes_s": round(stats.mean_bytes_s),
            "ratio": round(stats.mean_bytes_s / target, 4), "worst_window_error": round(stats.worst_window_error, 4),
            "windows": stats.windows, "basis": stats.basis, "records": arrivals.records,
            "out_of_order": arrivals.out_of_order,
            "bytes": sum(n for _, n in arrivals.samples), "first_record_s": round(first - started, 2),
            "backlog_exhausted_at_s": None if exhausted is None else round(exhausted, 2)}
    if exhausted is not None:
        line["note"] = (f"reached the end of the backlog {exhausted:.1f} s after its first record: the throttle "
                        f"did not hold it to the target")
    emit(line)
    return line


def summary(lines: list[dict[str, Any]], args: argparse.Namespace, target: int) -> dict[str, Any]:
    by_kind: dict[str, dict[str, dict[str, Any]]] = {}
    for line in lines:
        entry = by_kind.setdefault(line["kind"], {}).setdefault(line["mode"], {"worst_window_error": 0.0,
                                                                               "ratio": {}})
        entry["worst_window_error"] = max(entry["worst_window_error"], line["worst_window_error"])
        entry["ratio"][line["client"]] = line["ratio"]
    worst = max(line["worst_window_error"] for line in lines)
    out_of_order = sum(line.get("out_of_order", 0) for line in lines)
    return verdict.summary("throttle", {
        "worst_window_error": worst, "out_of_order": out_of_order, "target_bytes_s": target,
        "seconds": args.seconds, "mib": args.mib, "by_kind": by_kind,
        "backlog_exhausted": [f"{x['client']}/{x['mode']}" for x in lines
                              if x.get("backlog_exhausted_at_s") is not None]},
        {"worst_window_error": verdict.at_most(GOAL)}, checks={"each_partition_once_in_order": out_of_order == 0},
        errors=[f"{x['client']}/{x['mode']}: {x['error']}" for x in lines if "error" in x])


def names_arg(text: str, known: Sequence[str], what: str, ap: argparse.ArgumentParser,
              allow_empty: bool = False) -> list[str]:
    """A comma-separated option of names from ``known`` (argparse's error naming the unknown ones otherwise)."""
    names = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in names if x not in known]
    if (not names and not allow_empty) or unknown:
        ap.error(f"--{what}: {', '.join(unknown) or 'none given'}; known: {', '.join(known)}")
    return names


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.throttle", description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=3 * WINDOW,
                    help=f"measured seconds per run after the first record (default {3 * WINDOW}: the warm-up "
                         f"window and two more; at least {2 * WINDOW})")
    ap.add_argument("--rate", type=float, default=1.0, help="leader throttle, MB/s (default 1)")
    ap.add_argument("--mib", type=int, default=512, help="MiB of records in the topic (default 512)")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of: {', '.join(MODES)}")
    ap.add_argument("--clients", default=",".join(DEFAULT_CLIENTS),
                    help=f"comma-separated, of: {', '.join(CLIENTS)} (default {', '.join(DEFAULT_CLIENTS)})")
    ap.add_argument("--share", action="store_true",
                    help="the share consumer only (KIP-932, --clients java-share --modes passthrough: [sessions] "
                         "terminate owns Fetch sessions, not share sessions)")
    verdict.add_options(ap, "3 s runs of confluent-kafka and kafka-python in both modes, 16 MiB (no window "
                            "is counted)")
    args = ap.parse_args(argv)
    if args.share:
        args.clients, args.modes = "java-share", "passthrough"
    if args.smoke:
        args.seconds, args.mib = 3, 16
        if not args.share:
            args.clients = "confluent,kafka-python"
    elif args.seconds < 2 * WINDOW:
        ap.error(f"--seconds must be at least {2 * WINDOW}: a warm-up window and one counted window")
    if args.rate <= 0:
        ap.error("--rate must be positive")
    args.modes = names_arg(args.modes, MODES, "modes", ap)
    args.clients = names_arg(args.clients, list(CLIENTS), "clients", ap)
    needed = BACKLOG_MARGIN * args.rate * MB * args.seconds
    if args.mib * MiB < needed and not args.smoke:
        ap.error(f"--mib {args.mib} is too small: a client held to {args.rate:g} MB/s for {args.seconds} s reads "
                 f"{args.rate * args.seconds:g} MB; the backlog must hold {BACKLOG_MARGIN}x that "
                 f"(--mib >= {int(needed / MiB) + 1})")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    target = int(args.rate * MB)
    lines: list[dict[str, Any]] = []
    with KafkaBroker() as broker, tempfile.TemporaryDirectory(prefix="bench-throttle-") as tmp:
        topic = f"bench-throttle-{int(time.time() * 1000)}"
        t0 = time.monotonic()
        ends = produce(broker.bootstrap, topic, args.mib)
        log(f"produced {args.mib} MiB ({sum(ends.values())} records) in {time.monotonic() - t0:.1f} s")
        for mode in args.modes:
            for name in args.clients:
                lines.append(run(broker.bootstrap, topic, ends, mode, name, target, args.seconds, Path(tmp)))
    result = summary(lines, args, target)
    emit(result)
    return verdict.exit_status(result, args.check)


if __name__ == "__main__":
    sys.exit(main())
