"""Share groups (KIP-932) under Sluice's policies, sans-IO: a ShareFetch is bounded on the request side
only (MaxBytes), its acknowledgements, session epoch and partitions pass unchanged, its response is never edited;
the throttle follows the share session and mutes within the acquisition lock; the access log and metrics count what
was acquired and acknowledged."""

from __future__ import annotations

import uuid

import pytest

from proxy.core.rate import WindowedRate
from proxy.policies.share_groups.policy import acknowledged, acquired
from proxy.policies.throttle.share import ShareSession, clamp_max_bytes, mute_for
from proxy.wire.api_keys import ApiKey
from proxy.wire.messages import decode_request, encode_request, encode_response, request_codec, response_codec
from proxy.wire.model import Message
from rig.chain_rig import Clock, SansIOProxy

TOPIC = uuid.UUID("6ba7b810-9dad-11d1-80b4-00c04fd430c8").bytes
OTHER = uuid.UUID("6ba7b811-9dad-11d1-80b4-00c04fd430c8").bytes
VERSIONS = (1, 2)


def share_fetch(version: int, *, epoch: int = 0, max_bytes: int = 50 << 20, acks: bool = True,
                forgotten: tuple[tuple[bytes, int], ...] = ()) -> Message:
    body = request_codec(ApiKey.SHARE_FETCH, version).default()
    body.group_id, body.member_id, body.share_session_epoch = "g", "m", epoch
    body.max_wait_ms, body.min_bytes, body.max_bytes, body.max_records, body.batch_size = 500, 1, max_bytes, 500, 500
    batches = [Message(first_offset=0, last_offset=9, acknowledge_types=[1]),  # 10 accepted
               Message(first_offset=10, last_offset=13, acknowledge_types=[1, 2, 3, 0])] if acks else []
    body.topics = [Message(topic_id=TOPIC, partitions=[Message(partition_index=0, acknowledgement_batches=batches),
                                                       Message(partition_index=1, acknowledgement_batches=[])])]
    body.forgotten_topics_data = [Message(topic_id=t, partitions=[p]) for t, p in forgotten]
    return body


def frame(version: int, body: Message, client_id: str = "share-1") -> bytes:
    header = Message(request_api_key=ApiKey.SHARE_FETCH, request_api_version=version, correlation_id=3,
                     client_id=client_id)
    return encode_request(header, body)


def share_fetch_response(version: int, records: bytes, ranges: list[tuple[int, int]]) -> bytes:
    body = response_codec(ApiKey.SHARE_FETCH, version).default()
    body.acquisition_lock_timeout_ms = 30_000
    body.responses = [Message(topic_id=TOPIC, partitions=[Message(
        partition_index=0, error_code=0, error_message=None, acknowledge_error_code=0, acknowledge_error_message=None,
        current_leader=Message(leader_id=1, leader_epoch=0), records=records,
        acquired_records=[Message(first_offset=a, last_offset=b, delivery_count=1) for a, b in ranges])])]
    body.node_endpoints = []
    return encode_response(ApiKey.SHARE_FETCH, version, Message(correlation_id=3), body)


@pytest.mark.parametrize("version", VERSIONS)
def test_budget_clamps_max_bytes_keeps_acks_and_never_touches_the_response(version: int) -> None:
    p = SansIOProxy({"size_limit.budgets": [{"client_id": "share-*", "fetch_max_bytes": 262144}]})
    sent = share_fetch(version)
    ex = p.request(frame(version, sent))
    _, upstream = decode_request(ex.frame)
    assert upstream.max_bytes == 262144
    # everything else as the client sent it: the acknowledgements, the epoch, the partitions, MaxRecords
    assert upstream.replace(max_bytes=sent.max_bytes) == sent
    raw = share_fetch_response(version, b"\x00" * 300_000, [(0, 99)])  # larger than the budget: passes whole
    assert p.respond(ex, raw)[4:] == raw
    assert p.metrics.total("sluice_share_records_acquired_total") == 100
    assert ex.log["share_acquired"] == 100
    assert ex.log["share_acknowledged"] == {"accept": 11, "release": 1, "reject": 1, "gap": 1}


@pytest.mark.parametrize("version", VERSIONS)
def test_under_budget_and_other_clients_pass_unchanged(version: int) -> None:
    p = SansIOProxy({"size_limit.budgets": [{"client_id": "share-*", "fetch_max_bytes": 262144}]})
    small = frame(version, share_fetch(version, max_bytes=1000))
    assert p.request(small).frame == small[:]  # already within: not re-encoded
    other = frame(version, share_fetch(version), client_id="app")
    assert p.request(other).frame == other


def test_a_partition_budget_bounds_the_whole_share_fetch() -> None:
    """ShareFetch has no per-partition limit: the partition budget bounds the whole response (every partition is
    then within it)."""
    p = SansIOProxy({"size_limit.budgets": [{"client_id": "*", "partition_max_bytes": 65536}]})
    ex = p.request(frame(2, share_fetch(2)))
    assert decode_request(ex.frame)[1].max_bytes == 65536


def test_acknowledgement_counting() -> None:
    body = share_fetch(2)
    assert acknowledged(body) == {"accept": 11, "release": 1, "reject": 1, "gap": 1}
    assert acknowledged(share_fetch(2, acks=False)) == {}
    body.topics[0].partitions[0].acknowledgement_batches = [Message(first_offset=5, last_offset=6,
                                                                    acknowledge_types=[4, 9])]
    assert acknowledged(body) == {"renew": 1, "unknown": 1}


def test_acquired_counts_inclusive_ranges() -> None:
    body = Message(responses=[Message(topic_id=TOPIC, partitions=[Message(acquired_records=[
        Message(first_offset=0, last_offset=0), Message(first_offset=5, last_offset=9)])])])
    assert acquired(body) == 6
    assert acquired(Message(responses=[])) == 0


def test_share_session_follows_the_client() -> None:
    s = ShareSession()
    s.update(share_fetch(2, epoch=0))
    assert s.partitions == {(TOPIC, 0), (TOPIC, 1)}
    later = share_fetch(2, epoch=1, forgotten=((TOPIC, 1),))
    later.topics = [Message(topic_id=OTHER, partitions=[Message(partition_index=3, acknowledgement_batches=[])])]
    s.update(later)
    assert s.partitions == {(TOPIC, 0), (OTHER, 3)}
    s.update(share_fetch(2, epoch=0))  # a new session: what its opening request lists
    assert s.partitions == {(TOPIC, 0), (TOPIC, 1)}


def test_max_bytes_follows_the_headroom() -> None:
    body = share_fetch(2)
    assert clamp_max_bytes(body, 100_000.5) and body.max_bytes == 100_000
    assert clamp_max_bytes(body, -5.0) and body.max_bytes == 1  # the broker still returns one batch
    assert not clamp_max_bytes(body, float("inf"))


def test_mute_is_capped_by_the_acquisition_lock() -> None:
    quota = WindowedRate(1000, 11, 1.0)
    quota.record(1_000_000, 0.0)  # far over: ~1000 s to recover
    assert mute_for(quota, 30_000, 0.5) == 15.0
    assert mute_for(quota, 0, 0.5) > 15.0  # no lock announced (an error response): the quota's own time
    assert mute_for(WindowedRate(1000, 11, 1.0), 30_000, 0.5) == 0.0


def test_throttled_share_consumer_waits_for_names_and_is_muted_never_trimmed() -> None:
    clock = Clock(100.0)
    p = SansIOProxy({"throttle.leader_rate_bytes": 1000, "throttle.topics": [{"topic": "orders", "replicas": "*"}],
                     "throttle.consumers": [{"client_id": "share-*"}]}, clock=clock)
    p.names.learn(TOPIC, "orders")
    first = share_fetch(2)
    ex = p.request(frame(2, first))
    assert decode_request(ex.frame)[1].max_bytes < first.max_bytes  # the headroom bounds it
    raw = share_fetch_response(2, b"\x00" * 50_000, [(0, 49)])
    assert p.respond(ex, raw)[4:] == raw  # never trimmed
    assert 0 < ex.mute_s <= 15.0
    assert ex.log["throttled_bytes"] == 50_000
    # The next fetch of the session, quota exceeded: MaxBytes 1, its acknowledgements kept.
    nxt = share_fetch(2, epoch=1)
    ex = p.request(frame(2, nxt))
    upstream = decode_request(ex.frame)[1]
    assert upstream.max_bytes == 1 and upstream.topics == nxt.topics
