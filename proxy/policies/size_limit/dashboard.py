"""The size limit policy's row of Sluice's Grafana dashboard (``Registration.dashboard``)."""

from __future__ import annotations

from ...dashboard import Panel, Row, rate, sel

ROW = Row("Response-size limits (KIP-74)", [
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
          "sluice_response_memory_waits_total: fetches that waited for response memory "
          "(size_limit.global_max_bytes) before going upstream.",
          [(rate("sluice_size_limit_limited_responses_total"), "limited responses"),
           (rate("sluice_response_memory_waits_total"), "memory waits")], width=6),
    Panel("Response bytes held", "bytes",
          "sluice_response_bytes_held: fetch response bytes reserved or held, counted against "
          "size_limit.global_max_bytes.",
          [(f"sum({sel('sluice_response_bytes_held')})", "held")], width=6),
    Panel("Share fetches clamped/s", "cps",
          "sluice_size_limit_share_clamped_requests_total: ShareFetch requests whose MaxBytes a size budget "
          "lowered (share fetches are bounded on the request side only: a record cut from a response would "
          "stay acquired).",
          [(rate("sluice_size_limit_share_clamped_requests_total"), "clamped")], width=24),
])
