"""The client quotas' metrics, on the proxy's registry: per entry, what was counted and the throttle applied."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter


class QuotaMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.bytes = Counter(
            "sluice_quota_bytes_total",
            "Bytes counted against a [[quota.entries]] entry: produce = Produce request bytes, fetch = Fetch "
            "response bytes.", ["entry", "kind"], registry=r)
        self.requests = Counter(
            "sluice_quota_requests_total", "Produce and Fetch requests of the clients an entry selects.",
            ["entry", "api"], registry=r)
        self.throttle_seconds = Counter(
            "sluice_quota_throttle_seconds_total",
            "Throttle time Sluice applied to the clients an entry selects (throttle_time_ms sent, the connection "
            "not read for that long; KIP-219), summed over their requests.", ["entry", "api"], registry=r)
        self.throttled = Counter(
            "sluice_quota_throttled_total", "Responses (or acks=0 Produce requests) throttled by an entry.",
            ["entry", "api"], registry=r)

        #: the per-request children, by (counter, entry, label): ``labels()`` takes a lock and builds a key on every
        #: call (metrics.py); bounded by the entries configured and the two APIs and kinds
        self._children: dict[tuple[Counter, str, str], Any] = {}

    def _inc(self, counter: Counter, entry: str, label: str, n: float) -> None:
        child = self._children.get((counter, entry, label))
        if child is None:
            child = self._children[(counter, entry, label)] = counter.labels(entry, label)
        child.inc(n)

    def count(self, entry: str, api: str) -> None:
        """One Produce or Fetch request of ``entry``'s clients."""
        self._inc(self.requests, entry, api, 1)

    def count_bytes(self, entry: str, kind: str, n: int) -> None:
        """``n`` bytes counted against ``entry`` (``kind``: produce or fetch)."""
        self._inc(self.bytes, entry, kind, n)

    def throttle(self, entry: str, api: str, seconds: float) -> None:
        """A response (or acks=0 Produce) of ``entry``'s clients throttled for ``seconds``."""
        self._inc(self.throttle_seconds, entry, api, seconds)
        self._inc(self.throttled, entry, api, 1)

    def show(self, entries: Iterable[Any]) -> None:
        """Every configured entry's series, at 0 until it counts something (dashboards and alerts see them)."""
        for entry in entries:
            for kind in ("produce", "fetch"):
                self.bytes.labels(entry.name, kind)
            for api in ("Produce", "Fetch"):
                self.requests.labels(entry.name, api)
                self.throttle_seconds.labels(entry.name, api)
                self.throttled.labels(entry.name, api)
