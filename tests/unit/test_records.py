"""Record batches (magic 2): compression, CRC-32C, truncated tails, control batches, and interoperability
with an independent implementation (kafka-python's record builder and reader) and real producers (golden)."""

from __future__ import annotations

import struct
import types
from pathlib import Path

import cramjam
import kafka.codec
import kafka.record.default_records as kp_default
import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords, MemoryRecordsBuilder

from proxy.wire import records as R
from proxy.wire.errors import CodecError
from proxy.wire.messages import decode_request, decode_response
from proxy.wire.records import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    CONTROL_MASK,
    TRANSACTIONAL_MASK,
    Record,
    RecordBatch,
    batch_header_codec,
    complete_size,
    control_record_type,
    decode_batch,
    decode_batches,
    encode_batch,
    iter_batches,
    new_batch,
    prefix_within,
    walk_batches,
)

CODECS = [COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_SNAPPY, COMPRESSION_LZ4, COMPRESSION_ZSTD]
IDS = ["none", "gzip", "snappy", "lz4", "zstd"]


def sample_records(n: int = 20, value_size: int = 200) -> list[Record]:
    out = []
    for i in range(n):
        key = None if i % 7 == 3 else b"key-%d" % i
        value = None if i % 11 == 5 else bytes((i * 31 + j) % 13 for j in range(value_size))  # compressible
        headers: list[tuple[str, bytes | None]] = [("trace", b"t%d" % i), ("empty", None)] if i % 2 else []
        out.append(Record(offset_delta=i, timestamp_delta=i * 5, key=key, value=value, headers=headers))
    return out


@pytest.fixture
def kafka_python_codecs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Give kafka-python snappy/lz4/zstd through cramjam (only gzip is built in). kafka-python's own xerial
    framing code (kafka.codec.snappy_encode/_decode) still does the framing, independently of Sluice."""
    snappy = types.SimpleNamespace(
        compress=lambda data: bytes(cramjam.snappy.compress_raw(bytes(data))),
        decompress=lambda data: bytes(cramjam.snappy.decompress_raw(bytes(data))),
    )
    monkeypatch.setattr(kafka.codec, "snappy", snappy)
    monkeypatch.setattr(kafka.codec, "lz4", types.SimpleNamespace())
    monkeypatch.setattr(kafka.codec, "zstd", types.SimpleNamespace())
    monkeypatch.setattr(kp_default, "lz4_encode", lambda d: bytes(cramjam.lz4.compress(bytes(d))))
    monkeypatch.setattr(kp_default, "lz4_decode", lambda d: bytes(cramjam.lz4.decompress(bytes(d))))
    monkeypatch.setattr(kp_default, "zstd_encode", lambda d: bytes(cramjam.zstd.compress(bytes(d))))
    monkeypatch.setattr(kp_default, "zstd_decode", lambda d: bytes(cramjam.zstd.decompress(bytes(d))))


# --------------------------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("compression", CODECS, ids=IDS)
def test_each_compression_round_trips(compression: int) -> None:
    batch = new_batch(sample_records(), base_offset=1000, base_timestamp=1_700_000_000_000,
                      compression=compression)
    data = encode_batch(batch)
    assert data[R.MAGIC_OFFSET] == 2
    decoded = decode_batch(data)
    assert decoded == batch
    assert decoded.compression == compression
    assert encode_batch(decoded) == data
    if compression:
        assert len(data) < len(encode_batch(new_batch(sample_records(), compression=0)))


def test_new_batch_fields() -> None:
    batch = new_batch(sample_records(5), base_offset=10, base_timestamp=100)
    assert batch.last_offset_delta == 4
    assert batch.max_timestamp == 120
    assert batch.last_offset == 14
    header = next(iter_batches(encode_batch(batch)))
    assert (header.base_offset, header.last_offset_delta, header.records_count) == (10, 4, 5)
    assert header.next_offset == 15


def test_empty_batch_round_trips() -> None:
    # compaction can leave a batch with no records (kept for producer state)
    batch = RecordBatch(base_offset=5, last_offset_delta=3, producer_id=9, producer_epoch=1, base_sequence=0)
    data = encode_batch(batch)
    assert len(data) == R.HEADER_SIZE
    assert decode_batch(data) == batch


def test_changed_records_are_recompressed() -> None:
    batch = new_batch(sample_records(), compression=COMPRESSION_ZSTD)
    decoded = decode_batch(encode_batch(batch))
    decoded.records[0].value = b"changed"
    again = decode_batch(encode_batch(decoded))
    assert again.records[0].value == b"changed"
    assert again.records[1:] == batch.records[1:]


# --------------------------------------------------------------------------------------------- CRC


def test_crc_is_crc32c_over_attributes_to_end() -> None:
    data = encode_batch(new_batch(sample_records(3)))
    stored = struct.unpack_from(">I", data, R.CRC_OFFSET)[0]
    assert stored == R.batch_crc(data)
    # PartitionLeaderEpoch (set by the broker) is outside the CRC
    changed = bytearray(data)
    struct.pack_into(">i", changed, 12, 42)
    assert decode_batch(bytes(changed)).partition_leader_epoch == 42


@pytest.mark.parametrize("compression", CODECS, ids=IDS)
def test_flipped_byte_detected(compression: int) -> None:
    data = bytearray(encode_batch(new_batch(sample_records(), compression=compression)))
    for pos in (R.ATTRIBUTES_OFFSET + 3, R.HEADER_SIZE + 5, len(data) - 1):
        bad = bytearray(data)
        bad[pos] ^= 0x01
        with pytest.raises(CodecError, match="CRC"):
            decode_batch(bytes(bad))


def test_crc_check_can_be_skipped() -> None:
    data = bytearray(encode_batch(new_batch([Record(0, 0, b"k", b"value")])))
    data[-3] ^= 0x20  # inside the value (then one byte: the header count 0): still parses
    with pytest.raises(CodecError, match="CRC"):
        decode_batch(bytes(data))
    batch = decode_batch(bytes(data), verify_crc=False)
    assert batch.records[0].value == b"valUe"


# --------------------------------------------------------------------------------------------- walking


def test_truncated_trailing_batch_is_reported_not_an_error() -> None:
    batches = [encode_batch(new_batch(sample_records(3), base_offset=i * 3)) for i in range(3)]
    full = b"".join(batches)
    for cut in range(len(full) + 1):
        part = memoryview(full)[:cut]
        walk = walk_batches(part)
        ends = [sum(len(b) for b in batches[: i + 1]) for i in range(3)]
        done = max([e for e in ends if e <= cut], default=0)
        assert walk.complete_size == done == complete_size(part)
        assert walk.truncated == cut - done
        assert [h.base_offset for h in walk.batches] == [i * 3 for i in range(len(walk.batches))]
        assert len(decode_batches(part)) == len(walk.batches)


def test_walk_does_not_copy_and_matches_spec_decoder() -> None:
    datas = [encode_batch(new_batch(sample_records(4), base_offset=100 * i, compression=c,
                                    producer_id=7, producer_epoch=2, base_sequence=i,
                                    partition_leader_epoch=3))
             for i, c in enumerate(CODECS)]
    buf = memoryview(b"".join(datas))
    start = 0
    for header, data in zip(iter_batches(buf), datas, strict=True):
        assert (header.start, header.end) == (start, start + len(data))
        start += len(data)
        spec = batch_header_codec().decode(data[: R.HEADER_SIZE])
        for name, value in spec.fields().items():
            assert getattr(header, name) == value, name


def test_invalid_sizes_and_magic_are_corrupt() -> None:
    data = bytearray(encode_batch(new_batch(sample_records(2))))
    small = bytearray(data)
    struct.pack_into(">i", small, 8, 13)  # below LegacyRecord.RECORD_OVERHEAD_V0
    with pytest.raises(CodecError, match="minimum"):
        list(iter_batches(small))
    bad_magic = bytearray(data)
    bad_magic[R.MAGIC_OFFSET] = 3
    with pytest.raises(CodecError, match="magic 3"):
        list(iter_batches(bad_magic))
    negative_magic = bytearray(data)
    negative_magic[R.MAGIC_OFFSET] = 0xFF
    with pytest.raises(CodecError, match="magic -1"):
        list(iter_batches(negative_magic))
    short_v2 = bytearray(data[:40])
    struct.pack_into(">i", short_v2, 8, 28)
    with pytest.raises(CodecError, match="v2 header"):
        list(iter_batches(short_v2))


@pytest.mark.parametrize("magic", [0, 1])
def test_legacy_entries_are_walked_not_decoded(magic: int) -> None:
    builder = LegacyRecordBatchBuilder(magic=magic, compression_type=0, batch_size=1 << 20)
    for i in range(3):
        builder.append(i, timestamp=1000 + i if magic else None, key=b"k", value=b"v%d" % i)
    data = bytes(builder.build())
    headers = list(iter_batches(data))
    assert [h.base_offset for h in headers] == [0, 1, 2]
    assert all(h.is_legacy and h.magic == magic and h.records_count == -1 for h in headers)
    if magic == 1:
        assert [h.base_timestamp for h in headers] == [1000, 1001, 1002]
    assert headers[-1].end == len(data)
    with pytest.raises(CodecError, match="only message format v2"):
        decode_batch(data[headers[0].start : headers[0].end])


@pytest.mark.parametrize("magic", [0, 1])
def test_budget_walk_crosses_from_v2_batches_to_legacy_entries_and_back(magic: int) -> None:
    """prefix_within reads v2 batches in its own loop and leaves anything else to the full framing rules: a log
    whose v2 batches are followed by legacy entries (an old segment) and v2 again is cut where the header walk
    puts batch ends, under every budget; a corrupt header after whole batches is the same CodecError."""
    builder = LegacyRecordBatchBuilder(magic=magic, compression_type=0, batch_size=1 << 20)
    for i in range(2):
        builder.append(i, timestamp=1000 + i if magic else None, key=b"k", value=b"v%d" % i)
    legacy = bytes(builder.build())
    v2 = [encode_batch(new_batch(sample_records(2), base_offset=i * 2)) for i in range(3)]
    data = v2[0] + v2[1] + legacy + v2[2]
    ends = [h.end for h in iter_batches(data)]
    assert len(ends) == 5
    for allowed in range(len(data) + 2):
        for at_least_one in (False, True):
            kept = max((e for i, e in enumerate(ends) if e <= allowed or (at_least_one and i == 0)), default=0)
            assert prefix_within(data, allowed, at_least_one) == kept
    for cut in range(len(data) + 1):
        assert complete_size(data[:cut]) == max((e for e in ends if e <= cut), default=0)
    corrupt = bytearray(data + v2[0])
    corrupt[len(data) + R.MAGIC_OFFSET] = 3
    with pytest.raises(CodecError, match="magic 3"):
        complete_size(corrupt)


# --------------------------------------------------------------------------------------------- control,
# transactions


def test_control_batch_passes_through_intact() -> None:
    # A COMMIT marker as the transaction coordinator writes it: ControlRecordType key (version 0, type 1) and
    # an
    # EndTransactionMarker value (version 0, coordinator epoch).
    marker = Record(0, 0, struct.pack(">hh", 0, 1), struct.pack(">hi", 0, 5), [])
    batch = new_batch([marker], base_offset=42, base_timestamp=1234, producer_id=1001, producer_epoch=3,
                      attributes=CONTROL_MASK | TRANSACTIONAL_MASK)
    data = encode_batch(batch)
    header = next(iter_batches(data))
    assert header.is_control and header.is_transactional
    decoded = decode_batch(data)
    assert decoded.is_control and decoded.is_transactional
    assert control_record_type(decoded.records[0]) == 1
    assert encode_batch(decoded) == data
    # kafka-python reads it as a control record
    kp_batch = MemoryRecords(data).next_batch()
    assert kp_batch.is_control_batch and kp_batch.is_transactional
    (record,) = list(kp_batch)
    assert record.commit


def test_transactional_attributes_and_unused_bits_preserved() -> None:
    batch = new_batch(sample_records(3), producer_id=2**40, producer_epoch=7, base_sequence=99,
                      attributes=TRANSACTIONAL_MASK | R.TIMESTAMP_TYPE_MASK | R.DELETE_HORIZON_MASK | 0x4000,
                      compression=COMPRESSION_LZ4)
    data = encode_batch(batch)
    decoded = decode_batch(data)
    flags = TRANSACTIONAL_MASK | R.TIMESTAMP_TYPE_MASK | R.DELETE_HORIZON_MASK | 0x4000
    assert decoded.attributes == flags | COMPRESSION_LZ4
    assert (decoded.producer_id, decoded.producer_epoch, decoded.base_sequence) == (2**40, 7, 99)
    assert encode_batch(decoded) == data


# --------------------------------------------------------------------------------------------- kafka-python


def _kp_build(compression: int, records: list[Record], *, base_timestamp: int = 1_700_000_000_000) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=compression, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 22)
    for r in records:
        builder.append(r.offset_delta, timestamp=base_timestamp + r.timestamp_delta, key=r.key, value=r.value,
                       headers=r.headers)
    return bytes(builder.build())


@pytest.mark.usefixtures("kafka_python_codecs")
@pytest.mark.parametrize("compression", CODECS, ids=IDS)
def test_kafka_python_batches_decode_identically(compression: int) -> None:
    records = sample_records(30, value_size=300)
    data = _kp_build(compression, records)
    batch = decode_batch(data)
    assert batch.compression == compression  # kafka-python falls back to none when compression does not pay
    assert batch.records == records
    assert batch.base_timestamp == 1_700_000_000_000
    assert batch.last_offset_delta == 29
    # unchanged, it re-encodes byte-exact, compressed payload included
    assert encode_batch(batch) == data
    kp = MemoryRecords(data).next_batch()
    assert batch.crc == kp.crc
    header = next(iter_batches(data))
    assert (header.records_count, header.crc, header.attributes) == (kp.records_count, kp.crc, kp.attributes)


@pytest.mark.usefixtures("kafka_python_codecs")
@pytest.mark.parametrize("compression", CODECS, ids=IDS)
def test_sluice_batches_read_by_kafka_python(compression: int) -> None:
    records = sample_records(30, value_size=300)
    data = encode_batch(new_batch(records, base_offset=500, base_timestamp=10_000, compression=compression))
    kp = MemoryRecords(data).next_batch()
    assert kp.validate_crc()
    assert kp.compression_type == compression
    got = list(kp)
    assert [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in got] == [
        (500 + r.offset_delta, 10_000 + r.timestamp_delta, r.key, r.value, r.headers) for r in records
    ]


@pytest.mark.usefixtures("kafka_python_codecs")
def test_memory_records_builder_record_set() -> None:
    builder = MemoryRecordsBuilder(magic=2, compression_type=COMPRESSION_GZIP, batch_size=1 << 20, offset=77)
    for i in range(10):
        builder.append(timestamp=5000 + i, key=b"k%d" % i, value=b"v" * 100, headers=[])
    builder.close()
    (batch,) = decode_batches(bytes(builder.buffer()))
    # kafka-python leaves BaseOffset 0 (the broker assigns offsets) and writes the offsets as deltas
    assert [batch.base_offset + r.offset_delta for r in batch.records] == list(range(77, 87))
    assert [r.key for r in batch.records] == [b"k%d" % i for i in range(10)]


# --------------------------------------------------------------------------------------------- snappy framing


def test_snappy_is_xerial_framed_like_java() -> None:
    data = encode_batch(new_batch(sample_records(100, value_size=1000), compression=COMPRESSION_SNAPPY))
    payload = data[R.HEADER_SIZE :]
    assert payload[:16] == b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    # blocks of at most 32 KiB uncompressed (xerial's default block size)
    first_block = struct.unpack_from(">i", payload, 16)[0]
    assert cramjam.snappy.decompress_raw_len(payload[20 : 20 + first_block]) == 32 * 1024


def _with_payload(batch: RecordBatch, payload: bytes) -> bytes:
    """A batch whose records section is ``payload`` (compressed by the caller), with a correct CRC."""
    header = bytearray(encode_batch(RecordBatch(
        base_offset=batch.base_offset, attributes=batch.attributes, last_offset_delta=batch.last_offset_delta,
        base_timestamp=batch.base_timestamp, max_timestamp=batch.max_timestamp,
    ))[: R.HEADER_SIZE])
    struct.pack_into(">i", header, 8, R.MIN_LENGTH_V2 + len(payload))
    struct.pack_into(">i", header, 57, len(batch.records))
    out = header + payload
    struct.pack_into(">I", out, R.CRC_OFFSET, R.batch_crc(out))
    return bytes(out)


def test_raw_and_concatenated_snappy_are_read() -> None:
    batch = new_batch(sample_records(10), compression=COMPRESSION_SNAPPY)
    raw_records = R.encode_records(batch.records)
    # raw snappy (no xerial framing), as librdkafka writes it
    raw = bytes(cramjam.snappy.compress_raw(raw_records))
    assert decode_batch(_with_payload(batch, raw)).records == batch.records
    # two xerial streams back to back (xerial's SnappyInputStream reads concatenated streams)
    half = len(raw_records) // 2
    two = R.compress(COMPRESSION_SNAPPY, raw_records[:half])
    two += R.compress(COMPRESSION_SNAPPY, raw_records[half:])
    assert decode_batch(_with_payload(batch, two)).records == batch.records


def test_lz4_blocks_are_independent() -> None:
    # Kafka's Lz4BlockInputStream decompresses every block on its own: FLG must have the B.Indep bit set
    payload = R.compress(COMPRESSION_LZ4, b"x" * 200_000)
    assert payload[:4] == b"\x04\x22\x4d\x18"
    assert payload[4] & 0x20


# --------------------------------------------------------------------------------------------- malformed


@pytest.mark.parametrize("compression", CODECS[1:], ids=IDS[1:])
def test_decompression_bomb_is_bounded(compression: int) -> None:
    # 8 MiB of zeros compresses to a few KiB; with a 1 MiB bound it must fail without decompressing it all
    records = [Record(0, 0, None, bytes(8 * 1024 * 1024))]
    data = encode_batch(new_batch(records, compression=compression))
    assert len(data) < 512 * 1024
    with pytest.raises(CodecError, match="more than 1048576 bytes"):
        decode_batch(data, max_decompressed=1024 * 1024)
    assert decode_batch(data, max_decompressed=16 * 1024 * 1024).records == records


def test_corrupt_compressed_payload() -> None:
    batch = new_batch(sample_records(5), compression=COMPRESSION_ZSTD)
    with pytest.raises(CodecError, match="zstd"):
        decode_batch(_with_payload(batch, b"\x28\xb5\x2f\xfd garbage garbage"))
    with pytest.raises(CodecError, match="snappy"):
        decode_batch(_with_payload(new_batch(sample_records(5), compression=COMPRESSION_SNAPPY),
                                   b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01\x7f\xff\xff\xff"))


def test_unknown_compression_type() -> None:
    batch = new_batch(sample_records(2))
    batch.attributes |= 5
    with pytest.raises(CodecError, match="compression type 5"):
        encode_batch(batch)
    data = bytearray(encode_batch(new_batch(sample_records(2))))
    data[R.ATTRIBUTES_OFFSET + 1] |= 6
    with pytest.raises(CodecError, match="compression type 6"):
        decode_batch(bytes(data), verify_crc=False)


@pytest.mark.parametrize(("what", "count"), [("negative", -1), ("too many", 2**31 - 1), ("one more", 3)])
def test_record_count_must_match(what: str, count: int) -> None:
    data = bytearray(encode_batch(new_batch(sample_records(2))))
    struct.pack_into(">i", data, 57, count)
    with pytest.raises(CodecError):
        decode_batch(bytes(data), verify_crc=False)


def test_declared_sizes_checked() -> None:
    data = encode_batch(new_batch(sample_records(2)))
    with pytest.raises(CodecError, match="truncated"):
        decode_batch(data[:-1])
    with pytest.raises(CodecError, match="trailing"):
        decode_batch(data + b"\x00")
    bad = bytearray(data)
    bad[R.HEADER_SIZE : R.HEADER_SIZE + 5] = b"\xfe\xff\xff\xff\x0f"  # first record's length: 2**31-1
    with pytest.raises(CodecError, match="record size"):
        decode_batch(bytes(bad), verify_crc=False)
    bad[R.HEADER_SIZE : R.HEADER_SIZE + 5] = b"\xff\xff\xff\xff\xff"
    with pytest.raises(CodecError, match="varint"):
        decode_batch(bytes(bad), verify_crc=False)


# --------------------------------------------------------------------------------------------- golden frames

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden"


def _golden_record_sets() -> list[tuple[str, bytes]]:
    """Record sets written by real producers (Java, librdkafka, kafka-python, aiokafka) as a Kafka 4.1 broker
    returned them in Fetch responses, and as the clients sent them in Produce requests."""
    out: list[tuple[str, bytes]] = []
    for path in sorted(GOLDEN.glob("Fetch-v*-response-*.bin")):
        version = int(path.name.split("-v")[1].split("-")[0])
        _, body = decode_response(1, version, path.read_bytes())
        out += [(path.name, bytes(p.records)) for t in body.responses for p in t.partitions if p.records]
    for path in sorted(GOLDEN.glob("Produce-v*-request-*.bin")):
        _, body = decode_request(path.read_bytes())
        out += [(path.name, bytes(p.records)) for t in body.topic_data for p in t.partition_data if p.records]
    return out


GOLDEN_SETS = _golden_record_sets()


def test_golden_record_sets_cover_compression() -> None:
    seen = {h.compression for _, data in GOLDEN_SETS for h in iter_batches(data)}
    assert {COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_LZ4, COMPRESSION_ZSTD} <= seen


@pytest.mark.usefixtures("kafka_python_codecs")
@pytest.mark.parametrize(("name", "data"), GOLDEN_SETS,
                         ids=[f"{n}-{i}" for i, (n, _) in enumerate(GOLDEN_SETS)])
def test_golden_record_set(name: str, data: bytes) -> None:
    walk = walk_batches(data)
    assert walk.truncated == 0 and walk.complete_size == len(data)
    kp_batches = list(MemoryRecords(data))
    assert len(kp_batches) == len(walk.batches)
    for header, kp in zip(walk.batches, kp_batches, strict=True):
        raw = data[header.start : header.end]
        batch = decode_batch(raw)
        assert encode_batch(batch) == raw  # byte-exact, compressed payloads included
        assert (header.base_offset, header.crc, header.records_count) == (kp.base_offset, kp.crc,
                                                                          kp.records_count)
        got = [(batch.base_offset + r.offset_delta, batch.base_timestamp + r.timestamp_delta, r.key, r.value,
                r.headers) for r in batch.records]
        assert got == [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in kp]


@pytest.mark.parametrize("codec", CODECS)
def test_extend_batch_moves_the_last_offset_only(codec: int) -> None:
    """A batch stretched over offsets past its last record is what the codec writes for the same fields with
    LastOffsetDelta moved there: every other byte as it was, the CRC-32C valid."""
    data = encode_batch(new_batch(sample_records(3), base_offset=100, compression=codec, producer_id=7,
                                  producer_epoch=2, base_sequence=5, partition_leader_epoch=3))
    out = R.extend_batch(data, 150)
    (batch,) = R.decode_batches(out)  # CRC-32C verified
    assert batch.last_offset == 149 and len(batch.records) == 3
    (header,) = iter_batches(data)
    assert out == R._write_batch(header._replace(last_offset_delta=49), 3, memoryview(data)[R.HEADER_SIZE:])
    with pytest.raises(CodecError):
        R.extend_batch(data, 101)  # before its own last record
