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

Every PUT goes to a :class:`SectionStore`: this process alone (:class:`LocalStore`, the state file), or a
fleet's control topic (proxy/fleet/: the store applies it, on every instance of the fleet). Either way GET adds
the section's ``"revision"`` and a PUT may carry the ``"revision"`` it was based on (what GET answered, PUT back
as is): refused with 409 if the section moved past it (a local revision counts this process's changes since it
started, admin PUTs and SIGHUP reloads alike). ``?dry_run=1`` validates the change as a PUT would, checks its
revision, and changes nothing: the answer says what would be applied. Who changed a section is the principal the
admin API authenticated (proxy/admin.py): in the ``admin_changed`` log event, and in a fleet's history.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .accesslog import get_logger
from .admin import require_principal
from .app import load_settings
from .config import ConfigError, apply_state_file, save_state_section
from .core.registration import Registration
from .http_routes import Request, Response, json_response

if TYPE_CHECKING:
    from .admin import AdminServer
    from .server import Proxy

log = get_logger("sluice.reconfigure")

__all__ = ["ChangeRefused", "LocalStore", "SectionStore", "Written", "add_routes", "add_section_routes",
           "reload_file", "store_write"]


class ChangeRefused(Exception):
    """A store refused a change: ``status`` is the HTTP answer (409 conflict, 403 not authorized, 503...)."""

    def __init__(self, status: int, message: str, revision: int | None = None, key: str | None = None) -> None:
        super().__init__(message)
        self.status, self.revision, self.key = status, revision, key


@dataclass(frozen=True, slots=True)
class Written:
    """What a store did (``revision``: the change's) or a dry run would do (``revision`` None; ``based_on``: the
    section's revision now)."""

    section: str
    revision: int | None
    based_on: int
    settings: dict[str, Any]


class SectionStore(Protocol):
    """Where the dynamic sections are kept: this process (:class:`LocalStore`) or a fleet (proxy/fleet/control.py)."""

    #: where, for people: "this instance", "fleet <name>"
    scope: str

    def revision(self, section: str) -> int:
        """The section's revision in force."""

    def overlay(self, settings: Any) -> Any:
        """``settings`` (a SIGHUP's fresh read) with the store's sections over them."""

    async def write(self, section: str, values: dict[str, Any], based_on: int | None, changed_by: str, *,
                    dry_run: bool = False, rollback_of: int | None = None) -> Written:
        """Write a validated section (or only check it could be: ``dry_run``). Raises :class:`ChangeRefused`."""


def _conflict(section: str, based_on: int | None, current: int) -> None:
    if based_on is not None and current > based_on:
        raise ChangeRefused(409, f"[{section}] changed meanwhile: the change is based on revision {based_on}, "
                                 f"this instance runs revision {current}; read it again and retry", current)


class LocalStore:
    """This process's sections: a PUT saved in ``admin.state_file`` (when set: the whole section, atomically; 500
    and not applied if that fails, so what runs is what a restart brings back), then applied. Revisions count
    the changes since the process started."""

    scope = "this instance"

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy
        self.revisions: dict[str, int] = {}
        self._lock = asyncio.Lock()  # one for all: each PUT reads, changes and rewrites the one state file

    def revision(self, section: str) -> int:
        return self.revisions.get(section, 0)

    def overlay(self, settings: Any) -> Any:
        for section in self.proxy.settings.dynamic_sections:
            if getattr(settings, section) != getattr(self.proxy.settings, section):
                self.revisions[section] = self.revision(section) + 1
        return settings

    async def write(self, section: str, values: dict[str, Any], based_on: int | None, changed_by: str, *,
                    dry_run: bool = False, rollback_of: int | None = None) -> Written:
        async with self._lock:
            current = self.revision(section)
            _conflict(section, based_on, current)
            if dry_run:
                return Written(section, None, current, values)
            updated = getattr(self.proxy.settings.with_overrides({section: values}), section)
            state_file = self.proxy.settings.admin.state_file
            if state_file:
                try:  # in a thread: fsync may take a while, and the loop carries every client's traffic
                    await asyncio.to_thread(save_state_section, state_file, section, values,
                                            self.proxy.settings.dynamic_sections)
                except ConfigError as e:
                    log.error("state_file_not_saved", section=section, error=str(e))
                    raise ChangeRefused(500, str(e), key=e.key) from None
            # This section only: a SIGHUP while the file was written may have changed the others.
            self.proxy.apply_dynamic(self.proxy.settings.model_copy(update={section: updated}))
            self.revisions[section] = current + 1
            log.info("admin_changed", section=section, revision=current + 1, principal=changed_by)
            return Written(section, current + 1, current, values)


def add_routes(admin: AdminServer, proxy: Proxy, store: SectionStore | None = None) -> SectionStore:
    """GET/PUT of every dynamic section at its registration's ``admin_path`` (JSON), kept by ``store`` (default:
    a :class:`LocalStore`); the store."""
    store = store if store is not None else LocalStore(proxy)
    for registration in proxy.settings.policies:
        if registration.dynamic:
            add_section_routes(admin, proxy, registration, store)
    return store


def add_section_routes(admin: AdminServer, proxy: Proxy, registration: Registration, store: SectionStore) -> None:
    """GET/PUT ``registration.admin_path`` for its dynamic settings section (JSON). PUT replaces the whole section
    (keys left out take their defaults), is validated as a whole, needs a principal when the admin API
    authenticates, goes to ``store``, and answers with the section now in force and its ``revision``; GET shows the
    section as configured (entries as written, globs included), its ``revision`` and, when the registration has a
    ``status``, what its policy measures (``"status"``)."""
    section, status = registration.section, registration.status

    async def get(_request: Request) -> Response:
        body = getattr(proxy.settings, section).model_dump()
        if status is not None:
            # build() makes one policy per registration, in list order
            body["status"] = status(proxy.chain.policies[proxy.settings.policies.index(registration)])
        body["revision"] = store.revision(section)
        body["store"] = store.scope  # where the section is kept (not a key: a section may have a "scope" setting)
        return json_response(body)

    async def put(request: Request) -> Response:
        try:
            body: Any = request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return json_response({"error": f"body is not JSON: {e}"}, status=400)
        based_on = None
        if isinstance(body, dict):
            body.pop("status", None)  # what GET answered may be PUT back as is
            body.pop("store", None)
            based_on = body.pop("revision", None)
        if based_on is not None and (not isinstance(based_on, int) or isinstance(based_on, bool) or based_on < 0):
            return json_response({"error": f"revision: expected a revision number, got {based_on!r}",
                                  "key": "revision"}, status=400)
        try:
            updated = getattr(proxy.settings.with_overrides({section: body}), section)
        except ConfigError as e:
            return json_response({"error": str(e), "key": e.key}, status=400)
        return await store_write(request, store, section, updated.model_dump(), based_on, proxy)

    admin.add_route("GET", registration.admin_path, get)
    admin.add_route("PUT", registration.admin_path, put, mutating=True)


async def store_write(request: Request, store: SectionStore, section: str, values: dict[str, Any],
                      based_on: int | None, proxy: Proxy, rollback_of: int | None = None) -> Response:
    """The store's answer to a validated change, as JSON: the section in force and its revision, or (dry run)
    what would be applied and the revision it is based on."""
    dry_run = request.query.get("dry_run", "").lower() in ("1", "true", "yes")
    try:
        written = await store.write(section, values, based_on, require_principal(request), dry_run=dry_run,
                                    rollback_of=rollback_of)
    except ChangeRefused as e:
        answer: dict[str, Any] = {"error": str(e), "revision": e.revision}
        if e.key is not None:
            answer["key"] = e.key
        return json_response(answer, status=e.status)
    if written.revision is None:
        return json_response({**values, "revision": written.based_on, "store": store.scope, "dry_run": True})
    return json_response({**getattr(proxy.settings, section).model_dump(), "revision": written.revision,
                          "store": store.scope})


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
        name for name in type(fresh).__struct_fields__
        if name not in fresh.dynamic_sections and getattr(fresh, name) != getattr(proxy.settings, name)
    ]
    if static_changed:
        log.warning("reload_needs_restart", sections=static_changed)
    proxy.apply_dynamic(fresh)
    return True
