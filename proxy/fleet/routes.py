"""The fleet's own admin endpoint (besides each section's GET/PUT, proxy/reconfigure.py, which write to the fleet
through :class:`~proxy.fleet.control.FleetControl`).

==================  ======  ==========================================================================
route               method  answer
==================  ======  ==========================================================================
/fleet/rollback     POST    ``{"section", "revision", "based_on"?}``: the section's settings at ``revision``
                            (the history) written again as a new change (``?dry_run=1``: checked, not
                            written); the answer of a PUT: the section in force and its new revision
==================  ======  ==========================================================================
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ..config import ConfigError
from ..http_routes import Request, Response, json_response
from ..reconfigure import ChangeRefused, store_write

if TYPE_CHECKING:
    from ..admin import AdminServer
    from ..server import Proxy
    from .control import FleetControl

__all__ = ["add_routes"]


def _revision(body: dict[str, Any], key: str, required: bool) -> int | None:
    value = body.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < (1 if required else 0):
        raise ValueError(f"{key}: expected a revision number, got {value!r}")
    return value


def add_routes(admin: AdminServer, proxy: Proxy, fleet: FleetControl) -> None:
    async def rollback(request: Request) -> Response:
        try:
            body: Any = request.json()
            if not isinstance(body, dict):
                raise ValueError("body: expected a JSON object")
            section = body.get("section")
            if section not in proxy.settings.dynamic_sections:
                raise ValueError(f"section: {section!r} is not changeable at run time")
            revision = _revision(body, "revision", True)
            based_on = _revision(body, "based_on", False)
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as e:
            return json_response({"error": str(e)}, status=400)
        assert revision is not None
        try:
            values = await fleet.settings_at(section, revision)
        except ChangeRefused as e:
            return json_response({"error": str(e)}, status=e.status)
        try:
            restored = getattr(proxy.settings.with_overrides({section: values}), section)
        except ConfigError as e:
            return json_response({"error": f"revision {revision} of [{section}] is not valid here: {e}",
                                  "key": e.key}, status=400)
        return await store_write(request, fleet, section, restored.model_dump(), based_on, proxy,
                                 rollback_of=revision)

    admin.add_route("POST", "/fleet/rollback", rollback, mutating=True)
