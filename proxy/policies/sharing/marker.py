"""What cooperative consumption carries inside the classic group protocol, and how it is read and written.

The classic consumer protocol (``ConsumerProtocolSubscription`` in JoinGroup metadata,
``ConsumerProtocolAssignment`` in SyncGroup assignments) is read by every client field by field: Java's generated
classes, librdkafka's ``rd_kafka_group_MemberMetadata_consumer_read``, kafka-python's and aiokafka's
``Struct.decode`` all stop after the fields they know and ignore the bytes after them (Kafka relies on this to add
fields in new versions). Sluice appends a *trailer* there:

    the struct as the client wrote it | Int16 version | kind byte | payload (a Sluice spec) | Int32 length
    (of version, kind and payload) | "\\0SLUICE\\0"

found from the end, whatever the struct's version. A member's Sluice appends a :data:`SUBSCRIPTION` marker
(SharingSubscription: the topics it may share) to its JoinGroup metadata; the leader's Sluice removes them from the
JoinGroup response before the leader client sees them, and appends :data:`ASSIGNMENT` slices (SharingAssignment) to
each marked member's assignment in the SyncGroup request; the member's Sluice removes those from the SyncGroup
response. A leader that does not go through Sluice sees the markers and ignores them, like any reader.

Also here: the owned-partition rewrite of a member's JoinGroup subscription (v1+ OwnedPartitions), so that a
partition several members share is claimed by one of them only (the holder of slice 0): Kafka's sticky assignors
(AbstractStickyAssignor) treat two claims on one partition as a conflict.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Mapping
from functools import cache

from ...wire.compiler import Codec, compiled_for
from ...wire.errors import CodecError
from ...wire.messages import decode_consumer_protocol, encode_consumer_protocol
from ...wire.model import Message, TopicPartition
from ...wire.schema import kafka_spec, sluice_spec
from .keys import Slice

MAGIC = b"\x00SLUICE\x00"
_LENGTH = struct.Struct(">i")
_FOOTER = _LENGTH.size + len(MAGIC)
SUBSCRIPTION, ASSIGNMENT = "SharingSubscription", "SharingAssignment"
#: the version of each spec this Sluice writes (a newer one read is refused: its fields are unknown here)
VERSION = 0



class MarkerError(CodecError):
    """A trailer that says it is Sluice's but cannot be read."""


@cache
def _codec(name: str) -> Codec:
    return compiled_for(sluice_spec(name), VERSION)


def split(data: bytes | bytearray | memoryview) -> tuple[bytes, Message | None, str | None]:
    """(the bytes before Sluice's trailer, the trailer decoded, its spec name); no trailer: (data, None, None).
    MarkerError when the bytes end with the magic but the trailer cannot be read."""
    raw = bytes(data)
    if len(raw) < _FOOTER or not raw.endswith(MAGIC):
        return raw, None, None
    (length,) = _LENGTH.unpack_from(raw, len(raw) - _FOOTER)
    start = len(raw) - _FOOTER - length
    if length < 2 or start < 0:
        raise MarkerError(f"Sluice trailer length {length} does not fit the {len(raw)} bytes")
    payload = raw[start : start + length]
    version = int.from_bytes(payload[:2], "big", signed=True)
    if version != VERSION:
        raise MarkerError(f"Sluice trailer version {version} (this Sluice reads {VERSION})")
    name = _NAMES.get(payload[2:3])
    if name is None:
        raise MarkerError(f"Sluice trailer of unknown kind {payload[2:3]!r}")
    try:
        return raw[:start], _codec(name).decode(payload[3:]), name
    except CodecError as e:
        raise MarkerError(f"undecodable Sluice trailer: {e}") from None


#: one byte after the version tells the two trailers apart
_KIND = {SUBSCRIPTION: b"S", ASSIGNMENT: b"A"}
_NAMES = {v: k for k, v in _KIND.items()}


def append(data: bytes, name: str, payload: Message) -> bytes:
    """``data`` with a trailer holding ``payload`` (a ``name`` spec message)."""
    body = VERSION.to_bytes(2, "big", signed=True) + _KIND[name] + _codec(name).encode(payload)
    return bytes(data) + body + _LENGTH.pack(len(body)) + MAGIC


def read(data: bytes | bytearray | memoryview, name: str) -> tuple[bytes, Message | None]:
    """The bytes before the trailer and the trailer if it is a ``name`` one (another kind is dropped as unreadable:
    MarkerError)."""
    core, payload, kind = split(data)
    if payload is not None and kind != name:
        raise MarkerError(f"a Sluice trailer of the wrong kind where a {name} belongs")
    return core, payload


# ----------------------------------------------------------------------------------------- subscription


def subscription_marker(topics: Iterable[str]) -> Message:
    return Message(shareable_topics=sorted(set(topics)))


def mark_subscription(metadata: bytes, shareable: Callable[[str], bool],
                      not_owned: Callable[[TopicPartition], bool]) -> tuple[bytes, frozenset[str]]:
    """A member's JoinGroup protocol metadata, marked: the subscribed topics ``shareable`` admits are listed in the
    marker, and owned partitions ``not_owned`` names (those the member shares but does not claim) are removed
    from OwnedPartitions. Returns the new metadata and the topics marked (none: ``metadata`` unchanged).
    CodecError if the metadata is not a consumer protocol subscription Sluice can read."""
    core, _ = read(metadata, SUBSCRIPTION)  # a client never writes a marker; one left by a bug is replaced
    version, sub = read_subscription(core)
    topics = frozenset(t for t in sub.topics if shareable(t))
    if not topics:
        return metadata, topics
    owned = getattr(sub, "owned_partitions", None)
    if owned and version <= 3:  # a newer version would lose its unknown fields if written again: left as is
        kept = [Message(topic=tp.topic, partitions=[p for p in tp.partitions if not not_owned((tp.topic, p))])
                for tp in owned]
        kept = [tp for tp in kept if tp.partitions]
        if kept != list(owned):
            core = encode_consumer_protocol("subscription", version, sub.replace(owned_partitions=kept))
    return append(core, SUBSCRIPTION, subscription_marker(topics)), topics


def strip_subscription(metadata: bytes) -> tuple[bytes, frozenset[str] | None]:
    """A member's metadata as the leader client must see it, and the topics its marker lists (None: not marked).
    MarkerError for an unreadable marker (the member is then treated as not marked; the bytes stay as they are)."""
    core, marker = read(metadata, SUBSCRIPTION)
    if marker is None:
        return bytes(metadata), None
    return core, frozenset(marker.shareable_topics)


def subscribed_topics(metadata: bytes) -> list[str]:
    """The topics of a (trailer-free) consumer protocol subscription."""
    return list(read_subscription(metadata)[1].topics)


def read_subscription(data: bytes) -> tuple[int, Message]:
    """A (trailer-free) consumer protocol subscription: (version as written, struct). A struct that ends before
    its version's trailing fields (kafka-go writes version 1 without OwnedPartitions) is read with the layout of
    the newest older version its bytes fill exactly, the missing fields at their defaults (no partition owned,
    no rack, generation -1): what the member means by it, and safe to act on, since Sluice rewrites a
    subscription only to take owned partitions out (there are none) and leaders get the bytes as written.
    CodecError when no layout reads it."""
    try:
        return decode_consumer_protocol("subscription", data)
    except CodecError as e:
        error = e
    version = int.from_bytes(data[:2], "big", signed=True) if len(data) >= 2 else -1
    for older in range(min(version, kafka_spec("ConsumerProtocolSubscription").valid.high) - 1, -1, -1):
        try:
            _, sub = decode_consumer_protocol("subscription", older.to_bytes(2, "big") + data[2:])
        except CodecError:
            continue
        # the struct of its own version, the fields its bytes lack at their defaults
        return version, decode_consumer_protocol("subscription",
                                                 encode_consumer_protocol("subscription", version, sub))[1]
    raise error


# ------------------------------------------------------------------------------------------- assignment


def assigned(data: bytes) -> tuple[int, Message, dict[str, list[int]]]:
    """A (trailer-free) consumer protocol assignment: its version, the struct, and its partitions by topic."""
    version, msg = decode_consumer_protocol("assignment", data)
    parts: dict[str, list[int]] = {}
    for tp in msg.assigned_partitions:
        parts.setdefault(tp.topic, []).extend(tp.partitions)
    return version, msg, parts


def write_assignment(version: int, msg: Message, partitions: Mapping[str, Iterable[int]],
                     slices: Mapping[TopicPartition, Slice] | None) -> bytes:
    """The assignment with ``partitions`` instead of its own (user data and version kept), and ``slices`` in a
    trailer when given."""
    if version > 3:
        raise CodecError(f"consumer protocol assignment version {version} is newer than Sluice writes")
    body = msg.replace(assigned_partitions=[Message(topic=t, partitions=sorted(ps))
                                            for t, ps in sorted(partitions.items()) if ps])
    out = encode_consumer_protocol("assignment", version, body)
    if slices is not None:
        out = append(out, ASSIGNMENT, slices_message(slices))
    return out


def slices_message(slices: Mapping[TopicPartition, Slice]) -> Message:
    by_topic: dict[str, list[Message]] = {}
    for (topic, partition), s in sorted(slices.items()):
        by_topic.setdefault(topic, []).append(Message(partition=partition, index=s.index, count=s.count))
    return Message(topics=[Message(topic=t, partitions=ps) for t, ps in by_topic.items()])


def strip_assignment(data: bytes) -> tuple[bytes, dict[TopicPartition, Slice] | None]:
    """A member's assignment as its client must see it, and its slices (None: no trailer). MarkerError for an
    unreadable trailer or slices that make no sense (then the member holds no slice)."""
    core, payload = read(data, ASSIGNMENT)
    if payload is None:
        return bytes(data), None
    slices: dict[TopicPartition, Slice] = {}
    try:
        for t in payload.topics:
            for p in t.partitions:
                slices[(t.topic, p.partition)] = Slice(p.index, p.count)
    except ValueError as e:
        raise MarkerError(str(e)) from None
    return core, slices
