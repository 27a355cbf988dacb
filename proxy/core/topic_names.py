"""Topic id -> name, for every connection of a proxy, with the lookups Sluice makes itself. Sans-IO.

Fetch v13+ names topics by id only (KIP-516), while operators configure policies by topic name and the access log
reports names. A client's own Metadata responses are not enough: a connection that never sends Metadata (a
replica fetcher never does) would never learn them, and a rule on its topics would silently do nothing. So,
as Kroxylicious's ``topicNames(ids)`` does, Sluice asks the cluster itself: the server sends a Metadata request
of its own (v12+, topics by id) whenever a request that needs names names an id Sluice does not know, and the
request waits for the answer (:meth:`TopicNames.wait`). Names are cached for the life of the proxy (a topic id is
never reused: a re-created topic gets a new one). An id the cluster does not know, or a lookup that failed, is
not waited for again for ``retry_after_s``; such topics are shown as Kafka prints ids (base64url, no padding).

Only :mod:`proxy.io.cluster` does the I/O: it is told through ``on_lookup`` that ids are wanted, takes them with
:meth:`take`, and reports with :meth:`settle`.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .exchange import Signal

#: the all-zero id: "no topic id" (Uuid.ZERO_UUID)
ZERO_ID = bytes(16)


@dataclass(slots=True, eq=False)
class _Waiter:
    ids: set[bytes]
    callback: Callable[[], None]


class TopicNames:
    def __init__(self, clock: Callable[[], float], retry_after_s: float = 10.0,
                 on_lookup: Callable[[], None] | None = None) -> None:
        self._clock = clock
        self.retry_after_s = retry_after_s
        #: called when ids are wanted and no lookup is running (the server then calls :meth:`take`)
        self.on_lookup = on_lookup
        self._names: dict[bytes, str] = {}
        self._wanted: set[bytes] = set()
        self._pending: set[bytes] = set()
        self._given_up: dict[bytes, float] = {}  # id -> when it was last found unknown or failed
        self._waiters: list[_Waiter] = []

    def __len__(self) -> int:
        return len(self._names)

    def get(self, topic_id: bytes) -> str | None:
        return self._names.get(topic_id)

    def label(self, topic_id: bytes) -> str:
        """The name, else the id as Kafka prints it (Uuid.toString: base64url without padding)."""
        return self._names.get(topic_id) or base64.urlsafe_b64encode(topic_id).rstrip(b"=").decode()

    def learn(self, topic_id: bytes, name: str) -> None:
        """A name seen elsewhere (e.g. a Metadata response)."""
        if topic_id != ZERO_ID and name:
            self._names[topic_id] = name
            self._given_up.pop(topic_id, None)

    def missing(self, ids: Iterable[bytes]) -> frozenset[bytes]:
        """The ids among ``ids`` worth waiting for: unknown, and not given up on within ``retry_after_s``."""
        names, given_up = self._names, self._given_up
        out = {i for i in ids if i not in names and i != ZERO_ID}
        if out and given_up:
            now = self._clock()
            out = {i for i in out if now - given_up.get(i, -1e18) >= self.retry_after_s}
        return frozenset(out)

    def wait(self, ids: Iterable[bytes], callback: Callable[[], None]) -> None:
        """Look ``ids`` up (those not already being looked up) and call ``callback`` once every one of them is
        settled: learnt, unknown to the cluster, or failed."""
        waiter = _Waiter(set(ids), callback)
        self._waiters.append(waiter)
        self._want(waiter.ids)

    def pending(self, ids: Iterable[bytes]) -> Signal:
        """A request's wait (``Exchange.pending``) for ``ids``, settled as :meth:`wait` would call back. When the
        connection waiting on it closes (cancels its callback), the lookup stops waiting for it too: a policy
        that waits for names itself (with the ids it finds while reading a request) leaves nothing behind."""
        signal = _NamesWait(names=self)
        self.wait(ids, signal.settle)
        return signal

    def note(self, ids: Iterable[bytes]) -> None:
        """Look up the unknown ones among ``ids`` in the background (a response named them: next time they are
        known), without waiting."""
        self._want(self.missing(ids))

    @property
    def waiting(self) -> int:
        """How many waits for names are open (a closed connection leaves none behind)."""
        return len(self._waiters)

    def cancel(self, callback: Callable[[], None]) -> None:
        """Forget a waiter (its connection closed)."""
        self._waiters = [w for w in self._waiters if w.callback != callback]  # bound methods compare by ==

    def _want(self, ids: set[bytes] | frozenset[bytes]) -> None:
        new = {i for i in ids if i not in self._pending}
        if not new:
            return
        idle = not self._wanted
        self._wanted |= new
        if idle and self.on_lookup is not None:
            self.on_lookup()

    def take(self) -> set[bytes]:
        """The ids to look up now (they are pending until :meth:`settle`)."""
        ids, self._wanted = self._wanted, set()
        self._pending |= ids
        return ids

    def settle(self, found: dict[bytes, str], not_found: Iterable[bytes] = ()) -> None:
        """A lookup's outcome: ``found`` names; every other id taken is unknown to the cluster or failed."""
        now = self._clock()
        for topic_id, name in found.items():
            self.learn(topic_id, name)
        for topic_id in not_found:
            if topic_id not in self._names:
                self._given_up[topic_id] = now
        settled = set(found) | set(not_found)
        self._pending -= settled
        ready: list[Callable[[], None]] = []
        for waiter in self._waiters:
            waiter.ids -= settled
            if not waiter.ids:
                ready.append(waiter.callback)
        if ready:
            self._waiters = [w for w in self._waiters if w.ids]
            for callback in ready:
                callback()


@dataclass(eq=False)
class _NamesWait(Signal):
    """:meth:`TopicNames.pending`'s Signal: withdrawn from the lookup once nobody waits on it."""

    names: TopicNames | None = None

    def cancel(self, callback: Callable[[], None]) -> None:
        super().cancel(callback)
        if not self._callbacks and not self.settled and self.names is not None:
            self.names.cancel(self.settle)
