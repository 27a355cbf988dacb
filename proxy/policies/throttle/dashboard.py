"""The throttle policy's row of Sluice's Grafana dashboard (``Registration.dashboard``)."""

from __future__ import annotations

from ...dashboard import Panel, Row, rate, sel

ROW = Row("Replication throttles (KIP-73)", [
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
    Panel("Lag trend of throttled partitions (offsets/s over 15m)", "short",
          "deriv(sluice_throttle_sum_lag_offsets[15m]): below 0 the fetchers are catching up; at or above 0 "
          "while partitions are left out the lag is not falling (alert SluiceThrottledLagNotFalling): starving "
          "partitions (alert SluicePartitionStarving). Per-partition detail: the access log's partitions field, "
          "sluice report.",
          [(f"deriv({sel('sluice_throttle_sum_lag_offsets')}[15m])", "{{instance}}")], width=24, min_zero=False),
])
