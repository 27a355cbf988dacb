"""The transports of a client connection: the client's (:class:`ClientProtocol`), the upstream connection made for
it (:class:`UpstreamProtocol`), and the :class:`~proxy.core.connection.Port` through which the sans-IO core acts
on both.

Everything a connection decides (framing, order, waits, policies, backpressure rules, effects) is in the core
(:mod:`proxy.core.connection`); here each client connection feeds the core with what its two transports deliver
and carries out what the core asks.

- asyncio Protocols, not streams: a relay spends its time moving bytes, and Protocol callbacks avoid the
  per-read task wakeups and buffer copies of StreamReader (measured here: about 3x less CPU for relaying).
- One upstream connection per client connection, to the broker whose listener the client connected to (the
  bootstrap listener goes to any bootstrap server). Kafka matches responses to requests by order on a
  connection, so a 1:1 pairing keeps pipelining intact without rewriting correlation ids.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Callable, Sequence
from typing import Any

from ..core.connection import Timer
from ..core.exchange import Buffer, ConnectionInfo
from ..wire.errors import CodecError
from .host import ConnectionHost

__all__ = ["CLOSE_LINGER_S", "ClientProtocol", "UpstreamProtocol", "tls_error"]

#: how long a client connection Sluice closed may take to read what was written to it and close its side; then
#: it is reset (a client that never reads or never closes holds no socket for longer). Kafka's clients close as
#: soon as they read the FIN; a shutdown waits this much at most after its drain, inside the 5 s the Helm chart
#: adds to the drain for the grace period
CLOSE_LINGER_S = 3.0


def tls_error(e: BaseException) -> str:
    """A handshake failure in one line: OpenSSL's reason (e.g. TLSV1_ALERT_UNKNOWN_CA, CERTIFICATE_VERIFY_FAILED
    with its verify message, PEER_DID_NOT_RETURN_A_CERTIFICATE)."""
    if isinstance(e, ssl.SSLCertVerificationError):
        return f"{e.reason}: {e.verify_message}"
    if isinstance(e, ssl.SSLError):
        return str(e.reason or e)
    if isinstance(e, TimeoutError):
        return "handshake timed out"
    return str(e) or type(e).__name__


def configure(transport: Any, limits: Any) -> None:
    transport.set_write_buffer_limits(limits.write_high_water_bytes, limits.write_low_water_bytes)
    with contextlib.suppress(OSError, AttributeError):
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class ClientProtocol(asyncio.Protocol):
    """A client's connection to one of Sluice's listeners, the upstream connection made for it, and the
    :class:`~proxy.core.connection.Port` through which the core acts on both."""

    def __init__(self, proxy: ConnectionHost, node_id: int | None, host: str = "", port: int = 0) -> None:
        self.proxy = proxy
        self.node_id = node_id
        self.transport: Any = None  # uvloop's TCPTransport is not an asyncio.Transport
        self.upstream: Any = None
        #: the upstream transport's protocol (it switches to its ``read_into`` and back: read_upstream_into)
        self._upstream_protocol: UpstreamProtocol | None = None
        self._connect_task: asyncio.Task[None] | None = None
        self._torn_down = False
        #: the client's transport is gone (connection_lost)
        self._lost = False
        #: resets a closed connection whose client has not closed its side within CLOSE_LINGER_S
        self._linger: asyncio.TimerHandle | None = None
        #: admitted by proxy.io.listeners.accepted (the limits count it until teardown)
        self.host = host
        # made in a coroutine of the loop (proxy.io.listeners.accepted), which serves it for good: kept, since on
        # CPython 3.11 each asyncio.get_running_loop() makes a getpid() system call (_asynciomodule.c's check for a
        # fork), and the core asks for the loop's next turn once per collected response (defer) and for its timers
        self._loop = asyncio.get_running_loop()
        info = ConnectionInfo(proxy.next_connection_id(), "bootstrap" if node_id is None else f"broker-{node_id}",
                              node_id, host, port)
        self.conn = proxy.connection(info, self)
        # each read goes straight to the core: the transport binds data_received when the protocol is set
        # (uvloop keeps the bound callable), so an instance attribute spares a Python call per read
        self.data_received = self.conn.client_data  # type: ignore[method-assign]

    # ------------------------------------------------------------------ the client's transport

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        configure(transport, self.proxy.limits)
        self.proxy.opened(self.conn)
        m = self.proxy.metrics
        m.client_connections.inc()
        m.client_connections_open.inc()
        self._connect_task = self._loop.create_task(self._connect())

    def data_received(self, data: bytes) -> None:
        self.conn.client_data(data)

    def pause_writing(self) -> None:
        self.conn.client_write_paused()

    def resume_writing(self) -> None:
        self.conn.client_write_resumed()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self.proxy.closing.discard(self)
        if self._linger is not None:
            self._linger.cancel()
        self.conn.client_lost()
        self._teardown(abort=False)

    async def _connect(self) -> None:
        proxy, conn = self.proxy, self.conn
        try:
            addresses = await proxy.upstream_address(self.node_id)
        except (TimeoutError, OSError, CodecError) as e:
            proxy.metrics.upstream_connect_errors.inc()
            proxy.connect_failed(self.node_id, str(e))
            conn.upstream_failed(str(e))
            return
        last: BaseException | None = None
        for host, port in addresses:
            protocol = UpstreamProtocol(self)
            try:
                await self._open_upstream(protocol, host, port)
            except BaseException as e:
                # A connect that failed, timed out or was cancelled (the client gone) may already have made its
                # connection: uvloop calls connection_made, then, the connect's waiter cancelled before the
                # connect returned, closes the transport's handle itself, and the connection_lost a close had
                # scheduled is never called (uvloop loop.pyx create_connection, handles/basetransport.pyx
                # _call_connection_lost; MagicStack/uvloop#552 is the same kind). That connection is gone.
                self._abandon(protocol)
                if not isinstance(e, (TimeoutError, OSError)):
                    raise
                proxy.metrics.upstream_connect_errors.inc()
                last = e
                continue
            if conn.closed:
                self._teardown(abort=False)
                return
            conn.upstream_ready(f"{host}:{port}")
            return
        proxy.connect_failed(self.node_id, tls_error(last) if last is not None else "", addresses)
        conn.upstream_failed(str(last))

    async def _open_upstream(self, protocol: UpstreamProtocol, host: str, port: int) -> None:
        """Connect ``protocol`` to the broker at host:port (TLS if the upstream has it), within the connect timeout."""
        loop = asyncio.get_running_loop()
        timeout = self.proxy.upstream.connect_timeout_s
        tls = self.proxy.tls.upstream
        if tls is None:
            await asyncio.wait_for(loop.create_connection(lambda: protocol, host, port), timeout)
        else:
            await asyncio.wait_for(loop.create_connection(
                lambda: protocol, host, port, ssl=tls, server_hostname=host, ssl_handshake_timeout=timeout), timeout)

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
        return self._loop.call_later(delay, callback)

    def defer(self, callback: Callable[[], None]) -> None:
        self._loop.call_soon(callback)

    def read_upstream_into(self, on: bool) -> None:
        # A transport takes a new protocol between two reads, even from inside a read's callback (uvloop's
        # set_protocol restarts reading with the callbacks of the new protocol's kind; asyncio's selector and SSL
        # transports switch theirs likewise), and a BufferedProtocol's reads go into the buffer it hands out.
        upstream = self._upstream_protocol
        if self.upstream is None or self._torn_down or upstream is None:
            return
        self.upstream.set_protocol(upstream.read_into if on else upstream)

    @property
    def torn_down(self) -> bool:
        """Both transports are closed (or closing): nothing more is written."""
        return self._torn_down

    def _abandon(self, protocol: UpstreamProtocol) -> None:
        """The connect that made ``protocol`` did not return it (the loop has closed what it made): it is no
        longer this connection's upstream."""
        protocol.abandon()
        if self._upstream_protocol is protocol:
            self.upstream = None
            self._upstream_protocol = None

    def upstream_made(self, transport: Any, protocol: UpstreamProtocol) -> None:
        """The upstream connection is up (its transport and protocol); one made after the teardown is closed."""
        if self._torn_down:
            transport.close()
            return
        self.upstream = transport
        self._upstream_protocol = protocol

    def _teardown(self, abort: bool) -> None:
        if self._torn_down:
            return
        self._torn_down = True
        self.proxy.closed(self.conn)
        self.proxy.admission.release(self.host)
        self.proxy.metrics.client_connections_open.dec()
        if self.transport is not None and not self._lost:
            if abort:
                self.transport.abort()
            else:
                self.close_client()
        if self.upstream is not None:
            self.upstream.close()
        if self._connect_task is not None and not self._connect_task.done():
            self._connect_task.cancel()

    def close_client(self) -> None:
        """Close the client's side so that everything written reaches the client. A socket closed with input
        still unread sends an RST, not a FIN (RFC 1122 4.2.2.13), and the kernel then drops what it has not sent:
        the answer to a request read before a shutdown, followed by one sent after it began (a consumer's
        heartbeat, its next fetch), could be cut. So Sluice half-closes (a FIN after the last byte written),
        reads and drops what the client still sends until it closes its side (eof_received's default: the
        transport closes), then closes; CLOSE_LINGER_S bounds the wait. TLS has no half-close: its close sends
        close_notify after what is written and reads until the client's (asyncio's SSL shutdown). Either way the
        host waits for the transport to go (``closing``), so a shutdown's exit cuts nothing."""
        transport = self.transport
        if not transport.is_closing():  # else closing already (the client ended it): connection_lost follows
            if not transport.can_write_eof():
                transport.close()
            else:
                try:
                    transport.write_eof()
                except RuntimeError:
                    return  # uvloop: its handle is closed already, nothing is left to write or wait for
                transport.resume_reading()  # reads go to the closed core, which drops them
        self.proxy.closing.add(self)
        self._linger = self._loop.call_later(CLOSE_LINGER_S, transport.abort)


class UpstreamProtocol(asyncio.Protocol):
    """Sluice's connection to a broker on behalf of one client connection."""

    def __init__(self, client: ClientProtocol) -> None:
        self.client = client
        self.conn = client.conn
        self.data_received = self.conn.upstream_data  # type: ignore[method-assign]  # as ClientProtocol's
        #: the transport's protocol while a collected response is read in place
        self.read_into = ReadInto(self)
        #: counted in sluice_connections_open{side="upstream"}: from connection_made until it is gone
        self._open = False
        #: the connect that made it did not return it (ClientProtocol._abandon): its end is not the client's
        self._abandoned = False

    def connection_made(self, transport: Any) -> None:
        client = self.client
        configure(transport, client.proxy.limits)
        m = client.proxy.metrics
        m.upstream_connections.inc()
        m.upstream_connections_open.inc()
        self._open = True
        client.upstream_made(transport, self)

    def abandon(self) -> None:
        """The connect that made it failed or was cancelled: it is gone now, whether or not connection_lost comes,
        and a connection_lost that comes later ends nothing of the client's."""
        self._abandoned = True
        self._gone()

    def _gone(self) -> None:
        """It leaves the open count, once."""
        if self._open:
            self._open = False
            self.client.proxy.metrics.upstream_connections_open.dec()

    def data_received(self, data: bytes) -> None:
        self.conn.upstream_data(data)

    def pause_writing(self) -> None:
        self.conn.upstream_write_paused()

    def resume_writing(self) -> None:
        self.conn.upstream_write_resumed()

    def connection_lost(self, exc: Exception | None) -> None:
        self._gone()
        if not self._abandoned:
            self.conn.upstream_lost(str(exc) if exc else None)


class ReadInto(asyncio.BufferedProtocol):
    """The upstream transport's protocol while a collected response is read straight into the core's buffer
    (``Port.read_upstream_into``): each read lands in place, with no ``bytes`` made of it and no join at the end.
    Everything else is the upstream connection's own (:class:`UpstreamProtocol`)."""

    def __init__(self, upstream: UpstreamProtocol) -> None:
        self.upstream = upstream
        self.conn = upstream.conn

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.conn.upstream_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        self.conn.upstream_read_into(nbytes)

    def pause_writing(self) -> None:
        self.upstream.pause_writing()

    def resume_writing(self) -> None:
        self.upstream.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.upstream.connection_lost(exc)
