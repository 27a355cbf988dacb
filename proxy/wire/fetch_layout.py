"""The Fetch API's layout in one place: which version brought which field (Kafka's FetchRequest.json and
FetchResponse.json, as shipped in kafka-python), and how Sluice keys a partition.

Versions 0-3 were removed in Kafka 4.0 (KIP-896: "validVersions": "4-18"); Sluice reads 4-18.

Partition keys: Kafka compares partitions by topic id when a request uses ids (v13+) and by name otherwise
(CachedPartition.equals), and a fetch session never mixes the two (FETCH_SESSION_TOPIC_ID_ERROR). So a key is
``(topic, partition)`` where ``topic`` is the name (``str``, v4-12) or the 16-byte topic id (``bytes``, v13+),
exactly as it appears on the wire.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

MIN_VERSION = 4
MAX_VERSION = 18
FIRST_LOG_START = 5  # FetchPartition.LogStartOffset (request) / PartitionData.LogStartOffset (response) "5+"
FIRST_SESSION = 7  # SessionId, SessionEpoch, ForgottenTopicsData; response ErrorCode, SessionId "7+" (KIP-227)
FIRST_LEADER_EPOCH = 9  # FetchPartition.CurrentLeaderEpoch "9+"
FIRST_RACK = 11  # request RackId, response PreferredReadReplica "11+" (KIP-392)
FIRST_FLEXIBLE = 12  # "flexibleVersions": "12+" (KIP-482); also FetchPartition.LastFetchedEpoch "12+"
FIRST_TOPIC_ID = 13  # Topic (name) "0-12", TopicId "13+" (KIP-516)
FIRST_REPLICA_STATE = 15  # ReplicaId "0-14"; ReplicaState (tagged, tag 1) "15+" (KIP-903)
FIRST_NODE_ENDPOINTS = 16  # response NodeEndpoints: tagged, tag 0, "16+" (KIP-951)

# tagged fields
CLUSTER_ID_TAG = 0  # request, top level
REPLICA_STATE_TAG = 1  # request, top level
NODE_ENDPOINTS_TAG = 0  # response, top level
DIVERGING_EPOCH_TAG = 0  # response, PartitionData

TopicKey = str | bytes
PartitionKey = tuple[TopicKey, int]

# KIP-227 fetch sessions (FetchMetadata)
INVALID_SESSION_ID = 0  # "no session"
INITIAL_EPOCH = 0  # full request, create a session
FINAL_EPOCH = -1  # full request, no session (sessionless / close)
INT32_MAX = 2**31 - 1


def next_epoch(epoch: int) -> int:
    """FetchMetadata.nextEpoch: a negative epoch stays FINAL_EPOCH, INT32_MAX wraps to 1 (never back to 0,
    which would read as a full request), anything else + 1."""
    if epoch < 0:
        return FINAL_EPOCH
    if epoch == INT32_MAX:
        return 1
    return epoch + 1


def topic_key(topic: Any) -> TopicKey:
    """A response topic's key: its name (v4-12) or its id (v13+, where the name is empty)."""
    name: str = topic.topic
    return name if name else bytes(topic.topic_id)


def partition_keys(topics: Iterable[Any]) -> list[PartitionKey]:
    """The partition keys of a decoded response's topics, in order."""
    return [(topic_key(t), p.partition_index) for t in topics for p in t.partitions]
