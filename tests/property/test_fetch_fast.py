"""The Fetch fast path is proven equal to the construct reference codec, for every Fetch version (4-18).

For hypothesis-generated responses ``m`` (from the spec, with random unknown tagged fields at every level) and
``b = construct.encode(m)``:
- the fast path re-encodes ``b`` byte for byte (scatter buffers joined), with the right total length;
- its model converts to the very Message the construct codec decodes from ``b``, and back;
- policy edits (drop/reorder partitions, empty a record set, rewrite NodeEndpoints) made on both models encode
  to the same bytes;
- record sets are never copied: each non-empty one is emitted as a memoryview into the input.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.accesslog import KeptListing
from proxy.wire.fetch_fast import (
    EncodedTopics,
    FetchResponseView,
    NodeEndpoint,
    decode,
    decode_frame,
    encode_partition,
    top_head,
    top_tail,
    topic_head,
    topic_tail,
)
from proxy.wire.fetch_layout import PartitionKey, topic_key
from proxy.wire.messages import decode_response, encode_response, response_codec, response_spec
from proxy.wire.model import Message
from rig.fetch_oracle import from_message, to_message
from rig.specgen import message_strategy

VERSIONS = list(range(4, 19))
SETTINGS = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _strategy(version: int) -> st.SearchStrategy[Message]:
    return message_strategy(response_spec(1), version)


@pytest.mark.parametrize("version", VERSIONS)
def test_fast_path_equals_construct(version: int) -> None:
    codec = response_codec(1, version)

    @SETTINGS
    @given(_strategy(version))
    def check(msg: Message) -> None:
        data = codec.encode(msg)
        view = decode(memoryview(data), version)
        buffers, total = view.encode()
        assert b"".join(buffers) == data
        assert total == len(data)
        reference = codec.decode(data)
        assert to_message(view) == reference
        again = from_message(reference, version)
        assert again == view
        assert again.to_bytes() == data
        # zero copy: every non-empty record set is emitted as the very memoryview the decoder made
        emitted = {id(b) for b in buffers}
        for _, p in view.partitions():
            if p.records is not None and len(p.records) > 0:
                assert isinstance(p.records, memoryview)
                assert p.records.obj is data
                assert id(p.records) in emitted

    check()


@pytest.mark.parametrize("version", VERSIONS)
def test_policy_edits_match_construct(version: int) -> None:
    codec = response_codec(1, version)

    @SETTINGS
    @given(_strategy(version), st.randoms(use_true_random=False))
    def check(msg: Message, rnd: random.Random) -> None:
        data = codec.encode(msg)
        view = decode(data, version)
        ref = codec.decode(data)
        for t_view, t_ref in zip(view.topics, ref.responses, strict=True):
            keep = [i for i in range(len(t_view.partitions)) if rnd.random() < 0.7]
            rnd.shuffle(keep)
            t_view.partitions = [t_view.partitions[i] for i in keep]
            t_ref.partitions = [t_ref.partitions[i] for i in keep]
            for p_view, p_ref in zip(t_view.partitions, t_ref.partitions, strict=True):
                if rnd.random() < 0.3:
                    p_view.records = b""
                    p_ref.records = b""
                if rnd.random() < 0.3:
                    p_view.high_watermark = p_ref.high_watermark = rnd.randrange(2**40)
        if version >= 16 and rnd.random() < 0.5:
            view.node_endpoints = [NodeEndpoint(1, "proxy.local", 19092, None), NodeEndpoint(2, "p2", 1, "r")]
            ref.node_endpoints = [Message(node_id=1, host="proxy.local", port=19092, rack=None),
                                  Message(node_id=2, host="p2", port=1, rack="r")]
        assert view.to_bytes() == codec.encode(ref)

    check()


def test_node_endpoints_decoded_and_rewritten() -> None:
    codec = response_codec(1, 16)
    msg = codec.default()
    msg.node_endpoints = [Message(node_id=3, host="broker-3.internal", port=9092, rack="a")]
    view = decode(codec.encode(msg), 16)
    assert view.node_endpoints == [NodeEndpoint(3, "broker-3.internal", 9092, "a")]
    view.node_endpoints[0].host = "127.0.0.1"
    view.node_endpoints[0].port = 40003
    out = codec.decode(view.to_bytes())
    assert out.node_endpoints == [Message(node_id=3, host="127.0.0.1", port=40003, rack="a")]


@pytest.mark.parametrize("version", [4, 11, 12, 16])
def test_frame_roundtrip(version: int) -> None:
    codec = response_codec(1, version)
    msg = codec.default()
    msg.responses = [Message(**({"topic": "t"} if version < 13 else {"topic_id": b"\x01" * 16}),
                             partitions=[])]
    header = Message(correlation_id=77)
    frame = encode_response(1, version, header, msg)
    corr, tags, view = decode_frame(frame, version)
    assert corr == 77
    assert tags is None
    buffers, total = view.encode_frame(corr)
    wire = b"".join(buffers)
    assert int.from_bytes(wire[:4], "big") == len(frame) == total - 4
    assert wire[4:] == frame


GOLDEN = sorted((Path(__file__).resolve().parents[1] / "data" / "golden").glob("Fetch-v*-response-*.bin"))


def test_golden_fetch_responses_exist() -> None:
    assert len(GOLDEN) >= 4


@pytest.mark.parametrize("path", GOLDEN, ids=[p.name for p in GOLDEN])
def test_golden_fetch_response(path: Path) -> None:
    """Responses of a real Kafka 4.1 broker: byte-exact through the fast path, same Message as construct."""
    version = int(path.name.split("-v")[1].split("-")[0])
    frame = path.read_bytes()
    corr, tags, view = decode_frame(frame, version)
    buffers, total = view.encode_frame(corr, tags)
    wire = b"".join(buffers)
    assert wire[4:] == frame and total == len(wire)
    header, body = decode_response(1, version, frame)
    assert header.correlation_id == corr
    assert to_message(view) == body


@pytest.mark.parametrize("version", VERSIONS)
def test_partition_by_partition_encoding_equals_the_full_encoder(version: int) -> None:
    """encode_partition and the framing helpers (the reference form of the layout the full encoders inline)
    write any response exactly as encode() does; a view carrying those pieces as its encoded topics writes the
    same bytes and decodes, when read, to the same topics."""
    codec = response_codec(1, version)

    @SETTINGS
    @given(_strategy(version))
    def check(msg: Message) -> None:
        view = decode(memoryview(codec.encode(msg)), version)
        pieces: list[bytes | bytearray | memoryview] = []
        errors: list[int] = []
        keys: list[PartitionKey] = []
        sizes: dict[PartitionKey, int] = {}
        for t in view.topics:
            topic = t.topic_id if version >= 13 else t.topic
            pieces.append(topic_head(version, topic, len(t.partitions)))
            for p in t.partitions:
                pieces.extend(encode_partition(version, p))
                if p.error_code:
                    errors.append(p.error_code)
                keys.append((topic_key(t), p.partition_index))
                if p.records_size:
                    sizes[keys[-1]] = sizes.get(keys[-1], 0) + p.records_size
            pieces.append(topic_tail(version, t.tags))
        assembled = top_head(view, len(view.topics)) + b"".join(pieces) + top_tail(view)
        assert assembled == view.to_bytes()
        lazy = FetchResponseView.from_encoded(version, view.throttle_time_ms, view.error_code, view.session_id,
                                              EncodedTopics(len(view.topics), pieces, errors, keys, sizes,
                                                            [topic_key(t) for t in view.topics]))
        lazy.node_endpoints, lazy.unknown_tags = view.node_endpoints, view.unknown_tags
        assert lazy.error_codes() == view.error_codes()
        assert lazy.records_size == view.records_size and lazy.encoded is not None  # answered undecoded
        if len(set(keys)) == len(keys):  # (a built response lists each partition once)
            # the access log's listing of it, from what it was built with (proxy/core/chain.py's _listing; topics
            # named by their keys here), is the decoded response's
            encoded = lazy.encoded
            named: dict[object, Any] = {t: t for t in encoded.topics}
            listing = KeptListing(encoded.partitions, named, encoded.record_sizes)
            assert listing.rows() == list(view.partition_sizes()) and lazy.encoded is not None
        assert lazy.to_bytes() == view.to_bytes()
        assert lazy.topics == view.topics and lazy.encoded is None  # read: decoded, an ordinary view now

    check()


@pytest.mark.parametrize("version", VERSIONS)
def test_copying_decode_equals_construct(version: int) -> None:
    """decode(copy_records=True), the decoder's form of the result (bench.codec's like-for-like path): the same
    Message as the construct codec, the same bytes re-encoded, every record set its own ``bytes``, and nothing
    tied to the caller's buffer (overwriting it changes nothing)."""
    codec = response_codec(1, version)

    @SETTINGS
    @given(_strategy(version))
    def check(msg: Message) -> None:
        data = codec.encode(msg)
        frame = bytearray(data)
        view = decode(memoryview(frame), version, copy_records=True)
        frame[:] = bytes(len(frame))  # the caller reuses its buffer
        assert to_message(view) == codec.decode(data)
        buffers, total = view.encode()
        assert b"".join(buffers) == data and total == len(data)
        for _, p in view.partitions():
            assert p.records is None or type(p.records) is bytes
        assert FetchResponseView.decode(data, version, copy_records=True) == decode(memoryview(data), version)

    check()


def _boundary_response(version: int) -> Message:
    """Record sets around every length the fast paths special-case (compact length 1 byte below 128, 2 below
    16384, 3 below 2**21, 4 above; int32 lengths before v12), null and empty ones between them,
    AbortedTransactions null, empty and not, and (v12+) partition tagged fields, in two topics."""
    codec = response_codec(1, version)
    sizes = [None, 0, 1, 126, 127, 128, 300, None, 16382, 16383, 16384, 70000, 0, 5, 2097150, 2097151, 2097150]
    topics = []
    for t in range(2):
        parts = []
        for i, size in enumerate(sizes):
            part = codec.default_of("responses", "partitions")
            part.partition_index = i
            part.high_watermark = 1 << 40 if i % 2 else i
            part.last_stable_offset = part.high_watermark
            part.log_start_offset = 7
            part.records = None if size is None else (bytes(range(256)) * (size // 256 + 1))[i : i + size]
            if i % 5 == 3:
                part.aborted_transactions = [Message(producer_id=9, first_offset=i)] * (1 + i % 3)
            elif i % 5 == 4:
                part.aborted_transactions = []
            else:
                part.aborted_transactions = None
            if version >= 12 and i % 4 == 1:
                part.diverging_epoch = Message(epoch=3, end_offset=100 + i)
            parts.append(part)
        topic = {"topic": f"t{t}"} if version < 13 else {"topic_id": bytes([t + 1]) * 16}
        topics.append(Message(**topic, partitions=parts))
    msg = codec.default()
    msg.responses = topics
    return msg


@pytest.mark.parametrize("version", VERSIONS)
def test_record_lengths_at_the_fast_paths_boundaries(version: int) -> None:
    """Each branch of the one-unpack decode and the one-pack encode (lengths, the AbortedTransactions array
    present or not, tags after records, partitions without records between others), lazy and copying: equal to
    the construct codec both ways."""
    codec = response_codec(1, version)
    data = codec.encode(_boundary_response(version))
    reference = codec.decode(data)
    for copy in (False, True):
        view = decode(memoryview(data), version, copy_records=copy)
        assert to_message(view) == reference
        buffers, total = view.encode()
        assert b"".join(buffers) == data and total == len(data)
