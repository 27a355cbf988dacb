"""Message specs: Apache Kafka's JSON specs (from kafka-python's package resources) and Sluice's own (proxy/codecs/).

Kafka describes every API in ``clients/src/main/resources/common/message/*.json``; kafka-python >= 3 ships
those files and ``kafka.protocol.schemas.load_json`` parses them (comments stripped, commonStructs inlined).
Sluice never copies them: a Kafka upgrade is a dependency bump. What Kafka does not describe in JSON
(RecordBatch v2, Record) lives in ``proxy/codecs/`` in the same style, with a few extra primitive types (varint,
varlong, uint32, varbytes, varstring) documented in ``proxy/codecs/README.md``.

``proxy/codecs/`` is package data (pyproject.toml ``[tool.setuptools.package-data]``): it is installed inside the
``proxy`` package by a wheel, an sdist, ``pip install .`` and an editable install alike, and found next to the
imported package (:func:`codecs_dir`). :func:`check_specs` is what ``sluice run`` and ``sluice check-config`` call
first: without the specs the proxy could not decode a single response, so it refuses to start.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, cast

from kafka.protocol.schemas import load_json

from .errors import CodecError

#: Sluice's own declarative specs: package data of ``proxy`` (proxy/codecs/), next to this package wherever it is
#: installed. A module attribute so tests can point the locator elsewhere.
CODECS_DIR = Path(__file__).resolve().parents[1] / "codecs"


class SpecsError(RuntimeError):
    """Sluice's own specs are missing or unreadable: an installation problem, not bad wire data (so never a
    :class:`CodecError`, which the server confines to one connection)."""


def codecs_dir() -> Path:
    """Where Sluice's own specs are read from (``proxy/codecs/`` of the imported package)."""
    return CODECS_DIR


def _read_spec_file(path: Path) -> Any:
    try:
        return parse_spec_text(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecsError(
            f"Sluice's wire specs are missing: {path} not found (they ship inside the proxy package as "
            "package data, proxy/codecs/; reinstall kafka-sluice)"
        ) from None
    except (OSError, ValueError) as exc:
        raise SpecsError(f"Sluice's wire spec {path} is unreadable: {exc}") from None


def check_specs() -> Path:
    """Make sure every spec the proxy needs is present and parses: the manifest, the Sluice specs it names and
    the Kafka specs of the APIs it lists. Returns the specs directory; raises :class:`SpecsError` naming the
    missing or broken path. Called at start-up, before a listener opens."""
    directory = codecs_dir()
    if not directory.is_dir():
        raise SpecsError(
            f"Sluice's wire specs are missing: directory {directory} not found (they ship inside the proxy "
            "package as package data, proxy/codecs/; reinstall kafka-sluice)"
        )
    listed = _read_spec_file(directory / "manifest.json")
    for name in listed.get("sluice", ()):
        _read_spec_file(directory / f"{name}.json")
    try:
        for name in listed.get("apis", {}):
            kafka_spec(name + "Request")
            kafka_spec(name + "Response")
    except CodecError as exc:
        raise SpecsError(f"{exc} (Sluice needs kafka-python >= 3, which ships Kafka's JSON specs)") from None
    return directory


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


def _field(raw: dict[str, Any]) -> FieldSpec:
    nullable = Versions.parse(raw.get("nullableVersions"))
    ftype = raw["type"]
    children = tuple(_field(f) for f in raw.get("fields", ()))
    return FieldSpec(
        name=snake_case(raw["name"]),
        kafka_name=raw["name"],
        type=ftype,
        versions=Versions.parse(raw.get("versions", "0+")),
        nullable=nullable,
        tagged=Versions.parse(raw.get("taggedVersions")),
        tag=raw.get("tag"),
        flexible_override=Versions.parse(raw["flexibleVersions"]) if "flexibleVersions" in raw else None,
        default=_default(ftype, raw.get("default"), nullable),
        fields=children,
        count_type=raw.get("countType"),
    )


def _spec(raw: dict[str, Any]) -> MessageSpec:
    return MessageSpec(
        name=raw["name"],
        api_key=raw.get("apiKey"),
        kind=raw.get("type", "data"),
        valid=Versions.parse(raw.get("validVersions")),
        flexible=Versions.parse(raw.get("flexibleVersions")),
        fields=tuple(_field(f) for f in raw.get("fields", ())),
    )


@cache
def kafka_spec(name: str) -> MessageSpec:
    """Kafka's own spec for ``name`` (e.g. "FetchResponse"), loaded from kafka-python's resources, or for the APIs
    kafka-python does not ship yet (share groups, KIP-848, telemetry...) rebuilt from kio's classes, generated from
    the same JSON files (:mod:`proxy.wire.kio_specs`)."""
    try:
        return _spec(load_json(name))
    except FileNotFoundError:
        from .kio_specs import kio_spec

        spec = kio_spec(name)
        if spec is None:
            raise CodecError(f"no Kafka message spec named {name!r} in kafka-python or kio") from None
        return spec


@cache
def sluice_spec(name: str) -> MessageSpec:
    """One of Sluice's own specs from proxy/codecs/NAME.json (same format as Kafka's, comments allowed)."""
    return spec_from_json(_read_spec_file(codecs_dir() / f"{name}.json"))


def spec_from_json(raw: dict[str, Any]) -> MessageSpec:
    """A spec from its parsed JSON in Kafka's format, its ``commonStructs`` inlined where a field names one (as
    kafka-python's ``load_json`` does for the specs it ships)."""
    common = {s["name"]: s["fields"] for s in raw.get("commonStructs", [])}

    def inline(fields: list[dict[str, Any]]) -> None:
        for f in fields:
            inner = f["type"][2:] if f["type"].startswith("[]") else f["type"]
            if inner in common and "fields" not in f:
                f["fields"] = common[inner]
            inline(f.get("fields", []))

    inline(raw.get("fields", []))
    return _spec(raw)


def parse_spec_text(text: str) -> Any:
    """Kafka's spec JSON (``//`` comment lines allowed) as Python values."""
    return json.loads(re.sub(r"(?m)^\s*//.*\n?", "", text))


@cache
def manifest() -> dict[str, Any]:
    """proxy/codecs/manifest.json: which Kafka APIs (and versions) Sluice decodes, and its own specs."""
    return cast(dict[str, Any], _read_spec_file(codecs_dir() / "manifest.json"))
