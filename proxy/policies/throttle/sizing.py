"""KIP-73's sizing formulas (move time, safe throttle range): one home for ``sluice throttle plan`` and the report.

A move of B bytes, throttled at T while inbound (produce) traffic IN keeps arriving, takes B / (T - IN): the
throttle carries both the catch-up and the keep-up traffic. A throttle is safe when IN < T < N - IN/R (N: the
network capacity, R: the replication factor): above IN so the move finishes, below N - IN/R so it leaves room
for live replication.
"""

from __future__ import annotations

import math


def move_time_s(move_bytes: float, throttle_bps: float, inbound_bps: float) -> float:
    """KIP-73's move time: bytes / (T - IN); infinite when T <= IN (the backlog never shrinks)."""
    spare = throttle_bps - inbound_bps
    return move_bytes / spare if spare > 0 else math.inf


def safe_range(inbound_bps: float, network_bps: float, replication_factor: int) -> tuple[float, float]:
    """KIP-73's safe throttle range: (IN, N - IN/R); empty (low >= high) when inbound traffic leaves no room."""
    if replication_factor < 1:
        raise ValueError("replication factor must be >= 1")
    return inbound_bps, network_bps - inbound_bps / replication_factor


def required_throttle_bps(move_bytes: float, within_s: float, inbound_bps: float) -> float:
    """The T at which the move takes exactly ``within_s``: IN + bytes / time (the move time solved for T)."""
    if within_s <= 0:
        raise ValueError("the time budget must be positive")
    return inbound_bps + move_bytes / within_s
