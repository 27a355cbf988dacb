"""Sluice's own requests to the cluster, made once here for every policy: the broker list and topic names
(:mod:`proxy.core.topic_names`), and group requests (:mod:`proxy.core.group_calls`: commits and reads of group
offsets, group descriptions), each group's sent to its coordinator (FindCoordinator v4, KIP-699: several groups
in one request; cached, found again when a broker says it is not the coordinator or is loading).

They go over Sluice's own hand-written connections (:mod:`proxy.io.own_connection`), not confluent-kafka's
AdminClient, because the AdminClient cannot make the calls as they are needed:

- Metadata naming topics by id (v12+, KIP-516): ``describe_topics`` takes topic names only, and ``list_topics``
  returns no ids. The broker list comes with the same request.
- DescribeGroups with each member's raw subscription and assignment bytes (cooperative consumption's marker
  travels in their user data): ``describe_consumer_groups`` hands back the assignment decoded into partitions,
  and neither the subscription nor any user data.
- OffsetFetch with the committed metadata: ``list_consumer_group_offsets`` answers, but confluent-kafka's
  TopicPartition copies librdkafka's metadata (a buffer with a length, not NUL-terminated) as a C string, so what
  Python gets runs past its end: a commit's metadata came back with foreign bytes after it (a
  UnicodeDecodeError on cooperative consumption's own base64 metadata, with confluent-kafka 2.16.1). The
  metadata is where cooperative consumption keeps the layouts to read back.
- OffsetCommit alone it could make; a second client, with its own connections and login, only for the commits of
  calls whose reads and descriptions go over these connections, would add a path and buy nothing.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from ..accesslog import get_logger
from ..core.group_calls import Committed, GroupCall, GroupCalls
from ..core.routing import Address, Router
from ..core.topic_names import TopicNames
from ..metrics import Metrics
from ..wire.api_keys import ApiKey
from ..wire.errors import CodecError
from ..wire.messages import request_codec
from ..wire.model import Message, TopicPartition
from .own_connection import Link, one_request

if TYPE_CHECKING:
    from ..config import UpstreamSettings
    from ..tls import TlsContexts

__all__ = ["GROUP_CALL_TIMEOUT_S", "OwnRequests"]

log = get_logger("sluice.server")

#: Metadata v12: the first version whose request may name topics by id (MetadataRequest.json)
METADATA_BY_ID_VERSION = 12
#: NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS: find the coordinator again, retry
_COORDINATOR_MOVED = frozenset({16, 15, 14})
_GROUP_CALL_ATTEMPTS = 8
#: a group call's bound in all (a client's request waits for it; its request.timeout.ms is 30 s by default)
GROUP_CALL_TIMEOUT_S = 15.0


class _CoordinatorError(Exception):
    """A group request the cluster did not serve (after retries)."""


class OwnRequests:
    """Sluice's own requests to the cluster (see the module docstring), for one proxy. Takes the lookups
    ``names`` waits for and the calls queued in ``group_calls`` as they come."""

    def __init__(self, upstream: UpstreamSettings, tls: TlsContexts, router: Router, names: TopicNames,
                 group_calls: GroupCalls, metrics: Metrics, bootstrap: list[Address],
                 group_call_timeout: float = GROUP_CALL_TIMEOUT_S) -> None:
        self.upstream, self.tls, self.router, self.names = upstream, tls, router, names
        self.group_calls, self.metrics, self.bootstrap = group_calls, metrics, bootstrap
        self.group_call_timeout = group_call_timeout
        names.on_lookup = self._lookup_wanted
        group_calls.on_work = self._group_calls_wanted
        self.loop: asyncio.AbstractEventLoop | None = None
        self._coordinators: dict[str, Address] = {}
        self._links: dict[Address, Link] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._lookup_task: asyncio.Task[None] | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    async def close(self) -> None:
        """Stop: the calls in flight are cancelled (each fails, its connection closed), then the links closed."""
        tasks = [t for t in (self._lookup_task, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for link in self._links.values():
            link.close()

    # ------------------------------------------------------------------ Metadata: brokers, topic names

    def _servers(self) -> list[Address]:
        return [*self.bootstrap, *self.router.upstream.values()]

    async def _metadata(self, body: Message) -> Message:
        """A Metadata request of Sluice's own (v12), to the first bootstrap server (then known broker) that
        answers."""
        last: Exception | None = None
        for address in self._servers():
            try:
                return await one_request(address, ApiKey.METADATA, METADATA_BY_ID_VERSION, body,
                                         self.upstream.connect_timeout_s, self.tls.upstream, self.upstream.sasl)
            except (TimeoutError, OSError, CodecError, EOFError) as e:
                # EOFError: a listener that closes on requests it does not take before authentication (SASL)
                last = e if not isinstance(e, EOFError) else OSError(f"{address[0]}:{address[1]} closed the "
                                                                     "connection")
        raise last if last is not None else OSError("no upstream address")

    async def refresh_brokers(self) -> None:
        """Ask the cluster for its broker list (Metadata, no topics) and open their listeners."""
        body = await self._metadata(Message(topics=[], allow_auto_topic_creation=False,
                                            include_topic_authorized_operations=False))
        for broker in body.brokers:
            self.router.learn(broker.node_id, broker.host, broker.port)
            self.router.port_for(broker.node_id)  # opens the node's listener on first sight

    def _lookup_wanted(self) -> None:
        if self.loop is not None and (self._lookup_task is None or self._lookup_task.done()):
            self._lookup_task = self.loop.create_task(self._lookup_topic_names())

    async def _lookup_topic_names(self) -> None:
        """Resolve the topic ids the connections wait for (proxy/core/topic_names.py): Metadata v12 naming
        topics by id; an id the cluster does not know comes back with UNKNOWN_TOPIC_ID."""
        while ids := self.names.take():
            found: dict[bytes, str] = {}
            try:
                body = await self._metadata(Message(
                    topics=[Message(topic_id=i, name=None) for i in sorted(ids)],
                    allow_auto_topic_creation=False, include_topic_authorized_operations=False))
            except (TimeoutError, OSError, CodecError) as e:
                self.metrics.topic_lookups.labels("failed").inc(len(ids))
                log.warning("topic_lookup_failed", topics=len(ids), error=str(e))
            else:
                for topic in body.topics:
                    tid = bytes(topic.topic_id)
                    if topic.error_code == 0 and topic.name and tid in ids:
                        found[tid] = topic.name
                self.metrics.topic_lookups.labels("resolved").inc(len(found))
                self.metrics.topic_lookups.labels("unknown").inc(len(ids) - len(found))
            self.names.settle(found, ids - found.keys())

    # ------------------------------------------------------------------ group requests

    def _group_calls_wanted(self) -> None:
        if self.loop is None:
            return
        for call in self.group_calls.take():
            task = self.loop.create_task(self._group_call(call))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _group_call(self, call: GroupCall) -> None:
        """Carry out one :class:`~proxy.core.group_calls.GroupCall`: commits and reads at once (over connections
        of their own: :class:`~proxy.io.own_connection.Link`), then descriptions.
        Bounded: ``group_call_timeout`` in all; what came of it is the caller's to count (it sees the call
        settle)."""
        try:
            async with asyncio.timeout(self.group_call_timeout):
                await self._group_call_io(call)
        except asyncio.CancelledError:  # Sluice is stopping: whoever waits for the call learns it failed
            call.fail("cancelled: Sluice is stopping")
            raise
        except (TimeoutError, OSError, CodecError, _CoordinatorError) as e:
            log.warning("group_call_failed", groups=sorted({*call.commits, *call.reads, *call.describe}),
                        error=str(e) or type(e).__name__)
            call.fail(str(e) or type(e).__name__)
        else:
            call.settle()

    async def _group_call_io(self, call: GroupCall) -> None:
        for attempt in range(_GROUP_CALL_ATTEMPTS):
            retry = await self._group_call_once(call)
            if not retry:
                return
            for group in retry:
                self._coordinators.pop(group, None)
            await asyncio.sleep(0.1 * (attempt + 1))  # the coordinator is moving or loading: ask again shortly
        raise _CoordinatorError(f"no coordinator answered for {sorted(retry)}")

    async def _group_call_once(self, call: GroupCall) -> set[str]:
        """One pass over what is left of ``call``; the groups whose coordinator must be found again."""
        retry: set[str] = set()
        groups = {*call.commits, *call.reads, *call.describe, *call.describe_consumer}
        where = await self._find_coordinators(groups - self._coordinators.keys())
        where.update((g, self._coordinators[g]) for g in groups if g in self._coordinators)
        retry |= groups - where.keys()
        # A slice's commit and the reads of the others' positions need no order between them: a read that misses a
        # commit made meanwhile is lower than the truth, never higher (proxy/policies/sharing/frontier.py), and the
        # committing member reads again once its group commit is in (offsets._raise_stable)
        failed = [e for e in await asyncio.gather(self._commits(call, where, retry), self._reads(call, where, retry),
                                                  return_exceptions=True) if e is not None]
        if failed:
            raise failed[0]
        described: dict[Address, list[str]] = {}
        for group in call.describe:
            if group not in retry and group not in call.described:
                described.setdefault(where[group], []).append(group)
        for address, names in described.items():
            body = request_codec(ApiKey.DESCRIBE_GROUPS, 5).default().replace(groups=sorted(names))
            answer = await self._link(address).request(ApiKey.DESCRIBE_GROUPS, 5, body)
            for entry in answer.groups:
                if entry.error_code in _COORDINATOR_MOVED:
                    retry.add(entry.group_id)
                else:
                    call.described[entry.group_id] = entry
        for group in sorted(call.describe_consumer):
            if group in retry or group in call.described_consumer:
                continue
            body = request_codec(ApiKey.CONSUMER_GROUP_DESCRIBE, 0).default().replace(group_ids=[group])
            answer = await self._link(where[group]).request(ApiKey.CONSUMER_GROUP_DESCRIBE, 0, body)
            for entry in answer.groups:
                if entry.error_code in _COORDINATOR_MOVED:
                    retry.add(entry.group_id)
                else:
                    call.described_consumer[entry.group_id] = entry
        for group in retry:
            self._coordinators.pop(group, None)
        return retry

    async def _commits(self, call: GroupCall, where: dict[str, Address], retry: set[str]) -> None:
        """The commits of ``call`` not made yet (``retry`` gets the groups whose coordinator moved)."""
        for group, offsets in call.commits.items():
            if group in retry or group in call.committed:
                continue
            generation, member_id, instance = call.as_member.get(group, (-1, "", None))
            version = 9 if group in call.consumer_protocol else 8
            body = request_codec(ApiKey.OFFSET_COMMIT, version).default().replace(
                group_id=group, generation_id_or_member_epoch=generation, member_id=member_id,
                group_instance_id=instance,
                topics=[Message(name=topic, partitions=[
                    Message(partition_index=p, committed_offset=o, committed_leader_epoch=-1, committed_metadata=md)
                    for (t, p), (o, md) in sorted(offsets.items()) if t == topic])
                    for topic in sorted({t for t, _ in offsets})])
            answer = await self._link(where[group]).request(ApiKey.OFFSET_COMMIT, version, body)
            codes = {(t.name, p.partition_index): p.error_code for t in answer.topics for p in t.partitions}
            if any(c in _COORDINATOR_MOVED for c in codes.values()):
                retry.add(group)
            else:
                call.committed[group] = codes

    async def _reads(self, call: GroupCall, where: dict[str, Address], retry: set[str]) -> None:
        """The reads of ``call`` not made yet, one OffsetFetch per coordinator (``retry`` as for commits)."""
        by_node: dict[Address, list[str]] = {}
        for group in call.reads:
            if group not in retry and group not in call.offsets:
                by_node.setdefault(where[group], []).append(group)
        for address, names in by_node.items():
            body = request_codec(ApiKey.OFFSET_FETCH, 8).default().replace(require_stable=False, groups=[
                Message(group_id=g, topics=[Message(name=topic, partition_indexes=sorted(
                    p for t, p in call.reads[g] if t == topic)) for topic in sorted({t for t, _ in call.reads[g]})])
                for g in names])
            answer = await self._link(address).request(ApiKey.OFFSET_FETCH, 8, body)
            for entry in answer.groups:
                if entry.error_code in _COORDINATOR_MOVED:
                    retry.add(entry.group_id)
                    continue
                if entry.error_code:
                    raise _CoordinatorError(f"OffsetFetch of {entry.group_id}: error {entry.error_code}")
                read: dict[TopicPartition, Committed] = {}
                for t in entry.topics:
                    for p in t.partitions:
                        if p.error_code in _COORDINATOR_MOVED:
                            retry.add(entry.group_id)
                        read[(t.name, p.partition_index)] = Committed(p.committed_offset, p.committed_leader_epoch,
                                                                      p.metadata)
                if entry.group_id not in retry:
                    call.offsets[entry.group_id] = read

    async def _find_coordinators(self, groups: set[str]) -> dict[str, Address]:
        """FindCoordinator v4 (KIP-699: several keys in one request) for ``groups``, from the first bootstrap
        server (then known broker) that answers; the groups without an answer yet (coordinator not available,
        e.g. __consumer_offsets still being created) are left out."""
        if not groups:
            return {}
        body = request_codec(ApiKey.FIND_COORDINATOR, 4).default().replace(key_type=0, coordinator_keys=sorted(groups))
        last: Exception | None = None
        for address in self._servers():
            try:
                answer = await self._link(address).request(ApiKey.FIND_COORDINATOR, 4, body)
            except (TimeoutError, OSError, CodecError) as e:
                last = e
                continue
            found = {c.key: (c.host, c.port) for c in answer.coordinators if c.error_code == 0}
            self._coordinators.update(found)
            return found
        raise last if last is not None else OSError("no upstream address")

    def _link(self, address: Address) -> Link:
        link = self._links.get(address)
        if link is None:
            link = self._links[address] = Link(address, self.upstream.connect_timeout_s, self.tls.upstream,
                                               self.upstream.sasl)
        return link
