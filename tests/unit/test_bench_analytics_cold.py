"""bench.analytics --cold's summary from its runs: the means a side, the speedups against --compare's revision, and
the check (every run read every line; the tables equal). Its runs themselves start `sluice report` (a JVM each):
measured by hand, not in the unit tests."""

from __future__ import annotations

import argparse
from typing import Any

from bench.analytics import cold_summary


def _run(seconds: float, valid: int = 1000, malformed: int = 1) -> dict[str, Any]:
    return {"seconds": seconds, "lines": valid + malformed, "valid": valid, "malformed": malformed}


def _args(compare: str | None) -> argparse.Namespace:
    return argparse.Namespace(rows=1000, compare=compare)


def test_the_means_and_speedups_of_both_sides() -> None:
    runs = {"baseline_landed": [_run(32.0), _run(31.0)], "current_landed": [_run(30.0), _run(29.0)],
            "baseline_json": [_run(66.0), _run(67.0)], "current_json": [_run(65.0), _run(64.0)]}
    line = cold_summary(_args("abc123"), runs, True, malformed=1)
    assert (line["landed_s"], line["json_s"]) == (29.5, 64.5)
    assert (line["baseline_landed_s"], line["baseline_json_s"]) == (31.5, 66.5)
    assert (line["speedup_landed"], line["speedup_json"]) == (round(31.5 / 29.5, 3), round(66.5 / 64.5, 3))
    assert line["correct"] and line["tables_equal"] and line["every_line_read"] and line["goals"] == {}


def test_a_run_that_missed_lines_or_tables_that_differ_fail_the_check() -> None:
    runs = {"current_landed": [_run(30.0), _run(29.0, valid=999)], "current_json": [_run(65.0)]}
    line = cold_summary(_args(None), runs, True, malformed=1)
    assert not line["every_line_read"] and not line["correct"] and "speedup_landed" not in line
    line = cold_summary(_args(None), {"current_landed": [_run(30.0)], "current_json": [_run(65.0)]}, False,
                        malformed=1)
    assert line["every_line_read"] and not line["tables_equal"] and not line["correct"]
