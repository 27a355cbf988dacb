"""A kafka-python group consumer made to join its group only once it knows the partitions of its topic."""

from __future__ import annotations

import time

from kafka import KafkaConsumer

from rig.kafka import RigError


def wait_partitions_known(consumer: KafkaConsumer, topic: str, partitions: int, timeout: float = 60) -> None:
    """Return once ``consumer``'s metadata names the ``partitions`` partitions of ``topic`` (RigError after
    ``timeout``). Call it before the first poll (or iteration) of a kafka-python consumer subscribed to ``topic`` in a
    group; the topic must exist by then.

    A workaround for a kafka-python 3.0.12 bug, not a wait for the topic: the group is joined (in poll) only once
    this client's metadata names every partition. Joined sooner, the leader's assignment is empty
    (ConsumerCoordinator._perform_assignment assigns from the metadata it has: its bootstrap Metadata asks for no
    topic and the subscribed one is asked retry_backoff_ms later, while the join is quicker once the broker hosts
    __consumer_offsets; range.py: "No partition metadata"), and the metadata update that follows asks for a rejoin
    (need_rejoin: _metadata_snapshot differs from _assignment_snapshot). That rejoin can be lost:
    BaseCoordinator.join_group_async runs JoinGroup and SyncGroup as a task that only a poll() awaits; if it
    completes between two polls, the next poll finds need_rejoin() already False (the task's _perform_assignment
    set _assignment_snapshot) and never completes the join (_on_join_complete): the member stays REBALANCING,
    unassigned, its heartbeats disabled, until the coordinator expires it after session_timeout_ms (LeaveGroup at
    close answered UNKNOWN_MEMBER_ID; seen in CI as 0 records in 120 s). A loaded machine widens the gap between
    polls. With the metadata first, the first assignment is whole and no metadata change asks for that rejoin.
    (rig/group_consumer.py asks for the metadata once before its first poll, for the same reason.)
    """
    deadline = time.monotonic() + timeout
    while len(consumer.partitions_for_topic(topic)) != partitions:
        if time.monotonic() >= deadline:
            raise RigError(f"not within {timeout:.0f} s: kafka-python's metadata naming the {partitions} partitions "
                           f"of {topic}")
        time.sleep(0.05)  # bounded poll of a real condition
