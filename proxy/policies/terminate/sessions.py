"""Incremental fetch sessions (KIP-227), sans-IO: Sluice as the session *server* for its clients and as a
session *client* of the broker.

Nothing here does I/O or reads a clock: callers pass decoded Fetch requests/responses, ``now`` (seconds, any
monotonic origin) and, for session ids, an injected ``random.Random``. Rules are Kafka's, read from
``core/.../kafka/server/FetchSession.scala`` (FetchManager.newContext, CachedPartition.maybeUpdateResponseData,
FetchSessionCacheShard), ``clients/.../requests/FetchMetadata.java`` and ``clients/.../FetchSessionHandler.java``.

Downstream (:class:`SessionServer`), in two steps so the proxy can fetch in between:

1. ``handle_request(request, version, now) -> Decision``: the request's session metadata is checked and the
   session updated (newContext). The decision names the partitions the client wants, with their fetch
   parameters (request order for full/sessionless requests, session order for incremental ones, which is
   the order Kafka reads them in), or a top-level session error to send at once.
2. ``build_view(decision, partition_states) -> FetchResponseView``: the response from Sluice's latest knowledge of
   each partition (:class:`~proxy.wire.fetch_fast.FetchPartition`): every partition for a full or
   sessionless request, only the ones Kafka would include for an incremental one
   (updateAndGenerateResponseData). A full request's session is created here, as Kafka does, because the
   cached high watermark / log start offset are the ones in that response.

Upstream (:class:`SessionClient`): one per upstream connection, like the Java consumer's FetchSessionHandler:
the first request is full, later ones carry only added or altered partitions plus the forgotten ones, and
any session error or invalid response resets to a full request; so does a request whose version names topics
the other way (names up to v12, ids from v13) than the session was created with.

Partition keys: Kafka compares partitions by topic id when the request uses ids (v13+) and by name otherwise
(CachedPartition.equals), and a session never mixes the two (FETCH_SESSION_TOPIC_ID_ERROR). So a key here
is ``(topic, partition)`` where ``topic`` is the name (``str``, v7-12) or the 16-byte topic id (``bytes``,
v13+), exactly as it appears on the wire.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType

from ...wire.fetch_fast import FetchPartition, FetchResponseView, FetchTopic, has_diverging_epoch
from ...wire.fetch_layout import (
    FINAL_EPOCH,
    FIRST_TOPIC_ID,
    INITIAL_EPOCH,
    INT32_MAX,
    INVALID_SESSION_ID,
    PartitionKey,
    TopicKey,
    next_epoch,
    partition_keys,
)
from ...wire.fetch_request_fast import FetchParams, FetchRequestView, check_topic_key

# ------------------------------------------------------------------------------------------- constants

NONE = 0
FETCH_SESSION_ID_NOT_FOUND = 70
INVALID_FETCH_SESSION_EPOCH = 71
FETCH_SESSION_TOPIC_ID_ERROR = 106
SESSION_ERRORS = frozenset({FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH, FETCH_SESSION_TOPIC_ID_ERROR})


#: max.incremental.fetch.session.cache.slots default (KafkaConfig)
DEFAULT_CACHE_SLOTS = 1000
#: FetchSessionCache evictionMs: a session unused this long may be evicted by any newcomer
MIN_EVICTION_AGE_S = 120.0


def is_full(epoch: int) -> bool:
    """FetchMetadata.isFull: epoch 0 (create) or -1 (sessionless) lists every partition."""
    return epoch in (INITIAL_EPOCH, FINAL_EPOCH)


@dataclass(frozen=True, slots=True)
class FetchMetadata:
    """The (session id, epoch) pair a Fetch request carries; the transitions of FetchMetadata.java."""

    session_id: int = INVALID_SESSION_ID
    epoch: int = INITIAL_EPOCH

    @property
    def is_full(self) -> bool:
        return is_full(self.epoch)

    def next_close_existing(self) -> FetchMetadata:
        """Close this session and go sessionless for one request (FINAL_EPOCH, current Java client)."""
        return FetchMetadata(self.session_id, FINAL_EPOCH)

    def next_close_existing_attempt_new(self) -> FetchMetadata:
        """Close this session and create a new one in the same full request (INITIAL_EPOCH)."""
        return FetchMetadata(self.session_id, INITIAL_EPOCH)

    def next_incremental(self) -> FetchMetadata:
        return FetchMetadata(self.session_id, next_epoch(self.epoch))

    @staticmethod
    def new_incremental(session_id: int) -> FetchMetadata:
        return FetchMetadata(session_id, next_epoch(INITIAL_EPOCH))


INITIAL = FetchMetadata(INVALID_SESSION_ID, INITIAL_EPOCH)  # FetchMetadata.INITIAL
LEGACY = FetchMetadata(INVALID_SESSION_ID, FINAL_EPOCH)  # FetchMetadata.LEGACY: sessionless


# ------------------------------------------------------------------------------------------- server side


@dataclass(slots=True)
class CachedPartition:
    """One partition of a downstream session (FetchSession.scala CachedPartition): the client's last fetch
    parameters and what Sluice last told the client, which decides inclusion in incremental responses."""

    params: FetchParams
    high_watermark: int = -1  # last HW sent; -1 after an error so the partition is sent again later
    log_start_offset: int = -1  # last log start offset sent (Kafka's localLogStartOffset)
    last_stable_offset: int = -1  # last LSO sent: kept for observability only, it never triggers inclusion


@dataclass(slots=True, eq=False)
class Session:
    """A downstream fetch session (FetchSession.scala FetchSession). ``epoch`` is the epoch the client's next
    incremental request must carry. ``partitions`` is ordered: the session order Kafka reads partitions in;
    one that returned records moves to the end (fairness under max_bytes)."""

    id: int
    privileged: bool
    uses_topic_ids: bool
    created: float
    last_used: float
    epoch: int
    partitions: dict[PartitionKey, CachedPartition] = field(default_factory=dict)
    # Set by SessionCache.touch, like FetchSessionCacheShard's cachedSize and evictable maps: size and
    # evictability are those of the last touch, not of "now".
    cached_size: int = -1
    evictable_by_all: bool = False
    evictable_by_privileged: bool = False
    #: whoever last built this session's response from its own partition states (terminate.UpstreamSessions):
    #: while it stays the same, the session's cache agrees with those states except where new data arrived
    sync_token: object | None = None

    def evictable_key(self) -> tuple[bool, int, int]:
        """EvictableKey: (privileged, size, id), least valuable first."""
        return (self.privileged, self.cached_size, self.id)


@dataclass(slots=True)
class SessionStats:
    """Counters for metrics (Kafka: NumIncrementalFetchSessions, NumIncrementalFetchPartitionsCached,
    IncrementalFetchSessionEvictionsPerSec; plus session errors by code and sessions refused)."""

    sessions_created: int = 0
    sessions_closed: int = 0  # by a full request naming them, or left empty by an incremental one
    evictions: int = 0
    refused: int = 0  # full requests answered with session_id 0 because the cache would not take them
    errors: dict[int, int] = field(default_factory=lambda: {c: 0 for c in sorted(SESSION_ERRORS)})

    @property
    def epoch_errors(self) -> int:
        return self.errors[INVALID_FETCH_SESSION_EPOCH]


class SessionCache:
    """Sessions by id with a slot limit and Kafka's eviction (FetchSessionCacheShard.tryEvict).

    A newcomer may evict one session: the least recently used one if it has been idle longer than
    ``eviction_age_s``; otherwise the least valuable by (privileged, size, id) among the evictable ones, if
    the newcomer's (privileged, size, 0) is not smaller. A session is evictable by anyone only once it is
    older than ``eviction_age_s`` (at its last touch); by a privileged (follower) newcomer also while young
    unless it is privileged itself. Kafka splits the slots into 8 shards and evicts within one shard; Sluice
    keeps one shard (a single-threaded event loop needs no lock striping), which never evicts more eagerly.
    """

    def __init__(self, slots: int = DEFAULT_CACHE_SLOTS, eviction_age_s: float = MIN_EVICTION_AGE_S,
                 rng: random.Random | None = None) -> None:
        self.slots = slots
        self.eviction_age_s = eviction_age_s
        self.rng = rng if rng is not None else random.Random()
        self.sessions: dict[int, Session] = {}
        self.stats = SessionStats()
        self._partitions = 0

    def __len__(self) -> int:
        return len(self.sessions)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self.sessions

    def get(self, session_id: int) -> Session | None:
        return self.sessions.get(session_id)

    @property
    def partitions_cached(self) -> int:
        """Sum of the sessions' sizes at their last touch (NumIncrementalFetchPartitionsCached)."""
        return self._partitions

    def new_session_id(self) -> int:
        """A random positive id not in use (newSessionId); 0 is INVALID_SESSION_ID and never handed out."""
        while True:
            sid = self.rng.randrange(1, INT32_MAX)
            if sid not in self.sessions:
                return sid

    def maybe_create(self, now: float, privileged: bool, uses_topic_ids: bool,
                     partitions: dict[PartitionKey, CachedPartition]) -> Session | None:
        """maybeCreateSession: a new session (epoch 1) if there is a free slot or one can be evicted."""
        if len(self.sessions) >= self.slots and not self._try_evict(privileged, len(partitions), now):
            self.stats.refused += 1
            return None
        session = Session(self.new_session_id(), privileged, uses_topic_ids, now, now,
                          next_epoch(INITIAL_EPOCH), partitions)
        self.sessions[session.id] = session
        self.touch(session, now)
        self.stats.sessions_created += 1
        return session

    def _try_evict(self, privileged: bool, size: int, now: float) -> bool:
        if not self.sessions:
            return False
        # 1. a stale session: the least recently used, if idle longer than the eviction age (LastUsedKey order)
        lru = min(self.sessions.values(), key=lambda s: (s.last_used, s.id))
        if now - lru.last_used > self.eviction_age_s:
            self._evict(lru)
            return True
        # 2. the least valuable evictable session, if the newcomer is worth at least as much
        pool = [s for s in self.sessions.values()
                if (s.evictable_by_privileged if privileged else s.evictable_by_all)]
        if not pool:
            return False
        victim = min(pool, key=Session.evictable_key)
        if (privileged, size, 0) < victim.evictable_key():
            return False
        self._evict(victim)
        return True

    def _evict(self, session: Session) -> None:
        self.remove(session.id)
        self.stats.evictions += 1

    def remove(self, session_id: int) -> Session | None:
        session = self.sessions.pop(session_id, None)
        if session is not None and session.cached_size >= 0:
            self._partitions -= session.cached_size
        return session

    def touch(self, session: Session, now: float) -> None:
        """FetchSessionCacheShard.touch: record use, refresh the cached size and evictability."""
        session.last_used = now
        if session.cached_size >= 0:
            self._partitions -= session.cached_size
        session.cached_size = len(session.partitions)
        self._partitions += session.cached_size
        old = now - session.created > self.eviction_age_s
        session.evictable_by_privileged = (not session.privileged) or old
        session.evictable_by_all = old


class Kind(Enum):
    ERROR = "error"  # a top-level session error: answer at once, no partitions, session_id 0
    SESSIONLESS = "sessionless"  # epoch -1, or an incremental request that left its session empty
    FULL = "full"  # epoch 0: every partition; a session is created when the response is built
    INCREMENTAL = "incremental"  # a valid incremental request on an existing session


@dataclass(slots=True)
class Decision:
    """The outcome of :meth:`SessionServer.handle_request`.

    ``partitions`` is what to read and in which order: the request's partitions (full/sessionless) or all the
    session's partitions with their cached parameters (incremental, Kafka's IncrementalFetchContext
    .foreachPartition). Empty for errors.
    """

    kind: Kind
    version: int
    partitions: Mapping[PartitionKey, FetchParams]
    error_code: int = NONE
    session: Session | None = None  # INCREMENTAL: the session the response updates
    epoch: int = FINAL_EPOCH  # INCREMENTAL: the session's epoch after this request (duplicate check)
    privileged: bool = False
    now: float = 0.0
    #: INCREMENTAL: what the request itself added or changed, and forgot (the delta from the last request)
    sent: dict[PartitionKey, FetchParams] = field(default_factory=dict)
    forgotten: list[PartitionKey] = field(default_factory=list)

    @property
    def is_error(self) -> bool:
        return self.kind is Kind.ERROR


class SessionParams(Mapping[PartitionKey, FetchParams]):
    """A session's partitions with their fetch parameters, in session order: a live read-only view (an
    incremental decision must not copy a 10,000-partition session for every request)."""

    __slots__ = ("_partitions",)

    def __init__(self, partitions: dict[PartitionKey, CachedPartition]) -> None:
        self._partitions = partitions

    def __getitem__(self, key: PartitionKey) -> FetchParams:
        return self._partitions[key].params

    def __iter__(self) -> Iterator[PartitionKey]:
        return iter(self._partitions)

    def __len__(self) -> int:
        return len(self._partitions)

    def __contains__(self, key: object) -> bool:
        return key in self._partitions


def must_respond(cached: CachedPartition, data: FetchPartition, update: bool = True) -> bool:
    """CachedPartition.maybeUpdateResponseData: include ``data`` in an incremental response iff it has
    records, a high watermark or log start offset other than the one last sent, a preferred read replica,
    an error (the cached HW then becomes -1 so the partition is sent again once the error is gone) or a
    diverging epoch. A change of last stable offset alone does not count (Kafka does not compare it)."""
    respond = data.records_size > 0
    if cached.high_watermark != data.high_watermark:
        respond = True
        if update:
            cached.high_watermark = data.high_watermark
    if cached.log_start_offset != data.log_start_offset:
        respond = True
        if update:
            cached.log_start_offset = data.log_start_offset
    if data.preferred_read_replica != -1:  # FetchResponse.isPreferredReplica
        respond = True
    if data.error_code != NONE:
        respond = True
        if update:
            cached.high_watermark = -1
    if has_diverging_epoch(data):  # sent so that the follower/consumer truncates
        respond = True
    if respond and update:
        cached.last_stable_offset = data.last_stable_offset
    return respond


@dataclass(slots=True)
class Built:
    """A response :meth:`SessionServer.respond` built."""

    view: FetchResponseView
    #: the cached session the response is in (None: none, or no longer cached, e.g. evicted meanwhile)
    session: Session | None
    #: the server's counters after building it (cumulative: the caller moves its metrics by what changed)
    stats: SessionStats


class SessionServer:
    """Kafka's FetchManager for Sluice's clients: decides what a Fetch request means for its session and
    builds the response from Sluice's own per-partition state."""

    def __init__(self, cache: SessionCache | None = None) -> None:
        self.cache = cache if cache is not None else SessionCache()

    @property
    def stats(self) -> SessionStats:
        return self.cache.stats

    def handle_request(self, request: FetchRequestView, version: int, now: float) -> Decision:
        """FetchManager.newContext for a decoded FetchRequest of ``version``."""
        # v<7 has neither SessionId nor SessionEpoch: the view reads them as no session, session-less
        session_id, epoch = request.session_id, request.session_epoch
        # Follower sessions are privileged in the cache
        privileged = request.from_follower
        if is_full(epoch):
            # "Any session specified in a FULL fetch request will be closed."
            if session_id != INVALID_SESSION_ID and self.cache.remove(session_id) is not None:
                self.stats.sessions_closed += 1
            kind = Kind.SESSIONLESS if epoch == FINAL_EPOCH else Kind.FULL
            return Decision(kind, version, request.partitions(), privileged=privileged, now=now)
        session = self.cache.get(session_id)
        if session is None:
            return self._error(FETCH_SESSION_ID_NOT_FOUND, version)
        if session.epoch != epoch:
            return self._error(INVALID_FETCH_SESSION_EPOCH, version)
        if session.uses_topic_ids != (version >= FIRST_TOPIC_ID):
            # a session created with names (v<13) cannot continue with ids, nor the reverse
            return self._error(FETCH_SESSION_TOPIC_ID_ERROR, version)
        # FetchSession.update: sent partitions are added (at the end) or have their parameters updated in
        # place; forgotten ones are removed.
        sent = request.partitions()
        for key, params in sent.items():
            cached = session.partitions.get(key)
            if cached is None:
                session.partitions[key] = CachedPartition(params)
            else:
                cached.params = params
        forgotten = request.forgotten()
        for key in forgotten:
            session.partitions.pop(key, None)
        if not session.partitions:
            # the session is closed and the request answered as a sessionless one (with what it sent: nothing)
            self.cache.remove(session.id)
            self.stats.sessions_closed += 1
            return Decision(Kind.SESSIONLESS, version, sent, privileged=privileged, now=now)
        self.cache.touch(session, now)
        session.epoch = next_epoch(session.epoch)
        return Decision(Kind.INCREMENTAL, version, SessionParams(session.partitions), session=session,
                        epoch=session.epoch, privileged=privileged, now=now, sent=sent, forgotten=forgotten)

    def _error(self, code: int, version: int) -> Decision:
        self.stats.errors[code] += 1
        return Decision(Kind.ERROR, version, {}, error_code=code)

    def respond(self, decision: Decision, partition_states: Mapping[PartitionKey, FetchPartition],
                throttle_time_ms: int = 0, only: Iterable[PartitionKey] | None = None) -> Built:
        """:meth:`build_view`, with what a caller needs after it in the same call: the session the response is
        in, as the cache holds it now, and the counters (one step into the server per response)."""
        view = self.build_view(decision, partition_states, throttle_time_ms, only=only)
        return Built(view, self.cache.get(view.session_id) if view.session_id else None, self.stats)

    def build_view(self, decision: Decision, partition_states: Mapping[PartitionKey, FetchPartition],
                   throttle_time_ms: int = 0, now: float | None = None,
                   only: Iterable[PartitionKey] | None = None) -> FetchResponseView:
        """The response as a :class:`FetchResponseView` (the proxy's fast encoder; records are not copied).

        ``partition_states`` holds Sluice's latest data for each partition of ``decision.partitions``. Full
        and sessionless responses need every one of them (a Java client rejects a full response that omits a
        session partition); for an incremental response a missing partition is "no news" and left out.
        ``now`` (default: the request's) is when a full request's new session is created, as Kafka creates it
        when the response is generated.

        ``only`` (incremental): check just these partitions, because the caller knows no other partition of the
        session has news (its cache already agrees with their states); O(changed) instead of O(session).
        """
        version = decision.version
        if decision.kind is Kind.ERROR:
            # SessionErrorContext: the error, session_id 0, no partitions
            return FetchResponseView(version, throttle_time_ms, decision.error_code, INVALID_SESSION_ID)
        if decision.kind is Kind.INCREMENTAL:
            return self._incremental(decision, partition_states, throttle_time_ms, only)
        missing = [k for k in decision.partitions if k not in partition_states]
        if missing:
            raise KeyError(f"no partition state for {missing[:5]} ({len(missing)} missing) in a full response")
        keys = list(decision.partitions)
        session_id = INVALID_SESSION_ID
        if decision.kind is Kind.FULL:
            # FullFetchContext.updateAndGenerateResponseData: the session caches the response's HW and log
            # start. An error partition is cached with HW -1: Kafka's own error partitions carry HW -1, and
            # this makes sure it is sent again once the error clears.
            cached = {}
            for key in keys:
                data = partition_states[key]
                cp = CachedPartition(decision.partitions[key], data.high_watermark, data.log_start_offset,
                                     data.last_stable_offset)
                if data.error_code != NONE:
                    cp.high_watermark = -1
                cached[key] = cp
            session = self.cache.maybe_create(decision.now if now is None else now, decision.privileged,
                                              version >= FIRST_TOPIC_ID, cached)
            if session is not None:
                session_id = session.id
        return _view(version, throttle_time_ms, NONE, session_id, keys, partition_states)

    def _incremental(self, decision: Decision, partition_states: Mapping[PartitionKey, FetchPartition],
                     throttle_time_ms: int, only: Iterable[PartitionKey] | None = None) -> FetchResponseView:
        session = decision.session
        assert session is not None
        if session.epoch != decision.epoch:
            # IncrementalFetchContext: the session moved on between request and response (a duplicate or
            # pipelined request); Kafka answers INVALID_FETCH_SESSION_EPOCH with the session's id.
            self.stats.errors[INVALID_FETCH_SESSION_EPOCH] += 1
            return FetchResponseView(decision.version, throttle_time_ms, INVALID_FETCH_SESSION_EPOCH, session.id)
        included: list[PartitionKey] = []
        rotate: list[PartitionKey] = []
        candidates = list(session.partitions.items()) if only is None else \
            [(key, session.partitions[key]) for key in only if key in session.partitions]
        for key, cached in candidates:
            data = partition_states.get(key)
            if data is None or not must_respond(cached, data):
                continue
            included.append(key)
            if data.records_size > 0:
                rotate.append(key)
        for key in rotate:  # partitions that returned records go to the end of the session (fairness)
            session.partitions[key] = session.partitions.pop(key)
        return _view(decision.version, throttle_time_ms, NONE, session.id, included, partition_states)


def _view(version: int, throttle_time_ms: int, error_code: int, session_id: int, keys: Iterable[PartitionKey],
          states: Mapping[PartitionKey, FetchPartition]) -> FetchResponseView:
    """A response with ``keys`` in order, consecutive partitions of one topic under one topic entry (as
    Kafka's FetchResponse.toMessage groups them).

    The view holds the ``states`` objects themselves, not copies (copying is most of the cost of a
    10,000-partition response): policies that edit a built response only shorten ``records``, which the
    stored states (records-free) and the upstream response's partitions (discarded after) can take."""
    by_id = version >= FIRST_TOPIC_ID
    topics: list[FetchTopic] = []
    parts: list[FetchPartition] = []
    last: TopicKey | None = None
    for key in keys:
        topic = key[0]
        if topic != last or not topics:
            topics.append(_response_topic(topic, by_id))
            parts = topics[-1].partitions
            last = topic
        d = states[key]
        if d.partition_index != key[1]:  # a state filed under another index: the key is what the client asked
            d = FetchPartition(key[1], d.error_code, d.high_watermark, d.last_stable_offset, d.log_start_offset,
                               d.aborted_transactions, d.preferred_read_replica, d.records, d.tags)
        parts.append(d)
    return FetchResponseView(version, throttle_time_ms, error_code, session_id, topics)


def _response_topic(topic: TopicKey, by_id: bool) -> FetchTopic:
    check_topic_key(topic, by_id)
    if isinstance(topic, bytes):
        return FetchTopic(topic_id=topic)
    return FetchTopic(topic=topic)


# ------------------------------------------------------------------------------------------- client side


@dataclass(frozen=True, slots=True)
class UpstreamPlan:
    """The session part of the next upstream Fetch request (FetchSessionHandler.FetchRequestData)."""

    metadata: FetchMetadata
    to_send: dict[PartitionKey, FetchParams]  # full: every partition; incremental: added and altered ones
    to_forget: list[PartitionKey]  # incremental only: partitions no longer wanted
    #: everything the session covers after this request (the client's own map, read-only: not a copy)
    session_partitions: Mapping[PartitionKey, FetchParams]

    @property
    def is_full(self) -> bool:
        return self.metadata.is_full


@dataclass(frozen=True, slots=True)
class ResponseCheck:
    """What :meth:`SessionClient.check_response` found: whether the response's partitions may be used, and
    whether the session was open (an id and an incremental next request) before and after it."""

    usable: bool
    was_open: bool
    is_open: bool


#: every ResponseCheck there is: a check allocates nothing
_CHECKS = {(u, w, i): ResponseCheck(u, w, i) for u in (False, True) for w in (False, True) for i in (False, True)}


@dataclass(slots=True)
class ClientStats:
    full_requests: int = 0
    incremental_requests: int = 0
    #: session errors, invalid responses, connection errors and changes of topic addressing (names / ids)
    #: that forced a full request
    resets: int = 0
    partitions_sent: int = 0  # partitions listed in requests (the incremental saving is visible here)


class SessionClient:
    """The Java client's FetchSessionHandler for one upstream connection: Sluice's own session with the
    broker. ``build`` before each request, ``handle_response`` / ``handle_error`` after it.

    A session is created either with topic names (v7-12) or with topic ids (v13+) and keeps that addressing
    (:attr:`uses_topic_ids`, FetchSessionHandler's ``canUseTopicIds`` / ``sessionTopicNames``): the broker
    answers an incremental request in the other addressing with FETCH_SESSION_TOPIC_ID_ERROR
    (FetchSession.scala, FetchManager.newContext), and its keys could not even be written (a name in a v13
    request's ForgottenTopicsData). So when the version's addressing changes, ``build`` closes the session and
    creates a new one in the same full request, in the new addressing."""

    def __init__(self) -> None:
        self.next_metadata = INITIAL
        self.session_partitions: dict[PartitionKey, FetchParams] = {}
        #: the addressing of ``session_partitions``: topic ids (v13+) or names; None before the first request
        self.uses_topic_ids: bool | None = None
        self.stats = ClientStats()

    @property
    def session_open(self) -> bool:
        """An established session: the next request is incremental and names it."""
        meta = self.next_metadata
        return meta.session_id != INVALID_SESSION_ID and not meta.is_full

    def switches_addressing(self, uses_topic_ids: bool) -> bool:
        """Whether a request with this addressing cannot continue the session (:meth:`build` restarts it)."""
        return self.uses_topic_ids is not None and self.uses_topic_ids != uses_topic_ids

    def build(self, wanted: Mapping[PartitionKey, FetchParams], uses_topic_ids: bool | None = None) -> UpstreamPlan:
        """FetchSessionHandler.Builder.build for the partitions Sluice wants next (in priority order), for a
        request that names topics by id (v13+, ``uses_topic_ids``) or by name; None: as ``wanted``'s keys do
        (the session's addressing when there are none)."""
        if uses_topic_ids is None:
            uses_topic_ids = _keys_use_topic_ids(wanted, self.uses_topic_ids)
        if self.switches_addressing(uses_topic_ids):
            # The Java FetchSessionHandler sends the incremental request anyway ("If we switched from using
            # topic IDs to not using them (or vice versa), that error will also be handled in the receiving
            # broker"), gets FETCH_SESSION_TOPIC_ID_ERROR and then closes the session and opens a new one
            # (handleResponse: nextCloseExistingAttemptNew). Sluice's keys are the wire's (names or ids), so
            # that request cannot be written; it does the close-and-create at once: a full request naming
            # the session closes it (FetchManager.newContext: "Any session specified in a FULL fetch request
            # will be closed") and creates one in the request's addressing.
            if not self.next_metadata.is_full:
                self._reset(None)
        meta = self.next_metadata
        if meta.is_full:
            self.uses_topic_ids = uses_topic_ids
            self.session_partitions = dict(wanted)
            self.stats.full_requests += 1
            self.stats.partitions_sent += len(wanted)
            return UpstreamPlan(meta, dict(wanted), [], MappingProxyType(self.session_partitions))
        to_send: dict[PartitionKey, FetchParams] = {}
        altered: dict[PartitionKey, FetchParams] = {}
        removed: list[PartitionKey] = []
        for key in list(self.session_partitions):
            params = wanted.get(key)
            if params is None:
                del self.session_partitions[key]
                removed.append(key)
            elif params != self.session_partitions[key]:
                self.session_partitions[key] = params
                altered[key] = params
        for key, params in wanted.items():
            if key not in self.session_partitions:  # added: appended to the session
                self.session_partitions[key] = params
                to_send[key] = params
        to_send.update(altered)  # Java sends added partitions first, then the altered ones
        self.stats.incremental_requests += 1
        self.stats.partitions_sent += len(to_send)
        return UpstreamPlan(meta, to_send, removed, MappingProxyType(self.session_partitions))

    def build_delta(self, changed: Mapping[PartitionKey, FetchParams],
                    forgotten: Iterable[PartitionKey]) -> UpstreamPlan:
        """:meth:`build` for a wanted set known to differ from the session's partitions only by ``changed``
        (added or re-sent partitions) and ``forgotten``: the same plan in O(changed) instead of O(session).
        Falls back to nothing: the caller must know the session mirrors the wanted set and is incremental (so
        has the addressing of the request: the client session it mirrors never changes addressing)."""
        meta = self.next_metadata
        assert not meta.is_full, "build_delta needs an established session"
        to_send: dict[PartitionKey, FetchParams] = {}
        altered: dict[PartitionKey, FetchParams] = {}
        for key, params in changed.items():
            old = self.session_partitions.get(key)
            if old is None:
                self.session_partitions[key] = to_send[key] = params
            elif old != params:
                self.session_partitions[key] = altered[key] = params
        # forgotten after sent, as the server applies them (FetchSession.update)
        removed: list[PartitionKey] = []
        for key in forgotten:
            if self.session_partitions.pop(key, None) is None:
                continue
            if to_send.pop(key, None) is None:  # added and forgotten in one request: never sent at all
                altered.pop(key, None)
                removed.append(key)
        to_send.update(altered)
        self.stats.incremental_requests += 1
        self.stats.partitions_sent += len(to_send)
        return UpstreamPlan(meta, to_send, removed, MappingProxyType(self.session_partitions))

    def handle_response(self, response: FetchResponseView, version: int) -> bool:
        """FetchSessionHandler.handleResponse: advance or reset the session; False if the response's
        partitions must not be used (session error, or partitions that do not match the session)."""
        # a v4-6 response has neither field: no error, no session (the broker predates KIP-227)
        error = response.error_code
        session_id = response.session_id
        if error != NONE:
            # 70: the broker has no such session -> start over. 71/106/other: close it and create a new one
            # in the same full request (Java now closes with FINAL_EPOCH first, one sessionless round trip
            # more; a full request naming a session closes it either way, so one request does both).
            self._reset(INITIAL if error == FETCH_SESSION_ID_NOT_FOUND else None)
            return False
        keys = set(partition_keys(response.topics))
        if self.next_metadata.is_full:
            if not keys and response.throttle_time_ms > 0:
                return False  # KIP-219: an empty throttled full response; try the same full request again
            if keys != set(self.session_partitions):
                self._reset(None)  # "invalid full fetch response"
                return False
            self.next_metadata = (INITIAL if session_id == INVALID_SESSION_ID
                                  else FetchMetadata.new_incremental(session_id))
            return True
        if not all(k in self.session_partitions for k in keys):
            self._reset(None)  # "invalid incremental fetch response": partitions outside the session
            return False
        if session_id == INVALID_SESSION_ID:
            self.next_metadata = INITIAL  # the broker closed the session
        else:
            self.next_metadata = self.next_metadata.next_incremental()
        return True

    def check_response(self, response: FetchResponseView, version: int, full: bool) -> ResponseCheck:
        """:meth:`handle_response` for the answer to a request :meth:`build` made (``full``: a full one), with
        the session's open state before and after (one step into the client per response)."""
        was_open = self.session_open
        usable = self.handle_response(response, version)
        if not usable and full and self.next_metadata.session_id != INVALID_SESSION_ID:
            # a full request naming the old session failed too (an error other than 70, e.g. -1): naming it
            # again could fail forever, so start a fresh session instead (still a full request)
            self.next_metadata = INITIAL
        return _CHECKS[usable, was_open, self.session_open]

    def handle_error(self) -> None:
        """A request failed (connection lost, broker restarted): close and re-create on the next request
        (FetchSessionHandler.handleError -> nextCloseExistingAttemptNew)."""
        self._reset(None)

    def _reset(self, meta: FetchMetadata | None) -> None:
        self.next_metadata = meta if meta is not None else self.next_metadata.next_close_existing_attempt_new()
        self.stats.resets += 1


def _keys_use_topic_ids(wanted: Mapping[PartitionKey, FetchParams], default: bool | None) -> bool:
    """The addressing ``wanted``'s keys are in (ids are bytes, names str); ``default`` (else names) if empty."""
    for topic, _ in wanted:
        return isinstance(topic, bytes)
    return bool(default)
