"""Proxy.ready (/readyz): not ready until start-up is over, since the bootstrap listener opens before the brokers'
listeners and a client holding cached metadata connects straight to a broker's. No Kafka here: the broker list is
what ``refresh_brokers`` learns (held on an event), and the cluster's TCP answer a plain listening socket."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest

from proxy.app import load_settings
from proxy.server import Proxy


@pytest.fixture
async def proxy() -> AsyncIterator[Proxy]:
    """A proxy whose one bootstrap server is a plain listening socket (its TCP answer), stopped at the end."""
    with socket.socket() as upstream:
        upstream.bind(("127.0.0.1", 0))
        upstream.listen(8)
        settings = load_settings(None, env={}).with_overrides({
            "upstream.bootstrap_servers": [f"127.0.0.1:{upstream.getsockname()[1]}"], "listen.bootstrap_port": 0,
            "listen.broker_port_base": 0})
        proxy = Proxy(settings)
        try:
            yield proxy
        finally:
            await proxy.stop(drain_timeout=0)


def learn_node_1(proxy: Proxy) -> None:
    """What the real lookup does with the cluster's answer: node 1 known, its listener opened."""
    host, port = proxy.bootstrap[0]
    proxy.router.learn(1, host, port)
    proxy.router.port_for(1)


async def test_not_ready_until_the_brokers_listeners_are_open(proxy: Proxy,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    asking, release = asyncio.Event(), asyncio.Event()

    async def refresh_brokers() -> None:
        asking.set()
        await release.wait()
        learn_node_1(proxy)

    monkeypatch.setattr(proxy, "refresh_brokers", refresh_brokers)
    starting = asyncio.create_task(proxy.start())
    try:
        await asyncio.wait_for(asking.wait(), 10)  # start() is waiting for the cluster's broker list
        assert proxy.listener_ports().keys() == {None}  # the bootstrap listener is open, node 1's is not
        assert not await proxy.ready()
        release.set()
        await starting
        assert 1 in proxy.listener_ports()
        assert await proxy.ready()
    finally:
        release.set()
        await starting


async def test_brokers_unknown_at_start_are_asked_for_again_by_the_check(proxy: Proxy,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    answers = iter([OSError("cluster not up yet"), None])

    async def refresh_brokers() -> None:
        error = next(answers)
        if error is not None:
            raise error
        learn_node_1(proxy)

    monkeypatch.setattr(proxy, "refresh_brokers", refresh_brokers)
    await proxy.start()  # the lookup failed: start-up goes on, no broker listener yet
    assert proxy.listener_ports().keys() == {None}
    assert await proxy.ready()  # asked again, and answered
    assert 1 in proxy.listener_ports()
