"""Hypothesis strategies generated from message specs (Kafka's and Sluice's own), for the property tests and the
fuzz targets.

The strategy for (spec, version) walks the spec's FieldSpec tree exactly as proxy/wire/compiler.py does (which
fields exist at the version, which are tagged, which structs are flexible) and yields the :class:`Message` the
codec's decoder would produce: every plain and tagged field of the version (tagged ones sometimes at their
default, which is not written on the wire), plus random ``unknown_tags`` in flexible structs.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from proxy.wire.api_keys import api_key
from proxy.wire.messages import decoded_versions
from proxy.wire.model import Message
from proxy.wire.schema import FieldSpec, MessageSpec, kafka_spec, manifest, sluice_spec

_INTS: dict[str, tuple[int, int]] = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint16": (0, 2**16 - 1),
    "uint32": (0, 2**32 - 1),
    "varint": (-(2**31), 2**31 - 1),
    "varlong": (-(2**63), 2**63 - 1),
}

# Short values keep examples fast; lengths still cross the 1-byte/2-byte varint boundary sometimes via
# arrays of them. Surrogates are not encodable as UTF-8 (Kafka strings are UTF-8), so they are excluded.
TEXT = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=12)
BINARY = st.binary(max_size=24)


def _flexible_field(f: FieldSpec, version: int, flexible: bool) -> bool:
    return flexible and (f.flexible_override is None or version in f.flexible_override)


def default_for(f: FieldSpec, version: int) -> Any:
    """The value a decoder gives an absent field (compiler._default_value / KafkaStruct.default)."""
    if f.is_array:
        return []
    if f.is_struct:
        return Message(**{c.name: default_for(c, version) for c in f.fields if version in c.versions})
    return f.default


def _primitive(t: str) -> st.SearchStrategy[Any]:
    if t in _INTS:
        lo, hi = _INTS[t]
        return st.integers(lo, hi)
    if t == "bool":
        return st.booleans()
    if t == "float64":
        return st.floats(allow_nan=False, width=64)
    if t == "uuid":
        return st.binary(min_size=16, max_size=16)
    if t in ("string", "varstring"):
        return TEXT
    if t == "records":
        # Record sets also cross the 1-, 2- and 3-byte compact length boundaries (the fast path inlines them).
        return st.one_of(BINARY, st.sampled_from([126, 127, 128, 16382, 16383, 16384, 70000]).map(bytes))
    if t in ("bytes", "varbytes"):
        return BINARY
    raise AssertionError(f"no strategy for type {t}")


Overrides = dict[str, st.SearchStrategy[Any]]


def _field(f: FieldSpec, version: int, flexible: bool, unknown: bool,
           overrides: Overrides | None) -> st.SearchStrategy[Any]:
    fflex = _flexible_field(f, version, flexible)
    element: st.SearchStrategy[Any]
    if f.is_struct:
        element = struct_strategy(f.fields, version, fflex, unknown=unknown, overrides=overrides)
    elif overrides and f.name in overrides:
        element = overrides[f.name]
    else:
        element = _primitive(f.element_type)
    if f.is_array:
        element = st.lists(element, max_size=3)
    if version in f.nullable:
        element = st.one_of(st.none(), element)
    return element


def struct_strategy(fields: tuple[FieldSpec, ...], version: int, flexible: bool, *,
                    unknown: bool = True, overrides: Overrides | None = None) -> st.SearchStrategy[Message]:
    plain: dict[str, st.SearchStrategy[Any]] = {}
    known_tags: set[int] = set()
    for f in fields:
        if version not in f.versions:
            continue
        s = _field(f, version, flexible, unknown, overrides)
        if flexible and version in f.tagged:
            assert f.tag is not None
            known_tags.add(f.tag)
            s = st.one_of(st.just(default_for(f, version)), s)
        plain[f.name] = s
    base = st.fixed_dictionaries(plain)
    if not (flexible and unknown):
        return base.map(lambda d: Message(**d))
    tags = st.dictionaries(
        st.integers(0, 2**31 - 1).filter(lambda t: t not in known_tags), st.binary(max_size=8), max_size=2
    )

    def build(d: dict[str, Any], u: dict[int, bytes]) -> Message:
        return Message(**d, unknown_tags=u) if u else Message(**d)

    return st.builds(build, base, tags)


def message_strategy(spec: MessageSpec, version: int, *, unknown: bool = True,
                     overrides: Overrides | None = None) -> st.SearchStrategy[Message]:
    """Messages of ``spec`` at ``version`` as the construct codec decodes them. ``unknown``: add random
    unknown tagged fields; ``overrides``: strategies for primitive fields by snake_case name."""
    flexible = version in spec.flexible
    return struct_strategy(spec.fields, version, flexible, unknown=unknown, overrides=overrides)


def all_cases() -> list[tuple[str, MessageSpec, int]]:
    """Every (spec, version) Sluice decodes: the manifest's APIs (requests and responses over their decoded
    versions), its data and header specs, and Sluice's own record specs."""
    cases: list[tuple[str, MessageSpec, int]] = []
    m = manifest()
    for name in m["apis"]:
        versions = decoded_versions(api_key(name))
        assert versions is not None
        for side in ("Request", "Response"):
            spec = kafka_spec(name + side)
            cases.extend((spec.name, spec, v) for v in versions if v in spec.valid)
    for name in m["data"]:
        spec = kafka_spec(name)
        cases.extend((spec.name, spec, v) for v in spec.valid)
    for name in m["sluice"]:
        spec = sluice_spec(name)
        cases.extend((spec.name, spec, v) for v in spec.valid)
    return cases
