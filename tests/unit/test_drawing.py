"""Charts drawn by the report's worker process (proxy/analytics/drawing.py): the same PNG as drawn in the driver,
and drawn in the driver when the worker is gone."""

from __future__ import annotations

import os
import signal
from datetime import UTC, datetime, timedelta

from proxy.analytics import charts, drawing
from proxy.analytics.html import Chart, Section, render

TIMES = [datetime(2026, 11, 30, 8, 0, tzinfo=UTC) + timedelta(minutes=i) for i in range(5)]


def test_a_chart_drawn_by_the_worker_is_the_one_drawn_here() -> None:
    drawn = drawing.draw(charts.time_series, "Bytes", TIMES, {"a": [1.0, 2.0, 3.0, 2.0, 1.0]}, ylabel="bytes/s")
    here = charts.time_series("Bytes", TIMES, {"a": [1.0, 2.0, 3.0, 2.0, 1.0]}, ylabel="bytes/s")
    assert drawn.png() == here
    # the page holds the same image either way
    page = render("t", "m", [Section("s", "S", charts=[Chart("c", drawn)])])
    assert page == render("t", "m", [Section("s", "S", charts=[Chart("c", here)])])


def test_charts_of_a_worker_that_died_are_drawn_here_and_the_next_ones_by_a_new_worker() -> None:
    first = drawing.draw(charts.bars, "Top", ["a", "b"], [1.0, 2.0], xlabel="bytes")
    assert first.png() == charts.bars("Top", ["a", "b"], [1.0, 2.0], xlabel="bytes")
    pool = drawing._worker()
    assert pool is not None
    pids = list(pool._processes)  # the worker started for the chart above
    assert pids
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    lost = drawing.draw(charts.bars, "Top", ["a", "b", "c"], [1.0, 2.0, 3.0], xlabel="bytes")
    assert lost.png() == charts.bars("Top", ["a", "b", "c"], [1.0, 2.0, 3.0], xlabel="bytes")
    after = drawing.draw(charts.bars, "Top", ["c"], [3.0], xlabel="bytes")
    assert after.png() == charts.bars("Top", ["c"], [3.0], xlabel="bytes")
    again = drawing._worker()
    assert again is not None and not set(again._processes) & set(pids)
