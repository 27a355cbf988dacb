"""``[size_limit]``: response-size limiting (KIP-74), changeable at run time."""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import Field, model_validator

from ...config.base import KeyedValueError, Network, Section


class BudgetSettings(Section):
    """One ``[[size_limit.budgets]]`` entry (KIP-74). The first entry that matches a fetch applies; an entry's
    selectors (client_id, principal, client_address) must all match."""

    client_id: str | None = Field(
        default=None, description='client.id glob ("*" = every consumer); exclusive with replicas.'
    )
    principal: str | None = Field(
        default=None, description="SASL principal glob (the authenticated user); exclusive with replicas.")
    client_address: Network = Field(
        default=None, description="Client IP address or CIDR network (the PROXY protocol's source when read); "
                                  "exclusive with replicas.")
    replicas: bool = Field(default=False, description="Applies to replica fetchers (replica_id >= 0).")
    fetch_max_bytes: Annotated[int, Field(ge=0, le=2**31 - 1)] | None = Field(
        default=None,
        description="Response budget in bytes; 0 = none. Default: 10 MiB for replicas "
        "(replica.fetch.response.max.bytes), else 0.",
    )
    partition_max_bytes: Annotated[int, Field(ge=0, le=2**31 - 1)] = Field(
        default=0, description="Per-partition cap in bytes; 0 = none."
    )

    @model_validator(mode="after")
    def _selector(self) -> Self:
        clients = self.client_id is not None or self.principal is not None or self.client_address is not None
        if clients == self.replicas:
            raise KeyedValueError(
                "client_id", "set client selectors (client_id, principal, client_address) or replicas = true, "
                             "exactly one of the two"
            )
        return self


class SizeLimitSettings(Section):
    """Response-size limiting (KIP-74). Changeable at run time (admin API PUT /size-limits, SIGHUP)."""

    budgets: list[BudgetSettings] = Field(default_factory=list, description="Budget rules, first match wins.")
    fairness: Literal["round-robin", "off"] = Field(
        default="round-robin", description="Rotate partitions that returned data to the back, per connection."
    )
    global_max_bytes: Annotated[int, Field(ge=0)] = Field(
        default=0, description="Bound on response bytes held in Sluice at once; 0 = none."
    )
