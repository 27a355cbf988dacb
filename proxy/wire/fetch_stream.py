"""Streaming relay of Fetch responses: forward bytes as they arrive, walking partition and batch headers, and
hold back only the last tag section.

KIP-951 put broker addresses into Fetch responses (v16+): NodeEndpoints, a tagged field of the top-level
struct, i.e. the very last bytes of the response, present only after a leadership change. Collecting a whole
response (often megabytes) to look at its last bytes would turn Sluice's streaming relay into
store-and-forward and cost consumers a large share of their throughput (measured: 0.5x of direct for the Java
consumer). So :class:`FetchStreamer` walks the response as it streams through — partition headers are parsed,
record bytes only counted — forwards every byte before the top-level tag section unchanged (record bytes as
zero-copy slices of the received chunks), and holds back only that section (normally one byte: no tags).

The frame's size prefix has already gone out, so a rewritten tag section must keep its length. The rewritten
NodeEndpoints is padded to the original length with a filler tagged field (clients skip tags they do not know,
KIP-482); when the rewritten form does not fit, NodeEndpoints is replaced by a filler of the same length: the
client then finds the new leader with a Metadata refresh, exactly as before KIP-951, and in either case never
sees a real broker address.

The same walk serves policies that read a Fetch response without changing its records (every version Sluice
reads, 4-18, FetchResponse.json): :meth:`FetchStreamer.watch` makes it note each partition as it passes
(:class:`SeenPartition`: its header's fields and, from the record batches' headers, the bytes of whole batches,
a truncated trailing batch not counted) and raise ``throttle_time_ms`` (the body's first field) to a floor in
the first bytes, before they go out.

Sans-IO: ``feed(chunk) -> buffers to write``; the server owns the sockets.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import NamedTuple

from .errors import CodecError, codec_errors
from .fetch_fast import (
    Buffer,
    NodeEndpoint,
    build_tags,
    decode_endpoints,
    encode_endpoints,
    parse_tags,
)
from .fetch_layout import (
    FIRST_FLEXIBLE,
    FIRST_LOG_START,
    FIRST_NODE_ENDPOINTS,
    FIRST_RACK,
    FIRST_SESSION,
    FIRST_TOPIC_ID,
    MAX_VERSION,
    MIN_VERSION,
    NODE_ENDPOINTS_TAG,
    TopicKey,
)
from .records import MAGIC_OFFSET, batch_end

#: The filler's tag numbers: far above any tag Kafka assigns (they count up from 0 per struct), so no client
#: will ever mistake the filler for a field it knows. Two, with varints of different lengths (5 and 4 bytes): a
#: filler's size varint grows from 1 to 2 bytes between 127 and 128, so some exact lengths can only be reached
#: by shortening the tag instead.
FILLER_TAGS = (0x7FFFFF00, 0x0FFFFF00)

# Scanner stages, in the order of FetchResponse.json (the tag sections from v12, KIP-482)
_HEADER_TAGS, _TOP, _TOPIC, _PARTITION, _RECORDS, _PARTITION_TAGS, _TOPIC_TAGS, _TAIL = range(8)

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_PART_HEAD = struct.Struct(">ihq")  # PartitionIndex, ErrorCode, HighWatermark
#: what a batch's end is known from (BaseOffset, Length, PartitionLeaderEpoch, Magic: records.batch_end)
_BATCH_HEAD = MAGIC_OFFSET + 1


class SeenPartition(NamedTuple):
    """A partition of a watched response as it passed (:meth:`FetchStreamer.watch`)."""

    #: the topic's name (v4-12) or id (v13+), as on the wire (fetch_layout's partition keys)
    topic: TopicKey
    partition: int
    error_code: int
    high_watermark: int
    #: record bytes sent
    records_size: int
    #: of which whole batches: a truncated trailing batch (the broker's read is a byte slice of the log) is not
    #: counted; all of them when a batch header is corrupt (the client reports that itself)
    complete_size: int
    #: the first batch's base offset (None: no batch header in the records)
    first_offset: int | None


class _Incomplete(Exception):
    """The element being scanned continues in a chunk that has not arrived yet."""


def _uv(mv: memoryview, pos: int, end: int) -> tuple[int, int]:
    """An unsigned varint at ``pos`` of ``mv[:end]``: (value, next position)."""
    value = shift = 0
    for i in range(pos, min(pos + 5, end)):
        b = mv[i]
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i + 1
        shift += 7
    if end - pos >= 5:
        raise CodecError("varint longer than 5 bytes", api="Fetch")
    raise _Incomplete


def _skip_tags(mv: memoryview, pos: int, end: int) -> int:
    """Past a tag section (KIP-482) that must lie wholly within ``mv[:end]``."""
    if pos >= end:
        raise _Incomplete
    if mv[pos] == 0:
        return pos + 1
    count, pos = _uv(mv, pos, end)
    for _ in range(count):
        _, pos = _uv(mv, pos, end)
        size, pos = _uv(mv, pos, end)
        pos += size
        if pos > end:
            raise _Incomplete
    return pos


class FetchStreamer:
    """Relays one Fetch response body (everything after its correlation id) chunk by chunk.

    A resumable scanner finds where the top-level tag section starts: it parses whole elements (a partition
    header up to its record bytes, a tag section, ...) with direct indexing into the chunk, skips record bytes
    by their length, and stops at an element cut by the chunk's end; those few bytes are held back and scanned
    with the next chunk. Everything before them goes out as one zero-copy slice per chunk (~0.5 us per idle
    partition; the previous byte-stepping walk cost ~3 us and wrote several small buffers per partition).

    ``rewrite`` (v16+) rewrites KIP-951 NodeEndpoints in the tag section; without it the section goes out as it
    came. Versions before v12 have no tag sections: the response ends with its last partition."""

    def __init__(self, version: int, size: int,
                 rewrite: Callable[[list[NodeEndpoint]], None] | None = None) -> None:
        if not MIN_VERSION <= version <= MAX_VERSION:
            raise CodecError(f"Fetch v{version} is outside {MIN_VERSION}-{MAX_VERSION}", api="Fetch")
        self._version = version
        self._flex = version >= FIRST_FLEXIBLE
        self._ids = version >= FIRST_TOPIC_ID
        # ThrottleTimeMs (+ ErrorCode, SessionId from v7); a partition's fixed fields up to AbortedTransactions:
        # PartitionIndex, ErrorCode, HighWatermark, LastStableOffset (+ LogStartOffset from v5)
        self._top = 10 if version >= FIRST_SESSION else 4
        self._fixed = 30 if version >= FIRST_LOG_START else 22
        self._rack = 4 if version >= FIRST_RACK else 0  # PreferredReadReplica
        self._left = size  # bytes of the body not yet fed
        self._rewrite = rewrite if version >= FIRST_NODE_ENDPOINTS else None
        self._stage = _HEADER_TAGS if self._flex else _TOP
        self._topics = 0  # topics still to scan
        self._partitions = 0  # partitions of the current topic still to scan
        self._skip = 0  # record bytes of the current partition still to pass
        self._gap = 0  # of which to pass before the next batch header is read (all of them when not walked)
        self._held = b""  # the start of an element cut by the previous chunk's end (not yet sent)
        self._tail: bytearray | None = None
        #: the endpoints were rewritten in place / replaced by a filler
        self.rewritten = False
        self.scrubbed = False
        #: watched (:meth:`watch`): the partitions seen so far, in response order; else None
        self.seen: list[SeenPartition] | None = None
        #: watched: the response's top-level ErrorCode (v7+) and the ThrottleTimeMs the broker put in it
        self.error_code = 0
        self.throttle_time_ms = 0
        self._floor = 0  # the ThrottleTimeMs the response carries at least
        self._patch = -1  # where in the chunk being scanned ThrottleTimeMs is to be raised to _floor
        # watched: the partition whose records pass (its header's fields, whole-batch bytes, first base offset)
        self._topic: TopicKey = b""
        self._head: tuple[int, int, int, int] = (0, 0, 0, 0)
        self._complete = 0
        self._first: int | None = None
        self._walking = False

    def watch(self, throttle_time_ms: int = 0) -> None:
        """Note each partition as it passes (:attr:`seen`, walking record batch headers) and make the response
        carry a ``throttle_time_ms`` of at least ``throttle_time_ms`` (the broker's when larger, KIP-219). Before
        the first :meth:`feed`."""
        self.seen = []
        self._floor = throttle_time_ms

    @property
    def changed(self) -> bool:
        """The response went out other than it came in (its endpoints; a raised throttle time is a field set, as
        proxy/wire/throttle_time.py sets it in a collected response, not a rewrite)."""
        return self.rewritten or self.scrubbed

    def feed(self, data: Buffer) -> list[Buffer]:
        """The buffers to send the client for this chunk; the held-back tail comes with the last chunk.
        Raises CodecError if the response is malformed (the caller closes the connection: part of the
        response has already gone out)."""
        view = data if isinstance(data, memoryview) else memoryview(data)
        size = len(view)
        if not size:
            return []
        if size > self._left:
            raise CodecError(f"{size - self._left} bytes beyond the Fetch response", api="Fetch")
        self._left -= size
        if self._stage == _RECORDS and not self._held and size < self._gap:
            # the common chunk of a large response: record bytes through and through, nothing to scan
            self._skip -= size
            self._gap -= size
            return [view]
        out: list[Buffer] = []
        if self._tail is not None:
            self._tail += view
        else:
            # An element cut by the last chunk is scanned again from its start, joined with this chunk (one
            # copy; the cut happens at most once per chunk).
            buf = memoryview(self._held + bytes(view)) if self._held else view
            self._held = b""
            pos = self._scan(buf, len(buf))
            if self._stage == _TAIL:
                self._tail = bytearray(buf[pos:])
            elif pos < len(buf):
                self._held = bytes(buf[pos:])
            if pos:
                at = self._patch
                if at < 0:
                    out.append(buf[:pos])
                else:  # ThrottleTimeMs raised in the response's first bytes (KIP-219: the larger time wins)
                    self._patch = -1
                    out += (buf[:at], _I32.pack(self._floor), buf[at + 4 : pos])
        if self._left == 0:
            if self._tail is None:
                raise CodecError("Fetch response ended inside its partitions", api="Fetch")
            out.append(self._finish(bytes(self._tail)))
        return out

    def _scan(self, mv: memoryview, end: int) -> int:
        """Scan whole elements of ``mv[:end]`` from its start: the position before the first element not
        complete in it (or of the top-level tag section, stage _TAIL)."""
        pos, stage = 0, self._stage
        flex, seen, fixed, rack = self._flex, self.seen, self._fixed, self._rack
        try:
            while True:
                if stage == _PARTITION:
                    # Partitions, the hot loop: PartitionIndex, ErrorCode, HighWatermark, LastStableOffset,
                    # LogStartOffset (v5+), AbortedTransactions (nullable array of ProducerId, FirstOffset, + tags
                    # when flexible), PreferredReadReplica (v11+), Records (nullable bytes), tags (v12+).
                    if not self._partitions:
                        if flex:
                            stage = _TOPIC_TAGS
                        else:
                            self._topics -= 1
                            stage = _TOPIC
                        continue
                    p = pos + fixed
                    if flex:
                        n = mv[p]
                        if n < 0x80:
                            p += 1
                        else:
                            n, p = _uv(mv, p, end)
                        for _ in range(n - 1):
                            p = _skip_tags(mv, p + 16, end)
                        p += rack
                        r = mv[p]
                        if r < 0x80:
                            p += 1
                        else:
                            r, p = _uv(mv, p, end)
                        self._partitions -= 1
                        if seen is None:  # the relay's own walk: the hot loop kept short
                            if r > 1:  # compact: length + 1, 0 = null
                                self._skip = self._gap = r - 1
                                pos, stage = p, _RECORDS
                            elif p < end and mv[p] == 0:  # no records, no tags: the idle partition
                                pos = p + 1
                            else:
                                pos, stage = p, _PARTITION_TAGS
                            continue
                        r -= 1
                    else:
                        n = _I32.unpack_from(mv, p)[0]
                        p += 4 + 16 * max(n, 0) + rack
                        r = _I32.unpack_from(mv, p)[0]  # -1 = null
                        p += 4
                        self._partitions -= 1
                        if seen is None:
                            if r > 0:
                                self._skip = self._gap = r
                                pos, stage = p, _RECORDS
                            else:
                                pos = p
                            continue
                    self._head = (*_PART_HEAD.unpack_from(mv, pos), max(r, 0))
                    if r > 0:
                        self._skip = r
                        self._complete, self._first, self._walking, self._gap = 0, None, True, 0
                        pos, stage = p, _RECORDS
                        continue
                    seen.append(SeenPartition(self._topic, *self._head, 0, None))
                    if not flex:
                        pos = p
                    elif p < end and mv[p] == 0:
                        pos = p + 1
                    else:
                        pos, stage = p, _PARTITION_TAGS
                elif stage == _RECORDS:
                    gap = self._gap
                    if gap:
                        take = min(gap, end - pos)
                        pos += take
                        self._skip -= take
                        self._gap = gap = gap - take
                        if gap:
                            break
                    if self._skip:
                        self._next_batch(mv, pos, end)
                        continue
                    if seen is not None:
                        seen.append(SeenPartition(self._topic, *self._head, self._complete, self._first))
                    stage = _PARTITION_TAGS if flex else _PARTITION
                elif stage == _PARTITION_TAGS:  # DivergingEpoch, CurrentLeader, SnapshotId
                    pos = _skip_tags(mv, pos, end)
                    stage = _PARTITION
                elif stage == _TOPIC_TAGS:
                    pos = _skip_tags(mv, pos, end)
                    self._topics -= 1
                    stage = _TOPIC
                elif stage == _TOPIC:
                    if not self._topics:
                        stage = _TAIL
                        break
                    if self._ids:  # TopicId, Partitions count
                        n, p = _uv(mv, pos + 16, end)
                        topic: TopicKey = bytes(mv[pos : pos + 16]) if seen is not None else b""
                    elif flex:  # v12: Topic (compact string), Partitions count
                        length, p = _uv(mv, pos, end)
                        q = p + max(length - 1, 0)
                        topic = str(mv[p:q], "utf-8", "replace") if seen is not None else ""
                        n, p = _uv(mv, q, end)
                    else:  # Topic (string), Partitions count
                        length = _I16.unpack_from(mv, pos)[0]
                        p = pos + 2 + max(length, 0)
                        n = _I32.unpack_from(mv, p)[0] + 1
                        topic = str(mv[pos + 2 : p], "utf-8", "replace") if seen is not None else ""
                        p += 4
                    self._topic = topic or bytes(16)  # as fetch_layout.topic_key keys a topic without a name
                    self._partitions = max(n - 1, 0)
                    pos, stage = p, _PARTITION
                elif stage == _TOP:
                    p = pos + self._top  # ThrottleTimeMs, ErrorCode, SessionId, Responses count
                    if flex:
                        n, p = _uv(mv, p, end)
                    else:
                        n = _I32.unpack_from(mv, p)[0] + 1
                        p += 4
                    self._topics = max(n - 1, 0)
                    if seen is not None:
                        self.throttle_time_ms = _I32.unpack_from(mv, pos)[0]
                        if self._top > 4:
                            self.error_code = _I16.unpack_from(mv, pos + 4)[0]
                        if 0 < self._floor and self._floor > self.throttle_time_ms:
                            self._patch = pos
                    pos, stage = p, _TOPIC
                elif stage == _HEADER_TAGS:  # the response header's (v1) tag section
                    pos = _skip_tags(mv, pos, end)
                    stage = _TOP
                else:
                    break
        except (_Incomplete, IndexError, struct.error):
            pass  # the element at ``pos`` continues in the next chunk (counters move only once one is whole)
        self._stage = stage
        return pos

    def _next_batch(self, mv: memoryview, pos: int, end: int) -> None:
        """Record bytes are left at ``pos`` of a watched partition: how many pass before the next batch header
        (``_gap``), from the header there (records.batch_end's framing rules: Kafka's
        ByteBufferLogInputStream), or all of them once the walk stopped (a truncated trailing batch, a corrupt
        header). _Incomplete when the header is cut by the chunk's end."""
        skip = self._skip
        if self._walking:
            need = min(_BATCH_HEAD, skip)
            if end - pos < need:
                raise _Incomplete
            if self._first is None and skip >= 8:
                self._first = _I64.unpack_from(mv, pos)[0]
            try:
                batch = batch_end(mv, pos, pos + skip) - pos
            except CodecError:
                self._complete = self._head[3]
                batch = -1
            if batch > 0:
                self._complete += batch
                self._gap = batch
                return
            self._walking = False
        self._gap = skip

    def _finish(self, tail: bytes) -> bytes:
        if not self._flex:
            if tail:
                raise CodecError(f"{len(tail)} bytes after the Fetch response's topics", api="Fetch")
            return tail
        if not tail:
            raise CodecError("Fetch response has no top-level tag section", api="Fetch")
        if tail == b"\x00":
            return tail  # no tagged fields: the usual case
        fields: dict[int, Buffer] = dict(parse_tags(tail))
        if build_tags(fields) != tail:  # trailing bytes or out-of-order tags: the walk lost its way
            raise CodecError("malformed top-level tag section", api="Fetch")
        raw = fields.get(NODE_ENDPOINTS_TAG)
        if raw is None or self._rewrite is None:
            return tail
        # Malformed endpoints (a host that is not UTF-8, a truncated entry) or ones that cannot be rewritten (a
        # listener port past int32) fail like any malformed response: CodecError, the connection is closed.
        with codec_errors("NodeEndpoints", api="Fetch", version=self._version):
            endpoints = decode_endpoints(memoryview(raw))
            self._rewrite(endpoints)
            fields[NODE_ENDPOINTS_TAG] = encode_endpoints(endpoints)
        fitted = _fit(fields, len(tail))
        if fitted is not None:
            self.rewritten = True
            return fitted
        del fields[NODE_ENDPOINTS_TAG]
        fitted = _fit(fields, len(tail))
        if fitted is None:
            raise CodecError("cannot hide NodeEndpoints within its length", api="Fetch")
        self.scrubbed = True
        return fitted


def _fit(fields: dict[int, Buffer], length: int) -> bytes | None:
    """The tag section for ``fields`` at exactly ``length`` bytes, padded with a filler tag if needed."""
    plain = build_tags(fields) or b"\x00"
    if len(plain) == length:
        return plain
    if len(plain) > length:
        return None
    gap = length - len(plain)
    for tag in FILLER_TAGS:
        for size in range(max(0, gap - 12), gap + 1):
            padded = build_tags({**fields, tag: bytes(size)}) or b""
            if len(padded) == length:
                return padded
    return None
