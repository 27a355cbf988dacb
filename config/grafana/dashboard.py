"""Writes config/grafana/dashboards/sluice.json, the Grafana dashboard for Sluice:

    python config/grafana/dashboard.py          # rewrites the JSON next to it; commit both

Why a script and not hand-written JSON: a Grafana dashboard is ~30 lines of boilerplate per panel (grid
position, datasource, legend, tooltip) around the one line that matters, the PromQL. Here each panel is its
title, unit, description and queries; the layout (rows of panels side by side), the datasource reference on
every panel and target, and the instance filter in every selector are applied in one place, so they cannot be
forgotten on one panel. The JSON stays committed (Grafana's provisioning reads it as is, and it is what a user
imports by hand), and tests/unit/test_grafana_dashboard.py checks that it is exactly this script's output.

Template variables: ``datasource`` (any Prometheus), ``job`` and ``instance`` (from ``sluice_build_info``, "All" by
default). Rates use Grafana's ``$__rate_interval``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "dashboards" / "sluice.json"

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
#: the filter every selector carries (the job and instance template variables)
FILTER = 'job=~"$job", instance=~"$instance"'
RATE = "$__rate_interval"


def sel(metric: str, labels: str = "") -> str:
    """``metric{labels, job=~"$job", instance=~"$instance"}``."""
    return f"{metric}{{{labels + ', ' if labels else ''}{FILTER}}}"


def rate(metric: str, labels: str = "", by: str = "") -> str:
    """``sum [by (...)] (rate(metric{...}[$__rate_interval]))``."""
    return f"sum{f' by ({by}) ' if by else ''}(rate({sel(metric, labels)}[{RATE}]))"


def quantile(q: float) -> str:
    return (f"histogram_quantile({q}, sum by (api, le) "
            f"(rate({sel('sluice_request_latency_seconds_bucket')}[{RATE}])))")


@dataclass
class Panel:
    title: str
    unit: str
    description: str
    #: (PromQL, legend) pairs
    targets: list[tuple[str, str]]
    width: int = 12
    height: int = 8
    kind: str = "timeseries"
    #: the y axis starts at 0 (not for values that go negative)
    min_zero: bool = True
    #: stat panels: the value from which it turns red (None: always green)
    red_from: float | None = None


@dataclass
class Row:
    title: str
    panels: list[Panel] = field(default_factory=list)


ROWS = [
    Row("Overview", [
        Panel("Sluice instances up", "none", "Instances Prometheus scrapes successfully (the `up` metric).",
              [(f'sum(up{{{FILTER}}})', "up")], width=6, height=4, kind="stat"),
        Panel("Requests/s", "reqps", "Requests answered per second, every API.",
              [(rate("sluice_requests_total"), "requests/s")], width=6, height=4, kind="stat"),
        Panel("Client connections", "none", "Client connections open now.",
              [("sum(" + sel("sluice_connections_open", 'side="client"') + ")", "open")], width=6, height=4,
              kind="stat"),
        Panel("Sluice alerts firing", "none",
              "Alerts of config/prometheus/sluice-alerts.yml firing now (0 = none); their meaning and what to do: "
              "README, Grafana dashboard and alerts.",
              [('count(ALERTS{alertstate="firing", alertname=~"Sluice.+", ' + FILTER + "}) or vector(0)",
                "firing")], width=6, height=4, kind="stat", red_from=1),
    ]),
    Row("Traffic", [
        Panel("Requests/s by API", "reqps", "sluice_requests_total: requests answered, by Kafka API.",
              [(rate("sluice_requests_total", by="api"), "{{api}}")], width=8),
        Panel("Bytes/s by direction", "Bps",
              "sluice_bytes_total: client_to_proxy and proxy_to_upstream are requests, upstream_to_proxy and "
              "proxy_to_client responses (frame length prefix included).",
              [(rate("sluice_bytes_total", by="direction"), "{{direction}}")], width=8),
        Panel("Responses rewritten/s by API", "reqps",
              "sluice_responses_rewritten_total: responses Sluice re-encoded (addresses, policies) instead of "
              "relaying the broker's bytes.",
              [(rate("sluice_responses_rewritten_total", by="api"), "{{api}}")], width=8),
    ]),
    Row("Latency", [
        Panel("p50 latency by API", "s",
              "Median time from a request's last byte read to its response handed to the client "
              "(sluice_request_latency_seconds). Fetch includes the broker's long-poll wait (fetch.max.wait.ms).",
              [(quantile(0.5), "{{api}}")]),
        Panel("p99 latency by API", "s", "99th percentile of sluice_request_latency_seconds.",
              [(quantile(0.99), "{{api}}")]),
    ]),
    Row("Response-size limits (KIP-74)", [
        Panel("Trimmed bytes/s", "Bps",
              "sluice_size_limit_trimmed_bytes_total: record bytes left out of fetch responses to keep them "
              "within their budget (cut at batch boundaries; the client fetches them next).",
              [(rate("sluice_size_limit_trimmed_bytes_total"), "trimmed")], width=6),
        Panel("Deferred partitions/s", "cps",
              "sluice_size_limit_deferred_partitions_total: partitions whose records were all left out of a "
              "response (kept with error 0 and their real offsets).",
              [(rate("sluice_size_limit_deferred_partitions_total"), "deferred")], width=6),
        Panel("Limited responses/s and memory waits/s", "cps",
              "sluice_size_limit_limited_responses_total: responses the budget changed; "
              "sluice_size_limit_waits_total: fetches that waited for response memory "
              "(size_limit.global_max_bytes) before going upstream.",
              [(rate("sluice_size_limit_limited_responses_total"), "limited responses"),
               (rate("sluice_size_limit_waits_total"), "memory waits")], width=6),
        Panel("Response bytes held", "bytes",
              "sluice_response_bytes_held: fetch response bytes reserved or held, counted against "
              "size_limit.global_max_bytes.",
              [(f"sum({sel('sluice_response_bytes_held')})", "held")], width=6),
    ]),
    Row("Share groups (KIP-932)", [
        Panel("Share records acquired and acknowledged/s", "cps",
              "sluice_share_records_acquired_total: records ShareFetch responses acquired for their consumers; "
              "sluice_share_records_acknowledged_total by api and type (accept, release, reject, gap, renew): "
              "the acknowledgements consumers sent.",
              [(rate("sluice_share_records_acquired_total"), "acquired"),
               # no series until a share consumer acknowledged something (labelled by api and type)
               (rate("sluice_share_records_acknowledged_total", by="type") + " or on() vector(0)",
                "acknowledged: {{type}}")], width=12),
        Panel("Share fetches clamped/s", "cps",
              "sluice_size_limit_share_clamped_requests_total: ShareFetch requests whose MaxBytes a size budget "
              "lowered (share fetches are bounded on the request side only: a record cut from a response would "
              "stay acquired).",
              [(rate("sluice_size_limit_share_clamped_requests_total"), "clamped")], width=12),
    ]),
    Row("Fetch sessions (KIP-227)", [
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
    ]),
    Row("Replication throttles (KIP-73)", [
        Panel("Throttle rate vs limit", "Bps",
              "sluice_throttle_byte_rate (measured over the quota window) against sluice_throttle_rate_limit_bytes, "
              "per instance and side; a limit line is drawn only for sides with a limit. Alert: "
              "SluiceThrottleNotHolding.",
              [(f"sum by (instance, side) ({sel('sluice_throttle_byte_rate')})", "{{instance}} {{side}} rate"),
               (f"sum by (instance, side) ({sel('sluice_throttle_rate_limit_bytes')}) > 0",
                "{{instance}} {{side}} limit")]),
        Panel("Sum lag of throttled partitions", "short",
              "sluice_throttle_sum_lag_offsets: high watermark - fetch offset over throttled partitions and "
              "fetchers (KIP-73's SumReplicaLag). If it stops falling, raise the throttle.",
              [(f"sum by (instance) ({sel('sluice_throttle_sum_lag_offsets')})", "{{instance}}")]),
        Panel("Throttled bytes/s by side", "Bps",
              "sluice_throttle_bytes_total: record bytes of throttled partitions counted against the quota "
              "(leader = sent to fetchers, follower = fetched upstream).",
              [(rate("sluice_throttle_bytes_total", by="side"), "{{side}}")], width=8),
        Panel("Left-out partitions/s by side", "cps",
              "sluice_throttle_left_out_partitions_total: throttled partitions held back while the rate is above "
              "the limit.",
              [(rate("sluice_throttle_left_out_partitions_total", by="side"), "{{side}}")], width=8),
        Panel("Throttle configuration", "none",
              "sluice_throttle_topics: [[throttle.topics]] entries; sluice_throttle_window_seconds: the quota "
              "window (samples x window_s).",
              [(f"max({sel('sluice_throttle_topics')})", "topic entries"),
               (f"max({sel('sluice_throttle_window_seconds')})", "window (s)")], width=8, kind="stat"),
    ]),
    Row("Client quotas (KIP-13, KIP-219)", [
        Panel("Quota bytes/s by entry", "Bps",
              "sluice_quota_bytes_total: Produce request bytes and Fetch response bytes of the clients each "
              "[[quota.entries]] entry selects, counted against its quota.",
              [(rate("sluice_quota_bytes_total", by="entry, kind"), "{{entry}} {{kind}}")], width=8),
        Panel("Quota requests/s by entry", "reqps",
              "sluice_quota_requests_total: Produce and Fetch requests of the clients each entry selects.",
              [(rate("sluice_quota_requests_total", by="entry, api"), "{{entry}} {{api}}")], width=8),
        Panel("Share of time throttled by entry", "percentunit",
              "sluice_quota_throttle_seconds_total: throttle time applied per second (1 = one client held all the "
              "time; above 1, several); sluice_quota_throttled_total: throttled responses/s. Alert: "
              "SluiceQuotaHoldsClient.",
              [(rate("sluice_quota_throttle_seconds_total", by="entry, api"), "{{entry}} {{api}} held"),
               (rate("sluice_quota_throttled_total", by="entry, api"), "{{entry}} {{api}} throttled/s")], width=8),
    ]),
    Row("Cooperative consumption", [
        Panel("Shared partitions and members per partition", "none",
              "sluice_sharing_partitions: partitions split into key-hash slices among each group's members (as the "
              "members behind this Sluice hold them); sluice_sharing_partition_members: members sharing each.",
              [(f"max by (group) ({sel('sluice_sharing_partitions')})", "{{group}} partitions"),
               (f"max by (group) ({sel('sluice_sharing_partition_members')})", "{{group}} members/partition")],
              width=8),
        Panel("Stable-offset lag by group", "short",
              "sluice_sharing_stable_offset_lag: how far the furthest slice is ahead of the group's committed "
              "(stable) offset, summed over its shared partitions: what a consumer resuming from the group's offset "
              "without Sluice would read again. Rising without bound = a slice that no longer commits.",
              [(f"max by (group) ({sel('sluice_sharing_stable_offset_lag')})", "{{group}}")], width=8),
        Panel("Records filtered/s by reason, read-ahead", "cps",
              "sluice_sharing_records_filtered_total: records left out of members' fetch responses (other_slice: "
              "another member's keys; committed: an earlier slice committed them); "
              "sluice_sharing_filtered_bytes_total: record bytes of the partitions filtered (as fetched); "
              "sluice_sharing_read_ahead_total by event: fetch offsets moved past what Sluice read with nothing for "
              "the member, fetches sent again within the client's wait, read-aheads forgotten (the broker answered "
              "a moved offset out of range), slice positions Sluice committed on itself (advanced).",
              [(rate("sluice_sharing_records_filtered_total", by="reason"), "{{reason}}"),
               (rate("sluice_sharing_filtered_bytes_total"), "bytes filtered/s"),
               (rate("sluice_sharing_read_ahead_total", by="event"), "read-ahead {{event}}")], width=8),
        Panel("Not shared, withheld and rejoins/s", "cps",
              "sluice_sharing_not_shared_total by reason (kip848_group, client_id_collision, bad_marker, "
              "bad_assignment, member_unknown, undecodable_batch); sluice_sharing_withheld_partitions_total: "
              "partitions withheld from a member not yet known (after a restart); sluice_sharing_rejoins_total; "
              "sluice_sharing_assignments_total: assignments rewritten as group leader; "
              "sluice_sharing_stable_offsets_raised_total: group commits Sluice made as a member to raise a "
              "stable offset a concurrent commit left behind.",
              [(rate("sluice_sharing_not_shared_total", by="reason"), "not shared: {{reason}}"),
               (rate("sluice_sharing_withheld_partitions_total"), "withheld partitions"),
               (rate("sluice_sharing_rejoins_total"), "rejoins"),
               (rate("sluice_sharing_assignments_total"), "assignments rewritten"),
               (rate("sluice_sharing_stable_offsets_raised_total"), "stable offsets raised")]),
        Panel("Decoded-batch cache and own group requests", "short",
              "sluice_sharing_cache_bytes (sharing.cache_max_bytes), sluice_sharing_cache_lookups_total by outcome "
              "(hit/miss per second); sluice_sharing_group_calls_total: Sluice's own slice-position and group "
              "requests per second, ok or failed.",
              [(f"sum by (instance) ({sel('sluice_sharing_cache_bytes')})", "{{instance}} cache bytes"),
               (rate("sluice_sharing_cache_lookups_total", by="outcome"), "cache {{outcome}}/s"),
               (rate("sluice_sharing_group_calls_total", by="outcome"), "group calls {{outcome}}/s")]),
    ]),
    Row("Starvation", [
        Panel("Partitions held back/s", "cps",
              "Partitions whose records were left out: by a size budget (deferred) or a throttle (left out). "
              "Held back while the throttled bytes/s above stay at zero = starving (alert "
              "SluicePartitionStarving). Per-partition detail: the access log's partitions field, sluice report.",
              [(rate("sluice_size_limit_deferred_partitions_total"), "size limit: deferred"),
               (rate("sluice_throttle_left_out_partitions_total", by="side"), "throttle {{side}}: left out")]),
        Panel("Lag trend of throttled partitions (offsets/s over 15m)", "short",
              "deriv(sluice_throttle_sum_lag_offsets[15m]): below 0 the fetchers are catching up; at or above 0 "
              "while partitions are held back the lag is not falling (alert SluiceThrottledLagNotFalling).",
              [(f"deriv({sel('sluice_throttle_sum_lag_offsets')}[15m])", "{{instance}}")], min_zero=False),
    ]),
    Row("Rejected frames and access log", [
        Panel("Rejected frames/s by reason", "cps",
              "sluice_frames_rejected_total: each closed one connection (too_large, malformed, unknown_api, "
              "unsupported_version, request_timeout, upstream_closed). Alert: SluiceFramesRejected. "
              "sluice_policy_errors_total: a policy raised (a bug: the log's policy_failed event says where); "
              "each closed one connection.",
              [(rate("sluice_frames_rejected_total", by="reason"), "{{reason}}"),
               (rate("sluice_policy_errors_total", by="policy, api") + " or on() vector(0)",
                "policy error: {{policy}} {{api}}")]),
        Panel("APIs withheld from clients/s by API", "cps",
              "sluice_api_withheld_total: ApiVersions responses that left an API out (no version both Sluice and "
              "the broker speak); clients then never use it. The log's api_withheld event gives both ranges. "
              "0 while nothing was ever withheld.",
              # An API's series exists only once it was withheld (the label values are whatever the broker offers),
              # so a healthy Sluice has none: 0 then, rather than "No data".
              [(rate("sluice_api_withheld_total", by="api") + " or on() vector(0)", "{{api}}")]),
        Panel("Access-log events dropped/s by reason", "cps",
              "sluice_access_log_dropped_total: access-log events lost: write_failed (file or stdout), and the "
              "Kafka sink's buffer_full, delivery_failed, stopped. Alert: SluiceAccessLogDropping.",
              [(rate("sluice_access_log_dropped_total", by="reason"), "{{reason}}")]),
        Panel("Access-log events buffered for Kafka", "short",
              "sluice_access_log_buffered_events: events in the Kafka sink's buffer, not yet acknowledged by the "
              "cluster; rising toward logging.access_log_kafka.buffer_events means drops are next.",
              [(f"sum by (instance) ({sel('sluice_access_log_buffered_events')})", "{{instance}}")]),
    ]),
    Row("Security and connection limits", [
        Panel("Connections refused/s by reason", "cps",
              "sluice_connections_refused_total: client connections closed before their first request: "
              "max_connections, max_connections_per_address (limits, at accept), proxy_protocol (no valid PROXY "
              "header), tls_handshake (failed handshake: wrong CA, expired or missing client certificate).",
              [(rate("sluice_connections_refused_total", by="reason"), "{{reason}}")], width=6),
        Panel("Connections closed by limits/s", "cps",
              "sluice_connections_closed_total: idle (limits.idle_timeout_s); sluice_inflight_limited_total: "
              "times a connection reached limits.max_inflight_requests and was not read meanwhile.",
              [(rate("sluice_connections_closed_total", by="reason"), "closed: {{reason}}"),
               (rate("sluice_inflight_limited_total"), "in-flight bound reached")], width=6),
        Panel("SASL authentications/s", "cps",
              "sluice_sasl_authentications_total: SASL exchanges relayed that the broker accepted and whose "
              "principal Sluice read (first authentications and KIP-368 re-authentications).",
              [(rate("sluice_sasl_authentications_total"), "accepted")], width=6),
        Panel("Certificate reloads", "short",
              "sluice_tls_reloads_total by outcome over the range: reloaded (new connections use the new files), "
              "failed (the files in use stay; see the tls_reload_failed log event).",
              [(f"sum by (outcome) (increase({sel('sluice_tls_reloads_total')}[1h]))", "{{outcome}}")],
              width=6),
    ]),
    Row("Upstream health", [
        Panel("Upstream connect errors/s", "cps",
              "sluice_upstream_connect_errors_total: failed connects to brokers (refused, unreachable, timeout). "
              "Alerts: SluiceUpstreamDown, SluiceUpstreamConnectErrors.",
              [(rate("sluice_upstream_connect_errors_total"), "connect errors")], width=6),
        Panel("Connections open", "none",
              "sluice_connections_open (client = accepted from clients, upstream = to brokers) and "
              "sluice_connections_total opened per second.",
              [(f"sum by (side) ({sel('sluice_connections_open')})", "open: {{side}}"),
               (rate("sluice_connections_total", by="side"), "opened/s: {{side}}")], width=6),
        Panel("Topic-name lookups/s by outcome", "cps",
              "sluice_topic_name_lookups_total: topic ids Sluice looked up itself (Fetch v13+ from connections "
              "that never send Metadata): resolved, unknown, failed (no answer from the cluster).",
              [(rate("sluice_topic_name_lookups_total", by="outcome"), "{{outcome}}")], width=6),
        Panel("Listeners open", "none",
              "sluice_listeners: the bootstrap listener plus one per broker node.",
              [(f"sum by (instance) ({sel('sluice_listeners')})", "{{instance}}")], width=6),
    ]),
    Row("Fleet", [
        Panel("Instances reporting", "none",
              "Instances of the fleet Prometheus scrapes ([fleet] enabled: sluice_fleet_revision is exported), and "
              "those that reach the control cluster (sluice_fleet_control_reachable). `sluice fleet status` shows "
              "the fleet as its status topic has it (up, lagging, silent).",
              [(f"count({sel('sluice_fleet_control_reachable')})", "instances"),
               (f"sum({sel('sluice_fleet_control_reachable')})", "control reachable")], width=6),
        Panel("Revision applied per instance", "none",
              "sluice_fleet_revision: the fleet revision of each run-time changeable section each instance applied; "
              "an instance below the others lags (or cannot reach the control cluster).",
              [(f"max by (instance, section) ({sel('sluice_fleet_revision')})", "{{instance}} {{section}}")],
              width=6),
        Panel("Control records/s: applied, skipped by reason", "cps",
              "sluice_fleet_records_applied_total per section and sluice_fleet_records_skipped_total per reason "
              "(garbage, schema, fleet, section, stale, invalid, tombstone: never applied, the last good settings "
              "stay; the fleet_record_skipped log event says which record).",
              [(rate("sluice_fleet_records_applied_total", by="section"), "applied: {{section}}"),
               (rate("sluice_fleet_records_skipped_total", by="reason"), "skipped: {{reason}}")], width=6),
        Panel("Fleet writes and status records", "none",
              "sluice_fleet_writes_total: admin changes this instance wrote to the control topic, per outcome "
              "(written, conflict: based on an older revision, refused: not authorized, failed); "
              "sluice_fleet_status_published_total: status records published.",
              [(f"sum by (outcome) (increase({sel('sluice_fleet_writes_total')}[1h]))", "{{outcome}}"),
               (f"sum(increase({sel('sluice_fleet_status_published_total')}[1h]))", "status records")], width=6),
    ]),
]


def variable(name: str, label: str, query: str) -> dict[str, Any]:
    """A Prometheus label_values variable: multi-value, "All" (= the regex ``.+``) by default."""
    return {
        "name": name, "label": label, "type": "query", "datasource": DATASOURCE,
        "definition": query, "query": query, "refresh": 2, "regex": "", "sort": 1,
        "multi": True, "includeAll": True, "allValue": ".+",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]}, "options": [], "hide": 0,
    }


def panel_json(p: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    targets = [{"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": expr, "legendFormat": legend,
                "range": True, "instant": False} for i, (expr, legend) in enumerate(p.targets)]
    out: dict[str, Any] = {
        "id": panel_id, "type": p.kind, "title": p.title, "description": p.description, "datasource": DATASOURCE,
        "gridPos": {"h": p.height, "w": p.width, "x": x, "y": y},
    }
    if p.kind == "stat":
        steps: list[dict[str, Any]] = [{"color": "green", "value": None}]
        if p.red_from is not None:
            steps.append({"color": "red", "value": p.red_from})
        out["fieldConfig"] = {"defaults": {"unit": p.unit, "color": {"mode": "thresholds"},
                                           "thresholds": {"mode": "absolute", "steps": steps}},
                              "overrides": []}
        out["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                          "colorMode": "value", "graphMode": "area", "textMode": "auto", "justifyMode": "auto",
                          "orientation": "auto"}
    else:
        out["fieldConfig"] = {"defaults": {"unit": p.unit, "min": 0 if p.min_zero else None,
                                           "custom": {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10,
                                                      "showPoints": "never", "spanNulls": False}},
                              "overrides": []}
        out["options"] = {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                          "tooltip": {"mode": "multi", "sort": "desc"}}
    out["targets"] = targets
    return out


def dashboard() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    y = 0
    next_id = 1
    for row in ROWS:
        panels.append({"id": next_id, "type": "row", "title": row.title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        next_id += 1
        y += 1
        x, line_height = 0, 0
        for p in row.panels:
            if x + p.width > 24:
                x, y = 0, y + line_height
                line_height = 0
            panels.append(panel_json(p, next_id, x, y))
            next_id += 1
            x += p.width
            line_height = max(line_height, p.height)
        y += line_height
    return {
        "uid": "sluice",
        "title": "Sluice",
        "description": "Sluice, the Kafka wire-protocol proxy: traffic, latency, KIP-74 size limits, KIP-227 fetch "
                       "sessions, KIP-73 throttles, starvation, rejected frames, upstream health. Generated by "
                       "config/grafana/dashboard.py.",
        "tags": ["sluice", "kafka"],
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "links": [],
        "annotations": {"list": [{
            "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True, "hide": True,
            "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard"}]},
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
             "current": {}, "options": [], "refresh": 1, "regex": "", "hide": 0, "multi": False,
             "includeAll": False},
            variable("job", "Job", "label_values(sluice_build_info, job)"),
            variable("instance", "Instance", 'label_values(sluice_build_info{job=~"$job"}, instance)'),
        ]},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT}")
