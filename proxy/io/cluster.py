"""Sluice's own requests to the cluster, made once here for every policy: the broker list and topic names
(:mod:`proxy.core.topic_names`), and the work policies queue (:mod:`proxy.core.broker_calls`: a request of any API
to a broker, any broker or a key's coordinator, or a procedure of several, such as cooperative consumption's
commits and reads), run here with a :class:`Sender` over one hardened connection per broker
(:mod:`proxy.io.own_connection`: one deadline per call, answers bounded, never a request sent twice). Metadata
goes over the same connections; coordinators are found with FindCoordinator v4 (KIP-699: several keys in one
request) and remembered until a procedure learns one moved.

Sluice's own connections, not confluent-kafka's AdminClient, because the AdminClient cannot make the calls as they
are needed:

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
- Any other API a policy needs (``BrokerRequests.send``): the AdminClient covers a fixed set, and a second client
  with its own connections and login would add a path and buy nothing.

On a cluster with an authorizer these requests need the ACLs of proxy/kafka_acls.py (``instance``); a refusal
(TOPIC_AUTHORIZATION_FAILED 29, GROUP_AUTHORIZATION_FAILED 30) is one ``kafka_not_authorized`` event naming the
resource, the operation, Sluice's principal and the work's purpose, and work refused a coordinator for it fails at
once saying so (not after its retries, as if no coordinator answered).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..accesslog import get_logger
from ..core.broker_calls import AnyBroker, Broker, BrokerCalls, Coordinator, NotAuthorized, Target, Work
from ..core.routing import Address, Router
from ..core.topic_names import TopicNames
from ..kafka_acls import AclReporter, principal_name
from ..metrics import Metrics
from ..wire.api_keys import ApiKey, api_name
from ..wire.errors import CodecError
from ..wire.messages import request_codec
from ..wire.model import Message
from .own_connection import DEFAULT_MAX_FRAME_BYTES, Link, NotSent

if TYPE_CHECKING:
    from ..config import UpstreamSettings
    from ..tls import TlsContexts

__all__ = ["OwnRequests"]

log = get_logger("sluice.server")

#: Metadata v12: the first version whose request may name topics by id (MetadataRequest.json)
METADATA_BY_ID_VERSION = 12
#: FindCoordinator v4: several keys in one request (KIP-699)
FIND_COORDINATOR_VERSION = 4
#: Kafka's error codes (Errors.java) for a missing ACL
TOPIC_AUTHORIZATION_FAILED, GROUP_AUTHORIZATION_FAILED = 29, 30


def _read_only(api_key: int) -> bool:
    """A request that changes nothing on the broker (Kafka's Describe*, List* and lookups): sent to any broker, one
    that failed may go on to the next."""
    name = api_name(api_key)
    return name.startswith(("Describe", "List")) or name in ("Metadata", "FindCoordinator", "ApiVersions",
                                                              "OffsetFetch")


class OwnRequests:
    """Sluice's own requests to the cluster (see the module docstring), for one proxy. Takes the lookups
    ``names`` waits for and the work queued in ``calls`` as they come, and runs each with a :class:`_WorkSender`
    over its links."""

    def __init__(self, upstream: UpstreamSettings, tls: TlsContexts, router: Router, names: TopicNames,
                 calls: BrokerCalls, metrics: Metrics, bootstrap: list[Address],
                 max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.upstream, self.tls, self.router, self.names = upstream, tls, router, names
        self.calls, self.metrics, self.bootstrap = calls, metrics, bootstrap
        self.max_frame_bytes = max_frame_bytes
        names.on_lookup = self._lookup_wanted
        calls.on_work = self._work_wanted
        self.acls = AclReporter(principal_name(upstream.sasl.username if upstream.sasl.mechanism else "",
                                               upstream.tls.cert_file), log.warning)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._coordinators: dict[Coordinator, Broker] = {}
        self._links: dict[Address, Link] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._lookup_task: asyncio.Task[None] | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    async def close(self) -> None:
        """Stop: the work in flight is cancelled (each fails, its connection closed), then the links closed."""
        tasks = [t for t in (self._lookup_task, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for link in self._links.values():
            link.close()

    # ------------------------------------------------------------------ the Sender work runs with

    async def send(self, api_key: int, version: int, body: Message, to: Target) -> Message:
        if isinstance(to, AnyBroker):
            return await self._any(api_key, version, body, read_only=_read_only(api_key))
        if isinstance(to, Coordinator):
            found = await self.locate([to])
            if to not in found:
                raise OSError(f"no coordinator for {to.key!r} yet")
            to = found[to]
        address = self.router.upstream.get(to.node_id)
        if address is None:
            await self.refresh_brokers()
            address = self.router.upstream.get(to.node_id)
            if address is None:
                raise OSError(f"broker node {to.node_id} is unknown to the cluster")
        return await self._link(address).request(api_key, version, body)

    async def locate(self, coordinators: Iterable[Coordinator]) -> dict[Coordinator, Broker]:
        wanted = set(coordinators)
        found = {c: b for c, b in self._coordinators.items() if c in wanted}
        denied: list[str] = []
        by_type: dict[int, list[str]] = {}
        for c in sorted(wanted - found.keys(), key=lambda c: (c.key_type, c.key)):
            by_type.setdefault(c.key_type, []).append(c.key)
        for key_type, keys in by_type.items():
            body = request_codec(ApiKey.FIND_COORDINATOR, FIND_COORDINATOR_VERSION).default().replace(
                key_type=key_type, coordinator_keys=keys)
            answer = await self._any(ApiKey.FIND_COORDINATOR, FIND_COORDINATOR_VERSION, body, read_only=True)
            for entry in answer.coordinators:
                if entry.error_code == 0:
                    self.router.learn(entry.node_id, entry.host, entry.port)
                    found[Coordinator(entry.key, key_type)] = self._coordinators[Coordinator(entry.key, key_type)] = \
                        Broker(entry.node_id)
                elif entry.error_code == GROUP_AUTHORIZATION_FAILED and key_type == 0:
                    denied.append(entry.key)
        if denied:
            raise _Denied(denied)
        return found

    def forget(self, coordinator: Coordinator) -> None:
        self._coordinators.pop(coordinator, None)

    def refused(self, code: int, operation: str, purpose: str, *, group: str | None = None,
                topic: str | None = None) -> str | None:
        """A response's error ``code``: for a missing ACL (on ``topic``, else ``group``), reported; what is missing."""
        if code == TOPIC_AUTHORIZATION_FAILED and topic is not None:
            return self.acls.missing("Topic", topic, operation, purpose)
        if code == GROUP_AUTHORIZATION_FAILED and group is not None:
            return self.acls.missing("Group", group, operation, purpose)
        return None

    async def pause(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def _any(self, api_key: int, version: int, body: Message, read_only: bool = False) -> Message:
        """To the first bootstrap server (then known broker) that takes the request. A request that was never sent
        goes on to the next server, and so does a ``read_only`` one (Metadata, FindCoordinator) whatever failed;
        any other that was sent and then failed fails here (it may have been applied)."""
        last: Exception | None = None
        for address in dict.fromkeys([*self.bootstrap, *self.router.upstream.values()]):
            try:
                return await self._link(address).request(api_key, version, body)
            except NotSent as e:
                last = e
            except (OSError, CodecError) as e:
                if not read_only:
                    raise
                last = e
        raise last if last is not None else OSError("no upstream address")

    def _link(self, address: Address) -> Link:
        link = self._links.get(address)
        if link is None:
            link = self._links[address] = Link(address, self.upstream.connect_timeout_s, self.tls.upstream,
                                               self.upstream.sasl, self.max_frame_bytes)
        return link

    # ------------------------------------------------------------------ work the policies queue

    def _work_wanted(self) -> None:
        if self.loop is None:
            return
        for work in self.calls.take():
            task = self.loop.create_task(self._run(work))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, work: Work) -> None:
        """Run one piece of work, bounded by its deadline; what came of it is the caller's to count (it sees the
        work settle)."""
        try:
            async with asyncio.timeout(work.deadline_s):
                await work.run(_WorkSender(self, work.purpose))
        except asyncio.CancelledError:  # Sluice is stopping: whoever waits for the work learns it failed
            work.fail("cancelled: Sluice is stopping")
            raise
        except (TimeoutError, OSError, CodecError, EOFError) as e:
            error = str(e) or type(e).__name__
            log.warning("broker_call_failed", work=type(work).__name__, error=error)
            work.fail(error, refused=isinstance(e, NotAuthorized))
        else:
            work.settle()

    # ------------------------------------------------------------------ Metadata: brokers, topic names

    async def _metadata(self, body: Message) -> Message:
        """A Metadata request of Sluice's own (v12), to the first bootstrap server (then known broker) that
        takes it, over the same connections as every other request of Sluice's own."""
        return await self._any(ApiKey.METADATA, METADATA_BY_ID_VERSION, body, read_only=True)

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
            except (TimeoutError, OSError, CodecError, EOFError) as e:
                self.metrics.topic_lookups.labels("failed").inc(len(ids))
                log.warning("topic_lookup_failed", topics=len(ids), error=str(e))
            else:
                for topic in body.topics:
                    tid = bytes(topic.topic_id)
                    if topic.error_code == 0 and topic.name and tid in ids:
                        found[tid] = topic.name
                    elif topic.error_code == TOPIC_AUTHORIZATION_FAILED:
                        # Kafka names no topic it may not describe: its id (Kafka's Uuid text) is what is known
                        self.acls.missing("Topic", f"<the topic of id {_uuid_text(tid)}>", "Describe",
                                          "topic names of Fetch v13+ (Metadata by topic id)")
                self.metrics.topic_lookups.labels("resolved").inc(len(found))
                self.metrics.topic_lookups.labels("unknown").inc(len(ids) - len(found))
            self.names.settle(found, ids - found.keys())


class _Denied(OSError):
    """Coordinators the cluster refused to name for want of an ACL (group keys)."""

    def __init__(self, groups: list[str]) -> None:
        super().__init__(f"not authorized to describe groups {groups}")
        self.groups = groups


class _WorkSender:
    """What one piece of work runs with: Sluice's own requests, and the work's purpose for what an authorizer
    refuses (a :class:`~proxy.core.broker_calls.Sender`)."""

    def __init__(self, own: OwnRequests, purpose: str) -> None:
        self.own, self.purpose = own, purpose

    async def send(self, api_key: int, version: int, body: Message, to: Target) -> Message:
        try:
            return await self.own.send(api_key, version, body, to)
        except _Denied as e:
            raise self._denied(e) from None

    async def locate(self, coordinators: Iterable[Coordinator]) -> dict[Coordinator, Broker]:
        try:
            return await self.own.locate(coordinators)
        except _Denied as e:  # no coordinator will ever answer for these: the work fails now, saying why
            raise self._denied(e) from None

    def _denied(self, e: _Denied) -> NotAuthorized:
        return NotAuthorized("; ".join(self.own.refused(GROUP_AUTHORIZATION_FAILED, "Describe", self.purpose,
                                                        group=g) or g for g in e.groups))

    def forget(self, coordinator: Coordinator) -> None:
        self.own.forget(coordinator)

    async def pause(self, seconds: float) -> None:
        await self.own.pause(seconds)

    def authorization(self, code: int, operation: str, *, group: str | None = None,
                      topic: str | None = None) -> str | None:
        return self.own.refused(code, operation, self.purpose, group=group, topic=topic)


def _uuid_text(raw: bytes) -> str:
    """A topic id as Kafka prints it (Uuid.toString: URL-safe base64, no padding)."""
    import base64

    return base64.urlsafe_b64encode(raw).decode().rstrip("=")
