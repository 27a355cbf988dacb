"""Round trips for every (api, version) Sluice decodes: decode(encode(m)) == m and encode(decode(b)) == b.

Messages come from strategies generated from the specs themselves (rig/specgen.py), so a new API or
version in proxy/codecs/manifest.json is covered without touching this file.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from proxy.wire.compiler import compiled_for
from proxy.wire.model import Message
from proxy.wire.schema import MessageSpec
from rig.specgen import all_cases, message_strategy

CASES = all_cases()
SETTINGS = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)


def test_cases_cover_the_manifest() -> None:
    names = {name for name, _, _ in CASES}
    for must in ("FetchRequest", "FetchResponse", "MetadataResponse", "ApiVersionsResponse", "RequestHeader",
                 "ResponseHeader", "ConsumerProtocolAssignment", "RecordBatch", "Record"):
        assert must in names
    fetch = sorted(v for name, _, v in CASES if name == "FetchResponse")
    assert fetch == list(range(4, 19))


@pytest.mark.parametrize(("name", "spec", "version"), CASES, ids=[f"{n}-v{v}" for n, _, v in CASES])
def test_roundtrip(name: str, spec: MessageSpec, version: int) -> None:
    codec = compiled_for(spec, version)

    @SETTINGS
    @given(message_strategy(spec, version))
    def check(msg: Message) -> None:
        data = codec.encode(msg)
        decoded = codec.decode(data)
        assert decoded == msg
        assert codec.encode(decoded) == data

    check()
