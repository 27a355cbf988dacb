"""Replication throttles (KIP-73): byte-rate quotas applied by leaving throttled partitions out of fetches.

Sans-IO: :class:`Throttle` is the policy on the chain; it hands decoded Fetch requests (a
:class:`~proxy.wire.fetch_request_fast.FetchEdit`) and responses and ``now`` to :func:`plan_request` and
:func:`enforce`, which return decisions and edit in place. The quotas (:class:`~proxy.core.rate.WindowedRate`)
and the lag table live in one :class:`ThrottleState` shared by every connection (Kafka has one LeaderReplication
and one FollowerReplication quota per broker); the configuration is an immutable :class:`Throttles` snapshot,
swapped whole on reload. Fetch v13+ names topics by id: the policy asks for their names before it runs
(:mod:`proxy.core.topic_names`, a lookup of Sluice's own when no client told it).

Who is throttled (KIP-73; Kafka's ReplicationQuotaManager and ReplicaManager):

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

- Every throttled partition a response carries is metered, whether the request listed it or not: a fetch
  session's incremental request lists only the partitions that changed, while its response carries every
  partition of the session with news (KIP-227). Metering only the listed ones let a Java consumer read a 56 MB
  backlog with 6 MB counted.
- Leader side, on the response to the fetcher: if the leader quota is exceeded, a throttled partition's records
  are left out: the partition stays, error 0, real high watermark, empty records (shouldLeaderThrottle). Below
  the bound, the records that fit the quota's headroom pass, cut at batch boundaries (see :func:`enforce`: a
  consumer's response can hold many seconds of quota at once). Then the bytes of all throttled partitions sent
  are recorded (ReplicaManager records after responding). A response the headroom covers whole loses nothing:
  it streams through and its throttled partitions' whole batches are counted as they pass
  (:meth:`Throttle.stream_fetch`, :func:`account`).
- Follower side: if the follower quota is exceeded, throttled partitions are left out of a session-less fetch
  sent upstream (buildFetch's ``shouldFollowerThrottle``). A fetch session's partitions cannot be left out of
  its request (a full request defines the broker's session; an incremental one only lists changes, and the
  broker keeps returning the partitions it does not list), so for those the follower side leaves the records
  out of the response instead, exactly like the leader side.
- Both quotas record the throttled bytes handed to the fetcher. (Counting bytes a response carried but Sluice
  left out would keep a quota exceeded by the very records it holds back, which the broker sends again on the
  next fetch: nothing would ever pass.)
- In-sync exemption (KAFKA-4313, PR #2043): a partition whose fetcher is at the high watermark is never
  throttled, but its bytes still count. In a response that is when its first batch starts at (or past) the
  high watermark: a consumer only gets records below it, and a follower fetches from where its log ends, a
  batch boundary. On the follower side of a session-less request the high watermark is the last one seen in a
  response for that partition (unknown = not in sync).
- Sessions: leaving records out but keeping the partition keeps a Java client's session valid
  (FetchSessionHandler.verifyFullFetchResponsePartitions requires a full response to hold exactly the
  session's partitions) and an incremental session consistent (the broker's cached fetch offset only moves
  when the client asks for a new one, so the records are sent again later).
- Pacing: Kafka's DelayedFetch does not count throttled partitions towards min_bytes, so a fetch that gets
  only throttled partitions waits up to max_wait_ms. A proxy answers at once, so instead :class:`Outcome`
  carries ``mute_s`` (min(max_wait, time until the quota recovers)); the connection core stops reading that
  client for that long, as Kafka does for client quotas (KIP-219 channel muting).
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ...core.exchange import Exchange
from ...core.policy import Policy, Services, Streamed, reads
from ...core.rate import WindowedRate
from ...core.selectors import ClientSelector
from ...wire.api_keys import ApiKey
from ...wire.errors import CodecError
from ...wire.fetch_fast import FetchResponseView
from ...wire.fetch_layout import FIRST_TOPIC_ID, PartitionKey
from ...wire.fetch_request_fast import FetchEdit, FetchRequestView
from ...wire.fetch_stream import FetchStreamer, SeenPartition
from ...wire.records import complete_size, prefix_within
from ...wire.views import FetchResponse, MessageRequest, MessageResponse, ResponseView
from ..topic_rules import TopicRules
from . import share
from .metrics import ThrottleMetrics
from .settings import ThrottleSettings

#: fetcher id of a consumer (replica_id < 0) selected by a [[throttle.consumers]] glob
CONSUMER = -1
#: a record batch (and a legacy message set) starts with its base offset (int64)
_BASE_OFFSET = struct.Struct(">q")


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
    (:class:`~proxy.policies.topic_rules.TopicRules`, whose memo goes with the snapshot, replaced whole on every
    change)."""

    leader_rate: int = 0
    follower_rate: int = 0
    samples: int = 11
    window_s: float = 1.0
    topics: dict[str, ReplicaSet] = field(default_factory=dict)
    #: client selectors of throttled consumers (a plain string is a client.id glob)
    consumers: tuple[ClientSelector | str, ...] = ()
    #: the glob entries, in file order: part of equality, since with "first glob wins" their order is configuration
    globs: tuple[str, ...] = field(init=False, repr=False)
    _rules: TopicRules[ReplicaSet] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "consumers", tuple(c if isinstance(c, ClientSelector) else ClientSelector(c)
                                                    for c in self.consumers))
        rules = TopicRules(self.topics)
        object.__setattr__(self, "_rules", rules)
        object.__setattr__(self, "globs", rules.globs)

    @classmethod
    def from_settings(cls, s: ThrottleSettings) -> Throttles:
        topics = {t.topic: parse_replicas(t.replicas, f"throttle.topics[{i}].replicas")
                  for i, t in enumerate(s.topics)}
        return cls(s.leader_rate_bytes, s.follower_rate_bytes, s.samples, s.window_s, topics,
                   tuple(ClientSelector.of(c) for c in s.consumers))

    @property
    def active(self) -> bool:
        """Whether any fetch can be throttled (else Fetch is not decoded for throttling at all)."""
        return bool(self.topics) and bool(self.leader_rate or self.follower_rate)

    def fetcher(self, client_id: str | None, request: FetchRequestView | None, principal: str | None = None,
                host: str = "") -> int | None:
        """The fetcher id a fetch is throttled as (a follower's broker id, or CONSUMER), or None if it is not
        selected; ``request`` None: a consumer's (ShareFetch)."""
        if request is not None and request.from_follower:
            return request.replica_id
        if any(c.matches(client_id, principal, host) for c in self.consumers if isinstance(c, ClientSelector)):
            return CONSUMER
        return None

    def throttled(self, topic: str | None, partition: int, fetcher: int) -> bool:
        if topic is None:
            return False
        replicas = self._rules.get(topic)
        return replicas is not None and replicas.throttled(partition, fetcher)

    def entry(self, topic: str) -> str | None:
        """The ``[[throttle.topics]]`` topic (a name or a glob, as configured) whose replicas apply to ``topic``."""
        return self._rules.entry(topic)


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

    def reconfigure(self, t: Throttles, now: float | None = None) -> None:
        """A new snapshot: a changed bound applies from ``now`` (:meth:`WindowedRate.reconfigure`); an unchanged
        one keeps its history, a new sample shape restarts it."""
        self.leader.reconfigure(t.leader_rate, t.samples, t.window_s, now)
        self.follower.reconfigure(t.follower_rate, t.samples, t.window_s, now)
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
    """What the request side learnt, for the response side."""

    fetcher: int
    #: fetch offsets of the throttled partitions the request lists (for the lag gauge)
    offsets: dict[Key, int]
    max_wait_s: float
    #: the request belongs to a fetch session (epoch >= 0): its partitions cannot be left out of it (a full
    #: request defines the session, an incremental one lists only changes), so the follower side leaves their
    #: records out of the response instead
    session: bool = False
    left_out: int = 0  # partitions left out of the upstream request (follower side)
    emptied: bool = False  # the follower side left out every partition of the request


@dataclass(slots=True)
class Outcome:
    """What the policy did to one response."""

    left_out: int = 0  # throttled partitions whose records were (all or partly) held back for the leader quota
    follower_left_out: int = 0  # ... for the follower quota (fetch sessions)
    trimmed_bytes: int = 0  # truncated trailing batches dropped from throttled partitions
    #: record bytes of throttled partitions handed to the fetcher: what both quotas record
    sent_bytes: int = 0
    mute_s: float = 0.0
    #: topic ids the response named that Sluice could not name (looked up for the next response)
    unnamed: list[bytes] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.left_out or self.follower_left_out or self.trimmed_bytes)


TopicName = Callable[[bytes], "str | None"]


def plan_request(edit: FetchEdit, fetcher: int, t: Throttles, state: ThrottleState, names: TopicName,
                 now: float) -> Ticket:
    """Request side. Records the fetch offsets of the throttled partitions listed and, on the follower side,
    leaves throttled partitions that are not in sync out of a session-less request while the follower quota is
    exceeded (removed from ``edit.partitions``, ``edit.changed`` set; ``ticket.left_out`` says how many).
    Topics are named (v4-12) or, from v13, ids resolved through ``names``; an unknown id is not throttled."""
    view = edit.view
    ticket = Ticket(fetcher, {}, max(0, view.max_wait_ms) / 1000.0, session=view.session_epoch != -1)
    drop = bool(t.follower_rate) and not ticket.session and state.follower.exceeded(now)
    by_id = view.version >= FIRST_TOPIC_ID
    parts = edit.partitions
    left_out: list[PartitionKey] = []
    last: object = None
    name: str | None = None
    for key, p in parts.items():
        topic, partition = key
        if topic != last:  # partitions come grouped by topic: resolve each topic once
            last = topic
            name = names(topic) if by_id else (topic or None)  # type: ignore[arg-type,assignment]
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
    """The response side, on a decoded Fetch response, in place. Every throttled partition the response
    carries counts, whether the request listed it or not: a fetch session's response carries every partition
    of the session with news, while its incremental request lists only the changed ones (KIP-227), and Kafka
    applies the quota to every partition it returns (ReplicaManager records the size of all throttled
    partitions after responding).

    What passes is what the quota's headroom allows (:meth:`~proxy.core.rate.WindowedRate.headroom`), cut
    at batch boundaries: nothing once the bound is reached (Kafka's shouldLeaderThrottle), the whole response
    while far below it, and in between the batches that fit. A broker's response is bounded by the follower's
    replica.fetch.max.bytes (1 MiB); a consumer's can be 50 MiB, which at a 1 MB/s throttle would arrive as one
    burst every 50 s. Cutting to the headroom keeps every quota window within a few batches of the bound. The
    first throttled batch of a response passes whenever the bound is not yet reached, so a batch larger than the
    headroom still gets through (KIP-74's progress guarantee)."""
    out = Outcome()
    allow, leader = allowance(ticket, t, state, now)  # throttled bytes this response may still carry
    fetcher = ticket.fetcher
    any_records = False
    first_pass = True  # no throttled records kept yet in this response
    whole = view.whole
    for topic in view.topics:
        name = _topic_name(topic.topic or bytes(topic.topic_id), names, out.unnamed)
        for p in topic.partitions:
            size = p.records_size
            if name is None or not t.throttled(name, p.partition_index, fetcher):
                any_records = any_records or size > 0
                continue
            key = (name, p.partition_index)
            records = memoryview(p.records) if size else None  # type: ignore[arg-type]
            if records is not None and id(p) not in whole:
                # The broker's read is a byte slice of the log: a truncated trailing batch is useless to every
                # client (they discard it) and would make the quota count bytes nobody can use. Drop it, as
                # size_limit does; v3+ brokers always send at least one whole batch, so nothing is lost.
                try:
                    complete = complete_size(records)
                    whole.add(id(p))  # size_limit, next on the way to the client, need not walk it again
                except CodecError:  # not Sluice's to judge here: the client reports corrupt records itself
                    complete = size
                if complete < size:
                    records = records[:complete]
                    p.records = records
                    out.trimmed_bytes += size - complete
                    size = complete
            first = _BASE_OFFSET.unpack_from(records)[0] if records is not None and size else None
            _note(state, ticket, key, p.error_code, p.high_watermark, first, now)
            if not size or records is None or first is None:
                continue
            # In sync (KAFKA-4313: not throttled, but counted): the fetcher is at the high watermark. The first
            # batch's base offset tells without the request: a consumer gets records only below the high
            # watermark, and a follower's fetch starts where its log ends, at a batch boundary.
            if first >= p.high_watermark or allow >= size:  # in sync, or every whole batch fits: no walk
                kept = size
            elif allow <= 0:
                kept = 0
            else:
                try:
                    kept = prefix_within(records, int(allow), first_pass)
                except CodecError:
                    kept = size
            if kept < size:
                p.records = records[:kept]
                if leader:
                    out.left_out += 1
                else:
                    out.follower_left_out += 1
            if kept:
                first_pass = False
                any_records = True
                out.sent_bytes += kept
                allow -= kept
    _settle(out, any_records, ticket, state, now)
    return out


def allowance(ticket: Ticket, t: Throttles, state: ThrottleState, now: float) -> tuple[float, bool]:
    """The throttled bytes a response may carry now (the binding quota's headroom), and whether that quota is
    the leader's (else the follower's, for a fetch session's response)."""
    allow = math.inf
    leader = True
    if t.leader_rate:
        allow = state.leader.headroom(now)
    if ticket.session and t.follower_rate:
        follower = state.follower.headroom(now)
        if follower < allow:
            allow, leader = follower, False
    return allow, leader


def account(seen: Iterable[SeenPartition], ticket: Ticket, t: Throttles, state: ThrottleState, names: TopicName,
            now: float) -> Outcome:
    """The response side for a response that streamed through whole (the headroom covered it:
    :meth:`Throttle.stream_fetch`), from its partitions as they passed: what :func:`enforce` records when it
    leaves nothing out. A truncated trailing batch went to the client (it discards it) and is not counted."""
    out = Outcome()
    fetcher = ticket.fetcher
    any_records = False
    last: object = None
    name: str | None = None
    for s in seen:
        if s.topic != last:  # partitions come grouped by topic: each named once
            last = s.topic
            name = _topic_name(s.topic, names, out.unnamed)
        if name is None or not t.throttled(name, s.partition, fetcher):
            any_records = any_records or s.records_size > 0
            continue
        size = s.complete_size
        first = s.first_offset if size else None
        _note(state, ticket, (name, s.partition), s.error_code, s.high_watermark, first, now)
        if first is not None:
            any_records = True
            out.sent_bytes += size
    _settle(out, any_records, ticket, state, now)
    return out


def _topic_name(topic: str | bytes, names: TopicName, unnamed: list[bytes]) -> str | None:
    """A response's topic by name: its own (Fetch before v13), else its id's, if Sluice knows it; an id it does
    not know yet goes to ``unnamed`` (not throttled now; named by the next response)."""
    if isinstance(topic, str) and topic:
        return topic
    tid = topic if isinstance(topic, bytes) else bytes(16)
    name = names(tid)
    if name is None:
        unnamed.append(tid)
    return name


def _note(state: ThrottleState, ticket: Ticket, key: Key, error_code: int, high_watermark: int, first: int | None,
          now: float) -> None:
    """A throttled partition's high watermark (the follower side's in-sync test) and lag (the gauge), from the
    fetch offset its request listed or else its first batch's base offset."""
    if error_code == 0:
        state.high_watermarks[key] = high_watermark
        offset = ticket.offsets.get(key, first)
        if offset is not None:
            state.note_lag(key, ticket.fetcher, max(0, high_watermark - offset), now)


def _settle(out: Outcome, any_records: bool, ticket: Ticket, state: ThrottleState, now: float) -> None:
    """Both quotas record the throttled bytes handed to the fetcher; a response with nothing to hand back paces
    it as Kafka's DelayedFetch would (see the module docstring)."""
    state.leader.record(out.sent_bytes, now)
    state.follower.record(out.sent_bytes, now)
    if not any_records:
        if out.left_out:
            out.mute_s = min(ticket.max_wait_s, state.leader.throttle_time(now))
        elif out.follower_left_out or ticket.emptied:
            out.mute_s = min(ticket.max_wait_s, state.follower.throttle_time(now))


class Throttle(Policy):
    """The KIP-73 policy on the chain."""

    name = "throttle"
    decodes_fetch: ClassVar[bool] = True

    def __init__(self, settings: ThrottleSettings, services: Services, metrics: ThrottleMetrics) -> None:
        # ShareFetch (KIP-932): share consumers a [[throttle.consumers]] selector picks, held on the request side
        # only (share.py)
        self.apis = reads(ApiKey.FETCH, ApiKey.SHARE_FETCH)
        self.metrics = metrics
        self.clock = services.clock
        self.names = services.names
        #: the configuration snapshot (swapped whole by :meth:`reconfigure`) and the quotas every connection
        #: shares
        self.throttles = Throttles.from_settings(settings)
        self._active = self.throttles.active  # asked on every Fetch: computed once per snapshot
        self.state = ThrottleState(self.throttles)
        self.metrics.bind(self.state, self.throttles, self.clock)

    def reconfigure(self, section: ThrottleSettings) -> Callable[[], None]:
        throttles = Throttles.from_settings(section)

        def apply() -> None:
            self.throttles = throttles
            self._active = throttles.active
            self.state.reconfigure(throttles, self.clock())
            self.metrics.bind(self.state, throttles, self.clock)
        return apply

    def status(self) -> dict[str, Any]:
        """The quotas as measured now (bytes/s over the window) and the sum of lag of throttled partitions: what
        the admin API's GET /throttles adds as ``status``."""
        state, now = self.state, self.clock()
        return {"leader_rate": state.leader.rate(now), "follower_rate": state.follower.rate(now),
                "leader_exceeded": state.leader.exceeded(now), "follower_exceeded": state.follower.exceeded(now),
                "sum_lag": state.sum_lag(now)}

    def unread(self, api_key: int, version: int) -> bool:
        return not self._active  # switched off: no client's request is its business

    def applies(self, ex: Exchange) -> bool:
        return self._active

    def needs_topic_names(self, ex: Exchange) -> bool:
        return True  # throttles name topics; Fetch v13+ only carries ids

    def open(self, info: Any) -> share.ShareSession:
        return share.ShareSession()

    def on_request(self, ex: Exchange, conn: Any) -> Any:
        if ex.header.api_key == ApiKey.SHARE_FETCH:
            return self._share_request(ex, conn)
        t = self.throttles
        edit = ex.request
        assert isinstance(edit, FetchEdit)
        fetcher = t.fetcher(ex.client_id, edit.view, ex.principal, ex.client_host)
        if fetcher is None:
            return None
        ticket = plan_request(edit, fetcher, t, self.state, self.names.get, self.clock())
        if ticket.left_out:
            self.metrics.throttle_left_out_follower.inc(ticket.left_out)
        if not ticket.offsets and not ticket.left_out and not ticket.session:
            return None  # a session-less response holds only the partitions listed: none is throttled
        ex.collect = True
        return ticket, t  # the snapshot in force for this request

    def _share_request(self, ex: Exchange, session: share.ShareSession) -> Any:
        """A ShareFetch: follow the share session; if it holds a topic id Sluice cannot name yet, wait for the name
        (a ShareFetch names topics by id only, and its response must be metered whole: it is never trimmed, so
        what is not counted when it passes is never counted); then :meth:`_share_plan`."""
        request = ex.request
        assert isinstance(request, MessageRequest)
        session.update(request.body)
        t = self.throttles
        if t.fetcher(ex.client_id, None, ex.principal, ex.client_host) is None or not t.leader_rate:
            return None
        unknown = self.names.missing({tid for tid, _ in session.partitions})
        if unknown:
            ex.pending = self.names.pending(unknown)
            return t
        return self._share_plan(ex, session, t)

    def on_resume(self, ex: Exchange, conn: Any, state: Any) -> Any:
        return self._share_plan(ex, conn, state)  # only ShareFetch waits (for topic names)

    def _share_plan(self, ex: Exchange, session: share.ShareSession, t: Throttles) -> Any:
        """Lower MaxBytes to the quota's headroom when the session holds a throttled partition; nothing else of
        the request changes (acknowledgements, epochs, partitions)."""
        names = self.names.get
        if not any(t.throttled(names(tid), index, CONSUMER) for tid, index in session.partitions):
            return None
        request = ex.request
        assert isinstance(request, MessageRequest)
        if share.clamp_max_bytes(request.body, self.state.leader.headroom(self.clock())):
            request.changed = True
        ex.collect = True
        return t

    def _share_response(self, ex: Exchange, response: MessageResponse, t: Throttles) -> None:
        """Meter a ShareFetch response, never edit it (share.py); mute the client while the quota is exceeded."""
        body = response.body
        names = self.names.get

        def throttled(tid: bytes, index: int) -> bool | None:
            name = names(tid)
            return None if name is None else t.throttled(name, index, CONSUMER)

        sent, unnamed = share.throttled_bytes(body, throttled)
        now = self.clock()
        self.state.leader.record(sent, now)
        if sent:
            self.metrics.throttle_bytes_leader.inc(sent)
        if unnamed:
            self.names.note(unnamed)
        ex.log["throttle_target_bps"] = t.leader_rate
        ex.log["throttled_bytes"] = sent
        mute = share.mute_for(self.state.leader, body.acquisition_lock_timeout_ms, now)
        if mute > 0:
            ex.mute_s = max(ex.mute_s, mute)

    def on_response(self, ex: Exchange, response: ResponseView, conn: Any, state: Any) -> None:
        if ex.header.api_key == ApiKey.SHARE_FETCH:
            assert isinstance(response, MessageResponse)
            self._share_response(ex, response, state)
            return
        assert isinstance(response, FetchResponse)
        ticket, t = state
        out = enforce(response.view, ticket, t, self.state, self.names.get, self.clock())
        self._report(ex, out, t)
        if out.changed:
            response.changed = True

    def stream_fetch(self, ex: Exchange, size: int, conn: Any, state: Any) -> Streamed | None:
        """A Fetch response streams through when the quota's headroom covers all of it (``size``, its prefix's:
        more than its record bytes), so nothing would be left out; else it is collected for :func:`enforce`.
        Its bytes are recorded when it has passed, as Kafka records a fetch's after responding
        (ReplicaManager): responses of other connections streaming at the same moment each saw the headroom
        before the others were counted, so the quota can be passed by what is in flight at once, as Kafka's
        fetcher threads can pass it; a reservation held from the start instead would outlive a connection closed
        mid-response."""
        ticket, t = state
        if allowance(ticket, t, self.state, self.clock())[0] < size:
            return None
        return Streamed(finish=functools.partial(self._stream_finish, ex, ticket, t))

    def _stream_finish(self, ex: Exchange, ticket: Ticket, t: Throttles, walk: FetchStreamer) -> None:
        self._report(ex, account(walk.seen or (), ticket, t, self.state, self.names.get, self.clock()), t)

    def _report(self, ex: Exchange, out: Outcome, t: Throttles) -> None:
        """What a Fetch response's outcome tells the metrics, the access log and the connection (its mute)."""
        m = self.metrics
        if out.left_out:
            m.throttle_left_out_leader.inc(out.left_out)
        if out.follower_left_out:
            m.throttle_left_out_follower.inc(out.follower_left_out)
        if out.sent_bytes:
            m.throttle_bytes_leader.inc(out.sent_bytes)
            m.throttle_bytes_follower.inc(out.sent_bytes)
        if out.unnamed:
            self.names.note(out.unnamed)
        if t.leader_rate:
            ex.log["throttle_target_bps"] = t.leader_rate
            ex.log["throttled_bytes"] = out.sent_bytes
        if out.mute_s > 0:
            ex.mute_s = max(ex.mute_s, out.mute_s)
