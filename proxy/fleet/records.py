"""The fleet's control records and the rules every instance folds them with: sans-IO (no Kafka, no clock; the
I/O part is proxy/fleet/control.py and writer.py).

A control record is one run-time changeable section of the whole fleet: key = the section's name (UTF-8), value =
JSON ``{"schema": 1, "fleet", "section", "revision", "settings", "changed_by", "changed_at"}``; ``settings`` is the
whole section (keys left out take their defaults, as a PUT of the admin API). The topic is compacted (one record
per key survives), so the latest record of each section is the fleet's setting of it. A tombstone (the key with
no value, an operator's delete) hands the section back to each instance's own settings (file, environment, state
file): running instances and instances started later alike.

**A change's revision is its record's offset + 1** (Kafka's convention for a position: the offset after it), never
a number a writer picks: Kafka gives each record of a partition an offset above every earlier one, compaction
keeps offsets, and a tombstone takes one too, so revisions are unique and only grow across compaction, deletes and
writers of different Sluice versions (whatever each finds valid). The payload's ``revision`` is the section's latest
revision the writer read + 1, kept for Sluice versions that numbered changes themselves (it is above what they
applied); this one ignores it. A
topic deleted and created again starts its offsets at 0: an instance that sees it (control.py: the topic's id
changed, or offsets went back) folds the new topic from its beginning in a fresh :class:`FleetState`.

Every instance reads the same records in the same order (one key, one partition: Kafka keeps a partition's order),
folds them with :class:`FleetState` and so reaches the same settings. A record is skipped, counted by reason and
never applied, when it is:

- ``garbage``: not JSON, not an object, fields missing or of the wrong type, key and section differ;
- ``schema``: a schema version this Sluice does not know (a later Sluice's record: this one keeps its settings);
- ``fleet``: another fleet's (two fleets sharing a topic by mistake must not steer each other);
- ``section``: a section this Sluice does not change at run time;
- ``stale``: at or below the revision already folded for its section (the same record read twice);
- ``invalid``: the settings fail the section's validation (``ConfigError``); its revision still counts as the
  section's latest (so every version agrees on the revision a change is based on), the last good settings stay.

A writer checks a change against the state it read to the topic's end (:func:`check_based_on`): a change based on
a revision older than the section's latest is a :class:`Conflict` (no lost update between two operators).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ..config.base import ConfigError

__all__ = ["SCHEMA", "SKIP_REASONS", "Change", "Conflict", "FleetState", "Skipped", "check_based_on", "decode",
           "encode", "revision_of", "settings_hash"]

#: The control records' schema version this Sluice writes and reads.
SCHEMA = 1

SkipReason = Literal["garbage", "schema", "fleet", "section", "stale", "invalid"]
SKIP_REASONS: tuple[SkipReason, ...] = ("garbage", "schema", "fleet", "section", "stale", "invalid")


def revision_of(offset: int) -> int:
    """A record's revision: its offset + 1 (0 stays "never set by the fleet")."""
    return offset + 1


def settings_hash(values: Mapping[str, Any]) -> str:
    """A short digest of a section's settings as validated (its model_dump): equal settings, equal hash, on every
    instance of one Sluice version (``sluice fleet status`` compares them: drift)."""
    return hashlib.sha256(json.dumps(values, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:12]


@dataclass(frozen=True, slots=True)
class Change:
    """One control record: a section's settings for the whole fleet (``settings`` None: deleted, a tombstone),
    at a revision."""

    fleet: str
    section: str
    revision: int
    settings: dict[str, Any] | None
    changed_by: str = ""
    changed_at: str = ""  # ISO 8601, UTC

    def as_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "fleet": self.fleet, "section": self.section, "revision": self.revision,
                "settings": self.settings, "changed_by": self.changed_by, "changed_at": self.changed_at}


class Skipped(Exception):
    """A record that is not applied, and why (one of :data:`SKIP_REASONS`)."""

    def __init__(self, reason: SkipReason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason: SkipReason = reason
        self.detail = detail


class Conflict(Exception):
    """A change based on a revision older than the section's latest."""

    def __init__(self, section: str, based_on: int, current: int) -> None:
        super().__init__(f"[{section}] changed meanwhile: the change is based on revision {based_on}, the fleet "
                         f"runs revision {current}; read it again and retry")
        self.section, self.based_on, self.current = section, based_on, current


def encode(change: Change) -> tuple[bytes, bytes]:
    """(key, value) of a control record (``change.settings`` must not be None: Sluice never writes tombstones)."""
    return change.section.encode(), json.dumps(change.as_json(), separators=(",", ":"), sort_keys=True).encode()


def decode(key: bytes | None, value: bytes | None, offset: int, fleet: str, sections: Collection[str]) -> Change:
    """The change a record at ``offset`` carries, or :class:`Skipped` (any reason but ``stale`` and ``invalid``,
    which need the state). A tombstone of a known section is a change whose ``settings`` is None."""
    name = _text(key)
    if value is None:
        if name not in sections:
            raise Skipped("section", f"tombstone of {name!r}, not a section changeable at run time")
        return Change(fleet, name, revision_of(offset), None)
    try:
        data = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise Skipped("garbage", f"key {name!r}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise Skipped("garbage", f"key {name!r}: not a JSON object")
    if data.get("schema") != SCHEMA:
        raise Skipped("schema", f"key {name!r}: schema {data.get('schema')!r}, this Sluice reads {SCHEMA}")
    settings = data.get("settings")
    if not isinstance(settings, dict):
        raise Skipped("garbage", f"key {name!r}: settings is not a JSON object")
    section = data.get("section")
    if section != name:
        raise Skipped("garbage", f"key {name!r} holds section {section!r}")
    if data.get("fleet") != fleet:
        raise Skipped("fleet", f"key {name!r}: fleet {data.get('fleet')!r}, this instance is in {fleet!r}")
    if section not in sections:
        raise Skipped("section", f"[{section}] is not changeable at run time (known: {', '.join(sections)})")
    return Change(fleet, section, revision_of(offset), settings, str(data.get("changed_by", "")),
                  str(data.get("changed_at", "")))


def _text(key: bytes | None) -> str:
    if key is None:
        return ""
    return key.decode("utf-8", errors="replace")


#: validates a section's settings: (section, settings) -> the validated section (a model); raises on invalid
Validate = Callable[[str, dict[str, Any]], Any]


@dataclass
class FleetState:
    """What the fleet's records say, folded in topic order: per section the revision of its latest record and
    the change in force (none: the section is the instance's own)."""

    fleet: str
    sections: tuple[str, ...]
    validate: Validate
    #: per section, the revision of the latest record folded (applied, deleted or invalid)
    latest: dict[str, int] = field(default_factory=dict)
    #: per section, the change in force and its validated settings
    applied: dict[str, tuple[Change, Any]] = field(default_factory=dict)

    def revision(self, section: str) -> int:
        """The section's revision (0: no record of it folded)."""
        return self.latest.get(section, 0)

    def revisions(self) -> dict[str, int]:
        return {s: self.revision(s) for s in self.sections}

    def offer(self, key: bytes | None, value: bytes | None, offset: int) -> tuple[Change, Any]:
        """Fold one record: (the change, its validated settings, or None for a tombstone) to apply, or
        :class:`Skipped`."""
        change = decode(key, value, offset, self.fleet, self.sections)
        current = self.revision(change.section)
        if change.revision <= current:
            raise Skipped("stale", f"[{change.section}] revision {change.revision}, revision {current} is folded")
        self.latest[change.section] = change.revision
        if change.settings is None:
            self.applied.pop(change.section, None)
            return change, None
        try:
            validated = self.validate(change.section, change.settings)
        except (ConfigError, ValueError) as exc:
            raise Skipped("invalid", f"[{change.section}] revision {change.revision}: {exc}") from None
        self.applied[change.section] = (change, validated)
        return change, validated

    def settings_of(self) -> dict[str, dict[str, Any]]:
        """The fleet's sections in force (validated, as dicts)."""
        return {s: validated.model_dump() for s, (_, validated) in self.applied.items()}

    def hashes(self) -> dict[str, str]:
        """:func:`settings_hash` of each section the fleet sets."""
        return {s: settings_hash(values) for s, values in self.settings_of().items()}


def check_based_on(state: FleetState, section: str, based_on: int | None) -> None:
    """A change of ``section`` based on revision ``based_on`` (what the writer's GET answered; None: unconditional)
    after reading the topic to its end into ``state``: :class:`Conflict` if the section has a later record. A
    ``based_on`` above what the topic holds is no conflict: the records it counted were compacted away (a
    tombstone's key) or belonged to the topic before it was created again."""
    current = state.revision(section)
    if based_on is not None and current > based_on:
        raise Conflict(section, based_on, current)
