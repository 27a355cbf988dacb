"""``[sessions]``: incremental fetch sessions (KIP-227); needs a restart."""

from __future__ import annotations

from typing import Annotated, Literal

from ...config.base import Meta, Seconds, Section, check_finite, field, field_validator


class SessionClientSettings(Section, kw_only=True, frozen=True):
    """One ``[[sessions.clients]]`` entry: the mode for clients whose client.id matches (first match wins)."""

    client_id: Annotated[str, Meta(description='client.id glob, e.g. "rdkafka*" ("*" = every client).')]
    mode: Annotated[Literal["passthrough", "terminate"], Meta(description="The mode for these clients.")]

    @field_validator("client_id")
    @classmethod
    def _glob(cls, value: str) -> str:
        if not value:
            raise ValueError('must be a glob, e.g. "rdkafka*" ("*" = every client)')
        return value


class SessionsSettings(Section, kw_only=True, frozen=True):
    """Incremental fetch sessions (KIP-227; sessions.py and policy.py beside this module). Needs a restart."""

    mode: Annotated[Literal["passthrough", "terminate"], Meta(
        description="passthrough: relay Fetch sessions untouched. terminate: Sluice owns the sessions on both "
                    "sides: one upstream session per client connection (only changed partitions on the upstream "
                    "link), and it serves the sessions of clients that use them (the Java client, "
                    "kafka-python) itself; session-less clients (librdkafka, aiokafka) get full responses. "
                    "The mode for clients no [[sessions.clients]] entry matches.")] = "passthrough"
    clients: Annotated[list[SessionClientSettings], Meta(
        description="Mode per client.id glob, first match wins.")] = field(default_factory=list)
    cache_slots: Annotated[int, Meta(
        ge=1, le=1_000_000, description="Downstream session cache slots (max.incremental.fetch.session.cache.slots).",
    )] = 1000
    eviction_age_s: Annotated[Seconds, Meta(
        description="A downstream session idle this long may be evicted by any newcomer.")] = 120.0

    @field_validator("eviction_age_s")
    @classmethod
    def _finite(cls, value: float) -> float:
        return check_finite(value)
