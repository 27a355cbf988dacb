"""What cooperative consumption carries in the group protocol (proxy/policies/sharing/marker.py): the JoinGroup
marker, the SyncGroup slices, the owned-partition rewrite, and that the clients' own readers ignore them."""

from __future__ import annotations

import pytest
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment, ConsumerProtocolMemberMetadata
from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment, ConsumerProtocolSubscription

from proxy.policies.sharing import marker
from proxy.policies.sharing.keys import Slice
from proxy.wire.errors import CodecError
from proxy.wire.messages import decode_consumer_protocol, encode_consumer_protocol
from proxy.wire.model import Message


def subscription(version: int, topics: list[str], owned: dict[str, list[int]] | None = None) -> bytes:
    fields: dict[str, object] = {"topics": topics, "user_data": b"ud"}
    if version >= 1:
        fields["owned_partitions"] = [Message(topic=t, partitions=ps) for t, ps in (owned or {}).items()]
    if version >= 2:
        fields["generation_id"] = 7
    if version >= 3:
        fields["rack_id"] = None
    return encode_consumer_protocol("subscription", version, Message(**fields))


def assignment(version: int, parts: dict[str, list[int]]) -> bytes:
    return encode_consumer_protocol("assignment", version, Message(
        assigned_partitions=[Message(topic=t, partitions=ps) for t, ps in parts.items()], user_data=None))


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_subscription_marker_round_trip(version: int) -> None:
    raw = subscription(version, ["orders", "audit"])
    marked, topics = marker.mark_subscription(raw, lambda t: t == "orders", lambda tp: False)
    assert topics == {"orders"} and marked.startswith(raw) and marked != raw
    assert marker.strip_subscription(marked) == (raw, frozenset({"orders"}))
    assert marker.strip_subscription(raw) == (raw, None)  # not marked


def test_nothing_shareable_leaves_the_metadata_as_it_was() -> None:
    raw = subscription(1, ["audit"])
    assert marker.mark_subscription(raw, lambda t: False, lambda tp: False) == (raw, frozenset())


def test_owned_partitions_rewritten_so_one_member_claims_a_shared_partition() -> None:
    raw = subscription(2, ["orders"], {"orders": [0, 1, 2]})
    # this member holds slice 1 of partition 1 (another member holds slice 0 and claims it) and all of 0 and 2
    marked, _ = marker.mark_subscription(raw, lambda t: True, lambda tp: tp == ("orders", 1))
    core, _ = marker.strip_subscription(marked)
    version, sub = decode_consumer_protocol("subscription", core)
    assert version == 2 and sub.owned_partitions == [Message(topic="orders", partitions=[0, 2])]
    assert (sub.topics, sub.user_data, sub.generation_id) == (["orders"], b"ud", 7)  # the rest as written


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_assignment_slices_round_trip(version: int) -> None:
    raw = assignment(version, {"orders": [0, 2], "audit": [1]})
    v, msg, parts = marker.assigned(raw)
    assert (v, parts) == (version, {"orders": [0, 2], "audit": [1]})
    slices = {("orders", 0): Slice(1, 2), ("orders", 2): Slice(0, 1)}
    written = marker.write_assignment(v, msg, parts, slices)
    core, got = marker.strip_assignment(written)
    assert got == slices and core == marker.write_assignment(v, msg, parts, None)
    assert marker.strip_assignment(core) == (core, None)


def test_clients_ignore_the_trailer() -> None:
    # The readers of a leader (subscriptions) and of a member (its assignment) that does not go through Sluice:
    # kafka-python's and aiokafka's decoders, and Sluice's own (Java's generated reader and librdkafka's
    # rd_kafka_group_MemberMetadata_consumer_read also stop after the fields they know).
    raw = subscription(1, ["orders"], {"orders": [0]})
    marked, _ = marker.mark_subscription(raw, lambda t: True, lambda tp: False)
    assert ConsumerProtocolSubscription.decode(marked).topics == ["orders"]
    assert ConsumerProtocolMemberMetadata.decode(marked).subscription == ["orders"]
    assert decode_consumer_protocol("subscription", marked[: len(raw)])[1].topics == ["orders"]
    a = assignment(0, {"orders": [0]})
    _, msg, parts = marker.assigned(a)
    with_slices = marker.write_assignment(0, msg, parts, {("orders", 0): Slice(0, 2)})
    assert ConsumerProtocolMemberAssignment.decode(with_slices).partitions()[0].partition == 0
    assert ConsumerProtocolAssignment.decode(with_slices).assigned_partitions[0].partitions == [0]


@pytest.mark.parametrize("garbage", [
    marker.MAGIC,  # magic and nothing else
    (1000).to_bytes(4, "big") + marker.MAGIC,  # a length beyond the bytes
    b"\x00\x09S\x00\x00\x00\x00" + (7).to_bytes(4, "big") + marker.MAGIC,  # an unknown version
    b"\x00\x00X\x00\x00\x00\x00" + (7).to_bytes(4, "big") + marker.MAGIC,  # an unknown kind
    b"\x00\x00S\xff\xff\xff\x05" + (7).to_bytes(4, "big") + marker.MAGIC,  # an undecodable struct
])
def test_malformed_trailers_are_refused_not_misread(garbage: bytes) -> None:
    with pytest.raises(marker.MarkerError):
        marker.strip_subscription(subscription(0, ["t"]) + garbage)


def test_a_trailer_of_the_other_kind_is_refused() -> None:
    _, msg, parts = marker.assigned(assignment(0, {"t": [0]}))
    with_slices = marker.write_assignment(0, msg, parts, {("t", 0): Slice(0, 2)})
    with pytest.raises(marker.MarkerError):
        marker.strip_subscription(with_slices)


def test_garbage_assignments_and_subscriptions_are_codec_errors() -> None:
    with pytest.raises(CodecError):
        marker.assigned(b"\x00")
    with pytest.raises(CodecError):
        marker.mark_subscription(b"\x00\x00\xff\xff", lambda t: True, lambda tp: False)
    with pytest.raises(CodecError):  # slices that are no slice (index >= count)
        marker.strip_assignment(marker.append(assignment(0, {}), marker.ASSIGNMENT, Message(topics=[
            Message(topic="t", partitions=[Message(partition=0, index=3, count=2)])])))


def test_a_version_1_subscription_without_owned_partitions_is_read_with_defaults() -> None:
    """kafka-go writes version 1 (topics, user data) without v1's OwnedPartitions: read with none owned, marked,
    and the leader's client gets the bytes as the member wrote them."""
    written = b"\x00\x01" + b"\x00\x00\x00\x01" + b"\x00\x06orders" + b"\xff\xff\xff\xff"  # version, topics, null
    marked, topics = marker.mark_subscription(written, lambda t: True, lambda tp: False)
    assert topics == {"orders"}
    assert marker.strip_subscription(marked) == (written, frozenset({"orders"}))
    assert marker.subscribed_topics(written) == ["orders"]
    version, sub = marker.read_subscription(written)
    assert version == 1 and sub.owned_partitions == [] and sub.user_data is None
    with pytest.raises(CodecError):
        marker.read_subscription(written[:-2])  # no layout reads a struct cut inside a field
