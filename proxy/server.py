"""The only module that touches sockets: listeners, client/upstream connection pairs, backpressure, shutdown.

Design (see ARCHITECTURE.md, "How a request flows"):

- asyncio Protocols, not streams: a relay spends its time moving bytes, and Protocol callbacks avoid the
  per-read task wakeups and buffer copies of StreamReader (measured here: about 3x less CPU for relaying).
- One upstream connection per client connection, to the broker whose listener the client connected to
  (the bootstrap listener goes to any bootstrap server). Kafka matches responses to requests by order on a
  connection, so a 1:1 pairing keeps pipelining intact without rewriting correlation ids.
- Requests are framed from a ``bytearray``; responses are *streamed*: a response Sluice does not need to
  read is written to the client chunk by chunk as it arrives (no full-frame buffering, no copy of record
  bytes), while a response a rule must rewrite is collected, rewritten and written whole. Responses go to
  the client strictly in request order; responses Sluice makes itself (e.g. an unsupported ApiVersions
  version) wait for their turn.
- Backpressure both ways: when one side's transport write buffer passes its high-water mark, reading from
  the other side pauses until it drains (Protocol.pause_writing/resume_writing).
- Frame size limit (like the broker's socket.request.max.bytes) checked on the 4-byte prefix, before any
  allocation; a violation closes only that connection, with a log event and a metric.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import socket
import struct
import time
from collections import deque
from typing import Any

from . import metrics
from .accesslog import AccessLog, get_access_log, get_logger
from .config import Settings
from .pipeline import ConnectionState, Pipeline, Request
from .policies.sessions import SessionCache, SessionServer
from .policies.size_limit import HeldBytes, SizeLimits
from .policies.terminate import SessionModes
from .policies.throttle import Throttles
from .routing import Address, Router
from .wire.errors import CodecError
from .wire.fetch_stream import FetchStreamer
from .wire.messages import decode_response, encode_request, request_header_version
from .wire.model import Message

log = get_logger("sluice.server")

_SIZE_CORR = struct.Struct(">ii")
_conn_ids = itertools.count(1)


def _parse_address(text: str) -> Address:
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


class Proxy:
    """A running Sluice instance: listeners, the router, and every connection pair."""

    def __init__(self, settings: Settings, access_log: AccessLog | None = None) -> None:
        self.settings = settings
        self.router = Router(settings.listen.advertised_host, settings.listen.broker_port_base,
                             open_listener=self.open_listener)
        self.pipeline = Pipeline(self.router, SizeLimits.from_settings(settings.size_limit),
                                 Throttles.from_settings(settings.throttle),
                                 session_modes=SessionModes.from_settings(settings.sessions),
                                 session_server=SessionServer(SessionCache(settings.sessions.cache_slots,
                                                                           settings.sessions.eviction_age_s)))
        #: the global bound on response bytes held (size_limit.global_max_bytes), shared by every connection
        self.held = HeldBytes(settings.size_limit.global_max_bytes, on_change=metrics.RESPONSE_BYTES_HELD.set)
        self.access_log = access_log if access_log is not None else get_access_log()
        self.bootstrap: list[Address] = [_parse_address(a) for a in settings.upstream.bootstrap_servers]
        self._servers: dict[int | None, Any] = {}  # asyncio servers (or _Pending while one starts)
        self._clients: set[ClientConnection] = set()
        self._closing = False
        self.loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        listen = self.settings.listen
        self._servers[None] = await self.loop.create_server(
            lambda: ClientConnection(self, None), listen.host, listen.bootstrap_port, reuse_address=True
        )
        metrics.LISTENERS.set(len(self._servers))
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
        Requests already classified keep the snapshot they were classified with; the next ones see the new one."""
        self.settings = self.settings.model_copy(update={"size_limit": settings.size_limit,
                                                         "throttle": settings.throttle})
        self.pipeline.size_limits = SizeLimits.from_settings(settings.size_limit)
        self.held.set_limit(settings.size_limit.global_max_bytes)
        self.pipeline.set_throttles(Throttles.from_settings(settings.throttle))
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
        while any(c.busy for c in self._clients) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)  # polling a real condition (requests in flight), bounded by the deadline
        pending = sum(len(c.inflight) for c in self._clients)
        for client in list(self._clients):
            client.close()
        for server in self._servers.values():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)
        log.info("stopped", abandoned_requests=pending)

    # ------------------------------------------------------------------ brokers and listeners

    def open_listener(self, node_id: int) -> int:
        """Open broker ``node_id``'s listener *now* and return its port: the socket listens before the
        rewritten response naming the port reaches the client, so the client's connect lands in the backlog,
        not a refusal. Port = broker_port_base + node id (stable across restarts), or a free one if base is 0."""
        listen = self.settings.listen
        port = listen.broker_port_base + node_id if listen.broker_port_base else 0
        if self._closing or self.loop is None:
            return port
        sock = socket.socket(socket.AF_INET6 if ":" in listen.host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((listen.host, port))
            sock.listen(512)
            sock.setblocking(False)
        except OSError as e:
            sock.close()
            log.error("listener_failed", node_id=node_id, host=listen.host, port=port, error=str(e))
            return port
        self._servers[node_id] = _Pending(sock)
        self.loop.create_task(self._serve_socket(node_id, sock))
        return int(sock.getsockname()[1])

    async def _serve_socket(self, node_id: int, sock: socket.socket) -> None:
        assert self.loop is not None
        server = await self.loop.create_server(lambda: ClientConnection(self, node_id), sock=sock)
        self._servers[node_id] = server
        metrics.LISTENERS.set(len(self._servers))
        log.info("listening", role="broker", node_id=node_id, port=self.router.port_for(node_id),
                 upstream="{}:{}".format(*self.router.upstream[node_id]))

    async def upstream_address(self, node_id: int | None) -> list[Address]:
        if node_id is None:
            return list(self.bootstrap)
        if node_id not in self.router.upstream:
            await self.refresh_brokers()
        if node_id not in self.router.upstream:
            raise OSError(f"broker node {node_id} is unknown to the cluster")
        return [self.router.upstream[node_id]]

    async def refresh_brokers(self) -> None:
        """Ask a bootstrap server for the broker list (MetadataRequest v12, no topics) and open listeners."""
        last: Exception | None = None
        for host, port in self.bootstrap:
            try:
                body = await _one_request(host, port, 3, 12, Message(topics=[], allow_auto_topic_creation=False,
                                                                        include_topic_authorized_operations=False),
                                          self.settings.upstream.connect_timeout_s)
            except (TimeoutError, OSError, CodecError) as e:
                last = e
                continue
            for broker in body.brokers:
                self.router.learn(broker.node_id, broker.host, broker.port)
                self.router.port_for(broker.node_id)  # opens the node's listener on first sight
            return
        if last is not None:
            raise last

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


class _Pending:
    """Stands in for a listener whose asyncio server is still being created (its socket already listens)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sockets = [sock]

    def close(self) -> None:
        self.sockets[0].close()

    async def wait_closed(self) -> None:
        return None


async def _one_request(host: str, port: int, api_key: int, version: int, body: Message,
                       timeout: float) -> Message:
    """A single request/response on a fresh connection (Sluice's own Metadata lookups)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    try:
        header = Message(request_api_key=api_key, request_api_version=version, correlation_id=1,
                         client_id="sluice")
        assert request_header_version(api_key, version) == 2
        frame = encode_request(header, body)
        writer.write(len(frame).to_bytes(4, "big") + frame)
        size = int.from_bytes(await asyncio.wait_for(reader.readexactly(4), timeout), "big")
        data = await asyncio.wait_for(reader.readexactly(size), timeout)
        return decode_response(api_key, version, data)[1]
    finally:
        writer.close()


# ---------------------------------------------------------------------------------------------- connections


class ClientConnection(asyncio.Protocol):
    """A client's connection to one of Sluice's listeners, paired with one upstream connection."""

    def __init__(self, proxy: Proxy, node_id: int | None) -> None:
        self.proxy = proxy
        self.node_id = node_id
        self.conn_id = next(_conn_ids)
        self.transport: asyncio.Transport | None = None
        self.upstream: UpstreamConnection | None = None
        self._buf = bytearray()
        self._queued: list[bytes] = []  # frames received before the upstream connection is up
        self._queued_bytes = 0
        #: requests in client order still owed a response
        self.inflight: deque[Request] = deque()
        #: requests sent upstream whose response has not started arriving, in send order
        self.awaiting: deque[Request] = deque()
        self._connect_task: asyncio.Task[None] | None = None
        self._closed = False
        self._limits = proxy.settings.limits
        self.client_id: str | None = None
        self.listener = "bootstrap" if node_id is None else f"broker-{node_id}"
        self.upstream_name = ""
        self.state = ConnectionState()
        #: requests held back, in order, behind one waiting for response memory (size_limit.global_max_bytes)
        self._blocked: deque[Request] = deque()
        self._writing_paused = False
        self._release_on_drain = 0  # reserved bytes to release once the client has drained our writes
        self._muted_until = 0.0  # loop time until which a throttle mute (KIP-73 pacing) holds reading paused

    @property
    def busy(self) -> bool:
        return bool(self.inflight) and not self._closed

    # ------------------------------------------------------------------ asyncio callbacks

    def connection_made(self, transport: Any) -> None:  # uvloop's TCPTransport is not an asyncio.Transport
        self.transport = transport
        transport.set_write_buffer_limits(self._limits.write_high_water_bytes, self._limits.write_low_water_bytes)
        with contextlib.suppress(OSError, AttributeError):
            transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.proxy._clients.add(self)
        metrics.CLIENT_CONNECTIONS.inc()
        metrics.CLIENT_CONNECTIONS_OPEN.inc()
        self._connect_task = asyncio.get_running_loop().create_task(self._connect())

    def data_received(self, data: bytes) -> None:
        metrics.BYTES_CLIENT_TO_PROXY.inc(len(data))
        buf = self._buf
        buf += data
        off = 0
        max_frame = self._limits.max_frame_bytes
        while len(buf) - off >= 4:
            size = int.from_bytes(buf[off : off + 4], "big", signed=True)
            if size < 0 or size > max_frame:
                self._reject("too_large", f"request frame declares {size} bytes (limit {max_frame})")
                return
            end = off + 4 + size
            if len(buf) < end:
                break
            with memoryview(buf) as view:
                frame = bytes(view[off + 4 : end])
            off = end
            self._on_request(frame)
            if self._closed:
                return
        if off:
            del buf[:off]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.inflight and not self._closed:
            log.info("client_closed", conn=self.conn_id, pending=len(self.inflight))
        self._finish_close()

    def pause_writing(self) -> None:
        # The client reads slower than the broker sends: stop reading responses from upstream.
        self._writing_paused = True
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.pause_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._release_on_drain:
            n, self._release_on_drain = self._release_on_drain, 0
            self.proxy.held.release(n)
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.resume_reading()

    def mute(self, seconds: float) -> None:
        """KIP-73 pacing (policies/throttle.py): a fetcher that got only throttled partitions back is not read
        from for ``seconds`` (at most its max_wait_ms), like Kafka's channel muting for quotas (KIP-219),
        instead of letting it re-fetch at once in a tight loop."""
        if self.transport is None or self._closed or seconds <= 0:
            return
        loop = asyncio.get_running_loop()
        self._muted_until = max(self._muted_until, loop.time() + seconds)
        self.transport.pause_reading()
        loop.call_later(seconds, self._unmute)

    def _unmute(self) -> None:
        loop = self.proxy.loop
        if loop is not None and self._muted_until - loop.time() > 0.002:
            # a later mute is still running (timers may also fire a little early: libuv counts milliseconds)
            loop.call_later(self._muted_until - loop.time(), self._unmute)
            return
        if self.transport is not None and not self._closed and not self._blocked:
            self.transport.resume_reading()

    def release_held(self, n: int) -> None:
        """A response's reserved bytes are written: they stop counting once the transport buffer drains."""
        if not n:
            return
        if self._writing_paused:
            self._release_on_drain += n
        else:
            self.proxy.held.release(n)

    # ------------------------------------------------------------------ requests

    def _on_request(self, frame: bytes) -> None:
        try:
            req = self.proxy.pipeline.on_request(frame, self.state)
        except CodecError as e:
            reason = "unsupported_version" if "version" in e.what else "malformed"
            self._reject(reason, str(e))
            return
        self.client_id = req.header.client_id
        assert self.proxy.loop is not None
        req.started = self.proxy.loop.time()
        if self._blocked:
            self._blocked.append(req)  # keep the order behind a fetch waiting for response memory
            return
        self._dispatch(req)

    def _dispatch(self, req: Request, granted: bool = False) -> bool:
        """Answer locally or send upstream; False if the request must wait for response memory."""
        if req.local_response is not None:
            self.inflight.append(req)
            self._flush()
            return True
        if req.reserve and not granted:
            if not self.proxy.held.reserve(req.reserve, self._memory_granted):
                # size_limit.global_max_bytes: wait (in arrival order, across connections) rather than
                # allocate; stop reading from this client meanwhile.
                metrics.SIZE_LIMIT_WAITS.inc()
                self._blocked.appendleft(req)
                if self.transport is not None:
                    self.transport.pause_reading()
                return False
        req.held = req.reserve
        self._send_upstream(len(req.frame).to_bytes(4, "big"), req.frame)
        if req.expects_response:
            self.inflight.append(req)
            self.awaiting.append(req)
        else:
            self._complete(req, 0, 0)
        return True

    def resend(self, req: Request) -> None:
        """Send ``req.frame`` upstream again; ``req`` stays at the head of ``inflight``."""
        self._send_upstream(len(req.frame).to_bytes(4, "big"), req.frame)
        self.awaiting.append(req)

    def _memory_granted(self) -> None:
        """HeldBytes granted the reservation of the request at the head of ``_blocked``."""
        if self._closed:  # granted in the instant the connection went away: give it straight back
            self.proxy.held.release(self._blocked[0].reserve if self._blocked else 0)
            return
        self._dispatch(self._blocked.popleft(), granted=True)
        while self._blocked:
            if not self._dispatch(self._blocked.popleft()):
                return
        if self.transport is not None:
            self.transport.resume_reading()

    def _send_upstream(self, prefix: bytes, frame: bytes) -> None:
        n = len(prefix) + len(frame)
        metrics.BYTES_PROXY_TO_UPSTREAM.inc(n)
        up = self.upstream
        if up is not None and up.transport is not None:
            up.transport.writelines((prefix, frame))
            return
        self._queued.append(prefix)
        self._queued.append(frame)
        self._queued_bytes += n
        if self._queued_bytes > self._limits.write_high_water_bytes and self.transport is not None:
            self.transport.pause_reading()  # backpressure while the upstream connect is still in flight

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        timeout = self.proxy.settings.upstream.connect_timeout_s
        try:
            addresses = await self.proxy.upstream_address(self.node_id)
        except (TimeoutError, OSError, CodecError) as e:
            metrics.UPSTREAM_CONNECT_ERRORS.inc()
            log.warning("upstream_unknown", conn=self.conn_id, node_id=self.node_id, error=str(e))
            self.close()
            return
        last: BaseException | None = None
        for host, port in addresses:
            try:
                transport, _ = await asyncio.wait_for(
                    loop.create_connection(lambda: UpstreamConnection(self), host, port), timeout
                )
            except (TimeoutError, OSError) as e:
                metrics.UPSTREAM_CONNECT_ERRORS.inc()
                last = e
                continue
            if self._closed:
                transport.close()
                return
            self.upstream_name = f"{host}:{port}"
            queued, self._queued, self._queued_bytes = self._queued, [], 0
            if queued:
                transport.writelines(queued)
            if self.transport is not None:
                self.transport.resume_reading()
            return
        log.warning("upstream_connect_failed", conn=self.conn_id, node_id=self.node_id,
                    upstream=[f"{h}:{p}" for h, p in addresses], error=str(last))
        self.close()

    # ------------------------------------------------------------------ responses

    def write(self, data: Any) -> None:
        if self.transport is not None and not self._closed:
            self.transport.write(data)

    def writelines(self, buffers: list[Any]) -> None:
        if self.transport is not None and not self._closed:
            self.transport.writelines(buffers)

    def _flush(self) -> None:
        """Write responses Sluice made itself once every earlier response has gone out."""
        while self.inflight and self.inflight[0].local_response is not None:
            req = self.inflight.popleft()
            assert req.local_response is not None
            self.write(req.local_response)
            self._complete(req, 0, len(req.local_response))

    def response_done(self, req: Request, upstream_bytes: int, client_bytes: int) -> None:
        head = self.inflight.popleft()
        assert head is req
        self._complete(req, upstream_bytes, client_bytes)
        self._flush()

    def _complete(self, req: Request, upstream_bytes: int, client_bytes: int) -> None:
        assert self.proxy.loop is not None
        latency = self.proxy.loop.time() - req.started
        h = req.header
        metrics.observe_request(req.api, h.api_version, latency)
        if client_bytes:
            metrics.BYTES_PROXY_TO_CLIENT.inc(client_bytes)
        self.proxy.access_log.record(
            conn_id=self.conn_id, client_id=h.client_id, api=req.api, api_key=h.api_key, version=h.api_version,
            correlation_id=h.correlation_id, bytes_client_to_proxy=req.size,
            bytes_proxy_to_upstream=0 if req.local_response is not None else len(req.frame) + 4,
            bytes_upstream_to_proxy=upstream_bytes, bytes_proxy_to_client=client_bytes,
            latency_ms=latency * 1000.0, error_codes=req.error_codes, listener=self.listener,
            upstream=self.upstream_name, decoded=req.rewrite is not None or req.collect,
            partitions=req.partitions, throttle_target_bps=req.throttle_target_bps,
            throttled_bytes=req.throttled_bytes, session_upstream_bytes=req.session_upstream_bytes,
        )

    # ------------------------------------------------------------------ closing

    def _reject(self, reason: str, detail: str) -> None:
        metrics.FRAMES_REJECTED.labels(reason).inc()
        log.warning("frame_rejected", conn=self.conn_id, listener=self.listener, reason=reason, detail=detail,
                    client_id=self.client_id)
        self.close(abort=True)

    def close(self, abort: bool = False) -> None:
        if self.transport is not None and not self._closed:
            if abort:
                self.transport.abort()
            else:
                self.transport.close()
        self._finish_close()

    def _finish_close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.proxy._clients.discard(self)
        metrics.CLIENT_CONNECTIONS_OPEN.dec()
        self.proxy.pipeline.on_close(self.state)
        # Response memory this connection reserved, held or waits for goes back to the others.
        if self._blocked:
            self.proxy.held.cancel(self._memory_granted)
        held = sum(r.held for r in self.inflight) + self._release_on_drain
        if held:
            self.proxy.held.release(held)
        if self._connect_task is not None and not self._connect_task.done():
            self._connect_task.cancel()
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.close()


class UpstreamConnection(asyncio.Protocol):
    """Sluice's connection to a broker on behalf of one client connection; streams responses back."""

    def __init__(self, client: ClientConnection) -> None:
        self.client = client
        self.transport: asyncio.Transport | None = None
        self._hdr = bytearray()  # size prefix + correlation id of the response being read
        self._req: Request | None = None  # the request the response being read answers
        self._left = 0  # bytes of that response still to arrive
        self._size = 0
        self._collect: bytearray | None = None  # the response body, when a rule must rewrite it
        self._stream: FetchStreamer | None = None  # walks a Fetch v16+ response as it streams through
        self._max = client._limits.max_frame_bytes

    def connection_made(self, transport: Any) -> None:  # uvloop's TCPTransport is not an asyncio.Transport
        self.transport = transport
        limits = self.client._limits
        transport.set_write_buffer_limits(limits.write_high_water_bytes, limits.write_low_water_bytes)
        with contextlib.suppress(OSError, AttributeError):
            transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.client.upstream = self
        metrics.UPSTREAM_CONNECTIONS.inc()
        metrics.UPSTREAM_CONNECTIONS_OPEN.inc()

    def pause_writing(self) -> None:
        # The broker reads slower than the client sends: stop reading requests from the client.
        if self.client.transport is not None:
            self.client.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.client.transport is not None:
            self.client.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        metrics.BYTES_UPSTREAM_TO_PROXY.inc(len(data))
        client = self.client
        view = memoryview(data)
        pos, end = 0, len(data)
        while pos < end:
            if self._req is None:
                need = 8 - len(self._hdr)
                self._hdr += view[pos : pos + need]
                pos += min(need, end - pos)
                if len(self._hdr) < 8:
                    return
                if not self._start_response():
                    return
                continue
            take = min(self._left, end - pos)
            chunk = view[pos : pos + take]
            pos += take
            self._left -= take
            if self._stream is not None:
                try:
                    client.writelines(self._stream.feed(chunk))
                except CodecError as e:
                    self._fail(f"undecodable Fetch response: {e}")
                    return
            elif self._collect is not None:
                self._collect += chunk
            else:
                client.write(chunk)
            if self._left == 0:
                self._end_response()

    def _start_response(self) -> bool:
        size, corr = _SIZE_CORR.unpack(self._hdr)
        client = self.client
        if not client.awaiting:
            self._fail(f"unsolicited response (correlation id {corr})")
            return False
        req = client.awaiting.popleft()
        if size < 4 or size > self._max:
            self._fail(f"response frame declares {size} bytes (limit {self._max})")
            return False
        if corr != req.header.correlation_id:
            self._fail(f"response correlation id {corr} does not match request {req.header.correlation_id}")
            return False
        self._req, self._size, self._left = req, size, size - 4
        if req.held and size != req.held:
            client.proxy.held.adjust(size - req.held)  # the real size (KIP-74's first batch may exceed max_bytes)
            req.held = size
        if req.collect:
            self._collect = bytearray(self._hdr[4:])
        else:
            # Kafka answers in order, so this response's request is at the head of the client's queue
            # (no rule holds responses back yet): stream it straight through. A Fetch v16+ response is
            # walked on the way, to rewrite its NodeEndpoints tail (proxy/wire/fetch_stream.py).
            assert client.inflight and client.inflight[0] is req
            if req.rewrite is not None:
                self._stream = client.proxy.pipeline.fetch_streamer(req, size - 4)
            client.write(bytes(self._hdr))
        self._hdr.clear()
        if self._left == 0:
            self._end_response()
        return True

    def _end_response(self) -> None:
        req, self._req = self._req, None
        assert req is not None
        upstream_bytes = client_bytes = self._size + 4
        if self._stream is not None:
            stream, self._stream = self._stream, None
            if stream.rewritten or stream.scrubbed:
                metrics.RESPONSES_REWRITTEN.labels(req.api).inc()
        elif self._collect is not None:
            frame, self._collect = self._collect, None
            try:
                out = self.client.proxy.pipeline.on_response(req, frame, reissue_ok=not self.client.awaiting)
            except CodecError as e:
                # Relaying what Sluice cannot read could hand the client a real broker address: close instead.
                self._fail(f"undecodable {req.api} v{req.header.api_version} response: {e}")
                return
            if out.reissue is not None:
                # [sessions] terminate: the broker refused Sluice's own fetch session; the same fetch goes up
                # again as a full session request and the client's response waits for its answer. Nothing
                # was written to the client, and no other request is in flight behind this one.
                self.client.resend(req)
                return
            req.error_codes = out.error_codes
            client_bytes = out.size
            self.client.writelines(out.buffers)
            if out.mute_s:
                self.client.mute(out.mute_s)
            if out.changed:
                metrics.RESPONSES_REWRITTEN.labels(req.api).inc()
        if req.held:
            held, req.held = req.held, 0
            self.client.release_held(held)
        self.client.response_done(req, upstream_bytes, client_bytes)

    def _fail(self, detail: str) -> None:
        metrics.FRAMES_REJECTED.labels("malformed").inc()
        log.error("upstream_protocol_error", conn=self.client.conn_id, detail=detail)
        if self.transport is not None:
            self.transport.abort()
        self.client.close(abort=True)

    def connection_lost(self, exc: Exception | None) -> None:
        metrics.UPSTREAM_CONNECTIONS_OPEN.dec()
        client = self.client
        if client.awaiting and not client._closed:
            metrics.FRAMES_REJECTED.labels("upstream_closed").inc()
            req = client.awaiting[0]
            log.warning("upstream_closed", conn=client.conn_id, pending=len(client.awaiting),
                        api=req.api, version=req.header.api_version, error=str(exc) if exc else None)
        client.close()


# ---------------------------------------------------------------------------------------------- entry point


async def serve(settings: Settings, config_path: str | None = None) -> None:
    """`sluice run`: the proxy and its admin server until SIGTERM/SIGINT, then a graceful shutdown.
    SIGHUP re-reads ``config_path`` and applies the sections changeable at run time (proxy/reconfigure.py)."""
    from . import reconfigure
    from .admin import AdminServer

    proxy = Proxy(settings)
    await proxy.start()
    admin: AdminServer | None = None
    if settings.admin.enabled:
        admin = AdminServer(settings.admin, proxy.ready)
        reconfigure.add_routes(admin, proxy)
        await admin.start()
        log.info("admin_listening", host=settings.admin.host, port=admin.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, reconfigure.reload_file, proxy, config_path)
    try:
        await stop.wait()
    finally:
        log.info("shutting_down", drain_timeout_s=settings.shutdown.drain_timeout_s)
        await proxy.stop()
        if admin is not None:
            await admin.stop()


__all__ = ["ClientConnection", "Proxy", "UpstreamConnection", "serve"]
