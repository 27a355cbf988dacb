"""Sluice's own hand-written connection to a broker (proxy/io/own_connection.py) against a local misbehaving
broker: an answer cut off mid-way (timeout), a call cancelled while it waits, the broker closing, an answer with
another request's correlation id. Each call that fails closes its connection, and the next call gets its own
answer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from proxy.io.own_connection import Link, OwnConnection
from proxy.wire.messages import response_codec
from proxy.wire.model import Message
from tests.support.misbehaving_broker import Broker, frame, running

DESCRIBE_GROUPS, V = 15, 5


def answer(correlation_id: int, group: str) -> bytes:
    body = response_codec(DESCRIBE_GROUPS, V).default().replace(throttle_time_ms=0, groups=[Message(
        error_code=0, group_id=group, group_state="Empty", protocol_type="", protocol_data="", members=[],
        authorized_operations=-2147483648)])
    return frame(DESCRIBE_GROUPS, V, correlation_id, body)


async def right(header: Message, body: Message, writer: asyncio.StreamWriter) -> None:
    writer.write(answer(header.correlation_id, body.groups[0]))


@pytest.fixture
async def broker() -> AsyncIterator[Broker]:
    async with running(right) as b:
        yield b


def describe(group: str) -> Message:
    return Message(groups=[group], include_authorized_operations=False)


async def test_an_answer_cut_off_mid_way_times_out_and_closes_the_connection(broker: Broker) -> None:
    async def half(header: Message, body: Message, writer: asyncio.StreamWriter) -> None:
        data = answer(header.correlation_id, body.groups[0])
        writer.write(data[:len(data) // 2])  # and the rest never comes

    broker.behave = half
    conn = await OwnConnection.open(broker.address, 0.2, None, None)
    with pytest.raises(TimeoutError):
        await conn.call(DESCRIBE_GROUPS, V, describe("g"))
    assert conn.closed
    await broker.client_closed.wait()


async def test_a_cancelled_call_closes_its_connection(broker: Broker) -> None:
    asked = asyncio.Event()

    async def silent(header: Message, body: Message, writer: asyncio.StreamWriter) -> None:
        asked.set()

    broker.behave = silent
    conn = await OwnConnection.open(broker.address, 30.0, None, None)
    task = asyncio.ensure_future(conn.call(DESCRIBE_GROUPS, V, describe("g")))
    await asyncio.wait_for(asked.wait(), 30.0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert conn.closed
    await broker.client_closed.wait()


async def test_a_broker_that_closes_mid_call_fails_the_call_and_the_connection(broker: Broker) -> None:
    async def hang_up(header: Message, body: Message, writer: asyncio.StreamWriter) -> None:
        writer.write(answer(header.correlation_id, body.groups[0])[:6])
        writer.close()

    broker.behave = hang_up
    conn = await OwnConnection.open(broker.address, 30.0, None, None)
    with pytest.raises(asyncio.IncompleteReadError):
        await conn.call(DESCRIBE_GROUPS, V, describe("g"))
    assert conn.closed
    with pytest.raises(OSError, match="closed"):
        await conn.call(DESCRIBE_GROUPS, V, describe("g"))


async def test_an_answer_with_another_correlation_id_is_refused_and_closes_the_connection(broker: Broker) -> None:
    async def other(header: Message, body: Message, writer: asyncio.StreamWriter) -> None:
        writer.write(answer(header.correlation_id + 7, body.groups[0]))

    broker.behave = other
    conn = await OwnConnection.open(broker.address, 30.0, None, None)
    with pytest.raises(OSError, match="correlation id 8 to request 1"):
        await conn.call(DESCRIBE_GROUPS, V, describe("g"))
    assert conn.closed
    await broker.client_closed.wait()


async def test_after_a_call_cancelled_mid_read_the_next_call_on_the_link_gets_its_own_answer(broker: Broker) -> None:
    """The defect: the group-call bound cancelled a call while it read; the link kept the connection and the next
    call read the cancelled call's answer as its own."""
    asked, release = asyncio.Event(), asyncio.Event()

    async def late_for_a(header: Message, body: Message, writer: asyncio.StreamWriter) -> None:
        if body.groups[0] == "a":
            asked.set()
            await release.wait()
        writer.write(answer(header.correlation_id, body.groups[0]))

    broker.behave = late_for_a
    link = Link(broker.address, 30.0, None, None)
    first = asyncio.ensure_future(link.request(DESCRIBE_GROUPS, V, describe("a")))
    await asyncio.wait_for(asked.wait(), 30.0)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    release.set()  # the broker answers the cancelled request after all
    got = await link.request(DESCRIBE_GROUPS, V, describe("b"))
    assert [g.group_id for g in got.groups] == ["b"]
    link.close()


async def test_an_answer_over_the_frame_bound_is_refused_before_it_is_read(broker: Broker) -> None:
    conn = await OwnConnection.open(broker.address, 30.0, None, None, max_frame_bytes=16)
    with pytest.raises(OSError, match=r"an answer of \d+ bytes, over the frame bound \(16\)"):
        await conn.call(DESCRIBE_GROUPS, V, describe("g"))
    assert conn.closed


async def test_a_call_has_one_deadline_for_the_size_and_the_body_together(broker: Broker) -> None:
    """Each half of the answer comes within the deadline, the whole does not: the call times out."""
    async def slow_halves(header: Message, body: Message, writer: asyncio.StreamWriter) -> None:
        data = answer(header.correlation_id, body.groups[0])
        writer.write(data[:4])
        await asyncio.sleep(0.3)
        writer.write(data[4:10])
        await asyncio.sleep(0.3)
        writer.write(data[10:])

    broker.behave = slow_halves
    conn = await OwnConnection.open(broker.address, 0.4, None, None)
    with pytest.raises(TimeoutError):
        await conn.call(DESCRIBE_GROUPS, V, describe("g"))
    assert conn.closed


async def test_a_request_that_timed_out_is_never_sent_again(broker: Broker) -> None:
    """It may have been applied (an OffsetCommit): the link fails the call, and the next call is the next one."""
    received: list[str] = []

    async def first_unanswered(header: Message, body: Message, writer: asyncio.StreamWriter) -> None:
        received.append(body.groups[0])
        if len(received) > 1:
            writer.write(answer(header.correlation_id, body.groups[0]))

    broker.behave = first_unanswered
    link = Link(broker.address, 0.2, None, None)
    with pytest.raises(OSError, match="TimeoutError"):
        await link.request(DESCRIBE_GROUPS, V, describe("a"))
    got = await link.request(DESCRIBE_GROUPS, V, describe("b"))
    assert [g.group_id for g in got.groups] == ["b"] and received == ["a", "b"]
    link.close()


async def test_a_connection_the_broker_closed_while_idle_is_opened_again_before_the_request(broker: Broker) -> None:
    async def answer_then_close(header: Message, body: Message, writer: asyncio.StreamWriter) -> None:
        writer.write(answer(header.correlation_id, body.groups[0]))
        writer.close()  # as a broker does after connections.max.idle.ms

    broker.behave = answer_then_close
    link = Link(broker.address, 30.0, None, None)
    assert [g.group_id for g in (await link.request(DESCRIBE_GROUPS, V, describe("a"))).groups] == ["a"]
    async with asyncio.timeout(30.0):
        while not link.idle_closed:  # the broker's end of stream reaches Sluice's side
            await asyncio.sleep(0.01)
    opened = broker.connections
    got = await link.request(DESCRIBE_GROUPS, V, describe("b"))
    assert [g.group_id for g in got.groups] == ["b"] and broker.connections == opened + 1
    link.close()


async def test_a_slow_answer_holds_back_no_other_request_on_the_link_up_to_its_width(broker: Broker) -> None:
    """A broker serves one connection's requests in turn: the link's requests go over connections of their own, up
    to its width, so one member's commit waiting on the coordinator does not hold the others' back."""
    release = asyncio.Event()

    async def slow_a(header: Message, body: Message, writer: asyncio.StreamWriter) -> None:
        if body.groups[0] == "a":
            await release.wait()
        writer.write(answer(header.correlation_id, body.groups[0]))

    broker.behave = slow_a
    link = Link(broker.address, 30.0, None, None, width=2)
    first = asyncio.ensure_future(link.request(DESCRIBE_GROUPS, V, describe("a")))
    got = await asyncio.wait_for(link.request(DESCRIBE_GROUPS, V, describe("b")), 30.0)
    assert [g.group_id for g in got.groups] == ["b"] and not first.done()
    release.set()
    assert [g.group_id for g in (await first).groups] == ["a"]
    assert broker.connections == 2
    await link.request(DESCRIBE_GROUPS, V, describe("c"))
    assert broker.connections == 2  # idle ones are used again
    link.close()
