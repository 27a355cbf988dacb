"""A client connection torn down while its upstream connect is under way (a client that connects and goes at once:
a load balancer's TCP health check, a client killed mid-start) leaves nothing counted open.

uvloop (the loop Sluice runs on: proxy/cli.py) calls the upstream protocol's connection_made and then, when the
connect is cancelled before it returns, closes the transport's handle itself without ever calling
connection_lost (uvloop loop.pyx create_connection, handles/basetransport.pyx _call_connection_lost). Counted
only in connection_lost, ``sluice_connections_open{side="upstream"}`` stayed up by one for good
(proxy/io/transports.py ClientProtocol._abandon). Where in the connect the teardown lands decides the path, so
each case tears the connection down after a different number of the loop's turns, covering the connect from its
start to its end.

The upstream is a plain TCP listener: nothing in these cases is read or written on the upstream connection, so no
Kafka is involved, and the case runs on uvloop itself (a real loop and real sockets, nothing faked).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import pytest
import uvloop

from proxy.app import load_settings
from proxy.server import Proxy

#: loop turns from the client connection's connection_made to its teardown; the connect returns within a few
TURNS = range(8)
WAIT_S = 10.0


class Upstream:
    """Accepts connections and waits for each to end; one that sends anything (Sluice's own Metadata request at
    start) is closed, so the start goes on at once."""

    def __init__(self) -> None:
        self.accepted = 0
        self.ended = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        with contextlib.suppress(OSError):
            await reader.read(1)
        self.ended += 1
        writer.close()


async def settled(condition: Callable[[], object], what: str) -> None:
    """Turn the loop until ``condition()`` holds, at most WAIT_S (each turn lets a callback run; no fixed wait)."""
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.001)


async def torn_down_after(turns: int) -> tuple[float, float, int]:
    upstream = Upstream()
    server = await asyncio.start_server(upstream.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    settings = load_settings(None, env={}).with_overrides(
        {"listen.bootstrap_port": 0, "listen.broker_port_base": 0, "admin.enabled": False,
         "upstream.bootstrap_servers": [f"127.0.0.1:{port}"]})
    proxy = Proxy(settings)
    await proxy.start()
    await settled(lambda: upstream.ended == upstream.accepted, "the start's own connection closed")
    before = upstream.accepted
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", proxy.bootstrap_port)
        while not proxy.connections:  # a turn at a time: the connect starts in the turns after this one
            await asyncio.sleep(0)
        [conn] = proxy.connections
        for _ in range(turns):
            await asyncio.sleep(0)
        conn.close(abort=True)  # as a client gone makes it (Port.close: the teardown)
        connect = conn.port._connect_task  # type: ignore[attr-defined]
        with contextlib.suppress(asyncio.CancelledError):
            await connect
        # The connect is over: whatever it made is closed, and the upstream sees its end
        await settled(lambda: upstream.ended == upstream.accepted, "the upstream connection closed")
        writer.close()
        metrics = proxy.metrics
        await settled(lambda: metrics.total("sluice_connections_open", side="client") == 0,
                      "the client connection gone")
        return (metrics.total("sluice_connections_open", side="upstream"),
                metrics.total("sluice_connections_total", side="upstream"), upstream.accepted - before)
    finally:
        await proxy.stop(drain_timeout=0)
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("turns", TURNS)
def test_a_client_gone_during_its_upstream_connect_leaves_no_upstream_counted_open(turns: int) -> None:
    open_upstream, made, _accepted = uvloop.run(torn_down_after(turns))
    assert open_upstream == 0, f"made {made}, still counted open {open_upstream}"


def test_the_turns_cover_a_connect_made_before_the_teardown_and_one_not() -> None:
    """The cases above reach both ends of the connect: one torn down before any upstream connection was made,
    and one after it was (else they would not cover the path in between)."""
    made = [uvloop.run(torn_down_after(turns))[1] for turns in (TURNS[0], TURNS[-1])]
    assert made == [0, 1]
