"""The specs Sluice rebuilds from kio (proxy/wire/kio_specs.py) for the APIs kafka-python does not ship are Kafka's own:
compared, field by field and version by version, with the JSON specs inside the rig's kafka-clients jar (the
newest Kafka the rig runs). Names, wire types, the versions each field exists in, is nullable in and is tagged
in (and its tag) must agree; so must each API's valid and flexible versions."""

from __future__ import annotations

import re
import zipfile
from functools import cache

import pytest

from proxy.wire.kio_specs import kio_spec
from proxy.wire.messages import response_spec
from proxy.wire.schema import FieldSpec, MessageSpec, Versions, kafka_spec, parse_spec_text, spec_from_json
from rig.kafka import KAFKA_NEWEST, find_libs

#: the APIs Sluice must know on Kafka 4.3 that kafka-python 3.0.12 has no spec for (all of them are checked)
SHARE_APIS = ("ShareGroupHeartbeat", "ShareGroupDescribe", "ShareFetch", "ShareAcknowledge",
              "DescribeShareGroupOffsets", "AlterShareGroupOffsets", "DeleteShareGroupOffsets")


@cache
def _jar() -> zipfile.ZipFile:
    libs = find_libs(KAFKA_NEWEST)
    (jar,) = libs.glob("kafka-clients-*.jar")
    return zipfile.ZipFile(jar)


def kafka_json(name: str) -> MessageSpec:
    return spec_from_json(parse_spec_text(_jar().read(f"common/message/{name}.json").decode()))


def _missing_from_kafka_python() -> list[str]:
    names = []
    for entry in _jar().namelist():
        m = re.fullmatch(r"common/message/(\w+)(Request|Response)\.json", entry)
        if not m:
            continue
        raw = parse_spec_text(_jar().read(entry).decode())
        if "broker" not in raw.get("listeners", ()):
            continue
        try:
            from kafka.protocol.schemas import load_json

            load_json(m[1] + m[2])
        except FileNotFoundError:
            names.append(m[1] + m[2])
    return sorted(names)


def _compare(ours: tuple[FieldSpec, ...], theirs: tuple[FieldSpec, ...], version: int, where: str) -> None:
    mine = {f.name: f for f in ours if version in f.versions}
    for f in theirs:
        if version not in f.versions:
            continue
        path = f"{where}.{f.name} v{version}"
        assert f.name in mine, f"{path}: missing"
        o = mine.pop(f.name)
        assert o.type == f.type, f"{path}: {o.type} != {f.type}"
        if f.type not in ("uuid",):
            assert (version in o.nullable) == (version in f.nullable), f"{path}: nullable"
        assert (version in o.tagged) == (version in f.tagged), f"{path}: tagged"
        if version in f.tagged:
            assert o.tag == f.tag, f"{path}: tag {o.tag} != {f.tag}"
        _compare(o.fields, f.fields, version, path)
    assert not mine, f"{where} v{version}: fields Kafka does not have: {sorted(mine)}"


@pytest.mark.parametrize("name", _missing_from_kafka_python())
def test_kio_spec_equals_kafkas_json(name: str) -> None:
    theirs = kafka_json(name)
    ours = kio_spec(name)
    assert ours is not None, f"kio has no {name}"
    assert ours.api_key == theirs.api_key
    assert ours.valid == theirs.valid, f"{name}: kio covers {ours.valid}, Kafka {KAFKA_NEWEST} {theirs.valid}"
    for version in ours.valid:
        assert (version in ours.flexible) == (version in theirs.flexible), f"{name} v{version}: flexible"
        _compare(ours.fields, theirs.fields, version, name)


def test_share_apis_are_known() -> None:
    for api in SHARE_APIS:
        assert kafka_spec(api + "Request").api_key is not None
    assert response_spec(78).valid == Versions(1, 2)
