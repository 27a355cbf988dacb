"""Kafka's message specs for the APIs kafka-python does not ship yet, read from kio's classes.

kafka-python 3.0.12 (the newest) ships Kafka's JSON specs only up to the APIs it uses itself: no share groups
(KIP-932: ShareGroupHeartbeat, ShareFetch, ShareAcknowledge, ...), no KIP-848 ConsumerGroupHeartbeat, no client
telemetry, no delegation tokens. Kafka 4.2+ brokers advertise them (share groups are on by default from 4.2), so
without a spec Sluice would take their keys for garbage and close the connection. kio (PyPI ``kio``) is generated
from the very same JSON files (``clients/src/main/resources/common/message/*.json``, named in each module's
docstring), one dataclass module per API version, each field carrying its wire type (``kafka_type``), its tag
and, through its annotation, whether it is nullable. This module turns those classes back into the
:class:`~proxy.wire.schema.MessageSpec` the compiler reads, over every version kio has, so one codec path serves
every API. Nothing is copied: a Kafka upgrade is a kio bump, as it is a kafka-python bump for the rest.
``tests/unit/test_kio_specs.py`` holds the result equal to Kafka's own JSON from the rig's kafka-clients jar.

Where kio's Python view differs from the wire, it is mapped back: ``error_code`` is an int16, ``timedelta_i32`` /
``timedelta_i64`` / ``datetime_i64`` are int32 / int64 / int64 (and kio drops their ``_ms`` suffix from the name),
a ``uuid`` is never null on the wire (kio's None is the zero id).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from functools import cache
from typing import Any

from .spec_types import NONE, FieldSpec, MessageSpec, Versions, _default

#: kio's Python-facing types -> the spec's wire types
_WIRE = {"error_code": "int16", "timedelta_i32": "int32", "timedelta_i64": "int64", "datetime_i64": "int64"}
#: kio names these fields without the unit Kafka's names carry
_MS_SUFFIX = frozenset({"timedelta_i32", "timedelta_i64", "datetime_i64"})


def _camel(snake: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in snake.split("_"))


@cache
def kio_api_names() -> dict[int, str]:
    """api key -> Kafka's API name ("ShareFetch"), for every API kio describes."""
    try:
        from kio.schema.index import api_key_map
    except ImportError:  # pragma: no cover - kio is a dependency; without it only kafka-python's APIs are known
        return {}
    return {int(key): _camel(name) for key, name in api_key_map.items()}


def _entries(api: str, kind: str) -> dict[int, str]:
    """version -> the dotted name of kio's class for ``api``'s ``kind`` ("request"/"response"), from kio's index
    alone: no class imported (kio's classes import its whole type system, and hypothesis's when it is installed)."""
    from kio.schema.index import schema_name_map
    from kio.static.constants import EntityType

    snake = next((s for s in schema_name_map if _camel(s) == api), None)
    if snake is None:
        return {}
    entity: Any = EntityType.request if kind == "request" else EntityType.response
    return {int(v): types_[entity] for v, types_ in schema_name_map[snake].items() if entity in types_}


def _classes(api: str, kind: str) -> dict[int, type]:
    from pkgutil import resolve_name

    return {v: resolve_name(dotted) for v, dotted in _entries(api, kind).items()}


def _kind(name: str) -> str | None:
    return "request" if name.endswith("Request") else "response" if name.endswith("Response") else None


def _range(versions: list[int]) -> Versions:
    if not versions:
        return NONE
    lo, hi = min(versions), max(versions)
    if sorted(versions) != list(range(lo, hi + 1)):
        raise ValueError(f"versions {versions} are not one range")
    return Versions(lo, hi)


def _unwrap(annotation: Any) -> tuple[Any, bool]:
    """(the type without None, whether None was allowed)."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0], len(args) < len(typing.get_args(annotation))
    return annotation, False


def _merge(per_version: dict[int, type]) -> tuple[FieldSpec, ...]:
    """The fields of one struct over the versions it exists in (each version a dataclass of kio's)."""
    order: list[str] = []
    seen: dict[str, dict[int, tuple[dataclasses.Field[Any], Any]]] = {}
    # The newest version's order first; a field older versions had and newer ones dropped goes after the field it
    # followed there.
    for version in sorted(per_version, reverse=True):
        cls = per_version[version]
        hints = typing.get_type_hints(cls)
        previous: str | None = None
        for f in dataclasses.fields(cls):
            if f.name not in seen:
                seen[f.name] = {}
                order.insert(order.index(previous) + 1 if previous else 0, f.name)
            seen[f.name][version] = (f, hints[f.name])
            previous = f.name
    return tuple(_field(name, seen[name]) for name in order)


def _field(name: str, by_version: dict[int, tuple[dataclasses.Field[Any], Any]]) -> FieldSpec:
    latest = max(by_version)
    f, annotation = by_version[latest]
    inner, _ = _unwrap(annotation)
    kio_type = f.metadata.get("kafka_type")
    is_array = typing.get_origin(inner) is tuple
    element = typing.get_args(inner)[0] if is_array else inner
    children: tuple[FieldSpec, ...] = ()
    if isinstance(element, type) and dataclasses.is_dataclass(element):
        wire = element.__name__
        nested: dict[int, type] = {}
        for v, (_, ann) in by_version.items():
            t, _ = _unwrap(ann)
            nested[v] = typing.get_args(t)[0] if typing.get_origin(t) is tuple else t
        children = _merge(nested)
    else:
        if kio_type is None:
            raise ValueError(f"field {name}: no kafka_type")
        wire = _WIRE.get(kio_type, kio_type)
    ftype = f"[]{wire}" if is_array else wire
    nullable = _range([v for v, (_, ann) in by_version.items() if _unwrap(ann)[1]]) if wire != "uuid" else NONE
    tagged = _range([v for v, (fv, _) in by_version.items() if "tag" in fv.metadata])
    default = f.default if f.default is not dataclasses.MISSING else None
    raw_default: Any = "null" if default is None and not nullable.empty else (
        str(int(default)) if isinstance(default, int) and not isinstance(default, bool) else None)
    wire_name = f"{name}_ms" if kio_type in _MS_SUFFIX else name
    return FieldSpec(
        name=wire_name, kafka_name=_camel(wire_name), type=ftype, versions=_range(list(by_version)),
        nullable=nullable, tagged=tagged, tag=f.metadata.get("tag"), flexible_override=None,
        default=_default(ftype, raw_default, nullable), fields=children, count_type=None,
    )  # fmt: skip


def kio_versions(name: str) -> Versions | None:
    """The versions kio has of spec ``name`` ("ShareFetchResponse"), read from its index; None if it has none."""
    kind = _kind(name)
    if kind is None or not kio_api_names():
        return None
    versions = list(_entries(name[: -len(kind)], kind))
    return _range(versions) if versions else None


@cache
def kio_spec(name: str) -> MessageSpec | None:
    """Kafka's spec ``name`` ("ShareFetchResponse") rebuilt from kio's classes; None if kio does not have it."""
    if not kio_api_names():
        return None
    kind = _kind(name)
    if kind is None:
        return None
    by_version = _classes(name[: -len(kind)], kind)
    if not by_version:
        return None
    latest = by_version[max(by_version)]
    return MessageSpec(
        name=name,
        api_key=int(latest.__api_key__),  # type: ignore[attr-defined]
        kind=kind,
        valid=_range(list(by_version)),
        flexible=_range([v for v, c in by_version.items() if c.__flexible__]),  # type: ignore[attr-defined]
        fields=_merge(by_version),
    )
