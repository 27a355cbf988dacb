"""``[throttle]``: replication throttles (KIP-73), changeable at run time."""

from __future__ import annotations

import re
from typing import Annotated, Self

from pydantic import Field, field_validator, model_validator

from ...config.base import ClientSelectorSettings, Section, check_finite, check_topic_or_glob, one_entry_per_topic


class ThrottleTopicSettings(Section):
    """One ``[[throttle.topics]]`` entry: which of a topic's replicas are throttled (KIP-73's
    ``leader/follower.replication.throttled.replicas`` syntax)."""

    topic: str = Field(
        description='Topic name, or a glob over topic names ("orders-*", "*"): *, ?, [...] as in fnmatch, '
                    "case-sensitive. An exact name wins over globs; among globs the first in file order wins.",
    )
    replicas: str = Field(
        default="*",
        description='"*" (all partitions, every fetcher) or "partition:fetcher,..." (fetcher = broker id).',
    )

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


class ThrottleSettings(Section):
    """Replication throttles (KIP-73). Changeable at run time (admin API PUT /throttles, SIGHUP)."""

    leader_rate_bytes: Annotated[int, Field(ge=0)] = Field(
        default=0, description="Bytes/s bound on throttled partitions in responses to fetchers; 0 = none."
    )
    follower_rate_bytes: Annotated[int, Field(ge=0)] = Field(
        default=0, description="Bytes/s bound on throttled partitions Sluice fetches upstream; 0 = none."
    )
    window_s: Annotated[float, Field(gt=0, le=3600)] = Field(
        default=1.0, description="Sample window, seconds (replication.quota.window.size.seconds)."
    )
    samples: Annotated[int, Field(ge=1, le=1000)] = Field(
        default=11, description="Samples kept (replication.quota.window.num)."
    )
    topics: list[ThrottleTopicSettings] = Field(default_factory=list, description="Throttled replicas per topic.")
    consumers: list[ClientSelectorSettings] = Field(
        default_factory=list, description="Consumers (by client.id glob) the topic lists also apply to."
    )

    @field_validator("window_s")
    @classmethod
    def _finite(cls, value: float) -> float:
        return check_finite(value)

    @model_validator(mode="after")
    def _one_entry_per_topic(self) -> Self:
        one_entry_per_topic("throttle", [t.topic for t in self.topics], " (list all its replicas in that entry)")
        return self
