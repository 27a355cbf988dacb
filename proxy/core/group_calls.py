"""Requests Sluice makes to the cluster's group coordinators on a policy's behalf: commits and reads of group
offsets, and group descriptions. Sans-IO, like :mod:`proxy.core.topic_names`: a policy builds a
:class:`GroupCall`, :meth:`GroupCalls.submit`\\s it and (if a request must wait for it) sets it as the exchange's
``pending``; :mod:`proxy.io.cluster` is told through ``on_work`` that calls are queued, takes them
(:meth:`GroupCalls.take`), does the I/O (FindCoordinator, then OffsetCommit / OffsetFetch / DescribeGroups to
each group's coordinator) and settles each call (:meth:`GroupCall.settle`, or :meth:`GroupCall.fail`), which
runs its callbacks.

Cooperative consumption (proxy/policies/sharing/) keeps each key-hash slice's position in a group of its own,
which can have another coordinator than the consumers' group: a client's coordinator connection cannot carry
these requests, so Sluice makes them itself.

Within one call, the commits and the reads are made at once (a read need not see a commit of the same call); the
descriptions come last.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..wire.model import TopicPartition
from .exchange import Signal


@dataclass(slots=True)
class Committed:
    """A group offset as OffsetFetch returns it (offset -1: none committed)."""

    offset: int = -1
    leader_epoch: int = -1
    metadata: str | None = None


@dataclass(eq=False)
class GroupCall(Signal):
    """One unit of work: commits (simple ones, generation -1 and no member id, unless made ``as_member``), offset
    reads and group descriptions, and, once settled, what came of them. A :class:`~proxy.core.exchange.Pending`."""

    #: group -> partition -> (offset, metadata)
    commits: dict[str, dict[TopicPartition, tuple[int, str | None]]] = field(default_factory=dict)
    #: group -> (generation, member id, group instance id): its commits are made as that member of the group, fenced
    #: by the coordinator like the member's own (a simple commit is refused while a group has members)
    as_member: dict[str, tuple[int, str, str | None]] = field(default_factory=dict)
    #: group -> partitions to read
    reads: dict[str, set[TopicPartition]] = field(default_factory=dict)
    #: groups to describe (DescribeGroups)
    describe: set[str] = field(default_factory=set)
    #: KIP-848 groups to describe (ConsumerGroupDescribe)
    describe_consumer: set[str] = field(default_factory=set)
    #: groups whose ``as_member`` commits are a KIP-848 member's: OffsetCommit v9, as ConsumerGroup
    #: .validateOffsetCommit refuses an older version from such a member
    consumer_protocol: set[str] = field(default_factory=set)
    # ---- outcome (after settle)
    #: group -> partition -> error code of each commit (0: committed)
    committed: dict[str, dict[TopicPartition, int]] = field(default_factory=dict)
    #: group -> partition -> the committed offset read
    offsets: dict[str, dict[TopicPartition, Committed]] = field(default_factory=dict)
    #: group -> its DescribeGroups entry (a decoded DescribedGroup message)
    described: dict[str, Any] = field(default_factory=dict)
    #: group -> its ConsumerGroupDescribe entry (a decoded DescribedGroup message of that API)
    described_consumer: dict[str, Any] = field(default_factory=dict)
    #: why the call failed as a whole (None: every part answered; per-partition errors are in ``committed``)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.settled and self.error is None and all(
            code == 0 for parts in self.committed.values() for code in parts.values())

    def fail(self, error: str) -> None:
        """The I/O failed as a whole: settle with ``error``."""
        if not self.settled:
            self.error = error
            self.settle()


class GroupRequests(Protocol):
    """What a policy may ask of Sluice's own group requests (``Services.group_requests``): a :class:`GroupCall` -
    commit these offsets for these groups, then read these groups' offsets, then describe these groups - which
    the I/O layer carries out and settles. Names no policy."""

    def submit(self, call: GroupCall) -> GroupCall: ...


class GroupCalls:
    """The queue of calls between the policies and the I/O layer (one per proxy): a :class:`GroupRequests`."""

    def __init__(self, on_work: Callable[[], None] | None = None) -> None:
        #: called when a call is queued and none was (the server then :meth:`take`\\s them)
        self.on_work = on_work
        self._queue: list[GroupCall] = []

    def __len__(self) -> int:
        return len(self._queue)

    def submit(self, call: GroupCall) -> GroupCall:
        idle = not self._queue
        self._queue.append(call)
        if idle and self.on_work is not None:
            self.on_work()
        return call

    def take(self) -> list[GroupCall]:
        calls, self._queue = self._queue, []
        return calls
