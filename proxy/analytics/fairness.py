"""Jain's fairness index over per-partition byte counts.

J(x) = (sum x)^2 / (n * sum x^2), for n >= 1 values x >= 0 (Jain, Chiu, Hawe 1984). It is 1 when every partition
got the same number of bytes and 1/n when one partition got everything; k equally served partitions out of n give
k/n, so "J = 0.25" reads as "as unfair as serving a quarter of the partitions". It ignores scale (bytes or MiB give
the same J), which is what makes it comparable across topics and runs.

The KIP-74 size limit promises progress for every partition; a low J over a long window, or partitions with fetches
but zero bytes, is how starvation would show in the access log.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["jain_index", "jain_index_from_sums"]


def jain_index_from_sums(n: int, total: float, total_sq: float) -> float | None:
    """J from n, sum x and sum x^2 (what one Spark aggregation yields); None when undefined (n = 0 or all zero)."""
    if n <= 0 or total_sq <= 0:
        return None
    return min(1.0, (total * total) / (n * total_sq))  # min(): float rounding can push equal shares past 1


def jain_index(values: Iterable[float]) -> float | None:
    """J over ``values`` (each >= 0); None when undefined."""
    n = 0
    total = 0.0
    total_sq = 0.0
    for v in values:
        if v < 0:
            raise ValueError(f"Jain's index is defined for non-negative values, got {v}")
        n += 1
        total += v
        total_sq += v * v
    return jain_index_from_sums(n, total, total_sq)
