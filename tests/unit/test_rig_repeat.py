"""rig/repeat.py's table (``make test-repeat``): failures and errors counted per test over runs, with the first
failure's message, and runs that left no report listed, from pytest's own JUnit XML."""

from __future__ import annotations

from pathlib import Path

from rig.repeat import Table

RUN_1 = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.clients.test_sharing" name="test_a[kafka-python]" time="1.0">
<failure message="AssertionError: 3 records not received&#10;consumer x: exited 1">trace</failure></testcase>
<testcase classname="tests.clients.test_sharing" name="test_b" time="1.0"/>
</testsuite></testsuites>"""

RUN_2 = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.clients.test_sharing" name="test_a[kafka-python]" time="1.0"/>
<testcase classname="tests.clients.test_sharing" name="test_b" time="1.0">
<error message="failed on teardown">trace</error></testcase>
</testsuite></testsuites>"""


def test_failures_and_errors_are_counted_per_test_over_runs(tmp_path: Path) -> None:
    table = Table()
    for run, xml in ((1, RUN_1), (2, RUN_2)):
        path = tmp_path / f"run-{run}.xml"
        path.write_text(xml)
        table.runs += 1
        table.read(run, path)
    table.runs += 1
    table.lost.append((3, "exit timed out"))
    a, b = "tests.clients.test_sharing::test_a[kafka-python]", "tests.clients.test_sharing::test_b"
    assert table.seen == {a: 2, b: 2}
    assert table.failed == {a: 1, b: 1}
    assert table.first[a] == "run 1: AssertionError: 3 records not received"  # the message's first line
    lines = table.lines()
    assert lines[0] == "# 3 runs, 2 tests, 4 test runs, 2 failures, 1 runs without a report"
    assert any(line.split()[:2] == ["1", "2"] and a in line for line in lines)
    assert lines[-1].endswith("run 3 ended without a report: exit timed out")


def test_a_clean_table_says_so() -> None:
    table = Table(runs=5)
    assert table.lines()[-1].split() == ["0", "5", "every", "test,", "every", "run"]
