"""Golden frames captured from real clients and a real Kafka 4.1 broker round-trip byte-exact.

Regenerate with ``.venv/bin/python -m tests.support.capture_golden`` (see that module).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from proxy.wire.compiler import skip_tags
from proxy.wire.messages import (
    api_name,
    decode_consumer_protocol,
    decode_request,
    decode_response,
    encode_consumer_protocol,
    encode_request,
    encode_response,
    known_api,
    response_body_offset,
    response_spec,
)
from proxy.wire.skim import top_level_tags_locator

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden"
FILES = sorted(GOLDEN.glob("*.bin"))
NAME = re.compile(r"(?P<api>\w+)-v(?P<version>\d+)-(?P<direction>request|response)-\d+\.bin")
API_KEYS = {api_name(k): k for k in range(100) if known_api(k)}


def test_golden_set_covers_the_core_apis() -> None:
    apis = {NAME.fullmatch(f.name).group("api") for f in FILES}  # type: ignore[union-attr]
    assert {"ApiVersions", "Metadata", "Fetch", "Produce", "FindCoordinator", "JoinGroup", "SyncGroup",
            "OffsetCommit", "OffsetFetch", "Heartbeat", "LeaveGroup", "ListOffsets"} <= apis


@pytest.mark.parametrize("path", FILES, ids=[f.name for f in FILES])
def test_golden_frame_round_trips(path: Path) -> None:
    m = NAME.fullmatch(path.name)
    assert m is not None
    key, version = API_KEYS[m["api"]], int(m["version"])
    data = path.read_bytes()
    if m["direction"] == "request":
        header, body = decode_request(data)
        assert (header.request_api_key, header.request_api_version) == (key, version)
        assert encode_request(header, body) == data
    else:
        header, body = decode_response(key, version, data)
        assert encode_response(key, version, header, body) == data
        if version in response_spec(key).flexible:
            # The skimmer finds the top-level tag section exactly where the full decode does: at the end.
            view = memoryview(data)
            locate = top_level_tags_locator(response_spec(key), version)
            tags_at = locate(view, response_body_offset(key, version, view))
            assert skip_tags(view, tags_at) == len(data)
    # The consumer protocol embedded in group messages round-trips too.
    if m["api"] == "JoinGroup" and m["direction"] == "request":
        for proto in body.protocols:
            v, sub = decode_consumer_protocol("subscription", proto.metadata)
            assert encode_consumer_protocol("subscription", v, sub) == proto.metadata
    if m["api"] == "SyncGroup" and m["direction"] == "request":
        for a in body.assignments:
            v, asg = decode_consumer_protocol("assignment", a.assignment)
            assert encode_consumer_protocol("assignment", v, asg) == a.assignment
