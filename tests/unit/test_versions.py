"""ApiVersions through Sluice (proxy/wire/versions.py): a broker's range is capped only where Sluice decodes, and
only on the side where decoding could fail (proxy/codecs/manifest.json "versions" and "relayed")."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from proxy.wire import messages, versions
from proxy.wire.errors import CodecError
from proxy.wire.messages import decoded_versions, negotiable_versions, request_spec
from proxy.wire.model import Message
from proxy.wire.schema import Versions

PRODUCE, FETCH, API_VERSIONS = 0, 1, 18
#: decoded at every version a client may pick (responses; Fetch requests too; the group APIs cooperative
#: consumption reads and rewrites): both ends capped
DECODED = {18: "ApiVersions", 3: "Metadata", 10: "FindCoordinator", 60: "DescribeCluster", 1: "Fetch",
           8: "OffsetCommit", 9: "OffsetFetch", 11: "JoinGroup", 12: "Heartbeat", 14: "SyncGroup"}
#: in the manifest (their codecs are tested) but never decoded from clients: relayed as bytes, not capped
RELAYED = {2: "ListOffsets", 13: "LeaveGroup", 15: "DescribeGroups"}
#: defined by Kafka, not described by kafka-python's specs: relayed as bytes, never capped
#: APIs Kafka defines that kafka-python does not describe: known from kio (proxy/wire/kio_specs.py)
UNSPECIFIED = {68: "ConsumerGroupHeartbeat", 69: "ConsumerGroupDescribe"}
DESCRIBE_CONFIGS = 32  # not in the manifest


def capped(ranges: dict[int, tuple[int, int]]) -> dict[int, tuple[int, int]]:
    body = Message(error_code=0, throttle_time_ms=0,
                   api_keys=[Message(api_key=k, min_version=lo, max_version=hi) for k, (lo, hi) in ranges.items()])
    return {e.api_key: (e.min_version, e.max_version) for e in versions.intersect(body)[0].api_keys}


def test_produce_keeps_the_broker_min() -> None:
    # Kafka 4.x advertises Produce from v0 although ProduceRequest.json starts at v3 (KAFKA-18659); Sluice
    # relays Produce v0-9 as bytes, so the range reaches the client as the broker sent it.
    assert capped({PRODUCE: (0, 12)}) == {PRODUCE: (0, 12)}
    # Above what the spec describes the max is capped: v10+ responses are skimmed for KIP-951 NodeEndpoints.
    assert capped({PRODUCE: (0, 99)}) == {PRODUCE: (0, request_spec(PRODUCE).valid.high)}


def test_decoded_apis_capped_at_both_ends() -> None:
    out = capped(dict.fromkeys(DECODED, (0, 99)))
    for key in DECODED:
        ours = decoded_versions(key)
        assert ours is not None
        assert out[key] == (ours.low, ours.high), DECODED[key]
    assert out[FETCH][0] == 4  # Fetch v0-3 (message format v0/v1 era) are never let through


def test_relayed_and_unlisted_apis_pass_through() -> None:
    broker = dict.fromkeys([*RELAYED, *UNSPECIFIED, DESCRIBE_CONFIGS], (0, 99))
    assert capped(broker) == broker


def test_apis_kafka_python_does_not_describe_are_known_by_name() -> None:
    # Kafka closes a connection that sends a key it does not define; Sluice relays these rather than refuse them.
    for key, name in UNSPECIFIED.items():
        assert messages.known_api(key) and messages.api_name(key) == name
    assert not messages.known_api(999) and messages.api_name(999) == "Unknown(999)"


def test_an_api_left_with_no_version_is_dropped() -> None:
    assert capped({FETCH: (0, 3), PRODUCE: (0, 12)}) == {PRODUCE: (0, 12)}


def test_negotiable_is_decoded_plus_relayed() -> None:
    valid = request_spec(PRODUCE).valid
    assert decoded_versions(PRODUCE) == valid
    assert negotiable_versions(PRODUCE) == Versions(0, valid.high)
    assert negotiable_versions(FETCH) == decoded_versions(FETCH)
    assert negotiable_versions(DESCRIBE_CONFIGS) is None


@pytest.fixture
def fake_manifest(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    cached = (messages.decoded_versions, messages.relayed_versions, messages.negotiable_versions)
    fake: dict[str, Any] = {"apis": {}}
    monkeypatch.setattr(messages, "manifest", lambda: fake)
    for f in cached:
        f.cache_clear()
    yield fake
    for f in cached:
        f.cache_clear()


def test_relayed_and_decoded_must_form_one_range(fake_manifest: dict[str, Any]) -> None:
    # Produce decoded 3-13, relayed 0-1: v2 would be advertised yet neither decodable nor relayed.
    fake_manifest["apis"]["Produce"] = {"key": PRODUCE, "versions": "all", "relayed": "0-1"}
    with pytest.raises(CodecError, match="one range"):
        negotiable_versions(PRODUCE)
