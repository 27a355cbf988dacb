"""Sluice's admin routes (GET/PUT /throttles, /size-limits) on a free port over a Proxy that is not started: the
admin API and its effect on the configuration in force, without listeners or a broker."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from proxy import reconfigure
from proxy.admin import AdminServer
from proxy.app import Settings
from proxy.server import Proxy


async def _ready() -> bool:
    return True


@asynccontextmanager
async def admin_over(settings: Settings) -> AsyncIterator[tuple[Proxy, str]]:
    """(the Proxy, the admin base URL) while the admin server runs on a free 127.0.0.1 port."""
    proxy = Proxy(settings)
    admin = AdminServer(settings.admin.model_copy(update={"enabled": True, "host": "127.0.0.1", "port": 0}),
                        _ready, proxy.metrics)
    reconfigure.add_routes(admin, proxy)
    await admin.start()
    try:
        yield proxy, f"http://127.0.0.1:{admin.port}"
    finally:
        await admin.stop()
