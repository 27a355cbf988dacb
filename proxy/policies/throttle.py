"""Replication throttles (KIP-73): byte-rate quotas applied by leaving throttled partitions out of fetches.

Sans-IO: the pipeline hands in decoded Fetch requests (a :class:`~proxy.wire.fetch_request_fast.FetchEdit`) and
responses and ``now``; this module returns decisions and edits in place. The quotas
(:class:`~proxy.quota.WindowedRate`) and the lag table live in one :class:`ThrottleState` shared by every
connection (Kafka has one LeaderReplication and one FollowerReplication quota per broker); the configuration
is an immutable :class:`Throttles` snapshot, swapped whole on reload.

Who is throttled (reference/kafka-semantics.md section C):

- ``[[throttle.topics]]`` lists a topic's throttled replicas in KIP-73's syntax: ``"*"`` (every partition, every
  fetcher), ``""`` (none) or ``"partition:broker,..."``. For a replica fetch (replica_id >= 0, a follower broker)
  the fetcher is that broker id, as in ``leader.replication.throttled.replicas``.
- An entry's ``topic`` is a topic name or a glob over names (fnmatch's ``*``, ``?``, ``[...]``, case-sensitive
  like Kafka's names; no topic name can hold those characters, Topic.java). One entry applies per topic, never
  a merge: the entry naming it exactly, else the first glob in file order that matches (as the budgets' "first
  match wins"). So a glob sets the rule for a family of topics and an exact entry overrides it for one, e.g.
  ``replicas = ""`` to exempt it. Kafka itself has no globs: its throttled-replicas lists are per-topic configs.
- Kafka never throttles consumers (UnboundedQuota). Sluice can: a consumer whose client.id matches a
  ``[[throttle.consumers]]`` glob is throttled on the partitions a topic entry lists (any fetcher), so a
  backfill or replay job reading from the start cannot eat the bandwidth live consumers need.

What happens (ReplicationQuotaManager.scala, ReplicaManager.readFromLocalLog, ReplicaFetcherThread.buildFetch):

- Leader side, on the response to the fetcher: if the leader quota is exceeded, a throttled partition's records
  are left out: the partition stays, error 0, real high watermark, empty records (shouldLeaderThrottle). Then
  the bytes of *all* throttled partitions sent are recorded (ReplicaManager records after responding).
- Follower side, on the request Sluice sends upstream: if the follower quota is exceeded, throttled partitions
  are left out of the fetch (buildFetch's ``shouldFollowerThrottle``); the bytes received for throttled
  partitions are recorded. Only session-less requests (epoch -1) are edited: a full session request
  (epoch 0) defines the broker's session, and an incremental one only lists changes, so removing a partition
  there would drop it from the session for good. Those rely on the leader side.
- In-sync exemption (KAFKA-4313, PR #2043): a partition whose fetch offset is at (or past) the high
  watermark is never throttled, but its bytes still count. On the follower side the high watermark is the
  last one seen in a response for that partition (unknown = not in sync).
- Sessions: leaving records out but keeping the partition keeps a Java client's session valid
  (FetchSessionHandler.verifyFullFetchResponsePartitions requires a full response to hold exactly the
  session's partitions) and an incremental session consistent (the broker's cached fetch offset only moves
  when the client asks for a new one, so the records are sent again later).
- Pacing: Kafka's DelayedFetch does not count throttled partitions towards min_bytes, so a fetch that gets
  only throttled partitions waits up to max_wait_ms. A proxy answers at once, so instead :class:`Outcome`
  carries ``mute_s`` (min(max_wait, time until the quota recovers)); the server stops reading that client
  connection for that long, as Kafka does for client quotas (KIP-219 channel muting).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..config import ThrottleSettings
from ..quota import WindowedRate
from ..wire.errors import CodecError
from ..wire.fetch_fast import FetchResponseView
from ..wire.fetch_request_fast import FIRST_TOPIC_ID, FetchEdit, PartitionKey
from ..wire.model import Message
from ..wire.records import complete_size

#: fetcher id of a consumer (replica_id < 0) selected by a [[throttle.consumers]] glob
CONSUMER = -1


@dataclass(frozen=True, slots=True)
class ReplicaSet:
    """A parsed ``*.replication.throttled.replicas`` value."""

    everything: bool = False
    pairs: frozenset[tuple[int, int]] = frozenset()  # (partition, broker id)

    @property
    def partitions(self) -> frozenset[int]:
        return frozenset(p for p, _ in self.pairs)

    def throttled(self, partition: int, fetcher: int) -> bool:
        if self.everything:
            return True
        if fetcher == CONSUMER:
            return any(p == partition for p, _ in self.pairs)
        return (partition, fetcher) in self.pairs


def parse_replicas(text: str, key: str = "replicas") -> ReplicaSet:
    """KIP-73 syntax (ThrottledReplicaListValidator: ``([0-9]+:[0-9]+)?`` items, or ``*``). Raises
    ValueError naming ``key`` and the offending item."""
    text = text.strip()
    if text == "*":
        return ReplicaSet(everything=True)
    if not text:
        return ReplicaSet()
    pairs = set()
    for raw in text.split(","):
        item = raw.strip()
        partition, sep, broker = item.partition(":")
        if not (sep and partition.isdigit() and broker.isdigit() and partition.isascii() and broker.isascii()):
            raise ValueError(f'{key}: {item!r} is not "partition:broker" (e.g. "0:101,1:102"), nor "*"')
        pairs.add((int(partition), int(broker)))
    return ReplicaSet(pairs=frozenset(pairs))


@dataclass(frozen=True, slots=True)
class Throttles:
    """One immutable snapshot of the [throttle] configuration.

    ``topics`` maps each ``[[throttle.topics]]`` entry's topic, as configured (a name or a glob), to its replicas,
    in file order. :meth:`throttled` picks the entry for a topic name by the precedence in the module docstring
    and remembers it per name (:attr:`RESOLVED_MAX`), so fnmatch runs once per topic name, not per partition per
    fetch; the memo goes with the snapshot, which is replaced whole on every change."""

    leader_rate: int = 0
    follower_rate: int = 0
    samples: int = 11
    window_s: float = 1.0
    topics: dict[str, ReplicaSet] = field(default_factory=dict)
    consumers: tuple[str, ...] = ()
    #: the glob entries, in file order: part of equality, since with "first glob wins" their order is configuration
    globs: tuple[str, ...] = field(init=False, repr=False)
    #: the entries naming a topic exactly
    _exact: dict[str, ReplicaSet] = field(init=False, repr=False, compare=False)
    #: topic name -> its entry's replicas (None: no entry). Starts with the exact names; a name resolved through
    #: the globs is added on first use.
    _resolved: dict[str, ReplicaSet | None] = field(init=False, repr=False, compare=False)

    #: Names resolved through globs that are remembered at most (then the memo starts again from the exact names,
    #: as the re module's cache does). A fetch may name any topic, so an unbounded memo would be unbounded memory;
    #: 10,000 names are a megabyte or two, and more topics than one proxy usually sees fetched.
    RESOLVED_MAX = 10_000

    def __post_init__(self) -> None:
        from ..config import topic_is_glob  # what a glob is: one definition, shared with config validation

        exact = {t: r for t, r in self.topics.items() if not topic_is_glob(t)}
        object.__setattr__(self, "globs", tuple(t for t in self.topics if t not in exact))
        object.__setattr__(self, "_exact", exact)
        object.__setattr__(self, "_resolved", dict(exact))

    @classmethod
    def from_settings(cls, s: ThrottleSettings) -> Throttles:
        topics = {t.topic: parse_replicas(t.replicas, f"throttle.topics[{i}].replicas")
                  for i, t in enumerate(s.topics)}
        return cls(s.leader_rate_bytes, s.follower_rate_bytes, s.samples, s.window_s, topics,
                   tuple(c.client_id for c in s.consumers))

    @property
    def active(self) -> bool:
        """Whether any fetch can be throttled (else Fetch is not decoded for throttling at all)."""
        return bool(self.topics) and bool(self.leader_rate or self.follower_rate)

    def fetcher(self, client_id: str | None, replica_id: int) -> int | None:
        """The fetcher id a fetch is throttled as (a broker id, or CONSUMER), or None if it is not selected."""
        if replica_id >= 0:
            return replica_id
        if any(fnmatch.fnmatchcase(client_id or "", g) for g in self.consumers):
            return CONSUMER
        return None

    def throttled(self, topic: str | None, partition: int, fetcher: int) -> bool:
        if topic is None:
            return False
        replicas = self._resolved.get(topic)
        if replicas is None and self.globs and topic not in self._resolved:
            replicas = self._resolve(topic)
        return replicas is not None and replicas.throttled(partition, fetcher)

    def entry(self, topic: str) -> str | None:
        """The ``[[throttle.topics]]`` topic (a name or a glob, as configured) whose replicas apply to ``topic``."""
        if topic in self._exact:
            return topic
        return next((g for g in self.globs if fnmatch.fnmatchcase(topic, g)), None)

    def _resolve(self, topic: str) -> ReplicaSet | None:
        """A topic no exact entry names, the first time it is seen: the first glob matching it (or None)."""
        entry = self.entry(topic)
        replicas = self.topics[entry] if entry is not None else None
        if len(self._resolved) >= len(self._exact) + self.RESOLVED_MAX:
            self._resolved.clear()
            self._resolved.update(self._exact)
        self._resolved[topic] = replicas
        return replicas


Key = tuple[str, int]  # (topic name, partition)


class ThrottleState:
    """What every connection shares: the two quotas, the last high watermark seen per throttled partition
    (the follower side's in-sync test) and the lag table behind the SumReplicaLag-style gauge."""

    def __init__(self, throttles: Throttles | None = None) -> None:
        t = throttles or Throttles()
        self.leader = WindowedRate(t.leader_rate, t.samples, t.window_s)
        self.follower = WindowedRate(t.follower_rate, t.samples, t.window_s)
        self.high_watermarks: dict[Key, int] = {}
        #: (topic, partition, fetcher) -> (lag, when): entries older than the quota's whole window are stale
        self._lag: dict[tuple[str, int, int], tuple[int, float]] = {}

    def reconfigure(self, t: Throttles) -> None:
        """A new snapshot: bounds apply at once; the rate history stays unless the sample shape changed."""
        self.leader.reconfigure(t.leader_rate, t.samples, t.window_s)
        self.follower.reconfigure(t.follower_rate, t.samples, t.window_s)
        self._lag.clear()
        self.high_watermarks.clear()

    def note_lag(self, key: Key, fetcher: int, lag: int, now: float) -> None:
        self._lag[(key[0], key[1], fetcher)] = (lag, now)

    def sum_lag(self, now: float) -> int:
        horizon = self.leader.samples * self.leader.window_s
        stale = [k for k, (_, t) in self._lag.items() if now - t > horizon]
        for k in stale:
            del self._lag[k]
        return sum(lag for lag, _ in self._lag.values())


@dataclass(slots=True)
class Ticket:
    """What the request side learnt, for the response side: the fetch offsets of throttled partitions."""

    fetcher: int
    offsets: dict[Key, int]
    max_wait_s: float
    left_out: int = 0  # partitions left out of the upstream request (follower side)
    emptied: bool = False  # the follower side left out every partition of the request


@dataclass(slots=True)
class Outcome:
    """What the leader side did to one response."""

    left_out: int = 0
    trimmed_bytes: int = 0  # truncated trailing batches dropped from throttled partitions
    leader_bytes: int = 0
    follower_bytes: int = 0
    mute_s: float = 0.0

    @property
    def changed(self) -> bool:
        return bool(self.left_out or self.trimmed_bytes)


TopicName = Callable[[Any], "str | None"]


def _name(topic: Any, names: TopicName) -> str | None:
    """A request/response topic's name: ``topic`` (Fetch <= v12) or its ``topic_id`` resolved by ``names``."""
    name = topic.get("topic") if isinstance(topic, Message) else getattr(topic, "topic", "")
    if name:
        return str(name)
    tid = topic.get("topic_id") if isinstance(topic, Message) else getattr(topic, "topic_id", None)
    return names(bytes(tid)) if tid is not None else None


def plan_request(edit: FetchEdit, fetcher: int, t: Throttles, state: ThrottleState, names: TopicName,
                 now: float) -> Ticket:
    """Request side. Records the fetch offsets of throttled partitions and, on the follower side, leaves
    throttled partitions that are not in sync out of a session-less request while the follower quota is
    exceeded (removed from ``edit.partitions``, ``edit.changed`` set; ``ticket.left_out`` says how many).
    Topics are named (v4-12) or, from v13, ids resolved through ``names``; an unknown id is not throttled."""
    view = edit.view
    ticket = Ticket(fetcher, {}, max(0, view.max_wait_ms) / 1000.0)
    drop = bool(t.follower_rate) and view.session_epoch == -1 and state.follower.exceeded(now)
    by_id = view.version >= FIRST_TOPIC_ID
    parts = edit.partitions
    left_out: list[PartitionKey] = []
    last: object = None
    name: str | None = None
    for key, p in parts.items():
        topic, partition = key
        if topic != last:  # partitions come grouped by topic: resolve each topic once
            last = topic
            name = names(topic) if by_id else (topic or None)  # type: ignore[assignment]  # str before v13
        if not t.throttled(name, partition, fetcher):
            continue
        assert name is not None
        hw = state.high_watermarks.get((name, partition))
        in_sync = hw is not None and p.fetch_offset >= hw
        if drop and not in_sync:
            left_out.append(key)
            continue
        ticket.offsets[(name, partition)] = p.fetch_offset
    if left_out:
        ticket.emptied = len(left_out) == len(parts)
        for key in left_out:
            del parts[key]
        ticket.left_out = len(left_out)
        edit.changed = True
    return ticket


def enforce(view: FetchResponseView, ticket: Ticket, t: Throttles, state: ThrottleState, names: TopicName,
            now: float) -> Outcome:
    """Leader side, on a decoded Fetch response, in place."""
    out = Outcome()
    exceeded = bool(t.leader_rate) and state.leader.exceeded(now)
    any_records = False
    for topic, p in view.partitions():
        name = _name(topic, names)
        key = (name or "", p.partition_index)
        offset = ticket.offsets.get(key) if name is not None else None
        size = len(p.records) if p.records else 0
        if offset is None:  # not throttled
            any_records = any_records or size > 0
            continue
        if size:
            # The broker's read is a byte slice of the log: a truncated trailing batch is useless to every
            # client (they discard it) and would make the quota count bytes nobody can use. Drop it, as
            # size_limit does; v3+ brokers always send at least one whole batch, so nothing useful is lost.
            try:
                complete = complete_size(memoryview(p.records))  # type: ignore[arg-type]
            except CodecError:  # not Sluice's to judge here: the client reports corrupt records itself
                complete = size
            if 0 < complete < size:
                p.records = memoryview(p.records)[:complete]  # type: ignore[arg-type]
                out.trimmed_bytes += size - complete
                size = complete
        if p.error_code == 0:
            state.high_watermarks[key] = p.high_watermark
            state.note_lag(key, ticket.fetcher, max(0, p.high_watermark - offset), now)
        out.follower_bytes += size
        in_sync = offset >= p.high_watermark  # KAFKA-4313: not throttled, but counted
        if exceeded and size and not in_sync:
            p.records = memoryview(p.records)[:0] if p.records is not None else p.records
            out.left_out += 1
            continue
        out.leader_bytes += size
        any_records = any_records or size > 0
    state.follower.record(out.follower_bytes, now)
    state.leader.record(out.leader_bytes, now)
    if not any_records:
        # Nothing to hand back: pace the fetcher as Kafka's DelayedFetch would (see the module docstring).
        if out.left_out:
            out.mute_s = min(ticket.max_wait_s, state.leader.throttle_time(now))
        elif ticket.emptied:
            out.mute_s = min(ticket.max_wait_s, state.follower.throttle_time(now))
    return out
