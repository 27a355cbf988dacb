"""A running Sluice: :class:`Proxy` composes the listeners, the chain and the shared state of its connections,
and runs their lifecycle (start, run-time reconfiguration, shutdown). The I/O is in :mod:`proxy.io`: accepting
connections (:mod:`proxy.io.listeners`: PROXY header, admission, TLS), the transports of each client connection
(:mod:`proxy.io.transports`), and Sluice's own requests to the cluster (:mod:`proxy.io.cluster`). This module
names no policy: ``proxy.policies.build`` makes the list.

While a broker is down, connect failures are logged once per broker per ``_CONNECT_LOG_INTERVAL_S`` with the
count of those not logged (a client retrying in a loop must not flood the log).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .accesslog import AccessLog, LogLimiter, get_access_log, get_logger
from .config import CoreSettings
from .config.sections import LimitsSettings, UpstreamSettings
from .core.admission import Admission
from .core.broker_calls import BrokerCalls
from .core.chain import Chain
from .core.connection import Connection, Limits, Port
from .core.exchange import ConnectionInfo
from .core.memory import HeldBytes
from .core.observer import ConnectionEvents
from .core.policy import Policy, Services
from .core.routing import Address, Router
from .core.topic_names import TopicNames
from .io.cluster import OwnRequests
from .io.listeners import Listener, Refusals, listening_socket
from .io.transports import CLOSE_LINGER_S
from .metrics import Metrics
from .policies import build as build_policies
from .policies import dynamic_sections, memory_bound
from .tls import TlsContexts
from .wire.errors import CodecError
from .wire.schema import check_specs

if TYPE_CHECKING:
    from .accesslog_kafka import KafkaAccessLogSink

log = get_logger("sluice.server")

_CONNECT_LOG_INTERVAL_S = 10.0
MAX_PORT = 65535
#: a readiness check that asks the cluster for its brokers waits this long for them (the admin's probe answers
#: within 5 s either way: proxy/admin.py)
READY_REFRESH_TIMEOUT_S = 2.0


def _parse_address(text: str) -> Address:
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


class Proxy:
    """A running Sluice instance: listeners, the chain, the shared state of its connections."""

    def __init__(self, settings: CoreSettings, access_log: AccessLog | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.settings = settings
        #: monotonic, high resolution: request latencies are sub-millisecond (uvloop's loop.time() counts ms)
        self.clock = clock
        self.metrics = Metrics()
        self.access_log = access_log if access_log is not None else get_access_log()
        self.access_log.count_drops(self.metrics.access_log_dropped.labels("write_failed").inc)
        #: the access log's Kafka sink ([logging.access_log_kafka]), made now so a bad librdkafka property fails
        #: before anything listens (ConfigError); attached in start(), flushed and closed in stop()
        self.access_log_sink: KafkaAccessLogSink | None = None
        if settings.logging.access_log_kafka.enabled:
            from .accesslog_kafka import KafkaAccessLogSink

            self.access_log_sink = KafkaAccessLogSink(settings.logging.access_log_kafka,
                                                      settings.upstream.bootstrap_servers, self.metrics)
        self.router = Router(settings.listen.advertised_host, settings.listen.broker_port_base,
                             open_listener=self.open_listener)
        self.names = TopicNames(clock)
        #: the global bound on response bytes held (set by a policy's section), shared by every connection
        self.memory = HeldBytes(memory_bound(settings), on_change=self.metrics.response_bytes_held.set)
        #: the work policies queue for the cluster (proxy/core/broker_calls.py), run by :attr:`own_requests`
        self.broker_calls = BrokerCalls()
        services = Services(self.metrics, clock, self.router, self.names, self.broker_calls)
        self.chain = Chain(build_policies(settings, services), self.metrics, self.names, self.access_log)
        #: what every connection reports to: the metrics, the operational log and the access log
        self.events = ConnectionEvents(self.metrics, self.access_log, self.chain)
        limits = settings.limits
        #: each connection's bounds, from [limits] (static: a restart changes them)
        self.connection_limits = Limits(
            max_frame_bytes=limits.max_frame_bytes, write_high_water_bytes=limits.write_high_water_bytes,
            request_timeout_s=limits.request_timeout_s, max_inflight_requests=limits.max_inflight_requests,
            idle_timeout_s=limits.idle_timeout_s)
        self.admission = Admission(limits.max_connections, limits.max_connections_per_address)
        #: the TLS contexts in force (ConfigError here, before anything listens, if a file cannot be used)
        self.tls = TlsContexts(settings, on_reload=lambda outcome: self.metrics.tls_reloads.labels(outcome).inc())
        self.refusals = Refusals(self)
        self._tls_task: asyncio.Task[None] | None = None
        self.bootstrap: list[Address] = [_parse_address(a) for a in settings.upstream.bootstrap_servers]
        #: Sluice's own requests to the cluster: brokers, topic names, the policies' work
        self.own_requests = OwnRequests(settings.upstream, self.tls, self.router, self.names, self.broker_calls,
                                        self.metrics, self.bootstrap, settings.limits.max_frame_bytes)
        self._servers: dict[int | None, Listener] = {}  # None: the bootstrap listener
        #: the client connections open now (their client transport up, not yet torn down)
        self.connections: set[Connection] = set()
        #: client transports closed and not gone yet (io.host.ConnectionHost.closing)
        self.closing: set[object] = set()
        self._conn_ids = itertools.count(1)
        self._closing = False
        #: start() has finished: the brokers' listeners are open if the cluster named them (/readyz waits for it)
        self._started = False
        self._connect_log = LogLimiter(_CONNECT_LOG_INTERVAL_S, time.monotonic)
        self.loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------ what io.host.ConnectionHost asks

    @property
    def limits(self) -> LimitsSettings:
        return self.settings.limits

    @property
    def upstream(self) -> UpstreamSettings:
        return self.settings.upstream

    def connection(self, info: ConnectionInfo, port: Port) -> Connection:
        return Connection(info, self.chain, port, memory=self.memory, names=self.names, observer=self.events,
                          tallies=self.events.tallies, clock=self.clock, limits=self.connection_limits)

    def opened(self, conn: Connection) -> None:
        self.connections.add(conn)

    def closed(self, conn: Connection) -> None:
        self.connections.discard(conn)

    def next_connection_id(self) -> int:
        return next(self._conn_ids)

    def policy(self, name: str) -> Policy:
        """The chain's policy called ``name`` (admin endpoints report its state)."""
        for p in self.chain.policies:
            if p.name == name:
                return p
        raise KeyError(name)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        check_specs()  # SpecsError before a listener opens: never a proxy that closes every connection it accepts
        self.loop = asyncio.get_running_loop()
        self.own_requests.start(self.loop)
        if self.access_log_sink is not None:
            self.access_log_sink.start(self.loop)
            self.access_log.attach_sink(self.access_log_sink)
        listen = self.settings.listen
        self._servers[None] = Listener(self, self.refusals, None, listening_socket(listen.host, listen.bootstrap_port))
        self.metrics.listeners.set(len(self._servers))
        if self.tls.enabled and listen.tls.reload_interval_s:
            self._tls_task = self.loop.create_task(self._watch_tls(listen.tls.reload_interval_s))
        log.info("listening", role="bootstrap", host=listen.host, port=self.bootstrap_port,
                 upstream=[f"{h}:{p}" for h, p in self.bootstrap])
        # Learn the brokers now, so a client holding cached metadata (e.g. after a Sluice restart) finds
        # every node's listener open. Best effort: the upstream may not be up yet (ready() tries again).
        with contextlib.suppress(OSError, asyncio.TimeoutError, CodecError):
            await self.refresh_brokers()
        self._started = True

    @property
    def bootstrap_port(self) -> int:
        return int(self._servers[None].sockets[0].getsockname()[1])

    def listener_ports(self) -> dict[int | None, int]:
        return {n: int(s.sockets[0].getsockname()[1]) for n, s in self._servers.items()}

    def apply_dynamic(self, settings: CoreSettings) -> None:
        """Apply the run-time changeable sections of ``settings`` (``CoreSettings.dynamic_sections``) without dropping a
        connection. Requests already in flight keep the snapshot they started with; the next ones see the new one."""
        dynamic = {name: getattr(settings, name) for name in self.settings.dynamic_sections}
        self.settings = self.settings.model_copy(update=dynamic)
        self.chain.reconfigure(dynamic_sections(self.settings, self.chain.policies))
        self.memory.set_limit(memory_bound(self.settings))
        log.info("reconfigured", **{name: section.model_dump() for name, section in dynamic.items()})

    async def stop(self, drain_timeout: float | None = None) -> None:
        """Graceful shutdown: stop accepting, let in-flight requests finish (bounded), then close."""
        if self._closing:
            return
        self._closing = True
        timeout = self.settings.shutdown.drain_timeout_s if drain_timeout is None else drain_timeout
        for server in self._servers.values():
            server.close()
        for conn in self.connections:
            conn.drain()  # what was read is answered; nothing more is read
        deadline = time.monotonic() + timeout
        while any(c.busy for c in self.connections) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)  # polling a real condition (requests in flight), bounded by the deadline
        # Read and never answered: sent upstream and not answered yet, or still waiting in Sluice (memory, names).
        # Each is named, so an operator (and the pod test) can tell which client's request the drain gave up on.
        now = self.clock()
        abandoned = [{"conn": c.info.conn_id, "listener": c.info.listener, "client_id": ex.header.client_id,
                      "api": ex.api, "version": ex.header.api_version, "age_ms": round((now - ex.started) * 1e3)}
                     for c in self.connections if not c.closed for ex in (*c.inflight, *c.pending_requests)]
        for conn in list(self.connections):
            conn.close()
        # Each client transport gone before the exit: its last answers out and its client's FIN read (a closed
        # connection lingers at most CLOSE_LINGER_S, transports.ClientProtocol.close_client)
        linger_end = time.monotonic() + CLOSE_LINGER_S + 0.5
        while self.closing and time.monotonic() < linger_end:
            await asyncio.sleep(0.02)  # polling a real condition (transports still open), bounded
        for server in self._servers.values():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)
        if self._tls_task is not None:
            self._tls_task.cancel()
        await self.own_requests.close()
        sink = self.access_log_sink
        if sink is not None:
            # Every connection is closed: no more lines. Flushed with a bound (flush_timeout_s), off the loop.
            if self.access_log.sink is sink:
                self.access_log.detach_sink()
            await sink.close()
        log.info("stopped", abandoned_requests=len(abandoned), **({"abandoned": abandoned} if abandoned else {}))

    # ------------------------------------------------------------------ brokers and listeners

    def open_listener(self, node_id: int) -> int:
        """Open broker ``node_id``'s listener *now* and return its port: the socket listens before the
        rewritten response naming the port reaches the client, so the client's connect lands in the backlog,
        not a refusal. Port = broker_port_base + node id (stable across restarts), or a free one if base is 0."""
        listen = self.settings.listen
        port = listen.broker_port_base + node_id if listen.broker_port_base else 0
        if not 0 <= port <= MAX_PORT:
            # Kafka allows node ids up to 2^31-1 (node.id is an int), so base + id can leave the port range;
            # bind() would raise OverflowError, not OSError. A free port keeps the broker reachable; only its
            # stability across restarts is lost, which the operator can restore with a lower broker_port_base.
            log.warning("broker_port_out_of_range", node_id=node_id, broker_port_base=listen.broker_port_base,
                        port=port, using="a free port")
            port = 0
        if self._closing or self.loop is None:
            return port
        try:
            sock = listening_socket(listen.host, port)
        except OSError as e:
            log.error("listener_failed", node_id=node_id, host=listen.host, port=port, error=str(e))
            return port
        self._servers[node_id] = Listener(self, self.refusals, node_id, sock)
        self.metrics.listeners.set(len(self._servers))
        log.info("listening", role="broker", node_id=node_id, port=int(sock.getsockname()[1]),
                 upstream="{}:{}".format(*self.router.upstream[node_id]) if node_id in self.router.upstream else "")
        return int(sock.getsockname()[1])

    # ------------------------------------------------------------------ accepting

    async def _watch_tls(self, interval: float) -> None:
        """Certificate files are checked every ``interval`` s; a change rebuilds the contexts (proxy/tls.py)."""
        while True:
            await asyncio.sleep(interval)
            self.tls.check()

    def reload_tls(self) -> None:
        """SIGHUP: rebuild the TLS contexts from the files (new connections use them)."""
        self.tls.reload()

    async def upstream_address(self, node_id: int | None) -> list[Address]:
        if node_id is None:
            return list(self.bootstrap)
        if node_id not in self.router.upstream:
            await self.refresh_brokers()
        if node_id not in self.router.upstream:
            raise OSError(f"broker node {node_id} is unknown to the cluster")
        return [self.router.upstream[node_id]]

    async def refresh_brokers(self) -> None:
        """Ask the cluster for its broker list and open their listeners."""
        await self.own_requests.refresh_brokers()

    def connect_failed(self, node_id: int | None, error: str, upstream: Sequence[Address] = ()) -> None:
        """Log an upstream connect failure, at most once per broker per interval, with the count not logged."""
        suppressed = self._connect_log.allow(node_id)
        if suppressed is not None:
            log.warning("upstream_connect_failed", node_id=node_id, upstream=[f"{h}:{p}" for h, p in upstream],
                        error=error, not_logged=suppressed, interval_s=_CONNECT_LOG_INTERVAL_S)

    async def ready(self) -> bool:
        """/readyz: start-up is over (the bootstrap listener opens before the brokers' are, and a client holding
        cached metadata connects straight to a broker's) and the upstream cluster answers a TCP connect. While no
        broker is known (the cluster did not answer at start), each check asks for them again."""
        if not self._started:
            return False
        if not self.router.upstream:
            with contextlib.suppress(OSError, asyncio.TimeoutError, CodecError):
                await asyncio.wait_for(self.refresh_brokers(), READY_REFRESH_TIMEOUT_S)
        for host, port in self.bootstrap:
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 2.0)
            except (TimeoutError, OSError):
                continue
            writer.close()
            return True
        return False


__all__ = ["Proxy"]
