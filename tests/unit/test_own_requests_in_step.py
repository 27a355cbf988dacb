"""Sluice's own connection to a broker for its group requests (proxy/server.py ``_Link``) stays in step with its
answers: one request at a time, so the next frame read must answer the request just sent. A request cancelled
while its answer is due (a group call reaching its bound) left that answer unread, and every later request on the
link was handed the answer to the one before it (offset reads answered with another call's offsets, or failing to
decode, for as long as the link lived). A local server stands in for the broker and counts what it is sent."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable

from proxy.server import _Link
from proxy.wire.messages import encode_response, request_codec, response_codec
from proxy.wire.model import Message

FIND_COORDINATOR = 10


class Broker:
    """Answers each FindCoordinator v4 with a coordinator key naming the request's number (1, 2, ... over every
    connection); the first answer waits for ``release``; ``wrong_id`` answers the first request with another
    correlation id."""

    def __init__(self, *, wrong_id: bool = False) -> None:
        self.received: list[int] = []
        self.got_first = asyncio.Event()
        self.release = asyncio.Event()
        self.wrong_id = wrong_id

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                (size,) = struct.unpack(">i", await reader.readexactly(4))
                data = await reader.readexactly(size)
                corr = struct.unpack(">i", data[4:8])[0]
                self.received.append(corr)
                n = len(self.received)
                if n == 1:
                    self.got_first.set()
                    await self.release.wait()
                    if self.wrong_id:
                        corr += 1000
                body = response_codec(FIND_COORDINATOR, 4).default().replace(coordinators=[Message(
                    key=f"request-{n}", node_id=1, host="h", port=1, error_code=0, error_message=None)])
                frame = encode_response(FIND_COORDINATOR, 4, Message(correlation_id=corr), body)
                writer.write(struct.pack(">i", len(frame)) + frame)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


def request() -> Message:
    return request_codec(FIND_COORDINATOR, 4).default().replace(key_type=0, coordinator_keys=["g"])


async def with_broker(broker: Broker, scenario: Callable[[_Link], Awaitable[list[str]]]) -> list[str]:
    server = await asyncio.start_server(broker.serve, "127.0.0.1", 0)
    link = _Link(("127.0.0.1", server.sockets[0].getsockname()[1]), 5.0, None, None)
    try:
        return await scenario(link)
    finally:
        link.close()
        server.close()


def test_a_request_cancelled_while_its_answer_is_due_does_not_shift_the_next_answers() -> None:
    broker = Broker()

    async def scenario(link: _Link) -> list[str]:
        first = asyncio.ensure_future(link.request(FIND_COORDINATOR, 4, request()))
        await broker.got_first.wait()
        first.cancel()  # as the group call's bound cancels it
        await asyncio.gather(first, return_exceptions=True)
        broker.release.set()  # the late answer arrives
        answers = []
        for _ in range(2):
            body = await link.request(FIND_COORDINATOR, 4, request())
            answers.append(body.coordinators[0].key)
        return answers

    assert asyncio.run(with_broker(broker, scenario)) == ["request-2", "request-3"]


def test_an_answer_to_another_request_is_not_taken_for_this_one() -> None:
    broker = Broker(wrong_id=True)
    broker.release.set()

    async def scenario(link: _Link) -> list[str]:
        body = await link.request(FIND_COORDINATOR, 4, request())  # refused, asked again on a new connection
        return [body.coordinators[0].key]

    assert asyncio.run(with_broker(broker, scenario)) == ["request-2"]
