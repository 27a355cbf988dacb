"""The share groups policy's row of Sluice's Grafana dashboard (``Registration.dashboard``)."""

from __future__ import annotations

from ...dashboard import Panel, Row, rate

ROW = Row("Share groups (KIP-932)", [
    Panel("Share records acquired and acknowledged/s", "cps",
          "sluice_share_records_acquired_total: records ShareFetch responses acquired for their consumers; "
          "sluice_share_records_acknowledged_total by api and type (accept, release, reject, gap, renew): "
          "the acknowledgements consumers sent.",
          [(rate("sluice_share_records_acquired_total"), "acquired"),
           # no series until a share consumer acknowledged something (labelled by api and type)
           (rate("sluice_share_records_acknowledged_total", by="type") + " or on() vector(0)",
            "acknowledged: {{type}}")], width=24),
])
