"""``[sharing]``: cooperative consumption (consumers share a partition by key-hash slice); needs a restart."""

from __future__ import annotations

import re
from typing import Annotated

from ...config.base import (
    ClientSelectorSettings,
    KeyedValueError,
    Meta,
    Section,
    check_finite,
    check_topic_name,
    check_topic_or_glob,
    field,
    field_validator,
    model_validator,
    one_entry_per_topic,
)
from .keys import MAX_SLICES


class SharingTopicSettings(Section, kw_only=True, frozen=True):
    """One ``[[sharing.topics]]`` entry: whether a topic (or a family of topics) may be shared by key-hash slices.
    Resolved as ``[[throttle.topics]]`` are: the entry naming a topic exactly wins, else the first glob in file
    order that matches it."""

    topic: Annotated[str, Meta(
        description='Topic name, or a glob over topic names ("orders-*", "*"): *, ?, [...] as in '
                    "fnmatch, case-sensitive.")]
    shared: Annotated[bool, Meta(description="Whether these topics are shared (false exempts a topic a glob "
                                             "would share).")] = True

    @field_validator("topic")
    @classmethod
    def _topic(cls, value: str) -> str:
        return check_topic_or_glob(value)


#: "index/count": slice index of count even slices of the key-hash space (keys.py)
_SLICE = re.compile(r"([0-9]+)/([0-9]+)")


class SharingStandaloneSettings(Section, kw_only=True, frozen=True):
    """One ``[[sharing.standalone]]`` entry: a consumer that uses ``assign()`` (no group protocol) reads only its
    key-hash slice of a topic's partitions. Each partition's slices are the ``count`` even slices; the members of
    one partition must be configured with the same count (one entry each, in every Sluice they use)."""

    client_id: Annotated[str, Meta(description='client.id glob of the consumer, e.g. "etl-1".')]
    topic: Annotated[str, Meta(description="The topic (a name, not a glob).")]
    partitions: Annotated[list[Annotated[int, Meta(ge=0)]], Meta(
        description="The partitions the slice applies to; empty = every partition.")] = field(default_factory=list)
    slice: Annotated[str, Meta(description='The consumer\'s slice, "index/count", e.g. "0/2" (the first of two).')]

    @field_validator("client_id")
    @classmethod
    def _glob(cls, value: str) -> str:
        if not value:
            raise ValueError('must be a client.id glob, e.g. "etl-1"')
        return value

    @field_validator("topic")
    @classmethod
    def _topic(cls, value: str) -> str:
        return check_topic_name(value)

    @field_validator("slice")
    @classmethod
    def _slice(cls, value: str) -> str:
        m = _SLICE.fullmatch(value.strip())
        if m is None or not 0 <= int(m[1]) < int(m[2]) <= MAX_SLICES:
            raise ValueError(f'must be "index/count" with 0 <= index < count <= {MAX_SLICES}, e.g. "0/2", '
                             f"got {value!r}")
        return value.strip()


class SharingSettings(Section, kw_only=True, frozen=True):
    """Cooperative consumption (proxy/policies/sharing/): consumers share a partition by key-hash slice.
    Needs a restart."""

    enabled: Annotated[bool, Meta(description="Sluice-wide switch.")] = False
    clients: Annotated[list[str | ClientSelectorSettings], Meta(
        description="The consumers that opt in (first switch per consumer): client.id globs, or client selectors "
                    "({client_id, principal, client_address}, all given must match).",
    )] = field(default_factory=lambda: list[str | ClientSelectorSettings](["*"]))
    topics: Annotated[list[SharingTopicSettings], Meta(
        description="The topics that may be shared (per-topic switch).")] = field(default_factory=list)
    standalone: Annotated[list[SharingStandaloneSettings], Meta(
        description="Slices of consumers that use assign() instead of a group.")] = field(default_factory=list)
    cache_max_bytes: Annotated[int, Meta(
        ge=0, description="Decoded batches kept for the other members of the same partition in this Sluice; 0 = none.",
    )] = 64 * 1024 * 1024
    member_wait_s: Annotated[float, Meta(
        gt=0, le=600, description="How long fetches of an opted-in consumer whose group member Sluice does not know "
                                  "(after a "
                                  "Sluice restart) are withheld waiting for it; then they pass unfiltered.")] = 10.0
    metadata_max_bytes: Annotated[int, Meta(
        ge=256, le=1 << 20, description="The brokers' offset.metadata.max.bytes: commit metadata Sluice writes fits "
                                        "it.")] = 4096

    @field_validator("clients")
    @classmethod
    def _clients(cls, value: list[str | ClientSelectorSettings]) -> list[str | ClientSelectorSettings]:
        if any(isinstance(glob, str) and not glob for glob in value):
            raise ValueError('a client.id glob cannot be empty ("*" = every client)')
        return value

    @field_validator("member_wait_s")
    @classmethod
    def _finite(cls, value: float) -> float:
        return check_finite(value)

    @model_validator
    def _consistent(self) -> None:
        one_entry_per_topic("sharing", [t.topic for t in self.topics])
        if self.enabled and not any(t.shared for t in self.topics):
            raise KeyedValueError("topics", "sharing is enabled but no topic may be shared: add a "
                                            '[[sharing.topics]] entry, e.g. topic = "orders-*"')
        seen: dict[tuple[str, str], tuple[int, set[int]]] = {}
        counts: dict[str, int] = {}
        for i, e in enumerate(self.standalone):
            parts = set(e.partitions)
            key = (e.client_id, e.topic)
            if key in seen and (not parts or not seen[key][1] or parts & seen[key][1]):
                raise KeyedValueError(f"standalone[{i}]", f"client {e.client_id!r} already has a slice of "
                                                          f"{e.topic!r} there (sharing.standalone[{seen[key][0]}])")
            seen[key] = (i, parts)
            count = int(e.slice.split("/")[1])
            if counts.setdefault(e.topic, count) != count:
                raise KeyedValueError(f"standalone[{i}].slice", f"{e.topic!r} is split in {counts[e.topic]} "
                                                                "slices by another entry: one count per topic")
