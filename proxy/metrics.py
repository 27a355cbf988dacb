"""Sluice's generic Prometheus metrics (connections, requests, bytes, latency, rejections...), in a registry of one
proxy's own; each policy brings its own metrics (``proxy/policies/<name>/metrics.py``), made on the same registry
by its registration's metrics factory.

Conventions (https://prometheus.io/docs/practices/naming/): prefix ``sluice_``, base units (bytes, seconds),
``_total`` on counters, and only low-cardinality labels (api, version, direction, side, reason) - never a
topic, partition, client id or address, which would grow without bound.

A :class:`Metrics` object holds its own ``CollectorRegistry``; the proxy makes one and hands it to the connection
core, the chain and every policy (whose own metrics are made on ``registry``), and the admin server serves that
registry on /metrics. Two proxies in one process (tests, benches) therefore keep separate counts; nothing here is
process-global.

Label children known up front are created with the collectors, so they are exported as 0 before the first event
(a rate() over a series that appears late misses its first increment, and dashboards show "no data" instead of
0). Hot paths use the pre-bound children (``metrics.bytes_client_to_proxy``, a :class:`Tally`;
``metrics.requests.observe``, :class:`RequestTallies`), because ``.labels(...)`` takes a lock and builds a key on
every call.
"""

from __future__ import annotations

import math
import platform
from functools import cache
from importlib import metadata
from itertools import accumulate
from pathlib import Path
from typing import Any, Final, Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Info, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

Direction = Literal["client_to_proxy", "proxy_to_upstream", "upstream_to_proxy", "proxy_to_client"]
Side = Literal["client", "upstream"]
#: why a frame or connection was refused; a value handed along by whoever refused it, never parsed from text.
#: "refused": a policy refused a request it has no response to refuse it in (Produce with acks=0: Kafka closes the
#: connection on a failed one, KafkaApis.handleProduceRequest)
RejectReason = Literal["too_large", "malformed", "unknown_api", "unsupported_version", "upstream_closed",
                       "request_timeout", "refused"]

DIRECTIONS: Final[tuple[Direction, ...]] = (
    "client_to_proxy",
    "proxy_to_upstream",
    "upstream_to_proxy",
    "proxy_to_client",
)
SIDES: Final[tuple[Side, ...]] = ("client", "upstream")
REJECT_REASONS: Final[tuple[RejectReason, ...]] = (
    "too_large",
    "malformed",
    "unknown_api",
    "unsupported_version",
    "upstream_closed",
    "request_timeout",
    "refused",
)
TOPIC_LOOKUP_OUTCOMES: Final[tuple[str, ...]] = ("resolved", "unknown", "failed")
#: why a client connection was closed before its first request was read (proxy/io/listeners.py)
REFUSE_REASONS: Final[tuple[str, ...]] = ("max_connections", "max_connections_per_address", "proxy_protocol",
                                          "tls_handshake")
#: why Sluice closed a client connection it had served (limits)
CLOSE_REASONS: Final[tuple[str, ...]] = ("idle",)
TLS_RELOAD_OUTCOMES: Final[tuple[str, ...]] = ("reloaded", "failed")
#: why an access-log event did not reach the Kafka sink's topic (proxy/accesslog_kafka.py)
ACCESS_LOG_DROP_REASONS: Final[tuple[str, ...]] = ("write_failed", "buffer_full", "delivery_failed", "stopped")

# 50 us (a relayed ApiVersions on loopback) .. 10 s (beyond any sane fetch.max.wait.ms); roughly 1-2.5-5 steps
# so a Fetch long poll (~0.5 s) and a sub-millisecond metadata call both land in a bucket of their own.
#: the request versions RequestTallies counts in a list per API (Kafka's newest is below 20): others in a dict
MAX_VERSION_INDEXED: Final = 31

LATENCY_BUCKETS: Final[tuple[float, ...]] = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0,
)

# Without this, every counter and histogram also exports a `<name>_created` gauge per label set (in the
# classic text format these are separate series): twice the series for a timestamp no dashboard here uses.
disable_created_metrics()


@cache
def sluice_version() -> str:
    """The installed distribution's version, or pyproject.toml's when running from a source checkout (read once:
    a lookup over every installed distribution, ~5 ms of a start)."""
    try:
        return metadata.version("kafka-sluice")
    except metadata.PackageNotFoundError:
        pass
    import tomllib  # only needed when running uninstalled, from the repository

    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    try:
        with pyproject.open("rb") as fh:
            return str(tomllib.load(fh)["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "0+unknown"


class Tally:
    """A counter child for the per-read and per-write paths (``inc`` as prometheus_client's; the connection core
    adds to ``value`` itself, a call less per read): a number added to in place, read by its :class:`TallyFamily`
    at scrape time. No lock and no checks, a fraction of a Counter's
    ``inc``: a proxy's counters are only ever touched on its event loop (the admin server scrapes on it too; a
    scrape from another thread reads a float, which the GIL keeps whole)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class TallyFamily(Collector):
    """A counter with one label whose values are known up front (each a :class:`Tally`, exported from the start)."""

    def __init__(self, name: str, documentation: str, label: str, values: tuple[str, ...]) -> None:
        self.name, self.documentation, self.label = name, documentation, label
        self.tallies = {value: Tally() for value in values}

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(self.name, self.documentation, labels=[self.label])

    def describe(self) -> list[Metric]:
        return [self._family()]

    def collect(self) -> list[Metric]:
        family = self._family()
        for value, tally in self.tallies.items():
            family.add_metric([value], tally.value)
        return [family]


class TallyCounter(Collector):
    """A counter whose label sets come as they are counted (:meth:`labels`, as prometheus_client's Counter's), each
    a :class:`Tally`: for counts a policy makes per request (bounded, as a Counter's, by what its configuration
    names), exported at scrape time with the same name, labels and values a Counter would give."""

    def __init__(self, name: str, documentation: str, labelnames: tuple[str, ...],
                 registry: CollectorRegistry) -> None:
        # _labelnames: prometheus_client's attribute, which the metrics reference reads (proxy/reference.py)
        self.name, self.documentation, self._labelnames = name, documentation, labelnames
        self.children: dict[tuple[str, ...], Tally] = {}
        registry.register(self)

    def labels(self, *values: str) -> Tally:
        child = self.children.get(values)
        if child is None:
            child = self.children[values] = Tally()
        return child

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(self.name, self.documentation, labels=list(self._labelnames))

    def describe(self) -> list[Metric]:
        return [self._family()]

    def collect(self) -> list[Metric]:
        family = self._family()
        for values, tally in self.children.items():
            family.add_metric(list(values), tally.value)
        return [family]


class RequestTallies(Collector):
    """``sluice_requests_total{api,version}`` and the ``{api}`` latency histogram, kept as plain numbers (one dict
    look-up, a few steps up the bucket bounds and three additions per request: no lock, as :class:`Tally`) and
    exported at scrape time in the form prometheus_client's Counter and Histogram give them (the same names, labels
    and bucket bounds).
    Bounded by the (api, version) pairs Kafka defines: callers pass the API *name* from the protocol table, never a
    raw client-supplied string."""

    def __init__(self, counter: str, counter_doc: str, histogram: str, histogram_doc: str,
                 buckets: tuple[float, ...]) -> None:
        self.counter, self.counter_doc = counter, counter_doc
        self.histogram, self.histogram_doc = histogram, histogram_doc
        self.bounds = buckets
        #: the bounds, then +Inf (observe's last step: every latency is below it)
        self._steps = [*buckets, math.inf]
        self._les = [floatToGoString(b) for b in buckets] + ["+Inf"]
        #: per API: [requests per version (index = version, 0..MAX_VERSION_INDEXED), observations per bucket (not
        #: cumulative; the last one +Inf), their sum]: one look-up by the API's name, then list items
        self.latency: dict[str, list[Any]] = {}
        #: requests of versions outside the per-API lists (negative, or beyond any Kafka defines): (api, version)
        self.other_versions: dict[tuple[str, int], int] = {}

    def observe(self, api: str, version: int, seconds: float) -> None:
        tally = self.latency.get(api)
        if tally is None:
            tally = self.latency[api] = [[0] * (MAX_VERSION_INDEXED + 1), [0] * (len(self.bounds) + 1), 0.0]
        if 0 <= version <= MAX_VERSION_INDEXED:
            tally[0][version] += 1
        else:
            self.other_versions[(api, version)] = self.other_versions.get((api, version), 0) + 1
        # the first bound >= seconds (Prometheus' le), found by stepping up from the lowest: a request's latency is
        # nearly always within the first few bounds, and these steps run in the interpreter's own loop, where
        # bisect's C function is cache lines more to fetch on every request (bench.instructions --cold)
        bounds, i = self._steps, 0
        while bounds[i] < seconds:
            i += 1
        tally[1][i] += 1
        tally[2] += seconds

    def _families(self) -> tuple[CounterMetricFamily, HistogramMetricFamily]:
        return (CounterMetricFamily(self.counter, self.counter_doc, labels=["api", "version"]),
                HistogramMetricFamily(self.histogram, self.histogram_doc, labels=["api"]))

    def describe(self) -> list[Metric]:
        return list(self._families())

    def collect(self) -> list[Metric]:
        counter, histogram = self._families()
        # Copied first: list(dict.items()) and a list slice are single C calls, so a scrape from another thread
        # (an embedding process, or the tests' rig/proxy_thread.py reading a live proxy) sees a whole snapshot
        # instead of failing "dictionary changed size during iteration" when the loop meets a new API mid-scrape.
        for api, (versions, buckets, total) in list(self.latency.items()):
            for version, n in enumerate(versions[:]):
                if n:
                    counter.add_metric([api, str(version)], n)
            cumulative = list(accumulate(buckets[:]))
            histogram.add_metric([api], list(zip(self._les, cumulative, strict=True)), sum_value=total)
        for (api, version), n in list(self.other_versions.items()):
            counter.add_metric([api, str(version)], n)
        return [counter, histogram]


class Metrics:
    """One proxy's collectors, in ``self.registry``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self._requests_and_bytes(self.registry)
        self._connections(self.registry)
        self._security_and_limits(self.registry)
        self._memory_access_log_and_build(self.registry)
        self._rewritten_for: dict[str, Any] = {}

    def _requests_and_bytes(self, r: CollectorRegistry) -> None:
        # ------------------------------------------------------------------------------------- requests
        # Counted and observed once per request: plain numbers, exported at scrape time (RequestTallies)
        self.requests = RequestTallies(
            "sluice_requests", "Requests relayed from clients, by Kafka API name and request version.",
            "sluice_request_latency_seconds",
            "Time from a request's last byte read from the client to its response handed to the client.",
            LATENCY_BUCKETS)
        r.register(self.requests)
        self.responses_rewritten = Counter(
            "sluice_responses_rewritten_total",
            "Responses the proxy re-encoded (address rewriting, policies) instead of relaying the upstream bytes.",
            ["api"], registry=r)
        self.api_withheld = Counter(
            "sluice_api_withheld_total",
            "APIs left out of ApiVersions responses to clients (no version both Sluice and the broker speak), by API.",
            ["api"], registry=r)
        self.policy_errors = Counter(
            "sluice_policy_errors_total",
            "Exceptions raised inside a policy (each closed its client connection only), by policy and Kafka API.",
            ["policy", "api"], registry=r)
        self.frames_rejected = Counter("sluice_frames_rejected_total",
                                       "Frames the proxy refused or could not deliver, by reason.",
                                       ["reason"], registry=r)

        # ---------------------------------------------------------------------------------------- bytes
        # Counted on every read and write: plain ints, exported at scrape time (Tally)
        self.bytes = TallyFamily("sluice_bytes", "Bytes moved, including the 4-byte frame length, by direction.",
                                 "direction", DIRECTIONS)
        r.register(self.bytes)
        for reason in REJECT_REASONS:
            self.frames_rejected.labels(reason)
        self.bytes_client_to_proxy = self.bytes.tallies["client_to_proxy"]
        self.bytes_proxy_to_upstream = self.bytes.tallies["proxy_to_upstream"]
        self.bytes_upstream_to_proxy = self.bytes.tallies["upstream_to_proxy"]
        self.bytes_proxy_to_client = self.bytes.tallies["proxy_to_client"]

    def _connections(self, r: CollectorRegistry) -> None:
        # ---------------------------------------------------------------------------------- connections
        self.connections_open = Gauge(
            "sluice_connections_open",
            "Connections currently open: client = accepted from clients, upstream = to brokers.",
            ["side"], registry=r)
        self.connections = Counter(
            "sluice_connections_total",
            "Connections opened since start: client = accepted from clients, upstream = to brokers.",
            ["side"], registry=r)
        self.upstream_connect_errors = Counter(
            "sluice_upstream_connect_errors_total",
            "Failed attempts to connect to an upstream broker (refused, unreachable, timeout).", registry=r)
        self.listeners = Gauge(
            "sluice_listeners",
            "Client-facing listeners open: the bootstrap listener plus one per upstream broker node.", registry=r)
        self.topic_lookups = Counter(
            "sluice_topic_name_lookups_total",
            "Topic ids Sluice looked up itself (a Metadata request of its own, for connections that never send "
            "one, e.g. replica fetchers), by outcome: resolved, unknown (no such topic), failed (no answer).",
            ["outcome"], registry=r)
        for side in SIDES:
            self.connections_open.labels(side)
            self.connections.labels(side)
        for outcome in TOPIC_LOOKUP_OUTCOMES:
            self.topic_lookups.labels(outcome)
        self.client_connections_open = self.connections_open.labels("client")
        self.upstream_connections_open = self.connections_open.labels("upstream")
        self.client_connections = self.connections.labels("client")
        self.upstream_connections = self.connections.labels("upstream")

    def _security_and_limits(self, r: CollectorRegistry) -> None:
        # ------------------------------------------------------------------------------- security, limits
        self.connections_refused = Counter(
            "sluice_connections_refused_total",
            "Client connections closed before their first request: max_connections / max_connections_per_address "
            "(limits, at accept, as Kafka's max.connections / max.connections.per.ip), proxy_protocol (no valid "
            "PROXY header where the listener requires one), tls_handshake (the client's TLS handshake failed).",
            ["reason"], registry=r)
        self.connections_closed = Counter(
            "sluice_connections_closed_total",
            "Client connections Sluice closed because of a limit: idle (limits.idle_timeout_s, Kafka's "
            "connections.max.idle.ms).", ["reason"], registry=r)
        self.inflight_limited = Counter(
            "sluice_inflight_limited_total",
            "Times a client connection reached limits.max_inflight_requests and was not read until a response "
            "went out (Kafka's channel muting).", registry=r)
        self.tls_reloads = Counter(
            "sluice_tls_reloads_total",
            "Certificate reloads (a file changed, or SIGHUP), by outcome: reloaded (new connections use the new "
            "files), failed (the files in use stay).", ["outcome"], registry=r)
        self.sasl_authentications = Counter(
            "sluice_sasl_authentications_total",
            "SASL authentications relayed that the broker accepted and whose principal Sluice read (first and "
            "KIP-368 re-authentications).", registry=r)
        for refused in REFUSE_REASONS:
            self.connections_refused.labels(refused)
        for closed in CLOSE_REASONS:
            self.connections_closed.labels(closed)
        for outcome in TLS_RELOAD_OUTCOMES:
            self.tls_reloads.labels(outcome)

    def _memory_access_log_and_build(self, r: CollectorRegistry) -> None:
        # ----------------------------------------------- response memory (proxy/core/memory.py, HeldBytes)
        # The proxy-wide bound is set by the policies' sections (each registration's memory_bound).
        self.response_bytes_held = Gauge(
            "sluice_response_bytes_held",
            "Bytes of responses reserved or held in Sluice, counted against the proxy's response memory bound.",
            registry=r)
        self.response_memory_waits = Counter(
            "sluice_response_memory_waits_total",
            "Requests that waited for response memory (the proxy's bound) before going upstream.",
            registry=r)

        # ------------------------------------------------------------------- access log (file and Kafka)
        self.access_log_dropped = Counter(
            "sluice_access_log_dropped_total",
            "Access-log events lost, by reason: write_failed (the file or stdout refused the line), and for the "
            "Kafka sink ([logging.access_log_kafka]) buffer_full (its "
            "bounded buffer was full: the cluster slow or down; the proxy never waits for it), delivery_failed "
            "(the cluster did not take it within delivery_timeout_s, or refused it), stopped (still buffered when "
            "the flush at shutdown ran out of time).", ["reason"], registry=r)
        self.access_log_buffered = Gauge(
            "sluice_access_log_buffered_events",
            "Access-log events in the Kafka sink's buffer, not yet acknowledged by the cluster.", registry=r)
        for drop in ACCESS_LOG_DROP_REASONS:
            self.access_log_dropped.labels(drop)

        # ---------------------------------------------------------------------------------------- build
        self.build_info = Info("sluice_build", "Sluice build information; the value is always 1.", registry=r)
        self.build_info.info({"version": sluice_version(), "python": platform.python_version()})

    # ------------------------------------------------------------------------------------- helpers

    def rewritten(self, api: str) -> None:
        """Count a response re-encoded (the child cached per API name, from the protocol table)."""
        counter = self._rewritten_for.get(api)
        if counter is None:
            counter = self._rewritten_for[api] = self.responses_rewritten.labels(api)
        counter.inc()

    def exposition(self) -> bytes:
        """The registry in Prometheus' text format (what /metrics serves)."""
        return generate_latest(self.registry)

    def total(self, name: str, **labels: str) -> float:
        """The sum of every sample named ``name`` whose labels include ``labels`` (0 if none): e.g.
        ``total("sluice_requests_total", api="Fetch")`` adds up all Fetch versions. For tests and benches;
        Prometheus does this with ``sum(...)``."""
        return sum(
            float(s.value)
            for m in self.registry.collect()
            for s in m.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        )
