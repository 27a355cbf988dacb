"""``[throttle]``: replication throttles (KIP-73), changeable at run time."""

from __future__ import annotations

import re
from typing import Annotated

from ...config.base import (
    ClientSelectorSettings,
    Meta,
    Section,
    check_finite,
    check_topic_or_glob,
    field,
    field_validator,
    model_validator,
    one_entry_per_topic,
)


class ThrottleTopicSettings(Section, kw_only=True, frozen=True):
    """One ``[[throttle.topics]]`` entry: which of a topic's replicas are throttled (KIP-73's
    ``leader/follower.replication.throttled.replicas`` syntax)."""

    topic: Annotated[str, Meta(
        description='Topic name, or a glob over topic names ("orders-*", "*"): *, ?, [...] as in fnmatch, '
                    "case-sensitive. An exact name wins over globs; among globs the first in file order wins.")]
    replicas: Annotated[str, Meta(
        description='"*" (all partitions, every fetcher) or "partition:fetcher,..." (fetcher = broker id).')] = "*"

    @field_validator("topic")
    @classmethod
    def _topic(cls, value: str) -> str:
        return check_topic_or_glob(value)

    @field_validator("replicas")
    @classmethod
    def _replicas(cls, value: str) -> str:
        value = value.strip()
        if value in ("*", ""):  # Kafka: "" = none, "*" = all
            return value
        for item in value.split(","):
            if not _REPLICA_ITEM.fullmatch(item.strip()):
                raise ValueError(
                    f'{item.strip()!r} is not "partition:broker" (e.g. "0:101,1:102"); use "*" for all'
                )
        return value


_REPLICA_ITEM = re.compile(r"[0-9]+:[0-9]+")


class ThrottleSettings(Section, kw_only=True, frozen=True):
    """Replication throttles (KIP-73). Changeable at run time (admin API PUT /throttles, SIGHUP)."""

    leader_rate_bytes: Annotated[int, Meta(
        ge=0, description="Bytes/s bound on throttled partitions in responses to fetchers; 0 = none.")] = 0
    follower_rate_bytes: Annotated[int, Meta(
        ge=0, description="Bytes/s bound on throttled partitions Sluice fetches upstream; 0 = none.")] = 0
    window_s: Annotated[float, Meta(
        gt=0, le=3600, description="Sample window, seconds (replication.quota.window.size.seconds).")] = 1.0
    samples: Annotated[int, Meta(ge=1, le=1000, description="Samples kept (replication.quota.window.num).")] = 11
    topics: Annotated[list[ThrottleTopicSettings], Meta(
        description="Throttled replicas per topic.")] = field(default_factory=list)
    consumers: Annotated[list[ClientSelectorSettings], Meta(
        description="Consumers (by client.id glob) the topic lists also apply to.")] = field(default_factory=list)

    @field_validator("window_s")
    @classmethod
    def _finite(cls, value: float) -> float:
        return check_finite(value)

    @model_validator
    def _one_entry_per_topic(self) -> None:
        one_entry_per_topic("throttle", [t.topic for t in self.topics], " (list all its replicas in that entry)")
