"""bench/fleet.py's figures: nearest-rank percentiles, and a summary whose check fails when an instance missed a change
or a change failed, and whose goal is the p99."""

from __future__ import annotations

from bench.fleet import percentile, summary


def test_percentiles_are_nearest_rank() -> None:
    values = [float(x) for x in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 99), percentile(values, 100)) == (50.0, 99.0, 100.0)
    assert percentile([0.3], 99) == 0.3


def test_a_missed_application_fails_the_summary() -> None:
    good = {"put_s": 1.0, "apply_s": [0.1, 0.2], "missed": 0}
    assert summary([good], 2) | {"met": True} == summary([good], 2)
    assert summary([good], 2)["correct"]
    missed = summary([good, {"put_s": 1.0, "apply_s": [0.1], "missed": 1}], 2)
    assert (missed["missed"], missed["correct"]) == (1, False)
    failed = summary([good, {"error": "PUT answered 409"}], 2)
    assert (failed["missed"], failed["errors"], failed["correct"]) == (2, ["PUT answered 409"], False)
    slow = summary([{"put_s": 1.0, "apply_s": [3.0, 0.1], "missed": 0}], 2)
    assert (slow["apply_p99_s"], slow["met"], slow["correct"]) == (3.0, False, True)
