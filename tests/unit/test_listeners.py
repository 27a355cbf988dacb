"""Broker listeners: port = listen.broker_port_base + node id, and what happens when that leaves the port range."""

from __future__ import annotations

import asyncio
import logging

import pytest

from proxy.app import load_settings
from proxy.server import MAX_PORT, Proxy


async def test_a_node_id_beyond_the_port_range_gets_a_free_port(caplog: pytest.LogCaptureFixture) -> None:
    # Kafka's node.id is an int: 100000 is a legal id, and 65000 + 100000 is no port. The broker must still be
    # reachable through Sluice (a free port), and the operator told why its port is not base + id.
    settings = load_settings(None, env={}).with_overrides(
        {"listen.bootstrap_port": 0, "listen.broker_port_base": 65000, "admin.enabled": False})
    proxy = Proxy(settings)
    await proxy.start()
    try:
        with caplog.at_level(logging.WARNING, logger="sluice"):
            port = proxy.open_listener(100_000)
        assert 0 < port <= MAX_PORT
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.close()
        await writer.wait_closed()
        assert any("broker_port_out_of_range" in r.getMessage() for r in caplog.records)
    finally:
        await proxy.stop(drain_timeout=0)
