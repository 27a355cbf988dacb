"""One request and its response as they pass through a connection: what the connection core, the chain and the
policies share about it.

An :class:`Exchange` carries no policy's own fields. What a policy remembers between a request and its response
is its per-request state, kept by the chain (:mod:`proxy.core.chain`); what it asks of the connection is one of
the generic *effects* below, which the connection core (:mod:`proxy.core.connection`) carries out:

- ``answer``: a response Sluice makes itself; the request never goes upstream;
- ``collect``: the whole response is needed (decoded, edited by policies, re-encoded if changed); otherwise it
  is relayed as bytes, or walked with ``streamer`` as it streams through;
  A Fetch response the policies asked to collect is walked as it streams instead when every one of them offers
  to read it so (:meth:`~proxy.core.policy.Policy.stream_fetch`, for the size its prefix declares): the chain
  keeps their terms in ``streamed``;
- ``relay_if``: set with ``collect`` by a policy that reads a response only for what it rarely carries (e.g.
  KIP-951 addresses): a response that arrives whole in one read and for which ``relay_if(frame)`` is true is
  relayed as bytes, unread, as if ``collect`` were not set. The chain keeps it only when that policy is the one
  policy of the request (:meth:`~proxy.core.chain.Chain.on_request`);
- ``reserve``: response bytes to reserve from the proxy-wide memory bound before the request goes upstream;
- ``mute_s``: after the response, stop reading the client for so long (KIP-73 pacing, KIP-219 muting);
- ``resend``: send ``frame`` upstream again instead of answering (fetch sessions refused upstream; a fetch whose
  records were all for someone else, fetched again further on). The asking policy puts the request to send in
  ``frame`` (:meth:`Exchange.send_again`); the policies after it (nearer the broker) take that frame as a new
  request (their ``on_request`` runs again; what they kept for the first one is dropped), so its response is
  theirs to handle before it is the asking policy's. The policies before it see one request and one response.
  Only when nothing else is in flight behind the request (``may_resend``): responses stay in order;
- ``bare_tokens``: after this response the connection carries bare SASL tokens (SaslHandshake v0, before
  KIP-152: a length and the token, no Kafka header, each answered by one such frame) until the
  :class:`BareTokens` says the exchange is over; the core relays them and hands each to it.
- ``pending``: work Sluice must do itself before the request can go on (its own requests to the cluster, e.g.
  :class:`~proxy.core.broker_calls.Work`): the connection waits for it, in order like the other waits, then
  the chain resumes the policy that asked (:meth:`~proxy.core.policy.Policy.on_resume`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from ..wire.messages import RequestHeader
from ..wire.model import Message
from ..wire.views import MessageRequest, request_view

if TYPE_CHECKING:
    from ..accesslog import Listing
    from ..metrics import RejectReason
    from ..wire.views import RequestView

Buffer = bytes | bytearray | memoryview


class Rejected(Exception):
    """A frame the connection cannot serve: the connection is closed and the rejection counted under
    ``reason`` (a value handed along, never parsed from ``detail``)."""

    def __init__(self, reason: RejectReason, detail: str) -> None:
        super().__init__(detail)
        self.reason: RejectReason = reason
        self.detail = detail


class PolicyFailed(Exception):
    """A policy's hook raised: a bug in that policy, or input it did not expect. The connection core closes that
    client connection only, with one ``policy_failed`` event and ``sluice_policy_errors_total{policy,api}``
    (:meth:`proxy.core.chain.Chain.report`); the process and every other connection carry on."""

    def __init__(self, policy: str, hook: str, ex: Exchange | None, error: Exception) -> None:
        super().__init__(f"policy {policy} failed in {hook}: {type(error).__name__}: {error}")
        self.policy = policy
        self.hook = hook
        self.api = ex.api if ex is not None else None
        self.version = ex.header.api_version if ex is not None else None
        self.error = error


@dataclass(slots=True)
class ConnectionInfo:
    """Who a client connection is, as policies may select on it (client selectors: ``client_host`` and
    ``principal`` next to each request's client.id). Set by the core and the server only; policies read it."""

    conn_id: int
    #: the listener the client connected to: "bootstrap" or "broker-N"
    listener: str
    #: the broker node the listener stands for (None: the bootstrap listener)
    node_id: int | None = None
    #: the client's address: the PROXY protocol header's source when the listener reads one, else the peer's
    client_host: str = ""
    client_port: int = 0
    #: the SASL principal's name once the broker accepted the client's authentication (policies/sasl.py), else None
    principal: str | None = None


class BareTokens(Protocol):
    """Follows a SASL exchange in bare frames (proxy/policies/sasl.py): sees each token, says when it ends."""

    def client_token(self, token: bytes) -> None: ...

    def server_token(self, token: bytes) -> bool:
        """True: the exchange is over; the next frames are Kafka requests again."""
        ...


class Pending(Protocol):
    """Work a request waits for (``Exchange.pending``): settled once, then its callbacks run."""

    @property
    def settled(self) -> bool: ...

    def on_settled(self, callback: Callable[[], None]) -> None: ...

    def cancel(self, callback: Callable[[], None]) -> None: ...


@dataclass(eq=False)
class Signal:
    """A :class:`Pending` settled by whoever made it (once; callbacks added later run at once)."""

    settled: bool = False
    _callbacks: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def on_settled(self, callback: Callable[[], None]) -> None:
        if self.settled:
            callback()
        else:
            self._callbacks.append(callback)

    def cancel(self, callback: Callable[[], None]) -> None:
        self._callbacks = [c for c in self._callbacks if c != callback]  # bound methods compare by ==

    def settle(self) -> None:
        if self.settled:
            return
        self.settled = True
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()


class Streamer(Protocol):
    """Walks a response body as it streams through (e.g. :class:`~proxy.wire.fetch_stream.FetchStreamer`)."""

    @property
    def changed(self) -> bool: ...

    def feed(self, data: Buffer) -> list[Buffer]: ...


#: access-log fields of a request no policy added any to
NO_FIELDS: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Arrival:
    """What a policy's ``arrival`` terms (:class:`Relay`) made of one request as it arrived: the access-log fields
    it adds (each declared in its ``Registration.log_fields``), whatever becomes of the request, and ``state``:
    None when the request may stay relayed unread, else the request becomes an :class:`Exchange` whose
    ``arrived`` hands this to the policy's ``on_request`` (what it earned on arrival, to act on)."""

    log: Mapping[str, Any] = field(default_factory=lambda: NO_FIELDS)
    state: Any = None


#: a policy's ``arrival`` terms: the request's header, its size (prefix included), its connection and whether a
#: response follows (not for Produce with acks=0) -> the :class:`Arrival`, or None (not this policy's business)
ArrivalTerms = Callable[[RequestHeader, int, ConnectionInfo | None, bool], Arrival | None]


@dataclass(frozen=True, slots=True)
class Relay:
    """A policy's terms for letting every request of an API version pass it unread
    (:meth:`~proxy.core.policy.Policy.unread`): it needs the response only when ``check`` is false for it (a
    response whole in one read; KIP-951 endpoints in a Produce response), or walks it with ``streamer`` as it
    streams (KIP-951 endpoints in a Fetch response), or answers a response whole in one read with what
    ``rewrite`` makes of it (the frame after its size prefix in, the one to send out; None: read it as an
    :class:`Exchange` after all), bytes in, bytes out (broker addresses in a Metadata response). With
    ``arrival``, it counts each request from its header and size as it arrives
    (:meth:`~proxy.core.chain.Chain.classify`, relayed or not), and reads it as an :class:`Exchange` only when
    that says so (a quota's Produce that earned a throttle time)."""

    check: Callable[[Buffer], bool] | None = None
    streamer: Callable[[int], Streamer] | None = None
    rewrite: Callable[[Buffer], bytes | None] | None = None
    arrival: ArrivalTerms | None = None

    @property
    def reads_response(self) -> bool:
        return self.check is not None or self.streamer is not None or self.rewrite is not None


class Relayed:
    """A request no policy reads under the settings in force (:meth:`~proxy.core.chain.Chain.classify` decides by
    its API and version, :meth:`~proxy.core.policy.Policy.unread`): sent upstream as it came and its response
    relayed as bytes, with no :class:`Exchange` and no policy called. Most of a producer's requests are these
    (Produce, and what no policy declares).

    Its one policy's terms (:class:`Relay`), if any: with ``check``, a response whole in one read for which it
    holds is relayed unread, and any other response (one it does not hold for, one split across reads, one that
    breaks the protocol) makes the request an :class:`Exchange` at that point
    (:meth:`~proxy.core.chain.Chain.exchange`), the core carrying on as for any other; with ``streamer``, the
    response is walked as it streams, as an Exchange's would be; with ``rewrite``, a response whole in one read is
    answered with what it makes of it, and any other (or one it gives None for) makes the request an Exchange as
    for ``check``. The class attributes are what an
    :class:`Exchange` may carry and a relayed request never does: the core reads both kinds alike."""

    __slots__ = ("api", "check", "client_bytes", "expects_response", "frame", "header", "log", "readers",
                 "rewrite", "started", "streamer", "upstream_bytes")

    answer: ClassVar[None] = None
    collect: ClassVar[bool] = False
    held: ClassVar[int] = 0
    error_codes: ClassVar[tuple[int, ...]] = ()
    partitions: ClassVar[None] = None
    streamed: ClassVar[tuple[Any, ...]] = ()

    def __init__(self, header: RequestHeader, api: str, frame: bytes, started: float, expects_response: bool,
                 check: Callable[[Buffer], bool] | None, streamer: Callable[[int], Streamer] | None,
                 rewrite: Callable[[Buffer], bytes | None] | None, readers: tuple[Any, ...],
                 log: Mapping[str, Any] = NO_FIELDS) -> None:
        self.header = header
        self.api = api
        self.frame = frame
        self.started = started
        self.expects_response = expects_response
        #: None: nothing reads the response; else the response is relayed unread only when check(frame) holds
        self.check = check
        self.streamer = streamer
        #: None, or the response whole in one read is answered with rewrite(frame) (unless it is None)
        self.rewrite = rewrite
        #: the policy that reads the response when ``check`` does not hold (it runs when it becomes an Exchange)
        self.readers = readers
        #: access-log fields its policies' ``arrival`` terms added (:class:`Arrival`)
        self.log = log
        #: the response's bytes as read, and as written
        self.upstream_bytes = self.client_bytes = 0

    @property
    def decoded(self) -> bool:
        """Whether its response was read (the access log's): only by its rewrite, relayed as bytes otherwise."""
        return self.rewrite is not None

    @property
    def size(self) -> int:
        """Bytes received from the client and sent upstream, size prefix included (the access log's)."""
        return len(self.frame) + 4

    upstream_sent = size


@dataclass(slots=True, eq=False)
class Exchange:
    """One request in flight on a connection, in arrival order, and what becomes of its response."""

    header: RequestHeader
    api: str
    #: bytes received from the client, size prefix included
    size: int
    #: the frame to send upstream (the client's bytes, or what the policies made of them); no size prefix
    frame: bytes
    #: when the request's last byte was read (the connection core's clock)
    started: float = 0.0
    #: False for Produce with acks=0: Kafka sends no response, so none is awaited (ProduceRequest docs)
    expects_response: bool = True
    #: effects (see the module docstring)
    answer: bytes | None = None
    collect: bool = False
    relay_if: Callable[[Buffer], bool] | None = None
    streamer: Callable[[int], Streamer] | None = None
    #: the chain's: the policies (each with its :class:`~proxy.core.policy.Streamed` terms) that read this Fetch
    #: response as it streams, in the order they asked for it (empty: it is not walked for policies)
    streamed: tuple[Any, ...] = ()
    reserve: int = 0
    mute_s: float = 0.0
    resend: bool = False
    bare_tokens: BareTokens | None = None
    pending: Pending | None = None
    #: set by the core before the response side runs: no other request is in flight behind this one, so it may
    #: go upstream again (``resend``) without breaking the order of responses
    may_resend: bool = False
    #: the request as the policies read it: decoded on first access (see :attr:`request`), None until then
    view: RequestView | None = None
    #: ``header`` was read from ``frame`` (a decode need not read it again): not once a policy replaced the frame
    peeked: bool = True
    #: topic ids the request names that Sluice cannot name yet: it waits for a lookup before the policies run
    missing_names: frozenset[bytes] = frozenset()
    #: the chain's per-request bookkeeping: the policies that apply, and each one's state for the response
    policies: tuple[Any, ...] = ()
    states: list[Any] = field(default_factory=list)
    #: response memory held for this exchange (granted reservation, then the response's real size)
    held: int = 0
    #: how many times the request went upstream, and the bytes sent (size prefixes included, every attempt)
    attempts: int = 0
    upstream_sent: int = 0
    #: for the access log: non-zero error codes of a decoded response, optional fields policies add
    #: (``log``, each declared in its policy's ``Registration.log_fields``), record bytes per partition of a
    #: decoded Fetch (topic, partition, bytes), response bytes read from upstream (every attempt) and sent to
    #: the client
    error_codes: list[int] = field(default_factory=list)
    log: dict[str, Any] = field(default_factory=dict)
    partitions: Listing | None = None
    decoded: bool = False
    upstream_bytes: int = 0
    client_bytes: int = 0
    #: the response to write, set when the chain has handled it (size prefix included, scatter buffers)
    reply: list[Buffer] | None = None
    #: the connection it arrived on (its client address and principal, for client selectors)
    info: ConnectionInfo | None = None
    #: per policy whose ``arrival`` terms asked for this Exchange (:class:`Arrival`), the state they handed on
    arrived: dict[Any, Any] | None = None

    @property
    def principal(self) -> str | None:
        return self.info.principal if self.info is not None else None

    @property
    def client_host(self) -> str:
        return self.info.client_host if self.info is not None else ""

    @property
    def client_id(self) -> str | None:
        return self.header.client_id

    def send_again(self, frame: bytes) -> None:
        """The response side's ``resend`` effect: ``frame`` (header included, no size prefix) goes upstream
        instead of the response going to the client; the policies after the asking one read it afresh."""
        self.view = None
        self.frame = frame
        self.peeked = False
        self.resend = True

    def send_instead(self, frame: bytes) -> None:
        """Send ``frame`` (header included, no size prefix) upstream instead of the request: a policy that built
        its own (fetch sessions do), whether or not the request was decoded."""
        if self.view is not None:
            self.view.replace_frame(frame)
        else:
            self.frame = frame
            self.peeked = False

    @property
    def body(self) -> Message:
        """The request's body, for APIs other than Fetch (decoded with :attr:`request`); a policy replaces it to
        change the request (re-encoded once, after every policy ran)."""
        view = self.request
        if not isinstance(view, MessageRequest):
            raise TypeError(f"{self.api} requests are read through Exchange.request")
        return view.body

    @body.setter
    def body(self, body: Message) -> None:
        view = self.request
        if not isinstance(view, MessageRequest):
            raise TypeError(f"{self.api} requests are edited through Exchange.request")
        view.body = body

    @property
    def request(self) -> RequestView:
        """The request decoded for the policies (once, on first access; CodecError if it is malformed). A
        policy edits it in place; the chain re-encodes it once, after every policy ran, if one changed it."""
        if self.view is None:
            header = self.header
            self.view = request_view(header.api_key, self.frame, header if self.peeked else None)
        return self.view
