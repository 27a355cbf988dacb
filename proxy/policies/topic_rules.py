"""Settings given per topic by topic name or by glob, resolved the one way Sluice resolves them everywhere
(``[[throttle.topics]]``, ``[[sharing.topics]]``): the entry naming a topic exactly wins, else the first glob in
file order that matches it (fnmatch's ``*``, ``?``, ``[...]``, case-sensitive like Kafka's topic names; no topic
name can hold those characters, Topic.java), else none. Entries are never merged.

The entry found for a topic name is remembered (:attr:`TopicRules.RESOLVED_MAX` names at most), so fnmatch runs
once per topic name, not per partition per fetch. A :class:`TopicRules` is built from one configuration snapshot
and replaced whole with it, memo included.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Generic, TypeVar

from ..config.base import topic_is_glob

T = TypeVar("T")


class TopicRules(Generic[T]):
    #: Names resolved through globs that are remembered at most (then the memo starts again from the exact names,
    #: as the re module's cache does). A fetch may name any topic, so an unbounded memo would be unbounded memory;
    #: 10,000 names are a megabyte or two, and more topics than one proxy usually sees fetched.
    RESOLVED_MAX = 10_000

    def __init__(self, entries: Mapping[str, T]) -> None:
        """``entries``: topic name or glob -> value, in file order."""
        self.entries = dict(entries)
        self.exact = {t: v for t, v in self.entries.items() if not topic_is_glob(t)}
        #: the glob entries, in file order (their order is configuration: the first match wins)
        self.globs = tuple(t for t in self.entries if t not in self.exact)
        self._resolved: dict[str, T | None] = dict(self.exact)

    def __bool__(self) -> bool:
        return bool(self.entries)

    def get(self, topic: str) -> T | None:
        """The value of the entry that applies to ``topic`` (None: no entry)."""
        resolved = self._resolved
        if topic in resolved:
            return resolved[topic]
        if not self.globs:
            return None
        entry = self.entry(topic)
        value = self.entries[entry] if entry is not None else None
        if len(resolved) >= len(self.exact) + self.RESOLVED_MAX:
            resolved.clear()
            resolved.update(self.exact)
        resolved[topic] = value
        return value

    def entry(self, topic: str) -> str | None:
        """The entry (a name or a glob, as configured) that applies to ``topic``."""
        if topic in self.exact:
            return topic
        return next((g for g in self.globs if fnmatch.fnmatchcase(topic, g)), None)
