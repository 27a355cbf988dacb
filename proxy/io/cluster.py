"""Sluice's own requests to the cluster, made once here for every policy: the broker list and topic names
(:mod:`proxy.core.topic_names`), and group requests (:mod:`proxy.core.group_calls`: commits and reads of group
offsets, group descriptions).

Which client makes which request, and why:

- Group offsets (OffsetCommit with metadata, OffsetFetch with metadata and leader epoch): confluent-kafka's
  AdminClient (:mod:`proxy.io.group_offsets`), which finds the coordinators and logs in with every SASL mechanism
  librdkafka has.
- DescribeGroups: hand-written (:mod:`proxy.io.own_connection`), sent to the group's coordinator found with
  FindCoordinator v4 (KIP-699). Cooperative consumption reads each member's raw subscription and assignment bytes
  (its marker travels in their user data); the AdminClient's ``describe_consumer_groups`` hands back the
  assignment decoded into partitions and neither the subscription nor the user data.
- Metadata (the broker list, topic names by id): hand-written, Metadata v12 naming topics by id (KIP-516). The
  AdminClient's ``describe_topics`` takes topic names only, and ``list_topics`` returns no ids. The broker list
  comes with the same request; a cluster that is down fails it at once (connection refused), where librdkafka
  would retry until its timeout: a client connecting to a node Sluice does not know yet waits on this lookup.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from ..accesslog import get_logger
from ..core.group_calls import GroupCall, GroupCalls
from ..core.routing import Address, Router
from ..core.topic_names import TopicNames
from ..metrics import Metrics
from ..wire.errors import CodecError
from ..wire.messages import request_codec
from ..wire.model import Message
from .group_offsets import GroupOffsets
from .own_connection import Link, one_request

if TYPE_CHECKING:
    from ..config import UpstreamSettings
    from ..tls import TlsContexts

__all__ = ["GROUP_CALL_TIMEOUT_S", "OwnRequests"]

log = get_logger("sluice.server")

METADATA_KEY = 3
#: Metadata v12: the first version whose request may name topics by id (MetadataRequest.json)
METADATA_BY_ID_VERSION = 12
_FIND_COORDINATOR, _DESCRIBE_GROUPS = 10, 15
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
        self._offsets = GroupOffsets(upstream, group_call_timeout)
        self._coordinators: dict[str, Address] = {}
        self._links: dict[Address, Link] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._lookup_task: asyncio.Task[None] | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    async def close(self) -> None:
        if self._lookup_task is not None:
            self._lookup_task.cancel()
        for task in list(self._tasks):
            task.cancel()
        for link in self._links.values():
            link.close()
        await self._offsets.close()

    # ------------------------------------------------------------------ Metadata: brokers, topic names

    def _servers(self) -> list[Address]:
        return [*self.bootstrap, *self.router.upstream.values()]

    async def _metadata(self, body: Message) -> Message:
        """A Metadata request of Sluice's own (v12), to the first bootstrap server (then known broker) that
        answers."""
        last: Exception | None = None
        for address in self._servers():
            try:
                return await one_request(address, METADATA_KEY, METADATA_BY_ID_VERSION, body,
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
        """Carry out one :class:`~proxy.core.group_calls.GroupCall`: commits, then reads, then descriptions.
        Bounded: ``group_call_timeout`` in all; what came of it is the caller's to count (it sees the call
        settle)."""
        try:
            await asyncio.wait_for(self._group_call_io(call), self.group_call_timeout)
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
            await asyncio.sleep(0.1 * (attempt + 1))  # the coordinator is moving or loading: ask again shortly
        raise _CoordinatorError(f"no coordinator answered for {sorted(retry)}")

    async def _group_call_once(self, call: GroupCall) -> set[str]:
        """One pass over what is left of ``call``; the groups to ask again (their coordinator is moving or
        loading)."""
        retry: set[str] = set()
        for group, offsets in call.commits.items():
            if group in call.committed:
                continue
            codes = await self._offsets.commit(group, offsets)
            if any(c in _COORDINATOR_MOVED for c in codes.values()):
                retry.add(group)
            else:
                call.committed[group] = codes
        for group, partitions in call.reads.items():
            if group in retry or group in call.offsets:
                continue
            read, errors = await self._offsets.read(group, partitions)
            if any(c in _COORDINATOR_MOVED for c in errors.values()):
                retry.add(group)
            elif errors:
                raise _CoordinatorError(f"OffsetFetch of {group}: errors {sorted(set(errors.values()))}")
            else:
                call.offsets[group] = read
        retry |= await self._describe(call)
        return retry

    async def _describe(self, call: GroupCall) -> set[str]:
        """DescribeGroups of the groups of ``call`` not described yet, each at its coordinator; the groups whose
        coordinator must be found again."""
        groups = call.describe - call.described.keys()
        if not groups:
            return set()
        where = await self._find_coordinators(groups - self._coordinators.keys())
        where.update((g, self._coordinators[g]) for g in groups if g in self._coordinators)
        retry = groups - where.keys()
        by_node: dict[Address, list[str]] = {}
        for group in groups & where.keys():
            by_node.setdefault(where[group], []).append(group)
        for address, names in by_node.items():
            body = request_codec(_DESCRIBE_GROUPS, 5).default().replace(groups=sorted(names))
            answer = await self._link(address).request(_DESCRIBE_GROUPS, 5, body)
            for entry in answer.groups:
                if entry.error_code in _COORDINATOR_MOVED:
                    retry.add(entry.group_id)
                else:
                    call.described[entry.group_id] = entry
        for group in retry:
            self._coordinators.pop(group, None)
        return retry

    async def _find_coordinators(self, groups: set[str]) -> dict[str, Address]:
        """FindCoordinator v4 (KIP-699: several keys in one request) for ``groups``, from the first bootstrap
        server (then known broker) that answers; the groups without an answer yet (coordinator not available,
        e.g. __consumer_offsets still being created) are left out."""
        if not groups:
            return {}
        body = request_codec(_FIND_COORDINATOR, 4).default().replace(key_type=0, coordinator_keys=sorted(groups))
        last: Exception | None = None
        for address in self._servers():
            try:
                answer = await self._link(address).request(_FIND_COORDINATOR, 4, body)
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
