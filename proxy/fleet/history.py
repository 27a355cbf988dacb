"""The fleet's history: every change made through Sluice, as it was made, in a topic that is not compacted
(``sluice-fleet-<name>-history``); sans-IO (written by proxy/fleet/writer.py in the change's own transaction, read
by ``sluice fleet history`` and by a rollback).

A history record, key = the section: ``{"schema": 1, "fleet", "section", "revision", "settings", "based_on",
"action", "rollback_of", "principal", "at", "instance"}``: ``revision`` is the control record's (its offset + 1,
proxy/fleet/records.py), ``principal`` who made the change as the admin API authenticated them (proxy/admin.py),
never a header the caller chose; ``action`` ``set`` or ``rollback`` (then ``rollback_of``: the revision whose
settings it restored).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

__all__ = ["HISTORY_SCHEMA", "Entry", "history_rows"]

HISTORY_SCHEMA = 1

Action = Literal["set", "rollback"]


@dataclass(frozen=True, slots=True)
class Entry:
    fleet: str
    section: str
    revision: int
    settings: dict[str, Any]
    principal: str
    at: str
    based_on: int | None = None
    action: Action = "set"
    rollback_of: int | None = None
    instance: str = ""

    def encode(self) -> tuple[bytes, bytes]:
        return self.section.encode(), json.dumps({"schema": HISTORY_SCHEMA, **asdict(self)}, sort_keys=True,
                                                 separators=(",", ":")).encode()

    @classmethod
    def decode(cls, value: bytes | None) -> Entry | None:
        """The entry, or None if it is not one this Sluice reads (garbage, another schema)."""
        if value is None:
            return None
        try:
            data = json.loads(value)
            if not isinstance(data, dict) or data.pop("schema", None) != HISTORY_SCHEMA:
                return None
            known = {f.name for f in fields(cls)}
            entry = cls(**{k: v for k, v in data.items() if k in known})
        except (UnicodeDecodeError, json.JSONDecodeError, TypeError):
            return None
        if not isinstance(entry.settings, dict) or not isinstance(entry.revision, int):
            return None
        return entry


def _diff(before: dict[str, Any] | None, after: dict[str, Any]) -> str:
    if before is None:
        return ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(after.items())) or "(defaults)"
    changed = [f"{k}: {json.dumps(before.get(k))} -> {json.dumps(after.get(k))}"
               for k in sorted(before.keys() | after.keys()) if before.get(k) != after.get(k)]
    return "; ".join(changed) or "(no change)"


def history_rows(entries: Iterable[Entry], fleet: str, section: str | None = None) -> list[dict[str, Any]]:
    """One row per change of ``fleet`` (of ``section`` only, if given), oldest first: what ``sluice fleet history``
    prints. ``change`` is what differs from the section's previous entry."""
    rows = []
    previous: dict[str, dict[str, Any]] = {}
    for e in sorted(entries, key=lambda e: e.revision):
        if e.fleet != fleet:
            continue
        change = _diff(previous.get(e.section), e.settings)
        previous[e.section] = e.settings
        if section is not None and e.section != section:
            continue
        action = e.action if e.rollback_of is None else f"{e.action} to {e.rollback_of}"
        rows.append({"revision": e.revision, "section": e.section, "at": e.at, "principal": e.principal,
                     "action": action, "change": change, "instance": e.instance})
    return rows
