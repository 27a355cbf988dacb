"""The streaming Fetch walk (proxy/wire/fetch_stream.py) watched by policies: every version Sluice reads, cut at
every byte, passes every byte unchanged (but a raised throttle_time_ms) and notes each partition as the decoded
view reads it."""

from __future__ import annotations

import random
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.wire.errors import CodecError
from proxy.wire.fetch_fast import AbortedTransaction, FetchPartition, FetchResponseView, FetchTopic, decode_frame
from proxy.wire.fetch_fast import decode as fast_decode
from proxy.wire.fetch_layout import FIRST_TOPIC_ID, MAX_VERSION, MIN_VERSION, topic_key
from proxy.wire.fetch_stream import FetchStreamer, SeenPartition
from proxy.wire.messages import response_codec, response_spec
from proxy.wire.model import Message
from proxy.wire.records import Record, complete_size, encode_batch, new_batch
from rig.specgen import message_strategy

VERSIONS = range(MIN_VERSION, MAX_VERSION + 1)


def batch(base: int, records: int = 1, value: int = 20) -> bytes:
    return encode_batch(new_batch([Record(offset_delta=i, value=b"v" * value) for i in range(records)],
                                  base_offset=base))


def response(version: int, throttle_ms: int = 0) -> FetchResponseView:
    """Idle, null, one-batch, many-batch, truncated-tail, aborted-transaction and corrupt partitions in two
    topics."""
    two = batch(10, 3) + batch(13, 1, 300)
    truncated = batch(40) + batch(41, 2)[:25]
    corrupt = batch(7) + struct.pack(">qi", 8, 3) + b"\x00" * 20  # Length 3: below any record's overhead
    ids = version >= FIRST_TOPIC_ID
    topics = [
        FetchTopic("" if ids else "orders", bytes(range(16)) if ids else bytes(16), [
            FetchPartition(0, high_watermark=5, records=b""),
            FetchPartition(1, high_watermark=14, records=two,
                           aborted_transactions=[AbortedTransaction(3, 11), AbortedTransaction(4, 12)]),
            FetchPartition(2, error_code=6, high_watermark=-1, records=None),
            FetchPartition(3, high_watermark=99, records=truncated),
        ]),
        FetchTopic("" if ids else "payments-\u00e9", bytes(range(16, 32)) if ids else bytes(16), [
            FetchPartition(7, high_watermark=20, records=batch(19)),
            FetchPartition(8, high_watermark=30, records=corrupt),
            FetchPartition(9, high_watermark=1, records=batch(0)[:9]),
        ]),
    ]
    return FetchResponseView(version, throttle_time_ms=throttle_ms, error_code=0, session_id=0, topics=topics)


def body_of(view: FetchResponseView) -> bytes:
    """What the streamer is fed: the frame after its size prefix and correlation id."""
    buffers, _ = view.encode_frame(1234)
    return b"".join(bytes(b) for b in buffers)[8:]


def expected(view: FetchResponseView) -> list[SeenPartition]:
    """The partitions as the decoded view reads them (what the collected path's policies see)."""
    out = []
    for t in view.topics:
        for p in t.partitions:
            records = bytes(p.records or b"")
            try:
                complete = complete_size(records)
            except CodecError:
                complete = len(records)
            first = struct.unpack_from(">q", records)[0] if len(records) >= 8 else None
            out.append(SeenPartition(topic_key(t), p.partition_index, p.error_code, p.high_watermark, len(records),
                                     complete, first))
    return out


def walk(version: int, body: bytes, cuts: list[int], floor: int = 0) -> tuple[bytes, FetchStreamer]:
    s = FetchStreamer(version, len(body))
    s.watch(floor)
    out = bytearray()
    prev = 0
    for cut in [*cuts, len(body)]:
        for b in s.feed(body[prev:cut]):
            out += b
        prev = cut
    return bytes(out), s


@pytest.mark.parametrize("version", VERSIONS)
def test_every_byte_boundary_gives_the_decoded_partitions(version: int) -> None:
    view = response(version)
    body = body_of(view)
    decoded = decode_frame(b"\x00" * 4 + body, version)[2]  # the wire's own reading agrees with the view
    want = expected(decoded)
    assert want == expected(view)
    assert [s.complete_size for s in want] == [0, len(view.topics[0].partitions[1].records or b""), 0,
                                              len(batch(40)), len(batch(19)), len(batch(7)) + 32, 0]
    one, s = walk(version, body, list(range(1, len(body))))  # byte by byte
    assert one == body and s.seen == want and not s.changed
    for split in range(len(body) + 1):  # every cut in two
        out, s = walk(version, body, [split])
        assert out == body and s.seen == want, split


@pytest.mark.parametrize("version", VERSIONS)
def test_random_chunkings(version: int) -> None:
    view = response(version, throttle_ms=7)
    body = body_of(view)
    want = expected(view)
    rnd = random.Random(version)
    for _ in range(200):
        cuts = sorted(rnd.sample(range(1, len(body)), rnd.randint(1, 12)))
        out, s = walk(version, body, cuts)
        assert out == body and s.seen == want and s.throttle_time_ms == 7


@pytest.mark.parametrize("version", [4, 7, 11, 12, 16])
def test_throttle_time_raised_never_lowered(version: int) -> None:
    view = response(version, throttle_ms=50)
    body = body_of(view)
    for split in range(len(body) + 1):
        out, s = walk(version, body, [split], floor=120)
        assert decode_frame(b"\x00" * 4 + out, version)[2].throttle_time_ms == 120
        assert out != body and s.throttle_time_ms == 50 and len(out) == len(body)
        rest = expected(view)
        assert s.seen == rest
    out, s = walk(version, body, [3], floor=20)  # the broker's larger time wins
    assert out == body


@pytest.mark.parametrize("version", [4, 11, 12, 18])
def test_malformed_ends_are_codec_errors(version: int) -> None:
    body = body_of(response(version))
    with pytest.raises(CodecError):
        walk(version, body[:-3] + b"", [])  # the size says fewer bytes: it ends inside a partition
    padded = body + b"\x00\x00"
    with pytest.raises(CodecError):
        walk(version, padded, [10])  # bytes after the end of the response


@pytest.mark.parametrize("version", VERSIONS)
def test_any_response_cut_anywhere(version: int) -> None:
    """Generated responses of every version (records of random bytes: corrupt, truncated or whole batches alike):
    the walk sees what the decoded view reads, the broker's throttle time and error code too."""
    codec = response_codec(1, version)

    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                     HealthCheck.data_too_large])
    @given(message_strategy(response_spec(1), version), st.lists(st.integers(0, 10**6), max_size=8))
    def check(msg: Message, cuts: list[int]) -> None:
        body = codec.encode(msg)
        data = (b"\x00" if version >= 12 else b"") + body  # the response header's tag section (v12+) comes first
        out, s = walk(version, data, sorted(c % (len(data) + 1) for c in cuts))
        view = fast_decode(body, version)
        assert out == data and s.seen == expected(view)
        assert (s.throttle_time_ms, s.error_code) == (view.throttle_time_ms, view.error_code)

    check()
