"""The Fetch *request* fast path: decode a client's Fetch request into partition keys and fetch parameters, and
re-encode it with other partitions and session fields, without the construct reference codec.

Why: the fetch-session policies (:mod:`proxy.policies.terminate.sessions`, :mod:`proxy.policies.terminate`)
read every client Fetch request and rewrite it for the upstream session. Through the construct codec that
costs ~8.5 us per partition to decode and ~12 us to rewrite, which a consumer with 10,000 partitions pays on
every fetch. Like the response side (:mod:`proxy.wire.fetch_fast`), this is a hand-written per-version layout
read with ``struct.unpack_from`` over a memoryview (one unpack per partition) and written with
``struct.pack`` and one ``bytes.join``.

Layout: Kafka's ``FetchRequest.json`` (clients/src/main/resources/common/message/, as shipped by
kafka-python; Sluice decodes versions 4-18, flexible from 12, KIP-482):

- body: ReplicaId int32 (0-14; from 15 it is inside the tagged ReplicaState, KIP-903), MaxWaitMs, MinBytes,
  MaxBytes int32, IsolationLevel int8, SessionId and SessionEpoch int32 (7+, KIP-227), Topics,
  ForgottenTopicsData (7+), RackId string (11+), then (12+) the top-level tag section: ClusterId (tag 0,
  nullable string), ReplicaState (tag 1, 15+: ReplicaId int32, ReplicaEpoch int64);
- topic: Topic name (0-12) or TopicId uuid (13+), Partitions, (12+) tag section;
- partition: Partition int32, CurrentLeaderEpoch int32 (9+), FetchOffset int64, LastFetchedEpoch int32 (12+),
  LogStartOffset int64 (5+), PartitionMaxBytes int32, (12+) tag section: ReplicaDirectoryId (tag 0, 17+),
  HighWatermark (tag 1, 18+);
- forgotten topic: Topic name (7-12) or TopicId (13+), Partitions []int32, (12+) tag section.

What is kept byte for byte: the request header, the fixed top-level fields (only SessionId/SessionEpoch are
replaced on encode), RackId and the whole top-level tag section (ClusterId, ReplicaState, unknown tags), and
each partition's tag section (in :attr:`FetchParams.tags`). What is not: the topic-level and forgotten-topic
tag sections (the spec defines no field there; the topics are regrouped on encode, so there is no entry to
attach them to), like :func:`proxy.policies.terminate.sessions.apply_plan`, which builds fresh topic entries.

The request-side policies (KIP-74 size limits, KIP-73 throttles, KIP-227 terminate mode) share one decode and
at most one encode per request through :class:`FetchEdit`.

Equivalence with the construct codec is proven by tests/property/test_fetch_request_fast.py.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import NamedTuple

from .api_keys import ApiKey
from .compiler import tag_section_at, uvarint_at
from .errors import CodecError, codec_errors
from .fetch_fast import _EMPTY_TAGS, _bad, _compact_string, _uv, parse_tags
from .fetch_layout import (
    CLUSTER_ID_TAG,
    FINAL_EPOCH,
    FIRST_FLEXIBLE,
    FIRST_LEADER_EPOCH,
    FIRST_LOG_START,
    FIRST_RACK,
    FIRST_REPLICA_STATE,
    FIRST_SESSION,
    FIRST_TOPIC_ID,
    MAX_VERSION,
    MIN_VERSION,
    REPLICA_STATE_TAG,
    PartitionKey,
    TopicKey,
)
from .messages import RequestHeader, peek_request_header

_API = "FetchRequest"

Buffer = bytes | bytearray | memoryview

# Fixed top-level fields, ending with SessionId, SessionEpoch from v7 (always the last 8 bytes)
_FIXED_V4 = struct.Struct(">iiiib")  # ReplicaId, MaxWaitMs, MinBytes, MaxBytes, IsolationLevel
_FIXED_V7 = struct.Struct(">iiiibii")  # ... SessionId, SessionEpoch (v7-14)
_FIXED_V15 = struct.Struct(">iiibii")  # MaxWaitMs, MinBytes, MaxBytes, IsolationLevel, SessionId, SessionEpoch
_SESSION = struct.Struct(">ii")
# MaxBytes' offset in the fixed fields: after ReplicaId, MaxWaitMs, MinBytes (v4-14); ReplicaId is gone from v15
_MAX_BYTES_AT = 12
_MAX_BYTES_AT_V15 = 8
# Partitions
_PART_V4 = struct.Struct(">iqi")  # Partition, FetchOffset, PartitionMaxBytes
_PART_V5 = struct.Struct(">iqqi")  # Partition, FetchOffset, LogStartOffset, PartitionMaxBytes
_PART_V9 = struct.Struct(">iiqqi")  # Partition, CurrentLeaderEpoch, FetchOffset, LogStartOffset, PartitionMaxBytes
_PART_FLEX = struct.Struct(">iiqiqi")  # Partition, CurrentLeaderEpoch, FetchOffset, LastFetchedEpoch, LSO, PMB
_PART_FLEX_T = struct.Struct(">iiqiqiB")  # ... and the first byte of its tag section (0: empty)
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_REPLICA_STATE = struct.Struct(">iq")  # ReplicaState: ReplicaId, ReplicaEpoch
#: FetchPartition's tagged fields, kept raw but sized as the construct codec reads them: (tag, size, first version):
#: ReplicaDirectoryId (uuid, 17+), HighWatermark (int64, 18+)
_PARTITION_TAGS = ((0, 16, 17), (1, 8, 18))

_new = tuple.__new__


class FetchParams(NamedTuple):
    """What a client asks of one partition (Kafka's FetchRequest.PartitionData), with the partition's raw tag
    section. The fetch-session policies use this type (proxy.policies.terminate.sessions imports it from here). A
    NamedTuple rather than a frozen dataclass because it is built once per partition on the hot path (a fifth
    of the cost).

    Equality is over every field, ``tags`` included, compared as raw bytes. Clients write a tag section
    canonically (ascending tags, minimal varints, only non-default fields), so two requests with the same
    per-partition fields give equal params; a changed tagged field (ReplicaDirectoryId, v17+; HighWatermark,
    v18+; unknown tags) makes the partition "altered", so an incremental upstream request forwards the new
    value instead of silently keeping the old one. (Kafka's PartitionData.equals compares the plain fields;
    the tagged ones are follower fields a consumer does not send, so this only matters for odd clients.)
    ``tags`` is None for an empty tag section (and before v12, where it is also ignored on encode).
    """

    fetch_offset: int
    log_start_offset: int = -1  # v5+; the fetcher's own log start (followers), -1 for consumers
    partition_max_bytes: int = 1048576
    current_leader_epoch: int = -1  # v9+
    last_fetched_epoch: int = -1  # v12+
    tags: bytes | None = None  # v12+: the raw tag section (count included), None when empty


class FetchRequestView:
    """A decoded Fetch request. It holds no reference to the frame (keys, params and raw parts are copies), so
    the caller may reuse its receive buffer. Treat it as read-only: :func:`encode_fetch_request` re-emits the
    header, the fixed fields, RackId and the top-level tag section from the raw bytes kept here."""

    __slots__ = ("_blocks", "_forgotten", "_head", "_partitions", "_tail", "cluster_id", "correlation_id", "header",
                 "isolation_level", "max_bytes", "max_wait_ms", "min_bytes", "rack_id", "replica_epoch",
                 "replica_id", "session_epoch", "session_id", "tags", "topic_keys", "version")

    version: int
    correlation_id: int
    header: bytes  # the request header as received (the frame up to the body)
    replica_id: int  # ReplicaId (v4-14) or ReplicaState.ReplicaId (v15+; -1 when absent)
    replica_epoch: int  # ReplicaState.ReplicaEpoch (v15+), else -1
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    isolation_level: int
    session_id: int  # v7+; 0 (INVALID_SESSION_ID) before
    session_epoch: int  # v7+; -1 (FINAL_EPOCH) before: such a request is session-less
    rack_id: str  # v11+; "" before
    cluster_id: str | None  # tagged ClusterId (v12+), None when absent
    tags: bytes | None  # the top-level tag section as received (v12+), None when empty
    _head: bytes  # the fixed top-level fields as received
    _tail: bytes  # RackId and the top-level tag section as received
    _partitions: dict[PartitionKey, FetchParams]
    _forgotten: list[PartitionKey]
    #: every topic the request names (its topics, then the forgotten ones), in order, repeats kept: lets a
    #: caller resolve topic ids per topic instead of per partition
    topic_keys: list[TopicKey]
    #: where each topic's partitions sit in the frame, when every partition has the fixed layout (no tagged
    #: fields): (start, count, size, topic); None otherwise (see :func:`changed_partitions`)
    _blocks: list[tuple[int, int, int, TopicKey]] | None

    def partitions(self) -> dict[PartitionKey, FetchParams]:
        """The partitions in request order; a repeated partition keeps its first position and its last
        parameters (Kafka reads them into a map; so does
        :class:`proxy.policies.terminate.sessions.SessionServer`). A new dict on each call."""
        return dict(self._partitions)

    @property
    def params(self) -> Mapping[PartitionKey, FetchParams]:
        """The partitions in request order, as :meth:`partitions` but read-only and not copied (the hot paths)."""
        return MappingProxyType(self._partitions)

    def forgotten(self) -> list[PartitionKey]:
        """ForgottenTopicsData flattened in request order (v7+; empty before)."""
        return list(self._forgotten)

    def replace(self, partitions: Mapping[PartitionKey, FetchParams], max_bytes: int,
                session_epoch: int | None = None) -> FetchRequestView:
        """This request with other partitions (in their order), MaxBytes and (v7+) SessionEpoch: what
        :func:`encode_fetch_request` and the session policies then see. A new view; ``partitions`` is copied."""
        out = object.__new__(FetchRequestView)
        for name in FetchRequestView.__slots__:
            setattr(out, name, getattr(self, name))
        out._partitions = dict(partitions)
        out.max_bytes = max_bytes
        session = None
        if session_epoch is not None and self.version >= FIRST_SESSION:
            out.session_epoch = session_epoch
            session = (self.session_id, session_epoch)
        out._head = _head_with(self, max_bytes, None, session)
        return out

    @property
    def from_follower(self) -> bool:
        """A follower broker's fetch (FetchRequest.isFromFollower: its replica id, in ReplicaState from v15,
        is a broker id, >= 0); a consumer's is -1 (an observer's, -2, is no follower either)."""
        return self.replica_id >= 0

    @property
    def has_partitions(self) -> bool:
        """At least one partition is requested (a topic entry with no partitions does not count)."""
        return bool(self._partitions)

    @property
    def partition_count(self) -> int:
        return len(self._partitions)

    def __repr__(self) -> str:
        return (f"FetchRequestView(v{self.version}, session {self.session_id}/{self.session_epoch}, "
                f"{len(self._partitions)} partitions, {len(self._forgotten)} forgotten)")


class FetchEdit:
    """A client's Fetch request while the request-side policies edit it, so that it is decoded once and encoded
    at most once however many of them apply (a decode and re-encode per policy through the construct codec cost
    ~85 ms each for 10,000 partitions, blocking the event loop). Each policy reads :attr:`view` and edits
    :attr:`partitions` (order included: a broker fills the response in request order under MaxBytes, KIP-74)
    and :attr:`max_bytes`, setting :attr:`changed`; the chain then sends :meth:`encode` (or a session policy
    builds its own frame from :meth:`request`). The session id and ForgottenTopicsData are never edited here; the
    session epoch is (:attr:`session_epoch`: a policy that sends requests of its own in the client's session
    numbers the client's next ones after them, KIP-227's epochs counting every request of a session)."""

    __slots__ = ("changed", "max_bytes", "partitions", "replacement", "session_epoch", "view")

    def __init__(self, view: FetchRequestView) -> None:
        self.view = view
        self.partitions: dict[PartitionKey, FetchParams] = view.partitions()
        self.max_bytes: int = view.max_bytes
        self.session_epoch: int = view.session_epoch
        self.changed = False
        #: a whole request frame a policy built itself to send instead (fetch sessions write their own)
        self.replacement: bytes | None = None

    def replace_frame(self, frame: bytes) -> None:
        """Send ``frame`` (header included, no size prefix) instead of the edited request."""
        self.replacement = frame
        self.changed = True

    def request(self) -> FetchRequestView:
        """The request as edited so far (the decoded view itself when nothing changed)."""
        if not self.changed:
            return self.view
        return self.view.replace(self.partitions, self.max_bytes, self.session_epoch)

    def encode(self) -> bytes:
        """The edited request frame (header included, no size prefix), the client's session id kept; or the
        frame a policy put in its place (:meth:`replace_frame`)."""
        if self.replacement is not None:
            return self.replacement
        v = self.view
        return encode_fetch_request(v, v.session_id, self.session_epoch, self.partitions, v._forgotten,
                                    max_bytes=self.max_bytes)


def _head_with(view: FetchRequestView, max_bytes: int | None, max_wait_ms: int | None,
               session: tuple[int, int] | None) -> bytes:
    """The fixed top-level fields as received, with MaxBytes (v3+, KIP-74), MaxWaitMs and (v7+) SessionId and
    SessionEpoch replaced when given."""
    head = view._head
    replica = 0 if view.version >= FIRST_REPLICA_STATE else 4  # ReplicaId leads them up to v14
    if max_wait_ms is not None and max_wait_ms != view.max_wait_ms:
        head = head[:replica] + _I32.pack(max_wait_ms) + head[replica + 4 :]
    if max_bytes is not None and max_bytes != view.max_bytes:
        at = _MAX_BYTES_AT_V15 if view.version >= FIRST_REPLICA_STATE else _MAX_BYTES_AT
        head = head[:at] + _I32.pack(max_bytes) + head[at + 4 :]
    if session is not None and view.version >= FIRST_SESSION:
        head = head[:-8] + _SESSION.pack(*session)
    return head


# --------------------------------------------------------------------------------------------- decode


def decode_fetch_request(frame: Buffer, head: RequestHeader | None = None) -> FetchRequestView:
    """Decode a Fetch request frame (request header and body, without the 4-byte size prefix); ``head``: its
    header as :func:`~proxy.wire.messages.peek_request_header` read it already (the chain reads every request's).

    Malformed input (truncated, impossible lengths or counts, invalid UTF-8, misordered tags, trailing bytes,
    another API, a version outside 4-18) raises :class:`CodecError`, as the construct codec would."""
    mv = frame if isinstance(frame, memoryview) else memoryview(frame)
    if head is None:
        head = peek_request_header(mv)
    version = head.api_version
    if head.api_key != ApiKey.FETCH:
        raise CodecError(f"api key {head.api_key} is not Fetch", api=head.api_key, version=version)
    if not MIN_VERSION <= version <= MAX_VERSION or head.body_offset is None:
        raise CodecError(f"Fetch request version {version} outside {MIN_VERSION}-{MAX_VERSION}",
                         api=_API, version=version)
    view = object.__new__(FetchRequestView)
    view.version = version
    view.correlation_id = head.correlation_id
    view.header = bytes(mv[: head.body_offset])
    with codec_errors("Fetch request", api=_API, version=version):
        if version >= FIRST_FLEXIBLE:
            pos = _decode_flexible(view, mv, head.body_offset)
        else:
            pos = _decode_classic(view, mv, head.body_offset)
    if pos != len(mv):
        raise CodecError(f"{len(mv) - pos} trailing bytes", where=pos, api=_API, version=version)
    return view


def sessionless(frame: Buffer, head: RequestHeader) -> bool:
    """Whether the Fetch request ``frame`` (its header ``head``) is outside a fetch session (KIP-227: v4-6, or
    SessionEpoch -1, FINAL_EPOCH), read from its fixed fields without decoding it. False when the frame is too
    short to hold them (a decode then says why)."""
    version, pos = head.api_version, head.body_offset
    if pos is None or version < FIRST_SESSION:
        return pos is not None
    fixed = _FIXED_V15 if version >= FIRST_REPLICA_STATE else _FIXED_V7
    end = pos + fixed.size  # SessionEpoch is the last fixed field
    return len(frame) >= end and _I32.unpack_from(frame, end - 4)[0] == FINAL_EPOCH


def topic_keys(frame: Buffer, head: RequestHeader) -> list[TopicKey] | None:
    """The topics a flexible Fetch request ``frame`` (its header ``head``; v12+) names, in its topics and its
    forgotten topics, in order (:attr:`FetchRequestView.topic_keys`: ids from v13), read without decoding its
    partitions: each is 33 bytes when none has tagged fields (the layout :class:`Baseline` reads too), so this is
    O(topics). None when a partition has tagged fields or the frame is not of that shape: decode it (which says
    why when it is malformed). What follows the forgotten topics (RackId, tags) is not read."""
    version, pos = head.api_version, head.body_offset
    if pos is None or version < FIRST_FLEXIBLE:
        return None
    mv = frame if isinstance(frame, memoryview) else memoryview(frame)
    n = len(mv)
    by_id = version >= FIRST_TOPIC_ID
    pos += (_FIXED_V15 if version >= FIRST_REPLICA_STATE else _FIXED_V7).size
    keys: list[TopicKey] = []
    topic: TopicKey
    try:
        entries, pos = uvarint_at(mv, pos)
        for _ in range(entries - 1):
            topic, pos = _topic_key(mv, pos, n, by_id)
            count, pos = uvarint_at(mv, pos)
            end = pos + (count - 1) * 33  # the topic's tag section
            if count < 1 or end >= n or mv[end] or any(mv[pos + 32 : end : 33]):
                return None
            keys.append(topic)
            pos = end + 1
        entries, pos = uvarint_at(mv, pos)
        for _ in range(entries - 1):  # ForgottenTopicsData: the topic, its partition indexes, a tag section
            topic, pos = _topic_key(mv, pos, n, by_id)
            count, pos = uvarint_at(mv, pos)
            pos += (count - 1) * 4
            if count < 1 or pos >= n or mv[pos]:
                return None
            keys.append(topic)
            pos += 1
    except (IndexError, struct.error, CodecError, UnicodeDecodeError):
        return None
    return keys


class Baseline:
    """A session-less client's request, decoded once, that its later requests are read against: by comparing
    bytes (C-level comparisons of slices; only the partitions in slices that differ are read), not by decoding
    every partition. librdkafka and aiokafka list every partition in every fetch, and usually only the fetch
    offsets of the partitions that returned records change; decoding 10,000 partitions is ~4.5 ms of the proxy's
    CPU per fetch, reading them against a baseline ~0.1 ms. The order of the partitions may differ from the
    baseline's (librdkafka starts each fetch one partition further on, splitting a topic into two entries): each
    topic entry is matched to where its partitions sit in the baseline.

    :meth:`read` gives the params of the partitions whose bytes differ from the baseline's, or None when the
    request differs in anything else (API version, fixed fields, the set of partitions, forgotten topics,
    RackId, tags) or has tagged partitions: decode it then (and make it the new baseline)."""

    __slots__ = ("_at", "_body", "_fixed", "_frame", "_tail", "_unpack", "view")

    def __init__(self, view: FetchRequestView, frame: bytes) -> None:
        self.view = view
        self._frame = frame
        self._body = len(view.header)
        self._unpack = _part_unpack(view.version)
        blocks = view._blocks
        #: where each partition's record starts in the baseline frame (None: not the fixed layout)
        self._at: dict[PartitionKey, int] | None = None
        self._fixed = self._tail = b""
        if blocks and sum(count for _, count, _, _ in blocks) == len(view._partitions):  # none listed twice
            at: dict[PartitionKey, int] = {}
            keys = iter(view._partitions)
            for start, count, size, _ in blocks:
                for n in range(count):
                    at[next(keys)] = start + n * size
            self._at = at
            self._fixed = frame[self._body : self._body + len(view._head)]
            start, count, size, _ = blocks[-1]
            self._tail = frame[start + count * size + _tag_len(view.version) :]

    def read(self, frame: bytes) -> tuple[FetchRequestView, dict[PartitionKey, FetchParams]] | None:
        """``frame`` read against the baseline: a view of it (the baseline's, with this request's header) and the
        params of the partitions whose bytes differ from the baseline's; None: decode it."""
        at, base = self._at, self._frame
        body = self._body
        if at is None or frame[:4] != base[:4] or frame[8:body] != base[8:body]:
            return None  # another API version or client id (the correlation id, bytes 4-8, may differ)
        fixed = self._fixed
        pos = body + len(fixed)
        if frame[body:pos] != fixed:
            return None  # MaxWaitMs, MinBytes, MaxBytes, IsolationLevel, session fields
        version = self.view.version
        flexible = version >= FIRST_FLEXIBLE
        by_id = version >= FIRST_TOPIC_ID
        size = 33 if flexible else _part_size(version)
        tag = _tag_len(version)
        mv = memoryview(frame)
        n = len(frame)
        unpack = self._unpack
        changed: dict[PartitionKey, FetchParams] = {}
        covered: list[tuple[int, int]] = []  # the baseline's bytes each part of this request matched
        try:
            if flexible:
                entries, pos = uvarint_at(mv, pos)
                entries -= 1
            else:
                (entries,) = _I32.unpack_from(mv, pos)
                pos += 4
            seen = 0
            for _ in range(entries):
                topic: TopicKey
                if flexible:
                    topic, pos = _topic_key(mv, pos, n, by_id)
                    count, pos = uvarint_at(mv, pos)
                    count -= 1
                else:
                    topic, pos = _string16(mv, pos, n, "Topic")
                    (count,) = _I32.unpack_from(mv, pos)
                    pos += 4
                end = pos + count * size
                if count < 0 or end + tag > n or (flexible and any(mv[pos + 32 : end : 33])):
                    return None  # tagged partitions, or not a request at all
                seen += count
                step = size * 64
                for chunk in range(pos, end, step):
                    chunk_end = min(chunk + step, end)
                    (idx,) = _I32.unpack_from(mv, chunk)
                    origin = at.get((topic, idx))
                    if origin is None:
                        return None  # a partition the baseline does not have
                    if frame[chunk:chunk_end] == base[origin : origin + chunk_end - chunk]:
                        covered.append((origin, chunk_end - chunk))  # the same partitions, unchanged
                        continue
                    for rec in range(chunk, chunk_end, size):
                        (idx,) = _I32.unpack_from(mv, rec)
                        origin = at.get((topic, idx))
                        if origin is None:
                            return None
                        covered.append((origin, size))
                        if frame[rec : rec + size] != base[origin : origin + size]:
                            _, params = unpack(mv, rec)
                            changed[(topic, idx)] = params
                pos = end + tag  # the topic's tag section: empty (checked with the tail below)
                if flexible and mv[end] != 0:
                    return None
        except (IndexError, struct.error, CodecError, UnicodeDecodeError):
            return None  # a topic name that is not UTF-8 too (bench.fuzz): the full decode refuses it
        if seen != len(at) or frame[pos:] != self._tail or not _exact_cover(covered):
            return None  # partitions missing or repeated, forgotten topics, RackId, tags
        view = object.__new__(FetchRequestView)
        for name in FetchRequestView.__slots__:
            setattr(view, name, getattr(self.view, name))
        view.header = frame[:body]
        view.correlation_id = _I32.unpack_from(frame, 4)[0]
        return view, changed


def _exact_cover(spans: list[tuple[int, int]]) -> bool:
    """The (start, length) spans do not overlap (with as many partitions as the baseline's, every one of its
    partitions was matched exactly once)."""
    spans.sort()
    end = -1
    for start, length in spans:
        if start < end:
            return False
        end = start + length
    return True


def _tag_len(version: int) -> int:
    """The empty tag section closing a topic entry (v12+)."""
    return 1 if version >= FIRST_FLEXIBLE else 0


def _part_size(version: int) -> int:
    if version >= FIRST_LEADER_EPOCH:
        return _PART_V9.size
    if version >= FIRST_LOG_START:
        return _PART_V5.size
    return _PART_V4.size


def _part_unpack(version: int) -> Callable[[memoryview, int], tuple[int, FetchParams]]:
    """Reads one fixed-layout partition: (index, params)."""
    new = _new
    if version >= FIRST_FLEXIBLE:
        unpack = _PART_FLEX_T.unpack_from

        def flexible(mv: memoryview, at: int) -> tuple[int, FetchParams]:
            idx, cle, fo, lfe, lso, pmb, _ = unpack(mv, at)
            return idx, new(FetchParams, (fo, lso, pmb, cle, lfe, None))
        return flexible
    if version >= FIRST_LEADER_EPOCH:
        unpack9 = _PART_V9.unpack_from

        def v9(mv: memoryview, at: int) -> tuple[int, FetchParams]:
            idx, cle, fo, lso, pmb = unpack9(mv, at)
            return idx, new(FetchParams, (fo, lso, pmb, cle, -1, None))
        return v9
    if version >= FIRST_LOG_START:
        unpack5 = _PART_V5.unpack_from

        def v5(mv: memoryview, at: int) -> tuple[int, FetchParams]:
            idx, fo, lso, pmb = unpack5(mv, at)
            return idx, new(FetchParams, (fo, lso, pmb, -1, -1, None))
        return v5
    unpack4 = _PART_V4.unpack_from

    def v4(mv: memoryview, at: int) -> tuple[int, FetchParams]:
        idx, fo, pmb = unpack4(mv, at)
        return idx, new(FetchParams, (fo, -1, pmb, -1, -1, None))
    return v4


def _string16(mv: memoryview, pos: int, n: int, what: str) -> tuple[str, int]:
    """A non-nullable int16-length string (versions < 12)."""
    (size,) = _I16.unpack_from(mv, pos)
    pos += 2
    if size < 0:
        raise CodecError(f"{what}: length {size} (null not allowed here)", where=pos)
    if size > n - pos:
        raise _bad(f"{what}: declared length", size, n - pos, pos)
    return str(mv[pos : pos + size], "utf-8"), pos + size


def _decode_classic(view: FetchRequestView, mv: memoryview, pos: int) -> int:
    """Versions 4-11: int16-length strings, int32 counts, no tagged fields."""
    version = view.version
    n = len(mv)
    start = pos
    if version >= FIRST_SESSION:
        (view.replica_id, view.max_wait_ms, view.min_bytes, view.max_bytes, view.isolation_level,
         view.session_id, view.session_epoch) = _FIXED_V7.unpack_from(mv, pos)
        pos += _FIXED_V7.size
    else:
        (view.replica_id, view.max_wait_ms, view.min_bytes, view.max_bytes,
         view.isolation_level) = _FIXED_V4.unpack_from(mv, pos)
        view.session_id, view.session_epoch = 0, -1
        pos += _FIXED_V4.size
    view._head = bytes(mv[start:pos])
    view.replica_epoch = -1
    view.cluster_id = None
    view.tags = None
    (ntopics,) = _I32.unpack_from(mv, pos)
    pos += 4
    if ntopics < 0 or ntopics > n - pos:
        raise _bad("Topics: array count", ntopics, n - pos, pos)
    part = _PART_V9 if version >= FIRST_LEADER_EPOCH else (_PART_V5 if version >= FIRST_LOG_START else _PART_V4)
    size = part.size
    iter_unpack = part.iter_unpack
    new = _new
    out: dict[PartitionKey, FetchParams] = {}
    keys: list[TopicKey] = []
    blocks: list[tuple[int, int, int, TopicKey]] = []
    for _ in range(ntopics):
        topic, pos = _string16(mv, pos, n, "Topic")
        keys.append(topic)
        (nparts,) = _I32.unpack_from(mv, pos)
        pos += 4
        if nparts < 0 or nparts * size > n - pos:
            raise _bad("Partitions: array count", nparts, n - pos, pos)
        end = pos + nparts * size
        blocks.append((pos, nparts, size, topic))
        # Fixed-size partitions: one C-level iteration over the whole array.
        if size == _PART_V9.size:
            for idx, cle, fo, lso, pmb in iter_unpack(mv[pos:end]):
                out[(topic, idx)] = new(FetchParams, (fo, lso, pmb, cle, -1, None))
        elif size == _PART_V5.size:
            for idx, fo, lso, pmb in iter_unpack(mv[pos:end]):
                out[(topic, idx)] = new(FetchParams, (fo, lso, pmb, -1, -1, None))
        else:
            for idx, fo, pmb in iter_unpack(mv[pos:end]):
                out[(topic, idx)] = new(FetchParams, (fo, -1, pmb, -1, -1, None))
        pos = end
    view._partitions = out
    forgotten: list[PartitionKey] = []
    if version >= FIRST_SESSION:
        (nforgot,) = _I32.unpack_from(mv, pos)
        pos += 4
        if nforgot < 0 or nforgot > n - pos:
            raise _bad("ForgottenTopicsData: array count", nforgot, n - pos, pos)
        for _ in range(nforgot):
            topic, pos = _string16(mv, pos, n, "Topic")
            keys.append(topic)
            (count,) = _I32.unpack_from(mv, pos)
            pos += 4
            if count < 0 or count * 4 > n - pos:
                raise _bad("Partitions: array count", count, n - pos, pos)
            forgotten.extend((topic, p) for p in struct.unpack_from(f">{count}i", mv, pos))
            pos += count * 4
    view._forgotten = forgotten
    view.topic_keys = keys
    view._blocks = blocks
    tail = pos
    if version >= FIRST_RACK:
        view.rack_id, pos = _string16(mv, pos, n, "RackId")
    else:
        view.rack_id = ""
    view._tail = bytes(mv[tail:pos])
    return pos


def _decode_flexible(view: FetchRequestView, mv: memoryview, pos: int) -> int:
    """Versions 12-18 (KIP-482): compact strings and arrays (uvarint length + 1, 0 = null), a tag section after
    every struct."""
    version = view.version
    n = len(mv)
    start = pos
    if version >= FIRST_REPLICA_STATE:
        (view.max_wait_ms, view.min_bytes, view.max_bytes, view.isolation_level, view.session_id,
         view.session_epoch) = _FIXED_V15.unpack_from(mv, pos)
        view.replica_id = -1
        pos += _FIXED_V15.size
    else:
        (view.replica_id, view.max_wait_ms, view.min_bytes, view.max_bytes, view.isolation_level,
         view.session_id, view.session_epoch) = _FIXED_V7.unpack_from(mv, pos)
        pos += _FIXED_V7.size
    view._head = bytes(mv[start:pos])
    view.replica_epoch = -1
    by_id = version >= FIRST_TOPIC_ID
    ntopics, pos = uvarint_at(mv, pos)
    ntopics -= 1
    if ntopics < 0 or ntopics > n - pos:
        raise _bad("Topics: array count", ntopics, n - pos, pos)
    unpack = _PART_FLEX_T.unpack_from
    iter_unpack = _PART_FLEX_T.iter_unpack
    new = _new
    out: dict[PartitionKey, FetchParams] = {}
    keys: list[TopicKey] = []
    blocks: list[tuple[int, int, int, TopicKey]] | None = []
    topic: TopicKey
    for _ in range(ntopics):
        topic, pos = _topic_key(mv, pos, n, by_id)
        keys.append(topic)
        nparts, pos = uvarint_at(mv, pos)
        nparts -= 1
        # every partition takes at least 33 bytes: 32 of fields and its tag section
        if nparts < 0 or nparts * 33 > n - pos:
            raise _bad("Partitions: array count", nparts, n - pos, pos)
        end = pos + nparts * 33
        if not any(mv[pos + 32 : end : 33]):
            # The common case: no partition has tagged fields. Then every partition is 33 bytes, ending with a
            # 0 tag count (by induction: the first one's count byte is 0, so the next starts 33 bytes on...),
            # and one C-level iteration reads them all.
            for idx, cle, fo, lfe, lso, pmb, _ in iter_unpack(mv[pos:end]):
                out[(topic, idx)] = new(FetchParams, (fo, lso, pmb, cle, lfe, None))
            if blocks is not None:
                blocks.append((pos, nparts, 33, topic))
            pos = end
            _, pos = tag_section_at(mv, pos, n)
            continue
        blocks = None  # tagged partitions: not the fixed layout
        for _ in range(nparts):
            idx, cle, fo, lfe, lso, pmb, first = unpack(mv, pos)
            if first:
                raw, pos = tag_section_at(mv, pos + 32, n)
                tags: bytes | None = bytes(raw)  # type: ignore[arg-type]  # non-empty: never None
                _check_partition_tags(raw, version)  # type: ignore[arg-type]
            else:
                tags = None
                pos += 33
            out[(topic, idx)] = new(FetchParams, (fo, lso, pmb, cle, lfe, tags))
        _, pos = tag_section_at(mv, pos, n)  # the topic's tag section: no fields defined, not kept
    view._partitions = out
    nforgot, pos = uvarint_at(mv, pos)
    nforgot -= 1
    if nforgot < 0 or nforgot > n - pos:
        raise _bad("ForgottenTopicsData: array count", nforgot, n - pos, pos)
    forgotten: list[PartitionKey] = []
    for _ in range(nforgot):
        topic, pos = _topic_key(mv, pos, n, by_id)
        keys.append(topic)
        count, pos = uvarint_at(mv, pos)
        count -= 1
        if count < 0 or count * 4 > n - pos:
            raise _bad("Partitions: array count", count, n - pos, pos)
        forgotten.extend((topic, p) for p in struct.unpack_from(f">{count}i", mv, pos))
        pos += count * 4
        _, pos = tag_section_at(mv, pos, n)
    view._forgotten = forgotten
    view.topic_keys = keys
    view._blocks = blocks
    tail = pos
    rack, pos = _compact_string(mv, pos, False, "RackId")
    view.rack_id = rack or ""
    raw_tags, pos = tag_section_at(mv, pos, n)
    view._tail = bytes(mv[tail:pos])
    view.tags = None if raw_tags is None else bytes(raw_tags)
    view.cluster_id = None
    if raw_tags is not None:
        _top_tags(view, raw_tags)
    return pos


def _topic_key(mv: memoryview, pos: int, n: int, by_id: bool) -> tuple[TopicKey, int]:
    if by_id:
        if pos + 16 > n:
            raise CodecError("truncated TopicId", where=pos)
        return bytes(mv[pos : pos + 16]), pos + 16
    name, pos = _compact_string(mv, pos, False, "Topic")
    return name or "", pos


def _check_partition_tags(raw: memoryview, version: int) -> None:
    """A partition's known tagged fields must have their type's size (the construct codec refuses a
    ReplicaDirectoryId or HighWatermark of another length; found by bench.fuzz)."""
    fields = parse_tags(raw)
    for tag, size, since in _PARTITION_TAGS:
        value = fields.get(tag)
        if value is not None and version >= since and len(value) != size:
            raise CodecError(f"FetchPartition: tagged field {tag} of {len(value)} bytes, not {size}")


def _top_tags(view: FetchRequestView, raw: memoryview) -> None:
    """ClusterId (tag 0) and, from v15, ReplicaState (tag 1), read and checked like the construct codec reads
    tagged fields (the value must be consumed exactly); other tags stay in ``view.tags`` only."""
    for tag, value in parse_tags(raw).items():
        if tag == CLUSTER_ID_TAG:
            view.cluster_id, end = _compact_string(value, 0, True, "ClusterId")
        elif tag == REPLICA_STATE_TAG and view.version >= FIRST_REPLICA_STATE:
            view.replica_id, view.replica_epoch = _REPLICA_STATE.unpack_from(value, 0)
            _, end = tag_section_at(value, _REPLICA_STATE.size, len(value))
        else:
            continue
        if end != len(value):
            raise CodecError(f"tagged field {tag} has {len(value) - end} trailing bytes")


# --------------------------------------------------------------------------------------------- encode


def encode_fetch_request(view: FetchRequestView, session_id: int, session_epoch: int,
                         to_send: Mapping[PartitionKey, FetchParams],
                         to_forget: Sequence[PartitionKey], max_bytes: int | None = None,
                         max_wait_ms: int | None = None) -> bytes:
    """The request frame (header included, no size prefix) of ``view`` with other partitions and session.

    Everything but the session fields, Topics, ForgottenTopicsData and (when given) MaxBytes and MaxWaitMs is
    re-emitted as received. Topics:
    ``to_send`` in its order, consecutive partitions of one topic under one topic entry (Java's
    FetchRequest.Builder; the order matters because a broker fills the response in request order under
    MaxBytes). ForgottenTopicsData: ``to_forget`` grouped per topic in first-appearance order. For v4-6 (no
    sessions, KIP-227 is v7) ``session_id``, ``session_epoch`` and ``to_forget`` are ignored. Keys must be
    topic names before v13 and 16-byte topic ids from v13; values may be any object with FetchParams'
    attributes (a missing ``tags`` reads as None). Unencodable values raise :class:`CodecError`.
    """
    version = view.version
    try:
        head = _head_with(view, max_bytes, max_wait_ms, (session_id, session_epoch))
        if version >= FIRST_FLEXIBLE:
            body = _encode_flexible(version, to_send, to_forget)
        else:
            body = _encode_classic(version, to_send, to_forget)
    except struct.error as e:
        raise CodecError(f"cannot encode: {e}", api=_API, version=version) from None
    except CodecError as e:
        raise e.located(api=_API, version=version) from None
    except (TypeError, AttributeError, UnicodeEncodeError) as e:
        raise CodecError(f"cannot encode: {type(e).__name__}: {e}", api=_API, version=version) from None
    return b"".join((view.header, head, *body, view._tail))


def check_topic_key(topic: object, by_id: bool) -> None:
    """A Fetch key must match its version's topic addressing (FetchRequest.json: Topic "0-12", TopicId "13+";
    Sluice reads v4+): a name where ids are used, or the reverse, would encode garbage."""
    if by_id:
        if not isinstance(topic, bytes) or len(topic) != 16:
            raise CodecError(f"v13+ keys are 16-byte topic ids, got {topic!r}")
    elif not isinstance(topic, str):
        raise CodecError(f"v4-12 keys are topic names, got {topic!r}")


def _forgotten_groups(to_forget: Sequence[PartitionKey]) -> dict[TopicKey, list[int]]:
    groups: dict[TopicKey, list[int]] = {}
    for topic, partition in to_forget:
        groups.setdefault(topic, []).append(partition)
    return groups


def _encode_classic(version: int, to_send: Mapping[PartitionKey, FetchParams],
                    to_forget: Sequence[PartitionKey]) -> list[bytes]:
    out: list[bytes] = [b""]  # [0]: the topic count, known at the end
    pack_i32 = _I32.pack
    has_epoch = version >= FIRST_LEADER_EPOCH
    has_lso = version >= FIRST_LOG_START
    pack = (_PART_V9 if has_epoch else (_PART_V5 if has_lso else _PART_V4)).pack
    ntopics = 0
    slot = 0  # index in ``out`` of the current topic's header (name and partition count)
    count = 0
    last: object = None
    for (topic, idx), p in to_send.items():
        if not ntopics or topic != last:
            if ntopics:
                out[slot] += pack_i32(count)
            check_topic_key(topic, False)
            name = topic.encode("utf-8")  # type: ignore[union-attr]  # checked: a str
            slot = len(out)
            out.append(_I16.pack(len(name)) + name)
            ntopics += 1
            count = 0
            last = topic
        if has_epoch:
            out.append(pack(idx, p.current_leader_epoch, p.fetch_offset, p.log_start_offset,
                            p.partition_max_bytes))
        elif has_lso:
            out.append(pack(idx, p.fetch_offset, p.log_start_offset, p.partition_max_bytes))
        else:
            out.append(pack(idx, p.fetch_offset, p.partition_max_bytes))
        count += 1
    if ntopics:
        out[slot] += pack_i32(count)
    out[0] = pack_i32(ntopics)
    if version >= FIRST_SESSION:
        groups = _forgotten_groups(to_forget)
        out.append(pack_i32(len(groups)))
        for topic, parts in groups.items():
            check_topic_key(topic, False)
            name = topic.encode("utf-8")  # type: ignore[union-attr]
            out.append(_I16.pack(len(name)) + name + struct.pack(f">i{len(parts)}i", len(parts), *parts))
    return out


def _encode_flexible(version: int, to_send: Mapping[PartitionKey, FetchParams],
                     to_forget: Sequence[PartitionKey]) -> list[bytes]:
    by_id = version >= FIRST_TOPIC_ID
    out: list[bytes] = [b""]  # [0]: the topic count, known at the end
    pack = _PART_FLEX.pack
    pack_t = _PART_FLEX_T.pack
    ntopics = 0
    slot = 0
    count = 0
    last: object = None
    for (topic, idx), p in to_send.items():
        if not ntopics or topic != last:
            if ntopics:
                out[slot] += _uv(count + 1)
                out.append(_EMPTY_TAGS)  # the previous topic's tag section
            slot = len(out)
            out.append(_topic_bytes(topic, by_id))
            ntopics += 1
            count = 0
            last = topic
        tags = getattr(p, "tags", None)
        if tags is None:
            out.append(pack_t(idx, p.current_leader_epoch, p.fetch_offset, p.last_fetched_epoch,
                              p.log_start_offset, p.partition_max_bytes, 0))
        else:
            out.append(pack(idx, p.current_leader_epoch, p.fetch_offset, p.last_fetched_epoch,
                            p.log_start_offset, p.partition_max_bytes) + bytes(tags))
        count += 1
    if ntopics:
        out[slot] += _uv(count + 1)
        out.append(_EMPTY_TAGS)
    out[0] = _uv(ntopics + 1)
    groups = _forgotten_groups(to_forget)
    out.append(_uv(len(groups) + 1))
    for topic, parts in groups.items():
        out.append(_topic_bytes(topic, by_id) + _uv(len(parts) + 1)
                   + struct.pack(f">{len(parts)}i", *parts) + _EMPTY_TAGS)
    return out


def _topic_bytes(topic: object, by_id: bool) -> bytes:
    check_topic_key(topic, by_id)
    if by_id:
        return topic  # type: ignore[return-value]  # checked: 16 bytes
    name = topic.encode("utf-8")  # type: ignore[attr-defined]  # checked: a str
    return _uv(len(name) + 1) + name
