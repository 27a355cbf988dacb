"""What a member sharing a partition receives (proxy/policies/sharing/fetch.py over proxy/wire/record_filter.py):
the records of its key slice only, every batch kept with its offsets, timestamps, producer fields and codec,
CRC-32C valid; no batch left without records ever sent; control batches untouched; committed work left out; the
gaps the read-ahead cursor moves fetches past; the decoded-batch cache."""

from __future__ import annotations

import pytest

from proxy.policies.sharing.fetch import BatchCache, filter_records
from proxy.policies.sharing.frontier import Frontier
from proxy.policies.sharing.keys import WHOLE, Slice, key_hash
from proxy.wire.errors import CodecError
from proxy.wire.record_filter import parse_batch, record_at
from proxy.wire.records import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    CONTROL_MASK,
    HEADER_SIZE,
    TRANSACTIONAL_MASK,
    BatchHeader,
    Record,
    decode_batches,
    encode_batch,
    iter_batches,
    new_batch,
    rebuild_batch,
)

CODECS = {"none": COMPRESSION_NONE, "gzip": COMPRESSION_GZIP, "snappy": COMPRESSION_SNAPPY, "lz4": COMPRESSION_LZ4,
          "zstd": COMPRESSION_ZSTD}


def records(n: int, first: int = 0) -> list[Record]:
    return [Record(offset_delta=i, timestamp_delta=10 * i, key=None if i % 9 == 4 else b"key-%d" % ((first + i) % 13),
                   value=b"value-%d" % (first + i), headers=[("h", b"%d" % i)] if i % 2 else [])
            for i in range(n)]


def batch(base: int, n: int, compression: int = COMPRESSION_NONE, attributes: int = 0) -> bytes:
    return encode_batch(new_batch(records(n, base), base_offset=base, base_timestamp=1_700_000_000_000 + base,
                                  compression=compression, attributes=attributes, producer_id=42, producer_epoch=3,
                                  base_sequence=base))


def in_slice(key: bytes | None, s: Slice) -> bool:
    return s.holds(key_hash(key))


@pytest.mark.parametrize("codec", list(CODECS))
def test_each_slice_gets_its_keys_and_batches_keep_their_fields(codec: str) -> None:
    data = batch(100, 30, CODECS[codec]) + batch(130, 20, CODECS[codec])
    original = decode_batches(data)
    received: list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]], int]] = []
    for s in (Slice(0, 4), Slice(1, 4), Slice(2, 4), Slice(3, 4)):
        out = filter_records(memoryview(data), s, None, BatchCache(0), "t", 0)
        assert out.changed and out.other_slice > 0
        got = decode_batches(out.records)  # every CRC-32C verified
        # batches left empty are left out, but the client still moves past the end: the last batch reaches it
        assert not got or got[-1].last_offset == original[-1].last_offset
        assert all(b.records for b in got)  # never a batch without records
        by_base = {o.base_offset: o for o in original}
        for b in got:
            o = by_base[b.base_offset]
            assert b.attributes & 0x07 == CODECS[codec]  # the same codec
            assert (b.base_offset, b.base_timestamp, b.max_timestamp, b.producer_id,
                    b.producer_epoch, b.base_sequence) == (o.base_offset, o.base_timestamp,
                                                           o.max_timestamp, o.producer_id, o.producer_epoch,
                                                           o.base_sequence)
            assert b.last_offset == o.last_offset or b is got[-1]
            for r in b.records:
                assert in_slice(r.key, s)
                received.append((b.base_offset + r.offset_delta, r.key, r.value, r.headers,
                                 b.base_timestamp + r.timestamp_delta))
    # the three slices together: every record once, unchanged (offset, key, value, headers, timestamp)
    expected = [(o.base_offset + r.offset_delta, r.key, r.value, r.headers, o.base_timestamp + r.timestamp_delta)
                for o in original for r in o.records]
    assert sorted(received, key=lambda x: x[0]) == expected


def test_batches_left_without_records_are_left_out_and_their_offsets_are_a_gap() -> None:
    """No client reads a batch emptied of its records as Kafka means it (kafka-go reads a record from every batch,
    librdkafka reports a partition whose records hold no message too large to fetch): a partition whose batches
    all hold other slices' records goes out with none, and the offsets read are a gap the member's next fetch
    starts past (the read-ahead cursor), with the leader epoch of the batch before that fetch's offset."""
    keys = [k for k in (b"k%d" % i for i in range(40)) if in_slice(k, Slice(0, 2))][:3]
    data = b"".join(encode_batch(new_batch([Record(key=k, value=b"v")], base_offset=10 + i, partition_leader_epoch=e))
                    for i, (k, e) in enumerate(zip(keys, (3, 3, 4), strict=True)))
    out = filter_records(memoryview(data), Slice(1, 2), None, BatchCache(0), "t", 0)
    assert out.changed and bytes(out.records) == b"" and out.other_slice == 3
    assert out.gaps == [(10, 13, 4)]


def test_batches_left_empty_are_left_out_and_the_last_kept_one_reaches_the_end() -> None:
    """An empty batch never goes out: a batch that keeps records has its offset range stretched over the empty
    ones after it (compaction's shape), those between two kept ones are simply left out; the gaps are the offsets
    between the member's records."""
    data = b"".join(batch(10 + i, 1) for i in range(8))  # one record per batch
    keys = [r.key for b in decode_batches(data) for r in b.records]
    for s in (Slice(0, 2), Slice(1, 2)):
        mine = [i for i, k in enumerate(keys) if in_slice(k, s)]
        assert mine and len(mine) < 8  # each slice has some records, not all
        out = filter_records(memoryview(data), s, None, BatchCache(0), "t", 0)
        got = decode_batches(out.records)
        assert [b.base_offset for b in got] == [10 + i for i in mine]  # no empty batch: one per record kept
        assert got[-1].last_offset == 17 and all(len(b.records) == 1 for b in got)
        assert [b.base_offset + b.records[0].offset_delta for b in got] == [10 + i for i in mine]
        ends = [10 + i for i in mine] + [18]
        starts = [10] + [10 + i + 1 for i in mine]
        assert [(a, b) for a, b, _ in out.gaps] == [(a, b) for a, b in zip(starts, ends, strict=True) if b > a]


@pytest.mark.parametrize("codec", list(CODECS))
def test_a_filtered_batch_stretched_over_empty_ones_counts_the_records_it_holds(codec: str) -> None:
    """A batch that keeps some of its records, then batches left with none: the kept batch's range is stretched
    to the end, and its RecordsCount is that of the records it holds (found by the aiokafka six-consumer test:
    the broker's count went out with the filtered records, and two consumers read past the batch's end)."""
    s = Slice(0, 2)
    mine = [b"k%d" % i for i in range(40) if in_slice(b"k%d" % i, s)][:2]
    other = [b"k%d" % i for i in range(40) if not in_slice(b"k%d" % i, s)][:3]
    first = encode_batch(new_batch([Record(offset_delta=i, key=k, value=b"v%d" % i)
                                    for i, k in enumerate([mine[0], other[0], mine[1]])],
                                   base_offset=10, compression=CODECS[codec]))
    rest = b"".join(encode_batch(new_batch([Record(key=k, value=b"w")], base_offset=13 + i))
                    for i, k in enumerate(other[1:]))
    out = filter_records(memoryview(first + rest), s, None, BatchCache(0), "t", 0)
    (got,) = decode_batches(out.records)  # every CRC-32C verified, every record read to the batch's end
    assert [(got.base_offset + r.offset_delta, r.key) for r in got.records] == [(10, mine[0]), (12, mine[1])]
    assert got.last_offset == 14  # the client fetches on past the empty batches
    (header,) = iter_batches(out.records)
    assert header.records_count == 2


def test_control_and_transactional_batches() -> None:
    control = encode_batch(new_batch([Record(key=b"\x00\x00\x00\x01", value=b"\x00\x00\x00\x00\x00\x05")],
                                     base_offset=20, attributes=CONTROL_MASK | TRANSACTIONAL_MASK, producer_id=42))
    txn = batch(10, 10, attributes=TRANSACTIONAL_MASK)
    data = txn + control
    out = filter_records(memoryview(data), Slice(0, 2), None, BatchCache(0), "t", 0)
    _, kept_control = list(iter_batches(out.records))
    assert bytes(out.records[kept_control.start : kept_control.end]) == control  # untouched, byte for byte
    (b, c) = decode_batches(out.records)
    assert b.is_transactional and b.producer_id == 42 and c.is_control


def test_committed_work_is_left_out() -> None:
    data = batch(100, 30)
    # an earlier layout of 2 slices: slice 0/2 committed up to 120, slice 1/2 up to 105
    f = Frontier(100, {Slice(0, 2): 120, Slice(1, 2): 105})
    out = filter_records(memoryview(data), WHOLE, f.done_table(WHOLE), BatchCache(0), "t", 0)
    got = [(b.base_offset + r.offset_delta, r.key) for b in decode_batches(out.records) for r in b.records]
    for offset, key in got:
        assert offset >= (120 if in_slice(key, Slice(0, 2)) else 105)
    expected = [(100 + r.offset_delta, r.key) for r in records(30, 100)
                if 100 + r.offset_delta >= (120 if in_slice(r.key, Slice(0, 2)) else 105)]
    assert got == expected and out.committed == 30 - len(expected)


def test_whole_partition_with_nothing_committed_above_is_not_decoded() -> None:
    data = memoryview(batch(100, 10))
    cache = BatchCache(1 << 20)
    out = filter_records(data, WHOLE, None, cache, "t", 0)
    assert not out.changed and out.records is data and len(cache) == 0


def test_cache_serves_the_other_members_of_a_partition() -> None:
    """Batches that must be decoded (several records, or compressed: a one-record gzip batch too) are decoded once;
    a batch of one uncompressed record is read in place once, its record's offset and key hash kept, no decoded
    entry."""
    lookups: list[tuple[int, int]] = []
    cache = BatchCache(1 << 20, on_lookup=lambda hits, misses: lookups.append((hits, misses)))
    data = memoryview(batch(100, 30, COMPRESSION_LZ4) + batch(130, 1, COMPRESSION_GZIP)
                      + b"".join(batch(131 + i, 1) for i in range(5)))
    filter_records(data, Slice(0, 2), None, cache, "t", 0)
    filter_records(data, Slice(1, 2), None, cache, "t", 0)
    assert lookups == [(0, 7), (7, 0)] and len(cache) == 2 and cache.bytes > 0


def test_cache_is_bounded() -> None:
    sizes: list[int] = []
    cache = BatchCache(20_000, on_change=sizes.append)
    for base in range(0, 1000, 50):
        filter_records(memoryview(batch(base, 50)), Slice(0, 2), None, cache, "t", 0)
    assert 0 < cache.bytes <= 20_000 and max(sizes) <= 20_000 and 1 < len(cache) < 20


def test_cache_of_one_record_batches_is_bounded() -> None:
    """What one-record batches read keep (offset and key hash per batch) counts towards the bound and is let go
    when past it; a batch changed under the same offset (another CRC) is read again."""
    sizes: list[int] = []
    cache = BatchCache(20_000, on_change=sizes.append)
    data = b"".join(batch(i, 1) for i in range(60))
    for base in range(0, 3000, 60):
        filter_records(memoryview(data), Slice(0, 2), None, cache, "t", base)  # a partition each
    assert cache.bytes <= 20_000 and 0 < max(sizes) <= 20_000 and min(sizes) == 0  # let go, then held again
    hits: list[int] = []
    cache = BatchCache(1 << 20, on_lookup=lambda h, m: hits.append(h))
    filter_records(memoryview(data), Slice(0, 2), None, cache, "t", 0)
    other = b"".join(encode_batch(new_batch([Record(key=b"other-%d" % i, value=b"v")], base_offset=i))
                     for i in range(60))
    out = filter_records(memoryview(other), Slice(0, 2), None, cache, "t", 0)
    assert hits == [0, 0]
    kept = [r.key for b in decode_batches(out.records) for r in b.records]
    assert kept == [b"other-%d" % i for i in range(60) if in_slice(b"other-%d" % i, Slice(0, 2))]


def test_truncated_tail_dropped_and_undecodable_batch_passed_through() -> None:
    good = batch(0, 5)
    corrupt = bytearray(batch(5, 5))
    corrupt[-1] ^= 0xFF  # the CRC no longer matches: the client reports it as it would from the broker
    data = good + bytes(corrupt) + batch(10, 5)[:40]
    out = filter_records(memoryview(data), Slice(0, 2), None, BatchCache(0), "t", 0)
    assert out.undecodable == 1
    headers = list(iter_batches(out.records))
    assert len(headers) == 2 and bytes(out.records[headers[1].start : headers[1].end]) == bytes(corrupt)
    assert headers[-1].end == len(out.records)  # no truncated tail


@pytest.mark.parametrize("codec", list(CODECS))
@pytest.mark.parametrize("count", [2, 3])
def test_one_record_batches_filter_as_decoding_them_does(codec: str, count: int) -> None:
    """A low-rate topic's record set (a batch per record, among a few batches of several records and a transaction
    marker), every codec: each slice gets exactly the records whose keys hash into it, every batch kept whole goes
    out byte for byte as it came (an uncompressed one is never written again, a compressed one is decompressed to
    read its key and, kept, sent as it came), the last one stretched to the end of what was read; the gaps are the
    offsets between the slice's records."""
    c = CODECS[codec]
    control = encode_batch(new_batch([Record(key=b"\x00\x00\x00\x01", value=b"\x00\x00\x00\x00\x00\x05")],
                                     base_offset=30, attributes=CONTROL_MASK | TRANSACTIONAL_MASK, producer_id=42))
    parts = [batch(i, 1, c) for i in range(30)] + [control] + [batch(31, 6, c)] + \
        [batch(37 + i, 1, c) for i in range(20)]
    data = b"".join(parts)
    original = {o.base_offset: o for o in decode_batches(data)}
    as_sent = {h.base_offset: data[h.start : h.end] for h in iter_batches(data)}
    received: list[int] = []
    for s in (Slice(i, count) for i in range(count)):
        out = filter_records(memoryview(data), s, None, BatchCache(1 << 20), "t", 0)
        got = decode_batches(out.records)  # every CRC-32C verified
        assert all(b.records for b in got if not b.is_control)
        # the member fetches on from 57: its last data batch reaches it, or the read-ahead cursor does (a gap)
        assert (got[-1].last_offset == 56 and not got[-1].is_control) or out.gaps[-1][1] == 57
        sent = {h.base_offset: bytes(out.records[h.start : h.end]) for h in iter_batches(out.records)}
        for b in got:
            if b.is_control:
                continue
            mine = [r for r in original[b.base_offset].records if in_slice(r.key, s)]
            assert [(r.offset_delta, r.key, r.value) for r in b.records] == \
                [(r.offset_delta, r.key, r.value) for r in mine]
            received += [b.base_offset + r.offset_delta for r in b.records]
            if len(mine) == len(original[b.base_offset].records) and b is not got[-1]:
                assert sent[b.base_offset] == as_sent[b.base_offset]
        mine_offsets = [original[o].base_offset + r.offset_delta for o in sorted(original)
                        if not original[o].is_control for r in original[o].records if in_slice(r.key, s)]
        assert [o for b in got if not b.is_control for o in (b.base_offset + r.offset_delta for r in b.records)] \
            == mine_offsets
        ends = [*mine_offsets, 57]
        starts = [0] + [o + 1 for o in mine_offsets]
        assert [(a, b) for a, b, _ in out.gaps] == [(a, b) for a, b in zip(starts, ends, strict=True) if b > a]
    assert sorted(received) == [o for o in range(57) if o != 30]  # every record once, the marker none


def _record_at(buf: bytes | memoryview, h: BatchHeader) -> tuple[int, bytes | None]:
    """record_at of the batch ``h`` locates in ``buf``, as filter_records calls it (once it has found the batch to
    hold one uncompressed record)."""
    return record_at(buf, h.start, h.end, h.base_offset, h.crc)


@pytest.mark.parametrize("key", [None, b"", b"k", b"x" * 300])
@pytest.mark.parametrize("value_size", [0, 40, 200, 20_000])  # the record's Length: a 1-, 2- or 3-byte varint
@pytest.mark.parametrize(("timestamp_delta", "offset_delta"), [(0, 0), (70_000, 0), (0, 5)])
def test_a_one_record_batch_is_read_in_place_as_parse_batch_reads_it(key: bytes | None, value_size: int,
                                                                     timestamp_delta: int, offset_delta: int) -> None:
    """A low-rate topic's batches hold one record each: read in place (no copy, no decode of the rest), from the
    record set as walked (the batch among others), the same offset and key as parse_batch finds; a corrupt one is
    refused alike (the client then gets it as it came)."""
    data = encode_batch(new_batch([Record(offset_delta=offset_delta, timestamp_delta=timestamp_delta, key=key,
                                          value=b"v" * value_size, headers=[("h", b"1")])],
                                  base_offset=1 << 33, base_timestamp=5))
    (h,) = iter_batches(data)
    parsed = parse_batch(data)
    assert _record_at(data, h) == (parsed.offsets[0], parsed.keys[0])
    around = batch(0, 3) + data + batch(50, 1)
    (_, inner, _) = iter_batches(around)
    assert _record_at(memoryview(around), inner) == (parsed.offsets[0], parsed.keys[0])
    corrupt = bytearray(data)
    corrupt[-1] ^= 0xFF
    with pytest.raises(CodecError):
        _record_at(bytes(corrupt), h)


@pytest.mark.parametrize(("value_size", "change"), [(40, "longer"), (40, "shorter"), (200, "longer"),
                                                    (200, "shorter"), (40, "key_past_end")])
def test_a_one_record_batch_whose_record_does_not_fill_it_is_refused(value_size: int, change: str) -> None:
    """A record whose Length (or key length) disagrees with its batch, under a valid CRC-32C (a writer's bug, not
    line noise), is refused as parse_batch refuses it: the batch then goes out as it came."""
    data = encode_batch(new_batch([Record(key=b"k", value=b"v" * value_size)], base_offset=7))
    (h,) = iter_batches(data)
    raw = bytearray(data[HEADER_SIZE:])
    if change == "key_past_end":
        size_bytes = 1 if raw[0] < 0x80 else 2
        raw[size_bytes + 3] = 0x7E  # key length 63: past the record's end (48 bytes)
    elif change == "longer":
        raw += b"\x00"
    else:
        raw = raw[:-1]
    bad = rebuild_batch(h, bytes(raw), 1)  # Length and CRC-32C made to match
    (bh,) = iter_batches(bad)
    with pytest.raises(CodecError):
        parse_batch(bad)
    with pytest.raises(CodecError):
        _record_at(bad, bh)

