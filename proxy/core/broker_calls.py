"""Requests Sluice makes to the cluster on a policy's behalf, as Kroxylicious filters have ``sendRequest``: any API
and version, to a broker, to any broker, or to the coordinator of a key. Sans-IO, like
:mod:`proxy.core.topic_names`: a policy hands :class:`BrokerCalls` a piece of :class:`Work` (one :class:`Call`, or
a procedure of several requests such as cooperative consumption's commits and reads); the I/O layer
(:mod:`proxy.io.cluster`) is told through ``on_work``, takes the work, runs it with a :class:`Sender` of its own
(hardened connections, one per broker) within the work's deadline, and settles it, which runs its callbacks. A
request that must wait for the answer sets the work as the exchange's ``pending``.

A procedure only ever awaits its :class:`Sender` (``send``, ``locate``, ``forget``, ``pause``): it touches no
socket and no clock of its own, so a test runs it with a fake sender.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from ..wire.model import Message
from .exchange import Signal

__all__ = ["ANY_BROKER", "AnyBroker", "Broker", "BrokerCalls", "BrokerRequests", "Call", "Coordinator",
           "NotAuthorized", "Sender", "Target", "Work"]


class NotAuthorized(OSError):
    """The cluster refused a request of the work for want of an ACL (GROUP_AUTHORIZATION_FAILED,
    TOPIC_AUTHORIZATION_FAILED): asking again changes nothing until someone grants it (:attr:`Work.refused`)."""


@dataclass(frozen=True, slots=True)
class Broker:
    """The broker with this node id (its address from the cluster's metadata)."""

    node_id: int


@dataclass(frozen=True, slots=True)
class AnyBroker:
    """Whichever broker answers first, the bootstrap servers first (Metadata, FindCoordinator)."""


#: the one :class:`AnyBroker`
ANY_BROKER = AnyBroker()


@dataclass(frozen=True, slots=True)
class Coordinator:
    """The coordinator of ``key`` (FindCoordinator, KIP-699): key type 0 a group, 1 a transactional id, 2 a share
    group's partition (Kafka's FindCoordinatorRequest.CoordinatorType). Found once and remembered, until the work
    learns it moved (:meth:`Sender.forget`)."""

    key: str
    key_type: int = 0


Target = Broker | AnyBroker | Coordinator


class Sender(Protocol):
    """What a piece of :class:`Work` may do, all of it through the I/O layer's connections."""

    async def send(self, api_key: int, version: int, body: Message, to: Target) -> Message:
        """One request and its answer (OSError when it cannot be had: not sent, or no answer in time; a request
        is never sent twice on the work's behalf, so one that may have been applied is never applied again)."""
        ...

    async def locate(self, coordinators: Iterable[Coordinator]) -> dict[Coordinator, Broker]:
        """The brokers of these coordinators, found in one request where not known yet; those the cluster has none
        for now (e.g. __consumer_offsets still being created) are left out. OSError naming what is missing when the
        cluster refuses one for want of an ACL (:class:`NotAuthorized`): no coordinator will ever answer for it."""
        ...

    def forget(self, coordinator: Coordinator) -> None:
        """``coordinator`` moved (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS...): found again when next used."""
        ...

    async def pause(self, seconds: float) -> None:
        """Wait before trying again (a coordinator moving or loading)."""
        ...

    def authorization(self, code: int, operation: str, *, group: str | None = None,
                      topic: str | None = None) -> str | None:
        """An answer's error ``code``: when it says an ACL is missing (TOPIC_AUTHORIZATION_FAILED on ``topic``,
        GROUP_AUTHORIZATION_FAILED on ``group``), one event naming what is missing for the work's purpose, and
        that text; else None."""
        ...


@dataclass(eq=False)
class Work(Signal):
    """Something Sluice does on the cluster for a policy: :meth:`run` with the I/O layer's sender, bounded by
    ``deadline_s`` in all; settled when it ends, with ``error`` set if it failed as a whole."""

    #: the bound of the whole work (a client's request may wait for it; its request.timeout.ms is 30 s by default)
    deadline_s: float = field(default=15.0, kw_only=True)
    #: what the work is for, as a missing ACL's event names it (e.g. "[sharing]: ...")
    purpose: str = field(default="a policy's own request", kw_only=True)
    #: why the work failed as a whole (None: it ran to its end)
    error: str | None = field(default=None, kw_only=True)
    #: it failed because the cluster refused it for want of an ACL (:class:`NotAuthorized`), not for a while
    refused: bool = field(default=False, kw_only=True)

    async def run(self, sender: Sender) -> None:
        raise NotImplementedError

    @property
    def ok(self) -> bool:
        return self.settled and self.error is None

    def fail(self, error: str, refused: bool = False) -> None:
        """The work failed as a whole: settle with ``error`` (``refused``: for want of an ACL)."""
        if not self.settled:
            self.error, self.refused = error, refused
            self.settle()


@dataclass(eq=False)
class Call(Work):
    """One request to ``to`` and, once settled, its ``answer`` (None if the call failed: ``error``)."""

    api_key: int = 0
    version: int = 0
    body: Message = field(default_factory=Message)
    to: Target = ANY_BROKER
    answer: Message | None = None

    async def run(self, sender: Sender) -> None:
        self.answer = await sender.send(self.api_key, self.version, self.body, self.to)


_W = TypeVar("_W", bound=Work)


class BrokerRequests(Protocol):
    """What a policy may ask of Sluice's own requests (``Services.broker``)."""

    def submit(self, work: _W) -> _W:
        """Queue ``work`` for the I/O layer; returned, to wait on (``ex.pending``) or read once settled."""
        ...

    def send(self, api_key: int, version: int, body: Message, to: Target = ANY_BROKER) -> Call:
        """One request, queued: :meth:`submit` of a :class:`Call`."""
        ...


class BrokerCalls:
    """The queue of work between the policies and the I/O layer (one per proxy): a :class:`BrokerRequests`."""

    def __init__(self, on_work: Callable[[], None] | None = None) -> None:
        #: called when work is queued and none was (the I/O layer then :meth:`take`\\s it)
        self.on_work = on_work
        self._queue: list[Work] = []

    def __len__(self) -> int:
        return len(self._queue)

    def submit(self, work: _W) -> _W:
        idle = not self._queue
        self._queue.append(work)
        if idle and self.on_work is not None:
            self.on_work()
        return work

    def send(self, api_key: int, version: int, body: Message, to: Target = ANY_BROKER) -> Call:
        return self.submit(Call(api_key=api_key, version=version, body=body, to=to))

    def take(self) -> list[Work]:
        work, self._queue = self._queue, []
        return work
