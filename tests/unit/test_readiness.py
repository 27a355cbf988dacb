"""Proxy.ready (/readyz): not ready until start-up is over, since the bootstrap listener opens before the brokers'
listeners and a client holding cached metadata connects straight to a broker's. No Kafka here: the broker list is
what ``refresh_brokers`` learns (held on an event), and the cluster's TCP answer a plain listening socket."""

from __future__ import annotations

import asyncio
import socket

import pytest

from proxy.app import load_settings
from proxy.server import Proxy


def listening() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    return sock


async def test_not_ready_until_the_brokers_listeners_are_open(monkeypatch: pytest.MonkeyPatch) -> None:
    upstream = listening()
    port = upstream.getsockname()[1]
    settings = load_settings(None, env={}).with_overrides({
        "upstream.bootstrap_servers": [f"127.0.0.1:{port}"], "listen.bootstrap_port": 0,
        "listen.broker_port_base": 0})
    proxy = Proxy(settings)
    asking, release = asyncio.Event(), asyncio.Event()

    async def refresh_brokers() -> None:
        asking.set()
        await release.wait()
        proxy.router.learn(1, "127.0.0.1", port)
        proxy.router.port_for(1)  # the node's listener, as the real lookup opens it

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
        await proxy.stop(drain_timeout=0)
        upstream.close()


async def test_brokers_unknown_at_start_are_asked_for_again_by_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    upstream = listening()
    port = upstream.getsockname()[1]
    settings = load_settings(None, env={}).with_overrides({
        "upstream.bootstrap_servers": [f"127.0.0.1:{port}"], "listen.bootstrap_port": 0,
        "listen.broker_port_base": 0})
    proxy = Proxy(settings)
    answers = iter([OSError("cluster not up yet"), None])

    async def refresh_brokers() -> None:
        error = next(answers)
        if error is not None:
            raise error
        proxy.router.learn(1, "127.0.0.1", port)
        proxy.router.port_for(1)

    monkeypatch.setattr(proxy, "refresh_brokers", refresh_brokers)
    try:
        await proxy.start()  # the lookup failed: start-up goes on, no broker listener yet
        assert proxy.listener_ports().keys() == {None}
        assert await proxy.ready()  # asked again, and answered
        assert 1 in proxy.listener_ports()
    finally:
        await proxy.stop(drain_timeout=0)
        upstream.close()
