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
from pathlib import Path
from typing import Any

from proxy.app import REGISTRY
from proxy.dashboard import DATASOURCE, FILTER, Panel, Row, quantile, rate, sel

OUT = Path(__file__).resolve().parent / "dashboards" / "sluice.json"

#: the core's rows before the policies' (each registration's ``dashboard``, in chain order) and after them
HEAD_ROWS = [
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
              "docs/operations.md, Grafana dashboard and alerts.",
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
]
TAIL_ROWS = [
    Row("Rejected frames and access log", [
        Panel("Rejected frames/s by reason", "cps",
              "sluice_frames_rejected_total: each closed one connection (too_large, malformed, unknown_api, "
              "unsupported_version, request_timeout, upstream_closed, refused). Alert: SluiceFramesRejected. "
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
              "the fleet as its status topic has it (up, lagging, drift, silent).",
              [(f"count({sel('sluice_fleet_control_reachable')})", "instances"),
               (f"sum({sel('sluice_fleet_control_reachable')})", "control reachable")], width=6),
        Panel("Revision applied per instance", "none",
              "sluice_fleet_revision: the revision (its record's offset + 1) of each run-time changeable section's "
              "latest record each instance folded; an instance below the others lags (or cannot reach the control "
              "cluster).",
              [(f"max by (instance, section) ({sel('sluice_fleet_revision')})", "{{instance}} {{section}}")],
              width=6),
        Panel("Control records/s: applied, skipped by reason", "cps",
              "sluice_fleet_records_applied_total per section (a tombstone too: the section back to the local "
              "settings) and sluice_fleet_records_skipped_total per reason (garbage, schema, fleet, section, stale, "
              "invalid: never applied, the last good settings stay; the fleet_record_skipped log event says which "
              "record).",
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
ROWS = [*HEAD_ROWS, *(r.dashboard for r in REGISTRY if r.dashboard is not None), *TAIL_ROWS]



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
