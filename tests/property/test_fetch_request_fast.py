"""The Fetch request fast path (proxy/wire/fetch_request_fast.py) is proven equal to the construct reference codec
and to the session policies built on it, for every Fetch version Sluice decodes (4-18).

For hypothesis-generated requests (from Kafka's FetchRequest.json via specgen, with random unknown tagged
fields at every level, sometimes with few topic names/ids and partition numbers so that topics repeat and
partitions collide) encoded by the construct codec:
- the fast decode gives the partitions, forgotten partitions and top-level fields that
  the oracle's ``request_partitions`` / ``forgotten_partitions`` and the construct decode give;
- re-encoding with the request's own partitions and session gives the construct encoding of the request
  regrouped canonically (which is the input itself when the input is canonical);
- re-encoding with arbitrary partitions, forgotten partitions and session equals ``rig.fetch_oracle.apply_plan``;
- truncated or mutated frames fail with CodecError exactly when the construct codec fails, and decode to the
  same thing when it does not.
Golden frames from real clients (Java console consumer, kafka-python, librdkafka, aiokafka) round-trip byte
for byte.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.policies.terminate import sessions
from proxy.wire.compiler import KafkaStruct, struct_for
from proxy.wire.errors import CodecError
from proxy.wire.fetch_fast import parse_tags
from proxy.wire.fetch_request_fast import (
    MAX_VERSION,
    MIN_VERSION,
    Baseline,
    FetchParams,
    FetchRequestView,
    PartitionKey,
    decode_fetch_request,
    encode_fetch_request,
    sessionless,
    topic_keys,
)
from proxy.wire.messages import (
    decode_request,
    decoded_versions,
    encode_request,
    peek_request_header,
    request_codec,
    request_header_version,
    request_spec,
)
from proxy.wire.model import Message
from proxy.wire.schema import Versions
from rig.fetch_oracle import _element, _fields_to_tags, apply_plan, forgotten_partitions, request_partitions
from rig.specgen import TEXT, message_strategy

VERSIONS = list(range(MIN_VERSION, MAX_VERSION + 1))
SETTINGS = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
GOLDEN = sorted((Path(__file__).resolve().parents[1] / "data" / "golden").glob("Fetch-v*-request-*.bin"))

_IDS = [bytes([i]) * 16 for i in range(1, 4)]
_NAMES = ["a", "b", "topic-ü"]


def _topic_field(version: int) -> str:
    return "topic_id" if version >= 13 else "topic"


def _bodies(version: int) -> st.SearchStrategy[Message]:
    """Requests as the construct codec decodes them: anything the spec allows, or few topics and partitions
    (repeated topic entries, repeated partitions, the same topic in several forgotten entries)."""
    spec = request_spec(1)
    colliding = {"topic": st.sampled_from(_NAMES), "topic_id": st.sampled_from(_IDS),
                 "partition": st.integers(0, 3), "partitions": st.integers(0, 3)}
    return st.one_of(message_strategy(spec, version), message_strategy(spec, version, overrides=colliding))


def _headers(version: int) -> st.SearchStrategy[Message]:
    flexible = request_header_version(1, version) >= 2
    tags = st.dictionaries(st.integers(0, 100), st.binary(max_size=4), max_size=2) if flexible else st.just({})

    def build(corr: int, client_id: str | None, unknown: dict[int, bytes]) -> Message:
        m = Message(request_api_key=1, request_api_version=version, correlation_id=corr, client_id=client_id)
        if unknown:
            m.unknown_tags = unknown
        return m

    return st.builds(build, st.integers(-(2**31), 2**31 - 1), st.one_of(st.none(), TEXT), tags)


def _structs(version: int) -> tuple[KafkaStruct, KafkaStruct]:
    top = struct_for(request_spec(1), version)
    return top, _element(_element(top, "topics"), "partitions")


def _as_sessions(parts: dict[PartitionKey, FetchParams]) -> dict[PartitionKey, sessions.FetchParams]:
    return {k: sessions.FetchParams(*p[:5]) for k, p in parts.items()}


def _check_decode(view: FetchRequestView, frame: bytes) -> None:
    """Everything the view exposes equals what the construct decode of ``frame`` says."""
    version = view.version
    header, ref = decode_request(frame)
    assert (header.request_api_key, header.request_api_version) == (1, version)
    assert view.correlation_id == header.correlation_id
    assert view.header == frame[: peek_request_header(frame).body_offset]
    parts = view.partitions()
    expected = request_partitions(ref, version)
    assert list(parts) == list(expected)  # same order
    assert _as_sessions(parts) == expected
    assert view.forgotten() == forgotten_partitions(ref, version)
    assert view.has_partitions == any(t.partitions for t in ref.topics)
    top, part_st = _structs(version)
    # each partition's tag section: the one of the last entry for its key, as the construct codec writes it
    tf = _topic_field(version)
    # (compared parsed: a mutated frame may spell a tag or size as an overlong varint, kept as received)
    tags: dict[PartitionKey, dict[int, bytes]] = {}
    for t in ref.topics:
        for p in t.partitions:
            tags[(t.get(tf), p.partition)] = _parsed(_fields_to_tags(part_st, p.fields()) if version >= 12 else None)
    assert {k: _parsed(p.tags) for k, p in parts.items()} == tags
    assert all(p.tags is None or len(p.tags) > 1 for p in parts.values())  # None for an empty section
    if version >= 15:
        assert (view.replica_id, view.replica_epoch) == (ref.replica_state.replica_id,
                                                          ref.replica_state.replica_epoch)
    else:
        assert (view.replica_id, view.replica_epoch) == (ref.replica_id, -1)
    assert (view.max_wait_ms, view.min_bytes, view.max_bytes, view.isolation_level) == (
        ref.max_wait_ms, ref.min_bytes, ref.max_bytes, ref.isolation_level)
    assert (view.session_id, view.session_epoch) == (ref.get("session_id", 0), ref.get("session_epoch", -1))
    assert view.rack_id == ref.get("rack_id", "")
    assert view.cluster_id == ref.get("cluster_id")
    assert _top_parsed(view.tags) == _top_parsed(_fields_to_tags(top, ref.fields()) if version >= 12 else None)
    assert view.tags is None or len(view.tags) > 1


def _parsed(raw: bytes | None) -> dict[int, bytes]:
    return {tag: bytes(value) for tag, value in parse_tags(raw).items()}


#: the request's ReplicaState tag (v15+, KIP-903): ReplicaId int32, ReplicaEpoch int64, then its own tag section
REPLICA_STATE_TAG, REPLICA_STATE_FIXED = 1, 12


def _top_parsed(raw: bytes | None) -> dict[int, Any]:
    """The request's tag section parsed, ReplicaState's value down to its own tag section: a mutated frame may
    spell a tag nested there as an overlong varint too, kept as received, while the construct codec writes it
    anew."""
    out: dict[int, Any] = dict(_parsed(raw))
    state = out.get(REPLICA_STATE_TAG)
    if state is not None and len(state) > REPLICA_STATE_FIXED:
        out[REPLICA_STATE_TAG] = (state[:REPLICA_STATE_FIXED], _parsed(state[REPLICA_STATE_FIXED:]))
    return out


def _canonical(body: Message, version: int) -> Message:
    """``body`` as the fast encoder writes it from its own partitions() and forgotten(): one entry per run of
    consecutive partitions of a topic, a repeated partition at its first position with its last value, the
    forgotten partitions grouped per topic, no topic-level tags."""
    tf = _topic_field(version)
    latest: dict[PartitionKey, Message] = {}
    for t in body.topics:
        for p in t.partitions:
            latest[(t.get(tf), p.partition)] = p
    topics: list[Message] = []
    for (topic, _), p in latest.items():
        if topics and topics[-1].get(tf) == topic:
            topics[-1].partitions.append(p)
        else:
            topics.append(Message(**{tf: topic, "partitions": [p]}))
    out = body.replace(topics=topics)
    if version >= 7:
        groups: dict[Any, list[int]] = {}
        for topic, partition in forgotten_partitions(body, version):
            groups.setdefault(topic, []).append(partition)
        out.forgotten_topics_data = [Message(**{tf: t, "partitions": ps}) for t, ps in groups.items()]
    return out


def test_versions_are_the_decoded_ones() -> None:
    """A Kafka upgrade that adds a Fetch version must fail here: its layout has to be added by hand."""
    assert decoded_versions(1) == Versions(MIN_VERSION, MAX_VERSION)
    assert request_spec(1).valid == Versions(MIN_VERSION, MAX_VERSION)


@pytest.mark.parametrize("version", VERSIONS)
def test_decode_and_reencode_equal_construct(version: int) -> None:
    @SETTINGS
    @given(_headers(version), _bodies(version))
    def check(header: Message, body: Message) -> None:
        frame = encode_request(header, body)
        view = decode_fetch_request(frame)
        _check_decode(view, frame)
        assert decode_fetch_request(bytearray(frame)).partitions() == view.partitions()
        head = peek_request_header(frame)  # read already (the chain's): the same decode, the same session read
        assert decode_fetch_request(frame, head).partitions() == view.partitions()
        assert sessionless(frame, head) == (view.session_epoch == -1)
        # the topics read from the topic entries alone (the chain's look-up of names): None (decode) when an entry
        # has tagged fields, else what the decode reads; Sluice's own encoding has none but the partitions' own
        keys = topic_keys(frame, head)
        assert keys is None or (version >= 12 and keys == view.topic_keys)
        again = encode_fetch_request(view, view.session_id, view.session_epoch, view.partitions(), view.forgotten())
        tagged = any(params.tags for params in view.partitions().values())
        assert topic_keys(again, peek_request_header(again)) == \
            (None if tagged or version < 12 else decode_fetch_request(again).topic_keys)
        ref_header, ref = decode_request(frame)
        canonical = _canonical(ref, version)
        assert again == encode_request(ref_header, canonical)
        assert decode_request(again) == (ref_header, canonical)
        if canonical == ref:
            assert again == frame

    check()


@pytest.mark.parametrize("version", VERSIONS)
def test_canonical_requests_round_trip_byte_exact(version: int) -> None:
    @SETTINGS
    @given(_headers(version), _bodies(version))
    def check(header: Message, body: Message) -> None:
        frame = encode_request(header, _canonical(decode_request(encode_request(header, body))[1], version))
        view = decode_fetch_request(frame)
        assert encode_fetch_request(view, view.session_id, view.session_epoch, view.partitions(),
                                    view.forgotten()) == frame

    check()


def _keys(version: int) -> st.SearchStrategy[PartitionKey]:
    topics = st.sampled_from(_IDS) if version >= 13 else st.sampled_from(_NAMES)
    return st.tuples(topics, st.integers(-(2**31), 2**31 - 1) | st.integers(0, 5))


_I32 = st.integers(-(2**31), 2**31 - 1)
_I64 = st.integers(-(2**63), 2**63 - 1)
_PARAMS = st.builds(FetchParams, _I64, _I64, _I32, _I32, _I32, tags=st.none())


@pytest.mark.parametrize("version", VERSIONS)
def test_rewrite_equals_apply_plan(version: int) -> None:
    @SETTINGS
    @given(_headers(version), _bodies(version), st.dictionaries(_keys(version), _PARAMS, max_size=12),
           st.lists(_keys(version), max_size=6), _I32, _I32)
    def check(header: Message, body: Message, to_send: dict[PartitionKey, FetchParams],
              to_forget: list[PartitionKey], session_id: int, epoch: int) -> None:
        frame = encode_request(header, body)
        view = decode_fetch_request(frame)
        out = encode_fetch_request(view, session_id, epoch, to_send, to_forget)
        ref_header, ref = decode_request(frame)
        if version >= 7:
            plan = sessions.UpstreamPlan(sessions.FetchMetadata(session_id, epoch), _as_sessions(to_send),
                                         list(to_forget), {})
            expected = apply_plan(ref, version, plan)
        else:
            # apply_plan needs ForgottenTopicsData (v7+); before v7 only the topics change
            tf = _topic_field(version)
            expected = _canonical(Message(**{**ref.fields(), "topics": [
                Message(**{tf: k[0], "partitions": [Message(
                    partition=k[1], fetch_offset=p.fetch_offset, partition_max_bytes=p.partition_max_bytes,
                    **({"log_start_offset": p.log_start_offset} if version >= 5 else {}),
                    **({"current_leader_epoch": p.current_leader_epoch} if version >= 9 else {}))]})
                for k, p in to_send.items()]}), version)
        assert decode_request(out) == (ref_header, expected)
        assert out == encode_request(ref_header, expected)
        again = decode_fetch_request(out)
        assert again.partitions() == {k: p._replace(
            log_start_offset=p.log_start_offset if version >= 5 else -1,
            current_leader_epoch=p.current_leader_epoch if version >= 9 else -1,
            last_fetched_epoch=p.last_fetched_epoch if version >= 12 else -1) for k, p in to_send.items()}
        if version >= 7:
            assert (again.session_id, again.session_epoch) == (session_id, epoch)
            assert sorted(again.forgotten(), key=repr) == sorted(to_forget, key=repr)
        else:
            assert (again.session_id, again.session_epoch, again.forgotten()) == (0, -1, [])

    check()


@pytest.mark.parametrize("version", [v for v in VERSIONS if v >= 12])
def test_partition_tags_survive_a_rewrite(version: int) -> None:
    """Per-partition tagged fields (ReplicaDirectoryId v17+, HighWatermark v18+, unknown tags; flexible versions
    only) are re-emitted as received, and take part in equality."""
    top, part_st = _structs(version)
    codec_key = (b"\x07" * 16) if version >= 13 else "t"
    p = part_st.default().replace(partition=1, fetch_offset=5, unknown_tags={99: b"xy"})
    if version >= 17:
        p.replica_directory_id = b"\x05" * 16
    body = top.default().replace(topics=[Message(**{_topic_field(version): codec_key, "partitions": [p]})])
    frame = encode_request(Message(request_api_key=1, request_api_version=version, correlation_id=1,
                                   client_id="c"), body)
    view = decode_fetch_request(frame)
    params = view.partitions()[(codec_key, 1)]
    assert params.tags is not None and params != params._replace(tags=None)
    out = encode_fetch_request(view, 1, 2, {(codec_key, 1): params}, [])
    assert decode_request(out)[1].topics[0].partitions == [p]


@pytest.mark.parametrize("version", VERSIONS)
def test_mutations_fail_like_construct(version: int) -> None:
    @SETTINGS
    @given(_headers(version), _bodies(version), st.data())
    def check(header: Message, body: Message, data: st.DataObject) -> None:
        frame = bytearray(encode_request(header, body))
        cut = data.draw(st.integers(0, len(frame)))
        frames = [bytes(frame[:cut])]
        for _ in range(3):
            i = data.draw(st.integers(0, len(frame) - 1))
            frame[i] = data.draw(st.integers(0, 255))
            frames.append(bytes(frame))
        for f in frames:
            _same_outcome(f)

    check()


def _same_outcome(frame: bytes) -> None:
    try:
        head = peek_request_header(frame)
    except CodecError:
        keys = None
    else:
        keys = topic_keys(frame, head)  # never raises: None, or what a decode reads when one succeeds
    try:
        header, _ = decode_request(frame)
    except CodecError:
        with pytest.raises(CodecError):
            decode_fetch_request(frame)
        return
    if header.request_api_key != 1:
        with pytest.raises(CodecError):
            decode_fetch_request(frame)
        return
    view = decode_fetch_request(frame)
    _check_decode(view, frame)
    assert keys is None or keys == view.topic_keys


def test_golden_requests_exist() -> None:
    assert len(GOLDEN) >= 4


@pytest.mark.parametrize("path", GOLDEN, ids=[p.name for p in GOLDEN])
def test_golden_fetch_request(path: Path) -> None:
    """Requests of real clients: decoded like construct, re-encoded byte for byte, truncations rejected."""
    frame = path.read_bytes()
    view = decode_fetch_request(frame)
    assert view.version == int(path.name.split("-v")[1].split("-")[0])
    assert view.has_partitions
    _check_decode(view, frame)
    assert encode_fetch_request(view, view.session_id, view.session_epoch, view.partitions(),
                                view.forgotten()) == frame
    for cut in range(len(frame)):
        with pytest.raises(CodecError):
            decode_fetch_request(frame[:cut])


def test_view_does_not_reference_the_frame() -> None:
    frame = bytearray(GOLDEN[-1].read_bytes())
    view = decode_fetch_request(frame)
    before = (view.partitions(), view.forgotten(), view.header, view.tags)
    expected = encode_fetch_request(view, 1, 2, view.partitions(), [])
    frame[:] = bytes(len(frame))
    assert (view.partitions(), view.forgotten(), view.header, view.tags) == before
    assert encode_fetch_request(view, 1, 2, view.partitions(), []) == expected


def test_old_versions_ignore_session_fields() -> None:
    top = struct_for(request_spec(1), 4).default()
    top.topics = [Message(topic="t", partitions=[Message(partition=0, fetch_offset=3, partition_max_bytes=9)])]
    frame = encode_request(Message(request_api_key=1, request_api_version=4, correlation_id=1, client_id=None), top)
    view = decode_fetch_request(frame)
    assert (view.session_id, view.session_epoch, view.rack_id, view.cluster_id) == (0, -1, "", None)
    assert encode_fetch_request(view, 5, 6, view.partitions(), [("t", 1)]) == frame


@pytest.mark.parametrize("version", [7, 13])
def test_bad_keys_and_values_raise_codec_error(version: int) -> None:
    body = struct_for(request_spec(1), version).default()
    frame = encode_request(Message(request_api_key=1, request_api_version=version, correlation_id=1,
                                   client_id="c"), body)
    view = decode_fetch_request(frame)
    wrong_topic = "t" if version >= 13 else b"\x01" * 16
    with pytest.raises(CodecError):
        encode_fetch_request(view, 0, -1, {(wrong_topic, 0): FetchParams(1)}, [])
    with pytest.raises(CodecError):
        encode_fetch_request(view, 0, -1, {}, [(wrong_topic, 0)])
    good_topic = b"\x01" * 16 if version >= 13 else "t"
    with pytest.raises(CodecError):
        encode_fetch_request(view, 0, -1, {(good_topic, 0): FetchParams(2**63)}, [])
    with pytest.raises(CodecError):
        encode_fetch_request(view, 2**31, -1, {}, [])


def test_other_apis_and_versions_are_rejected() -> None:
    produce = next((GOLDEN[0].parent).glob("Produce-v*-request-*.bin")).read_bytes()
    with pytest.raises(CodecError):
        decode_fetch_request(produce)
    frame = bytearray(GOLDEN[0].read_bytes())
    frame[2:4] = (19).to_bytes(2, "big")
    with pytest.raises(CodecError):
        decode_fetch_request(frame)
    with pytest.raises(CodecError):
        decode_fetch_request(b"")


# --------------------------------------------------------------------------------------- changed_partitions


def _offsets_st(version: int) -> st.SearchStrategy[dict[PartitionKey, FetchParams]]:
    """A request's partitions (fixed layout: no tagged fields), a few topics, in order."""
    return st.dictionaries(st.tuples(st.sampled_from(_IDS if version >= 13 else _NAMES), st.integers(0, 40)),
                           _PARAMS, min_size=1, max_size=40)


def _frame(version: int, parts: dict[PartitionKey, FetchParams], corr: int, max_bytes: int = 1 << 20) -> bytes:
    """A session-less consumer Fetch listing ``parts`` (consecutive partitions of a topic in one entry)."""
    header = Message(request_api_key=1, request_api_version=version, correlation_id=corr, client_id="c")
    base = decode_fetch_request(encode_request(header, request_codec(1, version).default().replace(
        max_wait_ms=500, min_bytes=1, max_bytes=max_bytes, **({"replica_id": -1} if version < 15 else {}))))
    return encode_fetch_request(base, 0, -1, parts, [])


@pytest.mark.parametrize("version", VERSIONS)
def test_a_request_read_against_its_baseline_equals_a_full_decode(version: int) -> None:
    """A request listing the baseline's partitions (in any order: librdkafka rotates its list) with some of
    their fields changed is read against the baseline: exactly the partitions whose fields differ from the
    baseline's, with the fields a full decode gives, and a view that re-encodes to the request; any other
    difference gives None."""

    @SETTINGS
    @given(_offsets_st(version), st.data())
    def check(parts: dict[PartitionKey, FetchParams], data: st.DataObject) -> None:
        before = _frame(version, parts, corr=1)
        keys = list(parts)
        turn = data.draw(st.integers(0, len(keys) - 1))
        edited = {k: parts[k] for k in keys[turn:] + keys[:turn]}  # rotated
        for key in data.draw(st.lists(st.sampled_from(keys), max_size=5)):
            edited[key] = data.draw(_PARAMS)
        kind = data.draw(st.sampled_from(["same partitions", "max_bytes", "partition added", "partition removed"]))
        if kind == "max_bytes":
            after = _frame(version, edited, corr=2, max_bytes=7)
        elif kind == "partition added":
            after = _frame(version, {**edited, (keys[-1][0], 1000): FetchParams(1)}, corr=2)
        elif kind == "partition removed" and len(keys) > 1:
            after = _frame(version, {k: v for k, v in edited.items() if k != keys[0]}, corr=2)
        else:
            kind = "same partitions"
            after = _frame(version, edited, corr=2)
        result = Baseline(decode_fetch_request(before), before).read(after)
        if kind != "same partitions":
            assert result is None
            return
        assert result is not None
        view, differing = result
        full = decode_fetch_request(after)
        assert set(differing) == {k for k, p in edited.items() if _written(p, version) != _written(parts[k], version)}
        assert all(differing[k] == full.partitions()[k] for k in differing)
        assert view.correlation_id == 2 and view.header == after[: len(view.header)]
        assert encode_fetch_request(view, 0, -1, full.partitions(), []) == after

    check()


def _written(p: FetchParams, version: int) -> tuple[int, ...]:
    """The fields ``version`` writes (older versions have fewer): params that encode alike compare equal."""
    return (p.fetch_offset, p.partition_max_bytes, p.log_start_offset if version >= 5 else -1,
            p.current_leader_epoch if version >= 9 else -1, p.last_fetched_epoch if version >= 12 else -1)
