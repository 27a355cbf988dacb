"""The quota policy's row of Sluice's Grafana dashboard (``Registration.dashboard``)."""

from __future__ import annotations

from ...dashboard import Panel, Row, rate, sel

ROW = Row("Client quotas (KIP-13, KIP-219)", [
    Panel("Quota bytes/s by entry", "Bps",
          "sluice_quota_bytes_total: Produce request bytes and Fetch and ShareFetch response bytes counted "
          "against each [[quota.entries]] entry's quota of that kind.",
          [(rate("sluice_quota_bytes_total", by="entry, kind"), "{{entry}} {{kind}}")], width=8),
    Panel("Quota requests/s by entry", "reqps",
          "sluice_quota_requests_total: Produce, Fetch, ShareFetch and ShareAcknowledge requests of the clients "
          "each entry governs (for any kind).",
          [(rate("sluice_quota_requests_total", by="entry, api"), "{{entry}} {{api}}")], width=8),
    Panel("Share of time throttled by entry", "percentunit",
          "sluice_quota_throttle_seconds_total: throttle time applied per second (1 = one client held all the "
          "time; above 1, several); sluice_quota_throttled_total: throttled responses/s. Alert: "
          "SluiceQuotaHoldsClient.",
          [(rate("sluice_quota_throttle_seconds_total", by="entry, api"), "{{entry}} {{api}} held"),
           (rate("sluice_quota_throttled_total", by="entry, api"), "{{entry}} {{api}} throttled/s")], width=8),
    Panel("Fleet quotas", "none",
          "With fleet-scoped quotas: sluice_quota_fleet_live_instances, the instances sharing them as each one "
          "sees it; sluice_quota_fleet_usage_reachable, 0 while an instance cannot read its own usage reports "
          "(it holds quota / instances last live); sluice_quota_fleet_fallbacks_total, such losses; "
          "sluice_quota_fleet_reports_skipped_total, usage records that are no report.",
          [(f"min({sel('sluice_quota_fleet_live_instances')})", "live instances (min)"),
           (f"min({sel('sluice_quota_fleet_usage_reachable')})", "usage topic reachable (min)"),
           (f"sum(increase({sel('sluice_quota_fleet_fallbacks_total')}[$__range]))", "fallbacks"),
           (f"sum(increase({sel('sluice_quota_fleet_reports_skipped_total')}[$__range]))", "reports skipped")],
          width=8, kind="stat"),
])
