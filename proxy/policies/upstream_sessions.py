"""``[sessions] mode = "terminate"`` for session-less clients, sans-IO: Sluice speaks a KIP-227 fetch session
upstream on their behalf, so the upstream link carries only changed partitions while the client still gets a
full response.

librdkafka (confluent-kafka) and aiokafka send every Fetch with session_epoch -1, listing every partition.
Per client connection (which has exactly one upstream connection) Sluice keeps an :class:`UpstreamSessions`:
a :class:`~proxy.policies.sessions.SessionClient` (the Java client's FetchSessionHandler) and the latest
:class:`~proxy.wire.fetch_fast.FetchPartition` of every partition of the session (an incremental response
omits partitions with no news, so the last known state is kept).

1. Request (:func:`plan_request`): the client's partitions and fetch parameters are the session's wanted set;
   ``SessionClient.build`` gives the plan (full the first time, then only added and altered partitions plus
   forgotten ones) and ``apply_plan`` rewrites the request. A consumer advances its fetch offset after every
   response that carried records, so partitions with traffic are sent upstream again; idle partitions are
   not, which is where the savings come from.
2. Response (:func:`build_client_response`): ``SessionClient.handle_response`` checks the upstream response
   (session errors 70/71/106, or partitions that do not match the session, reset it to a full request); the
   state store is updated; the client's response lists every partition it asked for, in its order: the
   upstream entry when the response has one (its records are for the client's fetch offset, since the
   session's fetch parameters are exactly the client's), else the stored state with empty records.

When the upstream response cannot be used (a session error 70/71/106, an invalid response, a throttled empty
full response), the same client request goes upstream again at once as a full session request
(:func:`replan`, once), and the client never sees the error. The server does this only when no other request
of the connection is in flight behind it (responses must stay in order); otherwise, or if the second attempt
fails too, the client gets a retriable empty answer: error 0, every partition Sluice knows with its stored
state and no records (partitions it does not know yet are left out), so a session-less client simply fetches
again, and that fetch is a full one.

One upstream session per connection means one session fetch in flight: a second Fetch pipelined behind a
session fetch is relayed untouched (a session-less request with session id 0 does not disturb the session).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..wire.fetch_fast import FetchPartition, FetchResponseView
from ..wire.model import Message
from .sessions import (
    FINAL_EPOCH,
    FIRST_SESSION_VERSION,
    FIRST_TOPIC_ID_VERSION,
    INITIAL,
    INVALID_SESSION_ID,
    NONE,
    Decision,
    FetchParams,
    Kind,
    PartitionKey,
    SessionClient,
    SessionServer,
    apply_plan,
    is_from_follower,
    request_partitions,
)

#: builds session-less responses from partition states (Kind.SESSIONLESS never touches the cache)
_BUILDER = SessionServer()


@dataclass(slots=True)
class UpstreamSessions:
    """One client connection's upstream session and the last known state of each of its partitions."""

    client: SessionClient = field(default_factory=SessionClient)
    #: latest partition data (records dropped) per key, from every upstream response
    states: dict[PartitionKey, FetchPartition] = field(default_factory=dict)
    #: a session fetch is in flight (its response must be handled before the next one is built)
    busy: bool = False

    @property
    def session_open(self) -> bool:
        return self.client.next_metadata.session_id != INVALID_SESSION_ID and not self.client.next_metadata.is_full


@dataclass(slots=True)
class SessionTicket:
    """What the response side needs: the client's partitions (its order) and what was sent upstream."""

    sessions: UpstreamSessions
    version: int
    wanted: dict[PartitionKey, FetchParams]
    full: bool
    #: the client's request body (after other policies), to send again if the session is refused
    body: Message
    #: the request header (set by the pipeline) and how many times this client request went upstream
    header: Message | None = None
    attempts: int = 1


@dataclass(slots=True)
class ClientResponse:
    view: FetchResponseView
    used: bool  # False: the upstream response could not be used; ``view`` is the retriable empty answer


def eligible(body: Message, version: int) -> bool:
    """A consumer's session-less Fetch (v7+, epoch -1, no session named) with at least one partition."""
    return (version >= FIRST_SESSION_VERSION
            and body.get("session_epoch", FINAL_EPOCH) == FINAL_EPOCH
            and body.get("session_id", INVALID_SESSION_ID) == INVALID_SESSION_ID
            and not is_from_follower(body, version)
            and any(t.partitions for t in body.topics or ()))


def plan_request(body: Message, version: int, sessions: UpstreamSessions) -> tuple[Message, SessionTicket] | None:
    """The request to send upstream instead of ``body``, and its ticket; None to relay ``body`` untouched."""
    if sessions.busy or not eligible(body, version):
        return None
    wanted = request_partitions(body, version)
    plan = sessions.client.build(wanted)
    for key in plan.to_forget:  # no longer wanted: forget its state (it is refreshed if it comes back)
        sessions.states.pop(key, None)
    sessions.busy = True
    return apply_plan(body, version, plan), SessionTicket(sessions, version, wanted, plan.is_full, body)


def replan(ticket: SessionTicket) -> tuple[Message, SessionTicket] | None:
    """After an unusable response (the session is reset): the same client request as a new full session
    request, once; None when it was already sent again."""
    if ticket.attempts > 1:
        return None
    planned = plan_request(ticket.body, ticket.version, ticket.sessions)
    if planned is None:
        return None
    body, again = planned
    again.header, again.attempts = ticket.header, ticket.attempts + 1
    return body, again


def _stored(p: FetchPartition) -> FetchPartition:
    """The state kept for a partition: offsets and error, without records or per-response details."""
    return FetchPartition(p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset,
                          p.log_start_offset, None, -1, b"", None)


def build_client_response(upstream: FetchResponseView, ticket: SessionTicket) -> ClientResponse:
    """The session-less response for the client, from the upstream response to the session request."""
    sessions, version = ticket.sessions, ticket.version
    sessions.busy = False
    states = sessions.states
    if not sessions.client.handle_response(upstream, version):
        meta = sessions.client.next_metadata
        if ticket.full and meta.session_id != INVALID_SESSION_ID:
            # a full request naming the old session failed too (an error other than 70, e.g. -1): naming it
            # again could fail forever, so start a fresh session instead (still a full request)
            sessions.client.next_metadata = INITIAL
        return ClientResponse(_retriable(upstream, ticket), False)
    by_id = version >= FIRST_TOPIC_ID_VERSION
    fresh: dict[PartitionKey, FetchPartition] = {}
    for t, p in upstream.partitions():
        key = (t.topic_id if by_id else t.topic, p.partition_index)
        fresh[key] = p
        states[key] = _stored(p)
    merged: dict[PartitionKey, FetchPartition] = {}
    for key in ticket.wanted:
        data = fresh.get(key)
        if data is None:
            data = states.get(key)
        if data is None:
            # the broker said nothing about a partition Sluice has never seen: not a valid session answer
            sessions.client.handle_error()
            return ClientResponse(_retriable(upstream, ticket), False)
        merged[key] = data
    decision = Decision(Kind.SESSIONLESS, version, ticket.wanted)
    view = _BUILDER.build_view(decision, merged, upstream.throttle_time_ms)
    view.node_endpoints = upstream.node_endpoints
    view.unknown_tags = upstream.unknown_tags
    return ClientResponse(view, True)


def _retriable(upstream: FetchResponseView, ticket: SessionTicket) -> FetchResponseView:
    known = {k: ticket.sessions.states[k] for k in ticket.wanted if k in ticket.sessions.states}
    view = _BUILDER.build_view(Decision(Kind.SESSIONLESS, ticket.version, {k: ticket.wanted[k] for k in known}), known,
                               upstream.throttle_time_ms)
    view.error_code = NONE
    view.node_endpoints = upstream.node_endpoints
    return view
