"""A policy declares the API versions it reads (proxy/core/policy.py): ApiVersions offers clients only those, and
the chain never hands a policy another one (a client that ignores ApiVersions is closed, as Kafka closes it)."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from proxy.core.exchange import Rejected
from proxy.core.policy import Policy, reads, versions_read
from proxy.wire.api_keys import ApiKey
from proxy.wire.messages import decode_response, encode_request, encode_response, request_codec, response_codec
from proxy.wire.model import Message
from proxy.wire.schema import Versions
from rig.chain_rig import SansIOProxy

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


def test_sharing_reads_every_offset_fetch_and_commit_version_topics_by_name_or_id() -> None:
    # OffsetFetch/OffsetCommit v10 name topics by id: sharing's offsets code reads both forms, so nothing is capped
    on = offered(SHARING_ON)
    assert on[ApiKey.OFFSET_FETCH] == (1, 10) and on[ApiKey.OFFSET_COMMIT] == (2, 10)
    assert on[ApiKey.FETCH] == (4, 18) and on[ApiKey.JOIN_GROUP] == (0, 9)
    # KIP-848 groups are shared too: ConsumerGroupHeartbeat is decoded (kio's spec, ConsumerGroupHeartbeatRequest.json)
    assert on[ApiKey.CONSUMER_GROUP_HEARTBEAT] == (0, 1)


def test_without_sharing_nothing_is_capped_for_it() -> None:
    off = offered(None)
    assert off[ApiKey.OFFSET_FETCH] == (1, 10) and off[ApiKey.OFFSET_COMMIT] == (2, 10)


def test_a_version_a_policy_does_not_read_closes_the_connection() -> None:
    """A Fetch v3 (before KIP-98's record batches: the policies on Fetch read v4+) from a client that ignores
    ApiVersions is refused before any policy runs, as Kafka refuses a version it has not enabled (franz-go's
    OffsetFetch v10 once reached sharing's code written for names only)."""
    p = SansIOProxy(SHARING_ON)
    # Kafka 4's specs start Fetch at v4, so the frame is written by hand: request header v1, a v3 body
    header = struct.pack(">hhih", ApiKey.FETCH, 3, 7, 1) + b"c"
    body = struct.pack(">iiiii", -1, 0, 1, 1 << 20, 0)  # replica, max wait, min bytes, max bytes, no topics
    with pytest.raises(Rejected) as e:
        p.request(header + body)
    assert e.value.reason == "unsupported_version" and "Fetch v3" in e.value.detail


def test_sharing_reads_offset_fetch_v10_topics_by_id() -> None:
    """franz-go's OffsetFetch v10 (topics by id) reaches sharing, which reads it (no AttributeError)."""
    p = SansIOProxy(SHARING_ON)
    body = request_codec(ApiKey.OFFSET_FETCH, 10).default().replace(groups=[
        Message(group_id="g", member_id=None, member_epoch=-1,
                topics=[Message(topic_id=b"\x01" * 16, partition_indexes=[0])])])
    ex = p.request(req_frame(ApiKey.OFFSET_FETCH, 10, body))
    assert [policy.name for policy in ex.policies] == ["sharing"]


def test_without_sharing_offset_fetch_v10_is_relayed_unread() -> None:
    p = SansIOProxy(None)
    ex = p.request(req_frame(ApiKey.OFFSET_FETCH, 10))
    assert ex.policies == () and ex.view is None and not ex.collect


def test_a_declaration_up_to_a_version_caps_what_the_policy_reads() -> None:
    every = reads(ApiKey.FETCH, ApiKey.OFFSET_COMMIT)
    capped = reads(ApiKey.FETCH, ApiKey.OFFSET_COMMIT, up_to={ApiKey.FETCH: 12})
    assert capped[ApiKey.FETCH] == Versions(every[ApiKey.FETCH].low, 12)
    assert capped[ApiKey.OFFSET_COMMIT] == every[ApiKey.OFFSET_COMMIT]
    # the chain offers clients the intersection: a policy capped at v12 keeps every client at v12 or below
    assert versions_read([_Declares(every), _Declares(capped)])[ApiKey.FETCH].high == 12
    with pytest.raises(ValueError, match="does not read"):
        reads(ApiKey.FETCH, up_to={ApiKey.OFFSET_COMMIT: 3})
    with pytest.raises(ValueError, match="from v"):
        reads(ApiKey.FETCH, up_to={ApiKey.FETCH: every[ApiKey.FETCH].low - 1})


class _Declares(Policy):
    def __init__(self, apis: dict[int, Versions]) -> None:
        self.apis = apis
