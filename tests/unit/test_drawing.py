"""Charts drawn by the report's worker process (proxy/analytics/drawing.py): the same PNG as drawn in the driver,
and drawn in the driver when the worker is gone."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest

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
    worker = drawing._running()
    assert worker is not None
    worker.kill()
    lost = drawing.draw(charts.bars, "Top", ["a", "b", "c"], [1.0, 2.0, 3.0], xlabel="bytes")
    assert lost.png() == charts.bars("Top", ["a", "b", "c"], [1.0, 2.0, 3.0], xlabel="bytes")
    after = drawing.draw(charts.bars, "Top", ["c"], [3.0], xlabel="bytes")
    assert after.png() == charts.bars("Top", ["c"], [3.0], xlabel="bytes")
    assert drawing._running() is not worker  # a new worker drew it


def test_a_chart_that_fails_in_the_worker_fails_here_with_its_own_error() -> None:
    drawn = drawing.draw(charts.time_series, "Bytes", TIMES, {"a": [1.0]}, ylabel="bytes/s")  # 1 value, 5 times
    try:
        charts.time_series("Bytes", TIMES, {"a": [1.0]}, ylabel="bytes/s")
    except Exception as e:  # what matplotlib raises, whatever its type
        expected: type[Exception] = type(e)
    else:
        raise AssertionError("the chart was meant to fail")
    with pytest.raises(expected):
        drawn.png()


def test_charts_with_large_data_sent_faster_than_drawn_are_all_drawn() -> None:
    """Calls of ~100 KB each, sent while the worker's answers (PNGs) come back: both pipes fill (64 KiB each), and
    every chart must still come back (a write to the worker made while holding what the reading thread needs would
    wait for ever)."""
    times = [datetime(2026, 11, 30, tzinfo=UTC) + timedelta(seconds=i) for i in range(2000)]
    series = {f"s{k}": [float((i * (k + 1)) % 97) for i in range(2000)] for k in range(3)}
    done: list[bytes] = []

    def draw_all() -> None:
        drawn = [drawing.draw(charts.time_series, f"chart {n}", times, series, ylabel="bytes/s") for n in range(12)]
        done.extend(d.png() for d in drawn)

    runner = threading.Thread(target=draw_all, daemon=True)
    runner.start()
    runner.join(120)  # a bound on a hang, not a timing: the 12 charts take about a second
    assert not runner.is_alive(), f"{len(done)} of 12 charts came back"
    assert done[0] == charts.time_series("chart 0", times, series, ylabel="bytes/s")
