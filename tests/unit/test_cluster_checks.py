"""The cluster tests' checks (tests/support/cluster_checks.py) fail on each planted fault and pass on the real thing:
checked over what was acknowledged, per partition of the topic, so a partition that delivered nothing, or nothing
delivered at all, fails them; a duplicate, a gap and a changed value fail the exactly-once check; the at-least-once
check allows a redelivery of the very records from an earlier offset and nothing else."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.support.cluster_checks import check_at_least_once_in_order, check_exactly

Check = Callable[[list[tuple[int, int, str]], list[tuple[int, int, str]], str, int], None]
ACKED = [(p, o, f"v{p}-{o}") for p in range(3) for o in range(4)]


def without(records: list[tuple[int, int, str]], partition: int) -> list[tuple[int, int, str]]:
    return [r for r in records if r[0] != partition]


def test_every_record_once_in_order_passes_both() -> None:
    check_exactly(ACKED, ACKED, "reader", 3)
    check_at_least_once_in_order(ACKED, ACKED, "member", 3)
    # a redelivery from an earlier offset, the very records again: at least once, in order
    check_at_least_once_in_order([*ACKED, (1, 2, "v1-2"), (1, 3, "v1-3")], ACKED, "member", 3)


@pytest.mark.parametrize("check", [check_exactly, check_at_least_once_in_order])
def test_a_dropped_partition_or_nothing_at_all_fails(check: Check) -> None:
    with pytest.raises(AssertionError, match="partition 1"):
        check(without(ACKED, 1), ACKED, "who", 3)
    with pytest.raises(AssertionError, match="partition 0"):
        check([], ACKED, "who", 3)
    with pytest.raises(AssertionError, match="harness"):  # nothing acknowledged at all: nothing to check
        check([], [], "who", 3)
    # nothing acknowledged to one partition (a sticky partitioner): it must deliver nothing, the others everything
    check(without(ACKED, 2), without(ACKED, 2), "who", 3)
    with pytest.raises(AssertionError, match="partition 2"):
        check(ACKED, without(ACKED, 2), "who", 3)


@pytest.mark.parametrize("check", [check_exactly, check_at_least_once_in_order])
def test_a_gap_and_a_changed_value_fail(check: Check) -> None:
    with pytest.raises(AssertionError):
        check([r for r in ACKED if r != (0, 2, "v0-2")], ACKED, "who", 3)
    with pytest.raises(AssertionError):
        check([(p, o, v if (p, o) != (2, 1) else "changed") for p, o, v in ACKED], ACKED, "who", 3)
    with pytest.raises(AssertionError):  # a record of a partition never produced to
        check([*ACKED, (5, 0, "x")], ACKED, "who", 3)


def test_a_duplicate_fails_exactly_once_even_at_the_end() -> None:
    with pytest.raises(AssertionError, match="partition 0"):
        check_exactly([*ACKED, (0, 3, "v0-3")], ACKED, "reader", 3)


def test_first_deliveries_out_of_order_fail_at_least_once() -> None:
    swapped = [r for r in ACKED if r[0] != 0] + [(0, 0, "v0-0"), (0, 2, "v0-2"), (0, 1, "v0-1"), (0, 3, "v0-3")]
    with pytest.raises(AssertionError, match="out of order"):
        check_at_least_once_in_order(swapped, ACKED, "member", 3)
