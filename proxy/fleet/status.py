"""The fleet's status records and the table ``sluice fleet status`` prints: sans-IO (the reading is
proxy/fleet/cli.py's, the publishing proxy/fleet/control.py's).

Every instance publishes its status every ``[fleet] status_interval_s`` to the status topic, keyed by its instance
id: ``{"schema": 1, "fleet", "instance", "host", "pid", "version", "listeners", "revisions", "started_at",
"published_at", "control_reachable"}``; a clean stop publishes a tombstone (the key with no value), so a stopped
instance leaves the table while one that died (kill -9, a lost host) stays in it, ``silent``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

__all__ = ["STATUS_SCHEMA", "StatusRecord", "fleet_table", "instance_state"]

STATUS_SCHEMA = 1
#: an instance is "silent" when its last status is older than this many status intervals
SILENT_INTERVALS = 3


@dataclass(frozen=True)
class StatusRecord:
    fleet: str
    instance: str
    host: str
    pid: int
    version: str
    started_at: str
    published_at: str
    listeners: dict[str, int] = field(default_factory=dict)
    revisions: dict[str, int] = field(default_factory=dict)
    control_reachable: bool = True

    def encode(self) -> tuple[bytes, bytes]:
        return self.instance.encode(), json.dumps({"schema": STATUS_SCHEMA, **asdict(self)},
                                                  separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def decode(cls, value: bytes) -> StatusRecord | None:
        """The record, or None if it is not one this Sluice reads (garbage, another schema)."""
        try:
            data = json.loads(value)
            if not isinstance(data, dict) or data.pop("schema", None) != STATUS_SCHEMA:
                return None
            return cls(**data)
        except (UnicodeDecodeError, json.JSONDecodeError, TypeError):
            return None


def _age_s(published_at: str, now: datetime) -> float:
    try:
        return (now - datetime.fromisoformat(published_at.replace("Z", "+00:00"))).total_seconds()
    except ValueError:
        return float("inf")


def instance_state(record: StatusRecord, current: Mapping[str, int], now: datetime, interval_s: float) -> str:
    """``silent`` (no status for SILENT_INTERVALS intervals), ``lagging`` (a section's revision below the fleet's),
    else ``up``."""
    if _age_s(record.published_at, now) > SILENT_INTERVALS * interval_s:
        return "silent"
    if any(record.revisions.get(s, 0) < r for s, r in current.items()):
        return "lagging"
    return "up"


def fleet_table(records: Iterable[StatusRecord], current: Mapping[str, int], now: datetime,
                interval_s: float) -> list[dict[str, Any]]:
    """One row per instance (sorted by id): what ``sluice fleet status`` prints."""
    rows = []
    for r in sorted(records, key=lambda r: r.instance):
        rows.append({
            "instance": r.instance, "state": instance_state(r, current, now, interval_s), "host": r.host,
            "version": r.version, "revisions": ",".join(f"{s}={v}" for s, v in sorted(r.revisions.items())),
            "last_seen_s": round(_age_s(r.published_at, now), 1), "started_at": r.started_at,
            "control": "reachable" if r.control_reachable else "unreachable",
        })  # fmt: skip
    return rows
