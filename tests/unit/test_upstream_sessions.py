"""[sessions] mode = terminate, sans-IO (proxy/policies/upstream_sessions.py): a session-less client's fetches
become Sluice's own upstream session requests, and its responses are rebuilt in full from partition state."""

from __future__ import annotations

from proxy.policies.sessions import FINAL_EPOCH, FetchMetadata, FetchParams, PartitionKey, UpstreamPlan, apply_plan
from proxy.policies.upstream_sessions import (
    UpstreamSessions,
    build_client_response,
    eligible,
    plan_request,
    replan,
)
from proxy.wire.fetch_fast import FetchPartition, FetchResponseView, FetchTopic
from proxy.wire.messages import request_codec
from proxy.wire.model import Message

V = 12
KEYS: list[PartitionKey] = [("t", 0), ("t", 1), ("t", 2)]


def request(offsets: dict[PartitionKey, int], version: int = V, session_id: int = 0, epoch: int = FINAL_EPOCH,
            replica_id: int = -1) -> Message:
    body = request_codec(1, version).default()
    body = body.replace(replica_state=body.replica_state.replace(replica_id=replica_id)) if version >= 15 \
        else body.replace(replica_id=replica_id)
    parts = {k: FetchParams(o) for k, o in offsets.items()}
    body = apply_plan(body, version, UpstreamPlan(FetchMetadata(session_id, epoch), parts, [], parts))
    # round trip through the codec, as the pipeline decodes what the client sent
    codec = request_codec(1, version)
    return codec.decode(codec.encode(body))


def response(parts: dict[PartitionKey, tuple[int, bytes]], session_id: int = 0, error: int = 0) -> FetchResponseView:
    """Partitions as {key: (high watermark, records)}."""
    topics: list[FetchTopic] = []
    for (topic, index), (hw, records) in parts.items():
        if not topics or topics[-1].topic != topic:
            topics.append(FetchTopic(topic=str(topic)))
        topics[-1].partitions.append(FetchPartition(index, 0, hw, hw, 0, None, -1, records))
    return FetchResponseView(V, 0, error, session_id, topics)


def sent(body: Message) -> dict[PartitionKey, int]:
    return {(t.topic, p.partition): p.fetch_offset for t in body.topics for p in t.partitions}


def by_key(view: FetchResponseView) -> dict[PartitionKey, tuple[int, bytes]]:
    return {(t.topic, p.partition_index): (p.high_watermark, bytes(p.records or b"")) for t, p in view.partitions()}


def test_full_then_incremental_client_gets_every_partition() -> None:
    s = UpstreamSessions()
    planned = plan_request(request(dict.fromkeys(KEYS, 0)), V, s)
    assert planned is not None
    up, ticket = planned
    assert (up.session_id, up.session_epoch) == (0, 0) and sent(up) == dict.fromkeys(KEYS, 0) and ticket.full
    assert plan_request(request(dict.fromkeys(KEYS, 0)), V, s) is None  # one session fetch in flight
    out = build_client_response(response({("t", 0): (2, b"AB"), ("t", 1): (0, b""), ("t", 2): (5, b"")},
                                         session_id=42), ticket)
    assert out.used and by_key(out.view) == {("t", 0): (2, b"AB"), ("t", 1): (0, b""), ("t", 2): (5, b"")}
    assert out.view.session_id == 0 and s.session_open
    # the client advanced partition 0 only: only it goes upstream, in session 42 epoch 1
    planned = plan_request(request({("t", 0): 2, ("t", 1): 0, ("t", 2): 0}), V, s)
    assert planned is not None
    up, ticket = planned
    assert (up.session_id, up.session_epoch) == (42, 1) and sent(up) == {("t", 0): 2} and not ticket.full
    # the broker answers only partition 1 (new data); the client still gets all three, in its order
    out = build_client_response(response({("t", 1): (1, b"C")}, session_id=42), ticket)
    assert out.used
    assert list(by_key(out.view)) == KEYS
    assert by_key(out.view) == {("t", 0): (2, b""), ("t", 1): (1, b"C"), ("t", 2): (5, b"")}
    # nothing changed: an empty incremental request
    planned = plan_request(request({("t", 0): 2, ("t", 1): 0, ("t", 2): 0}), V, s)
    assert planned is not None and sent(planned[0]) == {} and planned[0].session_epoch == 2


def test_session_error_gives_a_retriable_answer_and_a_full_request_next() -> None:
    s = UpstreamSessions()
    planned = plan_request(request(dict.fromkeys(KEYS, 0)), V, s)
    assert planned is not None
    build_client_response(response({k: (3, b"") for k in KEYS}, session_id=9), planned[1])
    planned = plan_request(request(dict.fromkeys(KEYS, 0)), V, s)
    assert planned is not None
    out = build_client_response(response({}, error=70), planned[1])
    assert not out.used and out.view.error_code == 0
    assert by_key(out.view) == {k: (3, b"") for k in KEYS}  # known state, no records
    planned = plan_request(request(dict.fromkeys(KEYS, 0)), V, s)
    assert planned is not None and planned[1].full and sent(planned[0]) == dict.fromkeys(KEYS, 0)


def test_invalid_full_response_is_not_used() -> None:
    s = UpstreamSessions()
    planned = plan_request(request(dict.fromkeys(KEYS, 0)), V, s)
    assert planned is not None
    out = build_client_response(response({("t", 0): (1, b"X")}, session_id=5), planned[1])  # partitions missing
    assert not out.used and all(p.records_size == 0 for _, p in out.view.partitions())
    planned = plan_request(request(dict.fromkeys(KEYS, 0)), V, s)
    assert planned is not None and planned[1].full


def test_forgotten_partitions_leave_the_state() -> None:
    s = UpstreamSessions()
    planned = plan_request(request(dict.fromkeys(KEYS, 0)), V, s)
    assert planned is not None
    build_client_response(response({k: (1, b"") for k in KEYS}, session_id=3), planned[1])
    planned = plan_request(request({("t", 0): 0}), V, s)
    assert planned is not None
    assert [(t.topic, list(t.partitions)) for t in planned[0].forgotten_topics_data] == [("t", [1, 2])]
    assert set(s.states) == {("t", 0)}


def test_only_sessionless_consumer_fetches_are_eligible() -> None:
    offsets = dict.fromkeys(KEYS, 0)
    assert eligible(request(offsets), V)
    assert not eligible(request(offsets, epoch=0), V)  # the client's own session
    assert not eligible(request(offsets, session_id=7, epoch=3), V)
    assert not eligible(request(offsets, replica_id=1), V)  # a follower
    assert not eligible(request({}), V)
    v6 = request_codec(1, 6).default().replace(topics=[Message(topic="t", partitions=[
        Message(partition=0, fetch_offset=0, log_start_offset=-1, partition_max_bytes=1 << 20)])])
    assert not eligible(v6, 6)  # before KIP-227: no session fields


def test_a_failed_full_request_naming_a_session_starts_a_fresh_one() -> None:
    s = UpstreamSessions()
    planned = plan_request(request(dict.fromkeys(KEYS, 0)), V, s)
    assert planned is not None
    build_client_response(response({k: (0, b"") for k in KEYS}, session_id=9), planned[1])
    planned = plan_request(request(dict.fromkeys(KEYS, 0)), V, s)
    assert planned is not None
    build_client_response(response({}, error=-1, session_id=9), planned[1])
    planned = plan_request(request(dict.fromkeys(KEYS, 0)), V, s)
    assert planned is not None and (planned[0].session_id, planned[0].session_epoch) == (9, 0)  # close + new
    build_client_response(response({}, error=-1, session_id=9), planned[1])
    planned = plan_request(request(dict.fromkeys(KEYS, 0)), V, s)
    assert planned is not None and (planned[0].session_id, planned[0].session_epoch) == (0, 0)  # fresh


def test_replan_sends_the_same_client_request_again_once() -> None:
    s = UpstreamSessions()
    planned = plan_request(request(dict.fromkeys(KEYS, 0)), V, s)
    assert planned is not None
    build_client_response(response({k: (0, b"") for k in KEYS}, session_id=4), planned[1])
    planned = plan_request(request({("t", 0): 1, ("t", 1): 0, ("t", 2): 0}), V, s)
    assert planned is not None
    out = build_client_response(response({}, error=70), planned[1])
    assert not out.used
    again = replan(planned[1])
    assert again is not None
    body, ticket = again
    assert ticket.full and ticket.attempts == 2 and (body.session_id, body.session_epoch) == (0, 0)
    assert sent(body) == {("t", 0): 1, ("t", 1): 0, ("t", 2): 0}
    build_client_response(response({}, error=70), ticket)
    assert replan(ticket) is None
