"""Every Prometheus metric Sluice exports, named in this one place, in a registry of one proxy's own.

Conventions (https://prometheus.io/docs/practices/naming/): prefix ``sluice_``, base units (bytes, seconds),
``_total`` on counters, and only low-cardinality labels (api, version, direction, side, reason) - never a
topic, partition, client id or address, which would grow without bound.

A :class:`Metrics` object holds its own ``CollectorRegistry``; the proxy makes one and hands it to the connection
core, the chain and every policy, and the admin server serves that registry on /metrics. Two proxies in one
process (tests, benches) therefore keep separate counts; nothing here is process-global.

Label children known up front are created with the collectors, so they are exported as 0 before the first event
(a rate() over a series that appears late misses its first increment, and dashboards show "no data" instead of
0). Hot paths use the pre-bound children (``metrics.bytes_client_to_proxy.inc(n)``) or :meth:`requests_for`,
because ``.labels(...)`` takes a lock and builds a key on every call.
"""

from __future__ import annotations

import platform
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any, Final, Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, disable_created_metrics
from prometheus_client.exposition import generate_latest

Direction = Literal["client_to_proxy", "proxy_to_upstream", "upstream_to_proxy", "proxy_to_client"]
Side = Literal["client", "upstream"]
#: why a frame or connection was refused; a value handed along by whoever refused it, never parsed from text
RejectReason = Literal["too_large", "malformed", "unknown_api", "unsupported_version", "upstream_closed",
                       "request_timeout"]

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
)
THROTTLE_SIDES: Final[tuple[str, ...]] = ("leader", "follower")
SESSION_ERROR_NAMES: Final[dict[int, str]] = {70: "FETCH_SESSION_ID_NOT_FOUND", 71: "INVALID_FETCH_SESSION_EPOCH",
                                              106: "FETCH_SESSION_TOPIC_ID_ERROR"}
TOPIC_LOOKUP_OUTCOMES: Final[tuple[str, ...]] = ("resolved", "unknown", "failed")
#: why a client connection was closed before its first request was read (proxy/server.py)
REFUSE_REASONS: Final[tuple[str, ...]] = ("max_connections", "max_connections_per_address", "proxy_protocol",
                                          "tls_handshake")
#: why Sluice closed a client connection it had served (limits)
CLOSE_REASONS: Final[tuple[str, ...]] = ("idle",)
TLS_RELOAD_OUTCOMES: Final[tuple[str, ...]] = ("reloaded", "failed")
#: why cooperative consumption left something unshared (proxy/policies/sharing/)
SHARING_NOT_SHARED_REASONS: Final[tuple[str, ...]] = (
    "kip848_group", "client_id_collision", "bad_marker", "bad_assignment", "member_unknown", "undecodable_batch")
#: why records were left out of a member's fetch response: another member's key slice, or already committed
SHARING_FILTER_REASONS: Final[tuple[str, ...]] = ("other_slice", "committed")
#: why an access-log event did not reach the Kafka sink's topic (proxy/accesslog_kafka.py)
ACCESS_LOG_DROP_REASONS: Final[tuple[str, ...]] = ("write_failed", "buffer_full", "delivery_failed", "stopped")

# 50 us (a relayed ApiVersions on loopback) .. 10 s (beyond any sane fetch.max.wait.ms); roughly 1-2.5-5 steps
# so a Fetch long poll (~0.5 s) and a sub-millisecond metadata call both land in a bucket of their own.
LATENCY_BUCKETS: Final[tuple[float, ...]] = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0,
)

# Without this, every counter and histogram also exports a `<name>_created` gauge per label set (in the
# classic text format these are separate series): twice the series for a timestamp no dashboard here uses.
disable_created_metrics()


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


class Metrics:
    """One proxy's collectors, in ``self.registry``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry if registry is not None else CollectorRegistry(auto_describe=True)

        # ------------------------------------------------------------------------------------- requests
        self.requests = Counter("sluice_requests_total",
                                "Requests relayed from clients, by Kafka API name and request version.",
                                ["api", "version"], registry=r)
        self.request_latency = Histogram(
            "sluice_request_latency_seconds",
            "Time from a request's last byte read from the client to its response handed to the client.",
            ["api"], buckets=LATENCY_BUCKETS, registry=r)
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
        self.bytes = Counter("sluice_bytes_total",
                             "Bytes moved, including the 4-byte frame length, by direction.",
                             ["direction"], registry=r)

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

        # ---------------------------------------------------------------------------------------- build
        self.build_info = Info("sluice_build", "Sluice build information; the value is always 1.", registry=r)
        self.build_info.info({"version": sluice_version(), "python": platform.python_version()})

        # ---------------------------------------------------------------------- size limiting (KIP-74)
        self.size_limit_trimmed = Counter(
            "sluice_size_limit_trimmed_bytes_total",
            "Record bytes left out of fetch responses to keep them within their budget (cut at batch boundaries).",
            registry=r)
        self.size_limit_deferred = Counter(
            "sluice_size_limit_deferred_partitions_total",
            "Partitions whose records were all left out of a response (kept, error 0, real offsets, empty "
            "records).", registry=r)
        self.size_limit_limited = Counter("sluice_size_limit_limited_responses_total",
                                          "Fetch responses the budget changed.", registry=r)
        self.response_bytes_held = Gauge(
            "sluice_response_bytes_held",
            "Bytes of fetch responses reserved or held in Sluice, counted against size_limit.global_max_bytes.",
            registry=r)
        self.size_limit_waits = Counter(
            "sluice_size_limit_waits_total",
            "Fetches that waited for response memory (size_limit.global_max_bytes) before going upstream.",
            registry=r)

        # ------------------------------------------------------------------------- throttles (KIP-73)
        self.throttle_byte_rate = Gauge(
            "sluice_throttle_byte_rate",
            "Bytes/s of throttled partitions over the quota window (Kafka's LeaderReplication/FollowerReplication "
            "byte-rate): leader = sent to fetchers, follower = fetched upstream.", ["side"], registry=r)
        self.throttle_bytes = Counter(
            "sluice_throttle_bytes_total",
            "Record bytes of throttled partitions counted against the quota: leader = sent to fetchers, "
            "follower = fetched upstream (every partition a response carries, listed in the request or not).",
            ["side"], registry=r)
        self.throttle_rate_limit = Gauge(
            "sluice_throttle_rate_limit_bytes",
            "Configured throttle in bytes/s (throttle.leader_rate_bytes / follower_rate_bytes); 0 = none.",
            ["side"], registry=r)
        self.throttle_window = Gauge("sluice_throttle_window_seconds",
                                     "Quota window: samples x window_s (Kafka: 11 x 1 s).", registry=r)
        self.throttle_topics = Gauge(
            "sluice_throttle_topics", "Throttled-replicas entries ([[throttle.topics]]: topic names and globs).",
            registry=r)
        self.throttle_left_out = Counter(
            "sluice_throttle_left_out_partitions_total",
            "Throttled partitions held back: leader = records left out of a response (partition kept, empty "
            "records), follower = left out of a request sent upstream, or their records out of the response "
            "when the request could not leave them out (a fetch session's partitions).", ["side"], registry=r)
        self.throttle_sum_lag = Gauge(
            "sluice_throttle_sum_lag_offsets",
            "Sum over throttled partitions and fetchers of high watermark - fetch offset (KIP-73's SumReplicaLag): "
            "if it stops falling, the throttle is too low for the move to finish.", registry=r)

        # ------------------------------------------------------------------- fetch sessions (KIP-227)
        self.fetch_sessions_open = Gauge(
            "sluice_fetch_sessions_open",
            "Fetch sessions Sluice holds: upstream = its own sessions with brokers ([sessions] mode = terminate), "
            "downstream = sessions it serves to clients.", ["side"], registry=r)
        self.fetch_session_partitions_cached = Gauge(
            "sluice_fetch_session_partitions_cached",
            "Partitions in fetch sessions: upstream = partitions whose last known state Sluice keeps for its own "
            "sessions, downstream = partitions of the sessions it serves (Kafka's "
            "NumIncrementalFetchPartitionsCached).", ["side"], registry=r)
        self.upstream_fetch_requests = Counter(
            "sluice_upstream_fetch_requests_total",
            "Fetch requests Sluice sent upstream in its own sessions, by kind: full (every partition) or "
            "incremental (only added/changed partitions).", ["kind"], registry=r)
        self.upstream_fetch_bytes = Counter(
            "sluice_upstream_fetch_bytes_total",
            "Bytes of the Fetch requests Sluice sent upstream in [sessions] terminate mode and of their responses "
            "(size prefix included), by direction: request or response.", ["direction"], registry=r)
        self.upstream_fetch_bytes_saved = Counter(
            "sluice_upstream_fetch_bytes_saved_total",
            "Bytes saved on the upstream link by Sluice's fetch sessions, by direction: the client's request minus "
            "the request sent upstream instead, and the response sent to the client minus the upstream response "
            "(for a session-less client: the saving against the full fetch it asked for).", ["direction"],
            registry=r)
        self.fetch_session_retries = Counter(
            "sluice_fetch_session_retries_total",
            "Upstream session responses that could not be used (session error 70/71/106, invalid or throttled "
            "empty response): the session restarts with a full request, sent at once when possible, else the "
            "client gets a retriable answer.", registry=r)
        self.downstream_fetch_requests = Counter(
            "sluice_downstream_fetch_requests_total",
            "Fetch requests of clients that use fetch sessions, answered by Sluice's own sessions ([sessions] "
            "mode = terminate), by kind: full (creates a session), incremental, sessionless (epoch -1: closes a "
            "session or none) or error (a session error sent to the client).", ["kind"], registry=r)
        self.fetch_session_errors = Counter(
            "sluice_fetch_session_errors_total",
            "Session errors Sluice sent to its clients, by Kafka error name (FETCH_SESSION_ID_NOT_FOUND, "
            "INVALID_FETCH_SESSION_EPOCH, FETCH_SESSION_TOPIC_ID_ERROR).", ["error"], registry=r)
        self.fetch_session_evictions = Counter(
            "sluice_fetch_session_evictions_total",
            "Client fetch sessions evicted from Sluice's session cache to make room for a new one "
            "(Kafka's IncrementalFetchSessionEvictionsPerSec).", registry=r)

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

        # ------------------------------------------------------- cooperative consumption (seed 004)
        # The group label is the one exception to "no client-chosen labels": the issue asks for these per group,
        # and a group's children are removed when no member of it is behind this Sluice any more, so they are
        # bounded by the groups of the consumers this Sluice serves now.
        self.sharing_partitions = Gauge(
            "sluice_sharing_partitions",
            "Partitions split into key-hash slices among a group's members, as the members behind this Sluice hold "
            "them, by group.", ["group"], registry=r)
        self.sharing_partition_members = Gauge(
            "sluice_sharing_partition_members",
            "Members sharing each of those partitions (the most among them), by group.", ["group"], registry=r)
        self.sharing_stable_lag = Gauge(
            "sluice_sharing_stable_offset_lag",
            "Sum over a group's shared partitions of (the furthest slice position - the stable offset), as last "
            "computed at a commit through this Sluice: what a consumer resuming from the group's committed offset "
            "(one without Sluice, a lag tool) would read again.", ["group"], registry=r)
        self.sharing_records_filtered = Counter(
            "sluice_sharing_records_filtered_total",
            "Records left out of members' fetch responses, by reason: other_slice (another member's key slice) or "
            "committed (an earlier slice already committed it).", ["reason"], registry=r)
        self.sharing_filtered_bytes = Counter(
            "sluice_sharing_filtered_bytes_total",
            "Record bytes of the shared partitions Sluice filtered, as fetched (before filtering).", registry=r)
        self.sharing_assignments = Counter(
            "sluice_sharing_assignments_total",
            "Group assignments this Sluice rewrote as the group leader's (topics split into key-hash slices).",
            registry=r)
        self.sharing_not_shared = Counter(
            "sluice_sharing_not_shared_total",
            "Times cooperative consumption left something unshared, by reason: kip848_group (a consumer on the "
            "KIP-848 protocol), client_id_collision (two members with one client.id and host behind one Sluice), "
            "bad_marker / bad_assignment (undecodable group protocol data), member_unknown (an opted-in client's "
            "fetches passed unfiltered: no group member seen for it), undecodable_batch (a batch passed unfiltered).",
            ["reason"], registry=r)
        self.sharing_withheld = Counter(
            "sluice_sharing_withheld_partitions_total",
            "Shared partitions whose records were withheld from a member whose slices Sluice did not know yet "
            "(after a Sluice restart, until the group tells it again).", registry=r)
        self.sharing_rejoins = Counter(
            "sluice_sharing_rejoins_total",
            "Members Sluice asked to rejoin their group (a heartbeat answered REBALANCE_IN_PROGRESS).", registry=r)
        self.sharing_cache_bytes = Gauge(
            "sluice_sharing_cache_bytes",
            "Bytes of decoded batches kept for the other members of a partition (sharing.cache_max_bytes).",
            registry=r)
        self.sharing_cache_lookups = Counter(
            "sluice_sharing_cache_lookups_total", "Decoded-batch cache lookups, by outcome: hit or miss.",
            ["outcome"], registry=r)
        self.sharing_group_calls = Counter(
            "sluice_sharing_group_calls_total",
            "Group requests of Sluice's own (slice positions and group descriptions), by outcome: ok or failed.",
            ["outcome"], registry=r)

        # ------------------------------------------------------------ children known up front, pre-bound
        for direction in DIRECTIONS:
            self.bytes.labels(direction)
        for side in SIDES:
            self.connections_open.labels(side)
            self.connections.labels(side)
        for reason in REJECT_REASONS:
            self.frames_rejected.labels(reason)
        for outcome in TOPIC_LOOKUP_OUTCOMES:
            self.topic_lookups.labels(outcome)
        for tside in THROTTLE_SIDES:
            self.throttle_left_out.labels(tside)
            self.throttle_bytes.labels(tside)
            self.throttle_byte_rate.labels(tside)
            self.throttle_rate_limit.labels(tside)
        for sside in ("downstream", "upstream"):
            self.fetch_sessions_open.labels(sside)
            self.fetch_session_partitions_cached.labels(sside)
        for kind in ("full", "incremental"):
            self.upstream_fetch_requests.labels(kind)
        for kind in ("full", "incremental", "sessionless", "error"):
            self.downstream_fetch_requests.labels(kind)
        for rr in ("request", "response"):
            self.upstream_fetch_bytes.labels(rr)
            self.upstream_fetch_bytes_saved.labels(rr)
        for error in SESSION_ERROR_NAMES.values():
            self.fetch_session_errors.labels(error)
        for drop in ACCESS_LOG_DROP_REASONS:
            self.access_log_dropped.labels(drop)
        for refused in REFUSE_REASONS:
            self.connections_refused.labels(refused)
        for closed in CLOSE_REASONS:
            self.connections_closed.labels(closed)
        for outcome in TLS_RELOAD_OUTCOMES:
            self.tls_reloads.labels(outcome)
        for not_shared in SHARING_NOT_SHARED_REASONS:
            self.sharing_not_shared.labels(not_shared)
        for filtered in SHARING_FILTER_REASONS:
            self.sharing_records_filtered.labels(filtered)
        for outcome in ("hit", "miss"):
            self.sharing_cache_lookups.labels(outcome)
        for outcome in ("ok", "failed"):
            self.sharing_group_calls.labels(outcome)

        self.bytes_client_to_proxy = self.bytes.labels("client_to_proxy")
        self.bytes_proxy_to_upstream = self.bytes.labels("proxy_to_upstream")
        self.bytes_upstream_to_proxy = self.bytes.labels("upstream_to_proxy")
        self.bytes_proxy_to_client = self.bytes.labels("proxy_to_client")
        self.client_connections_open = self.connections_open.labels("client")
        self.upstream_connections_open = self.connections_open.labels("upstream")
        self.client_connections = self.connections.labels("client")
        self.upstream_connections = self.connections.labels("upstream")
        self.throttle_left_out_leader = self.throttle_left_out.labels("leader")
        self.throttle_left_out_follower = self.throttle_left_out.labels("follower")
        self.throttle_bytes_leader = self.throttle_bytes.labels("leader")
        self.throttle_bytes_follower = self.throttle_bytes.labels("follower")
        self.upstream_fetch_sessions_open = self.fetch_sessions_open.labels("upstream")
        self.upstream_fetch_full = self.upstream_fetch_requests.labels("full")
        self.upstream_fetch_incremental = self.upstream_fetch_requests.labels("incremental")
        self.upstream_fetch_partitions_cached = self.fetch_session_partitions_cached.labels("upstream")
        self.upstream_fetch_request_bytes = self.upstream_fetch_bytes.labels("request")
        self.upstream_fetch_response_bytes = self.upstream_fetch_bytes.labels("response")
        self.upstream_fetch_request_bytes_saved = self.upstream_fetch_bytes_saved.labels("request")
        self.upstream_fetch_response_bytes_saved = self.upstream_fetch_bytes_saved.labels("response")
        #: per kind: "full", "incremental", "sessionless", "error"
        self.downstream_fetch_requests_by_kind = {
            kind: self.downstream_fetch_requests.labels(kind)
            for kind in ("full", "incremental", "sessionless", "error")}
        # Bounded by the number of (api, version) pairs Kafka defines (a few hundred): callers pass the API
        # *name* from the protocol table, never a raw client-supplied string.
        self._requests_for: dict[tuple[str, int], Any] = {}
        self._latency_for: dict[str, Any] = {}
        self._rewritten_for: dict[str, Any] = {}

    # ------------------------------------------------------------------------------------- helpers

    def observe_request(self, api: str, version: int, latency_s: float) -> None:
        """Count one completed request and observe its latency (seconds): the per-request metrics in one call
        (children cached: ``.labels()`` is the cost per request)."""
        counter = self._requests_for.get((api, version))
        if counter is None:
            counter = self._requests_for[(api, version)] = self.requests.labels(api, str(version))
        counter.inc()
        histogram = self._latency_for.get(api)
        if histogram is None:
            histogram = self._latency_for[api] = self.request_latency.labels(api)
        histogram.observe(latency_s)

    def rewritten(self, api: str) -> None:
        """Count a response re-encoded (the child cached per API name, from the protocol table)."""
        counter = self._rewritten_for.get(api)
        if counter is None:
            counter = self._rewritten_for[api] = self.responses_rewritten.labels(api)
        counter.inc()

    def observe_size_limit(self, trimmed_bytes: int, deferred_partitions: int) -> None:
        """Count what a budget did to one response."""
        if trimmed_bytes:
            self.size_limit_limited.inc()
            self.size_limit_trimmed.inc(trimmed_bytes)
        if deferred_partitions:
            self.size_limit_deferred.inc(deferred_partitions)

    def bind_throttle(self, state: Any, throttles: Any, clock: Callable[[], float]) -> None:
        """Point the throttle gauges at the proxy's quotas (proxy.policies.throttle.ThrottleState) and the
        configuration in force; called again on every reconfiguration."""
        self.throttle_byte_rate.labels("leader").set_function(lambda: state.leader.rate(clock()))
        self.throttle_byte_rate.labels("follower").set_function(lambda: state.follower.rate(clock()))
        self.throttle_sum_lag.set_function(lambda: state.sum_lag(clock()))
        self.throttle_rate_limit.labels("leader").set(throttles.leader_rate)
        self.throttle_rate_limit.labels("follower").set(throttles.follower_rate)
        self.throttle_window.set(throttles.samples * throttles.window_s)
        self.throttle_topics.set(len(throttles.topics))

    def bind_session_cache(self, sessions_open: Callable[[], float], partitions_cached: Callable[[], float]) -> None:
        """Report the downstream session cache (Kafka's NumIncrementalFetchSessions / ...PartitionsCached)."""
        self.fetch_sessions_open.labels("downstream").set_function(sessions_open)
        self.fetch_session_partitions_cached.labels("downstream").set_function(partitions_cached)

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
