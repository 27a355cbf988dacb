"""The only module that touches sockets: listeners, the pair of transports behind each client connection, the
connects, Sluice's own lookups (brokers, topic names) and group requests (cooperative consumption's offsets),
shutdown.

Everything a connection decides (framing, order, waits, policies, backpressure rules, effects) is in the sans-IO
core (:mod:`proxy.core.connection`); here each client connection is a :class:`_ClientProtocol` that feeds the
core with what its two transports deliver and carries out what the core asks (:class:`~proxy.core.connection
.Port`).

- asyncio Protocols, not streams: a relay spends its time moving bytes, and Protocol callbacks avoid the
  per-read task wakeups and buffer copies of StreamReader (measured here: about 3x less CPU for relaying).
- One upstream connection per client connection, to the broker whose listener the client connected to (the
  bootstrap listener goes to any bootstrap server). Kafka matches responses to requests by order on a
  connection, so a 1:1 pairing keeps pipelining intact without rewriting correlation ids.
- While a broker is down, connect failures are logged once per broker per ``_CONNECT_LOG_INTERVAL_S`` with the
  count of those not logged (a client retrying in a loop must not flood the log).
- Every listener accepts in a loop of its own (:class:`_Listener`), so that before a connection is handed to the
  core Sluice can: read the PROXY protocol header off the socket (exactly its bytes, peeked first: what follows
  may be a TLS handshake, which must reach the TLS layer whole), count the connection against the limits at
  accept as Kafka does (:mod:`proxy.core.admission`), and run the TLS handshake with the context in force now
  (:mod:`proxy.tls`: a certificate reload applies to the next connection) and see it fail: a refused connection is
  one log event (rate-limited per reason and address) and one count, and concerns no other connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import ssl
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .accesslog import AccessLog, LogLimiter, get_access_log, get_logger
from .config import Settings, UpstreamSaslSettings
from .core.admission import Admission
from .core.chain import Chain
from .core.connection import Connection, Limits, Timer
from .core.exchange import Buffer, ConnectionInfo
from .core.group_calls import Committed, GroupCall, GroupCalls, TopicPartition
from .core.memory import HeldBytes
from .core.policy import Policy, Services
from .core.proxy_protocol import ProxyHeader, ProxyProtocolError
from .core.proxy_protocol import parse as parse_proxy_header
from .core.routing import Address, Router
from .core.sasl_client import SaslClient, SaslClientError
from .core.topic_names import TopicNames
from .metrics import Metrics
from .policies import build as build_policies
from .tls import TlsContexts
from .wire.errors import CodecError
from .wire.messages import decode_response, encode_request, request_codec, request_header_version
from .wire.model import Message
from .wire.schema import check_specs

if TYPE_CHECKING:
    from .accesslog_kafka import KafkaAccessLogSink

log = get_logger("sluice.server")

METADATA_KEY = 3
#: Metadata v12: the first version whose request may name topics by id (MetadataRequest.json)
METADATA_BY_ID_VERSION = 12
_CONNECT_LOG_INTERVAL_S = 10.0
#: accept queue of every listener. asyncio's default (100) overflows when more clients connect in one instant than
#: the loop accepts meanwhile (kafka-go opens one connection per partition reader): the kernel then drops their
#: SYNs and each retries 1 s later (bench.storm counts the overflows). The kernel caps it at net.core.somaxconn.
LISTEN_BACKLOG = 1024
MAX_PORT = 65535


def _parse_address(text: str) -> Address:
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


class Proxy:
    """A running Sluice instance: listeners, the chain, the shared state of its connections."""

    def __init__(self, settings: Settings, access_log: AccessLog | None = None,
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
        self.names = TopicNames(clock, on_lookup=self._lookup_wanted)
        #: the global bound on response bytes held (size_limit.global_max_bytes), shared by every connection
        self.memory = HeldBytes(settings.size_limit.global_max_bytes, on_change=self.metrics.response_bytes_held.set)
        #: Sluice's own group requests (proxy/core/group_calls.py), made by :meth:`_group_call`
        self.group_calls = GroupCalls(on_work=self._group_calls_wanted)
        self._coordinators: dict[str, Address] = {}
        self._links: dict[Address, _Link] = {}
        self._call_tasks: set[asyncio.Task[None]] = set()
        services = Services(self.metrics, clock, self.router, self.names, self.group_calls)
        self.chain = Chain(build_policies(settings, services), self.metrics, self.names, self.access_log)
        limits = settings.limits
        self.limits = Limits(limits.max_frame_bytes, limits.write_high_water_bytes, limits.request_timeout_s,
                             limits.max_inflight_requests, limits.idle_timeout_s)
        self.admission = Admission(limits.max_connections, limits.max_connections_per_address)
        #: the TLS contexts in force (ConfigError here, before anything listens, if a file cannot be used)
        self.tls = TlsContexts(settings, on_reload=lambda outcome: self.metrics.tls_reloads.labels(outcome).inc())
        self._refused_log = LogLimiter(_CONNECT_LOG_INTERVAL_S, time.monotonic)
        self._tls_task: asyncio.Task[None] | None = None
        self.bootstrap: list[Address] = [_parse_address(a) for a in settings.upstream.bootstrap_servers]
        self._servers: dict[int | None, _Listener] = {}  # None: the bootstrap listener
        self._clients: set[_ClientProtocol] = set()
        self._conn_ids = itertools.count(1)
        self._closing = False
        self._lookup_task: asyncio.Task[None] | None = None
        self._connect_log = LogLimiter(_CONNECT_LOG_INTERVAL_S, time.monotonic)
        self.loop: asyncio.AbstractEventLoop | None = None

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
        if self.access_log_sink is not None:
            self.access_log_sink.start(self.loop)
            self.access_log.attach_sink(self.access_log_sink)
        listen = self.settings.listen
        self._servers[None] = _Listener(self, None, _listening_socket(listen.host, listen.bootstrap_port))
        self.metrics.listeners.set(len(self._servers))
        if self.tls.enabled and listen.tls.reload_interval_s:
            self._tls_task = self.loop.create_task(self._watch_tls(listen.tls.reload_interval_s))
        log.info("listening", role="bootstrap", host=listen.host, port=self.bootstrap_port,
                 upstream=[f"{h}:{p}" for h, p in self.bootstrap])
        # Learn the brokers now, so a client holding cached metadata (e.g. after a Sluice restart) finds
        # every node's listener open. Best effort: the upstream may not be up yet.
        with contextlib.suppress(OSError, asyncio.TimeoutError, CodecError):
            await self.refresh_brokers()

    @property
    def bootstrap_port(self) -> int:
        return int(self._servers[None].sockets[0].getsockname()[1])

    def listener_ports(self) -> dict[int | None, int]:
        return {n: int(s.sockets[0].getsockname()[1]) for n, s in self._servers.items()}

    def apply_dynamic(self, settings: Settings) -> None:
        """Apply the run-time changeable settings (size limits, throttles) without dropping a connection.
        Requests already in flight keep the snapshot they started with; the next ones see the new one."""
        self.settings = self.settings.model_copy(update={"size_limit": settings.size_limit,
                                                         "throttle": settings.throttle})
        self.chain.reconfigure(self.settings)
        self.memory.set_limit(settings.size_limit.global_max_bytes)
        log.info("reconfigured", size_limit=settings.size_limit.model_dump(), throttle=settings.throttle.model_dump())

    async def stop(self, drain_timeout: float | None = None) -> None:
        """Graceful shutdown: stop accepting, let in-flight requests finish (bounded), then close."""
        if self._closing:
            return
        self._closing = True
        timeout = self.settings.shutdown.drain_timeout_s if drain_timeout is None else drain_timeout
        for server in self._servers.values():
            server.close()
        deadline = time.monotonic() + timeout
        while any(c.conn.busy for c in self._clients) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)  # polling a real condition (requests in flight), bounded by the deadline
        pending = sum(len(c.conn.inflight) for c in self._clients)
        for client in list(self._clients):
            client.conn.close()
        for server in self._servers.values():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)
        if self._lookup_task is not None:
            self._lookup_task.cancel()
        if self._tls_task is not None:
            self._tls_task.cancel()
        for task in list(self._call_tasks):
            task.cancel()
        for link in self._links.values():
            link.close()
        sink = self.access_log_sink
        if sink is not None:
            # Every connection is closed: no more lines. Flushed with a bound (flush_timeout_s), off the loop.
            if self.access_log.sink is sink:
                self.access_log.detach_sink()
            await sink.close()
        log.info("stopped", abandoned_requests=pending)

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
            sock = _listening_socket(listen.host, port)
        except OSError as e:
            log.error("listener_failed", node_id=node_id, host=listen.host, port=port, error=str(e))
            return port
        self._servers[node_id] = _Listener(self, node_id, sock)
        self.metrics.listeners.set(len(self._servers))
        log.info("listening", role="broker", node_id=node_id, port=int(sock.getsockname()[1]),
                 upstream="{}:{}".format(*self.router.upstream[node_id]) if node_id in self.router.upstream else "")
        return int(sock.getsockname()[1])

    # ------------------------------------------------------------------ accepting

    def refused(self, reason: str, host: str, listener: str, **detail: Any) -> None:
        """A client connection closed before its first request: counted, and logged once per reason and address
        per interval (a client retrying in a loop, or a scanner, must not flood the log)."""
        self.metrics.connections_refused.labels(reason).inc()
        suppressed = self._refused_log.allow((reason, host, detail.get("error")))
        if suppressed is not None:
            log.warning("connection_refused", reason=reason, client=host, listener=listener,
                        not_logged=suppressed, **detail)

    async def accepted(self, sock: socket.socket, peer: Any, node_id: int | None) -> None:
        """A connection accepted on listener ``node_id``: its PROXY header (if the listener reads one), the
        limits (at accept, as Kafka), the TLS handshake (with the context in force now), then the core."""
        assert self.loop is not None
        name = "bootstrap" if node_id is None else f"broker-{node_id}"
        policy = self.tls.listener(name)
        host, port = (peer[0], peer[1]) if isinstance(peer, tuple) else ("", 0)
        timeout = self.settings.limits.request_timeout_s
        if policy.proxy_protocol != "off":
            try:
                header = await asyncio.wait_for(_read_proxy_header(self.loop, sock, policy.proxy_protocol), timeout)
            except asyncio.CancelledError:  # Sluice is stopping
                sock.close()
                raise
            except (ProxyProtocolError, OSError, TimeoutError) as e:
                error = str(e) if isinstance(e, ProxyProtocolError) else \
                    f"no PROXY header within {timeout:g} s" if isinstance(e, TimeoutError) else str(e)
                self.refused("proxy_protocol", host, name, error=error)
                sock.close()
                return
            if header.source is not None:
                host, port = header.source
        reason = self.admission.admit(host)
        if reason is not None:
            limits = self.settings.limits
            self.refused(reason, host, name, limit=limits.max_connections if reason == "max_connections"
                         else limits.max_connections_per_address)
            sock.close()
            return
        protocol = _ClientProtocol(self, node_id, host, port)
        try:
            if policy.ssl is None:
                await self.loop.connect_accepted_socket(lambda: protocol, sock)
            else:
                await asyncio.wait_for(self.loop.connect_accepted_socket(
                    lambda: protocol, sock, ssl=policy.ssl, ssl_handshake_timeout=timeout), timeout + 1.0)
        except BaseException as e:
            if protocol.transport is None:  # it never reached the core (whose teardown releases it): not counted
                self.admission.release(host)
            with contextlib.suppress(OSError):
                sock.close()
            if not isinstance(e, ssl.SSLError | OSError | TimeoutError):
                raise  # cancelled (Sluice is stopping), or a bug
            self.refused("tls_handshake" if policy.ssl is not None else "accept_failed", host, name,
                         error=_tls_error(e))

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

    async def _metadata(self, body: Message) -> Message:
        """A Metadata request of Sluice's own (v12), to the first bootstrap server (then known broker) that
        answers."""
        last: Exception | None = None
        for host, port in [*self.bootstrap, *self.router.upstream.values()]:
            try:
                return await _one_request(host, port, METADATA_KEY, METADATA_BY_ID_VERSION, body,
                                          self.settings.upstream.connect_timeout_s, self.tls.upstream,
                                          self.settings.upstream.sasl)
            except (TimeoutError, OSError, CodecError, EOFError) as e:
                # EOFError: a listener that closes on requests it does not take before authentication (SASL)
                last = e if not isinstance(e, EOFError) else OSError(f"{host}:{port} closed the connection")
        raise last if last is not None else OSError("no upstream address")

    async def refresh_brokers(self) -> None:
        """Ask the cluster for its broker list (Metadata, no topics) and open their listeners."""
        body = await self._metadata(Message(topics=[], allow_auto_topic_creation=False,
                                            include_topic_authorized_operations=False))
        for broker in body.brokers:
            self.router.learn(broker.node_id, broker.host, broker.port)
            self.router.port_for(broker.node_id)  # opens the node's listener on first sight

    def _lookup_wanted(self) -> None:
        if self.loop is not None and (self._lookup_task is None or self._lookup_task.done()):
            self._lookup_task = self.loop.create_task(self._lookup_topic_names())

    async def _lookup_topic_names(self) -> None:
        """Resolve the topic ids the connections wait for (proxy/core/topic_names.py): Metadata v12 naming
        topics by id; an id the cluster does not know comes back with UNKNOWN_TOPIC_ID."""
        while ids := self.names.take():
            found: dict[bytes, str] = {}
            try:
                body = await self._metadata(Message(
                    topics=[Message(topic_id=i, name=None) for i in sorted(ids)],
                    allow_auto_topic_creation=False, include_topic_authorized_operations=False))
            except (TimeoutError, OSError, CodecError) as e:
                self.metrics.topic_lookups.labels("failed").inc(len(ids))
                log.warning("topic_lookup_failed", topics=len(ids), error=str(e))
            else:
                for topic in body.topics:
                    tid = bytes(topic.topic_id)
                    if topic.error_code == 0 and topic.name and tid in ids:
                        found[tid] = topic.name
                self.metrics.topic_lookups.labels("resolved").inc(len(found))
                self.metrics.topic_lookups.labels("unknown").inc(len(ids) - len(found))
            self.names.settle(found, ids - found.keys())

    # ------------------------------------------------------------------ group requests of Sluice's own

    def _group_calls_wanted(self) -> None:
        if self.loop is None:
            return
        for call in self.group_calls.take():
            task = self.loop.create_task(self._group_call(call))
            self._call_tasks.add(task)
            task.add_done_callback(self._call_tasks.discard)

    async def _group_call(self, call: GroupCall) -> None:
        """Carry out one :class:`~proxy.core.group_calls.GroupCall`: commits, then reads, then descriptions, each
        sent to the group's coordinator (FindCoordinator, cached; found again when a broker says it is not the
        coordinator or is loading). Bounded: ``_GROUP_CALL_TIMEOUT_S`` in all."""
        try:
            await asyncio.wait_for(self._group_call_io(call), _GROUP_CALL_TIMEOUT_S)
        except (TimeoutError, OSError, CodecError, _CoordinatorError) as e:
            self.metrics.sharing_group_calls.labels("failed").inc()
            log.warning("group_call_failed", groups=sorted({*call.commits, *call.reads, *call.describe}),
                        error=str(e) or type(e).__name__)
            call.fail(str(e) or type(e).__name__)
        else:
            self.metrics.sharing_group_calls.labels("ok").inc()
            call.settle()

    async def _group_call_io(self, call: GroupCall) -> None:
        for attempt in range(_GROUP_CALL_ATTEMPTS):
            retry = await self._group_call_once(call)
            if not retry:
                return
            for group in retry:
                self._coordinators.pop(group, None)
            await asyncio.sleep(0.1 * (attempt + 1))  # the coordinator is moving or loading: ask again shortly
        raise _CoordinatorError(f"no coordinator answered for {sorted(retry)}")

    async def _group_call_once(self, call: GroupCall) -> set[str]:
        """One pass over what is left of ``call``; the groups whose coordinator must be found again."""
        retry: set[str] = set()
        groups = {*call.commits, *call.reads, *call.describe}
        where = await self._find_coordinators(groups - self._coordinators.keys())
        where.update((g, self._coordinators[g]) for g in groups if g in self._coordinators)
        retry |= groups - where.keys()
        for group, offsets in call.commits.items():
            if group in retry or group in call.committed:
                continue
            body = request_codec(_OFFSET_COMMIT, 8).default().replace(
                group_id=group, generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
                topics=[Message(name=topic, partitions=[
                    Message(partition_index=p, committed_offset=o, committed_leader_epoch=-1, committed_metadata=md)
                    for (t, p), (o, md) in sorted(offsets.items()) if t == topic])
                    for topic in sorted({t for t, _ in offsets})])
            answer = await self._link(where[group]).request(_OFFSET_COMMIT, 8, body)
            codes = {(t.name, p.partition_index): p.error_code for t in answer.topics for p in t.partitions}
            if any(c in _COORDINATOR_MOVED for c in codes.values()):
                retry.add(group)
            else:
                call.committed[group] = codes
        by_node: dict[Address, list[str]] = {}
        for group in call.reads:
            if group not in retry and group not in call.offsets:
                by_node.setdefault(where[group], []).append(group)
        for address, names in by_node.items():
            body = request_codec(_OFFSET_FETCH, 8).default().replace(require_stable=False, groups=[
                Message(group_id=g, topics=[Message(name=topic, partition_indexes=sorted(
                    p for t, p in call.reads[g] if t == topic)) for topic in sorted({t for t, _ in call.reads[g]})])
                for g in names])
            answer = await self._link(address).request(_OFFSET_FETCH, 8, body)
            for entry in answer.groups:
                if entry.error_code in _COORDINATOR_MOVED:
                    retry.add(entry.group_id)
                    continue
                if entry.error_code:
                    raise _CoordinatorError(f"OffsetFetch of {entry.group_id}: error {entry.error_code}")
                read: dict[TopicPartition, Committed] = {}
                for t in entry.topics:
                    for p in t.partitions:
                        if p.error_code in _COORDINATOR_MOVED:
                            retry.add(entry.group_id)
                        read[(t.name, p.partition_index)] = Committed(p.committed_offset, p.committed_leader_epoch,
                                                                      p.metadata)
                if entry.group_id not in retry:
                    call.offsets[entry.group_id] = read
        described: dict[Address, list[str]] = {}
        for group in call.describe:
            if group not in retry and group not in call.described:
                described.setdefault(where[group], []).append(group)
        for address, names in described.items():
            body = request_codec(_DESCRIBE_GROUPS, 5).default().replace(groups=sorted(names))
            answer = await self._link(address).request(_DESCRIBE_GROUPS, 5, body)
            for entry in answer.groups:
                if entry.error_code in _COORDINATOR_MOVED:
                    retry.add(entry.group_id)
                else:
                    call.described[entry.group_id] = entry
        for group in retry:
            self._coordinators.pop(group, None)
        return retry

    async def _find_coordinators(self, groups: set[str]) -> dict[str, Address]:
        """FindCoordinator v4 (KIP-699: several keys in one request) for ``groups``, from the first bootstrap
        server (then known broker) that answers; the groups without an answer yet (coordinator not available,
        e.g. __consumer_offsets still being created) are left out."""
        if not groups:
            return {}
        body = request_codec(_FIND_COORDINATOR, 4).default().replace(key_type=0, coordinator_keys=sorted(groups))
        last: Exception | None = None
        for host, port in [*self.bootstrap, *self.router.upstream.values()]:
            try:
                answer = await self._link((host, port)).request(_FIND_COORDINATOR, 4, body)
            except (TimeoutError, OSError, CodecError) as e:
                last = e
                continue
            found = {c.key: (c.host, c.port) for c in answer.coordinators if c.error_code == 0}
            self._coordinators.update(found)
            return found
        raise last if last is not None else OSError("no upstream address")

    def _link(self, address: Address) -> _Link:
        link = self._links.get(address)
        if link is None:
            link = self._links[address] = _Link(address, self.settings.upstream.connect_timeout_s, self.tls.upstream,
                                                 self.settings.upstream.sasl)
        return link

    def connect_failed(self, node_id: int | None, error: str, upstream: Sequence[Address] = ()) -> None:
        """Log an upstream connect failure, at most once per broker per interval, with the count not logged."""
        suppressed = self._connect_log.allow(node_id)
        if suppressed is not None:
            log.warning("upstream_connect_failed", node_id=node_id, upstream=[f"{h}:{p}" for h, p in upstream],
                        error=error, not_logged=suppressed, interval_s=_CONNECT_LOG_INTERVAL_S)

    async def ready(self) -> bool:
        """/readyz: the upstream cluster answers a TCP connect."""
        for host, port in self.bootstrap:
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 2.0)
            except (TimeoutError, OSError):
                continue
            writer.close()
            return True
        return False


def _listening_socket(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class _Listener:
    """One listening socket and its accept loop: each accepted connection goes to :meth:`Proxy.accepted` in a
    task of its own (a slow PROXY header or TLS handshake holds up no other connection)."""

    def __init__(self, proxy: Proxy, node_id: int | None, sock: socket.socket) -> None:
        self.proxy = proxy
        self.node_id = node_id
        self.sockets = [sock]
        self._connecting: set[asyncio.Task[None]] = set()
        assert proxy.loop is not None
        self._task = proxy.loop.create_task(self._accept(sock))

    async def _accept(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, peer = await loop.sock_accept(sock)
            except asyncio.CancelledError:
                raise
            except OSError as e:
                if sock.fileno() < 0:
                    return
                # EMFILE/ENFILE/ENOBUFS: out of descriptors or memory; the kernel keeps the backlog meanwhile
                log.error("accept_failed", node_id=self.node_id, error=str(e))
                await asyncio.sleep(0.1)
                continue
            conn.setblocking(False)
            task = loop.create_task(self.proxy.accepted(conn, peer, self.node_id))
            self._connecting.add(task)
            task.add_done_callback(self._connecting.discard)

    def close(self) -> None:
        self._task.cancel()
        for task in list(self._connecting):
            task.cancel()
        self.sockets[0].close()

    async def wait_closed(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


async def _readable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    fut: asyncio.Future[None] = loop.create_future()
    fd = sock.fileno()

    def ready() -> None:
        if not fut.done():
            fut.set_result(None)

    loop.add_reader(fd, ready)
    try:
        await fut
    finally:
        loop.remove_reader(fd)


async def _read_proxy_header(loop: asyncio.AbstractEventLoop, sock: socket.socket, versions: Any) -> ProxyHeader:
    """Read a PROXY protocol header off ``sock``, and not one byte more: what follows (a TLS ClientHello, the first
    Kafka request) stays in the socket for the connection. Bytes are peeked, then only the header's are taken."""
    got = bytearray()
    while True:
        await _readable(loop, sock)
        try:
            peeked = sock.recv(65536 + 16, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            continue
        if not peeked:
            raise ProxyProtocolError("the connection closed before a complete PROXY header")
        result = parse_proxy_header(bytes(got) + peeked, versions)
        if isinstance(result, ProxyHeader):
            take = result.length - len(got)
        else:  # incomplete: all that is there is header (a v1 line has no CRLF yet; v2 is shorter than its length)
            take = len(peeked)
        while take > 0:
            chunk = sock.recv(take)
            if not chunk:
                raise ProxyProtocolError("the connection closed inside its PROXY header")
            got += chunk
            take -= len(chunk)
        if isinstance(result, ProxyHeader):
            return result


def _tls_error(e: BaseException) -> str:
    """A handshake failure in one line: OpenSSL's reason (e.g. TLSV1_ALERT_UNKNOWN_CA, CERTIFICATE_VERIFY_FAILED
    with its verify message, PEER_DID_NOT_RETURN_A_CERTIFICATE)."""
    if isinstance(e, ssl.SSLCertVerificationError):
        return f"{e.reason}: {e.verify_message}"
    if isinstance(e, ssl.SSLError):
        return str(e.reason or e)
    if isinstance(e, TimeoutError):
        return "handshake timed out"
    return str(e) or type(e).__name__


SASL_HANDSHAKE_KEY, SASL_AUTHENTICATE_KEY = 17, 36


_FIND_COORDINATOR, _OFFSET_COMMIT, _OFFSET_FETCH, _DESCRIBE_GROUPS = 10, 8, 9, 15
#: NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS: find the coordinator again, retry
_COORDINATOR_MOVED = frozenset({16, 15, 14})
_GROUP_CALL_ATTEMPTS = 8
#: a group call's bound in all (a client's request waits for it; its request.timeout.ms is 30 s by default)
_GROUP_CALL_TIMEOUT_S = 15.0


class _CoordinatorError(Exception):
    """A group request the cluster did not serve (after retries)."""


class _OwnConnection:
    """A connection of Sluice's own to one broker (its Metadata lookups, its group requests), over the upstream
    TLS settings and authenticated first with Sluice's own identity when ``[upstream.sasl]`` names one (KIP-43
    SaslHandshake v1, SaslAuthenticate v2): a broker's SASL listener closes a connection whose first request is
    anything else. One request at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, address: Address,
                 timeout: float) -> None:
        self._reader, self._writer = reader, writer
        self.address, self.timeout = address, timeout
        self._corr = 0

    @classmethod
    async def open(cls, address: Address, timeout: float, tls: ssl.SSLContext | None,
                   sasl: UpstreamSaslSettings | None) -> _OwnConnection:
        host, port = address
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=tls, server_hostname=host if tls is not None else None), timeout)
        conn = cls(reader, writer, address, timeout)
        try:
            if sasl is not None and sasl.mechanism:
                await conn._login(sasl)
        except BaseException:
            conn.close()
            raise
        return conn

    async def _login(self, sasl: UpstreamSaslSettings) -> None:
        host, port = self.address
        shake = await self.call(SASL_HANDSHAKE_KEY, 1, Message(mechanism=sasl.mechanism))
        if shake.error_code:
            raise OSError(f"{host}:{port} refused SASL mechanism {sasl.mechanism} (error {shake.error_code})")
        client = SaslClient(sasl.mechanism, sasl.username, sasl.secret())
        token: bytes | None = client.first()
        while token is not None:
            answer = await self.call(SASL_AUTHENTICATE_KEY, 2, Message(auth_bytes=token))
            if answer.error_code:
                # the broker's message names the failure, never the credential
                raise OSError(f"{host}:{port}: Sluice's own SASL authentication failed: {answer.error_message}")
            try:
                token = client.next(bytes(answer.auth_bytes or b""))
            except SaslClientError as e:
                raise OSError(f"{host}:{port}: {e}") from None

    async def call(self, api_key: int, version: int, body: Message) -> Message:
        self._corr += 1
        header = Message(request_api_key=api_key, request_api_version=version, correlation_id=self._corr,
                         client_id="sluice")
        frame = encode_request(header, body)
        self._writer.write(len(frame).to_bytes(4, "big") + frame)
        size = int.from_bytes(await asyncio.wait_for(self._reader.readexactly(4), self.timeout), "big")
        data = await asyncio.wait_for(self._reader.readexactly(size), self.timeout)
        header, body = decode_response(api_key, version, data)
        if header.correlation_id != self._corr:  # the answer to another request: this connection is out of step
            raise OSError(f"{self.address[0]}:{self.address[1]}: answer to correlation id {header.correlation_id}, "
                          f"expected {self._corr}")
        return body

    def close(self) -> None:
        self._writer.close()


class _Link:
    """Sluice's own connection to one broker for its group requests: opened on first use, one request at a
    time, opened again after a failure."""

    def __init__(self, address: Address, timeout: float, tls: ssl.SSLContext | None,
                 sasl: UpstreamSaslSettings | None) -> None:
        self.address, self.timeout, self._tls, self._sasl = address, timeout, tls, sasl
        self._lock = asyncio.Lock()
        self._conn: _OwnConnection | None = None

    async def request(self, api_key: int, version: int, body: Message) -> Message:
        async with self._lock:
            for attempt in (1, 2):  # a connection the broker closed while idle: opened again, once
                try:
                    if self._conn is None:
                        self._conn = await _OwnConnection.open(self.address, self.timeout, self._tls, self._sasl)
                    return await self._conn.call(api_key, version, body)
                except (OSError, TimeoutError, asyncio.IncompleteReadError) as e:
                    self.close()
                    if attempt == 2:
                        raise OSError(f"{self.address[0]}:{self.address[1]}: {e!r}") from None
                except BaseException:
                    # Cancelled (the group call's bound) or failed while the answer was still due: that answer
                    # would be read as the next request's, and every later one as the one before it.
                    self.close()
                    raise
            raise AssertionError("unreachable")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


async def _one_request(host: str, port: int, api_key: int, version: int, body: Message,
                       timeout: float, tls: ssl.SSLContext | None = None,
                       sasl: UpstreamSaslSettings | None = None) -> Message:
    """A single request/response on a fresh connection of Sluice's own (its Metadata lookups)."""
    conn = await _OwnConnection.open((host, port), timeout, tls, sasl)
    try:
        assert request_header_version(api_key, version) == 2
        return await conn.call(api_key, version, body)
    finally:
        conn.close()


# ---------------------------------------------------------------------------------------------- connections


def _configure(transport: Any, limits: Any) -> None:
    transport.set_write_buffer_limits(limits.write_high_water_bytes, limits.write_low_water_bytes)
    with contextlib.suppress(OSError, AttributeError):
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _ClientProtocol(asyncio.Protocol):
    """A client's connection to one of Sluice's listeners, the upstream connection made for it, and the
    :class:`~proxy.core.connection.Port` through which the core acts on both."""

    def __init__(self, proxy: Proxy, node_id: int | None, host: str = "", port: int = 0) -> None:
        self.proxy = proxy
        self.node_id = node_id
        self.transport: Any = None  # uvloop's TCPTransport is not an asyncio.Transport
        self.upstream: Any = None
        self._connect_task: asyncio.Task[None] | None = None
        self._torn_down = False
        #: admitted by Proxy.accepted (the limits count it until teardown)
        self.host = host
        info = ConnectionInfo(next(proxy._conn_ids), "bootstrap" if node_id is None else f"broker-{node_id}",
                              node_id, host, port)
        self.conn = Connection(info, proxy.chain, self, memory=proxy.memory, names=proxy.names,
                               metrics=proxy.metrics, access_log=proxy.access_log, clock=proxy.clock,
                               limits=proxy.limits)

    # ------------------------------------------------------------------ the client's transport

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        _configure(transport, self.proxy.settings.limits)
        self.proxy._clients.add(self)
        m = self.proxy.metrics
        m.client_connections.inc()
        m.client_connections_open.inc()
        self._connect_task = asyncio.get_running_loop().create_task(self._connect())

    def data_received(self, data: bytes) -> None:
        self.conn.client_data(data)

    def pause_writing(self) -> None:
        self.conn.client_write_paused()

    def resume_writing(self) -> None:
        self.conn.client_write_resumed()

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn.client_lost()
        self._teardown(abort=False)

    async def _connect(self) -> None:
        proxy, conn = self.proxy, self.conn
        loop = asyncio.get_running_loop()
        timeout = proxy.settings.upstream.connect_timeout_s
        try:
            addresses = await proxy.upstream_address(self.node_id)
        except (TimeoutError, OSError, CodecError) as e:
            proxy.metrics.upstream_connect_errors.inc()
            proxy.connect_failed(self.node_id, str(e))
            conn.upstream_failed(str(e))
            return
        last: BaseException | None = None
        tls = proxy.tls.upstream
        for host, port in addresses:
            try:
                if tls is None:
                    await asyncio.wait_for(loop.create_connection(lambda: _UpstreamProtocol(self), host, port),
                                           timeout)
                else:
                    await asyncio.wait_for(loop.create_connection(
                        lambda: _UpstreamProtocol(self), host, port, ssl=tls, server_hostname=host,
                        ssl_handshake_timeout=timeout), timeout)
            except (TimeoutError, OSError) as e:
                proxy.metrics.upstream_connect_errors.inc()
                last = e
                continue
            if conn.closed:
                self._teardown(abort=False)
                return
            conn.upstream_ready(f"{host}:{port}")
            return
        proxy.connect_failed(self.node_id, _tls_error(last) if last is not None else "", addresses)
        conn.upstream_failed(str(last))

    # ------------------------------------------------------------------ Port: what the core asks

    def send_client(self, buffers: Sequence[Buffer]) -> None:
        if self.transport is not None and not self._torn_down:
            self.transport.writelines(buffers)

    def send_upstream(self, buffers: Sequence[Buffer]) -> None:
        if self.upstream is not None and not self._torn_down:
            self.upstream.writelines(buffers)

    def pause_client(self) -> None:
        if self.transport is not None and not self._torn_down:
            self.transport.pause_reading()

    def resume_client(self) -> None:
        if self.transport is not None and not self._torn_down:
            self.transport.resume_reading()

    def pause_upstream(self) -> None:
        if self.upstream is not None and not self._torn_down:
            self.upstream.pause_reading()

    def resume_upstream(self) -> None:
        if self.upstream is not None and not self._torn_down:
            self.upstream.resume_reading()

    def close(self, abort: bool) -> None:
        self._teardown(abort)

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        return asyncio.get_running_loop().call_later(delay, callback)

    def _teardown(self, abort: bool) -> None:
        if self._torn_down:
            return
        self._torn_down = True
        self.proxy._clients.discard(self)
        self.proxy.admission.release(self.host)
        self.proxy.metrics.client_connections_open.dec()
        if self.transport is not None:
            (self.transport.abort if abort else self.transport.close)()
        if self.upstream is not None:
            self.upstream.close()
        if self._connect_task is not None and not self._connect_task.done():
            self._connect_task.cancel()


class _UpstreamProtocol(asyncio.Protocol):
    """Sluice's connection to a broker on behalf of one client connection."""

    def __init__(self, client: _ClientProtocol) -> None:
        self.client = client
        self.conn = client.conn

    def connection_made(self, transport: Any) -> None:
        client = self.client
        _configure(transport, client.proxy.settings.limits)
        m = client.proxy.metrics
        m.upstream_connections.inc()
        m.upstream_connections_open.inc()
        if client._torn_down:
            transport.close()
            return
        client.upstream = transport

    def data_received(self, data: bytes) -> None:
        self.conn.upstream_data(data)

    def pause_writing(self) -> None:
        self.conn.upstream_write_paused()

    def resume_writing(self) -> None:
        self.conn.upstream_write_resumed()

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.proxy.metrics.upstream_connections_open.dec()
        self.conn.upstream_lost(str(exc) if exc else None)


__all__ = ["Proxy"]
