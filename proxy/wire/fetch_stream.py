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

from collections.abc import Callable, Generator
from typing import Any

from .errors import CodecError
from .fetch_fast import (
    FIRST_NODE_ENDPOINTS,
    NODE_ENDPOINTS_TAG,
    Buffer,
    NodeEndpoint,
    build_tags,
    decode_endpoints,
    encode_endpoints,
    parse_tags,
)

#: The filler's tag numbers: far above any tag Kafka assigns (they count up from 0 per struct), so no client
#: will ever mistake the filler for a field it knows. Two, with varints of different lengths (5 and 4 bytes): a
#: filler's size varint grows from 1 to 2 bytes between 127 and 128, so some exact lengths can only be reached
#: by shortening the tag instead.
FILLER_TAGS = (0x7FFFFF00, 0x0FFFFF00)

_NEED, _SKIP, _TAIL = 0, 1, 2
_Walk = Generator[tuple[int, int], Any, None]


def _uvarint(first: int | None = None) -> Generator[tuple[int, int], Any, int]:
    """An unsigned varint, byte by byte; ``first`` is its first byte when the caller already read it."""
    value = shift = 0
    for _ in range(5):
        byte = first if first is not None else (yield _NEED, 1)[0]
        first = None
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value
        shift += 7
    raise CodecError("varint longer than 5 bytes")


def _tags(first: int | None = None) -> Generator[tuple[int, int], Any, None]:
    count = yield from _uvarint(first)
    for _ in range(count):
        yield from _uvarint()
        size = yield from _uvarint()
        if size:
            yield _SKIP, size


def _walk_body() -> _Walk:
    """FetchResponse v16+ (flexible, topic ids) from the response header's tag section to the top-level tags:
    yields (_NEED, n) to read n bytes, (_SKIP, n) to pass n bytes by, (_TAIL, 0) at the top-level tags.
    Fixed-size runs are read together with the first byte of the varint that follows them (one step instead of
    several: the walk runs once per partition of every streamed response)."""
    yield from _tags()  # response header v1 tags
    head = yield _NEED, 11  # ThrottleTimeMs, ErrorCode, SessionId + the Responses count's first byte
    for _ in range((yield from _uvarint(head[10])) - 1):  # Responses
        head = yield _NEED, 17  # TopicId + the Partitions count's first byte
        for _ in range((yield from _uvarint(head[16])) - 1):  # Partitions
            # PartitionIndex, ErrorCode, HighWatermark, LastStableOffset, LogStartOffset + AbortedTransactions'
            # count's first byte (nullable: 0 = null)
            head = yield _NEED, 31
            b = head[30]
            for _ in range((b if b < 0x80 else (yield from _uvarint(b))) - 1):
                yield _SKIP, 16  # ProducerId, FirstOffset
                yield from _tags()
            head = yield _NEED, 5  # PreferredReadReplica + the Records length's first byte
            b = head[4]
            records = (b if b < 0x80 else (yield from _uvarint(b))) - 1
            if records > 0:
                yield _SKIP, records
            b = (yield _NEED, 1)[0]  # tagged fields: DivergingEpoch, CurrentLeader, SnapshotId
            if b:
                yield from _tags(b)
        yield from _tags()
    yield _TAIL, 0


class FetchStreamer:
    """Relays one Fetch v16+ response body (everything after its correlation id) chunk by chunk."""

    def __init__(self, version: int, size: int, rewrite: Callable[[list[NodeEndpoint]], None]) -> None:
        if version < FIRST_NODE_ENDPOINTS:
            raise CodecError(f"Fetch v{version} has no NodeEndpoints: relay it as bytes", api="Fetch")
        self._left = size  # bytes of the body not yet fed
        self._rewrite = rewrite
        self._walk = _walk_body()
        self._op, self._n = next(self._walk)
        self._need = bytearray()
        self._tail: bytearray | None = None
        #: the endpoints were rewritten in place / replaced by a filler
        self.rewritten = False
        self.scrubbed = False

    def feed(self, data: Buffer) -> list[Buffer]:
        """The buffers to send the client for this chunk; the held-back tail comes with the last chunk.
        Raises CodecError if the response is malformed (the caller closes the connection: part of the
        response has already gone out)."""
        view = data if isinstance(data, memoryview) else memoryview(data)
        end = len(view)
        if not end:
            return []
        if end > self._left:
            raise CodecError(f"{end - self._left} bytes beyond the Fetch response", api="Fetch")
        self._left -= end
        out: list[Buffer] = []
        pos = 0
        while pos < end:
            if self._tail is not None:
                self._tail += view[pos:]
                break
            if self._op == _SKIP:
                take = min(self._n, end - pos)
                out.append(view[pos : pos + take])
                pos += take
                self._n -= take
                if self._n == 0:
                    self._step(None)
            elif self._op == _NEED:
                take = min(self._n - len(self._need), end - pos)
                self._need += view[pos : pos + take]
                pos += take
                if len(self._need) == self._n:
                    got = bytes(self._need)
                    self._need.clear()
                    out.append(got)
                    self._step(got)
            else:  # _TAIL: the rest of the body is the top-level tag section
                self._tail = bytearray()
        if self._left == 0:
            if self._tail is None:
                if self._op != _TAIL:
                    raise CodecError("Fetch response ended inside its partitions", api="Fetch")
                self._tail = bytearray()
            out.append(self._finish(bytes(self._tail)))
        return out

    def _step(self, sent: bytes | None) -> None:
        # No bounds check is needed here: a walk that does not reach the tag section exactly at the end of
        # the frame is caught in feed() ("ended inside its partitions") or by parse_tags on a bogus tail.
        try:
            self._op, self._n = self._walk.send(sent)
        except StopIteration:
            raise CodecError("Fetch response walk ended early", api="Fetch") from None

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
