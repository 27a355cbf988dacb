"""Produce v0-2 request frames, built by hand: Kafka 4.0 removed these versions from ProduceRequest.json
(KIP-896), so Sluice's codecs cannot write them, yet a Kafka 4.x broker still advertises them (KAFKA-18659)
and a client may send them."""

from __future__ import annotations

import struct

TIMEOUT_MS = 30_000  # 0x00007530: its first two bytes read as acks=0 by a peek that assumes the v3+ layout


def produce_v0_2_frame(version: int, acks: int, *, topic: str = "t", corr: int = 1,
                       client_id: str = "legacy") -> bytes:
    """A Produce v0-2 request frame (no size prefix): request header v1, then Acks, TimeoutMs and one
    partition with an empty record set (the v0-2 body of the Kafka 3.x spec)."""
    assert 0 <= version <= 2
    cid = client_id.encode()
    name = topic.encode()
    header = struct.pack(">hhih", 0, version, corr, len(cid)) + cid
    body = (struct.pack(">hi", acks, TIMEOUT_MS)
            + struct.pack(">ih", 1, len(name)) + name  # TopicData: one topic
            + struct.pack(">iii", 1, 0, 0))  # PartitionData: one partition, index 0, empty Records
    return header + body
