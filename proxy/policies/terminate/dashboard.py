"""The terminate policy's row of Sluice's Grafana dashboard (``Registration.dashboard``)."""

from __future__ import annotations

from ...dashboard import Panel, Row, rate, sel

ROW = Row("Fetch sessions (KIP-227)", [
    Panel("Upstream fetch bytes/s: sent vs saved", "Bps",
          "With [sessions] mode = terminate: bytes of the Fetch requests and responses Sluice exchanged "
          "upstream in its own sessions (sluice_upstream_fetch_bytes_total), and the bytes its sessions saved "
          "against what the clients asked for (sluice_upstream_fetch_bytes_saved_total).",
          [(rate("sluice_upstream_fetch_bytes_total", by="direction"), "sent: {{direction}}"),
           (rate("sluice_upstream_fetch_bytes_saved_total", by="direction"), "saved: {{direction}}")]),
    Panel("Fetch sessions open", "none",
          "sluice_fetch_sessions_open: upstream = Sluice's own sessions with brokers, downstream = sessions "
          "it serves to clients.",
          [(f"sum by (side) ({sel('sluice_fetch_sessions_open')})", "{{side}}")], width=6),
    Panel("Partitions cached in sessions", "none",
          "sluice_fetch_session_partitions_cached (Kafka's NumIncrementalFetchPartitionsCached).",
          [(f"sum by (side) ({sel('sluice_fetch_session_partitions_cached')})", "{{side}}")], width=6),
    Panel("Fetch requests/s: incremental vs full", "reqps",
          "sluice_upstream_fetch_requests_total: what Sluice sent upstream in its sessions; "
          "sluice_downstream_fetch_requests_total: what session clients sent to Sluice's sessions.",
          [(rate("sluice_upstream_fetch_requests_total", by="kind"), "upstream: {{kind}}"),
           (rate("sluice_downstream_fetch_requests_total", by="kind"), "clients: {{kind}}")]),
    Panel("Session retries, errors and evictions/s", "cps",
          "sluice_fetch_session_retries_total: upstream session responses that could not be used (the session "
          "restarts); sluice_fetch_session_errors_total: session errors sent to clients; "
          "sluice_fetch_session_evictions_total: client sessions evicted from the cache.",
          [(rate("sluice_fetch_session_retries_total"), "upstream retries"),
           (rate("sluice_fetch_session_errors_total", by="error"), "to clients: {{error}}"),
           (rate("sluice_fetch_session_evictions_total"), "evictions")]),
])
