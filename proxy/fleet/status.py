"""The fleet's status records and the table ``sluice fleet status`` prints: sans-IO (the reading is
proxy/fleet/cli.py's, the publishing proxy/fleet/control.py's).

Every instance publishes its status every ``[fleet] status_interval_s`` to the status topic, keyed by its instance
id: ``{"schema": 1, "fleet", "instance", "host", "pid", "version", "listeners", "revisions", "hashes",
"topic_id", "started_at", "published_at", "control_reachable", "interval_s"}``; ``revisions`` per section the
latest record it folded, ``hashes`` per section the fleet sets the digest of the settings it applied (records.py
``settings_hash``), ``topic_id`` the control topic's id it follows (Kafka's topic id, KIP-516: a topic created
again has another). A clean stop publishes a tombstone (the key with no value), so a stopped instance leaves the
table; one that died (kill -9, a lost host) is ``silent`` from its last status on, and left out of the table once
that is older than ``[fleet] forget_silent_after_s``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime
from typing import Any

__all__ = ["STATUS_SCHEMA", "StatusRecord", "fleet_table", "instance_state"]

STATUS_SCHEMA = 1
#: an instance is "silent" when its last status is older than this many status intervals
SILENT_INTERVALS = 3
#: states that make ``sluice fleet status`` exit 1: a live instance behind the fleet or running other settings
FAILING = frozenset({"lagging", "drift"})


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
    hashes: dict[str, str] = field(default_factory=dict)
    topic_id: str = ""
    control_reachable: bool = True
    #: its status_interval_s (the reader's own setting when absent: an older instance's record)
    interval_s: float = 0.0

    def encode(self) -> tuple[bytes, bytes]:
        return self.instance.encode(), json.dumps({"schema": STATUS_SCHEMA, **asdict(self)},
                                                  separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def decode(cls, value: bytes) -> StatusRecord | None:
        """The record, or None if it is not one this Sluice reads (garbage, another schema). Fields this Sluice
        does not know (a later version's) are ignored."""
        try:
            data = json.loads(value)
            if not isinstance(data, dict) or data.pop("schema", None) != STATUS_SCHEMA:
                return None
            known = {f.name for f in fields(cls)}
            return cls(**{k: v for k, v in data.items() if k in known})
        except (UnicodeDecodeError, json.JSONDecodeError, TypeError):
            return None


def _age_s(published_at: str, now: datetime) -> float:
    try:
        return (now - datetime.fromisoformat(published_at.replace("Z", "+00:00"))).total_seconds()
    except ValueError:
        return float("inf")


def instance_state(record: StatusRecord, revisions: Mapping[str, int], hashes: Mapping[str, str], now: datetime,
                   interval_s: float, topic_id: str = "") -> str:
    """``silent`` (no status for SILENT_INTERVALS of its intervals), ``lagging`` (a section's revision below the
    fleet's, or another incarnation of the control topic), ``drift`` (at the fleet's revision of a section, other
    settings than ``hashes``, the fleet's as this Sluice validates them), else ``up``."""
    if _age_s(record.published_at, now) > SILENT_INTERVALS * (record.interval_s or interval_s):
        return "silent"
    if (topic_id and record.topic_id and record.topic_id != topic_id) or any(
            record.revisions.get(s, 0) < r for s, r in revisions.items()):
        return "lagging"
    if any(record.revisions.get(s, 0) == revisions.get(s, 0) and record.hashes.get(s) != h
           for s, h in hashes.items()):
        return "drift"
    return "up"


def fleet_table(records: Iterable[StatusRecord], revisions: Mapping[str, int], hashes: Mapping[str, str],
                now: datetime, interval_s: float, forget_after_s: float, topic_id: str = "") -> list[dict[str, Any]]:
    """One row per instance (sorted by id) whose last status is not older than ``forget_after_s``: what
    ``sluice fleet status`` prints. A silent instance's row says since when (``since``: its last status)."""
    rows = []
    for r in sorted(records, key=lambda r: r.instance):
        age = _age_s(r.published_at, now)
        if age > forget_after_s:
            continue
        state = instance_state(r, revisions, hashes, now, interval_s, topic_id)
        drifting = sorted(s for s, h in hashes.items()
                          if r.revisions.get(s, 0) == revisions.get(s, 0) and r.hashes.get(s) != h)
        rows.append({
            "instance": r.instance, "state": state, "host": r.host, "version": r.version,
            "revisions": ",".join(f"{s}={v}" for s, v in sorted(r.revisions.items())),
            "drift": ",".join(drifting) if state == "drift" else "",
            "last_seen_s": round(age, 1), "since": r.published_at if state == "silent" else "",
            "started_at": r.started_at, "control": "reachable" if r.control_reachable else "unreachable",
        })  # fmt: skip
    return rows
