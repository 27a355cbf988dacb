"""The Fetch response fast path: zero-copy decode, a small mutable model, scatter-write re-encode.

Fetch responses are the only hot path of the proxy (they carry all the record bytes), so they get a
hand-written codec next to the construct reference (:mod:`proxy.wire.compiler`):

- decode: ``struct.unpack_from`` over a memoryview of the frame, one call per partition (its whole fixed part
  when AbortedTransactions is null, as it almost always is), unpacked straight into the partition's slots;
  every partition's record set stays a memoryview slice of the frame (never copied, never decoded: policies
  that need batch boundaries use :func:`proxy.wire.records.iter_batches` on it). ``copy_records=True`` gives
  the decoder's form instead: each record set its own ``bytes``, nothing referring to the caller's buffer;
- a mutable model (:class:`FetchResponseView` -> :class:`FetchTopic` -> :class:`FetchPartition`) that
  policies edit: drop or reorder partitions and topics, replace ``records`` (with ``b""`` for instance),
  change offsets;
- encode: a list of buffers (small ``bytes`` for headers, the original memoryviews for records) and the
  total length, for ``transport.writelines`` (scatter/gather), so record bytes are never copied by the proxy.

Layout: Kafka's ``FetchResponse.json`` (versions 4-18; 0-3 were removed in Kafka 4.0; flexible from 12,
TopicId instead of Topic from 13, NodeEndpoints from 16). Tagged fields are kept as raw bytes at every level
(partition, aborted transaction, topic) and re-emitted as read, except the top-level NodeEndpoints (tag 0,
v16+, KIP-951), which is decoded because the proxy must rewrite broker addresses in it (clients must never
learn them).

Equivalence with the construct codec is the contract, proven by tests/property/test_fetch_fast.py: for every
version, ``decode(b).encode()`` equals ``response_codec(1, v).encode(m)`` for ``b = that encoding`` and
``to_message(decode(b)) == response_codec(1, v).decode(b)`` (the bridge to the construct model is a test oracle,
in rig/fetch_oracle.py). (Both re-encode canonically from decoded
fields, except that the fast path re-emits partition/topic tagged fields byte for byte as received.)
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from .compiler import tag_section_at as _skip_tags
from .compiler import uvarint_at as _uvarint
from .compiler import write_uvarint
from .errors import CodecError, codec_errors
from .fetch_layout import (
    DIVERGING_EPOCH_TAG,
    FIRST_FLEXIBLE,
    FIRST_NODE_ENDPOINTS,
    FIRST_TOPIC_ID,
    MAX_VERSION,
    MIN_VERSION,
    NODE_ENDPOINTS_TAG,
    PartitionKey,
    TopicKey,
    topic_key,
)

_API = "FetchResponse"

Buffer = bytes | bytearray | memoryview

_I32 = struct.Struct(">i")
_I32_2 = struct.Struct(">ii")
_U16_LEN = struct.Struct(">h")
_ABORTED = struct.Struct(">qq")  # ProducerId, FirstOffset
_TOP_V4 = struct.Struct(">ii")  # ThrottleTimeMs, Responses count
_TOP_V7 = struct.Struct(">ihii")  # ThrottleTimeMs, ErrorCode, SessionId, Responses count
_TOP_FLEX = struct.Struct(">ihi")  # ThrottleTimeMs, ErrorCode, SessionId (count is a uvarint)
# FetchResponse.json, PartitionData: PartitionIndex int32, ErrorCode int16, HighWatermark int64,
# LastStableOffset int64, LogStartOffset int64 "5+", AbortedTransactions "4+" (nullable; int32 count, or a compact
# count from 12, 0 = null), PreferredReadReplica int32 "11+", Records (nullable; int32 length, compact from 12).
# Partition header up to and including the AbortedTransactions count (non-flexible, int32 count, -1 = null)
_PART_V4 = struct.Struct(">ihqqi")  # PartitionIndex, ErrorCode, HighWatermark, LastStableOffset, count
_PART_V5 = struct.Struct(">ihqqqi")  # ... LogStartOffset (5+), count
_PART_FLEX = struct.Struct(">ihqqq")  # flexible: the count that follows is a uvarint
# The whole fixed part of the common partition, AbortedTransactions null: one unpack per partition on decode (a
# probe: it is re-read field by field when the count is not null), one pack on encode.
_PART_V4_NULL = struct.Struct(">ihqqii")  # ..., count -1, Records length
_PART_V5_NULL = struct.Struct(">ihqqqii")  # ..., count -1, Records length
_PART_V11_NULL = struct.Struct(">ihqqqiii")  # ..., count -1, PreferredReadReplica, Records length
_PART_FLEX_PROBE = struct.Struct(">ihqqqBiBB")  # decode: ..., count byte, PreferredReadReplica, 2 bytes
_PART_FLEX_NULL_1 = struct.Struct(">ihqqqBiB")  # ..., Records compact length as a 1-byte uvarint
_PART_FLEX_NULL_2 = struct.Struct(">ihqqqBiH")  # ..., Records compact length as a 2-byte uvarint (from _UV2)
# The same, led by the previous partition's empty tag section (one zero byte): the common partition after a
# non-empty record set is then one buffer, packed in one call (no bytearray to grow and copy per partition).
_PART_FLEX_LEAD_1 = struct.Struct(">BihqqqBiB")
_PART_FLEX_LEAD_2 = struct.Struct(">BihqqqBiH")  # the 2-byte uvarint as one big-endian uint16, from _UV2
_PART_FLEX_LEAD_3 = struct.Struct(">BihqqqBiBBB")  # a 3-byte uvarint: record sets up to 2 MiB (Kafka's default
# max.partition.fetch.bytes is 1 MiB)


def _uv2_table() -> array[int]:
    """2-byte uvarints (128 <= value < 16384) as big-endian uint16s: one look-up instead of four operations per
    partition on encode (32 KiB). Laid out as bytes, value v's big-endian pair at 2v (its low 7 bits with the
    continuation bit, then the rest), in a few slice copies: computed entry by entry, 16,384 of them, it was one of the
    slowest statements of Sluice's import (3-5 ms of every start)."""
    pairs = bytearray(2 * 16384)
    pairs[0::2] = bytes(range(0x80, 0x100)) * 128  # (v & 0x7F) | 0x80
    pairs[1::2] = b"".join(bytes([high]) * 128 for high in range(128))  # v >> 7
    table = array("H", pairs)
    if sys.byteorder == "little":
        table.byteswap()
    return table


_UV2 = _uv2_table()

#: small uvarints, precomputed (compact lengths and counts are almost always < 128)
_UV = [bytes([i]) for i in range(128)]
_EMPTY_TAGS = b"\x00"


def _bad(what: str, value: int, left: int, pos: int) -> CodecError:
    """A declared length/count that cannot be right: negative, or more than the bytes left (checked before
    anything is allocated, like Kafka's readers)."""
    if value < 0:
        return CodecError(f"{what} {value} is negative", where=pos)
    return CodecError(f"{what} {value} exceeds the {left} bytes remaining", where=pos)


def _uv(value: int) -> bytes:
    return _UV[value] if value < 128 else write_uvarint(value)


def parse_tags(raw: Buffer | None) -> dict[int, memoryview]:
    """A raw tag section (as kept in ``tags`` attributes) as {tag: raw value}."""
    out: dict[int, memoryview] = {}
    if raw is None:
        return out
    mv = memoryview(raw)
    try:
        count, pos = _uvarint(mv, 0)
        for _ in range(count):
            tag, pos = _uvarint(mv, pos)
            size, pos = _uvarint(mv, pos)
            if size > len(mv) - pos:
                raise CodecError(f"tagged field {tag} size {size} exceeds the bytes remaining", where=pos)
            out[tag] = mv[pos : pos + size]
            pos += size
    except IndexError:
        raise CodecError("truncated tag section") from None
    return out


def build_tags(fields: dict[int, Buffer]) -> bytes | None:
    """The raw tag section for {tag: raw value} (ascending tags), or None when there are none."""
    if not fields:
        return None
    out = bytearray(write_uvarint(len(fields)))
    for tag in sorted(fields):
        raw = fields[tag]
        out += write_uvarint(tag)
        out += write_uvarint(len(raw))
        out += raw
    return bytes(out)


# --------------------------------------------------------------------------------------------- model


class AbortedTransaction:
    __slots__ = ("first_offset", "producer_id", "tags")

    def __init__(self, producer_id: int, first_offset: int, tags: Buffer | None = None) -> None:
        self.producer_id = producer_id
        self.first_offset = first_offset
        self.tags = tags  # raw tag section (v12+), None when empty

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, AbortedTransaction) and self.producer_id == other.producer_id
                and self.first_offset == other.first_offset and _raw(self.tags) == _raw(other.tags))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"AbortedTransaction({self.producer_id}, {self.first_offset})"


class FetchPartition:
    """One partition of a Fetch response. ``records`` is a memoryview into the received frame (or any bytes a
    policy put there; None is a null record set). ``tags`` is the raw tag section (DivergingEpoch,
    CurrentLeader, SnapshotId, unknown tags), None when empty or for versions < 12."""

    __slots__ = ("aborted_transactions", "error_code", "high_watermark", "last_stable_offset",
                 "log_start_offset", "partition_index", "preferred_read_replica", "records", "tags")

    def __init__(
        self,
        partition_index: int,
        error_code: int = 0,
        high_watermark: int = 0,
        last_stable_offset: int = -1,
        log_start_offset: int = -1,
        aborted_transactions: list[AbortedTransaction] | None = None,
        preferred_read_replica: int = -1,
        records: Buffer | None = b"",
        tags: Buffer | None = None,
    ) -> None:
        self.partition_index = partition_index
        self.error_code = error_code
        self.high_watermark = high_watermark
        self.last_stable_offset = last_stable_offset
        self.log_start_offset = log_start_offset
        self.aborted_transactions = aborted_transactions
        self.preferred_read_replica = preferred_read_replica
        self.records = records
        self.tags = tags

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FetchPartition):
            return False
        return all(
            (_raw(getattr(self, k)) == _raw(getattr(other, k))) for k in FetchPartition.__slots__
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        size = None if self.records is None else len(self.records)
        return (f"FetchPartition({self.partition_index}, error={self.error_code}, hw={self.high_watermark}, "
                f"records={size} bytes)")

    @property
    def records_size(self) -> int:
        return 0 if self.records is None else len(self.records)

    def tagged_fields(self) -> dict[int, memoryview]:
        return parse_tags(self.tags)


def has_diverging_epoch(p: FetchPartition) -> bool:
    """FetchResponse.isDivergingEpoch: DivergingEpoch (tag 0, v12+) present with epoch >= 0."""
    if not p.tags:
        return False
    raw = p.tagged_fields().get(DIVERGING_EPOCH_TAG)
    return raw is not None and len(raw) >= 4 and _I32.unpack_from(raw)[0] >= 0


class _DecodedPartition(FetchPartition):
    """A :class:`FetchPartition` as the decoders make it: created without arguments, every slot then set by the
    decoder. A class whose ``__init__`` is ``object.__init__`` is instantiated by a C-level call (``type_call``:
    ``object_new``, no Python frame), a quarter cheaper than ``object.__new__(FetchPartition)``; it runs once per
    partition on the hot path. It is a FetchPartition in every other way (``isinstance``, equality, slots)."""

    __slots__ = ()
    __init__ = object.__init__


class FetchTopic:
    """One topic: ``topic`` (name, versions <= 12) or ``topic_id`` (16-byte UUID, versions >= 13)."""

    __slots__ = ("partitions", "tags", "topic", "topic_id")

    def __init__(self, topic: str = "", topic_id: bytes = bytes(16),
                 partitions: list[FetchPartition] | None = None, tags: Buffer | None = None) -> None:
        self.topic = topic
        self.topic_id = topic_id
        self.partitions = partitions if partitions is not None else []
        self.tags = tags

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, FetchTopic) and self.topic == other.topic
                and self.topic_id == other.topic_id and self.partitions == other.partitions
                and _raw(self.tags) == _raw(other.tags))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        name = self.topic or self.topic_id.hex()
        return f"FetchTopic({name!r}, {len(self.partitions)} partitions)"


class NodeEndpoint:
    """An entry of NodeEndpoints (KIP-951): where a client finds a partition's new leader."""

    __slots__ = ("host", "node_id", "port", "rack", "tags")

    def __init__(self, node_id: int, host: str, port: int, rack: str | None = None,
                 tags: Buffer | None = None) -> None:
        self.node_id = node_id
        self.host = host
        self.port = port
        self.rack = rack
        self.tags = tags

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, NodeEndpoint)
                and (self.node_id, self.host, self.port, self.rack)
                == (other.node_id, other.host, other.port, other.rack)
                and _raw(self.tags) == _raw(other.tags))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"NodeEndpoint({self.node_id}, {self.host!r}, {self.port}, rack={self.rack!r})"


def _raw(v: Any) -> Any:
    return bytes(v) if isinstance(v, memoryview) else v


class EncodedTopics(NamedTuple):
    """A response's topics array already encoded (its count, then each topic), as scatter buffers: what a
    response built from encodings kept from earlier responses carries instead of topic objects (see
    :attr:`FetchResponseView.encoded`)."""

    topic_count: int
    buffers: list[Buffer]
    #: non-zero partition error codes among them (for the access log, without decoding)
    errors: list[int]
    #: every partition's key, in order, and the record bytes of those written with records (the rest have none):
    #: what the access log lists and a quota counts, without decoding
    partitions: Sequence[PartitionKey]
    record_sizes: Mapping[PartitionKey, int]
    #: each topic entry's key, in order (the access log names them without going through every partition)
    topics: Sequence[TopicKey]


class FetchResponseView:
    """A decoded Fetch response body (the part after the response header), editable in place.

    A view may instead carry its topics already encoded (:attr:`encoded`, e.g. a response Sluice assembles from
    the partitions it encoded for earlier responses): it is written out as is, and decoded into topic objects
    only if someone reads :attr:`topics` (then it is an ordinary view)."""

    __slots__ = ("_topics", "encoded", "error_code", "node_endpoints", "session_id", "throttle_time_ms",
                 "unknown_tags", "version", "whole")

    def __init__(
        self,
        version: int,
        throttle_time_ms: int = 0,
        error_code: int = 0,
        session_id: int = 0,
        topics: list[FetchTopic] | None = None,
        node_endpoints: list[NodeEndpoint] | None = None,
        unknown_tags: dict[int, Buffer] | None = None,
    ) -> None:
        if not MIN_VERSION <= version <= MAX_VERSION:
            raise CodecError(f"Fetch response version {version} outside {MIN_VERSION}-{MAX_VERSION}",
                             api=_API, version=version)
        self.version = version
        self.throttle_time_ms = throttle_time_ms
        self.error_code = error_code
        self.session_id = session_id
        self.encoded: EncodedTopics | None = None
        self._topics: list[FetchTopic] | None = topics if topics is not None else []
        self.node_endpoints = node_endpoints if node_endpoints is not None else []
        # top-level tagged fields other than NodeEndpoints (tag 0 from v16), raw
        self.unknown_tags = unknown_tags if unknown_tags is not None else {}
        # Not on the wire: the partitions (their id(): a FetchPartition is unhashable, and the view holds each one
        # while it lives) whose records a policy walked and left as whole batches. The broker's read is a byte
        # slice of the log, so a decoded record set may end in a truncated batch; the throttle and the size limit
        # each drop it (proxy/wire/records.py, prefix_within), and with both on the second need not walk the same
        # batches again. Kept here, not on the partition, so decoding and building partitions cost nothing more.
        self.whole: set[int] = set()

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, FetchResponseView) and self.version == other.version
                and (self.throttle_time_ms, self.error_code, self.session_id)
                == (other.throttle_time_ms, other.error_code, other.session_id)
                and self.topics == other.topics and self.node_endpoints == other.node_endpoints
                and {k: _raw(v) for k, v in self.unknown_tags.items()}
                == {k: _raw(v) for k, v in other.unknown_tags.items()})

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        n = sum(len(t.partitions) for t in self.topics)
        return f"FetchResponseView(v{self.version}, {len(self.topics)} topics, {n} partitions)"

    @classmethod
    def from_encoded(cls, version: int, throttle_time_ms: int, error_code: int, session_id: int,
                     encoded: EncodedTopics) -> FetchResponseView:
        """A view whose topics are already encoded (decoded only if :attr:`topics` is read)."""
        view = cls(version, throttle_time_ms, error_code, session_id)
        view._topics = None
        view.encoded = encoded
        return view

    @property
    def topics(self) -> list[FetchTopic]:
        topics = self._topics
        if topics is None:
            topics = self._topics = self._decode_encoded()
        return topics

    @topics.setter
    def topics(self, topics: list[FetchTopic]) -> None:
        self._topics = topics
        self.encoded = None

    def _decode_encoded(self) -> list[FetchTopic]:
        """Turn :attr:`encoded` into topic objects (by decoding this view's own encoding)."""
        buffers, _ = encode(self)
        topics = decode(b"".join(buffers), self.version).topics
        self.encoded = None
        return topics

    def error_codes(self) -> list[int]:
        """The top-level error (if any), then every non-zero partition error code."""
        encoded = self.encoded
        if self._topics is None and encoded is not None:
            errors = list(encoded.errors)
        else:
            errors = [p.error_code for _, p in self.partitions() if p.error_code]
        if self.error_code:
            errors.insert(0, self.error_code)
        return errors

    def partitions(self) -> Iterable[tuple[FetchTopic, FetchPartition]]:
        for t in self.topics:
            for p in t.partitions:
                yield t, p

    def partition_sizes(self) -> Iterator[tuple[TopicKey, int, int]]:
        """Each partition's topic key, index and record bytes, in order: the access log's listing of a decoded
        response (one with :attr:`encoded` topics is listed from what it was built with, without decoding it:
        proxy/core/chain.py's ``_listing``)."""
        return ((topic_key(t), p.partition_index, p.records_size) for t in self.topics for p in t.partitions)

    @property
    def records_size(self) -> int:
        encoded = self.encoded
        if self._topics is None and encoded is not None:
            return sum(encoded.record_sizes.values())
        return sum(p.records_size for t in self.topics for p in t.partitions)

    # ----------------------------------------------------------------------------------------- decode

    @classmethod
    def decode(cls, body: Buffer, version: int, copy_records: bool = False) -> FetchResponseView:
        """Decode a Fetch response body (after the response header). Record bytes are not copied: the view
        keeps slices of ``body`` (pass a memoryview of a buffer that is not modified while the view lives).

        ``copy_records=True`` is what a decoder that hands its result over (as kafka-python's does) returns:
        every record set is its own ``bytes`` (copied once, sliced out of ``body`` when it is ``bytes``, else
        out of one copy of it) and nothing in the view refers to the caller's buffer; fields are decoded the
        same either way."""
        return decode(body, version, copy_records)

    # ----------------------------------------------------------------------------------------- encode

    def encode(self) -> tuple[list[Buffer], int]:
        """The body as scatter buffers (header bytes and the record memoryviews, uncopied) and its length."""
        return encode(self)

    def encode_frame(self, correlation_id: int,
                     header_tags: Buffer | None = None) -> tuple[list[Buffer], int]:
        """A whole response frame: 4-byte size, response header (v1 with its tag section for versions >= 12,
        KIP-482), then the body; ready for ``transport.writelines``."""
        buffers, size = encode(self)
        if self.version >= FIRST_FLEXIBLE:
            head = _I32.pack(correlation_id) + (bytes(header_tags) if header_tags else _EMPTY_TAGS)
        else:
            head = _I32.pack(correlation_id)
        size += len(head)
        return [_I32.pack(size) + head, *buffers], size + 4

    def to_bytes(self) -> bytes:
        """The body as one bytes object (copies the records: for tests and small responses)."""
        return b"".join(encode(self)[0])



# --------------------------------------------------------------------------------------------- decode


def decode_frame(frame: Buffer, version: int) -> tuple[int, memoryview | None, FetchResponseView]:
    """Decode a whole response frame (after the 4-byte size): (correlation id, raw response-header tag section
    or None, body view)."""
    mv = memoryview(frame)
    with codec_errors("Fetch response header", api=_API, version=version):
        (corr,) = _I32.unpack_from(mv, 0)
        pos = 4
        tags = None
        if version >= FIRST_FLEXIBLE:
            tags, pos = _skip_tags(mv, pos, len(mv))
    return corr, tags, decode(mv[pos:], version)


def decode(body: Buffer, version: int, copy_records: bool = False) -> FetchResponseView:
    """Decode a Fetch response body; see :meth:`FetchResponseView.decode`."""
    if not MIN_VERSION <= version <= MAX_VERSION:
        raise CodecError(f"Fetch response version {version} outside {MIN_VERSION}-{MAX_VERSION}",
                         api=_API, version=version)
    src: bytes | memoryview
    if copy_records:
        # Records are sliced out of an immutable bytes object (each slice its own copy); the raw tag sections
        # are views of that bytes object, never of the caller's buffer.
        src = body if isinstance(body, bytes) else bytes(body)
        mv = memoryview(src)
    else:
        mv = body if isinstance(body, memoryview) else memoryview(body)
        src = mv
    with codec_errors("Fetch response", api=_API, version=version):
        if version >= FIRST_FLEXIBLE:
            view, pos = _decode_flexible(mv, version, src)
        else:
            view, pos = _decode_classic(mv, version, src)
    if pos != len(mv):
        raise CodecError(f"{len(mv) - pos} trailing bytes", where=pos, api=_API, version=version)
    return view


def _decode_classic(mv: memoryview, version: int, src: bytes | memoryview) -> tuple[FetchResponseView, int]:
    """Versions 4-11: int16-length strings, int32 counts and lengths, no tagged fields. Records are sliced out
    of ``src`` (``mv`` itself, or the bytes ``mv`` views)."""
    n = len(mv)
    if version >= 7:
        throttle, error_code, session_id, ntopics = _TOP_V7.unpack_from(mv, 0)
        pos = 14
    else:
        throttle, ntopics = _TOP_V4.unpack_from(mv, 0)
        error_code = session_id = 0
        pos = 8
    if ntopics < 0 or ntopics > n - pos:
        raise _bad("Responses: array count", ntopics, n - pos, pos)
    has_lss = version >= 5
    has_pref = version >= 11
    # One unpack reads a partition's whole fixed part when AbortedTransactions is null (count -1), as it almost
    # always is; ``back`` is how far the probe read past the count (PreferredReadReplica, Records length), for
    # the partitions that carry the array.
    probe = _PART_V11_NULL if has_pref else (_PART_V5_NULL if has_lss else _PART_V4_NULL)
    unpack_probe = probe.unpack_from
    probe_size = probe.size
    back = 8 if has_pref else 4
    unpack_i32 = _I32.unpack_from
    unpack_i32_2 = _I32_2.unpack_from
    unpack_aborted = _ABORTED.unpack_from
    new_partition = _DecodedPartition
    topics: list[FetchTopic] = []
    for _ in range(ntopics):
        (nlen,) = _U16_LEN.unpack_from(mv, pos)
        pos += 2
        if nlen < 0:
            raise CodecError(f"Topic: length {nlen} (null not allowed here)", where=pos)
        if nlen > n - pos:
            raise _bad("Topic: declared length", nlen, n - pos, pos)
        name = str(mv[pos : pos + nlen], "utf-8")
        pos += nlen
        (nparts,) = unpack_i32(mv, pos)
        pos += 4
        if nparts < 0 or nparts > n - pos:
            raise _bad("Partitions: array count", nparts, n - pos, pos)
        parts: list[FetchPartition] = []
        append = parts.append
        for _ in range(nparts):
            # Fields go straight from the unpacked tuple into the partition's slots (no locals in between).
            p = new_partition()
            if has_pref:
                (p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset, p.log_start_offset,
                 acount, p.preferred_read_replica, rlen) = unpack_probe(mv, pos)
            elif has_lss:
                (p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset, p.log_start_offset,
                 acount, rlen) = unpack_probe(mv, pos)
                p.preferred_read_replica = -1
            else:
                (p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset, acount,
                 rlen) = unpack_probe(mv, pos)
                p.log_start_offset = -1
                p.preferred_read_replica = -1
            pos += probe_size
            if acount == -1:
                p.aborted_transactions = None
            else:
                pos -= back  # the array follows the count; the probe's last fields were its first bytes
                if acount < 0 or acount * 16 > n - pos:
                    raise _bad("AbortedTransactions: array count", acount, n - pos, pos)
                aborted = []
                for _ in range(acount):
                    pid, first = unpack_aborted(mv, pos)
                    aborted.append(AbortedTransaction(pid, first))
                    pos += 16
                p.aborted_transactions = aborted
                if has_pref:
                    p.preferred_read_replica, rlen = unpack_i32_2(mv, pos)
                    pos += 8
                else:
                    (rlen,) = unpack_i32(mv, pos)
                    pos += 4
            if rlen >= 0:
                end = pos + rlen
                if end > n:
                    raise _bad("Records: declared length", rlen, n - pos, pos)
                p.records = src[pos:end]
                pos = end
            elif rlen == -1:
                p.records = None
            else:
                raise CodecError(f"Records: length {rlen}", where=pos)
            p.tags = None
            append(p)
        topics.append(FetchTopic(name, bytes(16), parts, None))
    return FetchResponseView(version, throttle, error_code, session_id, topics), pos


def _decode_flexible(mv: memoryview, version: int, src: bytes | memoryview) -> tuple[FetchResponseView, int]:
    """Versions 12-18 (KIP-482): compact strings/arrays/bytes (uvarint length + 1, 0 = null), a tag section
    after every struct. Records are sliced out of ``src`` (``mv`` itself, or the bytes ``mv`` views)."""
    n = len(mv)
    throttle, error_code, session_id = _TOP_FLEX.unpack_from(mv, 0)
    pos = 10
    ntopics = mv[pos]
    if ntopics < 0x80:
        pos += 1
    else:
        ntopics, pos = _uvarint(mv, pos)
    ntopics -= 1
    if ntopics < 0 or ntopics > n - pos:
        raise _bad("Responses: array count", ntopics, n - pos, pos)
    by_id = version >= FIRST_TOPIC_ID
    unpack_head = _PART_FLEX_PROBE.unpack_from
    unpack_i32 = _I32.unpack_from
    new_partition = _DecodedPartition
    topics: list[FetchTopic] = []
    for _ in range(ntopics):
        if by_id:
            topic_id = bytes(mv[pos : pos + 16])
            if len(topic_id) != 16:
                raise CodecError("truncated TopicId", where=pos)
            name = ""
            pos += 16
        else:
            topic_id = bytes(16)
            nlen, pos = _uvarint(mv, pos)
            nlen -= 1
            if nlen < 0:
                raise CodecError(f"Topic: length {nlen} (null not allowed here)", where=pos)
            if nlen > n - pos:
                raise _bad("Topic: declared length", nlen, n - pos, pos)
            name = str(mv[pos : pos + nlen], "utf-8")
            pos += nlen
        nparts = mv[pos]
        if nparts < 0x80:
            pos += 1
        else:
            nparts, pos = _uvarint(mv, pos)
        nparts -= 1
        if nparts < 0 or nparts > n - pos:
            raise _bad("Partitions: array count", nparts, n - pos, pos)
        parts: list[FetchPartition] = []
        append = parts.append
        for _ in range(nparts):
            # One unpack for the common partition, AbortedTransactions null (compact count 0): PartitionIndex ..
            # LogStartOffset, the count byte, PreferredReadReplica and the two bytes that start the Records
            # length, straight into the partition's slots. No valid partition is shorter than these 37 bytes
            # (30 + count 1 + 4 + null records 1 + tags 1).
            p = new_partition()
            (p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset, p.log_start_offset, acount,
             p.preferred_read_replica, b0, b1) = unpack_head(mv, pos)
            if acount == 0:
                p.aborted_transactions = None
                # Records' compact length (uvarint): 1 byte below 127 record bytes, 2 below 16 KiB, 3 below 2 MiB
                if b0 < 0x80:
                    rlen = b0
                    pos += 36
                elif b1 < 0x80:
                    rlen = (b0 & 0x7F) | (b1 << 7)
                    pos += 37
                elif mv[pos + 37] < 0x80:  # 3 bytes: up to 2 MiB
                    rlen = (b0 & 0x7F) | ((b1 & 0x7F) << 7) | (mv[pos + 37] << 14)
                    pos += 38
                else:
                    rlen, pos = _uvarint(mv, pos + 35)
            else:
                # the probe read the array's first bytes as PreferredReadReplica: read them again in order
                p.aborted_transactions, pos = _flexible_aborted(mv, pos + 30, n, acount)
                (p.preferred_read_replica,) = unpack_i32(mv, pos)
                rlen, pos = _uvarint(mv, pos + 4)
            if rlen:
                end = pos + rlen - 1
                if end > n:
                    raise _bad("Records: declared length", rlen - 1, n - pos, pos)
                p.records = src[pos:end]
                pos = end
            else:
                p.records = None
            if mv[pos]:
                p.tags, pos = _skip_tags(mv, pos, n)
            else:
                p.tags = None
                pos += 1
            append(p)
        ttags, pos = _skip_tags(mv, pos, n)
        topics.append(FetchTopic(name, topic_id, parts, ttags))
    # Top-level tag section: NodeEndpoints (tag 0) is decoded from v16, everything else kept raw.
    raw_tags, pos = _skip_tags(mv, pos, n)
    unknown: dict[int, Buffer] = {}
    endpoints: list[NodeEndpoint] = []
    if raw_tags is not None:
        for tag, raw in parse_tags(raw_tags).items():
            if tag == NODE_ENDPOINTS_TAG and version >= FIRST_NODE_ENDPOINTS:
                endpoints = decode_endpoints(raw)
            else:
                unknown[tag] = raw
    return FetchResponseView(version, throttle, error_code, session_id, topics, endpoints, unknown), pos


def _flexible_aborted(mv: memoryview, pos: int, n: int,
                      first: int) -> tuple[list[AbortedTransaction] | None, int]:
    """A flexible AbortedTransactions array at ``pos``, whose first byte is ``first``: (list or None, next
    position)."""
    if first == 0:
        return None, pos + 1
    count, pos = _uvarint(mv, pos)
    count -= 1
    if count < 0:
        return None, pos  # null spelled with more bytes than needed (0x80 0x00): null, as construct reads it
    if count * 17 > n - pos:
        raise _bad("AbortedTransactions: array count", count, n - pos, pos)
    aborted = []
    unpack_aborted = _ABORTED.unpack_from
    for _ in range(count):
        pid, first_offset = unpack_aborted(mv, pos)
        if mv[pos + 16] == 0:
            tags = None
            pos += 17
        else:
            tags, pos = _skip_tags(mv, pos + 16, n)
        aborted.append(AbortedTransaction(pid, first_offset, tags))
    return aborted, pos


def _compact_string(mv: memoryview, pos: int, nullable: bool, what: str) -> tuple[str | None, int]:
    size, pos = _uvarint(mv, pos)
    size -= 1
    if size < 0:
        if nullable:
            return None, pos
        raise CodecError(f"{what}: null not allowed here", where=pos)
    if size > len(mv) - pos:
        raise _bad(f"{what}: declared length", size, len(mv) - pos, pos)
    return str(mv[pos : pos + size], "utf-8"), pos + size


def decode_endpoints(raw: memoryview) -> list[NodeEndpoint]:
    n = len(raw)
    count, pos = _uvarint(raw, 0)
    count -= 1
    if count < 0:
        # NodeEndpoints is not nullable (FetchResponse.json has no nullableVersions for it)
        raise CodecError("NodeEndpoints: null array not allowed")
    if count > n - pos:
        raise _bad("NodeEndpoints: array count", count, n - pos, pos)
    out: list[NodeEndpoint] = []
    for _ in range(count):
        (node_id,) = _I32.unpack_from(raw, pos)
        host, pos = _compact_string(raw, pos + 4, False, "Host")
        (port,) = _I32.unpack_from(raw, pos)
        rack, pos = _compact_string(raw, pos + 4, True, "Rack")
        tags, pos = _skip_tags(raw, pos, n)
        out.append(NodeEndpoint(node_id, host or "", port, rack, tags))
    if pos != n:
        raise CodecError(f"NodeEndpoints: {n - pos} trailing bytes")
    return out


# --------------------------------------------------------------------------------------------- encode


def encode(view: FetchResponseView) -> tuple[list[Buffer], int]:
    """Scatter-encode; see :meth:`FetchResponseView.encode`."""
    try:
        if view._topics is None and view.encoded is not None:
            return _encode_encoded(view, view.encoded)
        if view.version >= FIRST_FLEXIBLE:
            return _encode_flexible(view)
        return _encode_classic(view)
    except struct.error as e:
        raise CodecError(f"cannot encode: {e}", api=_API, version=view.version) from None
    except (TypeError, AttributeError, UnicodeEncodeError) as e:
        raise CodecError(f"cannot encode: {type(e).__name__}: {e}", api=_API, version=view.version) from None


def top_head(view: FetchResponseView, topics: int) -> bytes:
    """The fields before the topics array, and the array's count."""
    if view.version >= FIRST_FLEXIBLE:
        return _TOP_FLEX.pack(view.throttle_time_ms, view.error_code, view.session_id) + _uv(topics + 1)
    if view.version >= 7:
        return _TOP_V7.pack(view.throttle_time_ms, view.error_code, view.session_id, topics)
    return _TOP_V4.pack(view.throttle_time_ms, topics)


def top_tail(view: FetchResponseView) -> bytes:
    """What follows the topics array: the top-level tag section (v12+)."""
    return _top_tags(view) if view.version >= FIRST_FLEXIBLE else b""


def topic_head(version: int, topic: str | bytes, partitions: int) -> bytes:
    """A topic entry up to its partitions: the name (v4-12) or id (v13+), then the partitions array's count."""
    if version >= FIRST_FLEXIBLE:
        if isinstance(topic, bytes):
            if len(topic) != 16:
                raise CodecError(f"topic id of {len(topic)} bytes", api=_API, version=version)
            return topic + _uv(partitions + 1)
        name = topic.encode("utf-8")
        return _uv(len(name) + 1) + name + _uv(partitions + 1)
    name = str(topic).encode("utf-8")
    return _U16_LEN.pack(len(name)) + name + _I32.pack(partitions)


def topic_tail(version: int, tags: Buffer | None = None) -> bytes:
    """What closes a topic entry: its tag section (v12+)."""
    if version >= FIRST_FLEXIBLE:
        return _EMPTY_TAGS if tags is None else bytes(tags)
    return b""


def encode_partition(version: int, p: FetchPartition) -> list[Buffer]:
    """One partition as a response of ``version`` writes it: ``[head, records, tail]`` when it carries records
    (the records as they are, not copied), else ``[head + tail]``. The reference form of the layout the full
    encoders (:func:`_encode_flexible`, :func:`_encode_classic`) inline for speed; tests prove them equal."""
    records = p.records
    aborted = p.aborted_transactions
    head = bytearray()
    if version >= FIRST_FLEXIBLE:
        size = 0 if records is None else len(records) + 1
        head += _PART_FLEX.pack(p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset,
                                p.log_start_offset)
        if aborted is None:
            head.append(0)
        else:
            head += _uv(len(aborted) + 1)
            for a in aborted:
                head += _ABORTED.pack(a.producer_id, a.first_offset)
                head += _EMPTY_TAGS if a.tags is None else a.tags
        head += _I32.pack(p.preferred_read_replica)
        head += _uv(size)
        tail = _EMPTY_TAGS if p.tags is None else bytes(p.tags)
        has_records = size > 1
    else:
        rlen = -1 if records is None else len(records)
        if version >= 5:
            head += _PART_V5.pack(p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset,
                                  p.log_start_offset, -1 if aborted is None else len(aborted))
        else:
            head += _PART_V4.pack(p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset,
                                  -1 if aborted is None else len(aborted))
        for a in aborted or ():
            head += _ABORTED.pack(a.producer_id, a.first_offset)
        if version >= 11:
            head += _I32.pack(p.preferred_read_replica)
        head += _I32.pack(rlen)
        tail = b""
        has_records = rlen > 0
    if has_records:
        return [bytes(head), records, tail]  # type: ignore[list-item]
    return [bytes(head + tail)]


def _encode_encoded(view: FetchResponseView, encoded: EncodedTopics) -> tuple[list[Buffer], int]:
    out = [top_head(view, encoded.topic_count), *encoded.buffers, top_tail(view)]
    return out, sum(map(len, out))


def _encode_classic(view: FetchResponseView) -> tuple[list[Buffer], int]:
    version = view.version
    out: list[Buffer] = []
    emit = out.append
    # Header bytes that must precede the next record set (the top-level fields, a topic's name and count, the
    # heads of partitions without records); None when there are none, as after every non-empty record set.
    pending: bytearray | None = bytearray(top_head(view, len(view.topics)))
    has_lss = version >= 5
    has_pref = version >= 11
    null_head = _PART_V11_NULL.pack if has_pref else (_PART_V5_NULL.pack if has_lss else _PART_V4_NULL.pack)
    head = (_PART_V5 if has_lss else _PART_V4).pack
    pack_i32 = _I32.pack
    pack_aborted = _ABORTED.pack
    h: bytes | bytearray
    for t in view.topics:
        if pending is None:
            pending = bytearray()
        pending += topic_head(version, t.topic, len(t.partitions))
        for p in t.partitions:
            records = p.records
            rlen = -1 if records is None else len(records)
            aborted = p.aborted_transactions
            if aborted is None:
                if has_pref:
                    h = null_head(p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset,
                                  p.log_start_offset, -1, p.preferred_read_replica, rlen)
                elif has_lss:
                    h = null_head(p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset,
                                  p.log_start_offset, -1, rlen)
                else:
                    h = null_head(p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset,
                                  -1, rlen)
            else:
                h = bytearray()
                if has_lss:
                    h += head(p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset,
                              p.log_start_offset, len(aborted))
                else:
                    h += head(p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset,
                              len(aborted))
                for a in aborted:
                    h += pack_aborted(a.producer_id, a.first_offset)
                if has_pref:
                    h += pack_i32(p.preferred_read_replica)
                h += pack_i32(rlen)
            if pending is not None:
                pending += h
                h = pending
            if rlen > 0:
                emit(h)
                emit(records)  # type: ignore[arg-type]
                pending = None
            elif pending is None:
                pending = bytearray(h)
    if pending is not None:
        emit(pending)
    return out, sum(map(len, out))


def _encode_flexible(view: FetchResponseView) -> tuple[list[Buffer], int]:
    version = view.version
    out: list[Buffer] = []
    emit = out.append
    # Header bytes that must precede the next record set: the top-level fields, a topic's id or name and count,
    # partitions without records, tag sections. None stands for the commonest case, one zero byte (the empty tag
    # section of the partition whose records were just emitted): the next partition is then packed with that
    # byte in front (_PART_FLEX_LEAD_*), one buffer, one call.
    pending: bytearray | None = bytearray(top_head(view, len(view.topics)))
    by_id = version >= FIRST_TOPIC_ID
    lead_1 = _PART_FLEX_LEAD_1.pack
    lead_2 = _PART_FLEX_LEAD_2.pack
    lead_3 = _PART_FLEX_LEAD_3.pack
    uv2 = _UV2
    pack_null_1 = _PART_FLEX_NULL_1.pack
    pack_null_2 = _PART_FLEX_NULL_2.pack
    head = _PART_FLEX.pack
    pack_i32 = _I32.pack
    pack_aborted = _ABORTED.pack
    h: bytes | bytearray
    for t in view.topics:
        if pending is None:
            pending = bytearray(_EMPTY_TAGS)
        pending += topic_head(version, t.topic_id if by_id else t.topic, len(t.partitions))
        for p in t.partitions:
            records = p.records
            size = 0 if records is None else len(records) + 1  # compact length; 0 = null
            if p.aborted_transactions is None and size < 16384:
                # Records' compact length as a 1-byte (< 128) or 2-byte (< 16384) uvarint
                if size < 128:
                    if pending is None:
                        h = lead_1(0, p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset,
                                   p.log_start_offset, 0, p.preferred_read_replica, size)
                    else:
                        pending += pack_null_1(p.partition_index, p.error_code, p.high_watermark,
                                               p.last_stable_offset, p.log_start_offset, 0,
                                               p.preferred_read_replica, size)
                        h = pending
                elif pending is None:
                    h = lead_2(0, p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset,
                               p.log_start_offset, 0, p.preferred_read_replica, uv2[size])
                else:
                    pending += pack_null_2(p.partition_index, p.error_code, p.high_watermark,
                                           p.last_stable_offset, p.log_start_offset, 0, p.preferred_read_replica,
                                           uv2[size])
                    h = pending
            elif pending is None and size < 2097152 and p.aborted_transactions is None:
                h = lead_3(0, p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset,
                           p.log_start_offset, 0, p.preferred_read_replica, (size & 0x7F) | 0x80,
                           ((size >> 7) & 0x7F) | 0x80, size >> 14)
            else:
                if pending is None:
                    pending = bytearray(_EMPTY_TAGS)
                aborted = p.aborted_transactions
                pending += head(p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset,
                                p.log_start_offset)
                if aborted is None:
                    pending.append(0)
                else:
                    pending += _uv(len(aborted) + 1)
                    for a in aborted:
                        pending += pack_aborted(a.producer_id, a.first_offset)
                        pending += _EMPTY_TAGS if a.tags is None else a.tags
                pending += pack_i32(p.preferred_read_replica)
                pending += _uv(size)
                h = pending
            tags = p.tags
            if size > 1:
                emit(h)
                emit(records)  # type: ignore[arg-type]
                pending = None if tags is None else bytearray(tags)
            else:
                if h is not pending:
                    pending = bytearray(h)
                if tags is None:
                    pending.append(0)
                else:
                    pending += tags
        if pending is None:
            pending = bytearray(_EMPTY_TAGS)
        pending += _EMPTY_TAGS if t.tags is None else t.tags
    if pending is None:
        pending = bytearray(_EMPTY_TAGS)
    pending += top_tail(view)
    emit(pending)
    return out, sum(map(len, out))


def encode_endpoints(endpoints: list[NodeEndpoint]) -> bytes:
    out = bytearray(_uv(len(endpoints) + 1))
    for e in endpoints:
        host = e.host.encode("utf-8")
        out += _I32.pack(e.node_id) + _uv(len(host) + 1) + host + _I32.pack(e.port)
        if e.rack is None:
            out += b"\x00"
        else:
            rack = e.rack.encode("utf-8")
            out += _uv(len(rack) + 1) + rack
        out += _EMPTY_TAGS if e.tags is None else e.tags
    return bytes(out)


def _top_tags(view: FetchResponseView) -> bytes:
    fields: dict[int, Buffer] = dict(view.unknown_tags)
    if view.version >= FIRST_NODE_ENDPOINTS:
        # A tagged field is written only when it differs from its default, the empty list (KafkaStruct._build,
        # Kafka's generated FetchResponseData.write).
        fields.pop(NODE_ENDPOINTS_TAG, None)
        if view.node_endpoints:
            fields[NODE_ENDPOINTS_TAG] = encode_endpoints(view.node_endpoints)
    return build_tags(fields) or _EMPTY_TAGS
