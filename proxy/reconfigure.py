"""Run-time reconfiguration: the admin API's policy endpoints and SIGHUP reloads.

Listeners and upstream addresses need a restart; policies do not. Every change is validated as a whole
(``Settings.with_overrides``/``load_settings``) before it is applied, so a bad change is refused with one
message naming the key, and the running configuration stays as it was. Applying swaps immutable snapshots
(``Proxy.apply_dynamic``): no connection is dropped and requests already classified keep the snapshot they
were classified with.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from aiohttp import web

from .accesslog import get_logger
from .config import ConfigError, load_settings
from .policies.throttle import Throttle

if TYPE_CHECKING:
    from .admin import AdminServer
    from .server import Proxy

log = get_logger("sluice.reconfigure")

#: Settings sections that are changeable while running.
DYNAMIC_SECTIONS = ("size_limit", "throttle")


def add_routes(admin: AdminServer, proxy: Proxy) -> None:
    """GET/PUT /size-limits (JSON, the [size_limit] section; PUT needs the bearer token when one is set)."""

    async def get_size_limits(_request: web.Request) -> web.Response:
        return web.json_response(proxy.settings.size_limit.model_dump())

    async def put_size_limits(request: web.Request) -> web.Response:
        try:
            body: Any = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return web.json_response({"error": f"body is not JSON: {e}"}, status=400)
        try:
            updated = proxy.settings.with_overrides({"size_limit": body})
        except ConfigError as e:
            return web.json_response({"error": str(e), "key": e.key}, status=400)
        proxy.apply_dynamic(updated)
        return web.json_response(updated.size_limit.model_dump())

    admin.add_route("GET", "/size-limits", get_size_limits)
    admin.add_route("PUT", "/size-limits", put_size_limits, mutating=True)
    add_section_routes(admin, proxy, "/throttles", "throttle")


def add_section_routes(admin: AdminServer, proxy: Proxy, path: str, section: str) -> None:
    """GET/PUT ``path`` for one dynamic settings section (JSON). PUT replaces the whole section (keys left out
    take their defaults), is validated as a whole, needs the bearer token when one is set, and answers with
    the section now in force; GET also reports what the section's policy measures (``status``)."""

    async def get(_request: web.Request) -> web.Response:
        body = getattr(proxy.settings, section).model_dump()
        if section == "throttle":
            body["status"] = throttle_status(proxy)
        return web.json_response(body)

    async def put(request: web.Request) -> web.Response:
        try:
            body: Any = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return web.json_response({"error": f"body is not JSON: {e}"}, status=400)
        if isinstance(body, dict):
            body.pop("status", None)  # what GET answered may be PUT back as is
        try:
            updated = proxy.settings.with_overrides({section: body})
        except ConfigError as e:
            return web.json_response({"error": str(e), "key": e.key}, status=400)
        proxy.apply_dynamic(updated)
        return web.json_response(getattr(updated, section).model_dump())

    admin.add_route("GET", path, get)
    admin.add_route("PUT", path, put, mutating=True)


def throttle_status(proxy: Proxy) -> dict[str, Any]:
    """The throttle quotas as measured now (bytes/s over the window) and the sum of lag of throttled partitions."""
    throttle = proxy.policy("throttle")
    assert isinstance(throttle, Throttle)
    state, now = throttle.state, throttle.clock()
    return {"leader_rate": state.leader.rate(now), "follower_rate": state.follower.rate(now),
            "leader_exceeded": state.leader.exceeded(now), "follower_exceeded": state.follower.exceeded(now),
            "sum_lag": state.sum_lag(now)}


def reload_file(proxy: Proxy, path: str | None) -> bool:
    """SIGHUP: re-read the config file (and SLUICE_* env) and apply its dynamic sections. False if refused."""
    if path is None:
        log.warning("reload_ignored", reason="no config file was given at start-up")
        return False
    try:
        fresh = load_settings(path, os.environ)
    except ConfigError as e:
        log.error("reload_refused", path=path, error=str(e))
        return False
    static_changed = [
        name for name in type(fresh).model_fields
        if name not in DYNAMIC_SECTIONS and getattr(fresh, name) != getattr(proxy.settings, name)
    ]
    if static_changed:
        log.warning("reload_needs_restart", sections=static_changed)
    proxy.apply_dynamic(fresh)
    return True
