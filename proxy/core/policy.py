"""The policy protocol: what a policy declares and the calls the chain makes to it.

A policy is one module under ``proxy/policies/`` and one line in ``proxy/policies/__init__.py`` (the
registration list, client side first). Modelled on Kroxylicious's filters (``shouldHandleRequest`` /
``onRequest`` / ``onResponse``):

- :attr:`Policy.apis` declares the APIs it may act on and, per API, the versions it reads (:func:`reads`):
  requests of other APIs never reach it, an API no policy declares is relayed as bytes, never decoded, and the
  chain never hands it a version it did not declare. ApiVersions offers clients, per API, only the versions
  every policy declaring it reads (:func:`versions_read`); a request at another version, from a client that
  ignored ApiVersions, closes its connection as Kafka does for a version it has not enabled (SocketServer's
  parseRequestHeader: InvalidRequestException), so no request bypasses a policy unread.
  :meth:`Policy.applies` then decides per request from the header alone (version, client id), before anything
  is decoded. :meth:`Policy.unread` says, per API version and under the settings in force, whether it leaves
  every such request alone: when every policy declaring an API does, its requests are relayed without an
  Exchange (:class:`~proxy.core.exchange.Relayed`) and no policy is called for them.
- :meth:`Policy.open` / :meth:`Policy.close` give it a state of its own per client connection.
- :meth:`Policy.on_request` sees the request (``ex.request``: decoded on first access, once for all policies,
  re-encoded once at the end if any changed it) and returns its per-request state; a non-None state means it
  wants to see the response, passed back to :meth:`Policy.on_response`. Requests go through the policies in
  registration order (towards the broker), responses in the reverse order (back towards the client).
- It acts on the connection only through the effects on :class:`~proxy.core.exchange.Exchange` (answer,
  collect, streamer, reserve, mute, resend, pending); it never sees sockets or reads a clock
  (``services.clock``). A policy that needs Sluice's own requests to the cluster first sets ``ex.pending`` in
  :meth:`Policy.on_request`; once that work is settled the chain calls :meth:`Policy.on_resume` (which may ask
  for more), then runs the policies after it.
- :meth:`Policy.stream_fetch` offers to read a Fetch response as it streams (per partition and batch header,
  :mod:`proxy.wire.fetch_stream`) when its decision does not need the whole of it.
- :meth:`Policy.reconfigure` takes the run-time changeable settings (admin API, SIGHUP): the next requests
  see the new snapshot, requests already in flight keep theirs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

from ..wire.messages import negotiable_versions
from ..wire.schema import Versions
from .broker_calls import BrokerCalls, BrokerRequests
from .exchange import ConnectionInfo, Exchange, Relay

if TYPE_CHECKING:
    from ..metrics import Metrics
    from ..wire.fetch_stream import FetchStreamer
    from ..wire.views import ResponseView
    from .routing import Router
    from .topic_names import TopicNames


#: a version range for a policy that reads no more of a request than its header: every version of the API
ANY_VERSION = Versions.parse("0+")


def reads(*api_keys: int, up_to: Mapping[int, int] | None = None) -> dict[int, Versions]:
    """A policy's declaration: each API at every version Sluice decodes or relays (proxy/codecs/manifest.json,
    :func:`~proxy.wire.messages.negotiable_versions`) -- the versions a policy written against Kafka's specs reads
    -- or, for an API in ``up_to``, only up to that version (a policy that cannot read a newer layout yet: clients
    are then offered no newer version, :func:`versions_read`)."""
    declared: dict[int, Versions] = {}
    caps = dict(up_to or {})
    unknown = set(caps) - set(api_keys)
    if unknown:
        raise ValueError(f"up_to names APIs the declaration does not read: {sorted(unknown)}")
    for key in api_keys:
        ours = negotiable_versions(key)
        if ours is None:
            raise ValueError(f"API {key} is not in proxy/codecs/manifest.json: Sluice decodes none of its versions")
        cap = caps.get(key)
        if cap is not None:
            if cap < ours.low:
                raise ValueError(f"API {key} up to v{cap}: Sluice decodes it from v{ours.low} only")
            ours = Versions(ours.low, min(ours.high, cap))
        declared[key] = ours
    return declared


def versions_read(policies: Iterable[Policy]) -> dict[int, Versions]:
    """Per API some policy declares, the versions every policy declaring it reads (the intersection of their
    ranges): what clients may use, and all the chain lets through."""
    out: dict[int, Versions] = {}
    for policy in policies:
        for key, versions in policy.apis.items():
            have = out.get(key)
            out[key] = versions if have is None else Versions(max(have.low, versions.low),
                                                               min(have.high, versions.high))
    return out


@dataclass(frozen=True, slots=True)
class Services:
    """What the proxy hands every policy: one set per proxy, shared by its connections."""

    metrics: Metrics
    #: monotonic seconds (injected: tests drive it)
    clock: Callable[[], float]
    #: broker node id <-> local listener, and the address rewriting
    router: Router
    #: topic id -> name (Fetch v13+ names topics by id only)
    names: TopicNames
    #: Sluice's own requests to the cluster, any API, made by the I/O layer for the policy that sends them
    #: (:mod:`proxy.core.broker_calls`: one request, or a procedure of several)
    broker: BrokerRequests = field(default_factory=lambda: BrokerCalls())



@dataclass(frozen=True, slots=True)
class Streamed:
    """A policy's terms for reading a Fetch response as it streams through instead of collected whole
    (:meth:`Policy.stream_fetch`). ``start`` runs before the first byte of the body goes out and returns the
    ``throttle_time_ms`` the response must carry at least (0: none; the broker's when larger, KIP-219);
    ``finish`` runs once the last byte went out, with the walk (:class:`~proxy.wire.fetch_stream.FetchStreamer`:
    the partitions it saw, the broker's error code and throttle time)."""

    start: Callable[[], int] | None = None
    finish: Callable[[FetchStreamer], None] | None = None


def _unchanged() -> None:
    """What a policy without run-time settings applies on reconfiguration: nothing."""

class Policy:
    """Base class: every hook is optional."""

    #: short name (logs, metrics, docs)
    name: ClassVar[str] = "policy"
    #: the APIs whose requests this policy may act on, each with the versions it reads (:func:`reads`); a policy
    #: may set its own per instance (one switched off declares none, so it caps nothing)
    apis: Mapping[int, Versions] = MappingProxyType({})
    #: whether, applying to a Fetch, it may collect the response whole (decoded): the access log then lists the
    #: response's partitions by topic name, so while the access log is written a Fetch v13+ it applies to waits
    #: for the names of its topic ids as for :meth:`needs_topic_names`
    decodes_fetch: ClassVar[bool] = False

    def composed(self, chain: Sequence[Policy]) -> None:
        """The chain is composed (called once, before any connection): a policy whose behaviour depends on what
        the others declare (the versions clients may negotiate) reads it here."""

    def applies(self, ex: Exchange) -> bool:
        """Whether this request concerns the policy, from its header alone (cheap: called per request)."""
        return True

    def unread(self, api_key: int, version: int) -> bool | Relay:
        """Whether, under the settings in force, this policy leaves every request of this API version alone,
        whoever sends it (asked per API version when the chain is built and after each reconfiguration, never per
        request). False (the default): it must see each request. True: it acts on neither the request nor its
        response. A :class:`~proxy.core.exchange.Relay`: its :meth:`on_request` only asks for the response, on
        those terms (read only when a check is false for it, or walked as it streams), or its ``arrival`` terms
        count each request from its header and size and say when it must be read after all. When every policy
        declaring the API says one of the last two (at most one a Relay that reads the response), the API
        version's requests are relayed without an Exchange (:class:`~proxy.core.exchange.Relayed`)."""
        return False

    def needs_topic_names(self, ex: Exchange) -> bool:
        """Whether the policy reads topic names of this request: if it names topics by id only (Fetch v13+),
        the request waits until Sluice has learnt the names of its ids (a lookup of its own if needed)."""
        return False

    def open(self, info: ConnectionInfo) -> Any:
        """A new client connection: the policy's state for it (None if it keeps none)."""
        return None

    def close(self, state: Any) -> None:
        """The connection closed."""

    def on_request(self, ex: Exchange, conn: Any) -> Any:
        """Act on a request; return the state to see its response with (None: not interested)."""
        return None

    def on_resume(self, ex: Exchange, conn: Any, state: Any) -> Any:
        """The work this policy asked for in :meth:`on_request` (``ex.pending``) is settled: act on the request
        again (set ``ex.pending`` anew to wait for more); return the state to see the response with."""
        return state

    def on_response(self, ex: Exchange, response: ResponseView, conn: Any, state: Any) -> None:
        """Act on the response (decoded view, edited in place; set ``response.changed`` when editing)."""

    def stream_fetch(self, ex: Exchange, size: int, conn: Any, state: Any) -> Streamed | None:
        """The response to a Fetch this policy asked to see (``state``, from :meth:`on_request`) is ``size``
        bytes (correlation id and body, as its size prefix says), none read yet: :class:`Streamed` terms if the
        policy can do its part as it streams through unchanged (nothing cut from it), None (the default) if it
        needs the whole response (:meth:`on_response`). Nothing to change here: the response is streamed only
        if every policy that asked to see it offers terms (then :meth:`on_response` is not called), else it is
        collected for all of them. Never asked of a policy that defines :meth:`on_sent`."""
        return None

    def on_sent(self, ex: Exchange, conn: Any, state: Any) -> None:
        """The response is encoded as the client gets it (``ex.client_bytes``): for figures that need its final
        size. Called only for policies that define it."""

    def reconfigure(self, section: Any) -> Callable[[], None]:
        """New run-time settings of this policy's own section (one its registration declares dynamic),
        made ready: whatever can fail (building the new snapshot) happens here, and the function returned applies
        it to the requests that come next and cannot fail. The chain makes every policy's ready before it applies
        any (:meth:`~proxy.core.chain.Chain.reconfigure`: all or nothing)."""
        return _unchanged
