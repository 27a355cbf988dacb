"""``[size_limit]``: response-size limiting (KIP-74), changeable at run time."""

from __future__ import annotations

from typing import Annotated, Literal

from ...config.base import KeyedValueError, Meta, Network, Section, field, model_validator


class BudgetSettings(Section, kw_only=True, frozen=True):
    """One ``[[size_limit.budgets]]`` entry (KIP-74). The first entry that matches a fetch applies; an entry's
    selectors (client_id, principal, client_address) must all match."""

    client_id: Annotated[str | None, Meta(
        description='client.id glob ("*" = every consumer); exclusive with replicas.')] = None
    principal: Annotated[str | None, Meta(
        description="SASL principal glob (the authenticated user); exclusive with replicas.")] = None
    client_address: Annotated[Network, Meta(
        description="Client IP address or CIDR network (the PROXY protocol's source when read); "
                    "exclusive with replicas.")] = None
    replicas: Annotated[bool, Meta(description="Applies to replica fetchers (replica_id >= 0).")] = False
    fetch_max_bytes: Annotated[Annotated[int, Meta(ge=0, le=2**31 - 1)] | None, Meta(
        description="Response budget in bytes; 0 = none. Default: 10 MiB for replicas "
                    "(replica.fetch.response.max.bytes), else 0.")] = None
    partition_max_bytes: Annotated[int, Meta(
        ge=0, le=2**31 - 1, description="Per-partition cap in bytes; 0 = none.")] = 0

    @model_validator
    def _selector(self) -> None:
        clients = self.client_id is not None or self.principal is not None or self.client_address is not None
        if clients == self.replicas:
            raise KeyedValueError(
                "client_id", "set client selectors (client_id, principal, client_address) or replicas = true, "
                             "exactly one of the two"
            )


class SizeLimitSettings(Section, kw_only=True, frozen=True):
    """Response-size limiting (KIP-74). Changeable at run time (admin API PUT /size-limits, SIGHUP)."""

    budgets: Annotated[list[BudgetSettings], Meta(
        description="Budget rules, first match wins.")] = field(default_factory=list)
    fairness: Annotated[Literal["round-robin", "off"], Meta(
        description="Rotate partitions that returned data to the back, per connection.")] = "round-robin"
    global_max_bytes: Annotated[int, Meta(
        ge=0, description="Bound on response bytes held in Sluice at once; 0 = none.")] = 0
