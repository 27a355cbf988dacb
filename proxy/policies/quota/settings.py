"""``[quota]``: client quotas (KIP-13 byte rates, KIP-124 request rates) per client selector, changeable at run
time."""

from __future__ import annotations

from typing import Annotated, Self

from pydantic import Field, field_validator, model_validator

from ...config.base import ClientSelectorSettings, KeyedValueError, Section, check_finite


class QuotaEntrySettings(ClientSelectorSettings):
    """One ``[[quota.entries]]`` entry: the clients it selects (client.id glob, principal glob, client network;
    all that are given must match) and their quotas. A client takes the first entry that selects it."""

    name: str = Field(default="", description='Name in metrics and logs; "" = "entries[N]".')
    produce_rate_bytes: Annotated[int, Field(ge=0)] = Field(
        default=0, description="Produce request bytes/s (Kafka's producer_byte_rate); 0 = none.")
    fetch_rate_bytes: Annotated[int, Field(ge=0)] = Field(
        default=0, description="Fetch response bytes/s (Kafka's consumer_byte_rate); 0 = none.")
    request_rate: Annotated[float, Field(ge=0)] = Field(
        default=0.0, description="Produce and Fetch requests/s; 0 = none.")
    shared: bool = Field(
        default=False,
        description="true: one quota for every connection the entry selects together; false: one per client "
                    "(principal and client.id, Kafka's quota entity).")

    @field_validator("request_rate")
    @classmethod
    def _finite(cls, value: float) -> float:
        return check_finite(value)


class QuotaSettings(Section):
    """Client quotas. Changeable at run time (admin API PUT /quotas, SIGHUP)."""

    window_s: Annotated[float, Field(gt=0, le=3600)] = Field(
        default=1.0, description="Sample window, seconds (quota.window.size.seconds).")
    samples: Annotated[int, Field(ge=1, le=1000)] = Field(
        default=11, description="Samples kept (quota.window.num).")
    entries: list[QuotaEntrySettings] = Field(default_factory=list, description="Quotas per client selector.")

    @field_validator("window_s")
    @classmethod
    def _window_finite(cls, value: float) -> float:
        return check_finite(value)

    @model_validator(mode="after")
    def _unique_names(self) -> Self:
        seen: dict[str, int] = {}
        for i, entry in enumerate(self.entries):
            name = entry.name or f"entries[{i}]"
            if name in seen:
                raise KeyedValueError(f"entries[{i}].name", f"{name!r} is already quota.entries[{seen[name]}]")
            seen[name] = i
        return self
