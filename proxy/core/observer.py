"""What a connection's life looks like from outside: the events the connection core (:mod:`proxy.core.connection`)
reports, and :class:`ConnectionEvents`, which turns them into the metrics, the operational log and the access log.

The core decides and reports; it counts, logs and writes no access-log line itself (as h11 leaves logging to its
caller). One observer serves every connection of a proxy; a test hands the core its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ..accesslog import AccessLog, get_logger
from ..metrics import Metrics, RejectReason

if TYPE_CHECKING:
    from .chain import Chain
    from .exchange import ConnectionInfo, Exchange, PolicyFailed, Relayed

__all__ = ["ConnectionEvents", "ConnectionObserver"]

log = get_logger("sluice.connection")


class ConnectionObserver(Protocol):
    """The events of a client connection, each with the connection's identity (``info``) and the client id of its
    last request (``client_id``)."""

    def completed(self, info: ConnectionInfo, ex: Exchange | Relayed, latency: float, upstream: str) -> None:
        """A request is over: its response handed to the client (``latency`` seconds after it was read), or none
        owed. Once per request, in the order the client sent them."""

    def frame_rejected(self, info: ConnectionInfo, client_id: str | None, reason: RejectReason, detail: str) -> None:
        """A client's frame Sluice does not serve: the connection closes."""

    def policy_failed(self, info: ConnectionInfo, client_id: str | None, failure: PolicyFailed) -> None:
        """A policy's hook raised: the connection closes."""

    def upstream_error(self, info: ConnectionInfo, detail: str) -> None:
        """The broker broke the protocol (or sent what Sluice cannot read and must rewrite): the connection closes."""

    def upstream_closed(self, info: ConnectionInfo, pending: int, api: str, version: int, error: str | None) -> None:
        """The broker closed the connection with ``pending`` requests unanswered (or a response cut off)."""

    def client_closed(self, info: ConnectionInfo, pending: int) -> None:
        """The client went away with ``pending`` requests owed a response."""

    def inflight_limited(self, info: ConnectionInfo, client_id: str | None, limit: int, first: bool) -> None:
        """The client is not read: ``limit`` requests are owed a response (``first``: the first time on it)."""

    def idle_closed(self, info: ConnectionInfo, client_id: str | None, quiet_s: float) -> None:
        """Nothing in flight and no bytes from the client for ``quiet_s``: the connection closes."""

    def memory_wait(self, info: ConnectionInfo) -> None:
        """A request waits for response memory before it goes upstream."""

    def stream_rewritten(self, api: str) -> None:
        """A response walked as it streamed was changed on its way (e.g. its broker addresses)."""


class ConnectionEvents:
    """The observer of every connection of one proxy: the metrics, the operational log and the access log."""

    def __init__(self, metrics: Metrics, access_log: AccessLog, chain: Chain) -> None:
        self.metrics = metrics
        self.access_log = access_log
        self.chain = chain
        self._requests = metrics.requests
        #: the byte counts every connection adds to in place (the connection core's ``tallies``)
        self.tallies = (metrics.bytes_client_to_proxy, metrics.bytes_proxy_to_upstream, metrics.bytes_upstream_to_proxy,
                        metrics.bytes_proxy_to_client)

    def completed(self, info: ConnectionInfo, ex: Exchange | Relayed, latency: float, upstream: str) -> None:
        h = ex.header
        # a method of the tallies' class, not a bound method kept here: CPython 3.11 specialises only the former's
        # look-up; the other costs a look-up through the type and the instance on every request
        self._requests.observe(ex.api, h.api_version, latency)
        access_log = self.access_log
        if access_log.enabled:
            # positionally, in record()'s order: matching 19 keywords cost ~1.6k instructions per request
            access_log.record(
                info.conn_id, h.client_id, ex.api, h.api_key, h.api_version, h.correlation_id,
                ex.size, ex.upstream_sent, ex.upstream_bytes, ex.client_bytes,
                latency * 1000.0, ex.error_codes, info.listener, upstream, ex.decoded, ex.partitions,
                info.client_host or None, info.principal, ex.log,
            )

    def frame_rejected(self, info: ConnectionInfo, client_id: str | None, reason: RejectReason, detail: str) -> None:
        self.metrics.frames_rejected.labels(reason).inc()
        log.warning("frame_rejected", conn=info.conn_id, listener=info.listener, reason=reason, detail=detail,
                    client_id=client_id)

    def policy_failed(self, info: ConnectionInfo, client_id: str | None, failure: PolicyFailed) -> None:
        self.chain.report(failure, info, client_id)

    def upstream_error(self, info: ConnectionInfo, detail: str) -> None:
        self.metrics.frames_rejected.labels("malformed").inc()
        log.error("upstream_protocol_error", conn=info.conn_id, detail=detail)

    def upstream_closed(self, info: ConnectionInfo, pending: int, api: str, version: int, error: str | None) -> None:
        self.metrics.frames_rejected.labels("upstream_closed").inc()
        log.warning("upstream_closed", conn=info.conn_id, pending=pending, api=api, version=version, error=error)

    def client_closed(self, info: ConnectionInfo, pending: int) -> None:
        log.debug("client_closed", conn=info.conn_id, pending=pending)

    def inflight_limited(self, info: ConnectionInfo, client_id: str | None, limit: int, first: bool) -> None:
        self.metrics.inflight_limited.inc()
        if first:
            log.info("inflight_limit", conn=info.conn_id, listener=info.listener, limit=limit, client_id=client_id,
                     client=info.client_host, principal=info.principal)

    def idle_closed(self, info: ConnectionInfo, client_id: str | None, quiet_s: float) -> None:
        self.metrics.connections_closed.labels("idle").inc()
        log.info("idle_closed", conn=info.conn_id, listener=info.listener, idle_s=round(quiet_s, 3),
                 client_id=client_id, client=info.client_host, principal=info.principal)

    def memory_wait(self, info: ConnectionInfo) -> None:
        self.metrics.response_memory_waits.inc()

    def stream_rewritten(self, api: str) -> None:
        self.metrics.rewritten(api)
