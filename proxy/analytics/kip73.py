"""Replication-throttle sizing from observed inbound rates, with KIP-73's sizing formulas.

KIP-73 ("Replication Quotas") gives an operator two rules for picking the throttle T (bytes/s per broker):

- Move time: ``move time = bytes to move / (T - IN)``, IN the broker's inbound (keep-up) rate. Throttled
  replication must first keep up with new writes; only what is left over, T - IN, moves the backlog. As T
  approaches IN the move never finishes.
- Safe range: ``IN < T < N - IN/R``, N the network throughput and R the replication factor. Above IN so
  catch-up and keep-up traffic both fit; below N - IN/R so the (unthrottled) inbound traffic of the leaders a
  broker may end up with still fits on the link.

IN is measured, not assumed: the rate of ``bytes_upstream_to_proxy`` (bytes the brokers sent through Sluice) per
upstream broker over fixed windows, and the busiest broker's peak window is used, because the rule has to hold
for every broker at its worst moment. Everything here is plain arithmetic on numbers the Spark job collected.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from proxy.analytics.units import fmt_bytes, fmt_duration, fmt_rate
from proxy.policies.throttle.sizing import move_time_s, required_throttle_bps, safe_range

__all__ = [
    "InboundRate",
    "Recommendation",
    "ThrottleInputs",
    "move_time_s",
    "recommend",
    "required_throttle_bps",
    "safe_range",
]

GIB = 2**30
TIB = 2**40
EXAMPLE_MOVES = (10 * GIB, 100 * GIB, TIB)  # shown when the operator gave no move size
EXAMPLE_POSITIONS = (0.25, 0.5, 0.75)  # of the safe range, for the example throttles


@dataclass(frozen=True)
class InboundRate:
    """Observed inbound rate of one upstream broker, over ``window_s``-second windows."""

    upstream: str
    peak_bps: float
    p95_bps: float
    mean_bps: float
    windows: int
    window_s: int


@dataclass(frozen=True)
class ThrottleInputs:
    """What the logs cannot tell: the link, the replication factor, and the move being planned."""

    network_bps: float = 125_000_000.0  # 1 Gbit/s, the common floor for broker NICs
    replication_factor: int = 3
    move_bytes: int | None = None
    move_within_s: float = 3600.0  # "what throttle would finish this move in an hour"


@dataclass(frozen=True)
class Recommendation:
    inbound_bps: float
    busiest_upstream: str | None
    low_bps: float  # IN
    high_bps: float  # N - IN/R
    feasible: bool  # low < high: some safe throttle exists
    inputs: ThrottleInputs
    throttle_bps: float | None  # recommended T (only with a move size and a feasible range)
    move_time_s: float | None  # of the planned move at throttle_bps (or at the top of the range if it misses)
    examples: list[tuple[float, int, float]] = field(default_factory=list)  # (T, bytes, move time s)
    text: list[str] = field(default_factory=list)  # paragraphs for the report, plain text


def _round_up_2sig(x: float) -> float:
    """Round up to two significant figures: throttles are typed by people, and up keeps the deadline."""
    if x <= 0:
        return x
    step = 10 ** (math.floor(math.log10(x)) - 1)
    return math.ceil(x / step - 1e-9) * step


def recommend(rates: list[InboundRate], inputs: ThrottleInputs) -> Recommendation:
    busiest = max(rates, key=lambda r: r.peak_bps, default=None)
    inbound = busiest.peak_bps if busiest is not None else 0.0
    low, high = safe_range(inbound, inputs.network_bps, inputs.replication_factor)
    feasible = low < high
    text: list[str] = []
    if busiest is None:
        text.append("No inbound traffic in these logs (no bytes_upstream_to_proxy): IN = 0 B/s.")
    else:
        text.append(
            f"Inbound rate IN: the busiest upstream broker, {busiest.upstream}, peaked at {fmt_rate(busiest.peak_bps)} "
            f"(p95 {fmt_rate(busiest.p95_bps)}, mean {fmt_rate(busiest.mean_bps)}) over {busiest.windows} "
            f"{busiest.window_s}-second window(s) of bytes_upstream_to_proxy. The peak is used because the rule must "
            f"hold for every broker at its busiest."
        )
    n_text = f"N = {fmt_rate(inputs.network_bps)}, R = {inputs.replication_factor}"
    if feasible:
        text.append(
            f"Safe throttle range (KIP-73, IN < T < N - IN/R, {n_text}): "
            f"{fmt_rate(low)} < T < {fmt_rate(high)}."
        )
    else:
        text.append(
            f"No safe throttle exists (KIP-73 needs IN < N - IN/R, {n_text}): inbound traffic alone is "
            f"too close to the network's capacity. Add capacity or move load before moving replicas."
        )
    text.append(
        "Move time (KIP-73): time = bytes to move / (T - IN). Replication first keeps up with new writes "
        "(IN); only T - IN moves the backlog, so a throttle at or below IN never finishes."
    )

    throttle: float | None = None
    move_time: float | None = None
    examples: list[tuple[float, int, float]] = []
    if inputs.move_bytes is not None:
        need = required_throttle_bps(inputs.move_bytes, inputs.move_within_s, inbound)
        goal = f"To move {fmt_bytes(inputs.move_bytes)} within {fmt_duration(inputs.move_within_s)}"
        if feasible and need < high:
            rounded = _round_up_2sig(need)
            throttle = rounded if rounded < high else need
            move_time = move_time_s(inputs.move_bytes, throttle, inbound)
            text.append(
                f"{goal}, T must be at least IN + bytes/time = {fmt_rate(need)}. Recommended throttle: "
                f"{fmt_rate(throttle)}, which finishes in {fmt_duration(move_time)} and stays inside the safe "
                f"range. Apply it with: kafka-configs --alter --entity-type brokers --entity-name <id> "
                f"--add-config 'leader.replication.throttled.rate={throttle:.0f},"
                f"follower.replication.throttled.rate={throttle:.0f}'."
            )
        elif feasible:
            move_time = move_time_s(inputs.move_bytes, high, inbound)
            text.append(
                f"{goal}, T would have to be {fmt_rate(need)}, above the safe range. At its top "
                f"({fmt_rate(high)}) the move takes {fmt_duration(move_time)}: allow more time, move fewer "
                f"partitions at once, or add network capacity."
            )
        else:
            text.append(f"{goal}: not possible safely (no safe throttle exists).")
    if feasible:
        sizes = (inputs.move_bytes,) if inputs.move_bytes is not None else EXAMPLE_MOVES
        for pos in EXAMPLE_POSITIONS:
            t = low + pos * (high - low)
            for size in sizes:
                examples.append((t, size, move_time_s(size, t, inbound)))
    return Recommendation(
        inbound_bps=inbound,
        busiest_upstream=busiest.upstream if busiest is not None else None,
        low_bps=low,
        high_bps=high,
        feasible=feasible,
        inputs=inputs,
        throttle_bps=throttle,
        move_time_s=move_time,
        examples=examples,
        text=text,
    )
