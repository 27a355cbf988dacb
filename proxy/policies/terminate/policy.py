"""``[sessions] mode = "terminate"``, sans-IO: Sluice owns the KIP-227 fetch sessions on both sides of a client
connection, so the upstream link carries only changed partitions whatever the client does.

Upstream, per client connection (which has exactly one upstream connection), an :class:`UpstreamSessions`: a
:class:`~proxy.policies.terminate.sessions.SessionClient` (the Java consumer's FetchSessionHandler) and the latest
:class:`~proxy.wire.fetch_fast.FetchPartition` of every partition of the session (an incremental response
omits partitions with no news, so the last known state is kept).

Downstream, two kinds of client:

- session-less clients (librdkafka / confluent-kafka, aiokafka: every Fetch has session_epoch -1 and lists every
  partition): :func:`plan_request` takes the request's partitions as the session's wanted set, and the client
  gets a full response for every partition it asked for;
- clients with their own sessions (the Java consumer, kafka-python): :func:`plan_session_request` hands the
  request to Sluice's :class:`~.sessions.SessionServer` (one cache per proxy, Kafka's FetchManager
  rules), whose decision names every partition of the client's session with its fetch parameters; that is the
  wanted set. The client's session and Sluice's upstream session are independent (their own ids and epochs):
  the client gets exactly the partitions Kafka would include in its incremental response, built from Sluice's
  partition state, and session errors (70/71/106) are Sluice's own, answered at once without going upstream.

For both, the request side is the same: ``SessionClient.build`` gives the upstream plan (full the first time,
then only added and altered partitions plus forgotten ones) and ``encode_fetch_request`` (the request fast path,
proxy/wire/fetch_request_fast.py) writes it over the client's request, as the earlier request-side policies
left it. A consumer
advances its fetch offset after every response that carried records, so partitions with traffic are sent
upstream again; idle partitions are not, which is where the savings come from. On the response side
(:func:`build_client_response`) ``SessionClient.handle_response`` checks the upstream response (session errors
70/71/106, or partitions that do not match the session, reset it to a full request), the state store is
updated, and the client's response is built from the upstream entries (their records are for the client's
fetch offsets, since the session's fetch parameters are exactly the client's) and the stored state.

When the upstream response cannot be used (a session error, an invalid response, a throttled empty full
response), the same client request goes upstream again at once as a full session request (:func:`replan`,
once), and the client never sees the error. The server does this only when no other request of the connection
is in flight behind it (responses must stay in order); otherwise, or if the second attempt fails too, the
client gets a retriable answer (:func:`retriable_answer`, built only then: building an answer moves the
client session's cache, so one that is not sent must not be built): what Sluice knows without records, or, when a full
response cannot list every partition, an empty full response with a throttle time — KIP-219's "try again"
signal, which the Java FetchSessionHandler accepts without an error and answers with the same full request.

One upstream session per connection means one session fetch in flight: a session-less Fetch pipelined behind
a session fetch is relayed untouched (a request with session id 0 and epoch -1 does not disturb the session),
and a session-using client's pipelined Fetch goes upstream session-less, listing its whole session (the
clients named above never pipeline fetches to one broker, so this is the rare path).

Followers' fetches (FetchRequestView.from_follower) are relayed untouched: Sluice terminates consumer sessions only.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

from ...core.exchange import ConnectionInfo, Exchange
from ...core.policy import Policy, Services, reads
from ...wire.api_keys import ApiKey
from ...wire.fetch_fast import (
    Buffer,
    EncodedTopics,
    FetchPartition,
    FetchResponseView,
    encode_partition,
    topic_head,
    topic_tail,
)
from ...wire.fetch_layout import FIRST_SESSION, FIRST_TOPIC_ID, PartitionKey, TopicKey, partition_keys, topic_key
from ...wire.fetch_request_fast import (
    Baseline,
    FetchEdit,
    FetchParams,
    FetchRequestView,
    encode_fetch_request,
)
from ...wire.views import FetchResponse, ResponseView
from .metrics import SESSION_ERROR_NAMES, SessionMetrics
from .sessions import (
    FINAL_EPOCH,
    INVALID_SESSION_ID,
    LEGACY,
    NONE,
    Decision,
    Kind,
    ResponseCheck,
    Session,
    SessionCache,
    SessionClient,
    SessionServer,
    SessionStats,
    UpstreamPlan,
)
from .settings import SessionsSettings

TERMINATE, PASSTHROUGH = "terminate", "passthrough"

#: builds session-less responses from partition states (Kind.SESSIONLESS never touches the cache)
_BUILDER = SessionServer()


@dataclass(frozen=True, slots=True)
class SessionModes:
    """``[sessions]`` mode per client: the first ``(client_id glob, mode)`` rule that matches, else ``default``."""

    default: str = PASSTHROUGH
    rules: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_settings(cls, settings: SessionsSettings) -> SessionModes:
        return cls(settings.mode, tuple((c.client_id, c.mode) for c in settings.clients))

    @property
    def active(self) -> bool:
        return self.default == TERMINATE or any(mode == TERMINATE for _, mode in self.rules)

    def terminates(self, client_id: str | None) -> bool:
        for glob, mode in self.rules:
            if fnmatch.fnmatchcase(client_id or "", glob):
                return mode == TERMINATE
        return self.default == TERMINATE


@dataclass(slots=True)
class UpstreamSessions:
    """One client connection's upstream session and the last known state of each of its partitions."""

    client: SessionClient = field(default_factory=SessionClient)
    #: latest partition data (records dropped) per key, from every upstream response
    states: dict[PartitionKey, FetchPartition] = field(default_factory=dict)
    #: a session fetch is in flight (its response must be handled before the next one is built)
    busy: bool = False
    #: O(changed) bookkeeping for a client with its own session (see :func:`_upstream`,
    #: :func:`build_client_response`): the client session whose partitions the upstream session mirrors, and
    #: the one whose cache agrees with ``states`` (0: none); ``token`` marks the sessions this one built
    mirrors: int = 0
    synced: int = 0
    token: object = field(default_factory=object)
    #: O(changed) bookkeeping for a session-less client (see :func:`sessionless_delta`, :class:`FullResponse`):
    #: the request its later ones are read against, the partitions it wants now (the baseline's, in its order,
    #: with the params its last request gave), those whose params differ from the baseline's, the wanted map
    #: the upstream session's partitions equal, and its last full response, kept encoded partition by partition
    baseline: Baseline | None = None
    wanted: dict[PartitionKey, FetchParams] = field(default_factory=dict)
    diverged: set[PartitionKey] = field(default_factory=set)
    mirrors_wanted: object | None = None
    full: FullResponse | None = None

    @property
    def session_open(self) -> bool:
        return self.client.session_open


@dataclass(slots=True)
class SessionTicket:
    """What the response side needs: the client's partitions (its order) and what was sent upstream."""

    sessions: UpstreamSessions
    version: int
    wanted: Mapping[PartitionKey, FetchParams]
    full: bool
    #: the client's request (after other policies), to send again if the session is refused
    request: FetchRequestView
    #: how many times this client request went upstream
    attempts: int = 1
    #: the client's own session (FULL or INCREMENTAL decision of ``server``); None: a session-less response
    decision: Decision | None = None
    server: SessionServer = _BUILDER
    #: False: sent upstream session-less (the connection's session fetch was busy), not in Sluice's session
    in_session: bool = True
    #: the upstream session's partitions are now exactly ``wanted`` (built from the client session's)
    mirrored: bool = False
    #: a session-less client's request that differed from its previous one only in these partitions
    changed: Mapping[PartitionKey, FetchParams] | None = None


@dataclass(slots=True)
class SessionPlan:
    """What to do with a session-using client's Fetch (:func:`plan_session_request`)."""

    kind: Kind
    #: a session error of Sluice's own: the response to send at once
    answer: FetchResponseView | None = None
    #: the request frame to send upstream instead of the client's, and its ticket (no ticket: nothing to
    #: build, relay the upstream answer; no frame and no answer: relay the client's request untouched)
    frame: bytes | None = None
    ticket: SessionTicket | None = None


def uses_session(request: FetchRequestView) -> bool:
    """The client runs its own fetch session (or closes one): v7+ and not (session 0, epoch -1)."""
    return request.session_epoch != FINAL_EPOCH or request.session_id != INVALID_SESSION_ID


def eligible(request: FetchRequestView) -> bool:
    """A consumer's session-less Fetch (v7+, epoch -1, no session named) with at least one partition."""
    return (request.version >= FIRST_SESSION and not uses_session(request)
            and not request.from_follower and request.has_partitions)


def plan_request(request: FetchRequestView, sessions: UpstreamSessions,
                 changed: Mapping[PartitionKey, FetchParams] | None = None) -> tuple[bytes, SessionTicket] | None:
    """A session-less client's Fetch: the request frame to send upstream instead, and its ticket; None to relay
    the client's untouched. ``changed``: the request was read against the client's baseline
    (:func:`sessionless_delta`): the partitions it wants are ``sessions.wanted``, which differs from the last
    request's only by these, and the upstream delta is O(changed)."""
    if sessions.busy or not eligible(request):
        return None
    wanted = sessions.wanted if changed is not None else request.partitions()
    return _upstream(request, sessions, wanted, None, _BUILDER, changed)


def set_baseline(sessions: UpstreamSessions, request: FetchRequestView, frame: bytes, ticket: SessionTicket) -> None:
    """A session-less client's request, decoded whole (``frame``, as the client sent it) and planned: its later
    requests are read against it (:func:`sessionless_delta`)."""
    sessions.baseline = Baseline(request, frame)
    sessions.wanted, sessions.diverged = dict(ticket.wanted), set()
    ticket.wanted = sessions.mirrors_wanted = sessions.wanted  # the map the later requests update


#: a baseline is decoded again when this share of its partitions (at least) has diverged from it
_REBASE_SHARE = 8


def sessionless_delta(frame: bytes, sessions: UpstreamSessions
                      ) -> tuple[FetchRequestView, dict[PartitionKey, FetchParams]] | None:
    """A session-less client's request read against its baseline (:class:`~proxy.wire.fetch_request_fast
    .Baseline`): the request's view and the partitions whose params differ from its last request's, applied to
    ``sessions.wanted``; None: decode it. Not while a session fetch is in flight (``sessions.wanted`` is then in
    use), and not once many partitions have diverged from the baseline (reading against it would cost more than
    a decode)."""
    baseline = sessions.baseline
    if baseline is None or sessions.busy:
        return None
    read = baseline.read(frame)
    if read is None:
        sessions.baseline = None
        return None
    view, differing = read  # params that differ from the baseline's
    wanted, diverged, original = sessions.wanted, sessions.diverged, baseline.view.params
    changed: dict[PartitionKey, FetchParams] = {}
    for key in diverged - differing.keys():  # back to the baseline's params
        if wanted[key] != original[key]:
            changed[key] = original[key]
    for key, params in differing.items():
        if wanted[key] != params:
            changed[key] = params
    wanted.update(changed)
    sessions.diverged = set(differing)
    if len(differing) * _REBASE_SHARE > len(original):
        sessions.baseline = None  # decoded whole next time, and the new baseline
    return view, changed


def plan_session_request(request: FetchRequestView, sessions: UpstreamSessions, server: SessionServer,
                         now: float) -> SessionPlan:
    """A Fetch of a client that uses sessions (:func:`uses_session`), answered by Sluice's ``server``."""
    version = request.version
    if request.from_follower:
        return SessionPlan(Kind.SESSIONLESS)  # followers keep their own sessions with the broker
    decision = server.handle_request(request, version, now)
    if decision.is_error:
        return SessionPlan(decision.kind, answer=server.build_view(decision, {}))
    if decision.kind is Kind.SESSIONLESS:
        # The client closed its session (epoch -1 naming it, or an incremental request that forgot every
        # partition): from here it is a session-less request, which must not name Sluice's session upstream.
        if not decision.partitions or sessions.busy:
            return SessionPlan(decision.kind, frame=encode_fetch_request(
                request, INVALID_SESSION_ID, FINAL_EPOCH, decision.partitions, []))
        frame, ticket = _upstream(request, sessions, decision.partitions, None, _BUILDER)
        return SessionPlan(decision.kind, frame=frame, ticket=ticket)
    frame, ticket = _upstream(request, sessions, decision.partitions, decision, server)
    return SessionPlan(decision.kind, frame=frame, ticket=ticket)


def _upstream(request: FetchRequestView, sessions: UpstreamSessions, wanted: Mapping[PartitionKey, FetchParams],
              decision: Decision | None, server: SessionServer,
              changed: Mapping[PartitionKey, FetchParams] | None = None) -> tuple[bytes, SessionTicket]:
    client = sessions.client
    if sessions.busy:
        # Only a session-using client gets here (plan_request checks busy first): its whole session goes
        # upstream session-less, so the broker's answer is complete and the client's session stays served.
        everything = dict(wanted)
        plan = UpstreamPlan(LEGACY, everything, [], MappingProxyType(everything))
        in_session = mirrored = False
    else:
        by_id = request.version >= FIRST_TOPIC_ID
        if client.switches_addressing(by_id):
            # The client moved between Fetch v12 (topic names) and v13+ (topic ids), which librdkafka does
            # session-lessly when a partition has no topic id; a client with its own session must start a new
            # one (Sluice answered 106 otherwise). The upstream session restarts in the new addressing
            # (SessionClient.build), and the states kept under the old keys could never be read again: they
            # go, and the full response refills them under the new ones.
            sessions.states = {k: v for k, v in sessions.states.items() if isinstance(k[0], bytes) is by_id}
        session = decision.session if decision is not None else None
        if (session is not None and sessions.mirrors == session.id and session.sync_token is sessions.token
                and not client.next_metadata.is_full and not client.switches_addressing(by_id)):
            # The upstream session holds exactly this client session's partitions as of its last request, so
            # the client's own delta is the upstream delta: O(changed), not O(session).
            assert decision is not None
            plan = client.build_delta(decision.sent, decision.forgotten)
        elif (changed is not None and sessions.mirrors_wanted is wanted and not client.next_metadata.is_full
              and not client.switches_addressing(by_id)):
            # A session-less client's request differs from its previous one, whose partitions the upstream
            # session holds, only by ``changed``: the same O(changed) delta.
            plan = client.build_delta(changed, ())
        else:
            plan = client.build(wanted, by_id)
        # a session-less client's wanted map (reused, updated in place, by its next request when that one differs
        # only in some partitions): the upstream session's partitions are now exactly it
        sessions.mirrors_wanted = wanted if decision is None else None
        mirrored = decision is not None
        for key in plan.to_forget:  # no longer wanted: forget its state (it is refreshed if it comes back)
            sessions.states.pop(key, None)
        sessions.busy = in_session = True
        sessions.mirrors = 0  # until the response says which client session this now mirrors
    ticket = SessionTicket(sessions, request.version, wanted, plan.is_full, request, decision=decision,
                           server=server, in_session=in_session, mirrored=mirrored, changed=changed)
    meta = plan.metadata
    return encode_fetch_request(request, meta.session_id, meta.epoch, plan.to_send, plan.to_forget), ticket


def replan(ticket: SessionTicket) -> tuple[bytes, SessionTicket] | None:
    """After an unusable response (the session is reset): the same client request as a new full session
    request, once; None when it was already sent again or the connection's session is busy."""
    if ticket.attempts > 1 or ticket.sessions.busy:
        return None
    frame, again = _upstream(ticket.request, ticket.sessions, ticket.wanted, ticket.decision, ticket.server)
    again.attempts = ticket.attempts + 1
    return frame, again


def _stored(p: FetchPartition) -> FetchPartition:
    """The state kept for a partition: offsets and error, without records or per-response details."""
    return FetchPartition(p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset,
                          p.log_start_offset, None, -1, b"", None)


class FullResponse:
    """A session-less client's full response, kept encoded partition by partition, so that the next one, for the
    same partitions in the same order, costs O(changed partitions) of Python work (and a few C-level joins):
    only the partitions the upstream response named are encoded again; the response goes out as the encoded
    topics array of a :class:`~proxy.wire.fetch_fast.FetchResponseView` (decoded only if a later policy reads
    it). The encodings kept are of the stored states (no records); a partition that came with records is
    written with them for this response only. Building one costs O(partitions) once."""

    __slots__ = ("_errors", "_keys", "_pieces", "_slot", "_topic_keys", "_topics", "version", "wanted")

    def __init__(self, version: int, wanted: Mapping[PartitionKey, FetchParams],
                 states: Mapping[PartitionKey, FetchPartition]) -> None:
        self.version = version
        #: the wanted map this response lists (its identity says the next request asks for the same partitions)
        self.wanted = wanted
        keys = self._keys = list(wanted)  # the partitions' order in the response
        self._pieces: list[Buffer] = []
        self._slot: dict[PartitionKey, int] = {}
        self._errors: dict[PartitionKey, int] = {}
        self._topics = 0
        self._topic_keys: list[TopicKey] = []
        i = 0
        while i < len(keys):  # consecutive partitions of one topic share a topic entry (as _view groups them)
            topic = keys[i][0]
            j = i
            while j < len(keys) and keys[j][0] == topic:
                j += 1
            self._pieces.append(topic_head(version, topic, j - i))
            for key in keys[i:j]:
                self._slot[key] = len(self._pieces)
                self._pieces.append(self._stored_piece(key, states[key]))
            self._pieces.append(topic_tail(version))
            self._topics += 1
            self._topic_keys.append(topic)
            i = j

    def _stored_piece(self, key: PartitionKey, state: FetchPartition) -> bytes:
        if state.error_code:
            self._errors[key] = state.error_code
        else:
            self._errors.pop(key, None)
        if state.partition_index != key[1]:  # as _view: the key is what the client asked
            state = FetchPartition(key[1], state.error_code, state.high_watermark, state.last_stable_offset,
                                   state.log_start_offset, None, -1, b"", None)
        return b"".join(encode_partition(self.version, state))  # no records: one piece

    def response(self, fresh: Mapping[PartitionKey, FetchPartition], states: Mapping[PartitionKey, FetchPartition],
                 throttle_time_ms: int) -> FetchResponseView:
        """The full response: every wanted partition, the ``fresh`` ones (the upstream response's, which also
        updated ``states``) as the broker sent them."""
        pieces, version = self._pieces, self.version
        sent: dict[int, list[Buffer]] = {}
        sizes: dict[PartitionKey, int] = {}  # of those written with their records
        for key, data in fresh.items():
            slot = self._slot[key]
            pieces[slot] = self._stored_piece(key, states[key])
            if data.partition_index == key[1]:
                sent[slot] = encode_partition(version, data)
                if data.records_size:
                    sizes[key] = data.records_size
        buffers: list[Buffer] = []
        start = 0
        for slot in sorted(sent):
            buffers.append(b"".join(pieces[start:slot]))
            buffers.extend(sent[slot])
            start = slot + 1
        buffers.append(b"".join(pieces[start:]))
        errors = [code for code in self._errors.values() if code]
        return FetchResponseView.from_encoded(version, throttle_time_ms, NONE, INVALID_SESSION_ID,
                                              EncodedTopics(self._topics, buffers, errors, self._keys, sizes,
                                                            self._topic_keys))


@dataclass(slots=True)
class ClientResponse:
    """What one upstream response made (:func:`respond`): everything the policy needs after it, gathered on the
    way, so that handling a response steps into the session client once and into the session server once."""

    #: the client's response; None: the upstream response cannot be used
    view: FetchResponseView | None
    #: what the upstream session's check found; None: the request went upstream outside the session
    check: ResponseCheck | None = None
    #: the session server's counters after it built the view; None: no session server built it
    stats: SessionStats | None = None


def build_client_response(upstream: FetchResponseView, ticket: SessionTicket) -> FetchResponseView | None:
    """The client's response (session-less, or in its own session), from the upstream response; None when the
    upstream response cannot be used (the upstream session is reset: send the request again with
    :func:`replan`, or answer :func:`retriable_answer`)."""
    return respond(upstream, ticket).view


def respond(upstream: FetchResponseView, ticket: SessionTicket) -> ClientResponse:
    """:func:`build_client_response`, with what the session client and server said on the way.

    For a client session whose cache agreed with the partition states before this response (``synced``),
    only the partitions in the upstream response can have news, so only they are checked: the response
    costs O(changed partitions). Any other use of the states (another session, a session-less request, an
    unusable response) clears ``synced`` and the next response checks the whole session once."""
    sessions, version = ticket.sessions, ticket.version
    decision = ticket.decision
    session = decision.session if decision is not None else None
    fast = session is not None and sessions.synced == session.id and session.sync_token is sessions.token
    sessions.synced = 0
    check = None
    if ticket.in_session:
        sessions.busy = False
        check = sessions.client.check_response(upstream, version, ticket.full)
        if not check.usable:
            return ClientResponse(None, check)
    elif upstream.error_code != NONE or set(partition_keys(upstream.topics)) != set(ticket.wanted):
        return ClientResponse(None)  # a session-less answer must be complete
    states = sessions.states
    fresh: dict[PartitionKey, FetchPartition] = {}
    for t, p in upstream.partitions():
        key = (topic_key(t), p.partition_index)
        fresh[key] = p
        states[key] = _stored(p)
    if fast and decision is not None and all(k in states for k in decision.sent):
        built = ticket.server.respond(decision, fresh, upstream.throttle_time_ms, only=list(fresh))
        return ClientResponse(_built(upstream, ticket, built.view, built.session), check, built.stats)
    full = sessions.full
    if decision is None and ticket.in_session:
        if full is not None and full.wanted is ticket.wanted and full.version == version:
            # the same partitions as the last full response: O(changed) (FullResponse)
            view = full.response(fresh, states, upstream.throttle_time_ms)
            return ClientResponse(_built(upstream, ticket, view, None), check)
        if ticket.wanted is sessions.mirrors_wanted and full is None and ticket.changed is not None:
            # the client asks for the same partitions a second time in a row: worth keeping its response encoded
            if all(k in fresh or k in states for k in ticket.wanted):
                full = sessions.full = FullResponse(version, ticket.wanted, states)
                view = full.response(fresh, states, upstream.throttle_time_ms)
                return ClientResponse(_built(upstream, ticket, view, None), check)
    sessions.full = None
    merged: dict[PartitionKey, FetchPartition] = {}
    for key in ticket.wanted:
        data = fresh.get(key)
        if data is None:
            data = states.get(key)
        if data is None:
            # the broker said nothing about a partition Sluice has never seen: not a valid session answer
            if ticket.in_session:
                sessions.client.handle_error()
            return ClientResponse(None, check)
        merged[key] = data
    built = ticket.server.respond(decision or Decision(Kind.SESSIONLESS, version, ticket.wanted), merged,
                                  upstream.throttle_time_ms)
    return ClientResponse(_built(upstream, ticket, built.view, built.session), check, built.stats)


def _built(upstream: FetchResponseView, ticket: SessionTicket, view: FetchResponseView,
           session: Session | None) -> FetchResponseView:
    """A usable response: note which client session (``session``, the cached one the view is in) now agrees
    with the states (and, if the upstream session's partitions are that session's, that it mirrors them), and
    carry the upstream's top-level tags."""
    sessions = ticket.sessions
    if session is not None and not view.error_code:
        session.sync_token = sessions.token
        sessions.synced = session.id
        if ticket.mirrored:
            sessions.mirrors = session.id
    view.node_endpoints = upstream.node_endpoints
    view.unknown_tags = upstream.unknown_tags
    return view


def retriable_answer(upstream: FetchResponseView, ticket: SessionTicket) -> FetchResponseView:
    """An answer that lets the client simply fetch again, without an error: every partition with its stored
    state and no records (an incremental one: those whose state the client has not been told yet); when a full
    response cannot list every partition, an empty one with a throttle time (KIP-219: "an empty full fetch
    response to indicate that this client should be throttled", which the Java client does not count as
    invalid, and librdkafka/aiokafka simply fetch again after)."""
    states = ticket.sessions.states
    known = {k: states[k] for k in ticket.wanted if k in states}
    decision = ticket.decision or Decision(Kind.SESSIONLESS, ticket.version, ticket.wanted)
    if decision.kind is Kind.INCREMENTAL or len(known) == len(ticket.wanted):
        view = ticket.server.build_view(decision, known, upstream.throttle_time_ms)
    else:
        view = FetchResponseView(ticket.version, max(upstream.throttle_time_ms, 1), NONE, INVALID_SESSION_ID)
    view.node_endpoints = upstream.node_endpoints
    return view


@dataclass(slots=True)
class _Attempt:
    """The terminate policy's state for one client request: its ticket, replaced when it goes up again."""

    ticket: SessionTicket
    #: the size of the last upstream response (size prefix included)
    upstream_size: int = 0


class Terminate(Policy):
    """``[sessions] mode = "terminate"`` on the chain: the last policy before the broker, so it sends upstream
    what the earlier policies made of the request, and the first to see the response, which it turns into the
    client's (the later policies then edit that)."""

    name = "terminate"
    decodes_fetch: ClassVar[bool] = True

    def __init__(self, settings: SessionsSettings, services: Services, metrics: SessionMetrics) -> None:
        self.apis = reads(ApiKey.FETCH)
        self.metrics = metrics
        self.clock = services.clock
        self.modes = SessionModes.from_settings(settings)
        self._active = self.modes.active  # asked on every Fetch; [sessions] needs a restart to change
        #: the sessions Sluice serves to clients that use them (one cache for the proxy, like a broker's)
        self.server = SessionServer(SessionCache(settings.cache_slots, settings.eviction_age_s))
        self._stats_seen = SessionStats()
        cache = self.server.cache
        self.metrics.bind_session_cache(lambda: len(cache), lambda: cache.partitions_cached)

    def unread(self, api_key: int, version: int) -> bool:
        return not self._active  # switched off: no client's request is its business

    def applies(self, ex: Exchange) -> bool:
        return self._active and self.modes.terminates(ex.client_id)

    def open(self, info: ConnectionInfo) -> UpstreamSessions | None:
        # the connection's upstream fetch session (one per connection: it has one upstream connection)
        return UpstreamSessions() if self._active else None

    def close(self, sessions: UpstreamSessions | None) -> None:
        if sessions is not None:
            self._gauges(sessions.session_open, False, len(sessions.states), 0)

    def on_request(self, ex: Exchange, sessions: UpstreamSessions) -> Any:
        """The request goes upstream in the connection's own fetch session (only added/changed partitions); the
        response is collected and the client's response built from Sluice's partition state: in full for a
        session-less client, in the client's own session (served by :attr:`server`) for one that uses
        sessions. The request is the one the earlier policies left (their partitions, order and MaxBytes)."""
        # A session-less client's request that differs from its previous one only in some partitions is read
        # as that difference (not decoded whole), when no earlier policy decoded it.
        delta = sessionless_delta(ex.frame, sessions) if ex.view is None else None
        if delta is not None:
            request, changed = delta
            comparable = False  # the baseline stays
        else:
            edit = ex.request
            assert isinstance(edit, FetchEdit)
            request, changed = edit.request(), None
            comparable = not edit.changed  # the client's own bytes: its next request can be read against them
        if request.version < FIRST_SESSION:
            return None
        was_open, cached = sessions.session_open, len(sessions.states)
        m = self.metrics
        if uses_session(request):
            sessions.baseline = None
            plan = plan_session_request(request, sessions, self.server, self.clock())
            if not request.from_follower:
                m.downstream_fetch_requests_by_kind[plan.kind.value].inc()
            self._count_stats(self.server.stats)
            if plan.answer is not None:  # a session error of Sluice's own: answered here, nothing goes upstream
                buffers, _ = plan.answer.encode_frame(ex.header.correlation_id)
                ex.answer = b"".join(buffers)
                return None
            if plan.ticket is None or plan.frame is None:
                if plan.frame is not None:  # a closed session's request, now session-less: the broker answers
                    ex.send_instead(plan.frame)
                return None
            frame, ticket = plan.frame, plan.ticket
        else:
            planned = plan_request(request, sessions, changed)
            if planned is None:
                sessions.baseline = None
                return None
            frame, ticket = planned
            if comparable:
                set_baseline(sessions, request, ex.frame, ticket)
        self._gauges(was_open, sessions.session_open, cached, len(sessions.states))  # forgotten ones leave the state
        if ticket.in_session:
            (m.upstream_fetch_full if ticket.full else m.upstream_fetch_incremental).inc()
        m.upstream_fetch_request_bytes.inc(len(frame) + 4)
        # saved against what would have gone upstream without terminate mode: the client's own request (the
        # earlier policies clamp and reorder it, which keeps its size, up to topic entry regrouping)
        if len(frame) < len(ex.frame):
            m.upstream_fetch_request_bytes_saved.inc(len(ex.frame) - len(frame))
        ex.send_instead(frame)
        ex.collect = True
        return _Attempt(ticket)

    def on_response(self, ex: Exchange, response: ResponseView, sessions: UpstreamSessions,
                    state: _Attempt) -> None:
        """The upstream answered Sluice's session request: the client gets every partition it asked for, or
        those its own session must include (the policies nearer the client then edit that response as usual).
        An unusable answer sends the request upstream again once when nothing is in flight behind it, else
        gives the client a retriable answer."""
        assert isinstance(response, FetchResponse)
        m = self.metrics
        ticket = state.ticket
        was_cached = len(sessions.states)
        size = state.upstream_size = len(response.frame) + 4
        m.upstream_fetch_response_bytes.inc(size)
        ex.log["session_upstream_bytes"] = ex.log.get("session_upstream_bytes", 0) + size
        # one step into the session client (its check of the response) and one into the server (the view)
        result = respond(response.view, ticket)
        built, check, stats = result.view, result.check, result.stats
        if check is not None:
            was_open, is_open = check.was_open, check.is_open
        else:  # the request went upstream outside the session: the session did not move
            was_open = is_open = False
        if built is None:
            # the unusable paths may move the session after its check (handle_error, replan): read it again
            if check is None:
                was_open = sessions.session_open
            m.fetch_session_retries.inc()
            again = replan(ticket) if ex.may_resend else None
            if again is not None:
                ex.frame, state.ticket = again
                m.upstream_fetch_full.inc()
                self._gauges(was_open, sessions.session_open, was_cached, len(sessions.states))
                ex.resend = True
                return
            built, stats, is_open = retriable_answer(response.view, ticket), self.server.stats, sessions.session_open
        if ticket.decision is not None:
            assert stats is not None  # a decision's views are built by the policy's session server
            self._count_stats(stats)
        self._gauges(was_open, is_open, was_cached, len(sessions.states))
        response.view = built
        response.changed = True

    def on_sent(self, ex: Exchange, sessions: UpstreamSessions, state: _Attempt) -> None:
        # for a session-less client: the saving against the full response it would have fetched itself
        saved = ex.client_bytes - state.upstream_size
        if saved > 0:
            self.metrics.upstream_fetch_response_bytes_saved.inc(saved)

    def _count_stats(self, stats: SessionStats) -> None:
        """Move the downstream session counters by what the session server counted (``stats``, its counters)
        since the last call."""
        seen = self._stats_seen
        m = self.metrics
        if stats.evictions != seen.evictions:
            m.fetch_session_evictions.inc(stats.evictions - seen.evictions)
            seen.evictions = stats.evictions
        for code, n in stats.errors.items():
            if n != seen.errors[code]:
                m.fetch_session_errors.labels(SESSION_ERROR_NAMES[code]).inc(n - seen.errors[code])
                seen.errors[code] = n

    def _gauges(self, was_open: bool, is_open: bool, was_cached: int, cached: int) -> None:
        """Move the upstream-session gauges by what one request, response or closing connection changed."""
        m = self.metrics
        if is_open != was_open:
            m.upstream_fetch_sessions_open.inc(1 if is_open else -1)
        if cached != was_cached:
            m.upstream_fetch_partitions_cached.inc(cached - was_cached)
