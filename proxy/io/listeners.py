"""Accepting client connections: each listener's accept loop, and what happens to a connection before the core
sees a byte of it.

Every listener accepts in a loop of its own (:class:`Listener`), so that before a connection is handed to the
core Sluice can: read the PROXY protocol header off the socket (exactly its bytes, peeked first: what follows may
be a TLS handshake, which must reach the TLS layer whole), count the connection against the limits at accept as
Kafka does (:mod:`proxy.core.admission`), and run the TLS handshake with the context in force now
(:mod:`proxy.tls`: a certificate reload applies to the next connection) and see it fail (``create_server(ssl=...)``
would hide a failed handshake: no protocol is ever made for it). A refused connection is one log event
(rate-limited per reason and address) and one count, and concerns no other connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from typing import Any

from ..accesslog import LogLimiter, get_logger
from ..core.proxy_protocol import ProxyHeader, ProxyProtocolError
from ..core.proxy_protocol import parse as parse_proxy_header
from .host import ConnectionHost
from .transports import ClientProtocol, tls_error

__all__ = ["LISTEN_BACKLOG", "Listener", "Refusals", "accepted", "listening_socket"]

log = get_logger("sluice.server")

#: accept queue of every listener. asyncio's default (100) overflows when more clients connect in one instant than
#: the loop accepts meanwhile (kafka-go opens one connection per partition reader): the kernel then drops their
#: SYNs and each retries 1 s later (bench.storm counts the overflows). The kernel caps it at net.core.somaxconn.
LISTEN_BACKLOG = 1024


#: a refused connection is logged at most once per reason, address and error in this many seconds
REFUSED_LOG_INTERVAL_S = 10.0


class Refusals:
    """Client connections closed before their first request: each counted, and logged once per reason and address
    per interval (a client retrying in a loop, or a scanner, must not flood the log). One per host, shared by its
    listeners."""

    def __init__(self, host: ConnectionHost) -> None:
        self._count = host.metrics.connections_refused
        self._log = LogLimiter(REFUSED_LOG_INTERVAL_S, time.monotonic)

    def __call__(self, reason: str, client: str, listener: str, **detail: Any) -> None:
        self._count.labels(reason).inc()
        suppressed = self._log.allow((reason, client, detail.get("error")))
        if suppressed is not None:
            log.warning("connection_refused", reason=reason, client=client, listener=listener,
                        not_logged=suppressed, **detail)


async def accepted(proxy: ConnectionHost, refused: Refusals, sock: socket.socket, peer: Any,
                   node_id: int | None) -> None:
    """A connection accepted on listener ``node_id``: its PROXY header (if the listener reads one), the
    limits (at accept, as Kafka), the TLS handshake (with the context in force now), then the core."""
    assert proxy.loop is not None
    name = "bootstrap" if node_id is None else f"broker-{node_id}"
    policy = proxy.tls.listener(name)
    host, port = (peer[0], peer[1]) if isinstance(peer, tuple) else ("", 0)
    timeout = proxy.limits.request_timeout_s
    if policy.proxy_protocol != "off":
        try:
            header = await asyncio.wait_for(read_proxy_header(proxy.loop, sock, policy.proxy_protocol), timeout)
        except asyncio.CancelledError:  # Sluice is stopping
            sock.close()
            raise
        except (ProxyProtocolError, OSError, TimeoutError) as e:
            error = str(e) if isinstance(e, ProxyProtocolError) else \
                f"no PROXY header within {timeout:g} s" if isinstance(e, TimeoutError) else str(e)
            refused("proxy_protocol", host, name, error=error)
            sock.close()
            return
        if header.source is not None:
            host, port = header.source
    reason = proxy.admission.admit(host)
    if reason is not None:
        limits = proxy.limits
        refused(reason, host, name, limit=limits.max_connections if reason == "max_connections"
                else limits.max_connections_per_address)
        sock.close()
        return
    protocol = ClientProtocol(proxy, node_id, host, port)
    try:
        if policy.ssl is None:
            await proxy.loop.connect_accepted_socket(lambda: protocol, sock)
        else:
            await asyncio.wait_for(proxy.loop.connect_accepted_socket(
                lambda: protocol, sock, ssl=policy.ssl, ssl_handshake_timeout=timeout), timeout + 1.0)
    except BaseException as e:
        if protocol.transport is None:  # it never reached the core (whose teardown releases it): not counted
            proxy.admission.release(host)
        with contextlib.suppress(OSError):
            sock.close()
        if not isinstance(e, ssl.SSLError | OSError | TimeoutError):
            raise  # cancelled (Sluice is stopping), or a bug
        refused("tls_handshake" if policy.ssl is not None else "accept_failed", host, name, error=tls_error(e))


def listening_socket(host: str, port: int) -> socket.socket:
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


class Listener:
    """One listening socket and its accept loop: each accepted connection goes to :func:`accepted` in a task of its
    own (a slow PROXY header or TLS handshake holds up no other connection)."""

    def __init__(self, proxy: ConnectionHost, refused: Refusals, node_id: int | None, sock: socket.socket) -> None:
        self.proxy = proxy
        self.refused = refused
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
            task = loop.create_task(accepted(self.proxy, self.refused, conn, peer, self.node_id))
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


async def read_proxy_header(loop: asyncio.AbstractEventLoop, sock: socket.socket, versions: Any) -> ProxyHeader:
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
