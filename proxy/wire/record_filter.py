"""Keep some records of a v2 record batch and drop the others, without decoding the records whole: the fast path
of cooperative consumption (proxy/policies/sharing/), which removes from every batch a member fetches the records
of the other members' key slices.

:func:`parse_batch` decompresses a batch's records section once and locates each record (its offset and key, and
the span of its bytes, length varint included); :func:`keep_records` writes the batch again with only the chosen
records, their bytes copied as they were (never re-encoded), through :func:`proxy.wire.records.rebuild_batch`:
every header field kept (BaseOffset and LastOffsetDelta, so the consumer's next fetch offset moves past the whole
batch; the timestamps; the producer fields, so transactional batches stay what they were; the attributes, so the
same codec), Length, RecordsCount and CRC-32C recomputed. (A batch whose records are all dropped is not written at
all by cooperative consumption: proxy/policies/sharing/fetch.py.) :func:`record_at` reads the one record of an
uncompressed batch in place: a low-rate topic's batches hold one record each, and locating it costs a fifth of
:func:`parse_batch`.

The record layout read here is ``DefaultRecord``'s (proxy/codecs/Record.json): Length varint, Attributes int8,
TimestampDelta varlong, OffsetDelta varint, Key varbytes, then Value and Headers, which are not read. The
result equals decoding with :func:`~proxy.wire.records.decode_batch`, dropping records and encoding with
:func:`~proxy.wire.records.encode_batch` (tests/property/test_records_props.py), at a fraction of the cost.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from crc32c import crc32c

from .errors import CodecError
from .records import (
    ATTRIBUTES_OFFSET,
    DEFAULT_MAX_DECOMPRESSED,
    HEADER_SIZE,
    MAGIC_V2,
    BatchHeader,
    batch_crc,
    decompress,
    iter_batches,
    rebuild_batch,
)

Buffer = bytes | bytearray | memoryview
#: the first six bytes of a record
_SIX = struct.Struct(">6B")


@dataclass(slots=True)
class ParsedBatch:
    """One complete v2 batch with its records located (what a filter needs, and what a cache keeps)."""

    header: BatchHeader
    #: the records section, decompressed
    raw: bytes
    #: per record: its absolute offset, its key (None: null), and where its bytes lie in ``raw``
    offsets: list[int]
    keys: list[bytes | None]
    starts: list[int]
    ends: list[int]

    @property
    def size(self) -> int:
        """Bytes held (for a cache's bound): the records section and the per-record lists."""
        return len(self.raw) + 64 * len(self.offsets) + 128


def _varint(buf: Buffer, pos: int) -> tuple[int, int]:
    """A zigzag varint (ByteUtils.readVarint/readVarlong) at ``pos``: (value, next position)."""
    if pos < len(buf) and (b := buf[pos]) < 0x80:  # one byte: most deltas and key lengths
        return (b >> 1) ^ -(b & 1), pos + 1
    shift = value = 0
    n = len(buf)
    while True:
        if pos >= n or shift > 63:
            raise CodecError("truncated or overlong varint in a record", where=pos)
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return (value >> 1) ^ -(value & 1), pos
        shift += 7


def parse_batch(view: Buffer, *, verify_crc: bool = True,
                max_decompressed: int = DEFAULT_MAX_DECOMPRESSED) -> ParsedBatch:
    """Locate the records of one complete v2 batch (CRC-32C checked unless ``verify_crc`` is False). CodecError
    for anything malformed (the caller then leaves the batch as it came: the client sees what the broker sent)."""
    mv = memoryview(view)
    headers = list(iter_batches(mv))
    if len(headers) != 1 or headers[0].end != len(mv):
        raise CodecError("not exactly one complete record batch")
    header = headers[0]
    if header.magic != MAGIC_V2:
        raise CodecError(f"record batch magic {header.magic}: only message format v2 is filtered")
    if verify_crc and batch_crc(mv) != header.crc:
        raise CodecError("record batch CRC mismatch")
    payload = mv[HEADER_SIZE:]
    raw = decompress(header.compression, payload, max_size=max_decompressed) if header.compression \
        else bytes(payload)
    count = header.records_count
    n = len(raw)
    if count < 0 or count > n:
        raise CodecError(f"record count {count} for a {n}-byte records section")
    offsets: list[int] = []
    keys: list[bytes | None] = []
    starts: list[int] = []
    ends: list[int] = []
    base = header.base_offset
    pos = 0
    for _ in range(count):
        start = pos
        pos, delta, key = _record(raw, pos)
        keys.append(None if key is None else bytes(key))  # a slice of bytes: the object itself
        offsets.append(base + delta)
        starts.append(start)
        ends.append(pos)
    if pos != n:
        raise CodecError(f"{n - pos} bytes left after the declared {count} records", where=pos)
    return ParsedBatch(header, raw, offsets, keys, starts, ends)


def record_at(buf: Buffer, start: int, end: int, base_offset: int, crc: int) -> tuple[int, bytes | None]:
    """The offset and key of the one record of an uncompressed v2 batch within ``buf`` (the buffer
    :func:`~proxy.wire.records.iter_batches` walked: a whole record set, or the batch alone), given by its header's
    fields (its span, BaseOffset and CRC), which the caller has already found to say one uncompressed v2 record.
    Read in place (CRC-32C checked, nothing else copied); CodecError for anything malformed, as :func:`parse_batch`.

    Called once per batch of a low-rate topic for every member sharing it, so the common record's first fields are
    read in one unpack, and only another shape goes varint by varint (:func:`_record`)."""
    if crc32c(buf[start + ATTRIBUTES_OFFSET : end]) != crc:
        raise CodecError("record batch CRC mismatch")
    pos = start + HEADER_SIZE
    if end - pos >= 6:
        # the common record in one read: its Length a one- or two-byte varint, then Attributes, TimestampDelta,
        # OffsetDelta and the key's length one byte each
        b0, b1, b2, b3, b4, b5 = _SIX.unpack_from(buf, pos)
        if b0 < 0x80:
            size, ts, d, k, key_at = b0, b2, b3, b4, pos + 5
        elif b1 < 0x80:
            size, ts, d, k, key_at = (b0 & 0x7F) | b1 << 7, b3, b4, b5, pos + 6
        else:
            size = ts = d = k = key_at = 0x80  # a Length of three bytes or more: read below
        if ts | d | k < 0x80:
            klen = (k >> 1) ^ -(k & 1)
            # Length counts the bytes after itself: Attributes, the three one-byte varints, the key and the rest
            if (size >> 1) ^ -(size & 1) != end - key_at + 4 or klen < -1 or key_at + klen > end:
                raise CodecError("a one-record batch whose record does not fill it", where=key_at)
            return base_offset + ((d >> 1) ^ -(d & 1)), None if klen < 0 else bytes(buf[key_at : key_at + klen])
    rec_end, delta, key = _record(buf, pos)
    if rec_end != end:  # the record fills the batch: nothing missing, nothing after it
        raise CodecError(f"{end - rec_end} bytes left after the one record", where=rec_end)
    return base_offset + delta, None if key is None else bytes(key)


def _record(raw: Buffer, pos: int) -> tuple[int, int, Buffer | None]:
    """The record starting at ``pos`` of a records section: (where it ends, its OffsetDelta, its key)."""
    n = len(raw)
    size, pos = _varint(raw, pos)
    end = pos + size
    if size < 0 or end > n:
        raise CodecError(f"record size {size} exceeds the {n - pos} bytes remaining", where=pos)
    pos += 1  # Attributes
    _, pos = _varint(raw, pos)  # TimestampDelta
    delta, pos = _varint(raw, pos)  # OffsetDelta
    klen, pos = _varint(raw, pos)
    if klen < -1 or pos + max(klen, 0) > end:
        raise CodecError(f"record key length {klen} exceeds its record", where=pos)
    return end, delta, None if klen < 0 else raw[pos : pos + klen]


def keep_records(batch: ParsedBatch, kept: Sequence[int]) -> bytes:
    """The batch with only the records at indices ``kept`` (ascending), every header field kept."""
    raw, starts, ends = batch.raw, batch.starts, batch.ends
    section = b"".join([raw[starts[i] : ends[i]] for i in kept])
    return rebuild_batch(batch.header, section, len(kept))
