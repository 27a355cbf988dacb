"""Consumer groups of real clients for the cooperative consumption tests (tests/clients/test_sharing.py): each
consumer a subprocess (rig/group_consumer.py for the Python clients, Kafka's console consumer for Java) reporting
what it received, and the checks made of it from the clients' side."""

from __future__ import annotations

import contextlib
import itertools
import json
import time
import weakref
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import ConsumerGroupState, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from proxy.policies.sharing.keys import key_hash, slice_of
from rig.group_consumer import ConsumerProcess, stop_all
from rig.java_tools import CONSOLE_CONSUMER, JavaTools
from tests.support.faults import POLL_S, wait_until
from tests.support.topics import committed_offsets

REPO = Path(__file__).resolve().parents[2]
SEP = "|"
#: how long consumers are still watched once every expected record has arrived, for a record delivered again
#: just after: many fetch rounds of each (fetch.max.wait 200 ms for the Python runners, 500 ms Java's default)
LATE_S = 3.0
#: how long a classic group must stay unchanged to count as settled (:func:`settled`; a KIP-848 group's is
#: rig/kafka.py KIP848_SETTLE_S): its rebalance hands every member its assignment at once, in SyncGroup
CLASSIC_SETTLE_S = 2.0


@dataclass(frozen=True)
class Got:
    partition: int
    offset: int
    key: str
    value: str


class Member(ConsumerProcess):
    """One consumer of the group, as a subprocess, and everything it reported, in order. Every member made and not
    told to end must stay alive: the waits below fail at once, naming it, when one has died."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _members.add(self)

    @property
    def client_id(self) -> str:
        return self.name

    @property
    def received(self) -> list[Got]:
        return [Got(*r) for _, r in self.timed_records()]

    def committed(self) -> tuple[set[str], set[str]]:
        """(values certainly committed, values reported after the last commit attempt: certainly not)."""
        done, after = self._commits()
        return set(done), after

    def committed_at(self) -> dict[str, float]:
        """Each value certainly committed, with when it was known to be: the time (``time.monotonic``) of the report
        of the first successful commit covering it (:meth:`timed_events`; the commit landed before that)."""
        return self._commits()[0]

    def _commits(self) -> tuple[dict[str, float], set[str]]:
        done: dict[str, float] = {}
        seen: list[Got] = []
        after: set[str] = set()
        for t, e in self.timed_events():
            for r in e.get("rs", ()):
                seen.append(Got(*r))
                after.add(r[3])
            if "committing" in e:
                after = set()
            if "commit" in e:
                positions = {int(p): o for p, o in e["commit"].items()}
                for g in seen:
                    if g.partition in positions and g.offset < positions[g.partition]:
                        done.setdefault(g.value, t)
        return done, after


_members: weakref.WeakSet[Member] = weakref.WeakSet()


def check_members_alive() -> None:
    """AssertionError naming the first member that ended without being told to (its exit code and stderr)."""
    for m in list(_members):
        m.check_alive()


@contextlib.contextmanager
def members_of(*members: Member) -> Iterator[list[Member]]:
    """The consumers ``members``, stopped together at the end; a failure inside names where each one is (its
    description is added to the error), and their stderr files are then kept."""
    failed = False
    try:
        yield list(members)
    except BaseException as e:
        failed = True
        e.add_note(describe_members(members))  # which consumer stopped, and where
        raise
    finally:
        stop_all(members, keep_stderr=failed)


def describe_members(members: Iterable[Member]) -> str:
    """Where each member is (running or its exit code, its last report, its stderr): for a failing test."""
    return "\n".join(m.describe() for m in members)


def python_member(client: str, bootstrap: str, topic: str, group: str, client_id: str, *, work_ms: float = 0,
                  strategy: str = "range", assign: int = 0, protocol: str = "classic",
                  unread_joins: Path | None = None, assign_ms: float = 0, isolation: str | None = None,
                  rack: str | None = None, sasl: tuple[str, str] | None = None,
                  session_timeout_ms: int | None = None) -> Member:
    extra = ["--work-ms", str(work_ms), "--strategy", strategy, "--max-poll-records", "20"]
    if session_timeout_ms is not None:  # a classic member's session (rig.group_consumer's default: 6 s)
        extra += ["--session-timeout-ms", str(session_timeout_ms)]
    if sasl is not None:  # a SASL/SCRAM-SHA-512 login (user, password) over plaintext (rig.group_consumer)
        extra += ["--sasl-user", sasl[0], "--sasl-password", sasl[1]]
    if isolation:  # KIP-98's isolation level (none: the client's default, rig.group_consumer)
        extra += ["--isolation-level", isolation]
    if rack:  # KIP-392: fetch from a replica in this rack
        extra += ["--client-rack", rack]
    if assign_ms:  # its callback on an assignment takes this long (rig.group_consumer)
        extra += ["--assign-ms", str(assign_ms)]
    if unread_joins is not None:  # kafka-python: joins left unread while the file counts (rig.group_consumer)
        extra += ["--unread-joins", str(unread_joins)]
    if protocol != "classic":  # the Go consumer (rig/go) takes no such flag: it speaks the classic protocol
        extra += ["--group-protocol", protocol]
    if assign:
        extra += ["--assign", str(assign)]
    return Member.spawn(client, bootstrap, topic, group, client_id, *extra, cwd=str(REPO))


def java_member(tools: JavaTools, bootstrap: str, topic: str, group: str, client_id: str, *,
                props: dict[str, str] | None = None, protocol: str = "classic", partition: int | None = None) -> Member:
    """Kafka's console consumer (the Java client) in ``group``, printing "Partition:P|Offset:O|key|value"
    (``partition``: assigned that partition of the topic from its start instead, no group: a standalone consumer)."""
    args = ["--bootstrap-server", bootstrap, "--topic", topic,
            *(["--group", group] if partition is None else ["--partition", str(partition), "--offset", "earliest"]),
            "--property", "print.partition=true", "--property", "print.offset=true", "--property", "print.key=true",
            "--property", f"key.separator={SEP}",
            "--consumer-property", f"client.id={client_id}", "--consumer-property", "auto.offset.reset=earliest"]
    if protocol == "classic":
        args += ["--consumer-property", "heartbeat.interval.ms=500", "--consumer-property", "session.timeout.ms=6000"]
    else:  # KIP-848: the broker times the group; the Java client refuses the classic protocol's timing settings
        args += ["--consumer-property", f"group.protocol={protocol}"]
    for k, v in (props or {}).items():
        args += ["--consumer-property", f"{k}={v}"]

    def parse(line: str) -> dict[str, Any] | None:
        parts = line.rstrip("\n").split(SEP)
        if len(parts) != 4 or not parts[0].startswith("Partition:"):
            return None
        return {"rs": [[int(parts[0].split(":")[1]), int(parts[1].split(":")[1]), parts[2], parts[3]]]}

    return Member(tools.spawn(CONSOLE_CONSUMER, args), parse, client_id)


def produce(bootstrap: str, topic: str, n: int, keys: int, tag: str,
            config: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    """``n`` records of ``keys`` keys, acknowledged by the broker: [(key, value)], values unique (``config``: more
    producer settings)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all", **(config or {})})
    out = [(f"key-{i % keys}", f"{tag}-{i:06d}") for i in range(n)]
    for k, v in out:
        producer.produce(topic, key=k.encode(), value=v.encode())
        producer.poll(0)
    assert producer.flush(60) == 0
    return out


#: librdkafka's codecs (compression.type), every one Kafka defines
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


def produce_one_per_batch(bootstrap: str, topic: str, n: int, keys: int | list[str], tag: str,
                          partition: int | None = None) -> list[tuple[str, str]]:
    """``n`` records of ``keys`` keys (a count: ``key-0``...; or the keys themselves, taken in turn), each in a
    batch of its own, compressed with each codec of :data:`CODECS` in turn (one producer per codec, each waiting
    for its record's acknowledgement before the next is sent): a low-rate topic's shape, every codec in one
    partition (``partition``: all in that one, else where the producer's partitioner puts each key).
    [(key, value)], values unique."""
    producers = [Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0, "batch.num.messages": 1,
                           "compression.type": codec}) for codec in CODECS]
    names = [f"key-{i}" for i in range(keys)] if isinstance(keys, int) else keys
    out = [(names[i % len(names)], f"{tag}-{i:06d}") for i in range(n)]
    for i, (k, v) in enumerate(out):
        producer = producers[i % len(producers)]
        if partition is None:
            producer.produce(topic, key=k.encode(), value=v.encode())
        else:
            producer.produce(topic, key=k.encode(), value=v.encode(), partition=partition)
        assert producer.flush(30) == 0
    return out


def one_slice_run(bootstrap: str, topic: str, partitions: int, per_partition: int, tag: str) -> list[tuple[str, str]]:
    """``per_partition`` records one per batch in each partition whose keys all fall in slice 0 of a partition
    shared by two members (:func:`slice_of`), each key in one partition only (named for it): the member holding
    slice 1 reads nothing of its own across the run. [(key, value)], values unique."""
    out: list[tuple[str, str]] = []
    for p in range(partitions):
        keys = [k for k in (f"run-{p}-{j}" for j in range(40)) if slice_of(key_hash(k.encode()), 2) == 0][:5]
        out += produce_one_per_batch(bootstrap, topic, per_partition, keys, f"{tag}-p{p}", partition=p)
    return out


def settled(metrics: Callable[[], tuple[float, float]], timeout: float = 90.0,
            quiet_s: float = CLASSIC_SETTLE_S) -> None:
    """Wait until the group has settled: ``metrics()`` (e.g. shared partitions and assignments rewritten, summed
    over the Sluices) unchanged for ``quiet_s`` and its first figure non-zero."""
    last: list[Any] = [None, 0.0]

    def quiet() -> bool:
        check_members_alive()
        now = metrics()
        if now != last[0]:
            last[0], last[1] = now, time.monotonic()
            return False
        return bool(now[0]) and time.monotonic() - last[1] >= quiet_s

    wait_until(quiet, timeout, lambda: f"the group to settle (last {last[0]})")


def stable_members(admin: AdminClient, group: str) -> int:
    """How many members ``group`` has while its coordinator holds it Stable; 0 while it rebalances (or before the
    coordinator loaded it). A settled group is judged from the broker as well as from Sluice: each Sluice's figures
    stay what its member was handed last while a rebalance runs, and a rebalance can wait seconds on one member
    (kafka-go, after a JoinGroup, SyncGroup or OffsetFetch that failed other than by a rebalance, leaves the group
    and joins again 5 s later: ConsumerGroup.run, JoinGroupBackoff)."""
    try:
        described = admin.describe_consumer_groups([group])[group].result(30)
    except KafkaException:  # not loaded by its coordinator yet
        return 0
    return len(described.members) if described.state == ConsumerGroupState.STABLE else 0


def wait_for_all(members: Iterable[Member], values: set[str], timeout: float = 90.0,
                 late_s: float = LATE_S) -> None:
    """Wait until ``values`` have all been received, then go on watching the consumers, still polling, for
    ``late_s`` or until one of ``values`` has arrived twice: a verdict taken the moment the last record arrived
    would never see a duplicate delivered a moment later."""
    members = list(members)

    def received() -> Counter[str]:
        check_members_alive()
        return Counter(g.value for m in members for g in m.received)

    def missing() -> str:
        lost = sorted(values - received().keys())
        return f"{len(lost)} records not received (the first: {lost[:12]}); members_of describes the consumers"

    wait_until(lambda: values <= received().keys(), timeout, missing)
    deadline = time.monotonic() + late_s
    while time.monotonic() < deadline and not any(n > 1 for v, n in received().items() if v in values):
        time.sleep(POLL_S)  # an observation window (bounded in time, ended by the first duplicate), not a wait


def check_exactly_once(members: Iterable[Member], produced: list[tuple[str, str]],
                       required: set[str] | None = None) -> None:
    """Every record received once, unchanged, by one consumer; each consumer got records in offset order.
    ``required``: the values that must all arrive, none but produced ones arriving (default: every record produced;
    on a compacted topic, what the log still holds: the cleaner may remove the others before they are read)."""
    members = list(members)
    counts = Counter(g.value for m in members for g in m.received)
    key_of = dict((v, k) for k, v in produced)
    if required is None:
        assert set(counts) == set(key_of), "records missing or unknown"
    else:
        assert counts.keys() <= key_of.keys(), f"records never produced: {sorted(counts.keys() - key_of.keys())[:5]}"
        assert required <= counts.keys(), "records the log still holds were not received"
    twice = [v for v, n in counts.items() if n > 1]
    assert not twice, f"{len(twice)} records delivered twice: {twice[:5]}\n{describe_twice(members, twice[:5])}"
    for m in members:
        assert all(key_of[g.value] == g.key for g in m.received), "a record changed"
        check_in_order(m)


def describe_twice(members: list[Member], values: list[str]) -> str:
    """For a failure: where and when each of ``values`` was received, then every member's group events (whatever
    it reported besides records and successful commits: generations joined, errors, failed commits), timed from the
    first record any member received. Duplicates after a rebalance and duplicates within one generation read apart
    here."""
    start = min((t for m in members for t, _ in m.timed_records()), default=0.0)
    lines = []
    for v in values:
        seen = [f"{m.client_id} p{r[0]}@{r[1]} +{t - start:.2f}s" for m in members for t, r in m.timed_records()
                if r[3] == v]
        lines.append(f"{v}: {', '.join(seen)}")
    for m in members:
        events = [f"+{t - start:.2f}s {json.dumps(e)[:200]}" for t, e in m.group_events()]
        lines.append(f"{m.client_id}: {'; '.join(events) or 'no group events'}")
    return "\n".join(lines)


def _by_assignment(m: Member) -> list[list[Got]]:
    """``m``'s records in runs, a new one at each assignment it reported. A partition handed (again) resumes from its
    committed offset (KafkaConsumer's javadoc, "Offsets and Consumer Position"; an eager rebalance hands every
    partition again), below what the consumer had received when its last commit had not succeeded: order holds
    within a run. Records delivered again after they were committed are the duplicate checks' to find."""
    runs: list[list[Got]] = [[]]
    for e in m.reported():
        if "assigned" in e:
            runs.append([])
        runs[-1].extend(Got(*r) for r in e.get("rs", ()))
    return runs


def _check_increasing(m: Member, stream: Callable[[Got], Hashable], named: Callable[[Got], str]) -> None:
    """Within each run of ``m``'s records (:func:`_by_assignment`), each ``stream``'s offsets increase; a failure
    names the stream that went back."""
    for run in _by_assignment(m):
        last: dict[Hashable, int] = {}
        for g in run:
            k = stream(g)
            assert g.offset > last.get(k, -1), f"{m.client_id}: {named(g)} went back"
            last[k] = g.offset


def check_in_order(m: Member) -> None:
    """Within each partition, a consumer gets records in increasing offsets (so each key's in produced order), for
    as long as it holds the partition (:func:`_by_assignment`)."""
    _check_increasing(m, lambda g: g.partition, lambda g: f"partition {g.partition}")


def check_in_key_order(m: Member) -> None:
    """Each key's records reach a consumer in increasing offsets, for as long as it holds the partition
    (:func:`_by_assignment`): what a partition's records keep when its slices change under a consumer (a slice
    handed again starts from its committed position, below the consumer's last offset of other keys)."""
    _check_increasing(m, lambda g: (g.partition, g.key), lambda g: f"key {g.key} of partition {g.partition}")


def check_keys_at_one_consumer(members: Iterable[Member]) -> None:
    """In a group that did not change while consuming, each key's records all went to one consumer."""
    where: dict[str, set[str]] = defaultdict(set)
    for m in members:
        for g in m.received:
            where[g.key].add(m.client_id)
    split = {k: sorted(v) for k, v in where.items() if len(v) > 1}
    assert not split, f"keys consumed by several consumers: {split}"


def committed_and_end_offsets(bootstrap: str, topic: str, group: str,
                              partitions: int) -> tuple[dict[int, int], dict[int, int]]:
    """(the group's committed offset per partition, read from the broker; each partition's end offset)."""
    from confluent_kafka import Consumer, TopicPartition

    committed = committed_offsets(AdminClient({"bootstrap.servers": bootstrap}), group, topic, partitions)
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{group}-watermarks"})
    try:
        ends = {p: reader.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(partitions)}
    finally:
        reader.close()
    return committed, ends


def produce_tail(bootstrap: str, topic: str, partitions: int, slices: int, tag: str,
                 config: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    """Close each partition with one batch holding one record of each of its ``slices`` key-hash slices.

    A slice's position moves past the records Sluice left out of its member's fetches right after the member's last
    record only when they come in the same response (the member's commit then covers them); a member whose slice
    gets no record later never commits again, so its slice's position, and the group's stable offset, stay where
    they are (docs/cooperative-consumption.md, its limits). Whether the last records of a partition come in one
    response is up to timing; one batch is appended and fetched whole, so after this tail every slice's member
    sees its record and the other slices' after it together, and the stable offset can reach the end."""
    keys: dict[int, str] = {}
    for i in itertools.count():
        key = f"tail-{tag}-{i}"
        keys.setdefault(slice_of(key_hash(key.encode()), slices), key)
        if len(keys) == slices:
            break
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 100, "acks": "all", **(config or {})})
    out = []
    for p in range(partitions):
        for s in range(slices):
            record = (keys[s], f"{tag}-tail-{p}-{s}")
            producer.produce(topic, key=record[0].encode(), value=record[1].encode(), partition=p)
            out.append(record)
    assert producer.flush(60) == 0
    return out


def describe_slices(proxies: Iterable[Any]) -> str:
    """For a failure: what each in-process Sluice (rig.proxy_thread.ProxyThread) knows of its members' slices -
    the generation each holds, whether the coordinator fenced it there, and per partition the slice, its position as
    Sluice last committed or read it, a commit of it in flight, and the read-ahead's gaps past it (Sluice commits a
    slice on past them itself: offsets.advance). A read off the proxy's loop: a snapshot for a message only."""
    lines = []
    for proxy in proxies:
        sharing = proxy.proxy.policy("sharing")
        for key, m in list(sharing.members.by_key.items()):
            parts = {f"{t}-{part}": (str(st.slice), st.committed, st.in_flight is not None,
                                     st.gaps.after(st.committed)[0] if st.committed >= 0 else None)
                     for (t, part), st in sorted((m.partitions or {}).items())}
            lines.append(f"{proxy.bootstrap} {key[1]}: generation {m.held}, fenced at {m.fenced_at}; "
                         f"(slice, committed, in flight, gaps to) {parts}")
    return "\n".join(lines)


def wait_for_end_commits(bootstrap: str, topic: str, group: str, partitions: int, timeout: float = 60.0,
                         proxies: Iterable[Any] = ()) -> None:
    """Until the group's committed offsets (read from the broker) equal the partitions' end offsets: the stable
    offset reached the end (lag tools show no gap). A failure describes the slices of in-process ``proxies``."""
    last: list[Any] = [None]

    def at_end() -> bool:
        last[0] = committed_and_end_offsets(bootstrap, topic, group, partitions)
        return last[0][0] == last[0][1]

    wait_until(at_end, timeout, lambda: f"committed offsets to reach the end (committed, end: {last[0]})\n"
                                        f"{describe_slices(proxies)}")
