"""A policy declares the API versions it reads (proxy/core/policy.py): ApiVersions offers clients only those, and
the chain never hands a policy another one (a client that ignores ApiVersions is closed, as Kafka closes it)."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.core.exchange import Rejected
from proxy.wire.api_keys import ApiKey
from proxy.wire.messages import decode_response, encode_request, encode_response, request_codec, response_codec
from proxy.wire.model import Message
from tests.support.chain import SansIOProxy

SHARING_ON = {"sharing": {"enabled": True, "clients": ["*"], "topics": [{"topic": "*"}]}}


def req_frame(api_key: int, version: int, body: Message | None = None) -> bytes:
    header = Message(request_api_key=api_key, request_api_version=version, correlation_id=7, client_id="c")
    return encode_request(header, body if body is not None else request_codec(api_key, version).default())


def offered(overrides: dict[str, Any] | None) -> dict[int, tuple[int, int]]:
    """The ranges a client gets from an ApiVersions answer through Sluice, the broker offering 0-99 for each."""
    p = SansIOProxy(overrides)
    ex = p.request(req_frame(ApiKey.API_VERSIONS, 3, Message(client_software_name="t", client_software_version="1")))
    body = response_codec(ApiKey.API_VERSIONS, 3).default()
    body.api_keys = [Message(api_key=k, min_version=0, max_version=99)
                     for k in (ApiKey.FETCH, ApiKey.OFFSET_FETCH, ApiKey.OFFSET_COMMIT, ApiKey.JOIN_GROUP,
                               ApiKey.CONSUMER_GROUP_HEARTBEAT)]
    raw = encode_response(ApiKey.API_VERSIONS, 3, Message(correlation_id=7), body)
    sent = p.respond(ex, raw)
    out = decode_response(ApiKey.API_VERSIONS, 3, sent[4:])[1]
    return {k.api_key: (k.min_version, k.max_version) for k in out.api_keys}


def test_sharing_caps_offset_fetch_and_commit_at_the_last_version_with_topic_names() -> None:
    # OffsetFetch/OffsetCommit v10 name topics by id (KIP-848): sharing's offsets code reads names
    on = offered(SHARING_ON)
    assert on[ApiKey.OFFSET_FETCH] == (1, 9) and on[ApiKey.OFFSET_COMMIT] == (2, 9)
    assert on[ApiKey.FETCH] == (4, 18) and on[ApiKey.JOIN_GROUP] == (0, 9)
    assert on[ApiKey.CONSUMER_GROUP_HEARTBEAT] == (0, 99)  # only its header is read: never capped


def test_without_sharing_nothing_is_capped_for_it() -> None:
    off = offered(None)
    assert off[ApiKey.OFFSET_FETCH] == (1, 10) and off[ApiKey.OFFSET_COMMIT] == (2, 10)


def test_a_version_a_policy_does_not_read_closes_the_connection() -> None:
    """franz-go's OffsetFetch v10 (topics by id) once reached sharing's name-reading code; now it is refused
    before any policy runs, as Kafka refuses a version it has not enabled."""
    p = SansIOProxy(SHARING_ON)
    body = request_codec(ApiKey.OFFSET_FETCH, 10).default().replace(groups=[
        Message(group_id="g", member_id=None, member_epoch=-1,
                topics=[Message(topic_id=b"\x01" * 16, partition_indexes=[0])])])
    with pytest.raises(Rejected) as e:
        p.request(req_frame(ApiKey.OFFSET_FETCH, 10, body))
    assert e.value.reason == "unsupported_version" and "OffsetFetch v10" in e.value.detail


def test_without_sharing_offset_fetch_v10_is_relayed_unread() -> None:
    p = SansIOProxy(None)
    ex = p.request(req_frame(ApiKey.OFFSET_FETCH, 10))
    assert ex.policies == () and ex.view is None and not ex.collect
