"""bench/support/verdict.py: the check every bench's summary carries fails on each planted fault (a dropped partition, a
duplicate, a gap, a record out of order, a changed record) and passes on the real thing; goals are met only by
figures that are there and on the right side; the exit status follows the check, and the goals with --check."""

from __future__ import annotations

import math

from bench.support.verdict import Delivery, at_least, at_most, delivery, exit_status, goals_met, summary

SENT = {0: [0, 1, 2, 3], 1: [0, 1, 2], 2: [0, 1]}


def test_every_record_once_in_order_is_correct() -> None:
    assert delivery(SENT, {0: [0, 1, 2, 3], 1: [0, 1, 2], 2: [0, 1]}) == Delivery()
    # the order between partitions is not an order
    assert delivery(SENT, {2: [0, 1], 0: [0, 1, 2, 3], 1: [0, 1, 2]}).ok


def test_a_dropped_partition_is_lost() -> None:
    assert delivery(SENT, {0: [0, 1, 2, 3], 1: [0, 1, 2]}) == Delivery(lost=2)
    assert delivery(SENT, {}) == Delivery(lost=9)  # nothing arrived: nothing passes


def test_a_duplicate_and_a_gap_are_both_seen() -> None:
    # a count that stops at 4 would call this complete: the duplicate of 1 hides the missing 2
    assert delivery({0: [0, 1, 2, 3]}, {0: [0, 1, 1, 3]}) == Delivery(lost=1, duplicated=1)
    # a late duplicate, after the last record
    assert delivery({0: [0, 1, 2]}, {0: [0, 1, 2, 0]}) == Delivery(duplicated=1)


def test_a_record_out_of_order_and_a_changed_record() -> None:
    assert delivery({0: ["a", "b", "c"]}, {0: ["a", "c", "b"]}) == Delivery(out_of_order=1)
    assert delivery({0: ["a", "b"]}, {0: ["a", "B"]}) == Delivery(lost=1, unexpected=1)
    assert delivery({0: ["a"]}, {0: ["a"], 7: ["x"]}) == Delivery(unexpected=1)


def test_deliveries_add_up() -> None:
    assert Delivery(1, 0, 2, 0) + Delivery(0, 3, 0, 1) == Delivery(1, 3, 2, 1)


def test_goals_are_met_by_figures_that_are_there() -> None:
    figures = {"ratio": 0.97, "error": 0.05, "by": {"confluent": 1.2}, "none": None, "nan": math.nan}
    assert goals_met({"ratio": at_least(0.95), "error": at_most(0.05), "by.confluent": at_least(1.0)}, figures)
    assert not goals_met({"ratio": at_least(0.98)}, figures)
    assert not goals_met({"error": at_most(0.04)}, figures)
    for missing in ("absent", "by.kafka-python", "none", "nan"):
        assert not goals_met({missing: at_most(1.0)}, figures), missing
    assert not goals_met({"flag": at_least(0)}, {"flag": True})  # a boolean is not a figure
    assert goals_met({}, figures)


def test_summary_and_exit_status() -> None:
    good = summary("x", {"ratio": 0.9}, {"ratio": at_least(0.95)}, check=Delivery(), checks={"equal": True})
    assert good == {"summary": "x", "ratio": 0.9, "goals": {"ratio": ">= 0.95"}, "met": False, "lost": 0,
                    "duplicated": 0, "out_of_order": 0, "unexpected": 0, "equal": True, "errors": [],
                    "correct": True}
    assert (exit_status(good, check_goals=False), exit_status(good, check_goals=True)) == (0, 1)
    for bad in (summary("x", {}, {}, check=Delivery(duplicated=1)), summary("x", {}, {}, checks={"equal": False}),
                summary("x", {}, {}, errors=["a client failed"])):
        assert not bad["correct"] and exit_status(bad, check_goals=False) == 1
