"""The terminate policy's metrics (KIP-227 fetch sessions), on the proxy's registry."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge

from ...metrics import TallyFamily

SESSION_ERROR_NAMES: Final[dict[int, str]] = {70: "FETCH_SESSION_ID_NOT_FOUND", 71: "INVALID_FETCH_SESSION_EPOCH",
                                              106: "FETCH_SESSION_TOPIC_ID_ERROR"}


#: the kinds of client fetch requests terminate answers
_DOWNSTREAM_KINDS = ("full", "incremental", "sessionless", "error")


class SessionMetrics:
    """Sluice's own fetch sessions upstream and the sessions it serves to clients. The counters touched on every
    fetch are :class:`~proxy.metrics.TallyFamily` (plain numbers exported at scrape time: no lock per fetch)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.fetch_sessions_open = Gauge(
            "sluice_fetch_sessions_open",
            "Fetch sessions Sluice holds: upstream = its own sessions with brokers ([sessions] mode = terminate), "
            "downstream = sessions it serves to clients.", ["side"], registry=r)
        self.fetch_session_partitions_cached = Gauge(
            "sluice_fetch_session_partitions_cached",
            "Partitions in fetch sessions: upstream = partitions whose last known state Sluice keeps for its own "
            "sessions, downstream = partitions of the sessions it serves (Kafka's "
            "NumIncrementalFetchPartitionsCached).", ["side"], registry=r)
        self.upstream_fetch_requests = TallyFamily(
            "sluice_upstream_fetch_requests",
            "Fetch requests Sluice sent upstream in its own sessions, by kind: full (every partition) or "
            "incremental (only added/changed partitions).", "kind", ("full", "incremental"))
        r.register(self.upstream_fetch_requests)
        self.upstream_fetch_bytes = TallyFamily(
            "sluice_upstream_fetch_bytes",
            "Bytes of the Fetch requests Sluice sent upstream in [sessions] terminate mode and of their responses "
            "(size prefix included), by direction: request or response.", "direction", ("request", "response"))
        r.register(self.upstream_fetch_bytes)
        self.upstream_fetch_bytes_saved = TallyFamily(
            "sluice_upstream_fetch_bytes_saved",
            "Bytes saved on the upstream link by Sluice's fetch sessions, by direction: the client's request minus "
            "the request sent upstream instead, and the response sent to the client minus the upstream response "
            "(for a session-less client: the saving against the full fetch it asked for).", "direction",
            ("request", "response"))
        r.register(self.upstream_fetch_bytes_saved)
        self.fetch_session_retries = Counter(
            "sluice_fetch_session_retries_total",
            "Upstream session responses that could not be used (session error 70/71/106, invalid or throttled "
            "empty response): the session restarts with a full request, sent at once when possible, else the "
            "client gets a retriable answer.", registry=r)
        self.downstream_fetch_requests = TallyFamily(
            "sluice_downstream_fetch_requests",
            "Fetch requests of clients that use fetch sessions, answered by Sluice's own sessions ([sessions] "
            "mode = terminate), by kind: full (creates a session), incremental, sessionless (epoch -1: closes a "
            "session or none) or error (a session error sent to the client).", "kind", _DOWNSTREAM_KINDS)
        r.register(self.downstream_fetch_requests)
        self.fetch_session_errors = Counter(
            "sluice_fetch_session_errors_total",
            "Session errors Sluice sent to its clients, by Kafka error name (FETCH_SESSION_ID_NOT_FOUND, "
            "INVALID_FETCH_SESSION_EPOCH, FETCH_SESSION_TOPIC_ID_ERROR).", ["error"], registry=r)
        self.fetch_session_evictions = Counter(
            "sluice_fetch_session_evictions_total",
            "Client fetch sessions evicted from Sluice's session cache to make room for a new one "
            "(Kafka's IncrementalFetchSessionEvictionsPerSec).", registry=r)
        for sside in ("downstream", "upstream"):
            self.fetch_sessions_open.labels(sside)
            self.fetch_session_partitions_cached.labels(sside)
        for error in SESSION_ERROR_NAMES.values():
            self.fetch_session_errors.labels(error)
        self.upstream_fetch_sessions_open = self.fetch_sessions_open.labels("upstream")
        self.upstream_fetch_full = self.upstream_fetch_requests.tallies["full"]
        self.upstream_fetch_incremental = self.upstream_fetch_requests.tallies["incremental"]
        self.upstream_fetch_partitions_cached = self.fetch_session_partitions_cached.labels("upstream")
        self.upstream_fetch_request_bytes = self.upstream_fetch_bytes.tallies["request"]
        self.upstream_fetch_response_bytes = self.upstream_fetch_bytes.tallies["response"]
        self.upstream_fetch_request_bytes_saved = self.upstream_fetch_bytes_saved.tallies["request"]
        self.upstream_fetch_response_bytes_saved = self.upstream_fetch_bytes_saved.tallies["response"]
        #: per kind: "full", "incremental", "sessionless", "error"
        self.downstream_fetch_requests_by_kind = self.downstream_fetch_requests.tallies

    def bind_session_cache(self, sessions_open: Callable[[], float], partitions_cached: Callable[[], float]) -> None:
        """Report the downstream session cache (Kafka's NumIncrementalFetchSessions / ...PartitionsCached)."""
        self.fetch_sessions_open.labels("downstream").set_function(sessions_open)
        self.fetch_session_partitions_cached.labels("downstream").set_function(partitions_cached)

