"""The client quotas' arithmetic, sans-IO: which entry's quota of each kind a client is under, the windowed rates
it is measured with, and the throttle time an over-quota client gets (KIP-13, KIP-124, KIP-219; Kafka's
ClientQuotaManager).

**Entities and precedence.** Kafka resolves each quota kind (producer_byte_rate, consumer_byte_rate,
request_percentage: one ClientQuotaManager each) on its own, from the most specific entity that has a quota of
that kind (the Kafka documentation's "quotas" section, ClientQuotaManager's DefaultQuotaCallback.quotaLimit)::

    user + client-id > user + <default> client-id > user > <default> user + client-id
      > <default> user + <default> client-id > <default> user > client-id > <default> client-id

That order is lexicographic over (user, client-id), each ranked name > ``<default>`` > not given. Sluice ranks a
third part, the client's address (PROXY protocol), between the two: who the client proved to be (its SASL
principal) first, then where it connects from (which it cannot choose either), then the client.id it chose. Each
part ranks: exact name (an address: one host) > glob (Sluice's; a network: the longer prefix first) >
``<default>`` > not given; entries equal in every part go in list order. A client without a SASL principal matches
no entry that names one (Kafka would name it ANONYMOUS or by its TLS certificate, which Sluice does not see).

An entry whose kind is 0 is the client's entry for that kind all the same: it exempts the entity from the less
specific entries (Kafka has no exemption but a quota too large to bind).

**Rates.** Kafka keys a client's rate by the parts of the entity its quota came from (its metric tags,
DefaultQuotaCallback.quotaMetricTags): a user-level quota is one rate for every client.id of that user, a
``<default>`` one a rate per user. Sluice does the same per part (a glob or a network: one rate per value it
matched, like ``<default>``), and ``shared = true`` makes an entry one rate for every client it selects. A rate is
counted across every connection and broker of this Sluice; with ``scope = "fleet"`` its bound is this instance's
share of the quota (shares.py). Rates are Kafka's windowed rate (:class:`~proxy.core.rate.WindowedRate`).

**Throttle time**: Kafka's (QuotaUtils.throttleTime, :meth:`~proxy.core.rate.WindowedRate.throttle_time`), bounded
by the quota's whole window (QuotaUtils.boundedThrottleTime); and, unlike Kafka's, at least what keeps the client
within :data:`BURST_S` windows of its quota's pace (the rate's ``burst_s``: a windowed rate alone lets a client
repeat a burst every samples x window_s).
"""

from __future__ import annotations

import fnmatch
import ipaddress
from dataclasses import dataclass, field
from typing import Any, Literal

from ...core.rate import WindowedRate
from .settings import DEFAULT, QuotaEntrySettings, QuotaSettings
from .shares import FleetShares

Kind = Literal["produce", "fetch", "request"]
KINDS: tuple[Kind, ...] = ("produce", "fetch", "request")

#: a part's rank (see the module docstring)
_EXACT, _GLOB, _DEFAULT, _ANY = 3, 2, 1, 0


@dataclass(frozen=True, slots=True)
class _Name:
    """One textual part of an entity (principal, client.id): a name, a glob, ``<default>`` or None (not given)."""

    spec: str | None
    rank: int = field(init=False)

    def __post_init__(self) -> None:
        s = self.spec
        rank = _ANY if s is None else _DEFAULT if s == DEFAULT else _GLOB if any(c in s for c in "*?[") else _EXACT
        object.__setattr__(self, "rank", rank)

    def matches(self, value: str | None, absent_matches_default: bool) -> bool:
        rank = self.rank
        if rank == _ANY:
            return True
        if value is None:
            # a client.id may be absent (null: Kafka's default client-id applies to it); a principal is absent when
            # the connection did not authenticate, and then it is no user entity's
            return rank == _DEFAULT and absent_matches_default
        if rank == _DEFAULT:
            return True
        if rank == _EXACT:
            return value == self.spec
        return fnmatch.fnmatchcase(value, self.spec or "")


@dataclass(frozen=True, slots=True)
class _Address:
    """The address part: one host or a network, ``<default>`` or None (not given)."""

    spec: str | None
    rank: int = field(init=False)
    prefix: int = field(init=False)
    net: Any = field(init=False)

    def __post_init__(self) -> None:
        s = self.spec
        net = None if s is None or s == DEFAULT else ipaddress.ip_network(s, strict=False)
        rank = (_ANY if s is None else _DEFAULT if net is None else
                _EXACT if net.prefixlen == net.max_prefixlen else _GLOB)
        object.__setattr__(self, "net", net)
        object.__setattr__(self, "rank", rank)
        object.__setattr__(self, "prefix", net.prefixlen if net is not None else 0)

    def matches(self, host: str) -> bool:
        if self.rank == _ANY:
            return True
        try:
            addr = ipaddress.ip_address(host)
        except ValueError:
            return False  # no address known (an in-process test connection, a Unix socket)
        return self.net is None or addr in self.net


@dataclass(frozen=True, slots=True)
class Entry:
    name: str
    index: int
    principal: _Name
    client_id: _Name
    address: _Address
    #: per kind: the quota (bytes/s, requests/s), 0 = exempt, None = not set (the next entry's applies)
    produce: int | None
    fetch: int | None
    requests: float | None
    shared: bool
    fleet: bool

    @classmethod
    def of(cls, s: QuotaEntrySettings, index: int, scope: str) -> Entry:
        return cls(s.name or f"entries[{index}]", index, _Name(s.principal), _Name(s.client_id),
                   _Address(s.client_address), s.produce_rate_bytes, s.fetch_rate_bytes, s.request_rate, s.shared,
                   (s.scope or scope) == "fleet")

    def bound(self, kind: Kind) -> float | None:
        return self.produce if kind == "produce" else self.fetch if kind == "fetch" else self.requests

    @property
    def precedence(self) -> tuple[int, ...]:
        """Higher wins (the module docstring's order); list order last."""
        return (self.principal.rank, self.address.rank, self.address.prefix, self.client_id.rank, -self.index)

    def matches(self, client_id: str | None, principal: str | None, host: str) -> bool:
        return (self.principal.matches(principal, False) and self.client_id.matches(client_id, True)
                and self.address.matches(host))

    def key(self, kind: Kind, client_id: str | None, principal: str | None, host: str) -> RateKey:
        """The rate this client is counted on for ``kind`` under this entry (the module docstring's "Rates")."""
        if self.shared:
            return (self.name, kind, None, None, None)
        return (self.name, kind,
                principal if self.principal.rank != _ANY else None,
                (client_id or "") if self.client_id.rank != _ANY else None,
                host if self.address.rank != _ANY else None)


#: (entry name, kind, principal, client.id, address); a part the entry does not name (or a shared entry's) is None
RateKey = tuple[str, Kind, str | None, str | None, str | None]


@dataclass(frozen=True, slots=True)
class Governing:
    """A client's entry per kind (None: no quota of that kind, no entry or an exemption)."""

    produce: Entry | None
    fetch: Entry | None
    request: Entry | None
    #: the distinct entries governing some kind of this client (found once: a snapshot remembers its answers)
    entries: tuple[Entry, ...] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        seen: list[Entry] = []
        for e in (self.produce, self.fetch, self.request):
            if e is not None and e not in seen:
                seen.append(e)
        object.__setattr__(self, "entries", tuple(seen))

    def entry(self, kind: Kind) -> Entry | None:
        return self.produce if kind == "produce" else self.fetch if kind == "fetch" else self.request


NOTHING = Governing(None, None, None)
#: answers a snapshot remembers (client.ids are the clients' to choose: bounded, and started over when full)
_SEEN_MAX = 4096


@dataclass(frozen=True, slots=True)
class Quotas:
    """One immutable snapshot of the [quota] configuration."""

    entries: tuple[Entry, ...] = ()
    samples: int = 11
    window_s: float = 1.0
    #: per kind, the entries that set it, most specific first
    _by_kind: dict[Kind, tuple[Entry, ...]] = field(default_factory=dict, compare=False, repr=False)
    _seen: dict[tuple[str | None, str | None, str], Governing] = field(default_factory=dict, compare=False,
                                                                        repr=False)

    @classmethod
    def from_settings(cls, s: QuotaSettings) -> Quotas:
        entries = tuple(Entry.of(e, i, s.scope) for i, e in enumerate(s.entries))
        ordered = sorted(entries, key=lambda e: e.precedence, reverse=True)
        by_kind = {k: tuple(e for e in ordered if e.bound(k) is not None) for k in KINDS}
        return cls(entries, s.samples, s.window_s, by_kind)

    @property
    def fleet(self) -> bool:
        return any(e.fleet for e in self.entries)

    def sets(self, kind: Kind) -> bool:
        """Whether some entry sets a quota of ``kind``."""
        return any(e.bound(kind) for e in self._by_kind.get(kind, ()))

    def governing(self, client_id: str | None, principal: str | None, host: str) -> Governing:
        """The client's entry per kind: of the entries that select it and set the kind, the most specific."""
        ident = (client_id, principal, host)
        answer = self._seen.get(ident)
        if answer is None:
            if len(self._seen) >= _SEEN_MAX:
                self._seen.clear()
            found: list[Entry | None] = []
            for kind in KINDS:
                entry = next((e for e in self._by_kind.get(kind, ()) if e.matches(client_id, principal, host)), None)
                found.append(entry if entry is not None and entry.bound(kind) else None)  # 0: exempt
            answer = self._seen[ident] = Governing(*found) if any(found) else NOTHING
        return answer


class QuotaBook:
    """Every rate the proxy measures for its quotas, shared by its connections."""

    def __init__(self, quotas: Quotas, fleet: FleetShares | None = None) -> None:
        self.quotas = quotas
        self.rates: dict[RateKey, WindowedRate] = {}
        #: the fleet's reports and this instance's usage of its fleet-scoped rates (shares.py)
        self.fleet = fleet or FleetShares()
        self._sweep_at = _SWEEP_MIN

    def reconfigure(self, quotas: Quotas, now: float) -> None:
        """A new snapshot: a rate whose entry keeps a quota of its kind carries on under the new bound
        (:meth:`WindowedRate.reconfigure`: from ``now``); the others are forgotten."""
        by_name = {e.name: e for e in quotas.entries}
        kept: dict[RateKey, WindowedRate] = {}
        for key, rate in self.rates.items():
            entry = by_name.get(key[0])
            quota = entry.bound(key[1]) if entry is not None else None
            if entry is not None and quota:
                bound = self.fleet.share(key, quota, now) if entry.fleet else quota
                rate.reconfigure(_scaled(key[1], bound), quotas.samples, quotas.window_s, now)
                kept[key] = rate
        self.quotas, self.rates = quotas, kept
        self.fleet.forget({k for k in self.fleet.keys() if k not in kept})

    def record(self, entry: Entry, kind: Kind, amount: int, key: RateKey, now: float) -> float:
        """Record ``amount`` (bytes, or requests) on the rate ``key`` of ``entry``'s quota of ``kind``; the throttle
        time in seconds it earns (0: within its quota)."""
        quota = entry.bound(kind)
        if not quota:
            return 0.0
        rate = self.rates.get(key)
        if rate is None:
            if len(self.rates) >= self._sweep_at:
                self._sweep(now)
            q = self.quotas
            bound = self.fleet.share(key, quota, now) if entry.fleet else quota
            rate = self.rates[key] = WindowedRate(_scaled(kind, bound), q.samples, q.window_s, BURST_S * q.window_s)
        rate.record(amount * _REQUEST_SCALE if kind == "request" else amount, now)
        delay = rate.throttle_time(now)
        longest = rate.samples * rate.window_s
        if delay > longest:
            delay = longest
        if entry.fleet:
            if self.fleet.used(key, amount, delay > 0, now) and self._follow_share(rate, key, quota, now):
                delay = min(rate.throttle_time(now), rate.samples * rate.window_s)  # under its grown share
            # This instance's share follows its demand within an interval or two (shares.py): a client held to a
            # share about to change waits no longer than that, then for the new one
            delay = min(delay, FLEET_HOLD_INTERVALS * self.fleet.interval_s)
        return delay

    def bound(self, key: RateKey, kind: Kind, entry: Entry) -> float:
        """The bound ``key`` is held to: its rate's (a fleet-scoped one: this instance's share), else the quota."""
        rate = self.rates.get(key)
        return rate.bound / _scale(kind) if rate is not None else entry.bound(kind) or 0.0

    def rebalance(self, now: float) -> None:
        """Set every fleet-scoped rate's bound to this instance's share of its quota now (shares.py), when it moved
        by more than :data:`SHARE_STEP`: a new bound applies from ``now`` (:meth:`WindowedRate.reconfigure`), so
        a bound raised gives no credit for the window before (the other instances used that part of it)."""
        by_name = {e.name: e for e in self.quotas.entries if e.fleet}
        for key, rate in self.rates.items():
            entry = by_name.get(key[0])
            quota = entry.bound(key[1]) if entry is not None else None
            if quota:
                self._follow_share(rate, key, quota, now)

    def _follow_share(self, rate: WindowedRate, key: RateKey, quota: float, now: float) -> bool:
        """Set ``rate``'s bound to this instance's share of ``quota`` if it moved enough; True if it changed."""
        bound = _scaled(key[1], self.fleet.share(key, quota, now))
        if abs(bound - rate.bound) <= SHARE_STEP * rate.bound:
            return False
        q = self.quotas
        rate.reconfigure(bound, q.samples, q.window_s, now)
        return True

    def _sweep(self, now: float) -> None:
        """Forget the rates with nothing left in their window: an idle rate earns no credit
        (:mod:`proxy.core.rate`), so a new one is the same, and clients that come and go (a client.id per
        process, per job) do not pile up. Kafka expires its idle quota sensors likewise."""
        self.rates = {k: r for k, r in self.rates.items() if r.total(now)}
        self.fleet.forget({k for k in self.fleet.keys() if k not in self.rates})
        self._sweep_at = max(_SWEEP_MIN, 2 * len(self.rates))

    def entities(self, now: float, limit: int = 100) -> tuple[list[dict[str, Any]], int]:
        """The rates measured now, busiest first, at most ``limit`` (the admin API's status); and how many more."""
        measured = sorted(((rate.rate(now) / _scale(key[1]), key, rate) for key, rate in self.rates.items()),
                          key=lambda m: (-m[0], m[1][0], m[1][1]))
        rows = [{"entry": name, "kind": kind, "principal": principal, "client_id": client_id,
                 "client_address": address, "rate": measured_rate, "bound": rate.bound / _scale(kind)}
                for measured_rate, (name, kind, principal, client_id, address), rate in measured[:limit]]
        return rows, max(0, len(measured) - limit)


#: how far ahead of its quota's pace a client may get, in windows (core/rate.py ``burst_s``: without it a windowed
#: rate lets a client repeat an uneven history every samples x window_s)
BURST_S = 1.0
#: rates kept before idle ones are swept (then twice the number left)
_SWEEP_MIN = 1024
#: request rates are counted in thousandths, so that a fractional requests/s quota is an integer bound
_REQUEST_SCALE = 1000
#: a fleet-scoped client is held at most this many usage intervals at a time (see :meth:`QuotaBook.record`)
FLEET_HOLD_INTERVALS = 2
#: a fleet-scoped rate's bound follows its share when the share moved by more than this fraction
SHARE_STEP = 0.02


def _scale(kind: Kind) -> int:
    return _REQUEST_SCALE if kind == "request" else 1


def _scaled(kind: Kind, bound: float) -> int:
    return max(1, round(bound * _scale(kind)))
