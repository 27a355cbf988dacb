"""A local socket server speaking just enough Kafka for unit tests of Sluice's own client's failure paths: each
request is decoded and handed to ``behave``, which answers it (or not, or wrongly)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from proxy.wire.messages import decode_request, encode_response
from proxy.wire.model import Message

__all__ = ["Behaviour", "Broker", "frame", "running"]

#: what the broker does with a request: (header, body, writer) -> awaited
Behaviour = Callable[[Message, Message, asyncio.StreamWriter], Awaitable[None]]


def frame(api_key: int, version: int, correlation_id: int, body: Message) -> bytes:
    """A response as it travels: size prefix, header, body."""
    data = encode_response(api_key, version, Message(correlation_id=correlation_id), body)
    return len(data).to_bytes(4, "big") + data


class Broker:
    def __init__(self, behave: Behaviour) -> None:
        self.behave = behave
        self.connections = 0
        #: set when a connection of the client's is closed (the broker reads EOF)
        self.client_closed = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                size = int.from_bytes(await reader.readexactly(4), "big")
                header, body = decode_request(await reader.readexactly(size))
                await self.behave(header, body, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            self.client_closed.set()
        finally:
            writer.close()

    @property
    def address(self) -> tuple[str, int]:
        assert self.server is not None
        host, port = self.server.sockets[0].getsockname()[:2]
        return host, port


@asynccontextmanager
async def running(behave: Behaviour) -> AsyncIterator[Broker]:
    broker = Broker(behave)
    broker.server = await asyncio.start_server(broker._serve, "127.0.0.1", 0)
    try:
        yield broker
    finally:
        broker.server.close()
