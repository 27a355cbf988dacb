"""KIP-227 fetch sessions, sans-IO: FetchMetadata arithmetic, the downstream session server (lifecycle, errors
70/71/106, forgotten topics, empty sessions, topic-id mode, incremental inclusion rules), the session cache's
eviction order, and the upstream session client. Requests and responses are real FetchRequest/FetchResponse
messages (proxy.wire codecs), and some are encoded and decoded to prove they are valid on the wire."""

from __future__ import annotations

import random
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.policies.terminate.sessions import (
    FETCH_SESSION_ID_NOT_FOUND,
    FETCH_SESSION_TOPIC_ID_ERROR,
    FINAL_EPOCH,
    INITIAL,
    INT32_MAX,
    INVALID_FETCH_SESSION_EPOCH,
    Decision,
    FetchMetadata,
    FetchParams,
    Kind,
    PartitionKey,
    SessionCache,
    SessionClient,
    SessionServer,
    UpstreamPlan,
    has_diverging_epoch,
    is_full,
    next_epoch,
)
from proxy.wire.fetch_fast import FetchPartition, FetchResponseView, build_tags
from proxy.wire.messages import request_codec, response_codec
from proxy.wire.model import Message
from rig.fetch_oracle import apply_plan, build_response, handle_request, handle_response, response_keys, to_message

ID_A = bytes(range(1, 17))
ID_B = bytes(range(101, 117))
P = FetchParams


def fetch_request(version: int, parts: dict[PartitionKey, FetchParams], session_id: int = 0,
                  epoch: int = FINAL_EPOCH, forget: list[PartitionKey] | None = None,
                  replica_id: int = -1) -> Message:
    """A FetchRequest body of ``version`` (built from the codec's defaults, then filled by apply_plan)."""
    req = request_codec(1, version).default()
    if version >= 15:
        req = req.replace(replica_state=req.replica_state.replace(replica_id=replica_id))
    else:
        req = req.replace(replica_id=replica_id)
    plan = UpstreamPlan(FetchMetadata(session_id, epoch), dict(parts), list(forget or []), dict(parts))
    return apply_plan(req, version, plan)


def roundtrip_request(msg: Message, version: int) -> Message:
    codec = request_codec(1, version)
    return codec.decode(codec.encode(msg))


def roundtrip_response(msg: Message, version: int) -> Message:
    codec = response_codec(1, version)
    return codec.decode(codec.encode(msg))


def part(hw: int = 10, lso: int = 10, log_start: int = 0, error: int = 0, records: bytes = b"",
         preferred: int = -1, tags: bytes | None = None) -> FetchPartition:
    return FetchPartition(0, error, hw, lso, log_start, None, preferred, records, tags)


def keys_of(resp: Message, version: int) -> list[PartitionKey]:
    return response_keys(resp, version)


def server(slots: int = 1000, seed: int = 7) -> SessionServer:
    return SessionServer(SessionCache(slots=slots, rng=random.Random(seed)))


def open_session(srv: SessionServer, version: int, parts: dict[PartitionKey, FetchParams],
                 states: dict[PartitionKey, FetchPartition], now: float = 0.0, replica_id: int = -1) -> int:
    d = handle_request(srv, fetch_request(version, parts, 0, 0, replica_id=replica_id), version, now)
    assert d.kind is Kind.FULL
    resp = build_response(srv, d, states)
    sid: int = resp.session_id
    return sid


TWO: dict[PartitionKey, FetchParams] = {("t", 0): P(5), ("t", 1): P(7)}


def two_states(**kw: Any) -> dict[PartitionKey, FetchPartition]:
    return {("t", 0): part(**kw), ("t", 1): part(**kw)}


# --------------------------------------------------------------------------------------------- FetchMetadata


def test_next_epoch_arithmetic() -> None:
    assert next_epoch(-1) == -1 and next_epoch(-7) == -1  # negative stays FINAL_EPOCH
    assert next_epoch(0) == 1 and next_epoch(41) == 42
    assert next_epoch(INT32_MAX) == 1  # wraps to 1, never to 0 (which would mean "full")
    assert is_full(0) and is_full(-1) and not is_full(1)
    m = FetchMetadata(9, INT32_MAX)
    assert m.next_incremental() == FetchMetadata(9, 1)
    assert m.next_close_existing() == FetchMetadata(9, -1)
    assert m.next_close_existing_attempt_new() == FetchMetadata(9, 0)
    assert FetchMetadata.new_incremental(9) == FetchMetadata(9, 1)


# --------------------------------------------------------------------------------------------- lifecycle


def test_full_request_creates_session_with_random_positive_id_and_epoch_1() -> None:
    srv = server(seed=3)
    expected_id = random.Random(3).randrange(1, INT32_MAX)
    d = handle_request(srv, fetch_request(12, TWO, 0, 0), 12, now=1.0)
    assert d.kind is Kind.FULL and list(d.partitions) == [("t", 0), ("t", 1)]
    assert d.partitions[("t", 1)] == P(7)
    assert len(srv.cache) == 0  # created with the response, as Kafka's FullFetchContext does
    resp = build_response(srv, d, two_states(hw=10))
    assert resp.session_id == expected_id > 0 and resp.error_code == 0
    assert keys_of(resp, 12) == [("t", 0), ("t", 1)]
    session = srv.cache.get(expected_id)
    assert session is not None and session.epoch == 1 and not session.uses_topic_ids
    assert session.partitions[("t", 0)].high_watermark == 10
    assert srv.stats.sessions_created == 1 and srv.cache.partitions_cached == 2
    assert roundtrip_response(resp, 12) == resp


def test_incremental_requests_advance_the_epoch() -> None:
    srv = server()
    sid = open_session(srv, 12, TWO, two_states())
    for epoch in (1, 2, 3):
        d = handle_request(srv, fetch_request(12, {}, sid, epoch), 12, now=epoch)
        assert d.kind is Kind.INCREMENTAL and list(d.partitions) == [("t", 0), ("t", 1)]
        resp = build_response(srv, d, two_states())
        assert resp.session_id == sid and resp.error_code == 0 and resp.responses == []  # nothing changed
    session = srv.cache.get(sid)
    assert session is not None and session.epoch == 4 and session.last_used == 3


def test_sessionless_request_creates_nothing() -> None:
    srv = server()
    d = handle_request(srv, fetch_request(12, TWO), 12, now=0)
    assert d.kind is Kind.SESSIONLESS
    resp = build_response(srv, d, two_states())
    assert resp.session_id == 0 and keys_of(resp, 12) == [("t", 0), ("t", 1)]
    assert len(srv.cache) == 0


def test_v4_request_without_session_fields_is_sessionless() -> None:
    srv = server()
    req = request_codec(1, 4).default().replace(
        topics=[Message(topic="t", partitions=[Message(partition=0, fetch_offset=3, partition_max_bytes=100)])])
    d = handle_request(srv, req, 4, now=0)
    assert d.kind is Kind.SESSIONLESS and d.partitions == {("t", 0): P(3, -1, 100)}


def test_final_epoch_closes_a_named_session() -> None:
    srv = server()
    sid = open_session(srv, 12, TWO, two_states())
    d = handle_request(srv, fetch_request(12, TWO, sid, FINAL_EPOCH), 12, now=1)
    assert d.kind is Kind.SESSIONLESS and sid not in srv.cache
    assert build_response(srv, d, two_states()).session_id == 0
    assert srv.stats.sessions_closed == 1 and srv.cache.partitions_cached == 0
    # the closed session is gone for good
    assert handle_request(srv, fetch_request(12, {}, sid, 1), 12, 2).error_code == FETCH_SESSION_ID_NOT_FOUND


def test_initial_epoch_on_existing_id_closes_it_and_creates_another() -> None:
    srv = server()
    sid = open_session(srv, 12, TWO, two_states())
    d = handle_request(srv, fetch_request(12, {("t", 1): P(9)}, sid, 0), 12, now=1)
    assert d.kind is Kind.FULL and sid not in srv.cache
    new = build_response(srv, d, two_states()).session_id
    assert new not in (0, sid) and list(srv.cache.sessions) == [new]
    session = srv.cache.get(new)
    assert session is not None and list(session.partitions) == [("t", 1)]


# --------------------------------------------------------------------------------------------- errors


def _assert_error_response(srv: SessionServer, d: Decision, code: int, version: int) -> None:
    assert d.is_error and d.error_code == code and d.partitions == {}
    resp = build_response(srv, d, {})
    assert (resp.error_code, resp.session_id, resp.responses) == (code, 0, [])
    assert roundtrip_response(resp, version) == resp


def test_unknown_session_id_is_70() -> None:
    srv = server()
    _assert_error_response(srv, handle_request(srv, fetch_request(12, {}, 12345, 1), 12, 0),
                           FETCH_SESSION_ID_NOT_FOUND, 12)
    # id 0 is never handed out: an incremental epoch with session 0 is also "not found"
    _assert_error_response(srv, handle_request(srv, fetch_request(12, {}, 0, 5), 12, 0),
                           FETCH_SESSION_ID_NOT_FOUND, 12)
    assert srv.stats.errors[FETCH_SESSION_ID_NOT_FOUND] == 2


def test_wrong_epoch_is_71_and_keeps_the_session() -> None:
    srv = server()
    sid = open_session(srv, 12, TWO, two_states())
    for wrong in (2, 7, INT32_MAX):
        _assert_error_response(srv, handle_request(srv, fetch_request(12, {}, sid, wrong), 12, 1),
                               INVALID_FETCH_SESSION_EPOCH, 12)
    assert sid in srv.cache and srv.stats.epoch_errors == 3
    session = srv.cache.get(sid)
    assert session is not None and session.epoch == 1 and list(session.partitions) == [("t", 0), ("t", 1)]
    assert handle_request(srv, fetch_request(12, {}, sid, 1), 12, 2).kind is Kind.INCREMENTAL


def test_a_replayed_incremental_request_is_71() -> None:
    srv = server()
    sid = open_session(srv, 12, TWO, two_states())
    assert handle_request(srv, fetch_request(12, {}, sid, 1), 12, 1).kind is Kind.INCREMENTAL
    _assert_error_response(srv, handle_request(srv, fetch_request(12, {}, sid, 1), 12, 2),
                           INVALID_FETCH_SESSION_EPOCH, 12)


def test_stale_decision_answers_71_with_the_session_id() -> None:
    # two pipelined requests: the session moved on before the first response was built (Kafka's
    # "Possible duplicate request" check in IncrementalFetchContext)
    srv = server()
    sid = open_session(srv, 12, TWO, two_states())
    first = handle_request(srv, fetch_request(12, {}, sid, 1), 12, 1)
    handle_request(srv, fetch_request(12, {}, sid, 2), 12, 1)
    resp = build_response(srv, first, two_states(hw=11))
    assert (resp.error_code, resp.session_id, resp.responses) == (INVALID_FETCH_SESSION_EPOCH, sid, [])


def test_names_session_continued_with_ids_is_106_and_the_reverse() -> None:
    srv = server()
    sid = open_session(srv, 12, TWO, two_states())
    _assert_error_response(srv, handle_request(srv, fetch_request(13, {}, sid, 1), 13, 1),
                           FETCH_SESSION_TOPIC_ID_ERROR, 13)
    assert sid in srv.cache  # not deleted; the client's next full request replaces it
    ids: dict[PartitionKey, FetchParams] = {(ID_A, 0): P(1)}
    sid13 = open_session(srv, 13, ids, {(ID_A, 0): part()})
    session = srv.cache.get(sid13)
    assert session is not None and session.uses_topic_ids
    _assert_error_response(srv, handle_request(srv, fetch_request(12, {}, sid13, 1), 12, 1),
                           FETCH_SESSION_TOPIC_ID_ERROR, 12)
    assert handle_request(srv, fetch_request(13, {}, sid13, 1), 13, 2).kind is Kind.INCREMENTAL
    assert srv.stats.errors[FETCH_SESSION_TOPIC_ID_ERROR] == 2


# --------------------------------------------------------------------------------------------- session updates


def test_epoch_wraps_from_int32_max_to_1() -> None:
    srv = server()
    sid = open_session(srv, 12, TWO, two_states())
    session = srv.cache.get(sid)
    assert session is not None
    session.epoch = INT32_MAX
    assert handle_request(srv, fetch_request(12, {}, sid, INT32_MAX), 12, 1).kind is Kind.INCREMENTAL
    assert session.epoch == 1
    assert handle_request(srv, fetch_request(12, {}, sid, 1), 12, 2).kind is Kind.INCREMENTAL
    assert session.epoch == 2


def test_incremental_adds_updates_and_forgets() -> None:
    srv = server()
    three: dict[PartitionKey, FetchParams] = {("t", 0): P(5), ("t", 1): P(7), ("u", 0): P(1)}
    sid = open_session(srv, 12, three, {k: part() for k in three})
    d = handle_request(srv, fetch_request(12, {("t", 1): P(8, partition_max_bytes=10), ("v", 3): P(0)}, sid, 1,
                                         forget=[("u", 0), ("nope", 9)]), 12, 1)
    assert d.kind is Kind.INCREMENTAL
    # session order: kept ones in place (t-1 updated in place), new ones appended, forgotten removed
    assert d.partitions == {("t", 0): P(5), ("t", 1): P(8, partition_max_bytes=10), ("v", 3): P(0)}
    assert list(d.partitions) == [("t", 0), ("t", 1), ("v", 3)]
    assert srv.cache.partitions_cached == 3
    # a new partition has no cached HW yet: it is in the next response
    resp = build_response(srv, d, {("t", 0): part(), ("t", 1): part(), ("v", 3): part()})
    assert keys_of(resp, 12) == [("v", 3)]


def test_forgetting_every_partition_closes_the_session_and_answers_sessionless() -> None:
    srv = server()
    sid = open_session(srv, 12, TWO, two_states())
    d = handle_request(srv, fetch_request(12, {}, sid, 1, forget=[("t", 0), ("t", 1)]), 12, 1)
    assert d.kind is Kind.SESSIONLESS and d.partitions == {}
    assert sid not in srv.cache and srv.cache.partitions_cached == 0 and srv.stats.sessions_closed == 1
    resp = build_response(srv, d, {})
    assert (resp.error_code, resp.session_id, resp.responses) == (0, 0, [])


def test_full_request_answer_needs_every_partition_state() -> None:
    srv = server()
    d = handle_request(srv, fetch_request(12, TWO, 0, 0), 12, 0)
    with pytest.raises(KeyError, match="no partition state"):
        build_response(srv, d, {("t", 0): part()})


def test_followers_are_privileged() -> None:
    srv = server()
    sid = open_session(srv, 12, TWO, two_states(), replica_id=2)
    session = srv.cache.get(sid)
    assert session is not None and session.privileged
    d = handle_request(srv, fetch_request(15, {(ID_A, 0): P(0)}, 0, 0, replica_id=1), 15, 0)
    assert d.privileged
    d = handle_request(srv, fetch_request(15, {(ID_A, 0): P(0)}, 0, 0, replica_id=-1), 15, 0)
    assert not d.privileged


# --------------------------------------------------------------------------------------------- inclusion


def _incremental(srv: SessionServer, sid: int, epoch: int,
                 states: dict[PartitionKey, FetchPartition]) -> Message:
    d = handle_request(srv, fetch_request(12, {}, sid, epoch), 12, epoch)
    assert d.kind is Kind.INCREMENTAL
    return build_response(srv, d, states)


def test_inclusion_rules() -> None:
    srv = server()
    base = two_states(hw=10, lso=10, log_start=0)
    sid = open_session(srv, 12, TWO, base)
    t0, t1 = ("t", 0), ("t", 1)
    cases: list[tuple[FetchPartition, bool]] = [
        (part(hw=10, lso=10, log_start=0), False),  # nothing changed
        (part(hw=10, lso=8, log_start=0), False),  # LSO-only change never triggers inclusion
        (part(hw=10, lso=10, log_start=0, records=b"x" * 61), True),  # records
        (part(hw=12, lso=12, log_start=0), True),  # HW changed
        (part(hw=12, lso=12, log_start=0), False),  # ... and is cached
        (part(hw=12, lso=12, log_start=3), True),  # log start changed
        (part(hw=12, lso=12, log_start=3, preferred=2), True),  # preferred read replica
        (part(hw=12, lso=12, log_start=3, preferred=2), True),  # ... every time
    ]
    for epoch, (data, included) in enumerate(cases, start=1):
        resp = _incremental(srv, sid, epoch, {t0: data, t1: part(hw=10, lso=10, log_start=0)})
        assert keys_of(resp, 12) == ([t0] if included else []), (epoch, data)
        if included:
            p = resp.responses[0].partitions[0]
            assert (p.high_watermark, p.last_stable_offset, p.log_start_offset) == (
                data.high_watermark, data.last_stable_offset, data.log_start_offset)


def test_error_partition_is_resent_once_the_error_clears() -> None:
    srv = server()
    sid = open_session(srv, 12, TWO, two_states(hw=10))
    session = srv.cache.get(sid)
    assert session is not None
    resp = _incremental(srv, sid, 1, {("t", 0): part(hw=10, error=6), ("t", 1): part(hw=10)})
    assert keys_of(resp, 12) == [("t", 0)] and resp.responses[0].partitions[0].error_code == 6
    assert session.partitions[("t", 0)].high_watermark == -1
    # error gone, same HW as before the error: sent again because the cached HW is -1
    resp = _incremental(srv, sid, 2, {("t", 0): part(hw=10), ("t", 1): part(hw=10)})
    assert keys_of(resp, 12) == [("t", 0)] and resp.responses[0].partitions[0].error_code == 0
    resp = _incremental(srv, sid, 3, {("t", 0): part(hw=10), ("t", 1): part(hw=10)})
    assert keys_of(resp, 12) == []


def test_error_in_the_full_response_is_resent_later() -> None:
    srv = server()
    sid = open_session(srv, 12, TWO, {("t", 0): part(hw=10, error=6), ("t", 1): part(hw=10)})
    resp = _incremental(srv, sid, 1, two_states(hw=10))
    assert keys_of(resp, 12) == [("t", 0)]


def test_diverging_epoch_is_included() -> None:
    diverging = build_tags({0: struct.pack(">iq", 4, 100) + b"\x00"})
    none_set = build_tags({0: struct.pack(">iq", -1, -1) + b"\x00"})
    assert has_diverging_epoch(part(tags=diverging)) and not has_diverging_epoch(part(tags=none_set))
    srv = server()
    sid = open_session(srv, 12, TWO, two_states(hw=10))
    resp = _incremental(srv, sid, 1, {("t", 0): part(hw=10, tags=none_set), ("t", 1): part(hw=10, tags=diverging)})
    assert keys_of(resp, 12) == [("t", 1)]
    assert resp.responses[0].partitions[0].diverging_epoch == Message(epoch=4, end_offset=100)
    assert roundtrip_response(resp, 12) == resp


def test_missing_partition_state_is_no_news_in_an_incremental_response() -> None:
    srv = server()
    sid = open_session(srv, 12, TWO, two_states(hw=10))
    resp = _incremental(srv, sid, 1, {("t", 1): part(hw=11)})
    assert keys_of(resp, 12) == [("t", 1)]


def test_partitions_that_returned_records_move_to_the_end_of_the_session() -> None:
    srv = server()
    three: dict[PartitionKey, FetchParams] = {("t", 0): P(0), ("t", 1): P(0), ("t", 2): P(0)}
    sid = open_session(srv, 12, three, {k: part() for k in three})
    states: dict[PartitionKey, FetchPartition] = {k: part() for k in three}
    states[("t", 0)] = part(records=b"r" * 70)
    resp = _incremental(srv, sid, 1, states)
    assert keys_of(resp, 12) == [("t", 0)]
    d = handle_request(srv, fetch_request(12, {}, sid, 2), 12, 2)
    assert list(d.partitions) == [("t", 1), ("t", 2), ("t", 0)]


def test_full_response_groups_consecutive_partitions_by_topic() -> None:
    srv = server()
    order: dict[PartitionKey, FetchParams] = {("a", 0): P(0), ("b", 0): P(0), ("b", 1): P(0), ("a", 1): P(0)}
    d = handle_request(srv, fetch_request(12, order), 12, 0)
    resp = build_response(srv, d, {k: part() for k in order})
    assert [(t.topic, [p.partition_index for p in t.partitions]) for t in resp.responses] == [
        ("a", [0]), ("b", [0, 1]), ("a", [1])]


# --------------------------------------------------------------------------------------------- topic ids


def test_topic_id_session_v13_round_trips_on_the_wire() -> None:
    srv = server()
    parts: dict[PartitionKey, FetchParams] = {(ID_A, 0): P(3, current_leader_epoch=5, last_fetched_epoch=4),
                                              (ID_B, 2): P(9)}
    req = fetch_request(13, parts, 0, 0)
    assert roundtrip_request(req, 13) == req
    assert req.topics[0].topic_id == ID_A and req.topics[0].partitions[0].current_leader_epoch == 5
    d = handle_request(srv, roundtrip_request(req, 13), 13, 0)
    assert d.partitions == parts
    resp = build_response(srv, d, {k: part(hw=20) for k in parts})
    assert [t.topic_id for t in resp.responses] == [ID_A, ID_B]
    assert roundtrip_response(resp, 13) == resp
    sid = resp.session_id
    req2 = fetch_request(13, {}, sid, 1, forget=[(ID_B, 2)])
    d2 = handle_request(srv, roundtrip_request(req2, 13), 13, 1)
    assert list(d2.partitions) == [(ID_A, 0)]


@pytest.mark.parametrize("version", [7, 11, 12, 13, 16, 17])
def test_messages_encode_at_every_session_version(version: int) -> None:
    topic: bytes | str = ID_A if version >= 13 else "t"
    parts: dict[PartitionKey, FetchParams] = {(topic, 0): P(1), (topic, 1): P(2)}
    srv = server()
    req = fetch_request(version, parts, 0, 0)
    decoded = roundtrip_request(req, version)
    assert decoded.session_epoch == 0 and decoded.session_id == 0
    d = handle_request(srv, decoded, version, 0)
    resp = build_response(srv, d, {k: part(hw=5, records=b"") for k in parts})
    assert roundtrip_response(resp, version) == resp and resp.session_id > 0
    view = srv.build_view(handle_request(srv, fetch_request(version, {}, resp.session_id, 1), version, 1),
                          {k: part(hw=6) for k in parts})
    assert isinstance(view, FetchResponseView)
    assert response_codec(1, version).decode(view.to_bytes()) == to_message(view)
    assert len(to_message(view).responses) == 1 and len(to_message(view).responses[0].partitions) == 2


def test_keys_must_match_the_versions_topic_addressing() -> None:
    srv = server()
    d = handle_request(srv, fetch_request(12, {("t", 0): P(0)}), 12, 0)
    d.version = 13
    with pytest.raises(ValueError, match="16-byte topic ids"):
        build_response(srv, d, {("t", 0): part()})
    with pytest.raises(ValueError, match="topic names"):
        fetch_request(12, {(ID_A, 0): P(0)})


# --------------------------------------------------------------------------------------------- cache


def _cache_server(slots: int, age: float = 120.0) -> SessionServer:
    return SessionServer(SessionCache(slots=slots, eviction_age_s=age, rng=random.Random(1)))


def _parts(n: int, topic: str = "t") -> dict[PartitionKey, FetchParams]:
    return {(topic, i): P(0) for i in range(n)}


def _open(srv: SessionServer, n: int, now: float, replica_id: int = -1) -> int:
    parts = _parts(n)
    return open_session(srv, 12, parts, {k: part() for k in parts}, now=now, replica_id=replica_id)


def _touch(srv: SessionServer, sid: int, now: float) -> None:
    session = srv.cache.get(sid)
    assert session is not None
    assert handle_request(srv, fetch_request(12, {}, sid, session.epoch), 12, now).kind is Kind.INCREMENTAL


def test_full_cache_refuses_a_young_sessions_replacement() -> None:
    srv = _cache_server(1)
    a = _open(srv, 5, now=0)
    assert _open(srv, 50, now=10) == 0  # a is young (created < 120 s ago): not evictable by a consumer
    assert list(srv.cache.sessions) == [a] and srv.stats.refused == 1 and srv.stats.evictions == 0


def test_zero_slots_means_sessionless_full_responses() -> None:
    srv = _cache_server(0)
    assert _open(srv, 3, now=0) == 0 and len(srv.cache) == 0


def test_idle_session_is_evicted_first() -> None:
    srv = _cache_server(2)
    _open(srv, 100, now=0)
    b = _open(srv, 1, now=1)
    _touch(srv, b, 100)
    # at 121 s, a has been idle 121 s > 120 s: evicted although it is the largest
    c = _open(srv, 1, now=121)
    assert c != 0 and set(srv.cache.sessions) == {b, c} and srv.stats.evictions == 1
    assert srv.cache.partitions_cached == 2


def test_idle_means_strictly_longer_than_the_eviction_age() -> None:
    srv = _cache_server(1)
    _open(srv, 5, now=0)
    assert _open(srv, 1, now=120) == 0
    assert _open(srv, 1, now=120.5) != 0


def test_least_valuable_old_session_is_evicted_by_a_larger_newcomer() -> None:
    srv = _cache_server(3)
    small = _open(srv, 1, now=0)
    mid = _open(srv, 3, now=0)
    big = _open(srv, 5, now=0)
    for sid in (small, mid, big):  # used recently, created long ago: evictable, not stale
        _touch(srv, sid, 200)
    assert _open(srv, 1, now=201) == 0  # equal size is not enough: (False, 1, 0) < (False, 1, id)
    assert _open(srv, 0, now=202) == 0  # a smaller newcomer is refused
    new = _open(srv, 2, now=203)
    assert new != 0 and set(srv.cache.sessions) == {mid, big, new} and srv.stats.evictions == 1
    assert srv.cache.partitions_cached == 3 + 5 + 2


def test_evictability_is_decided_at_the_last_touch() -> None:
    # FetchSessionCacheShard.touch files a session as evictable only if it was older than the eviction age
    # when touched; a session touched young stays unevictable (by consumers) until its next touch.
    srv = _cache_server(1)
    a = _open(srv, 1, now=0)
    _touch(srv, a, 100)
    assert _open(srv, 10, now=150) == 0  # a: created 150 s ago, but young at its last touch
    _touch(srv, a, 151)
    assert _open(srv, 10, now=152) != 0 and a not in srv.cache


def test_privileged_sessions_outrank_consumer_sessions() -> None:
    srv = _cache_server(1)
    follower = _open(srv, 1, now=0, replica_id=1)
    _touch(srv, follower, 200)
    assert _open(srv, 100, now=201) == 0  # (False, 100, 0) < (True, 1, id): a consumer cannot evict it
    newcomer = _open(srv, 2, now=202, replica_id=2)
    assert newcomer != 0 and follower not in srv.cache


def test_a_follower_may_evict_a_young_consumer_session_but_not_a_young_follower() -> None:
    srv = _cache_server(1)
    consumer = _open(srv, 5, now=0)
    f1 = _open(srv, 1, now=1, replica_id=1)  # (True, 1, 0) > (False, 5, id)
    assert f1 != 0 and consumer not in srv.cache
    assert _open(srv, 10, now=2, replica_id=2) == 0  # young privileged sessions are not evictable


def test_stats_count_sessions_and_partitions() -> None:
    srv = _cache_server(10)
    a = _open(srv, 3, now=0)
    _open(srv, 2, now=0)
    assert len(srv.cache) == 2 and srv.cache.partitions_cached == 5 and srv.stats.sessions_created == 2
    handle_request(srv, fetch_request(12, {("t", 9): P(0)}, a, 1), 12, 1)
    assert srv.cache.partitions_cached == 6


# --------------------------------------------------------------------------------------------- upstream client


def _resp(version: int, keys: list[PartitionKey], session_id: int = 0, error: int = 0,
          throttle: int = 0) -> Message:
    """A broker's Fetch response listing ``keys`` (built by a throwaway server's sessionless path)."""
    decision = Decision(Kind.SESSIONLESS, version, {k: P(0) for k in keys})
    resp = build_response(SessionServer(), decision, {k: part() for k in keys})
    return resp.replace(session_id=session_id, error_code=error, throttle_time_ms=throttle)


def test_client_first_full_then_incremental_changed_only() -> None:
    c = SessionClient()
    wanted: dict[PartitionKey, FetchParams] = {("t", 0): P(5), ("t", 1): P(7), ("u", 0): P(1)}
    plan = c.build(wanted)
    assert plan.is_full and plan.metadata == INITIAL and plan.to_send == wanted and plan.to_forget == []
    assert handle_response(c, _resp(12, list(wanted), session_id=77), 12)
    assert c.next_metadata == FetchMetadata(77, 1)

    plan = c.build(wanted)  # nothing changed: an empty incremental request
    assert plan.metadata == FetchMetadata(77, 1) and plan.to_send == {} and plan.to_forget == []
    assert plan.session_partitions == wanted
    assert handle_response(c, _resp(12, [], session_id=77), 12)

    # t-0 altered, t-1 dropped, v-0 added
    wanted2: dict[PartitionKey, FetchParams] = {("t", 0): P(6), ("u", 0): P(1), ("v", 0): P(0)}
    plan = c.build(wanted2)
    assert plan.metadata == FetchMetadata(77, 2)
    assert list(plan.to_send.items()) == [(("v", 0), P(0)), (("t", 0), P(6))]  # added first, then altered
    assert plan.to_forget == [("t", 1)]
    assert handle_response(c, _resp(12, [("v", 0)], session_id=77), 12)
    assert c.next_metadata == FetchMetadata(77, 3)
    assert c.stats.full_requests == 1 and c.stats.incremental_requests == 2 and c.stats.partitions_sent == 5


@pytest.mark.parametrize(("error", "expected"), [
    (FETCH_SESSION_ID_NOT_FOUND, FetchMetadata(0, 0)),
    (INVALID_FETCH_SESSION_EPOCH, FetchMetadata(77, 0)),
    (FETCH_SESSION_TOPIC_ID_ERROR, FetchMetadata(77, 0)),
])
def test_client_resets_to_a_full_request_on_session_errors(error: int, expected: FetchMetadata) -> None:
    c = SessionClient()
    wanted: dict[PartitionKey, FetchParams] = {("t", 0): P(5), ("t", 1): P(7)}
    c.build(wanted)
    handle_response(c, _resp(12, list(wanted), session_id=77), 12)
    c.build(wanted)
    assert not handle_response(c, _resp(12, [], error=error), 12)
    assert c.next_metadata == expected and c.stats.resets == 1
    plan = c.build(wanted)
    assert plan.is_full and plan.to_send == wanted and plan.metadata == expected


@pytest.mark.parametrize(("old", "new"), [(12, 13), (13, 12)])
def test_client_restarts_its_session_when_the_topic_addressing_changes(old: int, new: int) -> None:
    """A session never mixes topic names (v7-12) and ids (v13+): the broker answers an incremental request in
    the other addressing with 106 (FetchManager.newContext), and names cannot even be written in a v13 request.
    So the next request is full, in the new addressing, naming the old session to close it."""
    keys: dict[int, list[PartitionKey]] = {12: [("t", 0), ("t", 1)], 13: [(ID_A, 0), (ID_A, 1)]}
    c = SessionClient()
    wanted = {k: P(0) for k in keys[old]}
    assert c.build(wanted, old >= 13).is_full and c.uses_topic_ids is (old >= 13)
    assert handle_response(c, _resp(old, keys[old], session_id=77), old)
    assert not c.switches_addressing(old >= 13) and c.switches_addressing(new >= 13)
    wanted = {k: P(3) for k in keys[new]}
    plan = c.build(wanted, new >= 13)
    assert plan.is_full and plan.metadata == FetchMetadata(77, 0) and plan.to_send == wanted and plan.to_forget == []
    assert dict(plan.session_partitions) == wanted and c.uses_topic_ids is (new >= 13) and c.stats.resets == 1
    req = roundtrip_request(apply_plan(request_codec(1, new).default(), new, plan), new)  # writable
    assert (req.session_id, req.session_epoch) == (77, 0)
    assert handle_response(c, _resp(new, keys[new], session_id=78), new)
    plan = c.build(wanted)  # no addressing given: the keys'
    assert plan.metadata == FetchMetadata(78, 1) and plan.to_send == {} and plan.to_forget == []


def test_client_sessionless_full_response_keeps_asking_for_a_session() -> None:
    c = SessionClient()
    c.build({("t", 0): P(0)})
    assert handle_response(c, _resp(12, [("t", 0)], session_id=0), 12)  # broker cache full
    assert c.next_metadata == INITIAL


def test_client_invalid_responses_reset() -> None:
    c = SessionClient()
    wanted: dict[PartitionKey, FetchParams] = {("t", 0): P(0), ("t", 1): P(0)}
    c.build(wanted)
    assert not handle_response(c, _resp(12, [("t", 0)], session_id=5), 12)  # full response omits t-1
    assert c.next_metadata == FetchMetadata(0, 0)
    c.build(wanted)
    assert handle_response(c, _resp(12, list(wanted), session_id=5), 12)
    c.build(wanted)
    assert not handle_response(c, _resp(12, [("x", 0)], session_id=5), 12)  # outside the session
    assert c.next_metadata == FetchMetadata(5, 0)


def test_client_throttled_empty_full_response_is_retried_unchanged() -> None:
    c = SessionClient()
    c.build({("t", 0): P(0)})
    assert not handle_response(c, _resp(12, [], throttle=100), 12)
    assert c.next_metadata == INITIAL and c.stats.resets == 0


def test_client_broker_closing_the_session_and_connection_errors() -> None:
    c = SessionClient()
    wanted: dict[PartitionKey, FetchParams] = {("t", 0): P(0)}
    c.build(wanted)
    handle_response(c, _resp(12, list(wanted), session_id=5), 12)
    c.build(wanted)
    assert handle_response(c, _resp(12, [], session_id=0), 12)  # incremental answered sessionless
    assert c.next_metadata == INITIAL
    c.build(wanted)
    handle_response(c, _resp(12, list(wanted), session_id=6), 12)
    c.handle_error()  # broker restart / connection lost
    assert c.next_metadata == FetchMetadata(6, 0) and c.build(wanted).to_send == wanted


def test_client_against_a_broker_without_sessions() -> None:
    c = SessionClient()
    c.build({("t", 0): P(0)})
    # Fetch v4 (before KIP-227) has no error_code / session_id at the top level
    v4 = Message(throttle_time_ms=0, responses=[Message(topic="t", partitions=[Message(
        partition_index=0, error_code=0, high_watermark=1, last_stable_offset=1, aborted_transactions=None,
        records=b"")])])
    assert roundtrip_response(v4, 4) == v4
    assert handle_response(c, v4, 4) and c.next_metadata == INITIAL
    assert c.build({("t", 0): P(1)}).is_full


def test_server_counts_what_the_metrics_report() -> None:
    srv = server()
    sid = open_session(srv, 12, TWO, two_states())
    handle_request(srv, fetch_request(12, {}, sid, 5), 12, 1)
    st = srv.stats
    assert (len(srv.cache), srv.cache.partitions_cached, st.epoch_errors, st.evictions) == (1, 2, 1, 0)


def test_client_epoch_wraps() -> None:
    c = SessionClient()
    c.next_metadata = FetchMetadata(5, INT32_MAX)
    c.session_partitions = {("t", 0): P(0)}
    plan = c.build({("t", 0): P(0)})
    assert plan.metadata.epoch == INT32_MAX
    assert handle_response(c, _resp(12, [], session_id=5), 12)
    assert c.next_metadata == FetchMetadata(5, 1)


def test_apply_plan_builds_valid_requests() -> None:
    plan = UpstreamPlan(FetchMetadata(9, 4), {("t", 0): P(5, 2, 100, 3, 1), ("u", 1): P(6), ("t", 2): P(7)},
                        [("x", 0), ("x", 3), ("y", 1)], {})
    base = request_codec(1, 12).default().replace(max_wait_ms=500, min_bytes=1)
    req = apply_plan(base, 12, plan)
    assert (req.session_id, req.session_epoch, req.max_wait_ms, req.min_bytes) == (9, 4, 500, 1)
    assert [(t.topic, [p.partition for p in t.partitions]) for t in req.topics] == [("t", [0]), ("u", [1]), ("t", [2])]
    p = req.topics[0].partitions[0]
    assert (p.fetch_offset, p.log_start_offset, p.partition_max_bytes, p.current_leader_epoch,
            p.last_fetched_epoch) == (5, 2, 100, 3, 1)
    assert [(f.topic, f.partitions) for f in req.forgotten_topics_data] == [("x", [0, 3]), ("y", [1])]
    assert roundtrip_request(req, 12) == req
    # v7 has neither current_leader_epoch (v9+) nor last_fetched_epoch (v12+)
    req7 = apply_plan(request_codec(1, 7).default(), 7, plan)
    assert "current_leader_epoch" not in req7.topics[0].partitions[0].fields()
    assert roundtrip_request(req7, 7) == req7


def test_client_drives_the_server_end_to_end() -> None:
    """A SessionClient talking to a SessionServer through encoded messages: every response validates, and
    incremental requests list only what changed."""
    for version, topic in ((12, "t"), (13, ID_A)):
        srv, c = server(), SessionClient()
        keys: list[PartitionKey] = [(topic, i) for i in range(4)]
        states = {k: part(hw=10) for k in keys}
        offsets = dict.fromkeys(keys, 0)
        sent_sizes = []
        for rnd in range(6):
            if rnd == 2:
                offsets[keys[1]] = 4  # one partition advances
                states[keys[1]] = part(hw=12, records=b"z" * 70)
            if rnd == 4:
                del offsets[keys[3]]  # one is dropped
            plan = c.build({k: P(o) for k, o in offsets.items()})
            sent_sizes.append(len(plan.to_send) + len(plan.to_forget))
            req = roundtrip_request(apply_plan(request_codec(1, version).default(), version, plan), version)
            d = handle_request(srv, req, version, rnd)
            resp = roundtrip_response(build_response(srv, d, states), version)
            assert handle_response(c, resp, version), (version, rnd)
            states[keys[1]] = part(hw=12)
        assert sent_sizes == [4, 0, 1, 0, 1, 0]
        assert c.next_metadata.epoch == 6 and srv.stats.sessions_created == 1


@settings(max_examples=200)
@given(st.lists(st.tuples(st.dictionaries(st.tuples(st.sampled_from("tu"), st.integers(0, 5)),
                                          st.integers(0, 3), max_size=6),
                          st.lists(st.tuples(st.sampled_from("tu"), st.integers(0, 5)), max_size=4)),
                min_size=1, max_size=8))
def test_build_delta_plans_what_build_plans(steps: list[tuple[dict[PartitionKey, int], list[PartitionKey]]]) -> None:
    """SessionClient.build_delta (the client's own delta) == build (the whole wanted set), step by step, when
    the wanted set changes by exactly that delta (sent partitions, then forgotten ones, as FetchSession.update)."""
    a, b = SessionClient(), SessionClient()
    wanted: dict[PartitionKey, FetchParams] = {("t", 0): P(0)}
    for c in (a, b):
        c.build(wanted)
        assert handle_response(c, _resp(12, list(wanted), session_id=5), 12)
    for changed_offsets, forgotten in steps:
        changed = {k: P(o) for k, o in changed_offsets.items()}
        for key, params in changed.items():
            wanted[key] = params
        for key in forgotten:
            wanted.pop(key, None)
        full = a.build(dict(wanted))
        delta = b.build_delta(changed, forgotten)
        assert full.metadata == delta.metadata
        assert dict(full.to_send) == dict(delta.to_send) and set(full.to_forget) == set(delta.to_forget)
        assert dict(a.session_partitions) == dict(b.session_partitions) == wanted
        for c in (a, b):
            assert handle_response(c, _resp(12, [], session_id=5), 12)
