"""Run-time reconfiguration: the admin API's policy endpoints and SIGHUP reloads.

Listeners and upstream addresses need a restart; the sections policies register as dynamic (``dynamic=True``,
proxy/policies/__init__.py) do not. Every change is validated as a whole
(``Settings.with_overrides``/``load_settings``) before it is applied, so a bad change is refused with one
message naming the key, and the running configuration stays as it was. Applying swaps immutable snapshots
(``Proxy.apply_dynamic``): no connection is dropped and requests already classified keep the snapshot they
were classified with.

With ``admin.state_file`` set, every admin change (a PUT of a section) is saved there before it is applied
(proxy/config/state.py ``save_state_section``: the whole section, atomically; a change that cannot be saved
is refused with 500 and not applied, so what runs is what a restart brings back). Precedence, at start-up
(``sluice run``) and on every SIGHUP alike: state file (the last admin change of a section) > environment >
config file > defaults. A SIGHUP re-reads the config file and then re-applies the state file, so a change made
in an emergency through the admin API is not lost to an unrelated edit of the file; to hand a section back to
the file, delete the state file (or its section) and send SIGHUP.

With a :class:`SectionStore` (a fleet's control topic, proxy/fleet/), a PUT writes the validated section there
instead (the store applies it, on every instance of the fleet): GET adds the section's ``"revision"``, a PUT may
carry the ``"revision"`` it was based on (what GET answered, PUT back as is) and is refused with 409 if the
section moved past it; the state file is not written, and a SIGHUP lays the store's sections over the file's.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from .accesslog import get_logger
from .app import load_settings
from .config import ConfigError, apply_state_file, save_state_section
from .core.registration import Registration

if TYPE_CHECKING:
    from .admin import AdminServer
    from .server import Proxy

log = get_logger("sluice.reconfigure")

__all__ = ["ChangeRefused", "SectionStore", "add_routes", "add_section_routes", "reload_file"]


class ChangeRefused(Exception):
    """A store refused a change: ``status`` is the HTTP answer (409 conflict, 403 not authorized, 503...)."""

    def __init__(self, status: int, message: str, revision: int | None = None) -> None:
        super().__init__(message)
        self.status, self.revision = status, revision


class SectionStore(Protocol):
    """Where the dynamic sections are kept when not in this process alone (proxy/fleet/control.py)."""

    def revision(self, section: str) -> int:
        """The section's revision in force."""

    def overlay(self, settings: Any) -> Any:
        """``settings`` with the store's sections over them."""

    async def write(self, section: str, values: dict[str, Any], based_on: int | None, changed_by: str) -> int:
        """Write a validated section; its new revision (applied). Raises :class:`ChangeRefused`."""


def add_routes(admin: AdminServer, proxy: Proxy, store: SectionStore | None = None) -> None:
    """GET/PUT of every dynamic section at its registration's ``admin_path`` (JSON)."""
    lock = asyncio.Lock()  # one for all: each PUT reads, changes and rewrites the one state file
    for registration in proxy.settings.policies:
        if registration.dynamic:
            add_section_routes(admin, proxy, registration, lock, store)


def add_section_routes(admin: AdminServer, proxy: Proxy, registration: Registration,
                       lock: asyncio.Lock | None = None, store: SectionStore | None = None) -> None:
    """GET/PUT ``registration.admin_path`` for its dynamic settings section (JSON). PUT replaces the whole section
    (keys left out take their defaults), is validated as a whole, needs the bearer token when one is set, is saved
    in ``admin.state_file`` when one is set (500, and not applied, if that fails), and answers with the section now
    in force; GET shows the section as configured (entries as written, globs included) and, when the registration
    has a ``status``, what its policy measures (``"status"``). ``lock`` serialises PUTs that share a state file."""
    lock = lock or asyncio.Lock()
    section, status = registration.section, registration.status

    async def get(_request: web.Request) -> web.Response:
        body = getattr(proxy.settings, section).model_dump()
        if status is not None:
            # build() makes one policy per registration, in list order
            body["status"] = status(proxy.chain.policies[proxy.settings.policies.index(registration)])
        if store is not None:
            body["revision"] = store.revision(section)
        return web.json_response(body)

    async def put(request: web.Request) -> web.Response:
        try:
            body: Any = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return web.json_response({"error": f"body is not JSON: {e}"}, status=400)
        if status is not None and isinstance(body, dict):
            body.pop("status", None)  # what GET answered may be PUT back as is
        based_on = body.pop("revision", None) if store is not None and isinstance(body, dict) else None
        if based_on is not None and (not isinstance(based_on, int) or isinstance(based_on, bool) or based_on < 0):
            return web.json_response({"error": f"revision: expected a revision number, got {based_on!r}",
                                      "key": "revision"}, status=400)
        if store is not None:
            try:
                updated = getattr(proxy.settings.with_overrides({section: body}), section)
            except ConfigError as e:
                return web.json_response({"error": str(e), "key": e.key}, status=400)
            changed_by = request.headers.get("X-Sluice-Changed-By", "") or f"admin API from {request.remote}"
            try:
                revision = await store.write(section, updated.model_dump(), based_on, changed_by[:200])
            except ChangeRefused as e:
                return web.json_response({"error": str(e), "revision": e.revision}, status=e.status)
            return web.json_response({**getattr(proxy.settings, section).model_dump(), "revision": revision})
        async with lock:
            try:
                updated = getattr(proxy.settings.with_overrides({section: body}), section)
            except ConfigError as e:
                return web.json_response({"error": str(e), "key": e.key}, status=400)
            state_file = proxy.settings.admin.state_file
            if state_file:
                try:  # in a thread: fsync may take a while, and the loop carries every client's traffic
                    await asyncio.to_thread(save_state_section, state_file, section, updated.model_dump(),
                                            proxy.settings.dynamic_sections)
                except ConfigError as e:
                    log.error("state_file_not_saved", section=section, error=str(e))
                    return web.json_response({"error": str(e), "key": e.key}, status=500)
            # This section only: a SIGHUP while the file was written may have changed the others.
            proxy.apply_dynamic(proxy.settings.model_copy(update={section: updated}))
        return web.json_response(updated.model_dump())

    admin.add_route("GET", registration.admin_path, get)
    admin.add_route("PUT", registration.admin_path, put, mutating=True)


def reload_file(proxy: Proxy, path: str | None, store: SectionStore | None = None) -> bool:
    """SIGHUP: re-read the config file (and SLUICE_* env), then the state file (``admin.state_file`` as in
    force: changing it needs a restart) over it, as at start-up, and apply the dynamic sections. False if
    refused (an invalid config or state file: the running configuration stays). The TLS certificate files are
    re-read first, whatever the config file says (proxy/tls.py: new connections get them)."""
    proxy.reload_tls()
    if path is None:
        log.warning("reload_ignored", reason="no config file was given at start-up")
        return False
    try:
        fresh = apply_state_file(load_settings(path, os.environ, type(proxy.settings)), proxy.settings.admin.state_file)
        if store is not None:
            fresh = store.overlay(fresh)  # the store's sections win over the file's
    except ConfigError as e:
        log.error("reload_refused", path=path, error=str(e))
        return False
    static_changed = [
        name for name in type(fresh).model_fields
        if name not in fresh.dynamic_sections and getattr(fresh, name) != getattr(proxy.settings, name)
    ]
    if static_changed:
        log.warning("reload_needs_restart", sections=static_changed)
    proxy.apply_dynamic(fresh)
    return True
