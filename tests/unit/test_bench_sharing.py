"""bench.sharing's check, key by key against what it produced, fails on each planted fault (a record lost, one
delivered twice, a key's records out of their produced order, a value never produced) and passes when each record
arrived once, each key in order, whichever consumer got it; its backlog is produced only once every consumer holds
what it was last assigned paused."""

from __future__ import annotations

from typing import Any

from bench.sharing import check_keys, paused_as_assigned
from bench.support.verdict import Delivery


def consumer(*records: tuple[float, int]) -> list[tuple[float, list[Any]]]:
    """(time, record number) -> what rig.group_consumer reports: [partition, offset, key, value]."""
    return [(t, [0, i, f"key-{i % 3}", f"{i:08d}" + "v" * 192]) for t, i in records]


def test_every_record_once_each_key_in_order_passes() -> None:
    got = [consumer((1.0, 0), (1.1, 3), (1.2, 2)), consumer((1.0, 1), (1.05, 4), (1.3, 5))]
    assert check_keys(6, 3, got) == Delivery()


def test_each_planted_fault_is_found() -> None:
    assert check_keys(6, 3, [consumer((1, 0), (2, 1), (3, 2), (4, 3), (5, 4))]) == Delivery(lost=1)
    assert check_keys(3, 3, [consumer((1, 0), (2, 1), (3, 2)), consumer((4, 1))]) == Delivery(duplicated=1)
    # key-0's records 3 then 0: out of the order they were produced in
    assert check_keys(6, 3, [consumer((1, 3), (2, 0), (3, 1), (4, 2), (5, 4), (6, 5))]) == Delivery(out_of_order=1)
    assert check_keys(3, 3, [consumer((1, 0), (2, 1), (3, 2), (4, 9))]) == Delivery(unexpected=1)


def test_the_backlog_waits_for_every_consumer_to_hold_its_last_assignment_paused() -> None:
    assert paused_as_assigned([])  # assigned nothing yet (a KIP-848 member the broker gives nothing)
    assert paused_as_assigned([{"assigned": []}])  # nothing to pause
    assert not paused_as_assigned([{"assigned": [["t", 0]]}])
    assert paused_as_assigned([{"assigned": [["t", 0]]}, {"paused": [["t", 0]]}])
    # assigned again since it paused: the new partitions are not paused yet
    assert not paused_as_assigned([{"assigned": [["t", 0]]}, {"paused": [["t", 0]]},
                                   {"assigned": [["t", 0], ["t", 1]]}])
