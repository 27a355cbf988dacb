"""The types a message spec is made of: version ranges, fields, messages (whatever the spec was read from: Kafka's
JSON, kio's classes, Sluice's own JSON), with the defaults Kafka's generator gives a field. Below
:mod:`proxy.wire.schema` (the readers of JSON specs) and :mod:`proxy.wire.kio_specs` (the reader of kio's).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Versions:
    """A Kafka version range: "3+", "0-5", "7" or "none" (empty)."""

    low: int
    high: int  # inclusive; 2**15 for an open range

    @classmethod
    def parse(cls, text: str | None) -> Versions:
        if text is None or text == "none":
            return NONE
        text = text.strip()
        if text.endswith("+"):
            return cls(int(text[:-1]), 2**15)
        if "-" in text:
            lo, hi = text.split("-", 1)
            return cls(int(lo), int(hi))
        return cls(int(text), int(text))

    def __contains__(self, version: object) -> bool:
        return isinstance(version, int) and self.low <= version <= self.high

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.low, self.high + 1))

    @property
    def empty(self) -> bool:
        return self.high < self.low


NONE = Versions(0, -1)

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def snake_case(name: str) -> str:
    """Kafka's CamelCase field names as Python attribute names: ThrottleTimeMs -> throttle_time_ms."""
    return _CAMEL.sub("_", name).lower()


@dataclass(frozen=True, slots=True)
class FieldSpec:
    name: str  # snake_case attribute name
    kafka_name: str  # the spec's CamelCase name
    type: str  # "int32", "string", "[]int32", "[]Topic", "Topic", ...
    versions: Versions
    nullable: Versions
    tagged: Versions
    tag: int | None
    flexible_override: Versions | None  # a field-level "flexibleVersions" (RequestHeader.ClientId: "none")
    default: Any
    fields: tuple[FieldSpec, ...] = ()
    count_type: str | None = None  # Sluice specs: array count encoding ("varint"); Kafka: int32/uvarint

    @property
    def is_array(self) -> bool:
        return self.type.startswith("[]")

    @property
    def element_type(self) -> str:
        return self.type[2:] if self.is_array else self.type

    @property
    def is_struct(self) -> bool:
        return bool(self.fields) or self.element_type[:1].isupper()


@dataclass(frozen=True, slots=True, eq=False)  # identity hash: specs are loaded once and cached
class MessageSpec:
    name: str
    api_key: int | None
    kind: str  # "request" | "response" | "header" | "data"
    valid: Versions
    flexible: Versions
    fields: tuple[FieldSpec, ...] = field(default=())


_INT_TYPES = {"int8", "int16", "int32", "int64", "uint16", "uint32", "varint", "varlong"}


def _default(ftype: str, raw: Any, nullable: Versions) -> Any:
    """The value a field takes when absent, following Kafka's generator (MessageDataGenerator):
    numbers 0, bool false, string "", arrays empty, nullable fields with default "null" -> None."""
    if raw == "null":
        return None
    if ftype.startswith("[]"):
        return []
    if ftype in _INT_TYPES:
        if raw is None or raw == "":
            return 0
        return int(raw, 0) if isinstance(raw, str) else int(raw)
    if ftype == "float64":
        return float(raw) if raw not in (None, "") else 0.0
    if ftype == "bool":
        return raw in (True, "true")
    if ftype in ("string", "varstring"):
        return raw if isinstance(raw, str) else ""
    if ftype in ("bytes", "varbytes"):
        return b""
    if ftype == "records":
        return None if not nullable.empty and raw is None else b""
    if ftype == "uuid":
        return bytes(16)
    return None  # struct: built from its fields' defaults by the model
