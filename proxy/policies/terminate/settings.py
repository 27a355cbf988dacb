"""``[sessions]``: incremental fetch sessions (KIP-227); needs a restart."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from ...config.base import Seconds, Section, check_finite


class SessionClientSettings(Section):
    """One ``[[sessions.clients]]`` entry: the mode for clients whose client.id matches (first match wins)."""

    client_id: str = Field(description='client.id glob, e.g. "rdkafka*" ("*" = every client).')
    mode: Literal["passthrough", "terminate"] = Field(description="The mode for these clients.")

    @field_validator("client_id")
    @classmethod
    def _glob(cls, value: str) -> str:
        if not value:
            raise ValueError('must be a glob, e.g. "rdkafka*" ("*" = every client)')
        return value


class SessionsSettings(Section):
    """Incremental fetch sessions (KIP-227; sessions.py and policy.py beside this module). Needs a restart."""

    mode: Literal["passthrough", "terminate"] = Field(
        default="passthrough",
        description="passthrough: relay Fetch sessions untouched. terminate: Sluice owns the sessions on both "
                    "sides: one upstream session per client connection (only changed partitions on the upstream "
                    "link), and it serves the sessions of clients that use them (the Java client, "
                    "kafka-python) itself; session-less clients (librdkafka, aiokafka) get full responses. "
                    "The mode for clients no [[sessions.clients]] entry matches.",
    )
    clients: list[SessionClientSettings] = Field(
        default_factory=list, description="Mode per client.id glob, first match wins."
    )
    cache_slots: Annotated[int, Field(ge=1, le=1_000_000)] = Field(
        default=1000, description="Downstream session cache slots (max.incremental.fetch.session.cache.slots)."
    )
    eviction_age_s: Seconds = Field(
        default=120.0, description="A downstream session idle this long may be evicted by any newcomer."
    )

    @field_validator("eviction_age_s")
    @classmethod
    def _finite(cls, value: float) -> float:
        return check_finite(value)
