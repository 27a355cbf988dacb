"""One quota for a whole fleet, sans-IO: each instance's share of a fleet-scoped quota, from the usage every
instance publishes (the publishing and reading are proxy/fleet/usage.py's, over a Kafka topic; no other server).

Every ``interval_s`` each instance publishes a usage report: per fleet-scoped rate it counted in the interval just
ended, its rate (bytes/s or requests/s) and whether it throttled a client on it in the interval's second half (it
wants more than its share: a client that stopped early in the interval wants nothing more).
From the latest report of every live instance (one heard from within :data:`SILENT_INTERVALS` intervals; this one
always counts) each instance computes its share of each quota by max-min fairness (water-filling):

- an instance that throttled nobody wants what it used plus :data:`GROWTH` (room to grow), at least the floor
  (:data:`FLOOR` of an equal share: a client arriving at an idle instance is served at once);
- the instances that throttled split what the others leave, equally;
- what nobody wants is spread equally over all, so the shares add up to the quota.

A share follows a change in demand within one or two intervals: a client that moves between instances, an
instance killed (silent after :data:`SILENT_INTERVALS` intervals: its share goes to the others). An instance that
starts throttling a client counts itself among those that want more at once (its share grows then; the others'
shrink at its next report). Until this
instance has read its own report back (the usage topic works both ways) it takes an equal share of the instances it
knows; when its reports stop coming back for :data:`SILENT_INTERVALS` intervals (the usage topic unreachable) it
falls back to the quota divided by the instances it last knew live, and says so (:meth:`FleetShares.tick`).

A report: JSON ``{"schema": 1, "instance", "interval_s", "usage": [[entry, kind, principal, client_id, address,
rate, throttled], ...]}``, at most :data:`MAX_KEYS` rates (the busiest), keyed by the instance id.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["FLOOR", "GROWTH", "FleetShares", "water_fill"]

SCHEMA = 1
#: an idle instance keeps this share of an equal split (so a new client is served at once)
FLOOR = 0.1
#: an instance that throttled nobody is given this much more than it used, to grow into
GROWTH = 0.25
#: an instance not heard from for this many intervals is not live (its share goes to the others)
SILENT_INTERVALS = 3
#: rates in one report at most (the busiest)
MAX_KEYS = 1000

State = Literal["starting", "reachable", "unreachable"]
#: (entry name, kind, principal, client.id, address): book.py's RateKey
Key = tuple[Any, ...]


def water_fill(total: float, wants: list[float]) -> list[float]:
    """Max-min fair shares of ``total``: each gets its want or an equal part of what is left, whichever is less;
    what nobody wants is spread equally, so the shares add up to ``total``."""
    n = len(wants)
    shares = [0.0] * n
    left, remaining = n, total
    for i in sorted(range(n), key=lambda i: wants[i]):
        give = min(wants[i], remaining / left)
        shares[i] = give
        remaining -= give
        left -= 1
    if remaining > 0 and n:
        shares = [s + remaining / n for s in shares]
    return shares


@dataclass(slots=True)
class _Report:
    received: float
    usage: dict[Key, tuple[float, bool]]


@dataclass(slots=True)
class _Interval:
    amount: float = 0.0
    throttled: bool = False
    #: when a client was last throttled on the key in this interval
    throttled_at: float = -math.inf


@dataclass
class FleetShares:
    """This instance's view of the fleet's usage (see the module docstring); times are this process's clock."""

    interval_s: float = 1.0
    #: this instance's id in the reports (proxy/fleet/usage.py sets it)
    me: str = ""
    state: State = "starting"
    #: live instances (this one included) when the usage topic last answered: the fallback's divisor
    known_live: int = 1
    _reports: dict[str, _Report] = field(default_factory=dict)
    _current: dict[Key, _Interval] = field(default_factory=dict)
    #: this instance's usage in the last interval closed: (rate, throttled) per key
    _mine: dict[Key, tuple[float, bool]] = field(default_factory=dict)
    _closed_at: float | None = None
    _own_seen: float | None = None
    _started: float | None = None
    _ticked: float = -math.inf

    # ------------------------------------------------------------------------------ this instance's usage

    def used(self, key: Key, amount: float, throttled: bool, now: float) -> bool:
        """Count this instance's use of ``key``; True when it is the first throttle of ``key`` this interval (its
        share is recomputed at once, book.py)."""
        interval = self._current.get(key)
        if interval is None:
            interval = self._current[key] = _Interval()
        interval.amount += amount
        newly = throttled and not interval.throttled
        if throttled:
            interval.throttled, interval.throttled_at = True, now
        return newly

    def keys(self) -> Iterable[Key]:
        return list(self._current)

    def forget(self, keys: Collection[Key]) -> None:
        for key in keys:
            self._current.pop(key, None)
            self._mine.pop(key, None)

    def report(self, now: float) -> bytes | None:
        """Close the interval: this instance's report of it (None before it has an id)."""
        elapsed = max(self.interval_s, now - self._closed_at) if self._closed_at is not None else self.interval_s
        self._closed_at = now
        recent = now - elapsed / 2
        self._mine = {k: (i.amount / elapsed, i.throttled_at >= recent) for k, i in self._current.items() if i.amount}
        self._current = {k: _Interval() for k, i in self._current.items() if i.amount}  # idle keys dropped
        if not self.me:
            return None
        busiest = sorted(self._mine.items(), key=lambda kv: -kv[1][0])[:MAX_KEYS]
        usage = [[*key, rate, throttled] for key, (rate, throttled) in busiest]
        return json.dumps({"schema": SCHEMA, "instance": self.me, "interval_s": self.interval_s, "usage": usage},
                          separators=(",", ":")).encode()

    # ------------------------------------------------------------------------------ the fleet's reports

    def offer(self, instance: str, value: bytes | None, now: float) -> bool:
        """A report read from the usage topic (this instance's own too); False if it is not one (skipped)."""
        try:
            data = json.loads(value or b"")
            if not isinstance(data, dict) or data.get("schema") != SCHEMA or data.get("instance") != instance:
                return False
            usage = {tuple(u[:5]): (float(u[5]), bool(u[6])) for u in data["usage"]}
        except (ValueError, TypeError, KeyError, IndexError):
            return False
        if instance == self.me:
            self._own_seen = now
            return True
        self._reports[instance] = _Report(now, usage)
        return True

    def live(self, now: float) -> int:
        """Instances heard from lately, this one included."""
        silent = SILENT_INTERVALS * self.interval_s
        return 1 + sum(1 for r in self._reports.values() if now - r.received <= silent)

    def tick(self, now: float) -> State | None:
        """Judge the usage topic's reachability now; the new state when it changed."""
        silent = SILENT_INTERVALS * self.interval_s
        if self._started is None or now - self._ticked > silent:  # the first, or again after a pause (no fleet
            self._started, self._own_seen = now, None               # quota for a while): starting over
            self.state = "starting"
        self._ticked = now
        seen = self._own_seen
        if seen is not None and now - seen <= silent:
            state: State = "reachable"
            self.known_live = self.live(now)
        elif now - (seen if seen is not None else self._started) > silent:
            state = "unreachable"
        else:
            state = self.state
        self._reports = {i: r for i, r in self._reports.items() if now - r.received <= 10 * silent}  # bounded
        if state == self.state:
            return None
        self.state = state
        return state

    def share(self, key: Key, quota: float, now: float) -> float:
        """This instance's share of ``quota`` for the rate ``key`` now."""
        if self.state == "unreachable":
            return quota / max(1, self.known_live)
        silent = SILENT_INTERVALS * self.interval_s
        # this instance as the others see it, but wanting more as soon as it throttles (the others follow at its next
        # report): a client that came to an idle instance gets an equal share at once, not the floor's for an
        # interval (the fleet's total may exceed the quota by that much for an interval, rather than fall short)
        rate, throttled = self._mine.get(key, (0.0, False))
        current = self._current.get(key)
        usages = [(rate, throttled or (current is not None and current.throttled))]
        usages += [r.usage.get(key, (0.0, False)) for r in self._reports.values() if now - r.received <= silent]
        floor = FLOOR * quota / len(usages)
        wants = [math.inf if throttled else max(floor, rate * (1 + GROWTH)) for rate, throttled in usages]
        return water_fill(quota, wants)[0]
