"""Sluice running in-process on its own event loop thread, for tests and benches that drive real (blocking)
clients.

Synchronous clients (kafka-python, confluent-kafka, the Java tools as subprocesses) block the calling thread,
so the proxy cannot share the caller's event loop: it gets a uvloop loop in a daemon thread, and the caller
talks to it through thread-safe calls. Metrics live in this process's default registry, so callers can read
them directly.

It lives in ``rig/`` (not ``tests/support``) so ``bench/`` can use it without importing the test tree.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import uvloop

from proxy import reconfigure
from proxy.accesslog import AccessLog
from proxy.admin import AdminServer
from proxy.app import Settings, load_settings
from proxy.fleet import routes as fleet_routes
from proxy.fleet.control import FleetControl
from proxy.fleet.usage import FleetUsage
from proxy.server import Proxy
from rig.kafka import RIG_NODE_IDS, free_ports

T = TypeVar("T")


async def _serving(fleet: FleetControl) -> None:
    fleet.serving()  # on the proxy's loop: it starts the status task there


class ProxyThread:
    def __init__(self, upstream: str, **overrides: Any) -> None:
        # Broker node N is served on base + N: every node's port of the rig's largest cluster is picked free.
        base_port, *_ = free_ports(RIG_NODE_IDS + 1, consecutive=True)
        base = {
            "upstream.bootstrap_servers": upstream.split(","),  # a client's bootstrap.servers: host:port,...
            "listen.bootstrap_port": 0,
            "listen.broker_port_base": base_port,
            "admin.enabled": False,
            "logging.access_log": "off",
        }
        base.update(overrides)
        self.settings: Settings = load_settings(None, env={}).with_overrides(base)
        self.loop = uvloop.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="sluice-proxy", daemon=True)
        self._thread.start()
        # The process-wide access log belongs to `sluice run` (configure_logging); an in-process proxy gets
        # its own, written where its settings say.
        self.proxy = Proxy(self.settings, access_log=AccessLog(self.settings.logging))
        #: the fleet's part of this instance ([fleet] enabled), as `sluice run` composes it (proxy/cli.py serve)
        self.fleet: FleetControl | None = None
        self.usage: FleetUsage | None = None
        if self.settings.fleet.enabled:
            self.fleet = FleetControl(self.proxy)
            self.call(self.fleet.start())
            self.usage = FleetUsage(self.fleet)
            self.call(self.usage.start())
        self.call(self.proxy.start())
        if self.fleet is not None:
            self.call(_serving(self.fleet))
        self.admin: AdminServer | None = None
        if self.settings.admin.enabled:
            self.admin = AdminServer(self.settings.admin, self._ready, self.proxy.metrics)
            reconfigure.add_routes(self.admin, self.proxy, self.fleet)
            if self.fleet is not None:
                fleet_routes.add_routes(self.admin, self.proxy, self.fleet)
            try:
                self.call(self.admin.start())
            except BaseException:
                self.stop()
                raise

    async def _ready(self) -> bool:
        return (self.fleet is None or self.fleet.ready()) and await self.proxy.ready()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.proxy.bootstrap_port}"

    @property
    def admin_port(self) -> int:
        """The admin server's port (``admin.enabled`` must be overridden to true)."""
        if self.admin is None:
            raise RuntimeError("the admin server is off: pass **{'admin.enabled': True, 'admin.port': 0}")
        return self.admin.port

    def policy_states(self, name: str) -> list[Any]:
        """Each open client connection's state of the chain's policy ``name`` (read it on the proxy's loop)."""
        policy = self.proxy.policy(name)
        return [c.policies.states[policy] for c in self.proxy.connections]

    def total(self, name: str, **labels: str) -> float:
        """A metric of this proxy (its own registry), summed over samples matching ``labels``."""
        return self.proxy.metrics.total(name, **labels)

    def stop(self) -> None:
        try:
            if self.admin is not None:
                self.call(self.admin.stop())
            if self.usage is not None:
                self.call(self.usage.stop())
            if self.fleet is not None:
                self.call(self.fleet.stop())
            self.call(self.proxy.stop(drain_timeout=2.0))
            self.proxy.access_log.close()
            self.call(_cancel_the_rest())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.loop.close()

    def __enter__(self) -> ProxyThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def _cancel_the_rest() -> None:
    """Cancel what is still running on the loop and wait for it, as ``asyncio.run`` does when ``sluice run``'s
    main coroutine returns (an upstream connect still in flight when the proxy stopped, say). A task left pending
    when the loop closes is reported at interpreter exit ("Task was destroyed but it is pending!"), after pytest
    stopped capturing: a passing run printing log lines."""
    rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for t in rest:
        t.cancel()
    await asyncio.gather(*rest, return_exceptions=True)
