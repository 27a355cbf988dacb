"""Per-request decisions, sans-IO: relay as bytes, answer locally, or decode and rewrite the response.

The server hands every complete request frame to :meth:`Pipeline.on_request` and every response frame to
:meth:`Pipeline.on_response`; neither touches a socket or a clock. Only APIs some rule needs are decoded
(Kroxylicious-style selective decoding): the ApiVersions ranges, and the responses that carry broker
addresses. Everything else — Produce and Fetch bodies included, unless a rule needs them — is relayed as the
original bytes.
"""

from __future__ import annotations

import base64
import io
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import metrics, versions
from .policies.sessions import FIRST_SESSION_VERSION, SessionServer, SessionStats
from .policies.size_limit import Budget, Fairness, SizeLimits, clamp_request, enforce, reorder_request
from .policies.terminate import (
    SessionModes,
    SessionTicket,
    UpstreamSessions,
    build_client_response,
    plan_session_request,
    replan,
    retriable_answer,
    uses_session,
)
from .policies.terminate import plan_request as session_plan
from .policies.throttle import Throttles, ThrottleState, Ticket
from .policies.throttle import enforce as throttle_enforce
from .policies.throttle import plan_request as throttle_plan
from .routing import Router
from .versions import UNSUPPORTED_VERSION
from .wire import fetch_fast
from .wire.compiler import head_codec, top_level_tags_locator
from .wire.errors import CodecError
from .wire.fetch_request_fast import FetchEdit, decode_fetch_request
from .wire.fetch_stream import FetchStreamer
from .wire.messages import (
    API_VERSIONS_KEY,
    RequestHeader,
    api_name,
    decode_response,
    decoded_versions,
    encode_response,
    negotiable_versions,
    peek_request_header,
    response_body_offset,
    response_spec,
)
from .wire.model import Message
from .wire.produce import produce_acks

PRODUCE, FETCH, METADATA, FIND_COORDINATOR, DESCRIBE_CLUSTER = 0, 1, 3, 10, 60

_I16 = struct.Struct(">h")


@dataclass(slots=True)
class Request:
    """One request in flight on a connection, in arrival order."""

    header: RequestHeader
    api: str
    size: int  # bytes received from the client, size prefix included
    #: False for Produce with acks=0: Kafka sends no response, so nothing is awaited (ProduceRequest docs)
    expects_response: bool = True
    #: a response Sluice produces itself (full frame incl. size prefix); None -> forwarded upstream
    local_response: bytes | None = None
    #: decode + rewrite the upstream response with this rule; None -> relay the bytes untouched
    rewrite: Callable[[Any], None] | None = None
    #: the whole response must be collected and decoded (a rule, or a policy, needs all of it)
    collect: bool = False
    #: the frame to send upstream (the client's bytes, or re-encoded by a policy); size prefix excluded
    frame: bytes = b""
    #: KIP-74 budget for this fetch's response (None: no size limit) and the connection's rotation state
    budget: Budget | None = None
    fairness: Fairness | None = None
    #: response bytes to reserve from the global bound before the request goes upstream, and what is
    #: currently held for it (set once granted, corrected to the real size, zero once released)
    reserve: int = 0
    held: int = 0
    started: float = 0.0
    #: KIP-73: the throttled partitions' fetch offsets, for the response side (None: no throttle applies)
    throttle: Ticket | None = None
    #: KIP-227 ([sessions] mode = terminate): this fetch went upstream in Sluice's own session
    session: SessionTicket | None = None
    error_codes: list[int] = field(default_factory=list)
    #: record bytes sent per (topic, partition) when the Fetch response was decoded (for the access log)
    partitions: list[tuple[str, int, int]] | None = None
    #: for the access log: the KIP-73 leader rate in force and the bytes of this response that counted against
    #: it (throttled fetches), and the upstream response bytes of Sluice's session fetches (terminate mode,
    #: every attempt)
    throttle_target_bps: int | None = None
    throttled_bytes: int | None = None
    session_upstream_bytes: int | None = None


@dataclass(slots=True)
class Rewritten:
    #: the response to send the client, size prefix included, as buffers for transport.writelines (record
    #: bytes of a Fetch response stay memoryview slices of the upstream frame: never copied)
    buffers: list[Any]
    size: int
    error_codes: list[int]
    changed: bool = True  # False: the upstream bytes went out untouched
    #: KIP-73 pacing: stop reading this client connection for so many seconds (see policies/throttle.py)
    mute_s: float = 0.0
    #: KIP-227 terminate: send this frame (no size prefix; also in ``req.frame``) upstream again and wait for
    #: its response instead of answering now (Sluice's upstream session was refused; nothing is in ``buffers``)
    reissue: bytes | None = None


class ConnectionState:
    """What policies remember per client connection."""

    __slots__ = ("fairness", "sessions")

    def __init__(self) -> None:
        self.fairness = Fairness()
        #: the connection's upstream fetch session ([sessions] mode = terminate), created on first use
        self.sessions: UpstreamSessions | None = None


class Pipeline:
    """Shared by all connections of one proxy; per-connection state lives in :class:`ConnectionState`."""

    def __init__(self, router: Router, size_limits: SizeLimits | None = None, throttles: Throttles | None = None,
                 clock: Callable[[], float] = time.monotonic, session_modes: SessionModes | None = None,
                 session_server: SessionServer | None = None) -> None:
        self.router = router
        #: [sessions] mode per client: "terminate" makes Sluice own the fetch sessions on both sides
        self.session_modes = session_modes or SessionModes()
        #: the sessions Sluice serves to clients that use them (one cache for the proxy, like a broker's)
        self.session_server = session_server or SessionServer()
        self._session_stats_seen = SessionStats()
        cache = self.session_server.cache
        metrics.bind_session_cache(lambda: len(cache), lambda: cache.partitions_cached)
        #: replaced whole on reconfiguration (admin API, SIGHUP): a request sees one consistent snapshot
        self.size_limits = size_limits or SizeLimits()
        #: KIP-73: the throttle snapshot (swapped by :meth:`set_throttles`) and the quotas every connection shares
        self.throttles = throttles or Throttles()
        self.throttle_state = ThrottleState(self.throttles)
        self.clock = clock
        #: topic id -> name, learnt from Metadata responses (Fetch v13+ names topics by id only)
        self.topic_names: dict[bytes, str] = {}
        metrics.bind_throttle(self.throttle_state, self.throttles, clock)
        #: api key -> the rewrite its responses need (all of them keep broker addresses away from clients)
        self._rules: dict[int, Callable[[Any], None]] = {
            METADATA: self._metadata,
            FIND_COORDINATOR: router.rewrite_find_coordinator,
            DESCRIBE_CLUSTER: router.rewrite_describe_cluster,
            FETCH: router.rewrite_node_endpoints,
            PRODUCE: router.rewrite_node_endpoints,
        }

    # ------------------------------------------------------------------ requests

    def on_request(self, frame: bytes, conn: ConnectionState | None = None) -> Request:
        """Classify a client request frame (without its size prefix). Raises CodecError if malformed."""
        header = peek_request_header(frame)
        key, version = header.api_key, header.api_version
        req = Request(header=header, api=api_name(key), size=len(frame) + 4, frame=frame)
        if key == API_VERSIONS_KEY:
            ours = decoded_versions(key)
            assert ours is not None
            if version > ours.high:
                req.local_response = self._local(header.correlation_id, key, 0,
                                                 versions.unsupported_api_versions_body())
            else:
                req.rewrite = self._api_versions
                req.collect = True
            return req
        ours = negotiable_versions(key)  # decoded or relayed as bytes (Produce v0-9, KAFKA-18659)
        rule = self._rules.get(key)
        if rule is not None and ours is not None:
            if version not in ours:
                # A client that read our ApiVersions never sends this; decoding its response would fail.
                raise CodecError(f"version outside the {ours.low}-{ours.high} Sluice decodes",
                                 api=req.api, version=version)
            if (key == FETCH and version < 16) or (key == PRODUCE and version < 10):
                pass  # no NodeEndpoints before KIP-951: nothing to rewrite, relay as bytes
            else:
                req.rewrite = rule
            req.collect = req.rewrite is not None and key != FETCH  # Fetch v16+ streams (fetch_stream.py)
        if key == FETCH:
            # The request-side Fetch policies, in this order: KIP-74 size limits, KIP-73 throttles, KIP-227
            # terminate mode, each seeing the request as the previous ones left it. The request is decoded once
            # (the fast path: ~0.45 us per partition) and encoded at most once, at the end.
            size_limited = self.size_limits.active and self.size_limits.may_apply(header.client_id)
            terminate = conn is not None and self.session_modes.active \
                and self.session_modes.terminates(header.client_id)
            if size_limited or self.throttles.active or terminate:
                edit = FetchEdit(decode_fetch_request(frame))
                if size_limited:
                    self._size_limit_request(req, edit, conn or ConnectionState())
                if self.throttles.active:
                    self._throttle_request(req, edit)
                # terminate mode builds its upstream frame (or a local answer) from the edited request itself
                built = terminate and conn is not None and self._session_request(req, edit, conn)
                if edit.changed and not built:
                    req.frame = edit.encode()
        if key == PRODUCE and header.body_offset is not None and produce_acks(frame, header) == 0:
            req.expects_response = False
        return req

    def _size_limit_request(self, req: Request, edit: FetchEdit, conn: ConnectionState) -> None:
        """KIP-74 on the request side: clamp what the broker may return and, for clients that do not rotate,
        ask for the longest-starved partitions first (edits ``edit``). The response is then collected and
        trimmed."""
        limits = self.size_limits
        budget = limits.budget_for(req.header.client_id, edit.view.replica_id)
        if budget is None:
            return
        clamp_request(edit, budget)
        if limits.fairness:
            req.fairness = conn.fairness
            reorder_request(edit, conn.fairness)
        req.budget = budget
        req.collect = True
        # What the broker may send: the clamped max_bytes (the first-batch rule can exceed it: the server adjusts
        # the reservation when the real size is known).
        req.reserve = edit.max_bytes if limits.global_max_bytes else 0

    def set_throttles(self, throttles: Throttles) -> None:
        self.throttles = throttles
        self.throttle_state.reconfigure(throttles)
        metrics.bind_throttle(self.throttle_state, throttles, self.clock)

    def _throttle_request(self, req: Request, edit: FetchEdit) -> None:
        """KIP-73 on the request side (policies/throttle.py): note the throttled partitions' fetch offsets and,
        while the follower quota is exceeded, leave them out of a session-less request (edits ``edit``). The
        response is then collected so the leader side can leave records out."""
        t = self.throttles
        fetcher = t.fetcher(req.header.client_id, edit.view.replica_id)
        if fetcher is None:
            return
        ticket = throttle_plan(edit, fetcher, t, self.throttle_state, self.topic_names.get, self.clock())
        if not ticket.offsets and not ticket.left_out:
            return
        if ticket.left_out:
            metrics.THROTTLE_LEFT_OUT_FOLLOWER.inc(ticket.left_out)
        req.throttle = ticket
        req.collect = True

    def _session_request(self, req: Request, edit: FetchEdit, conn: ConnectionState) -> bool:
        """KIP-227 terminate mode (policies/terminate.py): the request goes upstream in the connection's own
        fetch session (only added/changed partitions); the response is collected and the client's response
        built from Sluice's partition state: in full for a session-less client, in the client's own session
        (served by :attr:`session_server`) for one that uses sessions. The request is the one the size-limit
        and throttle steps left (``edit.request()``: their partitions, order and MaxBytes), read with the fast
        path (wire/fetch_request_fast.py): a 10,000-partition request costs ~4 ms instead of ~85 ms.

        True when this step set the frame to send upstream (or a local response); False: send the edited
        request as it is."""
        request = edit.request()
        if request.version < FIRST_SESSION_VERSION:
            return False
        if conn.sessions is None:
            conn.sessions = UpstreamSessions()
        sessions = conn.sessions
        was_open, cached = sessions.session_open, len(sessions.states)
        if uses_session(request):
            plan = plan_session_request(request, sessions, self.session_server, self.clock())
            if request.replica_id < 0:
                metrics.DOWNSTREAM_FETCH_REQUESTS.labels(plan.kind.value).inc()
            self._count_session_stats()
            if plan.answer is not None:  # a session error of Sluice's own: answered here, nothing goes upstream
                buffers, _ = plan.answer.encode_frame(req.header.correlation_id)
                req.local_response = b"".join(buffers)
                return True
            if plan.ticket is None or plan.frame is None:
                if plan.frame is not None:  # a closed session's request, now session-less: the broker answers
                    req.frame = plan.frame
                    return True
                return False
            frame, ticket = plan.frame, plan.ticket
        else:
            planned = session_plan(request, sessions)
            if planned is None:
                return False
            frame, ticket = planned
        _session_gauges(sessions, was_open, cached)  # forgotten partitions leave the state
        if ticket.in_session:
            (metrics.UPSTREAM_FETCH_FULL if ticket.full else metrics.UPSTREAM_FETCH_INCREMENTAL).inc()
        metrics.UPSTREAM_FETCH_BYTES.labels("request").inc(len(frame) + 4)
        # saved against what would have gone upstream without terminate mode: the client's own request (the
        # other request-side steps clamp and reorder it, which keeps its size, up to topic entry regrouping)
        if len(frame) < len(req.frame):
            metrics.UPSTREAM_FETCH_BYTES_SAVED.labels("request").inc(len(req.frame) - len(frame))
        req.frame = frame
        req.session = ticket
        req.collect = True
        return True

    def _count_session_stats(self) -> None:
        """Move the downstream session counters by what the session server counted since the last call."""
        stats, seen = self.session_server.stats, self._session_stats_seen
        if stats.evictions != seen.evictions:
            metrics.FETCH_SESSION_EVICTIONS.inc(stats.evictions - seen.evictions)
            seen.evictions = stats.evictions
        for code, n in stats.errors.items():
            if n != seen.errors[code]:
                metrics.FETCH_SESSION_ERRORS.labels(metrics.SESSION_ERROR_NAMES[code]).inc(n - seen.errors[code])
                seen.errors[code] = n

    def on_close(self, conn: ConnectionState) -> None:
        """A client connection closed: its upstream session (if any) goes with it."""
        sessions, conn.sessions = conn.sessions, None
        if sessions is not None:
            _session_gauges(sessions, was_open=sessions.session_open, was_cached=len(sessions.states),
                            closing=True)

    def _metadata(self, body: Message) -> None:
        self.router.rewrite_metadata(body)
        for topic in body.topics:
            tid, name = topic.get("topic_id"), topic.get("name")
            if tid and name and any(tid):
                self.topic_names[bytes(tid)] = name

    @staticmethod
    def _local(correlation_id: int, api_key: int, version: int, body: Message) -> bytes:
        frame = encode_response(api_key, version, Message(correlation_id=correlation_id), body)
        return len(frame).to_bytes(4, "big") + frame

    # ------------------------------------------------------------------ responses

    def on_response(self, req: Request, frame: bytes | bytearray, reissue_ok: bool = False) -> Rewritten:
        """Apply the request's rewrite rule to its response frame (without size prefix). ``reissue_ok``: no
        other request of the connection is in flight, so the request may go upstream again
        (:attr:`Rewritten.reissue`)."""
        key, version = req.header.api_key, req.header.api_version
        if key == FETCH:
            return self._fetch_response(req, frame, reissue_ok)
        assert req.rewrite is not None
        if key == PRODUCE:
            # KIP-951 NodeEndpoints is a top-level tagged field, present only after a leadership change:
            # skim to the tag section (a few microseconds) and relay the bytes untouched when it is empty.
            view = memoryview(frame)
            locate = top_level_tags_locator(response_spec(key), version)
            if view[locate(view, response_body_offset(key, version, view))] == 0:
                return Rewritten([len(frame).to_bytes(4, "big"), frame], len(frame) + 4, [], changed=False)
        if key == METADATA and not self.throttles.active:
            return self._metadata_head(version, frame)
        if key == API_VERSIONS_KEY and len(frame) >= 6 and _I16.unpack_from(frame, 4)[0] == UNSUPPORTED_VERSION:
            # A server that does not support the request's ApiVersions version answers in v0; clients check
            # the error code before choosing the layout (ApiVersionsResponse.parse, KIP-511).
            version = 0
        header, body = decode_response(key, version, frame)
        req.rewrite(body)
        out = encode_response(key, version, header, body)
        return Rewritten([len(out).to_bytes(4, "big"), out], len(out) + 4, _error_codes(body))

    def _metadata_head(self, version: int, frame: bytes | bytearray) -> Rewritten:
        """Metadata: the broker list (the only addresses) comes first in every version, before the topics,
        which can be most of a large cluster's response (10,000 partitions: ~260 KB, ~190 ms to decode and
        re-encode whole). Only the head up to Brokers is decoded and rewritten; the rest is relayed as bytes.
        (When throttles are active the whole response is decoded instead: they learn topic ids from it.)"""
        view = memoryview(frame)
        start = response_body_offset(METADATA, version, view)
        codec = head_codec(response_spec(METADATA), version, "brokers")
        stream = io.BytesIO(view[start:])
        head = codec.decode_from(stream)
        self.router.rewrite_metadata(head)
        new_head = codec.encode(head)
        rest = view[start + stream.tell() :]
        size = start + len(new_head) + len(rest)
        return Rewritten([size.to_bytes(4, "big"), view[:start], new_head, rest], size + 4, [])

    @staticmethod
    def _api_versions(body: Message) -> None:
        body.api_keys = versions.intersect(body).api_keys

    def _fetch_response(self, req: Request, frame: bytes | bytearray, reissue_ok: bool = False) -> Rewritten:
        """A collected Fetch response (a budget applies): the zero-copy fast path, NodeEndpoints rewritten,
        the budget enforced, re-encoded as scatter buffers (record bytes stay slices of ``frame``)."""
        corr, header_tags, view = fetch_fast.decode_frame(memoryview(frame), req.header.api_version)
        if req.session is not None:
            # KIP-227 terminate: the upstream answered Sluice's session request; the client gets every
            # partition it asked for, or those its own session must include (policies below then edit that
            # response as usual).
            sessions = req.session.sessions
            was_open, was_cached = sessions.session_open, len(sessions.states)
            metrics.UPSTREAM_FETCH_BYTES.labels("response").inc(len(frame) + 4)
            req.session_upstream_bytes = (req.session_upstream_bytes or 0) + len(frame) + 4
            built = build_client_response(view, req.session)
            if built is None:
                metrics.FETCH_SESSION_RETRIES.inc()
                again = replan(req.session) if reissue_ok else None
                if again is not None:
                    req.frame, req.session = again
                    metrics.UPSTREAM_FETCH_FULL.inc()
                    _session_gauges(sessions, was_open, was_cached)
                    return Rewritten([], 0, [], reissue=req.frame)
                built = retriable_answer(view, req.session)
            if req.session.decision is not None:
                self._count_session_stats()
            _session_gauges(sessions, was_open, was_cached)
            view = built
        errors = [p.error_code for _, p in view.partitions() if p.error_code]
        if view.error_code:
            errors.insert(0, view.error_code)
        changed = bool(view.node_endpoints) or req.session is not None
        self.router.rewrite_node_endpoints(view)
        mute = 0.0
        if req.throttle is not None:  # before the budget, so the budget goes to partitions that may send
            throttled = throttle_enforce(view, req.throttle, self.throttles, self.throttle_state,
                                         self.topic_names.get, self.clock())
            if throttled.left_out:
                metrics.THROTTLE_LEFT_OUT_LEADER.inc(throttled.left_out)
            if self.throttles.leader_rate:
                req.throttle_target_bps, req.throttled_bytes = self.throttles.leader_rate, throttled.leader_bytes
            changed = changed or throttled.changed
            mute = throttled.mute_s
        if req.budget is not None:
            outcome = enforce(view, req.budget, req.fairness)
            metrics.observe_size_limit(outcome.trimmed_bytes, outcome.deferred_partitions)
            changed = changed or outcome.limited
        # record bytes per partition, for the access log; partitions with none count too: the analytics'
        # empty fetches and partitions without bytes are how starvation shows (analytics/aggregates.py)
        req.partitions = [(self._topic_label(t), p.partition_index, p.records_size) for t, p in view.partitions()]
        if not changed:
            return Rewritten([len(frame).to_bytes(4, "big"), frame], len(frame) + 4, errors, changed=False,
                             mute_s=mute)
        buffers, size = view.encode_frame(corr, header_tags)
        if req.session is not None and size > len(frame) + 4:
            metrics.UPSTREAM_FETCH_BYTES_SAVED.labels("response").inc(size - len(frame) - 4)
        return Rewritten(buffers, size, errors, mute_s=mute)

    def _topic_label(self, topic: Any) -> str:
        """A Fetch response topic's name; from v13 responses name topics by id only: the name learnt from
        Metadata, else the id as Kafka prints it (base64url, no padding)."""
        if topic.topic:
            return str(topic.topic)
        tid = bytes(topic.topic_id)
        return self.topic_names.get(tid) or base64.urlsafe_b64encode(tid).rstrip(b"=").decode()

    def fetch_streamer(self, req: Request, size: int) -> FetchStreamer:
        """Fetch v16+ responses stream through (see proxy/wire/fetch_stream.py): only their final tag
        section, where KIP-951 NodeEndpoints lives, is held back and rewritten. ``size``: the body's bytes."""
        return FetchStreamer(req.header.api_version, size, self.router.rewrite_nodes)


def _session_gauges(sessions: UpstreamSessions, was_open: bool, was_cached: int, closing: bool = False) -> None:
    """Move the upstream-session gauges by what one response (or a closing connection) changed."""
    is_open = sessions.session_open and not closing
    if is_open != was_open:
        metrics.UPSTREAM_FETCH_SESSIONS_OPEN.inc(1 if is_open else -1)
    cached = 0 if closing else len(sessions.states)
    if cached != was_cached:
        metrics.UPSTREAM_FETCH_PARTITIONS_CACHED.inc(cached - was_cached)


def _error_codes(msg: Message) -> list[int]:
    """Every non-zero error code in a decoded response (for the access log)."""
    out: list[int] = []

    def walk(m: Message) -> None:
        for k, v in m.fields().items():
            if k == "error_code" and v:
                out.append(v)
            elif isinstance(v, Message):
                walk(v)
            elif isinstance(v, list) and v and isinstance(v[0], Message):
                for x in v:
                    walk(x)

    walk(msg)
    return out
