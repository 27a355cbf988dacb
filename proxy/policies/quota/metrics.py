"""The client quotas' metrics, on the proxy's registry: per entry (and kind or API), what was counted and the throttle
applied; for a fleet, what this instance sees of it. No label names a client: an entry's series are bounded by
the entries configured, the APIs and the kinds (an entity's own rate is the admin API's ``GET /quotas`` status)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ...metrics import TallyCounter

if TYPE_CHECKING:
    from .book import QuotaBook

#: the APIs a quota meters, as the access log and sluice_requests_total name them
APIS = ("Produce", "Fetch", "ShareFetch", "ShareAcknowledge")


class QuotaMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        # counted on every request a quota governs: tallies (no lock), as the core's own per-request counts
        self.bytes = TallyCounter(
            "sluice_quota_bytes_total",
            "Bytes counted against a [[quota.entries]] entry's quota of a kind: produce = Produce request bytes, "
            "fetch = Fetch and ShareFetch response bytes.", ("entry", "kind"), r)
        self.requests = TallyCounter(
            "sluice_quota_requests_total",
            "Requests of the clients an entry governs (for any kind): Produce, consumers' Fetch, ShareFetch, "
            "ShareAcknowledge.", ("entry", "api"), r)
        self.throttle_seconds = Counter(
            "sluice_quota_throttle_seconds_total",
            "Throttle time Sluice applied to the clients an entry governs (throttle_time_ms sent, the connection "
            "not read for that long; KIP-219), summed over their requests.", ["entry", "api"], registry=r)
        self.throttled = Counter(
            "sluice_quota_throttled_total", "Responses (or acks=0 Produce requests) throttled by an entry.",
            ["entry", "api"], registry=r)
        self.fleet_fallbacks = Counter(
            "sluice_quota_fleet_fallbacks_total",
            "Times this instance lost the fleet's usage topic (its own reports not read back) and fell back to "
            "each fleet quota divided by the instances last seen live.", registry=r)
        self.fleet_reports_skipped = Counter(
            "sluice_quota_fleet_reports_skipped_total", "Usage topic records that are not a usage report this "
            "Sluice reads (skipped).", registry=r)
        self._fleet = _FleetCollector()
        r.register(self._fleet)

        #: the per-request children, by (counter, entry, label): ``labels()`` takes a lock and builds a key on every
        #: call (metrics.py); bounded by the entries configured and the APIs and kinds
        self._children: dict[tuple[Counter | TallyCounter, str, str], Any] = {}

    def _inc(self, counter: Counter | TallyCounter, entry: str, label: str, n: float) -> None:
        child = self._children.get((counter, entry, label))
        if child is None:
            child = self._children[(counter, entry, label)] = counter.labels(entry, label)
        child.inc(n)

    def count(self, entry: str, api: str) -> None:
        """One request of a client ``entry`` governs."""
        self._inc(self.requests, entry, api, 1)

    def count_bytes(self, entry: str, kind: str, n: int) -> None:
        """``n`` bytes counted against ``entry`` (``kind``: produce or fetch)."""
        self._inc(self.bytes, entry, kind, n)

    def throttle(self, entry: str, api: str, seconds: float) -> None:
        """A response (or acks=0 Produce) of ``entry``'s clients throttled for ``seconds``."""
        self._inc(self.throttle_seconds, entry, api, seconds)
        self._inc(self.throttled, entry, api, 1)

    def bind(self, book: QuotaBook, clock: Callable[[], float]) -> None:
        """Every configured entry's series, at 0 until it counts something (dashboards and alerts see them); the
        fleet gauges read ``book`` when scraped."""
        for entry in book.quotas.entries:
            for kind, bound in (("produce", entry.produce), ("fetch", entry.fetch)):
                if bound is not None:
                    self.bytes.labels(entry.name, kind)
            for api in APIS:
                self.requests.labels(entry.name, api)
                self.throttle_seconds.labels(entry.name, api)
                self.throttled.labels(entry.name, api)
        self._fleet.book, self._fleet.clock = book, clock


_REACHABLE_DOC = ("1 while this instance reads its own usage reports back from the fleet's usage topic (the shares "
                  "follow the fleet), 0 while not (the fallback).")
_LIVE_DOC = "Instances of the fleet this one heard from lately, itself included: what a fleet quota is shared by."


class _FleetCollector(Collector):
    """The fleet's gauges, read from the book when scraped (only while an entry is fleet-scoped)."""

    def __init__(self) -> None:
        self.book: QuotaBook | None = None
        self.clock: Callable[[], float] | None = None

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """What it exports while an entry is fleet-scoped (the metrics reference lists it: proxy/reference.py)."""
        yield GaugeMetricFamily("sluice_quota_fleet_usage_reachable", _REACHABLE_DOC)
        yield GaugeMetricFamily("sluice_quota_fleet_live_instances", _LIVE_DOC)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        book, clock = self.book, self.clock
        if book is None or clock is None or not book.quotas.fleet:
            return
        shares = book.fleet
        yield GaugeMetricFamily("sluice_quota_fleet_usage_reachable", _REACHABLE_DOC,
                                value=0 if shares.state == "unreachable" else 1)
        yield GaugeMetricFamily("sluice_quota_fleet_live_instances", _LIVE_DOC, value=shares.live(clock()))
