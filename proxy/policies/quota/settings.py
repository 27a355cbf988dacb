"""``[quota]``: client quotas (KIP-13 byte rates, KIP-124 request rates) per quota entity, changeable at run time.

An entry names an entity as Kafka's ``kafka-configs --entity-type users/clients`` does, plus Sluice's own third
part, the client's address: each of ``principal`` (Kafka's user), ``client_id`` and ``client_address`` is a name
(an address or network for the last), a glob (Sluice's: ``"etl-*"``), ``"<default>"`` (Kafka's default entity:
every value that has no entry of its own) or left out. Each quota kind is set, or left out (the client's next
most specific entry that sets it applies: book.py has the order), or 0: no quota of that kind for this entity,
whatever a less specific entry says (an exemption).

The form before entities (a glob or network per selector, 0 for "none", the first entry selecting a client
governing every kind) is read as it is: its selectors are this form's names and globs, and its 0 is an
exemption. Kafka's own config names (``producer_byte_rate``, ``consumer_byte_rate``, ``request_percentage``,
``user``) are refused with the key to use instead.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from ...config.base import KeyedValueError, Meta, Section, check_finite, field, field_validator, model_validator

#: Kafka's name for the default entity of a kind (kafka-configs ``--entity-default``, ClientQuotaEntity)
DEFAULT = "<default>"

#: Kafka's quota config names and users' entity name -> (this section's key, what to say)
_KAFKA_NAMES = {
    "producer_byte_rate": ("produce_rate_bytes", "Produce request bytes/s"),
    "consumer_byte_rate": ("fetch_rate_bytes", "Fetch and ShareFetch response bytes/s"),
    "request_percentage": ("request_rate",
                           "requests/s; Kafka's share of broker thread time has no meaning in front of the broker"),
    "user": ("principal", "the SASL principal's name, or a glob, or \"<default>\""),
}

Scope = Literal["instance", "fleet"]


class QuotaEntrySettings(Section, kw_only=True, frozen=True):
    """One ``[[quota.entries]]`` entry: an entity (principal, client.id, client address: each a name, a glob,
    ``"<default>"`` or left out; at least one given) and its quotas per kind."""

    renamed_keys: ClassVar[Mapping[str, str]] = {
        kafka: f"Sluice's name for this is {ours} ({what})" for kafka, (ours, what) in _KAFKA_NAMES.items()}

    name: Annotated[str, Meta(description='Name in metrics and logs; "" = "entries[N]".')] = ""
    principal: Annotated[str | None, Meta(
        description='SASL principal (Kafka\'s user): a name, a glob, or "<default>".')] = None
    client_id: Annotated[str | None, Meta(description='client.id: a name, a glob, or "<default>".')] = None
    client_address: Annotated[str | None, Meta(
        description='Client IP address or CIDR network (PROXY protocol\'s source), or "<default>".')] = None
    produce_rate_bytes: Annotated[Annotated[int, Meta(ge=0)] | None, Meta(
        description="Produce request bytes/s (Kafka's producer_byte_rate); 0 = exempt; unset = the next entry's.",
    )] = None
    fetch_rate_bytes: Annotated[Annotated[int, Meta(ge=0)] | None, Meta(
        description="Fetch and ShareFetch response bytes/s (Kafka's consumer_byte_rate); 0 = exempt; unset = the "
                    "next entry's.")] = None
    request_rate: Annotated[Annotated[float, Meta(ge=0)] | None, Meta(
        description="Produce, Fetch, ShareFetch and ShareAcknowledge requests/s; 0 = exempt; unset = the next "
                    "entry's.")] = None
    shared: Annotated[bool, Meta(
        description="true: one quota for every client the entry selects together; false: one per entity, as Kafka "
                    "keys it (each value a glob or \"<default>\" matches has its own).")] = False
    scope: Annotated[Scope | None, Meta(
        description='"instance": this Sluice\'s alone; "fleet": one quota for the whole [fleet]; '
                    "unset = [quota] scope.")] = None

    @field_validator("principal", "client_id")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and not value:
            raise ValueError('must be a name, a glob (e.g. "etl-*") or "<default>"')
        return value

    @field_validator("client_address")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if value is None or value == DEFAULT:
            return value
        try:
            ipaddress.ip_network(value, strict=False)
        except ValueError:
            raise ValueError('must be an IP address, a CIDR network (e.g. 10.1.0.0/16) or "<default>", got '
                             f"{value!r}") from None
        return value

    @field_validator("request_rate")
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        return None if value is None else check_finite(value)

    @model_validator
    def _complete(self) -> None:
        if self.client_id is None and self.principal is None and self.client_address is None:
            raise KeyedValueError("client_id", "set at least one of principal, client_id, client_address (a name, "
                                               'a glob or "<default>")')
        if self.produce_rate_bytes is None and self.fetch_rate_bytes is None and self.request_rate is None:
            raise KeyedValueError("produce_rate_bytes", "set at least one of produce_rate_bytes, fetch_rate_bytes, "
                                                        "request_rate (0 = exempt from a less specific entry's)")


class QuotaSettings(Section, kw_only=True, frozen=True):
    """Client quotas. Changeable at run time (admin API PUT /quotas, ``sluice quota set``, SIGHUP)."""

    window_s: Annotated[float, Meta(
        gt=0, le=3600, description="Sample window, seconds (quota.window.size.seconds).")] = 1.0
    samples: Annotated[int, Meta(ge=1, le=1000, description="Samples kept (quota.window.num).")] = 11
    scope: Annotated[Scope, Meta(description='Entries\' scope unless they set one: "instance" (each Sluice its own, as '
                                             'each Kafka broker) or "fleet" (one for the [fleet], needs it on).',
    )] = "instance"
    entries: Annotated[list[QuotaEntrySettings], Meta(description="Quotas per entity.")] = field(default_factory=list)

    def fleet_key(self) -> str:
        """The key that makes a quota the fleet's, if any ("" if none): it needs [fleet] on."""
        if any(e.scope == "fleet" or (e.scope is None and self.scope == "fleet") for e in self.entries):
            return "scope" if self.scope == "fleet" else next(
                f"entries[{i}].scope" for i, e in enumerate(self.entries) if e.scope == "fleet")
        return ""

    @field_validator("window_s")
    @classmethod
    def _window_finite(cls, value: float) -> float:
        return check_finite(value)

    @model_validator
    def _unique(self) -> None:
        names: dict[str, int] = {}
        entities: dict[tuple[Any, ...], int] = {}
        for i, entry in enumerate(self.entries):
            name = entry.name or f"entries[{i}]"
            if name in names:
                raise KeyedValueError(f"entries[{i}].name", f"{name!r} is already quota.entries[{names[name]}]")
            names[name] = i
            # Kafka keeps one config per entity; two entries for one entity would leave one unused for the kinds
            # both set (the first wins), which is never what was meant
            entity = (entry.principal, entry.client_id, _network_key(entry.client_address))
            if entity in entities:
                raise KeyedValueError(f"entries[{i}].client_id",
                                      f"names the entity of quota.entries[{entities[entity]}] (principal, "
                                      "client_id, client_address): one entry per entity, its kinds together")
            entities[entity] = i


def _network_key(address: str | None) -> str | None:
    """An address as its network (so ``10.0.0.1`` and ``10.0.0.1/32`` are one entity)."""
    if address is None or address == DEFAULT:
        return address
    return str(ipaddress.ip_network(address, strict=False))
