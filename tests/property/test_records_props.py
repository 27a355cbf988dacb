"""Record batches under hypothesis: decode(encode(b)) == b for random batches in every compression, the struct
walk agrees with the spec-based header decoder (proxy/codecs/RecordBatch.json), kafka-python's reader sees the
same records, the light walks (size limits, throttles) keep what the header walk finds, and the record filter's
fast path equals decoding, dropping records and encoding."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.memory_records import MemoryRecords

from proxy.wire.errors import CodecError
from proxy.wire.record_filter import keep_records, parse_batch
from proxy.wire.records import (
    COMPRESSION_MASK,
    CONTROL_MASK,
    HEADER_SIZE,
    Record,
    RecordBatch,
    batch_header_codec,
    complete_size,
    decode_batch,
    decode_batches,
    encode_batch,
    iter_batches,
    prefix_within,
)

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
NULLABLE = st.one_of(st.none(), st.binary(max_size=40))
TEXT = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=8)

records = st.builds(
    Record,
    offset_delta=INT32,
    timestamp_delta=INT64,
    key=NULLABLE,
    value=NULLABLE,
    headers=st.lists(st.tuples(TEXT, NULLABLE), max_size=3),
    attributes=st.integers(-128, 127),
)

batches = st.builds(
    RecordBatch,
    base_offset=INT64,
    partition_leader_epoch=INT32,
    # compression 0-4 in bits 0-2; every other bit (timestamp type, transactional, control, delete horizon,
    # unused) must survive
    attributes=st.tuples(st.integers(0, 4), st.integers(0, 2**12 - 1)).map(lambda t: (t[1] << 3 | t[0]) - (
        1 << 15 if (t[1] << 3 | t[0]) >= 1 << 15 else 0)),
    last_offset_delta=INT32,
    base_timestamp=INT64,
    max_timestamp=INT64,
    producer_id=INT64,
    producer_epoch=st.integers(-(2**15), 2**15 - 1),
    base_sequence=INT32,
    records=st.lists(records, max_size=5),
)


@SETTINGS
@given(batches)
def test_batch_round_trip(batch: RecordBatch) -> None:
    data = encode_batch(batch)
    decoded = decode_batch(data)
    assert decoded == batch
    assert encode_batch(decoded) == data


@SETTINGS
@given(st.lists(batches, min_size=1, max_size=3), st.integers(0, 200))
def test_walk_equals_spec_decoder(items: list[RecordBatch], cut: int) -> None:
    datas = [encode_batch(b) for b in items]
    buf = b"".join(datas)
    buf = buf[: max(0, len(buf) - cut)]
    headers = list(iter_batches(memoryview(buf)))
    for header in headers:
        spec = batch_header_codec().decode(buf[header.start : header.start + HEADER_SIZE])
        assert {k: getattr(header, k) for k in spec.fields()} == spec.fields()
    assert len(decode_batches(buf)) == len(headers)


@SETTINGS
@given(st.lists(batches, max_size=4), st.integers(0, 200), st.booleans(), st.binary(max_size=30), st.data())
def test_light_walks_equal_the_header_walk(items: list[RecordBatch], cut: int, at_least_one: bool, noise: bytes,
                                          data: st.DataObject) -> None:
    """prefix_within and complete_size read only Length and Magic; they keep what iter_batches finds: whole
    batches within ``allowed`` (the first whatever its size with ``at_least_one``), never a truncated tail, and
    the same CodecError for a corrupt header (noise after the batches)."""
    buf = b"".join(encode_batch(b) for b in items)
    buf = buf[: max(0, len(buf) - cut)] + noise
    try:
        ends = [h.end for h in iter_batches(memoryview(buf))]
    except CodecError as e:
        for walk in (lambda: complete_size(buf), lambda: prefix_within(buf, 1 << 62, at_least_one)):
            with pytest.raises(CodecError) as got:
                walk()
            assert str(got.value) == str(e)
        return
    assert complete_size(buf) == (ends[-1] if ends else 0)
    # a budget at a batch's end, either side of it, or anywhere
    allowed = data.draw(st.one_of(st.integers(0, len(buf) + 1),
                                  st.sampled_from([0, *ends]).flatmap(lambda e: st.sampled_from([e - 1, e, e + 1]))))
    # ends grow, so the batches that fit are a prefix
    kept = max((e for i, e in enumerate(ends) if e <= allowed or (at_least_one and i == 0)), default=0)
    assert prefix_within(buf, allowed, at_least_one) == kept


@SETTINGS
@given(st.lists(records.filter(lambda r: r.attributes == 0), max_size=5),
       st.integers(0, 2**40), st.sampled_from([0, 1]))
def test_kafka_python_reads_what_sluice_writes(recs: list[Record], base: int, compression: int) -> None:
    # only uncompressed and gzip: kafka-python has no other codec here (test_records.py covers them with
    # shims)
    batch = RecordBatch(base_offset=base, base_timestamp=10**12, max_timestamp=10**12, attributes=compression,
                        records=recs, last_offset_delta=max((r.offset_delta for r in recs), default=0))
    kp = MemoryRecords(encode_batch(batch)).next_batch()
    assert kp.validate_crc()
    got = [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in kp]
    want = [(base + r.offset_delta, 10**12 + r.timestamp_delta, r.key, r.value, r.headers) for r in recs]
    assert got == want


@SETTINGS
@given(batches.filter(lambda b: not b.attributes & CONTROL_MASK), st.data())
def test_keep_records_equals_decode_drop_encode(batch: RecordBatch, data: st.DataObject) -> None:
    """The record filter's fast path (proxy/wire/record_filter.py) equals the reference: decode_batch, drop
    records, encode_batch (byte for byte when uncompressed: cramjam's compressors are not the Java client's)."""
    raw = encode_batch(batch)
    parsed = parse_batch(raw)
    assert parsed.keys == [r.key for r in batch.records]
    assert parsed.offsets == [batch.base_offset + r.offset_delta for r in batch.records]
    kept = sorted(data.draw(st.sets(st.integers(0, 4)))) if batch.records else []
    kept = [i for i in kept if i < len(batch.records)]
    out = keep_records(parsed, kept)
    reference = decode_batch(raw)
    reference.records = [reference.records[i] for i in kept]
    if batch.attributes & COMPRESSION_MASK == 0:
        assert out == encode_batch(reference)
    got = decode_batch(out)  # CRC-32C verified
    assert got.records == reference.records
    # a batch left empty is uncompressed (every client decodes that; not every codec's empty stream)
    attributes = batch.attributes if kept else batch.attributes & ~COMPRESSION_MASK
    assert (got.base_offset, got.last_offset_delta, got.base_timestamp, got.max_timestamp, got.attributes,
            got.producer_id, got.producer_epoch, got.base_sequence, got.partition_leader_epoch) == (
        batch.base_offset, batch.last_offset_delta, batch.base_timestamp, batch.max_timestamp, attributes,
        batch.producer_id, batch.producer_epoch, batch.base_sequence, batch.partition_leader_epoch)
