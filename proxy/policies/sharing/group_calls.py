"""Cooperative consumption's requests to the cluster's group coordinators: commits and reads of group offsets, and
group descriptions, as one piece of :class:`~proxy.core.broker_calls.Work` the I/O layer runs with its sender.

Each key-hash slice's position is kept in a group of its own, which can have another coordinator than the
consumers' group: a client's coordinator connection cannot carry these requests, so Sluice makes them itself.
Within one call the commits and the reads are made at once (a read need not see a commit of the same call: it is
then lower than the truth, never higher); the descriptions come last. A
coordinator that moved or is loading (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS) is
found again and asked again after a pause, a bounded number of times; what was answered stays answered.

Versions: OffsetCommit v8 (v9 as a KIP-848 member: ConsumerGroup.validateOffsetCommit refuses an older version from
one), OffsetFetch v8 (several groups in one request per coordinator), DescribeGroups v5, ConsumerGroupDescribe v0.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...core.broker_calls import Broker, Coordinator, NotAuthorized, Sender, Work
from ...wire.api_keys import ApiKey
from ...wire.messages import request_codec
from ...wire.model import Message, TopicPartition

__all__ = ["Committed", "GroupCall"]

#: NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS: find the coordinator again, retry
_COORDINATOR_MOVED = frozenset({16, 15, 14})
_ATTEMPTS = 8


@dataclass(slots=True)
class Committed:
    """A group offset as OffsetFetch returns it (offset -1: none committed)."""

    offset: int = -1
    leader_epoch: int = -1
    metadata: str | None = None


class CoordinatorError(OSError):
    """A group request the cluster did not serve (after retries)."""


@dataclass(eq=False)
class GroupCall(Work):
    """Commits (simple ones, generation -1 and no member id, unless made ``as_member``), offset reads and group
    descriptions, and, once settled, what came of them."""

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
    #: groups whose ``as_member`` commits are a KIP-848 member's: OffsetCommit v9
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
    #: as a missing ACL's event names it
    purpose: str = field(default="[sharing]: the group calls of cooperative consumption", kw_only=True)

    @property
    def ok(self) -> bool:
        return self.settled and self.error is None and all(
            code == 0 for parts in self.committed.values() for code in parts.values())

    @property
    def groups(self) -> list[str]:
        return sorted({*self.commits, *self.reads, *self.describe, *self.describe_consumer})

    async def run(self, sender: Sender) -> None:
        retry: set[str] = set()
        for attempt in range(_ATTEMPTS):
            retry = await self._once(sender)
            if not retry:
                return
            for group in retry:
                sender.forget(Coordinator(group))
            await sender.pause(0.1 * (attempt + 1))  # the coordinator is moving or loading: ask again shortly
        raise CoordinatorError(f"no coordinator answered for {sorted(retry)}")

    async def _once(self, sender: Sender) -> set[str]:
        """One pass over what is left of the call; the groups whose coordinator must be found again."""
        found = await sender.locate(Coordinator(g) for g in self.groups)
        where = {c.key: broker for c, broker in found.items()}
        retry = set(self.groups) - where.keys()
        # A slice's commit and the reads of the others' positions need no order between them: a read that misses a
        # commit made meanwhile is lower than the truth, never higher (frontier.py), and the committing member
        # reads again once its group commit is in (offsets.py, raising the stable offset)
        outcomes = await asyncio.gather(self._commits(sender, where, retry), self._reads(sender, where, retry),
                                        return_exceptions=True)
        failed = [e for e in outcomes if e is not None]
        if failed:
            raise failed[0]
        for broker, names in _by_broker(where, (g for g in self.describe
                                                if g not in retry and g not in self.described)):
            body = request_codec(ApiKey.DESCRIBE_GROUPS, 5).default().replace(groups=sorted(names))
            answer = await sender.send(ApiKey.DESCRIBE_GROUPS, 5, body, broker)
            _file_described(sender, answer.groups, retry, self.described)
        for group in sorted(self.describe_consumer):
            if group in retry or group in self.described_consumer:
                continue
            body = request_codec(ApiKey.CONSUMER_GROUP_DESCRIBE, 0).default().replace(group_ids=[group])
            answer = await sender.send(ApiKey.CONSUMER_GROUP_DESCRIBE, 0, body, where[group])
            _file_described(sender, answer.groups, retry, self.described_consumer)
        return retry

    async def _commits(self, sender: Sender, where: Mapping[str, Broker], retry: set[str]) -> None:
        """The commits not made yet (``retry`` gets the groups whose coordinator moved)."""
        for group, offsets in self.commits.items():
            if group in retry or group in self.committed:
                continue
            generation, member_id, instance = self.as_member.get(group, (-1, "", None))
            version = 9 if group in self.consumer_protocol else 8
            body = request_codec(ApiKey.OFFSET_COMMIT, version).default().replace(
                group_id=group, generation_id_or_member_epoch=generation, member_id=member_id,
                group_instance_id=instance,
                topics=[Message(name=topic, partitions=[
                    Message(partition_index=p, committed_offset=o, committed_leader_epoch=-1, committed_metadata=md)
                    for (t, p), (o, md) in sorted(offsets.items()) if t == topic])
                    for topic in sorted({t for t, _ in offsets})])
            answer = await sender.send(ApiKey.OFFSET_COMMIT, version, body, where[group])
            codes = {(t.name, p.partition_index): p.error_code for t in answer.topics for p in t.partitions}
            for (topic, _), code in codes.items():
                sender.authorization(code, "Read", group=group, topic=topic)
            if any(c in _COORDINATOR_MOVED for c in codes.values()):
                retry.add(group)
            else:
                self.committed[group] = codes

    async def _reads(self, sender: Sender, where: Mapping[str, Broker], retry: set[str]) -> None:
        """The reads not made yet, one OffsetFetch per coordinator (``retry`` as for commits)."""
        for broker, names in _by_broker(where, (g for g in self.reads if g not in retry and g not in self.offsets)):
            body = request_codec(ApiKey.OFFSET_FETCH, 8).default().replace(require_stable=False, groups=[
                Message(group_id=g, topics=[Message(name=topic, partition_indexes=sorted(
                    p for t, p in self.reads[g] if t == topic)) for topic in sorted({t for t, _ in self.reads[g]})])
                for g in names])
            answer = await sender.send(ApiKey.OFFSET_FETCH, 8, body, broker)
            for entry in answer.groups:
                if entry.error_code in _COORDINATOR_MOVED:
                    retry.add(entry.group_id)
                    continue
                if entry.error_code:
                    refused = sender.authorization(entry.error_code, "Describe", group=entry.group_id)
                    if refused:
                        raise NotAuthorized(refused)
                    raise CoordinatorError(f"OffsetFetch of {entry.group_id}: error {entry.error_code}")
                read: dict[TopicPartition, Committed] = {}
                for t in entry.topics:
                    for p in t.partitions:
                        sender.authorization(p.error_code, "Describe", group=entry.group_id, topic=t.name)
                        if p.error_code in _COORDINATOR_MOVED:
                            retry.add(entry.group_id)
                        read[(t.name, p.partition_index)] = Committed(p.committed_offset, p.committed_leader_epoch,
                                                                      p.metadata)
                if entry.group_id not in retry:
                    self.offsets[entry.group_id] = read


def _file_described(sender: Sender, entries: Iterable[Any], retry: set[str], into: dict[str, Any]) -> None:
    """A DescribeGroups or ConsumerGroupDescribe answer's groups: each filed ``into``, or put back in ``retry`` when
    its coordinator moved (both answers carry a group_id and an error_code per group)."""
    for entry in entries:
        sender.authorization(entry.error_code, "Describe", group=entry.group_id)
        if entry.error_code in _COORDINATOR_MOVED:
            retry.add(entry.group_id)
        else:
            into[entry.group_id] = entry


def _by_broker(where: Mapping[str, Broker], groups: Iterable[str]) -> list[tuple[Broker, list[str]]]:
    """``groups`` by the broker coordinating them: one request per broker carries all of them."""
    out: dict[Broker, list[str]] = {}
    for group in groups:
        out.setdefault(where[group], []).append(group)
    return list(out.items())
