"""bench/fleet.py's figures: nearest-rank percentiles, goals met or not, and a check that fails when an instance
missed a change or does not end at the last one."""

from __future__ import annotations

from bench.fleet import percentile, summary


def test_percentiles_are_nearest_rank() -> None:
    values = [float(x) for x in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 99), percentile(values, 100)) == (50.0, 99.0, 100.0)
    assert percentile([0.3], 99) == 0.3


def test_goals_and_the_check_are_judged_from_the_figures_and_what_the_instances_show() -> None:
    good = [{"revision": 3, "rate": 7, "put_s": 1.0, "apply_s": [0.1, 0.2], "missed": 0},
            {"revision": 9, "rate": 8, "put_s": 1.0, "apply_s": [0.3, 1.5], "missed": 0}]
    at_last = [{"revision": 9, "leader_rate_bytes": 8}] * 2
    result = summary(good, 2, at_last)
    assert result["correct"] and result["met"] is False  # p99 1.5 s over its goal of 1 s; max within 2 s
    assert (result["apply_p99_s"], result["apply_max_s"]) == (1.5, 1.5)
    assert summary([{**good[1], "apply_s": [0.3, 0.9]}], 2, at_last)["met"] is True
    missed = summary([good[0], {**good[1], "apply_s": [0.3], "missed": 1}], 2, at_last)
    assert (missed["missed"], missed["correct"]) == (1, False)
    behind = summary(good, 2, [at_last[0], {"revision": 3, "leader_rate_bytes": 7}])
    assert not behind["correct"] and behind["instances_behind"] == [1]
    back = summary([good[1], good[0]], 2, [{"revision": 3, "leader_rate_bytes": 7}] * 2)
    assert not back["correct"] and back["revisions_increasing"] is False
    failed = summary([{"error": "PUT answered 503"}], 2, at_last)
    assert not failed["correct"] and failed["errors"] == ["PUT answered 503"]
