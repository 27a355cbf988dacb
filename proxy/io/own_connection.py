"""Sluice's own hand-written connection to a broker, for the requests it makes itself (:mod:`proxy.io.cluster`
says which, and why not through confluent-kafka's AdminClient).

Over the upstream TLS settings, and authenticated first with Sluice's own identity when ``[upstream.sasl]`` names
one (KIP-43: SaslHandshake v1, then SaslAuthenticate v2): a broker's SASL listener closes a connection whose first
request is anything else. Held to the rules a Kafka client keeps:

- one request at a time on a connection, and Kafka answers in order, so the answer read next must carry the
  request's correlation id (NetworkClient.correlate in Kafka's client does the same check): one that does not
  means the stream is out of step, and the connection is closed;
- one deadline per call, the answer's size prefix and body together, and an answer larger than the frame bound
  (``[limits] max_frame_bytes``) is refused before its bytes are read, as the broker bounds requests
  (socket.request.max.bytes);
- a connection whose call failed in any way mid-exchange (timed out, cancelled, closed by the broker, too large)
  is closed: the unread rest of an answer would otherwise be read as the next request's;
- a request is never sent twice: a call that failed after its request was written may have been applied (an
  OffsetCommit, say), so it fails; only a connection the broker had closed while it was idle (seen before the
  request is written) is opened again first (:class:`Link`);
- a SASL session that the broker bounds (``connections.max.reauth.ms``: SaslAuthenticate v1+ answers with its
  lifetime, KIP-368) is not used past :data:`REAUTH_FRACTION` of that lifetime: the broker closes a connection
  whose session has expired when the next request arrives on it, unanswered (SocketServer's Processor), so the
  request would fail although it could have been made. Kafka's client re-authenticates on the connection at
  85-95% of the lifetime (SaslClientAuthenticator); Sluice's own connections carry few requests, so one whose
  session is that old is closed and another opened, authenticated afresh, before the request is written.
"""

from __future__ import annotations

import asyncio
import ssl

from ..config import UpstreamSaslSettings
from ..core.routing import Address
from ..core.sasl_client import SaslClient, SaslClientError
from ..wire.api_keys import ApiKey
from ..wire.messages import decode_response, encode_request
from ..wire.model import Message

__all__ = ["DEFAULT_MAX_FRAME_BYTES", "LINK_WIDTH", "Link", "NotSent", "OwnConnection"]

#: connections of Sluice's own to one broker at most (see :class:`Link`)
LINK_WIDTH = 4

#: the answer bound when none is given: Kafka's socket.request.max.bytes default, as [limits] max_frame_bytes
DEFAULT_MAX_FRAME_BYTES = 104857600

#: the share of a SASL session's lifetime after which its connection takes no new request (see the module
#: docstring): the lower end of the Java client's re-authentication window, so a request written just before it
#: reaches the broker well inside the session
REAUTH_FRACTION = 0.85


class OwnConnection:
    """A connection of Sluice's own to one broker; see the module docstring."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, address: Address,
                 timeout: float, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self._reader, self._writer = reader, writer
        self.address, self.timeout, self.max_frame_bytes = address, timeout, max_frame_bytes
        self._corr = 0
        self.closed = False
        #: the event loop's time from which this connection takes no new request (its SASL session is near its
        #: end), or None when the broker bounds no session
        self.reauth_at: float | None = None

    @classmethod
    async def open(cls, address: Address, timeout: float, tls: ssl.SSLContext | None,
                   sasl: UpstreamSaslSettings | None,
                   max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> OwnConnection:
        host, port = address
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=tls, server_hostname=host if tls is not None else None), timeout)
        conn = cls(reader, writer, address, timeout, max_frame_bytes)
        try:
            if sasl is not None and sasl.mechanism:
                await conn._login(sasl)
        except BaseException:
            conn.close()
            raise
        return conn

    async def _login(self, sasl: UpstreamSaslSettings) -> None:
        host, port = self.address
        shake = await self.call(ApiKey.SASL_HANDSHAKE, 1, Message(mechanism=sasl.mechanism))
        if shake.error_code:
            raise OSError(f"{host}:{port} refused SASL mechanism {sasl.mechanism} (error {shake.error_code})")
        client = SaslClient(sasl.mechanism, sasl.username, sasl.secret())
        token: bytes | None = client.first()
        started = asyncio.get_running_loop().time()  # the lifetime counts from the broker's authentication
        while token is not None:
            answer = await self.call(ApiKey.SASL_AUTHENTICATE, 2, Message(auth_bytes=token))
            if answer.session_lifetime_ms > 0:  # 0: the broker bounds no session (no connections.max.reauth.ms)
                self.reauth_at = started + answer.session_lifetime_ms / 1000 * REAUTH_FRACTION
            if answer.error_code:
                # the broker's message names the failure, never the credential
                raise OSError(f"{host}:{port}: Sluice's own SASL authentication failed: {answer.error_message}")
            try:
                token = client.next(bytes(answer.auth_bytes or b""))
            except SaslClientError as e:
                raise OSError(f"{host}:{port}: {e}") from None

    @property
    def idle_closed(self) -> bool:
        """The broker closed this connection while no request was on it (its end of stream already read): a
        request written now would be lost unread, so the connection is to be opened again first."""
        return self._reader.at_eof() or self._writer.is_closing()

    @property
    def session_ending(self) -> bool:
        """Its SASL session is near the end the broker set: a request written now could meet a closed session
        (see the module docstring), so the connection is to be opened again first."""
        return self.reauth_at is not None and asyncio.get_running_loop().time() >= self.reauth_at

    async def call(self, api_key: int, version: int, body: Message) -> Message:
        """Send one request and read its answer, within one deadline. Any failure on the way (a timeout, a
        cancellation, the broker closing, an answer to another request or over the frame bound) closes the
        connection before it propagates."""
        if self.closed:
            raise OSError(f"{self.address[0]}:{self.address[1]}: connection closed")
        self._corr += 1
        corr = self._corr
        header = Message(request_api_key=api_key, request_api_version=version, correlation_id=corr,
                         client_id="sluice")
        frame = encode_request(header, body)
        try:
            self._writer.write(len(frame).to_bytes(4, "big") + frame)
            async with asyncio.timeout(self.timeout):
                size = int.from_bytes(await self._reader.readexactly(4), "big")
                if size > self.max_frame_bytes:
                    raise OSError(f"{self.address[0]}:{self.address[1]}: an answer of {size} bytes, over the frame "
                                  f"bound ({self.max_frame_bytes})")
                data = await self._reader.readexactly(size)
            head, answer = decode_response(api_key, version, data)
            if head.correlation_id != corr:
                raise OSError(f"{self.address[0]}:{self.address[1]}: answer with correlation id "
                              f"{head.correlation_id} to request {corr}")
            return answer
        except BaseException:  # CancelledError included: the stream's position is unknown from here on
            self.close()
            raise

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._writer.close()


class Link:
    """Sluice's own connections to one broker: up to ``width`` at once (a broker serves one connection's requests in
    turn, so requests made at once, such as several members' slice commits, would each wait for all the others' on
    a single connection), each opened on first use, one request at a time on each, opened again when its last call
    failed (it closed it), the broker closed it while idle or its SASL session is near its end. A call is made
    once: it fails if anything goes wrong after its request was written (see the module docstring)."""

    def __init__(self, address: Address, timeout: float, tls: ssl.SSLContext | None,
                 sasl: UpstreamSaslSettings | None, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 width: int = LINK_WIDTH) -> None:
        self.address, self.timeout, self._tls, self._sasl = address, timeout, tls, sasl
        self.max_frame_bytes = max_frame_bytes
        self._slots = asyncio.Semaphore(width)
        #: connections open and idle, the most recently used last
        self._idle: list[OwnConnection] = []

    @property
    def idle_closed(self) -> bool:
        """An idle connection is open on Sluice's side only (the broker closed it while idle): the next request
        that would use it opens another first."""
        return any(not c.closed and c.idle_closed for c in self._idle)

    async def request(self, api_key: int, version: int, body: Message) -> Message:
        """One request and its answer. OSError names the broker: :class:`NotSent` if the request never left
        (no connection could be made), else the call's failure, after which it must not be sent again."""
        async with self._slots:
            conn = None
            while self._idle and conn is None:
                conn = self._idle.pop()
                if conn.closed or conn.idle_closed or conn.session_ending:
                    conn.close()
                    conn = None
            if conn is None:
                try:
                    conn = await OwnConnection.open(self.address, self.timeout, self._tls, self._sasl,
                                                    self.max_frame_bytes)
                except (OSError, TimeoutError, asyncio.IncompleteReadError) as e:
                    raise NotSent(f"{self.address[0]}:{self.address[1]}: {e!r}") from None
            try:
                answer = await conn.call(api_key, version, body)
            except (OSError, TimeoutError, asyncio.IncompleteReadError) as e:
                conn.close()
                raise OSError(f"{self.address[0]}:{self.address[1]}: {e!r}") from None
            except BaseException:
                conn.close()
                raise
            self._idle.append(conn)
            return answer

    def close(self) -> None:
        """Close the idle connections (one a call holds is closed by the call's end: cancelled when Sluice stops)."""
        for conn in self._idle:
            conn.close()
        self._idle.clear()


class NotSent(OSError):
    """A request that never reached the broker (no connection could be made): safe to try at another broker."""
