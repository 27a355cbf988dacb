"""Every Prometheus metric Sluice exports, named in this one place.

Conventions (https://prometheus.io/docs/practices/naming/): prefix ``sluice_``, base units (bytes, seconds),
``_total`` on counters, and only low-cardinality labels (api, version, direction, side, reason) - never a
topic, partition, client id or address, which would grow without bound.

All collectors live in prometheus_client's default ``REGISTRY``, which ``proxy.admin`` serves on /metrics.
Label children known up front are created at import so they are exported as 0 before the first event (a rate()
over a series that appears late misses its first increment, and dashboards show "no data" instead of 0).

Hot paths should use the pre-bound children (``BYTES_CLIENT_TO_PROXY.inc(n)``) or :func:`requests_for`,
because ``.labels(...)`` takes a lock and builds a key on every call.
"""

from __future__ import annotations

import functools
import platform
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any, Final, Literal

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, Info, disable_created_metrics

__all__ = [
    "BUILD_INFO",
    "BYTES",
    "BYTES_CLIENT_TO_PROXY",
    "BYTES_PROXY_TO_CLIENT",
    "BYTES_PROXY_TO_UPSTREAM",
    "BYTES_UPSTREAM_TO_PROXY",
    "CLIENT_CONNECTIONS",
    "CLIENT_CONNECTIONS_OPEN",
    "CONNECTIONS",
    "CONNECTIONS_OPEN",
    "DIRECTIONS",
    "FRAMES_REJECTED",
    "LISTENERS",
    "REJECT_REASONS",
    "REQUESTS",
    "REQUEST_LATENCY",
    "RESPONSES_REWRITTEN",
    "SIDES",
    "UPSTREAM_CONNECTIONS",
    "UPSTREAM_CONNECTIONS_OPEN",
    "UPSTREAM_CONNECT_ERRORS",
    "latency_for",
    "observe_request",
    "requests_for",
    "sluice_version",
]

Direction = Literal["client_to_proxy", "proxy_to_upstream", "upstream_to_proxy", "proxy_to_client"]
Side = Literal["client", "upstream"]
RejectReason = Literal["too_large", "malformed", "unknown_api", "unsupported_version", "upstream_closed"]

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
)

# 50 us (a relayed ApiVersions on loopback) .. 10 s (beyond any sane fetch.max.wait.ms); roughly 1-2.5-5 steps
# so a Fetch long poll (~0.5 s) and a sub-millisecond metadata call both land in a bucket of their own.
LATENCY_BUCKETS: Final[tuple[float, ...]] = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


def sluice_version() -> str:
    """The installed distribution's version, or pyproject.toml's when running from a source checkout."""
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


# Without this, every counter and histogram also exports a `<name>_created` gauge per label set (in the
# classic text format these are separate series): twice the series for a timestamp no dashboard here uses.
disable_created_metrics()

# ---------------------------------------------------------------------------------------------- requests

REQUESTS = Counter(
    "sluice_requests_total",
    "Requests relayed from clients, by Kafka API name and request version.",
    ["api", "version"],
)
REQUEST_LATENCY = Histogram(
    "sluice_request_latency_seconds",
    "Time from a request's last byte read from the client to its response's first byte queued to the client.",
    ["api"],
    buckets=LATENCY_BUCKETS,
)
RESPONSES_REWRITTEN = Counter(
    "sluice_responses_rewritten_total",
    "Responses the proxy re-encoded (address rewriting, policies) instead of relaying the upstream bytes.",
    ["api"],
)
FRAMES_REJECTED = Counter(
    "sluice_frames_rejected_total",
    "Frames the proxy refused or could not deliver, by reason.",
    ["reason"],
)

# ------------------------------------------------------------------------------------------------- bytes

BYTES = Counter(
    "sluice_bytes_total",
    "Bytes moved, including the 4-byte frame length, by direction.",
    ["direction"],
)

# ------------------------------------------------------------------------------------------- connections

CONNECTIONS_OPEN = Gauge(
    "sluice_connections_open",
    "Connections currently open: client = accepted from clients, upstream = to brokers.",
    ["side"],
)
CONNECTIONS = Counter(
    "sluice_connections_total",
    "Connections opened since start: client = accepted from clients, upstream = to brokers.",
    ["side"],
)
UPSTREAM_CONNECT_ERRORS = Counter(
    "sluice_upstream_connect_errors_total",
    "Failed attempts to connect to an upstream broker (refused, unreachable, timeout).",
)
LISTENERS = Gauge(
    "sluice_listeners",
    "Client-facing listeners open: the bootstrap listener plus one per upstream broker node.",
)

# ------------------------------------------------------------------------------------------------- build

BUILD_INFO = Info("sluice_build", "Sluice build information; the value is always 1.")
BUILD_INFO.info({"version": sluice_version(), "python": platform.python_version()})

# ----------------------------------------------------------------------------- response-size limiting (KIP-74)

SIZE_LIMIT_TRIMMED = Counter(
    "sluice_size_limit_trimmed_bytes_total",
    "Record bytes left out of fetch responses to keep them within their budget (cut at batch boundaries).",
)
SIZE_LIMIT_DEFERRED = Counter(
    "sluice_size_limit_deferred_partitions_total",
    "Partitions whose records were all left out of a response (kept, error 0, real offsets, empty records).",
)
SIZE_LIMIT_LIMITED = Counter(
    "sluice_size_limit_limited_responses_total",
    "Fetch responses the budget changed.",
)
RESPONSE_BYTES_HELD = Gauge(
    "sluice_response_bytes_held",
    "Bytes of fetch responses reserved or held in Sluice, counted against size_limit.global_max_bytes.",
)
SIZE_LIMIT_WAITS = Counter(
    "sluice_size_limit_waits_total",
    "Fetches that waited for response memory (size_limit.global_max_bytes) before going upstream.",
)


def observe_size_limit(trimmed_bytes: int, deferred_partitions: int) -> None:
    """Count what a budget did to one response."""
    if trimmed_bytes:
        SIZE_LIMIT_LIMITED.inc()
        SIZE_LIMIT_TRIMMED.inc(trimmed_bytes)
    if deferred_partitions:
        SIZE_LIMIT_DEFERRED.inc(deferred_partitions)


# ------------------------------------------------------------------------- replication throttles (KIP-73)

THROTTLE_SIDES: Final[tuple[str, ...]] = ("leader", "follower")

THROTTLE_BYTE_RATE = Gauge(
    "sluice_throttle_byte_rate",
    "Bytes/s of throttled partitions over the quota window (Kafka's LeaderReplication/FollowerReplication "
    "byte-rate): leader = sent to fetchers, follower = fetched upstream.",
    ["side"],
)
THROTTLE_RATE_LIMIT = Gauge(
    "sluice_throttle_rate_limit_bytes",
    "Configured throttle in bytes/s (throttle.leader_rate_bytes / follower_rate_bytes); 0 = none.",
    ["side"],
)
THROTTLE_WINDOW = Gauge(
    "sluice_throttle_window_seconds",
    "Quota window: samples x window_s (Kafka: 11 x 1 s).",
)
THROTTLE_TOPICS = Gauge(
    "sluice_throttle_topics",
    "Throttled-replicas entries ([[throttle.topics]]: topic names and globs).",
)
THROTTLE_LEFT_OUT = Counter(
    "sluice_throttle_left_out_partitions_total",
    "Throttled partitions left out: leader = records left out of a response (partition kept, empty records), "
    "follower = partitions left out of a request sent upstream.",
    ["side"],
)
THROTTLE_SUM_LAG = Gauge(
    "sluice_throttle_sum_lag_offsets",
    "Sum over throttled partitions and fetchers of high watermark - fetch offset (KIP-73's SumReplicaLag): "
    "if it stops falling, the throttle is too low for the move to finish.",
)


def bind_throttle(state: Any, throttles: Any, clock: Callable[[], float]) -> None:
    """Point the throttle gauges at a proxy's quotas (proxy.policies.throttle.ThrottleState) and configuration.
    Called again on every reconfiguration (and by the last Proxy created in a process, e.g. in tests)."""
    THROTTLE_BYTE_RATE.labels("leader").set_function(lambda: state.leader.rate(clock()))
    THROTTLE_BYTE_RATE.labels("follower").set_function(lambda: state.follower.rate(clock()))
    THROTTLE_SUM_LAG.set_function(lambda: state.sum_lag(clock()))
    THROTTLE_RATE_LIMIT.labels("leader").set(throttles.leader_rate)
    THROTTLE_RATE_LIMIT.labels("follower").set(throttles.follower_rate)
    THROTTLE_WINDOW.set(throttles.samples * throttles.window_s)
    THROTTLE_TOPICS.set(len(throttles.topics))


# ------------------------------------------------------------------------- fetch sessions (KIP-227)

FETCH_SESSIONS_OPEN = Gauge(
    "sluice_fetch_sessions_open",
    "Fetch sessions Sluice holds: upstream = its own sessions with brokers ([sessions] mode = terminate), "
    "downstream = sessions it serves to clients.",
    ["side"],
)
FETCH_SESSION_PARTITIONS_CACHED = Gauge(
    "sluice_fetch_session_partitions_cached",
    "Partitions in fetch sessions: upstream = partitions whose last known state Sluice keeps for its own "
    "sessions, downstream = partitions of the sessions it serves (Kafka's NumIncrementalFetchPartitionsCached).",
    ["side"],
)
UPSTREAM_FETCH_REQUESTS = Counter(
    "sluice_upstream_fetch_requests_total",
    "Fetch requests Sluice sent upstream in its own sessions, by kind: full (every partition) or incremental "
    "(only added/changed partitions).",
    ["kind"],
)
UPSTREAM_FETCH_BYTES = Counter(
    "sluice_upstream_fetch_bytes_total",
    "Bytes of the Fetch requests Sluice sent upstream in [sessions] terminate mode and of their responses "
    "(size prefix included), by direction: request or response.",
    ["direction"],
)
UPSTREAM_FETCH_BYTES_SAVED = Counter(
    "sluice_upstream_fetch_bytes_saved_total",
    "Bytes saved on the upstream link by Sluice's fetch sessions, by direction: the client's request minus the "
    "request sent upstream instead, and the response sent to the client minus the upstream response (for a "
    "session-less client: the saving against the full fetch it asked for).",
    ["direction"],
)
FETCH_SESSION_RETRIES = Counter(
    "sluice_fetch_session_retries_total",
    "Upstream session responses that could not be used (session error 70/71/106, invalid or throttled empty "
    "response): the session restarts with a full request, sent at once when possible, else the client gets a "
    "retriable answer.",
)
DOWNSTREAM_FETCH_REQUESTS = Counter(
    "sluice_downstream_fetch_requests_total",
    "Fetch requests of clients that use fetch sessions, answered by Sluice's own sessions ([sessions] mode = "
    "terminate), by kind: full (creates a session), incremental, sessionless (epoch -1: closes a session or "
    "none) or error (a session error sent to the client).",
    ["kind"],
)
FETCH_SESSION_ERRORS = Counter(
    "sluice_fetch_session_errors_total",
    "Session errors Sluice sent to its clients, by Kafka error name (FETCH_SESSION_ID_NOT_FOUND, "
    "INVALID_FETCH_SESSION_EPOCH, FETCH_SESSION_TOPIC_ID_ERROR).",
    ["error"],
)
FETCH_SESSION_EVICTIONS = Counter(
    "sluice_fetch_session_evictions_total",
    "Client fetch sessions evicted from Sluice's session cache to make room for a new one "
    "(Kafka's IncrementalFetchSessionEvictionsPerSec).",
)

SESSION_ERROR_NAMES = {70: "FETCH_SESSION_ID_NOT_FOUND", 71: "INVALID_FETCH_SESSION_EPOCH",
                       106: "FETCH_SESSION_TOPIC_ID_ERROR"}


def bind_session_cache(sessions_open: Callable[[], float], partitions_cached: Callable[[], float]) -> None:
    """Report the downstream session cache of the running proxy (the last one bound, as with throttles)."""
    FETCH_SESSIONS_OPEN.labels("downstream").set_function(sessions_open)
    FETCH_SESSION_PARTITIONS_CACHED.labels("downstream").set_function(partitions_cached)


# ------------------------------------------------------------------------- pre-created and pre-bound children

for _direction in DIRECTIONS:
    BYTES.labels(_direction)
for _side in SIDES:
    CONNECTIONS_OPEN.labels(_side)
    CONNECTIONS.labels(_side)
for _reason in REJECT_REASONS:
    FRAMES_REJECTED.labels(_reason)
for _tside in THROTTLE_SIDES:
    THROTTLE_LEFT_OUT.labels(_tside)
for _sside in ("downstream", "upstream"):
    FETCH_SESSIONS_OPEN.labels(_sside)
    FETCH_SESSION_PARTITIONS_CACHED.labels(_sside)
for _kind in ("full", "incremental"):
    UPSTREAM_FETCH_REQUESTS.labels(_kind)
for _kind in ("full", "incremental", "sessionless", "error"):
    DOWNSTREAM_FETCH_REQUESTS.labels(_kind)
for _rr in ("request", "response"):
    UPSTREAM_FETCH_BYTES.labels(_rr)
    UPSTREAM_FETCH_BYTES_SAVED.labels(_rr)
for _error in SESSION_ERROR_NAMES.values():
    FETCH_SESSION_ERRORS.labels(_error)
del _direction, _side, _reason, _tside, _sside, _kind, _rr, _error

BYTES_CLIENT_TO_PROXY = BYTES.labels("client_to_proxy")
BYTES_PROXY_TO_UPSTREAM = BYTES.labels("proxy_to_upstream")
BYTES_UPSTREAM_TO_PROXY = BYTES.labels("upstream_to_proxy")
BYTES_PROXY_TO_CLIENT = BYTES.labels("proxy_to_client")
CLIENT_CONNECTIONS_OPEN = CONNECTIONS_OPEN.labels("client")
UPSTREAM_CONNECTIONS_OPEN = CONNECTIONS_OPEN.labels("upstream")
CLIENT_CONNECTIONS = CONNECTIONS.labels("client")
UPSTREAM_CONNECTIONS = CONNECTIONS.labels("upstream")
THROTTLE_LEFT_OUT_LEADER = THROTTLE_LEFT_OUT.labels("leader")
THROTTLE_LEFT_OUT_FOLLOWER = THROTTLE_LEFT_OUT.labels("follower")
UPSTREAM_FETCH_SESSIONS_OPEN = FETCH_SESSIONS_OPEN.labels("upstream")
UPSTREAM_FETCH_FULL = UPSTREAM_FETCH_REQUESTS.labels("full")
UPSTREAM_FETCH_INCREMENTAL = UPSTREAM_FETCH_REQUESTS.labels("incremental")
UPSTREAM_FETCH_PARTITIONS_CACHED = FETCH_SESSION_PARTITIONS_CACHED.labels("upstream")


# Bounded by the number of (api, version) pairs Kafka defines (a few hundred), so an unbounded cache is safe:
# callers must pass the API *name* from the protocol table, never a raw client-supplied string.
@functools.cache
def requests_for(api: str, version: int) -> Counter:
    """The ``sluice_requests_total{api, version}`` child, cached (per request, ``.labels()`` is the cost)."""
    return REQUESTS.labels(api, str(version))


@functools.cache
def latency_for(api: str) -> Histogram:
    """The ``sluice_request_latency_seconds{api}`` child, cached like :func:`requests_for`."""
    return REQUEST_LATENCY.labels(api)


def observe_request(api: str, version: int, latency_s: float) -> None:
    """Count one completed request and observe its latency (seconds): the per-request metrics in one call."""
    requests_for(api, version).inc()
    latency_for(api).observe(latency_s)


def total(name: str, **labels: str) -> float:
    """The sum of every sample named ``name`` whose labels include ``labels`` (0 if none), from this process's
    default registry: e.g. ``total("sluice_requests_total", api="Fetch")`` adds up all Fetch versions. For
    in-process tests and benches; Prometheus does this with ``sum(...)``."""
    return sum(
        float(s.value)
        for m in REGISTRY.collect()
        for s in m.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )
