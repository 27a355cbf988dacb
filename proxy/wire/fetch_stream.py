"""Streaming relay of Fetch v16+ responses: forward bytes as they arrive, hold back only the last tag section.

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

Sans-IO: ``feed(chunk) -> buffers to write``; the server owns the sockets.
"""

from __future__ import annotations

from collections.abc import Callable

from .errors import CodecError, codec_errors
from .fetch_fast import (
    Buffer,
    NodeEndpoint,
    build_tags,
    decode_endpoints,
    encode_endpoints,
    parse_tags,
)
from .fetch_layout import FIRST_NODE_ENDPOINTS, NODE_ENDPOINTS_TAG

#: The filler's tag numbers: far above any tag Kafka assigns (they count up from 0 per struct), so no client
#: will ever mistake the filler for a field it knows. Two, with varints of different lengths (5 and 4 bytes): a
#: filler's size varint grows from 1 to 2 bytes between 127 and 128, so some exact lengths can only be reached
#: by shortening the tag instead.
FILLER_TAGS = (0x7FFFFF00, 0x0FFFFF00)

# Scanner stages, in the order of FetchResponse.json v16+ (flexible, topic ids)
_HEADER_TAGS, _TOP, _TOPIC, _PARTITION, _RECORDS, _PARTITION_TAGS, _TOPIC_TAGS, _TAIL = range(8)


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
    """Relays one Fetch v16+ response body (everything after its correlation id) chunk by chunk.

    A resumable scanner finds where the top-level tag section starts: it parses whole elements (a partition
    header up to its record bytes, a tag section, ...) with direct indexing into the chunk, skips record bytes
    by their length, and stops at an element cut by the chunk's end; those few bytes are held back and scanned
    with the next chunk. Everything before them goes out as one zero-copy slice per chunk (~0.5 us per idle
    partition; the previous byte-stepping walk cost ~3 us and wrote several small buffers per partition)."""

    def __init__(self, version: int, size: int, rewrite: Callable[[list[NodeEndpoint]], None]) -> None:
        if version < FIRST_NODE_ENDPOINTS:
            raise CodecError(f"Fetch v{version} has no NodeEndpoints: relay it as bytes", api="Fetch")
        self._version = version
        self._left = size  # bytes of the body not yet fed
        self._rewrite = rewrite
        self._stage = _HEADER_TAGS
        self._topics = 0  # topics still to scan
        self._partitions = 0  # partitions of the current topic still to scan
        self._skip = 0  # record bytes of the current partition still to pass
        self._held = b""  # the start of an element cut by the previous chunk's end (not yet sent)
        self._tail: bytearray | None = None
        #: the endpoints were rewritten in place / replaced by a filler
        self.rewritten = False
        self.scrubbed = False

    @property
    def changed(self) -> bool:
        """The response went out other than it came in."""
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
        if self._stage == _RECORDS and not self._held and size < self._skip:
            # the common chunk of a large response: record bytes through and through, nothing to scan
            self._skip -= size
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
                out.append(buf[:pos])
        if self._left == 0:
            if self._tail is None:
                raise CodecError("Fetch response ended inside its partitions", api="Fetch")
            out.append(self._finish(bytes(self._tail)))
        return out

    def _scan(self, mv: memoryview, end: int) -> int:
        """Scan whole elements of ``mv[:end]`` from its start: the position before the first element not
        complete in it (or of the top-level tag section, stage _TAIL)."""
        pos, stage = 0, self._stage
        try:
            while True:
                if stage == _PARTITION:
                    # Partitions, the hot loop: PartitionIndex, ErrorCode, HighWatermark, LastStableOffset,
                    # LogStartOffset (30 bytes), AbortedTransactions (nullable compact array of ProducerId,
                    # FirstOffset + tags), PreferredReadReplica, Records (compact nullable bytes), tags.
                    if not self._partitions:
                        stage = _TOPIC_TAGS
                        continue
                    p = pos + 30
                    n = mv[p]
                    if n < 0x80:
                        p += 1
                    else:
                        n, p = _uv(mv, p, end)
                    for _ in range(n - 1):
                        p = _skip_tags(mv, p + 16, end)
                    p += 4
                    r = mv[p]
                    if r < 0x80:
                        p += 1
                    else:
                        r, p = _uv(mv, p, end)
                    self._partitions -= 1
                    if r > 1:
                        self._skip = r - 1
                        pos, stage = p, _RECORDS
                    elif p < end and mv[p] == 0:  # no records, no tags: the idle partition
                        pos = p + 1
                    else:
                        pos, stage = p, _PARTITION_TAGS
                elif stage == _RECORDS:
                    take = min(self._skip, end - pos)
                    pos += take
                    self._skip -= take
                    if self._skip:
                        break
                    stage = _PARTITION_TAGS
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
                    n, p = _uv(mv, pos + 16, end)  # TopicId, Partitions count
                    self._partitions = max(n - 1, 0)
                    pos, stage = p, _PARTITION
                elif stage == _TOP:
                    n, p = _uv(mv, pos + 10, end)  # ThrottleTimeMs, ErrorCode, SessionId, Responses count
                    self._topics = max(n - 1, 0)
                    pos, stage = p, _TOPIC
                elif stage == _HEADER_TAGS:  # the response header's (v1) tag section
                    pos = _skip_tags(mv, pos, end)
                    stage = _TOP
                else:
                    break
        except (_Incomplete, IndexError):
            pass  # the element at ``pos`` continues in the next chunk (counters move only once one is whole)
        self._stage = stage
        return pos

    def _finish(self, tail: bytes) -> bytes:
        if not tail:
            raise CodecError("Fetch response has no top-level tag section", api="Fetch")
        if tail == b"\x00":
            return tail  # no tagged fields: the usual case
        fields: dict[int, Buffer] = dict(parse_tags(tail))
        if build_tags(fields) != tail:  # trailing bytes or out-of-order tags: the walk lost its way
            raise CodecError("malformed top-level tag section", api="Fetch")
        raw = fields.get(NODE_ENDPOINTS_TAG)
        if raw is None:
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
