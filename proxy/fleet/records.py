"""The fleet's control records and the rules every instance folds them with: sans-IO (no Kafka, no clock; the
I/O part is proxy/fleet/control.py).

A control record is one run-time changeable section of the whole fleet: key = the section's name (UTF-8), value =
JSON ``{"schema": 1, "fleet", "section", "revision", "settings", "changed_by", "changed_at"}``; ``settings`` is the
whole section (keys left out take their defaults, as a PUT of the admin API), ``revision`` counts the section's
changes (1, 2, ...; it only grows). The topic is compacted (one record per key survives), so the latest record of
each section is the fleet's setting of it.

Every instance reads the same records in the same order (one key, one partition: Kafka keeps a partition's order),
folds them with :class:`FleetState` and so reaches the same settings. A record is skipped, counted by reason and
never applied, when it is:

- ``garbage``: not JSON, not an object, fields missing or of the wrong type, key and section differ;
- ``schema``: a schema version this Sluice does not know (a later Sluice's record: this one keeps its settings);
- ``fleet``: another fleet's (two fleets sharing a topic by mistake must not steer each other);
- ``section``: a section this Sluice does not change at run time;
- ``stale``: a revision not above the one applied (a replay, or a record written around the writers' fencing);
- ``invalid``: the settings fail the section's validation (``ConfigError``);
- ``tombstone``: a deleted key (an operator's clean-up): the section keeps what it has.

A writer checks a change against the state it read to the topic's end (:func:`next_revision`): a change based on
an older revision than the current one is a :class:`Conflict` (no lost update between two operators).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ..config.base import ConfigError

__all__ = ["SCHEMA", "SKIP_REASONS", "Change", "Conflict", "FleetState", "Skipped", "decode", "encode",
           "next_revision"]

#: The control records' schema version this Sluice writes and reads.
SCHEMA = 1

SkipReason = Literal["garbage", "schema", "fleet", "section", "stale", "invalid", "tombstone"]
SKIP_REASONS: tuple[SkipReason, ...] = ("garbage", "schema", "fleet", "section", "stale", "invalid", "tombstone")


@dataclass(frozen=True, slots=True)
class Change:
    """One control record: a section's settings for the whole fleet, at a revision."""

    fleet: str
    section: str
    revision: int
    settings: dict[str, Any]
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
    """A change based on a revision older than the section's current one."""

    def __init__(self, section: str, based_on: int, current: int) -> None:
        super().__init__(f"[{section}] changed meanwhile: the change is based on revision {based_on}, the fleet "
                         f"runs revision {current}; read it again and retry")
        self.section, self.based_on, self.current = section, based_on, current


def encode(change: Change) -> tuple[bytes, bytes]:
    """(key, value) of a control record."""
    return change.section.encode(), json.dumps(change.as_json(), separators=(",", ":"), sort_keys=True).encode()


def decode(key: bytes | None, value: bytes | None, fleet: str, sections: Collection[str]) -> Change:
    """The change a record carries, or :class:`Skipped` (any reason but ``stale`` and ``invalid``, which need
    the state)."""
    name = _text(key)
    if value is None:
        raise Skipped("tombstone", f"key {name!r} deleted")
    try:
        data = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise Skipped("garbage", f"key {name!r}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise Skipped("garbage", f"key {name!r}: not a JSON object")
    if data.get("schema") != SCHEMA:
        raise Skipped("schema", f"key {name!r}: schema {data.get('schema')!r}, this Sluice reads {SCHEMA}")
    revision, settings = data.get("revision"), data.get("settings")
    if not isinstance(revision, int) or isinstance(revision, bool) or revision < 1:
        raise Skipped("garbage", f"key {name!r}: revision {revision!r} is not a positive integer")
    if not isinstance(settings, dict):
        raise Skipped("garbage", f"key {name!r}: settings is not a JSON object")
    section = data.get("section")
    if section != name:
        raise Skipped("garbage", f"key {name!r} holds section {section!r}")
    if data.get("fleet") != fleet:
        raise Skipped("fleet", f"key {name!r}: fleet {data.get('fleet')!r}, this instance is in {fleet!r}")
    if section not in sections:
        raise Skipped("section", f"[{section}] is not changeable at run time (known: {', '.join(sections)})")
    return Change(fleet, section, revision, settings, str(data.get("changed_by", "")),
                  str(data.get("changed_at", "")))


def _text(key: bytes | None) -> str:
    if key is None:
        return ""
    return key.decode("utf-8", errors="replace")


#: validates a section's settings: (section, settings) -> the validated section's model_dump(); raises on invalid
Validate = Callable[[str, dict[str, Any]], Any]


@dataclass
class FleetState:
    """What the fleet's records say, folded in topic order: per section the latest change applied."""

    fleet: str
    sections: tuple[str, ...]
    validate: Validate
    applied: dict[str, Change] = field(default_factory=dict)

    def revision(self, section: str) -> int:
        """The section's revision in force (0: the fleet never set it)."""
        change = self.applied.get(section)
        return change.revision if change is not None else 0

    def revisions(self) -> dict[str, int]:
        return {s: self.revision(s) for s in self.sections}

    def offer(self, key: bytes | None, value: bytes | None) -> tuple[Change, Any]:
        """Fold one record: (the change, what ``validate`` made of it) to apply, or :class:`Skipped`."""
        change = decode(key, value, self.fleet, self.sections)
        current = self.revision(change.section)
        if change.revision <= current:
            raise Skipped("stale", f"[{change.section}] revision {change.revision}, revision {current} is applied")
        try:
            validated = self.validate(change.section, change.settings)
        except (ConfigError, ValueError) as exc:
            raise Skipped("invalid", f"[{change.section}] revision {change.revision}: {exc}") from None
        self.applied[change.section] = change
        return change, validated

    def settings_of(self) -> Mapping[str, dict[str, Any]]:
        return {s: c.settings for s, c in self.applied.items()}


def next_revision(state: FleetState, section: str, based_on: int | None) -> int:
    """The revision a change of ``section`` gets, written after reading the topic to its end into ``state``.
    ``based_on`` = the revision the writer's change was made from (None: unconditional, e.g. a clear);
    :class:`Conflict` if the section has moved past it."""
    current = state.revision(section)
    if based_on is not None and based_on != current:
        raise Conflict(section, based_on, current)
    return current + 1
