"""The admin server's sockets: HTTP/1.1 over asyncio streams (TLS when given a context), each connection driven by
an h11 state machine (h11 parses and frames; this module reads, writes and keeps time). What to answer is the
caller's (``answer``: :meth:`proxy.admin.AdminServer.answer`, sans-IO).

- Keep-alive: a connection waits :data:`KEEP_ALIVE_S` for its next request, then closes.
- A request (head and body) must arrive within :data:`REQUEST_TIMEOUT_S` of its first byte (else 408), with a
  body of at most :data:`MAX_BODY_BYTES` (else 413), and its answer must be taken within :data:`WRITE_TIMEOUT_S`:
  a slow or stuck client holds its own connection, nothing else.
- A malformed request is answered 400 (h11's status hint), logged (rate-limited per client), and its connection
  closed; the server and the other connections carry on.
- :meth:`HttpServer.stop` stops listening, closes the idle connections, and gives the requests in flight the
  grace period to be answered (with ``Connection: close``) before it closes their connections too.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from http import HTTPStatus
from typing import Any

import h11

from ..accesslog import LogLimiter, get_logger
from ..http_routes import HTTPError, Request, Response, text_response
from .listeners import listening_socket

__all__ = ["KEEP_ALIVE_S", "MAX_BODY_BYTES", "REQUEST_TIMEOUT_S", "WRITE_TIMEOUT_S", "HttpServer"]

log = get_logger("sluice.admin")

Answer = Callable[[Request], Awaitable[Response]]

#: idle time between requests before a connection is closed: longer than the usual Prometheus scrape interval
#: (15-60 s), so a scraper keeps its connection
KEEP_ALIVE_S = 75.0
#: a request must arrive whole this long after its first byte
REQUEST_TIMEOUT_S = 30.0
#: an answer must be taken by the client within this long
WRITE_TIMEOUT_S = 30.0
#: the largest request body taken (a section's JSON is a few KiB; a long list of entries fits)
MAX_BODY_BYTES = 1 << 20
TLS_HANDSHAKE_TIMEOUT_S = 10.0
#: a malformed request is logged at most once per client in this many seconds
BAD_REQUEST_LOG_INTERVAL_S = 10.0
_READ_BYTES = 65536


class HttpServer:
    """One listening socket and its connections; made by :meth:`start`."""

    def __init__(self, answer: Answer, port: int) -> None:
        self.port = port
        self._answer = answer
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._idle: set[asyncio.Task[None]] = set()  # waiting for their next request's first byte
        self._closing = False
        self._bad_requests = LogLimiter(BAD_REQUEST_LOG_INTERVAL_S, time.monotonic)

    @classmethod
    async def start(cls, answer: Answer, host: str, port: int, tls: ssl.SSLContext | None) -> HttpServer:
        """Listening on ``host:port`` (0: a free port, then :attr:`port`); OSError if it cannot bind."""
        sock = listening_socket(host, port)
        server = cls(answer, int(sock.getsockname()[1]))
        options: dict[str, Any] = {"ssl": tls, "ssl_handshake_timeout": TLS_HANDSHAKE_TIMEOUT_S} if tls else {}
        try:
            server._server = await asyncio.start_server(server._accepted, sock=sock, **options)
        except BaseException:
            sock.close()
            raise
        return server

    async def stop(self, grace_s: float) -> None:
        self._closing = True
        if self._server is not None:
            self._server.close()
        for task in list(self._idle):
            task.cancel()
        if self._connections:
            _, pending = await asyncio.wait(set(self._connections), timeout=grace_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)

    # ---------------------------------------------------------------------------------------- connections

    def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._closing:  # its TLS handshake ended after stop() began
            writer.close()
            return
        task = asyncio.get_running_loop().create_task(self._serve(reader, writer))
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER)
        peer = writer.get_extra_info("peername")
        client = str(peer[0]) if peer else ""
        certificate = writer.get_extra_info("peercert")  # None without TLS or without a client certificate
        try:
            while True:
                try:
                    request = await self._request(conn, reader, writer, client, certificate)
                except h11.RemoteProtocolError as e:
                    suppressed = self._bad_requests.allow(client)
                    if suppressed is not None:
                        log.warning("admin_bad_request", client=client, error=str(e), not_logged=suppressed)
                    await self._respond(conn, writer, text_response(f"bad request: {e}\n", e.error_status_hint),
                                        head=False, close=True)
                    return
                except HTTPError as e:  # the server's own answer (408, 413), then the connection closes
                    await self._respond(conn, writer, e.response, head=False, close=True)
                    return
                if request is None:
                    return
                response = await self._answer(request)
                await self._respond(conn, writer, response, head=request.method == "HEAD", close=self._closing)
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return  # MUST_CLOSE: either side said Connection: close (or HTTP/1.0)
                conn.start_next_cycle()
        except (OSError, TimeoutError):
            pass  # the client went away, or did not take its answer
        except h11.LocalProtocolError as e:  # an answer HTTP cannot carry: a handler's bug, this request's
            log.error("admin_response_failed", client=client, error=str(e))
        except Exception as e:  # a bug here: this connection's end, not the server's
            log.error("admin_connection_failed", client=client, error=repr(e), exc_info=True)
        finally:
            writer.close()

    async def _request(self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       client: str, certificate: Mapping[str, Any] | None) -> Request | None:
        """The next request, read whole; None when the client closed (or kept silent) between requests."""
        loop = asyncio.get_running_loop()
        head: h11.Request | None = None
        body = bytearray()
        deadline: float | None = None  # set at the request's first byte
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await self._read(reader, deadline, loop)
                if data is None:
                    return None
                deadline = deadline if deadline is not None else loop.time() + REQUEST_TIMEOUT_S
                conn.receive_data(data)
            elif isinstance(event, h11.Request):
                head = event
                length = next((int(v) for k, v in event.headers if k == b"content-length"), 0)
                if length > MAX_BODY_BYTES:
                    raise HTTPError(text_response(f"request body over {MAX_BODY_BYTES} bytes\n", 413))
                if conn.they_are_waiting_for_100_continue:
                    writer.write(conn.send(h11.InformationalResponse(status_code=100, headers=[])))
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > MAX_BODY_BYTES:
                    raise HTTPError(text_response(f"request body over {MAX_BODY_BYTES} bytes\n", 413))
            elif isinstance(event, h11.EndOfMessage):
                assert head is not None
                return Request.parse(head.method, head.target, head.headers, bytes(body), client, certificate)
            else:  # ConnectionClosed: the client closed between requests
                return None

    async def _read(self, reader: asyncio.StreamReader, deadline: float | None,
                    loop: asyncio.AbstractEventLoop) -> bytes | None:
        """The next bytes (b"": the client closed); None when it stayed silent between requests or stop() began."""
        if deadline is not None:
            try:
                return await asyncio.wait_for(reader.read(_READ_BYTES), max(0.0, deadline - loop.time()))
            except TimeoutError:
                raise HTTPError(text_response("request timeout\n", 408)) from None
        if self._closing:
            return None
        task = asyncio.current_task()
        assert task is not None
        self._idle.add(task)  # stop() closes it
        try:
            return await asyncio.wait_for(reader.read(_READ_BYTES), KEEP_ALIVE_S)
        except TimeoutError:
            return None
        finally:
            self._idle.discard(task)

    async def _respond(self, conn: h11.Connection, writer: asyncio.StreamWriter, response: Response, *, head: bool,
                       close: bool) -> None:
        if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        headers = [("Content-Type", response.content_type), ("Content-Length", str(len(response.body))),
                   *response.headers]
        if close:
            headers.append(("Connection", "close"))
        writer.write(conn.send(h11.Response(status_code=response.status, headers=headers,
                                            reason=_reason(response.status))))
        if response.body and not head:  # HEAD: the headers GET would have, no body (RFC 9110 9.3.2)
            writer.write(conn.send(h11.Data(data=response.body)))
        writer.write(conn.send(h11.EndOfMessage()))
        await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT_S)


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:  # a status of a handler's own: the reason phrase is optional (RFC 9112 4)
        return ""
