"""bench.passthrough's pure logic without a broker (never a timing): its goals through the shared verdict, a ratio
that psutil's ticks leave undefined missing its goal, and the produce-latency send order (seeded, each path once per
send, each path after each other one about equally often). The measurement itself runs as ``python -m
bench.passthrough``."""

from __future__ import annotations

import itertools
from collections import Counter

from bench.passthrough import GOALS, GOALS_ALL_POLICIES, ratio, send_orders
from bench.support.verdict import Delivery, summary


def test_met_only_when_every_goal_holds() -> None:
    good = {"added_p50_over_bare_ms": 0.02, "cpu_per_send_vs_bare": 1.3, "consume_vs_bare": 1.0}
    assert summary("passthrough", good, GOALS, check=Delivery())["met"] is True
    for name, worse in (("added_p50_over_bare_ms", 0.021), ("cpu_per_send_vs_bare", 1.31), ("consume_vs_bare", 0.99)):
        assert summary("passthrough", {**good, name: worse}, GOALS, check=Delivery())["met"] is False


def test_a_ratio_without_a_baseline_misses_its_goal() -> None:
    # --smoke's runs may see no psutil tick of a relay's CPU: no ratio, not an infinite or zero one
    assert ratio(131.8, 63.6) == 2.072
    assert ratio(1.0, 0.0) is None and ratio(float("nan"), 1.0) is None
    line = summary("passthrough", {"consume_vs_passthrough": 0.97, "cpu_per_send_vs_passthrough": ratio(1.0, 0.0)},
                   GOALS_ALL_POLICIES, check=Delivery())
    assert line["goals"] == {"consume_vs_passthrough": ">= 0.95", "cpu_per_send_vs_passthrough": "<= 1.5"}
    assert line["met"] is False and line["correct"] is True


def test_sends_take_the_paths_in_a_seeded_shuffled_order() -> None:
    paths = ["direct", "sluice", "bare", "haproxy"]
    orders = list(itertools.islice(send_orders(paths), 6000))
    assert orders == list(itertools.islice(send_orders(paths), 6000))  # seeded: every run sends alike
    assert all(sorted(order) == sorted(paths) for order in orders)
    # each path right after each other one about equally often (a rotated order puts one path after Sluice always)
    after = Counter((a, b) for order in orders for a, b in itertools.pairwise(order))
    assert len(after) == 12
    assert max(after.values()) < 1.1 * min(after.values())
