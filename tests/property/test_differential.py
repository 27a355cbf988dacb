"""Differential decoding: the same bytes decoded by Sluice and by two independent implementations agree.

Oracles:
- kafka-python 3's generated codecs (``kafka.protocol.*``: ``Cls.decode(data, version=v)``), which read the
  same JSON specs but with its own hand-written primitives and code generator;
- kio (``kio.schema.<api>.v<N>`` dataclasses read by ``kio.serial.entity_reader``), generated independently
  from Kafka's specs, with a native (Rust) reader.

Bytes are Sluice's encoding of spec-generated messages; each oracle decodes them and every field is compared,
walking the spec (so names and types are normalised in one place: kio's ``*_ms`` timedeltas, error-code
enums, UUIDs and tuples; kafka-python's absent tagged structs as None). kafka-python also re-encodes its
decoded object, which must give back the very same bytes (an independent check of Sluice's encoder).

kio 0.6.5 covers fewer versions than Kafka 4.x for some APIs (only the versions under kio/schema/<api>/;
e.g. OffsetCommit from v2, like Kafka 4.0); cases without a kio module are compared with kafka-python only.
kio's error codes are an enum, so error_code fields are drawn from the codes it knows.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import importlib
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse
from kafka.protocol.consumer.group import (
    JoinGroupRequest,
    JoinGroupResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
)
from kafka.protocol.metadata.api_versions import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest, FindCoordinatorResponse
from kafka.protocol.metadata.metadata import MetadataRequest, MetadataResponse
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader

from proxy.wire.compiler import compiled_for
from proxy.wire.model import Message
from proxy.wire.schema import FieldSpec, MessageSpec, kafka_spec
from rig.specgen import default_for, message_strategy

# API name -> (kio package, kafka-python request class, response class)
APIS: dict[str, tuple[str, type[Any], type[Any]]] = {
    "Metadata": ("metadata", MetadataRequest, MetadataResponse),
    "Fetch": ("fetch", FetchRequest, FetchResponse),
    "FindCoordinator": ("find_coordinator", FindCoordinatorRequest, FindCoordinatorResponse),
    "ApiVersions": ("api_versions", ApiVersionsRequest, ApiVersionsResponse),
    "OffsetCommit": ("offset_commit", OffsetCommitRequest, OffsetCommitResponse),
    "JoinGroup": ("join_group", JoinGroupRequest, JoinGroupResponse),
}

SETTINGS = settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)

#: kio maps error codes to an enum and rejects codes it does not know, and int64 millisecond fields to
#: timedeltas, which overflow past 999,999,999 days
KIO_VALUES = {
    "error_code": st.sampled_from(sorted(int(e.value) for e in ErrorCode)),
    "retention_time_ms": st.integers(-(2**40), 2**40),
}
#: kafka-python reads an ApiVersions response with a non-zero error code as version 0, whatever the version
#: asked for, like Kafka's ApiVersionsResponse.parse fallback (a broker answers an unsupported ApiVersions
#: version with a v0 body and UNSUPPORTED_VERSION): only error-free responses are comparable at v1+.
KP_VALUES = {"ApiVersionsResponse": {"error_code": st.just(0)}}


def _cases() -> list[tuple[str, str, MessageSpec, int]]:
    out: list[tuple[str, str, MessageSpec, int]] = []
    for api in APIS:
        for side in ("Request", "Response"):
            spec = kafka_spec(api + side)
            out.extend((api, side, spec, v) for v in spec.valid)
    return out


CASES = _cases()
IDS = [f"{api}{side}-v{v}" for api, side, _, v in CASES]


def _kio_type(api: str, side: str, version: int) -> type | None:
    try:
        module = importlib.import_module(f"kio.schema.{APIS[api][0]}.v{version}.{side.lower()}")
    except ModuleNotFoundError:
        return None
    return getattr(module, api + side)


# --------------------------------------------------------------------------------------------- comparison


def _same(fields: tuple[FieldSpec, ...], version: int, flexible: bool, ours: Message, theirs: Any,
          get: Callable[[Any, str], Any], conv: Callable[[Any, FieldSpec], Any], path: str) -> None:
    """Walk the spec: every field of ``ours`` (a Sluice Message) equals the oracle's ``theirs``."""
    for f in fields:
        if version not in f.versions:
            continue
        fflex = flexible and (f.flexible_override is None or version in f.flexible_override)
        tagged = flexible and version in f.tagged
        where = f"{path}.{f.name}"
        mine = ours.fields()[f.name]
        other = get(theirs, f.name)
        if tagged and other is None:
            # kafka-python leaves an absent tagged field unset (None); it then has its default
            assert mine == default_for(f, version), where
            continue
        if f.is_array:
            if mine is None:
                assert other is None, where
                continue
            assert other is not None, where
            other = list(other)
            assert len(mine) == len(other), where
            for i, (a, b) in enumerate(zip(mine, other, strict=True)):
                if f.is_struct:
                    _same(f.fields, version, fflex, a, b, get, conv, f"{where}[{i}]")
                else:
                    assert conv(b, f) == a, f"{where}[{i}]"
        elif f.is_struct:
            _same(f.fields, version, fflex, mine, other, get, conv, where)
        else:
            assert conv(other, f) == mine, f"{where}: {conv(other, f)!r} != {mine!r}"


def _kp_get(obj: Any, name: str) -> Any:
    if name.endswith("_authorized_operations") and name not in obj._struct.fields:
        # kafka-python's MetadataResponse.json_patch renames {Cluster,Topic}AuthorizedOperations to a
        # "bitfield" named authorized_operations (a set of bit numbers; None for INT32_MIN, "not requested")
        return obj.authorized_operations
    return getattr(obj, name)


def _kp_conv(value: Any, f: FieldSpec) -> Any:
    if f.name.endswith("_authorized_operations") and (value is None or isinstance(value, set)):
        bits = sum(1 << b for b in value) if value is not None else 1 << 31
        return bits - (1 << 32) if bits >= 1 << 31 else bits
    if f.element_type == "uuid" and value is None:
        return bytes(16)  # kafka-python reads the zero UUID as None
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, uuid.UUID):
        return value.bytes
    if isinstance(value, enum.IntEnum):
        return int(value)
    return value


def _kio_get(obj: Any, name: str) -> Any:
    # kio names millisecond durations without the unit: throttle_time_ms -> throttle_time (a timedelta)
    names = {f.name for f in dataclasses.fields(obj)}
    if name in names:
        return getattr(obj, name)
    if name.endswith("_ms") and name[:-3] in names:
        return getattr(obj, name[:-3])
    raise AssertionError(f"kio {type(obj).__name__} has no field for {name}: {sorted(names)}")


def _kio_conv(value: Any, f: FieldSpec) -> Any:
    if isinstance(value, datetime.timedelta):
        return value // datetime.timedelta(milliseconds=1)
    if isinstance(value, datetime.datetime):
        return int(value.timestamp() * 1000)
    if f.element_type == "uuid":
        return bytes(16) if value is None else value.bytes  # kio reads the zero UUID as None
    if isinstance(value, enum.Enum):
        return int(value.value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, str):
        return str(value)
    return value


# --------------------------------------------------------------------------------------------- tests


def test_cases_cover_the_required_apis() -> None:
    versions: dict[str, set[int]] = {}
    for api, _, _, v in CASES:
        versions.setdefault(api, set()).add(v)
    assert set(versions) == set(APIS)
    assert set(APIS) == {"Metadata", "Fetch", "FindCoordinator", "ApiVersions", "OffsetCommit", "JoinGroup"}
    assert all(len(v) >= 3 for v in versions.values())
    with_kio = [c for c in CASES if _kio_type(c[0], c[1], c[3]) is not None]
    assert len(with_kio) >= len(CASES) * 3 // 4


@pytest.mark.parametrize(("api", "side", "spec", "version"), CASES, ids=IDS)
def test_kafka_python_agrees(api: str, side: str, spec: MessageSpec, version: int) -> None:
    codec = compiled_for(spec, version)
    kp_class = APIS[api][1] if side == "Request" else APIS[api][2]
    flexible = version in spec.flexible

    @SETTINGS
    @given(message_strategy(spec, version, unknown=False, overrides=KP_VALUES.get(spec.name)))
    def check(msg: Message) -> None:
        data = codec.encode(msg)
        theirs = kp_class.decode(data, version=version)
        _same(spec.fields, version, flexible, msg, theirs, _kp_get, _kp_conv, spec.name)
        assert bytes(theirs.encode()) == data  # decode set its version; encode(version=) needs a header

    check()


KIO_CASES = [c for c in CASES if _kio_type(c[0], c[1], c[3]) is not None]


@pytest.mark.parametrize(("api", "side", "spec", "version"), KIO_CASES,
                         ids=[f"{a}{s}-v{v}" for a, s, _, v in KIO_CASES])
def test_kio_agrees(api: str, side: str, spec: MessageSpec, version: int) -> None:
    codec = compiled_for(spec, version)
    kio_type = _kio_type(api, side, version)
    assert kio_type is not None
    read: Callable[..., Any] = entity_reader(kio_type)
    flexible = version in spec.flexible

    @SETTINGS
    @given(message_strategy(spec, version, unknown=False, overrides=KIO_VALUES))
    def check(msg: Message) -> None:
        data = codec.encode(msg)
        theirs, size = read(data, 0)
        assert size == len(data)
        _same(spec.fields, version, flexible, msg, theirs, _kio_get, _kio_conv, spec.name)

    check()


def test_a_disagreement_is_detected() -> None:
    """The comparison is not vacuous: a changed field in the oracle's view fails it."""
    spec = kafka_spec("MetadataResponse")
    codec = compiled_for(spec, 12)
    msg = codec.default()
    msg.brokers = [Message(node_id=1, host="a", port=1, rack=None)]
    theirs = MetadataResponse.decode(codec.encode(msg), version=12)
    theirs.brokers[0].port = 2
    with pytest.raises(AssertionError):
        _same(spec.fields, 12, True, msg, theirs, _kp_get, _kp_conv, spec.name)
