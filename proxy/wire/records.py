"""Record batches, message format v2 (magic 2, KIP-98): walk, decode, encode, CRC-32C and compression.

Two levels, because the proxy almost never needs the records themselves:

- **walk** (:func:`iter_batches`, :func:`walk_batches`): read each batch's 61-byte header with one
  ``struct.unpack_from`` over the caller's buffer; :func:`prefix_within` and :func:`complete_size`, what size
  budgets and throttles use to find batch boundaries, read only Length and Magic (:func:`batch_end`, where the
  framing rules below live). Nothing is copied or decompressed.
- **full decode/encode** (:func:`decode_batch`, :func:`encode_batch`): the reference path, built on Sluice's
  own declarative specs ``proxy/codecs/RecordBatch.json`` and ``proxy/codecs/Record.json`` compiled by
  :mod:`proxy.wire.compiler`. Only policies that read keys (cooperative consumption) need it.

The layout is Kafka's ``org.apache.kafka.common.record.DefaultRecordBatch`` (header) and ``DefaultRecord``
(records); see the comments in ``proxy/codecs/RecordBatch.json``. Rules taken from Kafka:

- A record set in a Fetch response is a byte slice of the partition's log cut at ``max_bytes``, so its last
  batch may be truncated. Kafka's ``ByteBufferLogInputStream.nextBatch`` stops (returns null) at such a tail
  rather than failing; so does :func:`iter_batches`, and :func:`walk_batches` reports the tail's size.
- ``ByteBufferLogInputStream.nextBatchSize`` rejects a size below ``LegacyRecord.RECORD_OVERHEAD_V0`` (14) and
  a magic outside 0..2 as corrupt, even when the batch is incomplete; the same checks are made here.
- The CRC is CRC-32C (Castagnoli) over everything from Attributes to the end of the batch
  (``DefaultRecordBatch.computeChecksum``), so PartitionLeaderEpoch can be set by the broker without
  recomputing it.
- Compression (attribute bits 0-2) covers the whole records section as one stream: gzip, snappy as written by
  the Java client (xerial ``SnappyOutputStream`` framing; raw snappy is accepted on read like xerial's
  ``SnappyInputStream`` does), lz4 frame format with independent blocks (``Lz4BlockOutputStream``), zstd.
  All through ``cramjam``; decompressed size is bounded (``max_decompressed``) before memory is committed.
- Magic 0/1 (legacy MessageSet entries, removed for writes in Kafka 4.0 by KIP-724 but possibly still in old
  log segments) are walked (offset and size only, so they can be forwarded or skipped) but not decoded.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from types import ModuleType
from typing import NamedTuple

from crc32c import crc32c

from .compiler import Codec, compiled_for, write_uvarint, zigzag_encode
from .errors import CodecError
from .model import Message
from .schema import sluice_spec

# --------------------------------------------------------------------------------------------- constants

#: DefaultRecordBatch offsets and sizes.
LOG_OVERHEAD = 12  # BaseOffset + Length: bytes not counted by Length
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
LAST_OFFSET_DELTA_OFFSET = 23
HEADER_SIZE = 61  # DefaultRecordBatch.RECORD_BATCH_OVERHEAD
MIN_LENGTH_V2 = HEADER_SIZE - LOG_OVERHEAD  # the smallest Length field a v2 batch can have
RECORD_OVERHEAD_V0 = 14  # LegacyRecord.RECORD_OVERHEAD_V0: the smallest legal Length field of any magic
MAGIC_V2 = 2

COMPRESSION_NONE = 0
COMPRESSION_GZIP = 1
COMPRESSION_SNAPPY = 2
COMPRESSION_LZ4 = 3
COMPRESSION_ZSTD = 4
COMPRESSION_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08  # 0 CreateTime, 1 LogAppendTime
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20
DELETE_HORIZON_MASK = 0x40  # KIP-534: BaseTimestamp holds the delete horizon

#: Default bound on one batch's decompressed records section. The broker's own limits are per batch
#: (message.max.bytes, 1 MiB by default) and per frame (socket.request.max.bytes, 100 MiB); a small compressed
#: batch expanding past 64 MiB is a bomb, not data.
DEFAULT_MAX_DECOMPRESSED = 64 * 1024 * 1024

# BaseOffset, Length, PartitionLeaderEpoch, Magic, CRC, Attributes, LastOffsetDelta, BaseTimestamp,
# MaxTimestamp, ProducerId, ProducerEpoch, BaseSequence, RecordsCount
_HEADER = struct.Struct(">qiibIhiqqqhii")
assert _HEADER.size == HEADER_SIZE
# Legacy MessageSet entry (LegacyRecord): Offset, Size, CRC, Magic, Attributes[, Timestamp for magic 1]
_LEGACY = struct.Struct(">qiIbb")
_LEGACY_TS = struct.Struct(">q")
_CRC = struct.Struct(">I")
_INT32 = struct.Struct(">i")
#: read at a batch's start: Length (after BaseOffset), then Magic four bytes on (PartitionLeaderEpoch between)
_LENGTH_MAGIC = struct.Struct(">8xi4xb")


# --------------------------------------------------------------------------------------------- walking


class BatchHeader(NamedTuple):
    """One batch's header as found by :func:`iter_batches`, with where it lies in the walked buffer.

    For legacy entries (magic 0/1) only ``start``, ``end``, ``base_offset`` (the entry's offset; for a
    compressed wrapper that is its last inner offset, as in Kafka's ``AbstractLegacyRecordBatch.lastOffset``),
    ``batch_length``, ``magic``, ``crc``, ``attributes`` and (magic 1) the timestamps are meaningful; the
    other fields are -1 and ``records_count`` is -1 (unknown without decompressing).
    """

    start: int  # offset of the batch in the walked buffer
    end: int  # start + LOG_OVERHEAD + batch_length
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        return self.end - self.start

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        """The offset a consumer fetches next after this batch."""
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def is_transactional(self) -> bool:
        return self.magic >= MAGIC_V2 and bool(self.attributes & TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return self.magic >= MAGIC_V2 and bool(self.attributes & CONTROL_MASK)

    @property
    def is_legacy(self) -> bool:
        return self.magic < MAGIC_V2


class BatchWalk(NamedTuple):
    """All complete batches of a record set, and the truncated tail that follows them (if any)."""

    batches: list[BatchHeader]
    complete_size: int  # bytes covered by complete batches: buf[:complete_size] is a valid record set
    truncated: int  # bytes of a trailing partial batch (0 when the record set ends on a batch boundary)


def batch_end(buf: memoryview | bytes | bytearray, pos: int, n: int) -> int:
    """Where the complete batch at ``pos`` ends, or -1 when the bytes from ``pos`` are a truncated batch.

    Reads only Length and Magic: the walks that need no more (:func:`prefix_within`, :func:`complete_size`) run
    once per batch of every fetched partition under a size limit or a throttle. Raises CodecError for Kafka's
    CorruptRecordException cases (``ByteBufferLogInputStream.nextBatchSize``, the v2 and magic 1 overheads)."""
    remaining = n - pos
    if remaining > MAGIC_OFFSET:  # the common case first, in one read: a whole v2 batch passes every rule below
        length, magic = _LENGTH_MAGIC.unpack_from(buf, pos)
        end = pos + LOG_OVERHEAD + length
        if magic == MAGIC_V2 and length >= MIN_LENGTH_V2 and end <= n:
            return end
    if remaining < LOG_OVERHEAD:
        return -1
    length = _INT32.unpack_from(buf, pos + 8)[0]
    if length < RECORD_OVERHEAD_V0:
        raise CodecError(f"record batch size {length} is less than the minimum record overhead "
                         f"({RECORD_OVERHEAD_V0})", where=pos + 8)
    if remaining < MAGIC_OFFSET + 1:
        return -1
    magic = buf[pos + MAGIC_OFFSET]
    if magic > MAGIC_V2:  # buf[i] is unsigned: a negative magic reads as >= 128
        raise CodecError(f"invalid magic {magic - 256 if magic > 127 else magic} in record batch",
                         where=pos + MAGIC_OFFSET)
    end = pos + LOG_OVERHEAD + length
    if end > n:
        return -1
    if magic == MAGIC_V2:
        if length < MIN_LENGTH_V2:
            raise CodecError(f"record batch length {length} is shorter than the v2 header", where=pos + 8)
    elif magic == 1 and length < RECORD_OVERHEAD_V0 + 8:
        raise CodecError(f"magic 1 record size {length} is less than its overhead", where=pos + 8)
    return end


def _next_batch(buf: memoryview | bytes | bytearray, pos: int, n: int) -> BatchHeader | None:
    """The complete batch at ``pos``, or None when the bytes from ``pos`` are a truncated batch."""
    end = batch_end(buf, pos, n)
    if end < 0:
        return None
    magic = buf[pos + MAGIC_OFFSET]
    if magic == MAGIC_V2:
        return BatchHeader(pos, end, *_HEADER.unpack_from(buf, pos))
    # Legacy entry: LegacyRecord header (offset, size, crc, magic, attributes[, timestamp]).
    base_offset, length, crc, _, attributes = _LEGACY.unpack_from(buf, pos)
    ts = _LEGACY_TS.unpack_from(buf, pos + 18)[0] if magic == 1 else -1
    return BatchHeader(pos, end, base_offset, length, -1, magic, crc, attributes, 0, ts, ts, -1, -1, -1, -1)


def iter_batches(buf: memoryview | bytes | bytearray) -> Iterator[BatchHeader]:
    """Walk the complete batches of a record set by header, without copying; stops at a truncated tail.

    Raises CodecError for a corrupt size or magic (Kafka's CorruptRecordException cases)."""
    n = len(buf)
    pos = 0
    # The common case inlined (a whole v2 batch: its header in one read, built as a tuple): cooperative consumption
    # walks every batch of every shared partition, and a low-rate topic's batches hold one record each, where the
    # calls of _next_batch and batch_end and the NamedTuple's constructor were a fifth of the filter's bytecodes.
    # Anything else (another magic, a length below the v2 header, a truncated tail) is _next_batch's, by its rules.
    read = _HEADER.unpack_from
    new = tuple.__new__
    last = n - HEADER_SIZE  # a batch starting at or before this has its whole header in the buffer
    try:
        while pos < n:
            if pos <= last:
                fields = read(buf, pos)
                end = pos + LOG_OVERHEAD + fields[1]
                if fields[3] == MAGIC_V2 and fields[1] >= MIN_LENGTH_V2 and end <= n:
                    yield new(BatchHeader, (pos, end, *fields))
                    pos = end
                    continue
            header = _next_batch(buf, pos, n)
            if header is None:
                return
            yield header
            pos = header.end
    except struct.error as e:  # unreachable by the length checks above; kept so no struct.error escapes
        raise CodecError(f"record batch header: {e}", where=pos) from None


def walk_batches(buf: memoryview | bytes | bytearray) -> BatchWalk:
    """Every complete batch, plus the size of the truncated tail (sent when max_bytes cuts a batch)."""
    batches = list(iter_batches(buf))
    done = batches[-1].end if batches else 0
    return BatchWalk(batches, done, len(buf) - done)


def complete_size(buf: memoryview | bytes | bytearray) -> int:
    """The number of leading bytes of ``buf`` that form complete batches."""
    return prefix_within(buf, len(buf), False)


def prefix_within(buf: memoryview | bytes | bytearray, allowed: int, at_least_one: bool) -> int:
    """How many leading bytes of a record set to keep: whole batches within ``allowed`` bytes; with
    ``at_least_one`` the first batch whatever its size (KIP-74's progress guarantee). A truncated trailing
    batch (the broker's reads are byte slices of the log) is never kept: every client discards it anyway, and
    the Java consumer fails with "Failed to make progress" on a partition holding nothing else."""
    n = len(buf)
    kept = 0  # where the batch at hand starts, so its end is all it would keep: within ``allowed`` or the first
    # batch_end's common case inlined (a whole v2 batch: Length and Magic in one read), as this loop runs once
    # per batch of every fetched partition under a size limit or a throttle (with a call of batch_end per batch
    # it was a third of the bytecodes of a ~1 MiB fetch with every policy on, bench.pipeline_cpu --opcodes --case
    # fetch_all); anything else - another magic, a length below the v2 header, a truncated tail - is left to
    # batch_end and its rules below.
    read = _LENGTH_MAGIC.unpack_from
    last = n - MAGIC_OFFSET  # a batch starting before this has its Magic in the buffer
    while kept < last:
        length, magic = read(buf, kept)
        end = kept + LOG_OVERHEAD + length
        if magic != MAGIC_V2 or length < MIN_LENGTH_V2 or end > n:
            break
        if end > allowed and (kept or not at_least_one):
            return kept
        kept = end
    while kept < n and (end := batch_end(buf, kept, n)) >= 0 and (end <= allowed or (at_least_one and not kept)):
        kept = end
    return kept


def batch_crc(view: memoryview | bytes | bytearray) -> int:
    """CRC-32C of a complete v2 batch as Kafka computes it: Attributes .. end
    (DefaultRecordBatch.computeChecksum)."""
    return crc32c(memoryview(view)[ATTRIBUTES_OFFSET:])


# --------------------------------------------------------------------------------------------- compression

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
#: xerial SnappyOutputStream header: magic, version 1, minimum compatible version 1 (currentHeader).
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
#: xerial's default block size (SnappyOutputStream.DEFAULT_BLOCK_SIZE), which Kafka's SnappyFactory uses.
_XERIAL_BLOCK = 32 * 1024


def _is_too_small(err: Exception) -> bool:
    # cramjam's *_into functions fail with "failed to write whole buffer" (gzip/lz4/zstd) or "output buffer
    # ... is smaller than required" (snappy) when the output does not fit; anything else is corrupt input.
    return "buffer" in str(err)


def _cramjam() -> ModuleType:
    """cramjam, imported with the first compressed batch rather than at start.

    It is ~1.5 MiB resident with its Rust codecs: a Sluice whose clients send uncompressed batches, or whose
    policies decode no records, never loads it.
    """
    import cramjam

    return cramjam


def _decompress_bounded(module: object, data: memoryview, max_size: int, what: str) -> bytes:
    """Decompress into a buffer that grows (x4) up to ``max_size``: a bomb fails at the bound."""
    cramjam = _cramjam()
    size = min(max_size, max(64 * 1024, 4 * len(data)))
    while True:
        out = bytearray(size)
        try:
            n = module.decompress_into(data, out)  # type: ignore[attr-defined]
        except cramjam.DecompressionError as e:
            if not _is_too_small(e):
                raise CodecError(f"corrupt {what} data: {e}") from None
            if size >= max_size:
                raise CodecError(f"{what} data decompresses to more than {max_size} bytes") from None
            size = min(max_size, size * 4)
            continue
        del out[n:]
        return bytes(out)


def _snappy_decompress(data: memoryview, max_size: int) -> bytes:
    """Snappy as Kafka's Java client writes it (xerial framing) or raw (other clients, e.g. librdkafka)."""
    cramjam = _cramjam()
    blocks: list[tuple[memoryview, int]] = []
    total = 0
    try:
        if bytes(data[:8]) == _XERIAL_MAGIC:
            if len(data) < len(_XERIAL_HEADER):
                raise CodecError("truncated xerial snappy header")
            pos, n = len(_XERIAL_HEADER), len(data)
            while pos < n:
                # xerial's SnappyInputStream reads concatenated streams: a header where a block length is due
                if bytes(data[pos : pos + 8]) == _XERIAL_MAGIC:
                    pos += len(_XERIAL_HEADER)
                    continue
                if n - pos < 4:
                    raise CodecError("truncated xerial snappy block length")
                (size,) = _INT32.unpack_from(data, pos)
                pos += 4
                if size < 0 or size > n - pos:
                    raise CodecError(f"xerial snappy block length {size} exceeds the {n - pos} bytes left")
                block = data[pos : pos + size]
                pos += size
                ulen = cramjam.snappy.decompress_raw_len(block)
                total += ulen
                if total > max_size:
                    raise CodecError(f"snappy data decompresses to more than {max_size} bytes")
                blocks.append((block, ulen))
        else:
            total = cramjam.snappy.decompress_raw_len(data)
            if total > max_size:
                raise CodecError(f"snappy data decompresses to more than {max_size} bytes")
            blocks.append((data, total))
        out = bytearray(total)
        view = memoryview(out)
        pos = 0
        for block, ulen in blocks:
            written = cramjam.snappy.decompress_raw_into(block, view[pos : pos + ulen])
            if written != ulen:
                raise CodecError("snappy block shorter than its declared length")
            pos += ulen
        view.release()
        return bytes(out)
    except cramjam.DecompressionError as e:
        raise CodecError(f"corrupt snappy data: {e}") from None


def decompress(compression: int, data: bytes | bytearray | memoryview, *,
               max_size: int = DEFAULT_MAX_DECOMPRESSED) -> bytes:
    """Decompress a records section; at most ``max_size`` bytes out, else CodecError."""
    cramjam = _cramjam()
    view = memoryview(data)
    if compression == COMPRESSION_NONE:
        return bytes(view)
    if compression == COMPRESSION_GZIP:
        return _decompress_bounded(cramjam.gzip, view, max_size, "gzip")
    if compression == COMPRESSION_SNAPPY:
        return _snappy_decompress(view, max_size)
    if compression == COMPRESSION_LZ4:
        return _decompress_bounded(cramjam.lz4, view, max_size, "lz4")
    if compression == COMPRESSION_ZSTD:
        return _decompress_bounded(cramjam.zstd, view, max_size, "zstd")
    raise CodecError(f"unknown compression type {compression}")


def compress(compression: int, data: bytes | bytearray | memoryview) -> bytes:
    """Compress a records section the way Kafka's Java producer frames it."""
    cramjam = _cramjam()
    if compression == COMPRESSION_NONE:
        return bytes(data)
    if compression == COMPRESSION_GZIP:
        return bytes(cramjam.gzip.compress(data))
    if compression == COMPRESSION_SNAPPY:
        view = memoryview(data)
        out = bytearray(_XERIAL_HEADER)
        for i in range(0, len(view), _XERIAL_BLOCK):
            block = cramjam.snappy.compress_raw(view[i : i + _XERIAL_BLOCK])
            out += _INT32.pack(len(block))
            out += block
        return bytes(out)
    if compression == COMPRESSION_LZ4:
        # Independent blocks: Kafka's Lz4BlockInputStream decompresses each block on its own, so linked blocks
        # (the lz4 frame default) would break Java consumers on batches over one 64 KiB block.
        lz4 = cramjam.lz4.Compressor(block_linked=False, content_checksum=False)
        lz4.compress(data)
        return bytes(lz4.finish())
    if compression == COMPRESSION_ZSTD:
        return bytes(cramjam.zstd.compress(data))
    raise CodecError(f"unknown compression type {compression}")


# --------------------------------------------------------------------------------------------- full decode


@dataclass(slots=True)
class Record:
    """One record of a v2 batch (DefaultRecord); offsets and timestamps are deltas from the batch's bases."""

    offset_delta: int = 0
    timestamp_delta: int = 0
    key: bytes | None = None
    value: bytes | None = None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)
    attributes: int = 0


@dataclass(slots=True)
class RecordBatch:
    """A decoded v2 batch. ``encode_batch`` recomputes Length, RecordsCount and CRC; everything else is kept.

    LastOffsetDelta and MaxTimestamp are kept as given, not recomputed: compaction removes records but keeps a
    batch's LastOffsetDelta (DefaultRecordBatch comment "the last offset ... is retained"), so it is not
    derivable from the records. :func:`new_batch` computes them for a fresh batch.
    """

    base_offset: int = 0
    partition_leader_epoch: int = -1
    attributes: int = 0
    last_offset_delta: int = 0
    base_timestamp: int = -1
    max_timestamp: int = -1
    producer_id: int = -1
    producer_epoch: int = -1
    base_sequence: int = -1
    records: list[Record] = field(default_factory=list)
    magic: int = MAGIC_V2
    crc: int = field(default=0, compare=False)  # as read; derived, recomputed by encode_batch
    # The compressed payload and what it decompressed to, as read: if the records still encode to the same
    # bytes, encode_batch reuses the payload, so an unchanged compressed batch re-encodes byte-exact
    # (cramjam's compressors do not reproduce the Java client's output bit for bit).
    _orig_payload: memoryview | bytes | None = field(default=None, repr=False, compare=False)
    _orig_records: bytes | None = field(default=None, repr=False, compare=False)
    _orig_compression: int = field(default=0, repr=False, compare=False)

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_MASK)

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta


@cache
def batch_header_codec() -> Codec:
    """The compiled proxy/codecs/RecordBatch.json (the 61-byte header)."""
    return compiled_for(sluice_spec("RecordBatch"), MAGIC_V2)


@cache
def record_codec() -> Codec:
    """The compiled proxy/codecs/Record.json (a record body, after its varint length)."""
    return compiled_for(sluice_spec("Record"), MAGIC_V2)


def _read_varint(buf: memoryview | bytes, pos: int, n: int) -> tuple[int, int]:
    """A zigzag varint (ByteUtils.readVarint, at most 5 bytes) at ``pos``: (value, next position)."""
    value = 0
    shift = 0
    for i in range(pos, min(pos + 5, n)):
        b = buf[i]
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return (value >> 1) ^ -(value & 1), i + 1
        shift += 7
    if n - pos < 5:
        raise CodecError("truncated record length varint", where=pos)
    raise CodecError("record length varint longer than 5 bytes", where=pos)


def _decode_records(raw: memoryview | bytes, count: int) -> list[Record]:
    if count < 0:
        raise CodecError(f"invalid record count {count}")
    n = len(raw)
    if count > n:  # every record takes several bytes: reject before looping
        raise CodecError(f"record count {count} exceeds the {n} bytes of the records section")
    codec = record_codec()
    records: list[Record] = []
    pos = 0
    for _ in range(count):
        size, pos = _read_varint(raw, pos, n)
        if size < 0 or size > n - pos:
            # DefaultRecord.readFrom: "Invalid record size: expected to read N bytes in record payload..."
            raise CodecError(f"record size {size} exceeds the {n - pos} bytes remaining", where=pos)
        m = codec.decode(raw[pos : pos + size])
        pos += size
        records.append(Record(m.offset_delta, m.timestamp_delta, m.key, m.value,
                              [(h.key, h.value) for h in m.headers], m.attributes))
    if pos != n:
        # DefaultRecordBatch.RecordIterator.ensureNoneRemaining: "Incorrect declared batch size, records still
        # remaining in file"
        raise CodecError(f"{n - pos} bytes left after the declared {count} records", where=pos)
    return records


def decode_batch(view: memoryview | bytes | bytearray, *, verify_crc: bool = True,
                 max_decompressed: int = DEFAULT_MAX_DECOMPRESSED) -> RecordBatch:
    """Decode exactly one complete v2 batch (CRC-32C verified unless ``verify_crc`` is False).

    Use :func:`decode_batches` for a record set (several batches, maybe a truncated tail)."""
    mv = memoryview(view)
    n = len(mv)
    if n < MAGIC_OFFSET + 1:
        raise CodecError(f"truncated record batch: {n} bytes")
    (length,) = _INT32.unpack_from(mv, 8)
    magic = mv[MAGIC_OFFSET]
    if magic != MAGIC_V2:
        raise CodecError(f"record batch magic {magic}: only message format v2 is decoded "
                         "(v0/v1 were removed in Kafka 4.0, KIP-724)", where=MAGIC_OFFSET)
    if length < MIN_LENGTH_V2:
        raise CodecError(f"record batch length {length} is shorter than the v2 header", where=8)
    size = LOG_OVERHEAD + length
    if size != n:
        raise CodecError(f"record batch declares {size} bytes but {n} were given "
                         f"({'truncated' if size > n else 'trailing bytes'})", where=8)
    header = batch_header_codec().decode(mv[:HEADER_SIZE])
    if verify_crc:
        actual = crc32c(mv[ATTRIBUTES_OFFSET:])
        if actual != header.crc:
            raise CodecError(f"record batch CRC mismatch: stored {header.crc:#010x}, computed {actual:#010x}",
                             where=CRC_OFFSET)
    payload = mv[HEADER_SIZE:]
    compression = header.attributes & COMPRESSION_MASK
    raw: memoryview | bytes
    if compression:
        raw = decompress(compression, payload, max_size=max_decompressed)
    else:
        raw = payload
    records = _decode_records(raw, header.records_count)
    return RecordBatch(
        base_offset=header.base_offset,
        partition_leader_epoch=header.partition_leader_epoch,
        attributes=header.attributes,
        last_offset_delta=header.last_offset_delta,
        base_timestamp=header.base_timestamp,
        max_timestamp=header.max_timestamp,
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        records=records,
        magic=header.magic,
        crc=header.crc,
        _orig_payload=payload if compression else None,
        _orig_records=raw if compression else None,  # type: ignore[arg-type]  # bytes when compressed
        _orig_compression=compression,
    )


def decode_batches(buf: memoryview | bytes | bytearray, *, verify_crc: bool = True,
                   max_decompressed: int = DEFAULT_MAX_DECOMPRESSED) -> list[RecordBatch]:
    """Decode every complete batch of a record set (a truncated tail is ignored, as consumers do)."""
    mv = memoryview(buf)
    return [decode_batch(mv[h.start : h.end], verify_crc=verify_crc, max_decompressed=max_decompressed)
            for h in iter_batches(mv)]


# --------------------------------------------------------------------------------------------- encode


def encode_records(records: list[Record]) -> bytes:
    codec = record_codec()
    out = bytearray()
    for r in records:
        body = codec.encode(Message(
            attributes=r.attributes,
            timestamp_delta=r.timestamp_delta,
            offset_delta=r.offset_delta,
            key=r.key,
            value=r.value,
            headers=[Message(key=k, value=v) for k, v in r.headers],
        ))
        out += write_uvarint(zigzag_encode(len(body), 32))
        out += body
    return bytes(out)


def encode_batch(batch: RecordBatch) -> bytes:
    """Encode a v2 batch: records (compressed per ``attributes``), then Length, RecordsCount and CRC-32C."""
    if batch.magic != MAGIC_V2:
        raise CodecError(f"cannot encode a record batch with magic {batch.magic}")
    body = encode_records(batch.records)
    compression = batch.attributes & COMPRESSION_MASK
    payload: bytes | memoryview
    if compression == COMPRESSION_NONE:
        payload = body
    elif (batch._orig_payload is not None and batch._orig_compression == compression
          and batch._orig_records == body):
        payload = batch._orig_payload
    else:
        payload = compress(compression, body)
    return _write_batch(batch, len(batch.records), payload)


def rebuild_batch(header: BatchHeader, records: bytes | bytearray | memoryview, count: int) -> bytes:
    """The v2 batch ``header`` describes, holding ``count`` already-encoded records (each with its length
    varint, as a records section lays them out) instead of its own: every header field is kept (BaseOffset,
    LastOffsetDelta, the timestamps, the producer fields, the attributes and so the codec), the records are
    compressed with the batch's codec, and Length, RecordsCount and the CRC-32C are recomputed. What a filter
    over a batch's records writes (:mod:`proxy.wire.record_filter`); a batch left with no record stays a batch,
    as compaction leaves them (DefaultRecordBatch: the last offset "is retained").

    A batch left with no record is written uncompressed, with no records section at all: a codec's stream of
    nothing is not something every client decodes (franz-go's snappy reader rejects the 16-byte stream of an empty
    input, "s2: corrupt input", and the partition stalls), while an uncompressed batch of no records is what
    Kafka's own log cleaner may leave, which every client reads and moves past (its LastOffsetDelta)."""
    if header.magic != MAGIC_V2:
        raise CodecError(f"cannot rebuild a record batch with magic {header.magic}")
    if count == 0:
        return _write_batch(header._replace(attributes=header.attributes & ~COMPRESSION_MASK), 0, b"")
    compression = header.attributes & COMPRESSION_MASK
    payload = bytes(records) if compression == COMPRESSION_NONE else compress(compression, records)
    return _write_batch(header, count, payload)


def extend_batch(batch: bytes | memoryview, next_offset: int) -> bytes:
    """The one whole v2 batch ``batch`` covering offsets up to ``next_offset`` - 1: LastOffsetDelta moved there and
    the CRC-32C recomputed, its records untouched. Offsets past its last record hold none, as compaction leaves
    batches; a consumer fetches on from ``next_offset``. The header is read from ``batch`` itself: a batch that
    filtering rebuilt (proxy/wire/record_filter.py) holds fewer records than the broker's it came from, and a
    RecordsCount above the records present sends every client reading past the batch's end."""
    view = memoryview(batch)
    headers = list(iter_batches(view))
    if len(headers) != 1 or headers[0].end != len(view):
        raise CodecError("extend_batch takes exactly one whole record batch")
    header = headers[0]
    if header.magic != MAGIC_V2:
        raise CodecError(f"cannot extend a record batch with magic {header.magic}")
    delta = next_offset - 1 - header.base_offset
    if not header.last_offset_delta <= delta <= 0x7FFFFFFF:
        raise CodecError(f"cannot extend a record batch at {header.base_offset} to {next_offset}")
    # every other field stays as it is, byte for byte: LastOffsetDelta written over, the CRC-32C computed again
    out = bytearray(view)
    _INT32.pack_into(out, LAST_OFFSET_DELTA_OFFSET, delta)
    _CRC.pack_into(out, CRC_OFFSET, crc32c(memoryview(out)[ATTRIBUTES_OFFSET:]))
    return bytes(out)


def _write_batch(fields: RecordBatch | BatchHeader, count: int, payload: bytes | memoryview) -> bytes:
    """The header (proxy/codecs/RecordBatch.json) over ``payload``, with Length, RecordsCount and the CRC-32C
    computed (over Attributes .. the end, DefaultRecordBatch.computeChecksum)."""
    if MIN_LENGTH_V2 + len(payload) > 0x7FFFFFFF:
        raise CodecError("record batch larger than 2 GiB")
    header = batch_header_codec().encode(Message(
        base_offset=fields.base_offset,
        batch_length=MIN_LENGTH_V2 + len(payload),
        partition_leader_epoch=fields.partition_leader_epoch,
        magic=MAGIC_V2,
        crc=0,
        attributes=fields.attributes,
        last_offset_delta=fields.last_offset_delta,
        base_timestamp=fields.base_timestamp,
        max_timestamp=fields.max_timestamp,
        producer_id=fields.producer_id,
        producer_epoch=fields.producer_epoch,
        base_sequence=fields.base_sequence,
        records_count=count,
    ))
    out = bytearray(header)
    out += payload
    _CRC.pack_into(out, CRC_OFFSET, crc32c(memoryview(out)[ATTRIBUTES_OFFSET:]))
    return bytes(out)


def new_batch(
    records: list[Record],
    *,
    base_offset: int = 0,
    base_timestamp: int = 0,
    compression: int = COMPRESSION_NONE,
    attributes: int = 0,
    partition_leader_epoch: int = -1,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
) -> RecordBatch:
    """A fresh batch whose LastOffsetDelta and MaxTimestamp are computed from ``records``
    (as MemoryRecordsBuilder does); ``attributes`` adds flags (transactional, control) to the compression."""
    if not 0 <= compression <= COMPRESSION_ZSTD:
        raise CodecError(f"unknown compression type {compression}")
    return RecordBatch(
        base_offset=base_offset,
        partition_leader_epoch=partition_leader_epoch,
        attributes=(attributes & ~COMPRESSION_MASK) | compression,
        last_offset_delta=max((r.offset_delta for r in records), default=0),
        base_timestamp=base_timestamp,
        max_timestamp=base_timestamp + max((r.timestamp_delta for r in records), default=0),
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        records=list(records),
    )


def control_record_type(record: Record) -> int | None:
    """For a record of a control batch: ControlRecordType's type (0 ABORT, 1 COMMIT, ...), else None.

    The key is (int16 version, int16 type) (ControlRecordType.parseTypeId)."""
    if record.key is None or len(record.key) < 4:
        return None
    return int(struct.unpack_from(">h", record.key, 2)[0])
