"""Time buckets for the over-time tables and charts.

One bucket size for the whole report, chosen from a fixed ladder of round sizes so that the span of the logs gives
at most ``max_buckets`` buckets: a 5-minute test run gets 5-second buckets, a day of logs 15-minute ones. Round
sizes keep buckets aligned to wall-clock boundaries (bucket start = floor(epoch seconds / size) * size), so two
reports over overlapping logs bucket the same request identically.
"""

from __future__ import annotations

__all__ = ["BUCKET_LADDER_S", "choose_bucket_seconds"]

BUCKET_LADDER_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400)


def choose_bucket_seconds(span_s: float, max_buckets: int = 120) -> int:
    """The smallest ladder size giving at most ``max_buckets`` buckets over ``span_s`` seconds (1 s minimum;
    a day once the ladder runs out, however long the span)."""
    if max_buckets < 1:
        raise ValueError("max_buckets must be >= 1")
    for size in BUCKET_LADDER_S:
        # +1: a span of exactly k sizes starting mid-bucket touches k + 1 buckets
        if span_s / size + 1 <= max_buckets:
            return size
    return BUCKET_LADDER_S[-1]
