"""Message specs: Apache Kafka's JSON specs (from kafka-python's package resources) and Sluice's own (proxy/codecs/).

Kafka describes every API in ``clients/src/main/resources/common/message/*.json``; kafka-python >= 3 ships
those files (``kafka/protocol/schemas/resources``). Sluice never copies them: a Kafka upgrade is a dependency bump.
They are read from where kafka-python is installed without importing it (:func:`kafka_python_specs`): its package
imports its whole client on the way to its spec loader, ~12 MB of a sidecar's memory for a few JSON files.
What Kafka does not describe in JSON (RecordBatch v2, Record) lives in ``proxy/codecs/`` in the same style, with a
few extra primitive types (varint, varlong, uint32, varbytes, varstring) documented in ``proxy/codecs/README.md``.

``proxy/codecs/`` is package data (pyproject.toml ``[tool.setuptools.package-data]``): it is installed inside the
``proxy`` package by a wheel, an sdist, ``pip install .`` and an editable install alike, and found next to the
imported package (:func:`codecs_dir`). :func:`check_specs` is what ``sluice run`` and ``sluice check-config`` call
first: without the specs the proxy could not decode a single response, so it refuses to start.

A spec is built on its first use (:func:`kafka_spec`, cached), not at start-up: most of the APIs Sluice knows are
only relayed, and a configuration that never meets a share consumer never needs kio's classes (whose import alone
costs ~7 MB, more with hypothesis installed). What start-up needs of the specs it decodes, their version ranges,
:func:`valid_versions` reads without building them.
"""

from __future__ import annotations

import json
import re
from functools import cache
from importlib.util import find_spec
from pathlib import Path
from typing import Any, cast

from .errors import CodecError
from .kio_specs import kio_spec, kio_versions
from .spec_types import NONE as NONE  # re-exported: the spec types are read through this module too
from .spec_types import FieldSpec as FieldSpec
from .spec_types import MessageSpec as MessageSpec
from .spec_types import Versions as Versions
from .spec_types import _default, snake_case

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


@cache
def kafka_python_specs() -> Path:
    """kafka-python's copy of Kafka's JSON specs, found through the import system without running kafka-python's
    package (``find_spec`` of a top-level name only locates it)."""
    found = find_spec("kafka")
    if found is None or not found.submodule_search_locations:
        raise SpecsError("kafka-python is not installed (Sluice reads Kafka's JSON message specs from it)")
    return Path(next(iter(found.submodule_search_locations))) / "protocol" / "schemas" / "resources"


def _kafka_json(name: str) -> dict[str, Any] | None:
    """Kafka's spec ``name`` as kafka-python ships it, parsed; None when it ships none of that name."""
    try:
        text = (kafka_python_specs() / f"{name}.json").read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    return cast(dict[str, Any], parse_spec_text(text))


@cache
def valid_versions(name: str) -> Versions:
    """The versions Kafka's spec ``name`` declares valid, read without building the spec (start-up needs the
    ranges of every API it caps, not their fields). CodecError when neither kafka-python nor kio has it."""
    raw = _kafka_json(name)
    if raw is not None:
        return Versions.parse(raw.get("validVersions"))
    versions = kio_versions(name)
    if versions is None:
        raise CodecError(f"no Kafka message spec named {name!r} in kafka-python or kio")
    return versions


def check_specs() -> Path:
    """Make sure every spec the proxy needs is present and parses: the manifest, the Sluice specs it names and
    the Kafka specs of the APIs it lists (their JSON read, their fields built on first use). Returns the specs
    directory; raises :class:`SpecsError` naming the missing or broken path. Called at start-up, before a
    listener opens."""
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
            valid_versions(name + "Request")
            valid_versions(name + "Response")
    except CodecError as exc:
        raise SpecsError(f"{exc} (Sluice needs kafka-python >= 3, which ships Kafka's JSON specs)") from None
    return directory


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
    raw = _kafka_json(name)
    if raw is not None:
        return spec_from_json(raw)
    spec = kio_spec(name)
    if spec is None:
        raise CodecError(f"no Kafka message spec named {name!r} in kafka-python or kio")
    return spec


@cache
def sluice_spec(name: str) -> MessageSpec:
    """One of Sluice's own specs from proxy/codecs/NAME.json (same format as Kafka's, comments allowed)."""
    return spec_from_json(_read_spec_file(codecs_dir() / f"{name}.json"))


def spec_from_json(raw: dict[str, Any]) -> MessageSpec:
    """A spec from its parsed JSON in Kafka's format, its ``commonStructs`` inlined where a field names one (as
    Kafka's generator does)."""
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
