"""The client quotas' arithmetic, sans-IO: which entry a request falls under, the windowed rates it is measured
with, and the throttle time an over-quota client gets (KIP-13, KIP-124, KIP-219; Kafka's ClientQuotaManager).

- An entry selects clients as every client selector does (client.id glob, principal glob, client network); a
  request takes the first entry that selects it and has a quota set.
- A shared entry has one rate per kind for every connection it selects; otherwise each client has its own,
  keyed by Kafka's quota entity (principal, client.id), across its connections and the brokers it talks to.
- Rates are Kafka's windowed rate (:class:`~proxy.core.rate.WindowedRate`): produce request bytes and fetch
  response bytes as Kafka records them (ProduceRequest size on arrival, the Fetch response's size when it is
  answered), requests one each.
- The throttle time is Kafka's (QuotaUtils.throttleTime, :meth:`~proxy.core.rate.WindowedRate.throttle_time`):
  the time that brings the rate back within the quota if the client sends nothing meanwhile, bounded by the
  quota's whole window, as Kafka bounds it (QuotaUtils.boundedThrottleTime).
- A quota of 0 means none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ...core.rate import WindowedRate
from ...core.selectors import ClientSelector
from .settings import QuotaSettings

Kind = Literal["produce", "fetch", "request"]


@dataclass(frozen=True, slots=True)
class Entry:
    name: str
    selector: ClientSelector
    produce: int
    fetch: int
    requests: float
    shared: bool

    def bound(self, kind: Kind) -> float:
        return self.produce if kind == "produce" else self.fetch if kind == "fetch" else self.requests


@dataclass(frozen=True, slots=True)
class Quotas:
    """One immutable snapshot of the [quota] configuration."""

    entries: tuple[Entry, ...] = ()
    samples: int = 11
    window_s: float = 1.0

    @classmethod
    def from_settings(cls, s: QuotaSettings) -> Quotas:
        entries = tuple(
            Entry(e.name or f"entries[{i}]", ClientSelector.of(e), e.produce_rate_bytes, e.fetch_rate_bytes,
                  e.request_rate, e.shared)
            for i, e in enumerate(s.entries) if e.produce_rate_bytes or e.fetch_rate_bytes or e.request_rate)
        return cls(entries, s.samples, s.window_s)

    def entry(self, client_id: str | None, principal: str | None, host: str) -> Entry | None:
        for e in self.entries:
            if e.selector.matches(client_id, principal, host):
                return e
        return None


#: (entry name, kind, principal, client.id); principal and client.id are None for a shared entry
RateKey = tuple[str, Kind, str | None, str | None]


class QuotaBook:
    """Every rate the proxy measures for its quotas, shared by its connections."""

    def __init__(self, quotas: Quotas) -> None:
        self.quotas = quotas
        self.rates: dict[RateKey, WindowedRate] = {}
        self._sweep_at = _SWEEP_MIN

    def reconfigure(self, quotas: Quotas, now: float) -> None:
        """A new snapshot: a rate whose entry keeps a quota of its kind carries on under the new bound
        (:meth:`WindowedRate.reconfigure`: from ``now``); the others are forgotten."""
        by_name = {e.name: e for e in quotas.entries}
        kept: dict[RateKey, WindowedRate] = {}
        for key, rate in self.rates.items():
            entry = by_name.get(key[0])
            if entry is not None and entry.bound(key[1]):
                rate.reconfigure(_scaled(key[1], entry.bound(key[1])), quotas.samples, quotas.window_s, now)
                kept[key] = rate
        self.quotas, self.rates = quotas, kept

    def record(self, entry: Entry, kind: Kind, amount: int, client_id: str | None, principal: str | None,
               now: float) -> float:
        """Record ``amount`` (bytes, or requests) against the entry's quota of ``kind`` for this client; the
        throttle time in seconds it earns (0: within its quota, or no quota of that kind)."""
        bound = entry.bound(kind)
        if not bound:
            return 0.0
        key: RateKey = (entry.name, kind, None, None) if entry.shared else (entry.name, kind, principal, client_id)
        rate = self.rates.get(key)
        if rate is None:
            if len(self.rates) >= self._sweep_at:
                self._sweep(now)
            q = self.quotas
            rate = self.rates[key] = WindowedRate(_scaled(kind, bound), q.samples, q.window_s)
        rate.record(amount * _scale(kind), now)
        return min(rate.throttle_time(now), rate.samples * rate.window_s)

    def _sweep(self, now: float) -> None:
        """Forget the rates with nothing left in their window: an idle rate earns no credit
        (:mod:`proxy.core.rate`), so a new one is the same, and clients that come and go (a client.id per
        process, per job) do not pile up. Kafka expires its idle quota sensors likewise."""
        self.rates = {k: r for k, r in self.rates.items() if r.total(now)}
        self._sweep_at = max(_SWEEP_MIN, 2 * len(self.rates))

    def rates_now(self, now: float) -> dict[str, dict[str, float]]:
        """Per entry and kind, the highest rate measured now (bytes/s, requests/s): the admin API's status."""
        out: dict[str, dict[str, float]] = {}
        for (name, kind, _principal, _client), rate in self.rates.items():
            per = out.setdefault(name, {})
            per[kind] = max(per.get(kind, 0.0), rate.rate(now) / _scale(kind))
        return out


#: rates kept before idle ones are swept (then twice the number left)
_SWEEP_MIN = 1024
#: request rates are counted in thousandths, so that a fractional requests/s quota is an integer bound
_REQUEST_SCALE = 1000


def _scale(kind: Kind) -> int:
    return _REQUEST_SCALE if kind == "request" else 1


def _scaled(kind: Kind, bound: float) -> int:
    return round(bound * _scale(kind))
