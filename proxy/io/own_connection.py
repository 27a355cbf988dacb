"""Sluice's own hand-written connection to a broker, for the requests it makes itself (:mod:`proxy.io.cluster`
says which, and why not through confluent-kafka's AdminClient).

Over the upstream TLS settings, and authenticated first with Sluice's own identity when ``[upstream.sasl]`` names
one (KIP-43: SaslHandshake v1, then SaslAuthenticate v2): a broker's SASL listener closes a connection whose first
request is anything else. One request at a time on a connection, and Kafka answers in order, so the answer read
next must carry the request's correlation id (NetworkClient.correlate in Kafka's client does the same check): one
that does not means the stream is out of step, and the connection is closed. So is a connection whose call
failed in any way mid-exchange - timed out, cancelled, closed by the broker: the unread rest of an answer would
otherwise be read as the next request's.
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

__all__ = ["LINK_WIDTH", "Link", "OwnConnection", "one_request"]

#: connections of Sluice's own to one broker for group requests at most (see :class:`Link`)
LINK_WIDTH = 4


class OwnConnection:
    """A connection of Sluice's own to one broker; see the module docstring."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, address: Address,
                 timeout: float) -> None:
        self._reader, self._writer = reader, writer
        self.address, self.timeout = address, timeout
        self._corr = 0
        self.closed = False

    @classmethod
    async def open(cls, address: Address, timeout: float, tls: ssl.SSLContext | None,
                   sasl: UpstreamSaslSettings | None) -> OwnConnection:
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
        shake = await self.call(ApiKey.SASL_HANDSHAKE, 1, Message(mechanism=sasl.mechanism))
        if shake.error_code:
            raise OSError(f"{host}:{port} refused SASL mechanism {sasl.mechanism} (error {shake.error_code})")
        client = SaslClient(sasl.mechanism, sasl.username, sasl.secret())
        token: bytes | None = client.first()
        while token is not None:
            answer = await self.call(ApiKey.SASL_AUTHENTICATE, 2, Message(auth_bytes=token))
            if answer.error_code:
                # the broker's message names the failure, never the credential
                raise OSError(f"{host}:{port}: Sluice's own SASL authentication failed: {answer.error_message}")
            try:
                token = client.next(bytes(answer.auth_bytes or b""))
            except SaslClientError as e:
                raise OSError(f"{host}:{port}: {e}") from None

    async def call(self, api_key: int, version: int, body: Message) -> Message:
        """Send one request and read its answer. Any failure on the way (a timeout, a cancellation, the broker
        closing, an answer to another request) closes the connection before it propagates."""
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
            async with asyncio.timeout(self.timeout):
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
    """Sluice's own connections to one broker for its group requests: up to ``width`` at once, each opened on first
    use, one request at a time on each (a broker serves one connection's requests in turn, so group requests of
    several members committing at once would each wait for all the others' on a single connection), opened again
    after a failure (a failed call has closed it)."""

    def __init__(self, address: Address, timeout: float, tls: ssl.SSLContext | None,
                 sasl: UpstreamSaslSettings | None, width: int = LINK_WIDTH) -> None:
        self.address, self.timeout, self._tls, self._sasl = address, timeout, tls, sasl
        self._slots = asyncio.Semaphore(width)
        #: connections open and idle
        self._idle: list[OwnConnection] = []

    async def request(self, api_key: int, version: int, body: Message) -> Message:
        async with self._slots:
            conn = self._idle.pop() if self._idle else None
            for attempt in (1, 2):  # a connection the broker closed while idle: opened again, once
                if conn is not None and conn.closed:
                    conn = None
                try:
                    if conn is None:
                        conn = await OwnConnection.open(self.address, self.timeout, self._tls, self._sasl)
                    answer = await conn.call(api_key, version, body)
                except (OSError, TimeoutError, asyncio.IncompleteReadError) as e:
                    if conn is not None:
                        conn.close()
                    conn = None
                    if attempt == 2:
                        raise OSError(f"{self.address[0]}:{self.address[1]}: {e!r}") from None
                else:
                    self._idle.append(conn)
                    return answer
            raise AssertionError("unreachable")

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()


async def one_request(address: Address, api_key: int, version: int, body: Message, timeout: float,
                      tls: ssl.SSLContext | None = None, sasl: UpstreamSaslSettings | None = None) -> Message:
    """A single request/response on a fresh connection of Sluice's own (its Metadata lookups)."""
    conn = await OwnConnection.open(address, timeout, tls, sasl)
    try:
        return await conn.call(api_key, version, body)
    finally:
        conn.close()
