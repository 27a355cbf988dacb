"""The client tests' record check (tests/support/records.py) fails on each planted fault and passes on the real
thing: a dropped partition, a duplicate, a gap, a changed record; and, where the read stopped once it had as many
records as were sent, a record the log holds twice after them (its end offsets say so, asked of the broker)."""

from __future__ import annotations

import dataclasses

import pytest

from tests.support import records as checks
from tests.support.records import assert_same_records, log_differs, make_records

SENT = make_records(12, 3, tag="check")


def test_every_record_once_in_order_passes() -> None:
    assert_same_records(SENT, list(SENT))
    assert_same_records(SENT, [r for p in (2, 0, 1) for r in SENT if r.partition == p])  # partitions interleave


@pytest.mark.parametrize("fault", ["dropped partition", "duplicate", "gap", "changed", "reordered"])
def test_each_planted_fault_fails(fault: str) -> None:
    got = list(SENT)
    if fault == "dropped partition":
        got = [r for r in got if r.partition != 1]
    elif fault == "duplicate":
        got.append(got[0])
    elif fault == "gap":
        del got[4]
    elif fault == "changed":
        got[5] = dataclasses.replace(got[5], value=b"changed")
    else:
        got[0], got[3] = got[3], got[0]  # records 0 and 3 are both partition 0's
    with pytest.raises(AssertionError):
        assert_same_records(SENT, got)


def test_a_record_stored_twice_after_the_last_one_read_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """The read stopped at 12 records, all as sent: only the log shows the 13th, stored twice."""
    assert log_differs({0: 4, 1: 4, 2: 4}, {0: 4, 1: 4, 2: 4}) == {}
    assert log_differs({0: 5, 1: 4, 2: 4}, {0: 4, 1: 4, 2: 4}) == {0: (5, 4)}
    assert log_differs({0: 4, 1: 4}, {0: 4, 1: 4, 2: 4}) == {2: (0, 4)}
    monkeypatch.setattr(checks, "end_offsets", lambda bootstrap, topic: {0: 4, 1: 5, 2: 4})
    with pytest.raises(AssertionError, match=r"1: \(5, 4\)"):
        assert_same_records(SENT, list(SENT), stored_in=("127.0.0.1:9", "t"))
    monkeypatch.setattr(checks, "end_offsets", lambda bootstrap, topic: {0: 4, 1: 4, 2: 4})
    assert_same_records(SENT, list(SENT), stored_in=("127.0.0.1:9", "t"))
