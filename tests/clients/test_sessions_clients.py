"""Clients that run KIP-227 fetch sessions themselves, through Sluice in ``[sessions] mode = "terminate"``: Sluice
serves their sessions (its own session ids and epochs, incremental responses built from its per-partition state)
while it keeps its own session with the broker.

- the Java console consumer (Kafka 4.1.2's client) for ~60 s while a producer keeps producing to 3 partitions:
  its FetchSessionHandler (DEBUG, captured through a log4j2 file appender) runs incremental sessions all along and
  never finds a response invalid nor gets a session error; every record arrives once, in per-partition order,
  unchanged; Sluice's metrics count the downstream incremental fetches it served and its own upstream ones;
- kafka-python (its own FetchSessionHandler, logged through ``logging``) the same way, for ~12 s;
- the Java consumer across a broker restart: nothing lost, nothing twice, no invalid session response.

The FetchSessionHandler phrases matched below were read from the 4.1.2 jar the rig runs
(``javap -v`` on ``org/apache/kafka/clients/FetchSessionHandler{,$Builder}.class`` and ``FetchMetadata.toString``
in kafka-clients-4.1.2.jar) and from kafka-python's ``kafka/consumer/fetcher.py`` (3.0.12).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import re
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import pytest
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient
from kafka import KafkaConsumer

from rig.java_tools import CONSOLE_CONSUMER, JavaTools
from rig.kafka import KafkaBroker
from rig.kafka_python_group import wait_partitions_known
from rig.proxy_thread import ProxyThread
from tests.integration.test_sessions_terminate import TERMINATE, create_topic
from tests.support.faults import wait_until
from tests.support.topics import committed_offsets

pytestmark = pytest.mark.broker

PARTITIONS = 3
SEP = "|"  # between the console consumer's printed fields; never inside a key or value

DOWNSTREAM = "sluice_downstream_fetch_requests_total"  # fetch requests in sessions Sluice serves to clients
UPSTREAM = "sluice_upstream_fetch_requests_total"  # fetch requests in Sluice's own sessions with the broker

# ---- Java FetchSessionHandler (kafka-clients 4.1.2) log phrases. FetchMetadata.toString() is
# "(sessionId=<id>, epoch=<n>)", or "(sessionId=INVALID, epoch=INITIAL)" without a session.
JAVA_BUILT_INCREMENTAL = re.compile(r"Built incremental fetch \(sessionId=(-?\d+), epoch=(-?\d+)\) for node ")
JAVA_INCREMENTAL_RESPONSE = re.compile(r"sent an incremental fetch response with throttleTimeMs = \d+ for session "
                                       r"(-?\d+)")
JAVA_SESSION_CREATED = re.compile(r"sent a full fetch response that created a new incremental fetch session (-?\d+)")
# Never in a healthy run: a response the handler rejects, a session error from the server (logged by
# handleResponse as "Node {} was unable to process the fetch request with {}: {}." with the error's name), or a
# failed send (handleError: "Error sending fetch request {} to node {}:", the session is then dropped).
JAVA_INVALID = ("sent an invalid full fetch response", "sent an invalid incremental fetch response")
SESSION_ERRORS = ("FETCH_SESSION_ID_NOT_FOUND", "INVALID_FETCH_SESSION_EPOCH")
JAVA_FETCH_FAILED = ("was unable to process the fetch request", "Error sending fetch request")
# FetchSessionHandler.notifyClose: the consumer is closing; its next request closes the session
JAVA_CLOSING = "Set the metadata for next fetch request to close the existing session"

# ---- kafka-python 3.0.12 FetchSessionHandler (logger kafka.consumer.fetcher); its FetchMetadata has no repr, so
# the session id is read from the response lines.
PY_INCREMENTAL_RESPONSE = re.compile(r"sent an incremental fetch response for session (-?\d+) with ")
PY_SESSION_CREATED = re.compile(r"sent a full fetch response that created a new incremental fetch session (-?\d+)")
PY_INVALID = ("sent an invalid full fetch response", "sent an invalid incremental fetch response")
PY_FETCH_FAILED = ("was unable to process the fetch request",)
# kafka-python names the errors by class: FetchSessionIdNotFoundError, InvalidFetchSessionEpochError.
PY_SESSION_ERRORS = ("FetchSessionIdNotFound", "InvalidFetchSessionEpoch")


def value(partition: int, seq: int) -> str:
    """Unique per (partition, seq), of varying length; the sequence is readable back for order checks."""
    return f"p{partition}-{seq:06d}-" + "v" * (seq % 41)


def key(partition: int, seq: int) -> str:
    return f"k{partition}-{seq % 5}"


def expected(per_partition: int) -> dict[int, list[str]]:
    return {p: [value(p, i) for i in range(per_partition)] for p in range(PARTITIONS)}


class ContinuousProducer:
    """From a thread, one round every `interval` s: a keyed record to each partition (sequences `first` up to
    `first + rounds`), with an idempotent acks=all confluent-kafka producer. Bounded in count (`rounds`) and time
    (the pacing plus a bounded flush). Keeps what the broker acknowledged, by partition: (offset, value)."""

    def __init__(self, bootstrap: str, topic: str, *, rounds: int, interval: float, first: int = 0) -> None:
        self.first, self.rounds = first, rounds
        self.acked: dict[int, list[tuple[int, str]]] = {p: [] for p in range(PARTITIONS)}
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(bootstrap, topic, rounds, interval, first),
                                        name="sessions-producer", daemon=True)
        self._thread.start()

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        with self._lock:
            if err is not None:
                self.errors.append(str(err))
            else:
                partition, offset, val = msg.partition(), msg.offset(), msg.value()
                assert partition is not None and offset is not None and val is not None
                self.acked[partition].append((offset, val.decode()))

    def _run(self, bootstrap: str, topic: str, rounds: int, interval: float, first: int) -> None:
        try:
            producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                                 "linger.ms": 5, "client.id": "sluice-test-sessions-producer"})
            start = time.monotonic()
            for i in range(first, first + rounds):
                if self._stop.is_set():
                    break
                for p in range(PARTITIONS):
                    producer.produce(topic, key=key(p, i).encode(), value=value(p, i).encode(), partition=p,
                                     on_delivery=self._delivered)
                producer.poll(0)
                # Pacing (a produce rate, not a synchronisation): round i+1 is due `interval` s after round i.
                self._stop.wait(max(0.0, start + (i - first + 1) * interval - time.monotonic()))
            left = producer.flush(60)
            if left:
                self.errors.append(f"{left} records not acknowledged after a 60 s flush")
        except BaseException as e:  # reported by join()
            self.errors.append(repr(e))

    def join(self, timeout: float = 120.0) -> None:
        """Wait for the last acknowledgement; then every produced record must have been acknowledged, in order."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._stop.set()
            raise AssertionError(f"producer still running after {timeout} s")
        assert not self.errors, f"producer errors: {self.errors[:5]}"

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(90)

    def check_acked(self) -> None:
        """Harness check: every record acknowledged once, at offset = sequence (one record per partition per
        round, into a new topic), so the broker's order is the sequence order."""
        seqs = range(self.first, self.first + self.rounds)
        for p in range(PARTITIONS):
            acked = sorted(self.acked[p])
            assert [o for o, _ in acked] == list(seqs), f"partition {p}: acknowledged offsets {acked[:3]}..."
            assert [v for _, v in acked] == [value(p, i) for i in seqs], f"partition {p}: acknowledged values"


def check_once_in_order(got: list[tuple[int, int, str]], per_partition: int) -> None:
    """(partition, offset, value) as consumed: every record once, in per-partition order, value unchanged."""
    want = expected(per_partition)
    by_partition: dict[int, list[tuple[int, str]]] = {p: [] for p in range(PARTITIONS)}
    for p, offset, val in got:
        assert p in by_partition, f"record from unexpected partition {p}: {val!r}"
        by_partition[p].append((offset, val))
    for p in range(PARTITIONS):
        records = by_partition[p]
        values = [v for _, v in records]
        missing = sorted(set(want[p]) - set(values))
        dups = sorted(v for v, n in Counter(values).items() if n > 1)
        assert not missing and not dups, \
            f"partition {p}: {len(values)} records, {len(missing)} missing (first {missing[:3]}), " \
            f"{len(dups)} duplicated (first {dups[:3]})"
        assert values == want[p], f"partition {p}: values out of order or changed"
        assert [o for o, _ in records] == list(range(per_partition)), f"partition {p}: offsets not 0..n-1 in order"
    assert len(got) == PARTITIONS * per_partition


def offending(lines: list[str], phrases: tuple[str, ...]) -> list[str]:
    return [ln for ln in lines if any(ph in ln for ph in phrases)]


def fetch_counts(sluice: ProxyThread) -> dict[str, float]:
    return {
        "fetch_requests": sluice.total("sluice_requests_total", api="Fetch"),
        "downstream_incremental": sluice.total(DOWNSTREAM, kind="incremental"),
        "upstream_incremental": sluice.total(UPSTREAM, kind="incremental"),
    }


def deltas(sluice: ProxyThread, before: dict[str, float]) -> dict[str, float]:
    after = fetch_counts(sluice)
    return {k: after[k] - before[k] for k in before}


# ------------------------------------------------------------------------------------------- Java consumer

JAVA_CLIENT_ID = "sluice-test-java-sessions"


def log4j2_config(tmp_path: Path) -> tuple[Path, Path]:
    """A log4j2 configuration: the FetchSessionHandler at DEBUG, and the consumer internals at INFO, into a file
    (the rig's default stays: everything WARN+ to stderr). Returns (config file, log file)."""
    log = tmp_path / "java-fetch-sessions.log"
    config = tmp_path / "log4j2-sessions.properties"
    config.write_text(f"""\
status = error
name = sluice-test-fetch-sessions
appender.err.type = Console
appender.err.name = STDERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
appender.file.type = File
appender.file.name = SESSIONS
appender.file.fileName = {log}
appender.file.immediateFlush = true
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = STDERR
logger.fsh.name = org.apache.kafka.clients.FetchSessionHandler
logger.fsh.level = DEBUG
logger.fsh.additivity = false
logger.fsh.appenderRef.file.ref = SESSIONS
logger.internals.name = org.apache.kafka.clients.consumer.internals
logger.internals.level = INFO
logger.internals.additivity = false
logger.internals.appenderRef.file.ref = SESSIONS
""")
    return config, log


def java_consumer_args(bootstrap: str, topic: str, total: int, idle_timeout_ms: int,
                       *consumer_properties: str) -> list[str]:
    extra = [arg for prop in consumer_properties for arg in ("--consumer-property", prop)]
    return [
        "--bootstrap-server", bootstrap, "--topic", topic, "--from-beginning", "--group", f"g-{topic}",
        "--max-messages", str(total), "--timeout-ms", str(idle_timeout_ms),
        "--property", "print.partition=true", "--property", "print.offset=true", "--property", "print.key=true",
        "--property", f"key.separator={SEP}",
        "--consumer-property", f"client.id={JAVA_CLIENT_ID}",
        "--consumer-property", "fetch.max.wait.ms=200",
        *extra,
    ]  # fmt: skip


def parse_console(lines: list[str]) -> list[tuple[int, int, str]]:
    """"Partition:P|Offset:O|KEY|VALUE" lines as (partition, offset, value); the key must match the value's."""
    out: list[tuple[int, int, str]] = []
    for raw in lines:
        part, off, k, val = raw.split(SEP)
        assert part.startswith("Partition:") and off.startswith("Offset:"), raw
        p = int(part.removeprefix("Partition:"))
        seq = int(val.split("-")[1])
        assert k == key(p, seq), f"key changed: {raw!r}"
        out.append((p, int(off.removeprefix("Offset:")), val))
    return out


def check_java_sessions(log_lines: list[str], stderr: str, *, min_incremental: int,
                        allow_fetch_failures: bool = False) -> None:
    """(a) the handler's DEBUG lines are there and show incremental sessions with non-zero ids; (b) no invalid
    response, no session error (in the log or on stderr)."""
    session_lines = [ln for ln in log_lines if "(org.apache.kafka.clients.FetchSessionHandler)" in ln]
    assert any("Built full fetch" in ln for ln in session_lines), \
        "no FetchSessionHandler DEBUG line (logging not captured?); log:\n" + "\n".join(log_lines[:20])
    built = [(int(m[1]), int(m[2])) for ln in session_lines if (m := JAVA_BUILT_INCREMENTAL.search(ln))]
    responses = [int(m[1]) for ln in session_lines if (m := JAVA_INCREMENTAL_RESPONSE.search(ln))]
    created = [int(m[1]) for ln in session_lines if (m := JAVA_SESSION_CREATED.search(ln))]
    assert created and all(s > 0 for s in created), f"sessions created: {created}"
    assert len(built) >= min_incremental and all(s > 0 and e > 0 for s, e in built), \
        f"{len(built)} incremental fetches built (want >= {min_incremental}); first: {built[:5]}"
    assert len(responses) >= min_incremental and all(s > 0 for s in responses), \
        f"{len(responses)} incremental responses accepted (want >= {min_incremental})"
    # Once the consumer starts closing, its handler's session is its own empty closing request: Kafka's
    # AbstractFetch.prepareCloseFetchSessionRequests calls FetchSessionHandler.notifyClose and builds a full
    # request with no partitions while a fetch may still be in flight, and handleResponse then judges that
    # fetch's answer against the empty session ("invalid full fetch response with extraIds=(<topic id>),
    # response=()" whenever the answer names a partition, whoever sent it). Those lines say nothing of Sluice.
    closing = next((i for i, ln in enumerate(log_lines) if JAVA_CLOSING in ln), len(log_lines))
    everything = [ln for i, ln in enumerate(log_lines) if i < closing or JAVA_INVALID[0] not in ln] \
        + stderr.splitlines()
    bad = offending(everything, JAVA_INVALID + SESSION_ERRORS + (() if allow_fetch_failures else JAVA_FETCH_FAILED))
    assert not bad, "the Java FetchSessionHandler rejected responses or got session errors:\n" + "\n".join(bad[:20])


@pytest.fixture(scope="module")
def sluice(kafka_broker: KafkaBroker) -> Iterator[ProxyThread]:
    with ProxyThread(kafka_broker.bootstrap, **TERMINATE) as p:
        yield p


def test_java_consumer_sessions_served_for_60s(kafka_broker: KafkaBroker, sluice: ProxyThread,
                                               java_tools: JavaTools, unique_topic: str, tmp_path: Path) -> None:
    """The acceptance test: 60 s of continuous produce, the Java consumer reading through Sluice from the start."""
    rounds, interval = 600, 0.1  # 1800 records over ~60 s
    total = PARTITIONS * rounds
    create_topic(kafka_broker.bootstrap, unique_topic, PARTITIONS)
    config, log = log4j2_config(tmp_path)
    before = fetch_counts(sluice)
    producer = ContinuousProducer(kafka_broker.bootstrap, unique_topic, rounds=rounds, interval=interval)
    try:
        # Ends after `total` records, or after 30 s without one (then fewer lines, asserted below).
        proc = java_tools.run(CONSOLE_CONSUMER, java_consumer_args(sluice.bootstrap, unique_topic, total, 30_000),
                              timeout=rounds * interval + 60, check=False, log4j_config=config)
    except BaseException:
        producer.stop()
        raise
    producer.join()
    producer.check_acked()
    counts = deltas(sluice, before)
    assert proc.returncode == 0, f"console consumer exited with {proc.returncode}:\n{proc.stderr[-3000:]}"
    log_lines = log.read_text().splitlines() if log.exists() else []
    check_java_sessions(log_lines, proc.stderr, min_incremental=50)
    got = parse_console(proc.stdout.splitlines())
    check_once_in_order(got, rounds)
    assert counts["fetch_requests"] >= 50, f"Fetch requests through Sluice: {counts}"
    assert counts["downstream_incremental"] >= 50, f"Sluice served too few downstream incremental fetches: {counts}"
    assert counts["upstream_incremental"] > 0, f"Sluice sent no upstream incremental fetch: {counts}"


# ------------------------------------------------------------------------------------------- kafka-python

PY_CLIENT_ID = "sluice-test-kafka-python-sessions"


class Captured(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.getMessage()}")


@contextmanager
def capture_fetcher_log() -> Iterator[Captured]:
    """kafka-python's FetchSessionHandler logs through `kafka.consumer.fetcher`; DEBUG for the duration."""
    logger = logging.getLogger("kafka.consumer.fetcher")
    handler, level, propagate = Captured(), logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False  # thousands of DEBUG lines: not into pytest's captured log of a failure
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def test_kafka_python_sessions_served(kafka_broker: KafkaBroker, sluice: ProxyThread, unique_topic: str) -> None:
    rounds, interval = 120, 0.1  # 360 records over ~12 s
    total = PARTITIONS * rounds
    create_topic(kafka_broker.bootstrap, unique_topic, PARTITIONS)
    before = fetch_counts(sluice)
    got: list[tuple[int, int, str]] = []
    with capture_fetcher_log() as captured:
        producer = ContinuousProducer(kafka_broker.bootstrap, unique_topic, rounds=rounds, interval=interval)
        consumer = KafkaConsumer(unique_topic, bootstrap_servers=sluice.bootstrap, client_id=PY_CLIENT_ID,
                                 group_id=f"g-{unique_topic}", auto_offset_reset="earliest",
                                 enable_auto_commit=False, fetch_max_wait_ms=100)
        try:
            wait_partitions_known(consumer, unique_topic, PARTITIONS)
            deadline = time.monotonic() + rounds * interval + 60
            while len(got) < total and time.monotonic() < deadline:
                for _tp, msgs in consumer.poll(timeout_ms=500).items():
                    got += [(m.partition, m.offset, m.value.decode()) for m in msgs]
                    assert all(m.key.decode() == key(m.partition, int(m.value.decode().split("-")[1])) for m in msgs)
        finally:
            consumer.close()
            producer.join()
    producer.check_acked()
    counts = deltas(sluice, before)
    lines = captured.lines
    responses = [int(m[1]) for ln in lines if (m := PY_INCREMENTAL_RESPONSE.search(ln))]
    created = [int(m[1]) for ln in lines if (m := PY_SESSION_CREATED.search(ln))]
    assert created and all(s > 0 for s in created), f"kafka-python created no session: {created}; log:\n" + \
        "\n".join(lines[:20])
    assert len(responses) >= 50 and all(s > 0 for s in responses), \
        f"{len(responses)} incremental responses accepted by kafka-python (want >= 50)"
    bad = offending(lines, PY_INVALID + PY_FETCH_FAILED + PY_SESSION_ERRORS)
    assert not bad, "kafka-python's FetchSessionHandler rejected responses or got errors:\n" + "\n".join(bad[:20])
    check_once_in_order(got, rounds)
    assert counts["fetch_requests"] >= 50, f"Fetch requests through Sluice: {counts}"
    assert counts["downstream_incremental"] >= 50, f"Sluice served too few downstream incremental fetches: {counts}"
    assert counts["upstream_incremental"] > 0, f"Sluice sent no upstream incremental fetch: {counts}"


# ------------------------------------------------------------------------------------------- broker restart


def committed(bootstrap: str, topic: str, group: str) -> dict[int, int]:
    """The group's committed offset per partition, read from the broker (-1001: none)."""
    return committed_offsets(AdminClient({"bootstrap.servers": bootstrap}), group, topic, PARTITIONS)


class LineReader:
    """A pipe's lines, read by a thread into a queue: a pipe read cannot be bounded in time, and a pipe nobody
    drains can block the writer."""

    def __init__(self, stream: IO[str] | None) -> None:
        assert stream is not None
        self.lines: list[str] = []
        #: the stream has ended and every line of it is in ``lines`` (a process that has exited may still have
        #: lines in the pipe that the thread has not read)
        self.ended = False
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, args=(stream,), daemon=True)
        self._thread.start()

    def _run(self, stream: IO[str]) -> None:
        for line in stream:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def drain(self, timeout: float) -> list[str]:
        """Every line, once the stream has ended (bounded by `timeout`)."""
        self.wait_for(2**31, timeout)
        return self.lines

    def wait_for(self, n: int, timeout: float) -> None:
        """Until `n` lines have arrived, or the stream ends, or `timeout` s pass."""
        deadline = time.monotonic() + timeout
        while len(self.lines) < n and not self.ended:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                return
            if line is None:
                self.ended = True
                return
            self.lines.append(line)


def test_java_consumer_broker_restart_loses_nothing(java_tools: JavaTools, unique_topic: str,
                                                    tmp_path: Path) -> None:
    """Its own broker (the shared one must not restart under other tests): the Java consumer reads half the records
    through Sluice, the broker restarts, the rest are produced; the consumer gets every record once, in order, and
    its session handler never sees an invalid response."""
    rounds = 150
    half = rounds // 2
    total = PARTITIONS * rounds
    config, log = log4j2_config(tmp_path)
    with KafkaBroker() as broker, ProxyThread(broker.bootstrap, **TERMINATE) as sluice:
        create_topic(broker.bootstrap, unique_topic, PARTITIONS)
        before = fetch_counts(sluice)
        first = ContinuousProducer(broker.bootstrap, unique_topic, rounds=half, interval=0.02)
        # Offsets committed every 100 ms (the default is 5 s), so that the first half is committed before the
        # restart (waited for below).
        proc = java_tools.spawn(CONSOLE_CONSUMER, java_consumer_args(sluice.bootstrap, unique_topic, total, 60_000,
                                                                     "auto.commit.interval.ms=100"),
                                log4j_config=config)
        out, err = LineReader(proc.stdout), LineReader(proc.stderr)
        try:
            first.join()
            first.check_acked()
            out.wait_for(PARTITIONS * half, timeout=60)
            assert len(out.lines) == PARTITIONS * half, f"before the restart: {len(out.lines)} records"
            # The restart may make the consumer rejoin its group (while the broker stops, its metadata can lack
            # the topic: "cached metadata has changed"). The classic consumer commits before rejoining, but only
            # the positions it holds valid (SubscriptionState.allConsumed: hasValidPosition), and after a leader
            # epoch change they await validation; with nothing committed it would start over from the beginning
            # (--from-beginning) and read the first half twice, which is the client's at-least-once, not Sluice's.
            # So the first half must be committed before the broker goes down.
            want = {p: half for p in range(PARTITIONS)}
            wait_until(lambda: committed(broker.bootstrap, unique_topic, f"g-{unique_topic}") == want, 30,
                       lambda: f"committed {committed(broker.bootstrap, unique_topic, f'g-{unique_topic}')}, "
                               f"want {want}")
            # And its session in use before the broker goes: caught up, the consumer sends an incremental fetch at
            # least every fetch.max.wait.ms; how many fit in the steps above depends on the machine's speed, so the
            # count the checks below ask for is waited for here, from its log
            wait_until(lambda: len(incremental_built(log)) >= MIN_INCREMENTAL, 60,
                       lambda: f"{len(incremental_built(log))} incremental fetches built before the restart")
            broker.restart()
            second = ContinuousProducer(broker.bootstrap, unique_topic, rounds=rounds - half, interval=0.02,
                                        first=half)
            second.join()
            second.check_acked()
            out.wait_for(total, timeout=90)
            # --max-messages reached: the tool exits by itself; otherwise it is stopped below
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(10)
        stderr = "\n".join(err.drain(10))
        counts = deltas(sluice, before)
    log_lines = log.read_text().splitlines() if log.exists() else []
    # A restart may break connections (the handler then drops its session: "Error sending fetch request"), but
    # nothing may be invalid, and no session error may reach the client: Sluice's session outlives the broker's.
    check_java_sessions(log_lines, stderr, min_incremental=MIN_INCREMENTAL, allow_fetch_failures=True)
    check_once_in_order(parse_console(out.lines), rounds)
    assert proc.returncode == 0, f"console consumer exited with {proc.returncode}:\n{stderr[-3000:]}"
    assert counts["downstream_incremental"] >= MIN_INCREMENTAL, \
        f"Sluice served too few downstream incremental fetches: {counts}"


#: incremental fetches the broker-restart test waits for before the restart, and then checks
MIN_INCREMENTAL = 5


def incremental_built(log: Path) -> list[str]:
    """The Java FetchSessionHandler's "Built incremental fetch" lines in its log so far."""
    lines = log.read_text().splitlines() if log.exists() else []
    return [ln for ln in lines if JAVA_BUILT_INCREMENTAL.search(ln)]


def test_java_consumer_session_while_policies_edit_its_responses(kafka_broker: KafkaBroker, java_tools: JavaTools,
                                                                unique_topic: str, tmp_path: Path) -> None:
    """Owning the session is what lets policies edit responses without breaking it: a KIP-73 throttle of 4 KB/s
    leaves the topic's records out of many responses (partitions kept, records empty) and a 1 KiB KIP-74 budget
    clamps every request, while the producer keeps going; the Java consumer's session handler never finds a
    response invalid, and every record arrives once, in order."""
    rounds = 150
    config, log = log4j2_config(tmp_path)
    create_topic(kafka_broker.bootstrap, unique_topic, PARTITIONS)
    policies = {"size_limit.budgets": [{"client_id": JAVA_CLIENT_ID, "fetch_max_bytes": 1024}],
                "throttle.leader_rate_bytes": 4000, "throttle.topics": [{"topic": unique_topic, "replicas": "*"}],
                "throttle.consumers": [{"client_id": JAVA_CLIENT_ID}]}
    with ProxyThread(kafka_broker.bootstrap, **TERMINATE, **policies) as sluice:
        before = fetch_counts(sluice)
        producer = ContinuousProducer(kafka_broker.bootstrap, unique_topic, rounds=rounds, interval=0.02)
        try:
            proc = java_tools.run(CONSOLE_CONSUMER,
                                  java_consumer_args(sluice.bootstrap, unique_topic, PARTITIONS * rounds, 30_000),
                                  timeout=120, check=False, log4j_config=config)
        finally:
            producer.join()
        producer.check_acked()
        counts = deltas(sluice, before)
    assert proc.returncode == 0, f"console consumer exited with {proc.returncode}:\n{proc.stderr[-3000:]}"
    check_java_sessions(log.read_text().splitlines() if log.exists() else [], proc.stderr, min_incremental=20)
    check_once_in_order(parse_console(proc.stdout.splitlines()), rounds)
    assert sluice.total("sluice_throttle_left_out_partitions_total", side="leader") > 0, \
        "the throttle never left records out"
    assert counts["downstream_incremental"] >= 20, f"Sluice served too few downstream incremental fetches: {counts}"
