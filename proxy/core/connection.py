"""A client connection and its upstream connection as a sans-IO state machine, h11-style: bytes and events in,
bytes and actions out. :mod:`proxy.io` owns the sockets and only moves bytes between them and this core.

Events in (called by the server): :meth:`Connection.client_data`, :meth:`~Connection.upstream_ready`,
:meth:`~Connection.upstream_data` (or :meth:`~Connection.upstream_read_into`, below), the four write-buffer
signals (``*_write_paused`` / ``*_write_resumed``), :meth:`~Connection.client_lost`,
:meth:`~Connection.upstream_lost`, :meth:`~Connection.upstream_failed`.
Actions out: the calls it makes on its :class:`Port` (send to either side, pause or resume reading either side,
close, start a timer). Everything in between is here:

- **Framing.** Requests are framed from a ``bytearray``; the 4-byte length is checked before anything is
  allocated: negative -> ``malformed``, over ``limits.max_frame_bytes`` (like the broker's
  ``socket.request.max.bytes``) -> ``too_large``. A frame still incomplete ``limits.request_timeout_s`` after
  its first byte (counted while Sluice reads) -> ``request_timeout``: a client cannot hold a connection and its
  buffer open by trickling a frame (Slowloris). Each rejection closes this connection only, with a log event and
  ``sluice_frames_rejected_total{reason}``. A policy whose hook raises closes this connection too
  (:class:`~proxy.core.exchange.PolicyFailed`: one ``policy_failed`` event, ``sluice_policy_errors_total``).
- **Order.** Kafka answers requests on a connection in order (and matches them by correlation id), so
  responses go to the client strictly in request order: answers Sluice makes itself wait for their turn, and
  an upstream response must belong to the oldest request awaiting one.
- **Waits.** A request may wait, in order (the ones behind it wait too and the client is not read meanwhile),
  for topic names Sluice must look up (:mod:`proxy.core.topic_names`), for response memory
  (:mod:`proxy.core.memory`: the bound a policy's section sets) and for work a policy asked of Sluice itself
  (``Exchange.pending``, e.g. :mod:`proxy.core.broker_calls`).
- **The chain.** A request no policy reads under the settings in force, with nothing waiting ahead of it, is
  sent as it came (a :class:`~proxy.core.exchange.Relayed`: no Exchange, no policy called) and its response
  relayed as bytes when it comes whole in one read and its one reader's check holds; otherwise it becomes an
  Exchange when its response starts. Every other request goes through the policies (:mod:`proxy.core.chain`)
  once its waits are over; a response is relayed as bytes (streamed chunk by chunk as it arrives, never
  buffered whole), walked as it streams (``Exchange.streamer``; or for the policies that asked to collect a Fetch
  response and offer to read it so, :meth:`~proxy.core.chain.Chain.stream_fetch`), or collected whole for the
  policies (``Exchange.collect``). A collected response is read into one buffer of the size its prefix declares; while
  more than ``DIRECT_READ_MIN`` of it is still to come the port may read straight into that buffer
  (:meth:`Port.read_upstream_into`): no copy of each read, and no join of the reads at the end.
- **Effects** the policies ask for: a local answer, the memory reservation, muting the client after a response
  (Kafka's channel muting, KIP-219), sending a request upstream again (a session a policy keeps with the broker
  was refused; only when no other request is in flight behind it).
- **Backpressure.** When one side's write buffer passes its high-water mark, reading the other side pauses
  until it drains. Reading the client is paused for any of several reasons at once (upstream full, waiting,
  muted, upstream not yet connected); it resumes only when none is left.
- **Limits** (Kafka's, per connection): with ``limits.max_inflight_requests`` the client is not read while that
  many requests are owed a response (the broker's channel muting under ``queued.max.requests``: the client
  waits, nothing is refused), and with ``limits.idle_timeout_s`` a connection with nothing in flight and no
  bytes from the client for that long is closed (``connections.max.idle.ms``). Each is counted and logged once
  per connection when hit.
- **Bare SASL tokens** (SaslHandshake v0, before KIP-152): after a response whose exchange says so
  (``Exchange.bare_tokens``), client frames are relayed as tokens, not requests, and each upstream answer is read
  as a bare frame (a length and the token, no correlation id) until the exchange says it is over; neither is a
  request, so neither is logged or counted as one.
- **State**: explicit, as h11's: the connection's :class:`State` (connecting upstream, open, closed), what its
  head request waits for (:class:`Wait`), and the reasons reading the client is paused (:class:`Pause`).
- **Observed from outside**: the core counts bytes (tallies read at scrape time) and reports every event (a request
  completed, a frame rejected, a policy failed, the connection closed for idleness...) to its observer
  (:mod:`proxy.core.observer`), which keeps the metrics, the operational log and the access log.
"""

from __future__ import annotations

import enum
import functools
import struct
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ..metrics import RejectReason, Tally
from ..wire.errors import CodecError
from ..wire.fetch_stream import FetchStreamer
from .chain import Chain, ChainConnection
from .exchange import BareTokens, Buffer, ConnectionInfo, Exchange, PolicyFailed, Rejected, Relayed, Streamer
from .memory import HeldBytes
from .observer import ConnectionObserver
from .topic_names import TopicNames

_SIZE_CORR = struct.Struct(">ii")
_SIZE = struct.Struct(">i")


class Timer(Protocol):
    def cancel(self) -> None: ...


class Port(Protocol):
    """What the core asks of the I/O layer: the only way it acts on the world."""

    def send_client(self, buffers: Sequence[Buffer]) -> None: ...

    def send_upstream(self, buffers: Sequence[Buffer]) -> None: ...

    def pause_client(self) -> None: ...

    def resume_client(self) -> None: ...

    def pause_upstream(self) -> None: ...

    def resume_upstream(self) -> None: ...

    def close(self, abort: bool) -> None: ...

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer: ...

    def defer(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the reads already in hand (every connection's) are handled: the event loop's next
        turn. A port may call it at once; the core takes either."""

    def read_upstream_into(self, on: bool) -> None:
        """``on``: the next upstream reads may go straight into :meth:`Connection.upstream_buffer` (each reported by
        :meth:`Connection.upstream_read_into`), until this is called with False. A port may ignore it and go on
        calling :meth:`Connection.upstream_data`; the core takes either."""


#: the byte counts a connection keeps (client -> Sluice, Sluice -> upstream, upstream -> Sluice, Sluice -> client)
Tallies = tuple[Tally, Tally, Tally, Tally]

#: a collected response with at least this much still to come is read straight into its buffer (the port's
#: choice): below it, one more read of a copied chunk costs less than switching the transport's protocol twice
DIRECT_READ_MIN = 64 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """A connection's bounds ([limits]); keyword-only, so a field can never take its neighbour's setting."""

    max_frame_bytes: int = 100 * 1024 * 1024
    #: the write high water ([limits] write_high_water_bytes) also bounds what is queued for a not-yet-connected
    #: upstream: past it, the client is no longer read
    write_high_water_bytes: int = 4 * 1024 * 1024
    request_timeout_s: float = 30.0
    #: requests owed a response before the client is no longer read (0 = no bound)
    max_inflight_requests: int = 0
    #: close a connection with nothing in flight and no bytes from the client for this long (0 = never)
    idle_timeout_s: float = 0.0


class State(enum.Enum):
    """Where a connection is in its life."""

    #: the client is connected, its upstream connection is being made (requests are queued, bounded)
    CONNECTING = "connecting"
    #: both connections are up
    OPEN = "open"
    #: closed (by either side, or by Sluice): nothing more is read, written or reported
    CLOSED = "closed"


class Wait(enum.Enum):
    """What the head request (the oldest not yet sent) waits for; those behind it wait too."""

    NAMES = "names"  # topic names Sluice looks up (proxy/core/topic_names.py)
    PENDING = "pending"  # work a policy asked of Sluice itself (Exchange.pending)
    MEMORY = "memory"  # response memory (proxy/core/memory.py)


class Pause(enum.Enum):
    """Why the client is not read; it is read again when no reason is left."""

    UPSTREAM_FULL = "upstream_full"  # the broker reads slower than the client sends
    WAITING = "waiting"  # a request waits (Wait): the ones behind it stay unread
    MUTED = "muted"  # a policy asked for it (Exchange.mute_s: Kafka's channel muting, KIP-219)
    CONNECTING = "connecting"  # the upstream connection is not up yet and the queue is full
    INFLIGHT = "inflight"  # max_inflight_requests are owed a response (Kafka's channel muting)
    DRAINING = "draining"  # shutdown: for good (see Connection.drain)


_CONNECTING, _OPEN, _CLOSED = State.CONNECTING, State.OPEN, State.CLOSED


class Connection:
    """One client connection (to one of Sluice's listeners) paired with one upstream connection."""

    def __init__(self, info: ConnectionInfo, chain: Chain, port: Port, *, memory: HeldBytes, names: TopicNames,
                 observer: ConnectionObserver, tallies: Tallies, clock: Callable[[], float],
                 limits: Limits = Limits()) -> None:
        self.info = info
        self.chain = chain
        self.port = port
        self.memory = memory
        self.names = names
        self.observer = observer
        self.clock = clock
        self.limits = limits
        self.state = _CONNECTING
        # the byte counts, bound once and added to in place (metrics.Tally: read at scrape time): each is on every
        # read's path, where a call more per read is measurable (docs/PERFORMANCE.md)
        self._bytes_in, self._bytes_up, self._bytes_back, self._bytes_out = tallies
        try:
            self.policies = chain.connect(info)
        except PolicyFailed as failure:
            # closed as soon as the connection is set up (the server is still making it)
            self.policies = ChainConnection(info, {})
            port.call_later(0, functools.partial(self._policy_failed, failure))
        self.client_id: str | None = None
        self.upstream_name = ""
        # requests
        self._buf = bytearray()
        self._partial_since: float | None = None  # when the incomplete frame in _buf started (while read)
        self._partial_timer: Timer | None = None
        #: classified, not yet dispatched: the head may wait for topic names or memory, the rest behind it
        self._pending: deque[Exchange] = deque()
        self._head_ran = False  # the policies ran on _pending[0]
        self._waiting: Wait | None = None  # what _pending[0] waits for
        #: dispatched, owed a response, in client order
        self.inflight: deque[Exchange | Relayed] = deque()
        #: sent upstream, response not started, in send order
        self.awaiting: deque[Exchange | Relayed] = deque()
        self._queued: list[Buffer] = []
        self._queued_bytes = 0
        # responses
        self._hdr = bytearray()  # size prefix + correlation id of the response being read, across reads
        #: a relayed response's header not yet written (it goes with the body's first bytes), and its offset in the
        #: read being handled when it lies there (-1: it came across reads)
        self._head: Buffer | None = None
        self._head_at = -1
        self._resp: Exchange | Relayed | None = None
        self._left = 0
        self._size = 0
        #: a collected response's frame (correlation id and body), allocated at its size prefix; all but its last
        #: ``_left`` bytes are filled, from copies of the reads or by reads straight into it (``_direct``: the port
        #: was told so)
        self._collect: bytearray | None = None
        self._direct = False
        self._stream: Streamer | None = None
        #: a collected response read whole, its decoding put off (Port.defer) so that the responses the other
        #: connections have already read are written first; this connection's bytes read after it wait in
        #: ``_backlog`` until it is written
        self._decoding: tuple[Exchange, memoryview] | None = None
        self._backlog: bytes | None = None
        # flow control
        self._client_pauses: set[Pause] = set()
        self._upstream_paused = False
        self._client_full = False
        self._release_on_drain = 0
        self._muted_until = 0.0
        self._mute_timer: Timer | None = None
        # bare SASL tokens (SaslHandshake v0): the exchange, tokens owed an answer, the answer being read
        self._bare: BareTokens | None = None
        self._bare_owed = 0
        self._bare_token: bytearray | None = None
        self._bare_left = 0
        # limits
        self._framing = False
        self._inflight_hit = False  # logged once per connection
        self._last_active = clock()
        self._idle_timer: Timer | None = None
        if limits.idle_timeout_s:
            self._idle_timer = port.call_later(limits.idle_timeout_s, self._idle_check)

    def drain(self) -> None:
        """Shutdown: no request is taken after the ones already read; those still get their responses. Without
        this a client that always has a request in flight (a follower's replica fetcher through a sidecar, a
        consumer's next long poll) keeps the connection busy until the drain timeout, and its last request is
        abandoned anyway. Reading is paused for good; bytes already buffered are left unread, as a broker's
        SocketServer leaves what it has not read when it shuts down (the client resends on its next connection)."""
        self._pause_client(Pause.DRAINING)

    @property
    def closed(self) -> bool:
        return self.state is _CLOSED

    @property
    def pending_requests(self) -> tuple[Exchange, ...]:
        """Requests read and not yet sent or answered (what :attr:`queued` counts)."""
        return tuple(self._pending)

    @property
    def queued(self) -> int:
        """Requests read and not yet sent or answered: the head one waiting (Wait), the others behind it."""
        return len(self._pending)

    @property
    def busy(self) -> bool:
        """Requests are owed a response (shutdown drains these)."""
        return (bool(self.inflight) or bool(self._pending)) and self.state is not _CLOSED

    # ============================================================================================ requests

    def client_data(self, data: bytes) -> None:
        if self.state is _CLOSED:
            return
        n = len(data)
        self._bytes_in.value += n
        # the read's time is each of its requests' start (the last byte read): one clock call per read
        clock = self.clock  # an attribute, not a method: called as ``self.clock()`` its look-up is not specialised
        now = self._last_active = clock()
        if self._buf or self._framing or type(data) is not bytes:
            self._buf += data
            self._frame(None, now)
        elif n >= 4 and not self._client_pauses and self._bare is None and \
                0 <= _SIZE.unpack_from(data)[0] == n - 4 <= self.limits.max_frame_bytes:
            # the read is one whole request (nearly always): nothing to frame, and sent as read if relayed; one of
            # an API version relayed unread is read by the chain's shortest path (Chain.relay)
            relayed = None if self._pending else self.chain.relay(data, now)
            if relayed is None:
                self._on_request(data[4:], now, data)
            else:
                self._relay(relayed, data)
        else:
            self._frame(data, now)  # nothing buffered: framed from the read itself, one copy less

    def _frame(self, data: bytes | None = None, now: float | None = None) -> None:
        """Take the complete request frames out of ``data`` (a read, when nothing was buffered before it) or the
        buffer (up to the in-flight bound), each started at ``now`` (the read's time; None: when it is taken).
        Not re-entered: a response completed while a request is handled (Produce acks=0) may lift the bound, and
        the loop running already goes on with the next frame."""
        if self._framing:
            return
        self._framing = True
        try:
            buf: bytes | bytearray = self._buf if data is None else data
            off = 0
            max_frame = self.limits.max_frame_bytes
            while len(buf) - off >= 4:
                pauses = self._client_pauses
                if pauses and (Pause.INFLIGHT in pauses or Pause.DRAINING in pauses):
                    break  # the rest waits in the buffer until a response goes out (draining: for good)
                size = _SIZE.unpack_from(buf, off)[0]
                if size < 0:
                    self._reject("malformed", f"request frame declares a negative length ({size})")
                    return
                if size > max_frame:
                    self._reject("too_large", f"request frame declares {size} bytes (limit {max_frame})")
                    return
                end = off + 4 + size
                if len(buf) < end:
                    break
                if data is None:
                    with memoryview(buf) as view:
                        frame = bytes(view[off + 4 : end])
                else:
                    frame = data[off + 4 : end]
                off = end
                if self._bare is not None:
                    self._client_token(frame)
                    continue
                # sent with a size prefix made for it: only client_data's one-whole-request read is sent as read
                self._on_request(frame, now, None)
                if self.state is _CLOSED:
                    return
            if data is not None:
                if off < len(data):
                    self._buf += memoryview(data)[off:]  # the start of a frame: buffered until the rest comes
            elif off:
                del self._buf[:off]
            if off:
                self._partial_since = None  # a frame ended: what is left started in this chunk, timed from now
            if self._buf:
                self._watch_partial()
        finally:
            self._framing = False

    def _watch_partial(self) -> None:
        """Start timing the incomplete frame left in the buffer (Slowloris guard)."""
        if self._partial_since is None:
            self._partial_since = self.clock()
            if self._partial_timer is None:
                self._partial_timer = self.port.call_later(self.limits.request_timeout_s, self._partial_expired)

    def _partial_expired(self) -> None:
        self._partial_timer = None
        if self.state is _CLOSED or self._partial_since is None:
            return
        now = self.clock()
        if self._client_pauses:
            # Sluice is not reading: the frame's slowness is not the client's; time it afresh once reading
            self._partial_since = now
        else:
            age = now - self._partial_since
            if age >= self.limits.request_timeout_s:
                self._reject("request_timeout", f"a request frame stayed incomplete for {age:.1f} s "
                                                f"({len(self._buf)} bytes received)")
                return
        left = self.limits.request_timeout_s - (now - self._partial_since)
        self._partial_timer = self.port.call_later(max(left, 0.001), self._partial_expired)

    def _on_request(self, frame: bytes, now: float | None, wire: bytes | None) -> None:
        """A request ``frame`` (no size prefix; ``wire``: with it, as read, when the read held nothing else)."""
        first = not self._pending  # nothing waits ahead of it
        try:
            ex = self.chain.classify(frame, self.clock() if now is None else now, self.info, first)
        except (Rejected, PolicyFailed) as e:
            self._refuse(e)
            return
        if isinstance(ex, Relayed):
            self._relay(ex, wire)
            return
        self.client_id = ex.header.client_id
        self._pending.append(ex)
        limit = self.limits.max_inflight_requests
        if limit and len(self.inflight) + len(self._pending) >= limit:
            self._inflight_full()
        if first:  # it is the one pending: nothing ahead of it to wait for
            self._pump()

    def _relay(self, r: Relayed, wire: bytes | None) -> None:
        """A request no policy reads (Chain.relay, Chain.classify: only with nothing pending ahead of it), sent now
        as it came (``wire``: as read, one buffer, no prefix made)."""
        self.client_id = r.header.client_id
        self._write_upstream(r.frame, wire)
        if r.expects_response:
            self.inflight.append(r)
            self.awaiting.append(r)
        else:
            self._complete(r)
        limit = self.limits.max_inflight_requests
        if limit and len(self.inflight) >= limit:
            self._inflight_full()

    def _inflight_full(self) -> None:
        """Kafka's channel muting: a connection with ``max_inflight_requests`` owed a response is not read until
        one goes out; the client's further requests wait in its socket and Sluice's buffer, none is refused."""
        self.observer.inflight_limited(self.info, self.client_id, self.limits.max_inflight_requests,
                                       not self._inflight_hit)
        self._inflight_hit = True
        self._pause_client(Pause.INFLIGHT)

    def _inflight_below(self) -> None:
        if Pause.INFLIGHT in self._client_pauses and \
                len(self.inflight) + len(self._pending) < self.limits.max_inflight_requests:
            self._resume_client(Pause.INFLIGHT)
            if self.state is not _CLOSED and Pause.INFLIGHT not in self._client_pauses:
                self._frame()  # requests already read and buffered go on now

    def _idle_check(self) -> None:
        """Kafka's connections.max.idle.ms: nothing in flight, no client bytes for idle_timeout_s -> closed."""
        self._idle_timer = None
        if self.state is _CLOSED:
            return
        idle = self.limits.idle_timeout_s
        now = self.clock()
        quiet = now - self._last_active
        if self.busy:
            left = idle
        elif quiet >= idle:
            self.observer.idle_closed(self.info, self.client_id, quiet)
            self.close()
            return
        else:
            left = idle - quiet
        self._idle_timer = self.port.call_later(max(left, 0.001), self._idle_check)

    def _client_token(self, token: bytes) -> None:
        """A bare SASL token (SaslHandshake v0): relayed as it came; its answer is owed as a bare frame."""
        assert self._bare is not None
        self._bare.client_token(token)
        self._bare_owed += 1
        self._bytes_up.value += len(token) + 4
        buffers = (len(token).to_bytes(4, "big"), token)
        if self.state is _OPEN:
            self.port.send_upstream(buffers)
        else:
            self._queued.extend(buffers)
            self._queued_bytes += len(token) + 4

    def _pump(self) -> None:
        """Take pending requests through their waits and the chain, in order, and dispatch them."""
        pending = self._pending
        while pending and self.state is not _CLOSED and self._waiting is None:
            ex = pending[0]
            if ex.missing_names:
                # names learnt (or given up on) while it waited behind another request: not waited for again
                ex.missing_names = self.names.missing(ex.missing_names)
            if ex.missing_names:
                self._wait(Wait.NAMES)
                self.names.wait(ex.missing_names, self._names_settled)
                return
            if not self._head_ran:
                self._head_ran = True
                try:
                    self.chain.on_request(self.policies, ex)
                except (Rejected, PolicyFailed) as e:
                    self._refuse(e)
                    return
            if ex.pending is not None:
                # a policy asked for work of Sluice's own first: wait for it, then the chain resumes that policy
                self._head_ran = False
                if not ex.pending.settled:
                    self._wait(Wait.PENDING)
                    ex.pending.on_settled(self._pending_settled)
                    return
                continue
            if ex.reserve and not ex.held and ex.answer is None:
                if not self.memory.reserve(ex.reserve, self._memory_granted):
                    self.observer.memory_wait(self.info)
                    self._wait(Wait.MEMORY)
                    return
                ex.held = ex.reserve
            pending.popleft()
            self._head_ran = False
            self._dispatch(ex)
        if not pending:
            self._resume_client(Pause.WAITING)

    def _wait(self, what: Wait) -> None:
        self._waiting = what
        self._pause_client(Pause.WAITING)

    def _names_settled(self) -> None:
        if self.state is _CLOSED or self._waiting is not Wait.NAMES:
            return
        self._pending[0].missing_names = frozenset()
        self._waiting = None
        self._resume_pump()

    def _pending_settled(self) -> None:
        if self.state is _CLOSED or self._waiting is not Wait.PENDING:
            return
        self._waiting = None
        self._resume_pump()

    def _memory_granted(self) -> None:
        if self.state is _CLOSED or self._waiting is not Wait.MEMORY:  # granted as the connection went away
            self.memory.release(self._pending[0].reserve if self._pending else 0)
            return
        ex = self._pending[0]
        ex.held = ex.reserve
        self._waiting = None
        self._resume_pump()

    def _resume_pump(self) -> None:
        """:meth:`_pump` after a wait, called back by what every connection shares (the topic names, Sluice's own
        work, the memory bound), which calls its other waiters after this one. A bug of Sluice's own in it closes
        this connection and is raised on a turn of its own (the loop logs it), never into that caller: raised
        there, it would leave this client waiting for its request timeout and the other waiters uncalled."""
        try:
            self._pump()
        except Exception as e:
            self.port.call_later(0, functools.partial(_raise, e))
            self.close(abort=True)

    def _dispatch(self, ex: Exchange) -> None:
        if ex.answer is not None:
            self.inflight.append(ex)
            self._flush_answers()
            return
        self._send_upstream(ex)
        if ex.expects_response:
            self.inflight.append(ex)
            self.awaiting.append(ex)
        else:
            self._complete(ex)
            if ex.mute_s > 0:
                self._mute(ex.mute_s)  # no response to follow (Produce acks=0): held from now (KIP-219)

    def _send_upstream(self, ex: Exchange) -> None:
        ex.attempts += 1
        ex.upstream_sent += len(ex.frame) + 4  # a request sent again may differ (a new full session request)
        self._write_upstream(ex.frame)

    def _write_upstream(self, frame: bytes, wire: bytes | None = None) -> None:
        """A request frame (no size prefix; ``wire``: the same with its size prefix, when the client's read was that)
        to the broker, or queued until the upstream connection is up."""
        size = len(frame)
        buffers: tuple[bytes, ...] = (size.to_bytes(4, "big"), frame) if wire is None else (wire,)
        self._bytes_up.value += size + 4
        if self.state is _OPEN:
            self.port.send_upstream(buffers)
            return
        self._queued.extend(buffers)
        self._queued_bytes += size + 4
        if self._queued_bytes > self.limits.write_high_water_bytes:
            self._pause_client(Pause.CONNECTING)  # backpressure while the upstream connect is still in flight

    def upstream_ready(self, name: str) -> None:
        """The upstream connection is up (``name``: host:port, for the logs)."""
        if self.state is _CLOSED:
            return
        self.upstream_name = name
        self.state = _OPEN
        queued, self._queued, self._queued_bytes = self._queued, [], 0
        if queued:
            self.port.send_upstream(queued)
        self._resume_client(Pause.CONNECTING)

    def upstream_failed(self, detail: str) -> None:
        """The upstream connection could not be made (the server logs the cause, rate-limited)."""
        self.close()

    # =========================================================================================== responses

    def upstream_data(self, data: bytes) -> None:
        if self.state is _CLOSED:
            return
        end = len(data)
        self._bytes_back.value += end
        if self._decoding is not None:  # read behind the put-off response: it waits for it
            self._backlog = data if self._backlog is None else self._backlog + data
            return
        self._responses(data, end)

    def _responses(self, data: bytes, end: int) -> None:
        """Relay, walk or collect the responses (and bare SASL tokens) in ``data``, one read of ``end`` bytes."""
        pos = 0
        if self._resp is None and not self._bare_owed and not self._hdr and self.awaiting and end >= 8:
            first = self.awaiting[0]
            if type(first) is Relayed and first.streamer is None and self._relayed(data, 0, end, first):
                # the read starts with a relayed response, whole (nearly always all of it): written, done
                pos = 4 + self._size
                if pos == end or self.state is _CLOSED:
                    return
        view = memoryview(data)
        while pos < end:
            if self._decoding is not None:  # a collected response's decoding was put off: the rest waits for it
                self._backlog = data[pos:]
                return
            if self._bare_owed and self._resp is None:
                pos = self._server_token(view, pos, end)
                if self.state is _CLOSED:
                    return
                continue
            if self._resp is None:
                if not self._hdr and end - pos >= 8:
                    # the whole header in this read (nearly always): read in place, relayed with the body's first
                    # bytes in one write (one send, one packet for a small response) from offset _head_at
                    self._head_at = pos
                    if self.awaiting:
                        first = self.awaiting[0]
                        if isinstance(first, Relayed):
                            if first.streamer is None and self._relayed(data, pos, end, first):
                                pos += 4 + self._size
                                if self.state is _CLOSED:
                                    return
                                continue
                        elif first.relay_if is not None:
                            self._relay_if(view, pos, end, first)
                    pos += 8
                    if not self._start_response(view[pos - 8 : pos]):
                        return
                    continue
                need = 8 - len(self._hdr)
                self._hdr += view[pos : pos + need]
                pos += min(need, end - pos)
                self._head_at = -1
                if len(self._hdr) < 8 or not self._start_response(self._hdr):
                    return
                continue
            take = min(self._left, end - pos)
            chunk = view[pos : pos + take]
            pos += take
            self._left -= take
            head, self._head = self._head, None
            if self._stream is not None:
                try:
                    out = self._stream.feed(chunk)
                except CodecError as e:
                    self._fail(f"undecodable Fetch response: {e}")
                    return
                self.port.send_client(out if head is None else [head, *out])
            elif self._collect is not None:
                filled = len(self._collect) - self._left  # _left already counts this chunk
                self._collect[filled - take : filled] = chunk
            elif head is None:
                self.port.send_client((chunk,))
            elif self._head_at >= 0:
                self.port.send_client((view[self._head_at : pos],))  # header and body adjacent in this read
            else:
                self.port.send_client((head, chunk))
            self._head_at = -1
            if self._left == 0:
                self._end_response()
                if self.state is _CLOSED:
                    return
        if self._head is not None:  # a header that ended this read: its body comes in a later one
            head, self._head, self._head_at = self._head, None, -1
            self.port.send_client((bytes(head),))
        elif self._collect is not None and not self._direct and self._left >= DIRECT_READ_MIN:
            self._direct = True
            self.port.read_upstream_into(True)

    def upstream_buffer(self) -> memoryview:
        """Where the port reads upstream bytes straight into while :meth:`Port.read_upstream_into` is on: what is
        still to come of the collected response (so a read never takes bytes of the next one)."""
        if self._collect is None:  # closed while the port was reading: the bytes go nowhere
            return memoryview(bytearray(DIRECT_READ_MIN))
        return memoryview(self._collect)[len(self._collect) - self._left :]

    def upstream_read_into(self, n: int) -> None:
        """``n`` bytes were read into :meth:`upstream_buffer`."""
        if self.state is _CLOSED:
            return
        self._bytes_back.value += n
        self._left -= n
        if self._left == 0:
            self._end_response()

    def _relayed(self, data: bytes, pos: int, end: int, r: Relayed) -> bool:
        """The response to a relayed request that is not walked as it streams, size prefix at ``pos``: when it is
        whole in this read, answers its request and its check (if any) holds, it is written as it came, or as its
        rewrite (if any) makes it (True, ``_size`` its size as read). Otherwise (False) :meth:`_start_response`
        reads it as any other response (making the request an Exchange if its check is false or its rewrite gives
        None), and fails the connection if it breaks the protocol."""
        size, corr = _SIZE_CORR.unpack_from(data, pos)
        if corr != r.header.correlation_id or not self._unread(data, pos, size, end, r.check):
            return False
        rewrite = r.rewrite
        if rewrite is None:
            # the read is this one response (nearly always): written as read, no view made of it
            out: tuple[Buffer, ...] = ((data,) if pos == 0 and size + 4 == end and type(data) is bytes
                                       else (memoryview(data)[pos : pos + 4 + size],))
            r.upstream_bytes = r.client_bytes = size + 4
        else:
            given = data[pos + 4 : pos + 4 + size]
            try:
                frame = rewrite(given)
            except CodecError:
                return False  # malformed: the chain's decode fails the connection there, as for any response
            if frame is None:
                return False
            if frame is not given:
                self.observer.stream_rewritten(r.api)
            out = (len(frame).to_bytes(4, "big"), frame)
            r.upstream_bytes, r.client_bytes = size + 4, len(frame) + 4
        self.awaiting.popleft()
        self.inflight.popleft()  # r: a relayed request is owed its response in order, as it was sent
        self.port.send_client(out)
        self._size = size
        self._complete(r)
        if self.inflight and self.inflight[0].answer is not None:
            self._flush_answers()
        return True

    def _relay_if(self, view: memoryview, pos: int, end: int, ex: Exchange) -> None:
        """The next response (size prefix at ``pos``) is to be collected only if ``Exchange.relay_if`` says it
        holds something to read: when it is whole in this read and holds nothing, it is relayed as bytes instead.
        One that is malformed is collected, and the chain's decode fails the connection as before."""
        if self._unread(view, pos, _SIZE.unpack_from(view, pos)[0], end, ex.relay_if):
            ex.collect = False

    def _unread(self, buf: Buffer, pos: int, size: int, end: int, check: Callable[[Buffer], bool] | None) -> bool:
        """Whether the response whose size prefix (``size``) is at ``pos`` of the read ``buf`` is whole in it,
        within the frame limit, and ``check`` (if any) holds for it: nothing in it is to be read. Else it is read as
        any other (one that is malformed, or that the check finds malformed, fails the connection there). The check
        reads a copy when ``buf`` is the read's bytes: a small response's bytes index faster than a view's."""
        if not 4 <= size <= end - pos - 4 or size > self.limits.max_frame_bytes:
            return False
        if check is not None:
            try:
                return check(buf[pos + 4 : pos + 4 + size])
            except CodecError:
                return False
        return True

    def _server_token(self, view: memoryview, pos: int, end: int) -> int:
        """Read (part of) a bare SASL answer from ``view[pos:end]``; relay it whole; return the new position."""
        if self._bare_token is None:
            need = 4 - len(self._hdr)
            self._hdr += view[pos : pos + need]
            pos += min(need, end - pos)
            if len(self._hdr) < 4:
                return pos
            size = int.from_bytes(self._hdr[:4], "big", signed=True)
            self._hdr.clear()
            if size < 0 or size > self.limits.max_frame_bytes:
                self._fail(f"bare SASL token frame declares {size} bytes")
                return end
            self._bare_token, self._bare_left = bytearray(), size
        take = min(self._bare_left, end - pos)
        self._bare_token += view[pos : pos + take]
        self._bare_left -= take
        pos += take
        if self._bare_left == 0:
            token, self._bare_token = bytes(self._bare_token), None
            self._bare_owed -= 1
            self.port.send_client((len(token).to_bytes(4, "big"), token))
            self._bytes_out.value += len(token) + 4
            if self._bare is not None and self._bare.server_token(token):
                self._bare = None  # the exchange is over: Kafka requests from here on
                if self._buf:
                    self._frame()
        return pos

    def _start_response(self, hdr: Buffer) -> bool:
        """A response's size and correlation id (``hdr``: 8 bytes) are read: check them against the oldest request
        awaiting one and start relaying, walking or collecting its body."""
        size, corr = _SIZE_CORR.unpack(hdr)
        if not self.awaiting:
            self._fail(f"unsolicited response (correlation id {corr})")
            return False
        ex = self.awaiting.popleft()
        if isinstance(ex, Relayed) and (ex.check is not None or ex.rewrite is not None):
            # its response is to be read after all (Relayed: not whole in one read, or its check false, or its
            # rewrite gave None): from here on an Exchange like any other, its policy reading it
            assert self.inflight[0] is ex
            try:
                ex = self.inflight[0] = self.chain.exchange(self.policies, ex)
            except (Rejected, PolicyFailed) as e:
                self._refuse(e)
                return False
        max_frame = self.limits.max_frame_bytes
        if size < 4 or size > max_frame:
            self._fail(f"response frame declares {size} bytes (limit {max_frame})")
            return False
        if corr != ex.header.correlation_id:
            self._fail(f"response correlation id {corr} does not match request {ex.header.correlation_id}")
            return False
        self._resp, self._size, self._left = ex, size, size - 4
        ex.upstream_bytes += size + 4
        if ex.held and size != ex.held:
            assert isinstance(ex, Exchange)  # a relayed request holds none
            self.memory.adjust(size - ex.held)  # the real size (KIP-74's first batch may exceed max_bytes)
            ex.held = size
        stream: Streamer | None = None
        if ex.collect:
            assert isinstance(ex, Exchange)  # a relayed request's response is never collected
            try:
                stream = self.chain.stream_fetch(self.policies, ex, size)
            except PolicyFailed as failure:
                self._policy_failed(failure)
                return False
        if stream is None and ex.collect:
            self._collect = bytearray(size)
            self._collect[:4] = hdr[4:]
        else:
            # Kafka answers in order and nothing is held back: this response's request is the client's oldest.
            assert self.inflight and self.inflight[0] is ex
            if stream is None and ex.streamer is not None:
                stream = ex.streamer(size - 4)
            self._stream = stream
            if self._left == 0:
                self.port.send_client((bytes(hdr),))
            else:
                # written with the body's first bytes (upstream_data): one write per read, not two
                self._head = hdr if hdr is not self._hdr else bytes(hdr)
        self._hdr.clear()
        if self._left == 0:
            self._end_response()
        return self.state is not _CLOSED  # the response may have closed the connection: read nothing after it

    def _end_response(self) -> None:
        ex, self._resp = self._resp, None
        assert ex is not None
        if self._collect is not None:
            assert isinstance(ex, Exchange)  # a relayed request's response is never collected
            if self._direct:
                self._direct = False
                self.port.read_upstream_into(False)
            # read-only, as bytes were: slices of it hash (topic ids as keys) and nothing can write through them
            self._decoding = (ex, memoryview(self._collect).toreadonly())
            self._collect = None
            # Decoding a large response takes a while: the responses other connections have already read (a
            # producer's, woken by the same append as this consumer's fetch) are written first, and this one on
            # the loop's next turn. What this connection reads meanwhile waits behind it (at most that turn's
            # reads: no pause, which would cost two system calls a response), so its responses stay in order.
            self.port.defer(self._decode)
            return
        ex.client_bytes = self._size + 4
        stream, self._stream = self._stream, None
        if stream is not None and stream.changed:
            self.observer.stream_rewritten(ex.api)
        if ex.streamed:  # walked for the policies (Chain.stream_fetch): theirs to finish
            assert isinstance(ex, Exchange) and isinstance(stream, FetchStreamer)
            try:
                self.chain.on_streamed(self.policies, ex, stream)
            except PolicyFailed as failure:
                self._policy_failed(failure)
                return
            if ex.mute_s > 0:
                self._mute(ex.mute_s)
        self._answered(ex)

    def _decode(self) -> None:
        """The put-off collected response: the chain reads it and its reply goes to the client; then the bytes
        read after it."""
        if self._decoding is None:
            return
        ex, frame = self._decoding
        if self.state is _CLOSED:
            self._decoding = self._backlog = None
            return
        ex.may_resend = not self.awaiting
        try:
            self.chain.on_response(self.policies, ex, frame)
        except CodecError as e:
            # Relaying what Sluice cannot read could hand the client a real broker address: close instead.
            self._decoding = None
            self._fail(f"undecodable {ex.api} v{ex.header.api_version} response: {e}")
            return
        except PolicyFailed as failure:
            self._decoding = None
            self._policy_failed(failure)
            return
        except BaseException:
            # A bug of Sluice's own. Raised in a read's callback it would take the transport with it (the loop's
            # fatal error), and the client would reconnect; raised here, on a turn of its own, it would leave the
            # client waiting for its request timeout. So this connection goes, and the loop logs the error.
            self._decoding = self._backlog = None
            self.close(abort=True)
            raise
        self._decoding = None
        if ex.resend:
            # Nothing went to the client, and no other request is in flight behind this one: the same
            # request goes up again and the client's response waits for its answer.
            ex.resend = False
            self._send_upstream(ex)
            self.awaiting.append(ex)
        else:
            assert ex.reply is not None
            self.port.send_client(ex.reply)
            if ex.mute_s > 0:
                self._mute(ex.mute_s)
            if ex.bare_tokens is not None:
                self._bare = ex.bare_tokens  # before the client's first token can arrive: it waits for this reply
            self._answered(ex)
        backlog, self._backlog = self._backlog, None
        if backlog is not None and self.state is not _CLOSED:
            self._responses(backlog, len(backlog))

    def _answered(self, ex: Exchange | Relayed) -> None:
        """``ex``'s response went to the client: its memory released, and the answers owed behind it written."""
        if ex.held:
            assert isinstance(ex, Exchange)
            held, ex.held = ex.held, 0
            self._release(held)
        head = self.inflight.popleft()
        assert head is ex
        self._complete(ex)
        self._flush_answers()

    def _flush_answers(self) -> None:
        """Write the answers Sluice made itself once every earlier response has gone out."""
        while self.inflight and self.inflight[0].answer is not None:
            ex = self.inflight.popleft()
            assert ex.answer is not None
            self.port.send_client((ex.answer,))
            ex.client_bytes = len(ex.answer)
            self._complete(ex)

    def _complete(self, ex: Exchange | Relayed) -> None:
        """The exchange is over (its response handed to the client, or none is owed): counted and observed."""
        clock = self.clock  # client_data says why
        now = clock()
        self._last_active = now
        self._bytes_out.value += ex.client_bytes
        self.observer.completed(self.info, ex, now - ex.started, self.upstream_name)
        if self.limits.max_inflight_requests:
            self._inflight_below()  # after the line: a request this lets through is logged after this one

    # ======================================================================================== flow control

    def _pause_client(self, reason: Pause) -> None:
        if not self._client_pauses:
            self.port.pause_client()
        self._client_pauses.add(reason)

    def _resume_client(self, reason: Pause) -> None:
        if reason not in self._client_pauses:
            return
        self._client_pauses.discard(reason)
        if not self._client_pauses and self.state is not _CLOSED:
            self.port.resume_client()
            if self._partial_since is not None:
                self._partial_since = self.clock()  # the time Sluice did not read does not count

    def upstream_write_paused(self) -> None:
        """The broker reads slower than the client sends: stop reading requests."""
        self._pause_client(Pause.UPSTREAM_FULL)

    def upstream_write_resumed(self) -> None:
        self._resume_client(Pause.UPSTREAM_FULL)

    def client_write_paused(self) -> None:
        """The client reads slower than the broker sends: stop reading responses."""
        self._client_full = True
        if not self._upstream_paused:
            self._upstream_paused = True
            self.port.pause_upstream()

    def client_write_resumed(self) -> None:
        self._client_full = False
        if self._release_on_drain:
            n, self._release_on_drain = self._release_on_drain, 0
            self.memory.release(n)
        if self._upstream_paused and self.state is not _CLOSED:
            self._upstream_paused = False
            self.port.resume_upstream()

    def _release(self, n: int) -> None:
        """A response's reserved bytes are written: they stop counting once the client's buffer drains."""
        if self._client_full:
            self._release_on_drain += n
        else:
            self.memory.release(n)

    def _mute(self, seconds: float) -> None:
        """A policy asked that the client not be read for ``seconds`` after its response (``Exchange.mute_s``), as
        Kafka mutes a client's channel (KIP-219): a client that ignores the throttle time it was told is held
        anyway, instead of asking again at once in a tight loop."""
        until = self.clock() + seconds
        if until <= self._muted_until and self._mute_timer is not None:
            return
        self._muted_until = max(self._muted_until, until)
        self._pause_client(Pause.MUTED)
        if self._mute_timer is not None:
            self._mute_timer.cancel()
        self._mute_timer = self.port.call_later(self._muted_until - self.clock(), self._unmute)

    def _unmute(self) -> None:
        self._mute_timer = None
        left = self._muted_until - self.clock()
        if left > 0.002:  # timers may fire a little early (libuv counts milliseconds)
            self._mute_timer = self.port.call_later(left, self._unmute)
            return
        self._resume_client(Pause.MUTED)

    # ============================================================================================= closing

    def _reject(self, reason: RejectReason, detail: str) -> None:
        self.observer.frame_rejected(self.info, self.client_id, reason, detail)
        self.close(abort=True)

    def _refuse(self, e: Rejected | PolicyFailed) -> None:
        """The chain refused a request (a counted rejection), or a policy failed on it: this connection closes."""
        if isinstance(e, Rejected):
            self._reject(e.reason, e.detail)
        else:
            self._policy_failed(e)

    def _policy_failed(self, failure: PolicyFailed) -> None:
        """A policy raised: this connection only is closed."""
        if self.state is _CLOSED:
            return
        self.observer.policy_failed(self.info, self.client_id, failure)
        self.close(abort=True)

    def _fail(self, detail: str) -> None:
        """The upstream broke the protocol (or Sluice could not read what it must rewrite)."""
        self.observer.upstream_error(self.info, detail)
        self.close(abort=True)

    def client_lost(self) -> None:
        if (self.inflight or self._pending) and self.state is not _CLOSED:
            self.observer.client_closed(self.info, len(self.inflight) + len(self._pending))
        self._finish_close()

    def upstream_lost(self, error: str | None = None) -> None:
        while self._decoding is not None and self.state is not _CLOSED:
            self._decode()  # read whole before the upstream went: the client gets it (and any behind it) at once
        if (self._resp is not None or self.awaiting) and self.state is not _CLOSED:
            # a response cut off, or requests that will never be answered
            ex = self._resp or self.awaiting[0]
            self.observer.upstream_closed(self.info, len(self.awaiting) + (self._resp is not None), ex.api,
                                          ex.header.api_version, error)
        self.close()

    def close(self, abort: bool = False) -> None:
        if self.state is not _CLOSED:
            self.port.close(abort)
        self._finish_close()

    def _finish_close(self) -> None:
        if self.state is _CLOSED:
            return
        self.state = _CLOSED
        self.chain.disconnect(self.policies)
        # Response memory this connection reserved, held or waits for goes back to the others.
        if self._waiting is Wait.MEMORY:
            self.memory.cancel(self._memory_granted)
        elif self._waiting is Wait.NAMES:
            self.names.cancel(self._names_settled)
        elif self._waiting is Wait.PENDING and self._pending and self._pending[0].pending is not None:
            self._pending[0].pending.cancel(self._pending_settled)
        held = sum(ex.held for ex in self.inflight) + sum(ex.held for ex in self._pending) + self._release_on_drain
        self._release_on_drain = 0  # released here: a drain after the close (a transport flushing) is not another
        if held:
            self.memory.release(held)
        for timer in (self._partial_timer, self._mute_timer, self._idle_timer):
            if timer is not None:
                timer.cancel()

    def __repr__(self) -> str:
        return f"Connection({self.info.conn_id}, {self.info.listener}, inflight={len(self.inflight)})"


__all__ = ["Connection", "Limits", "Pause", "Port", "State", "Tallies", "Timer", "Wait"]


def _raise(error: Exception) -> None:
    """Raise ``error`` (on a turn of its own: :meth:`Connection._resume_pump`)."""
    raise error
