"""bench.sessions' check, by offset against what the broker acknowledged to the producer, fails on each planted
fault (a busy partition the client got nothing of, a gap, a duplicate, another partition's record) and passes on a
client that got each busy partition's records from some point on, once, in order."""

from __future__ import annotations

from bench.sessions import busy_check, fetch_split
from bench.support.verdict import Delivery

ACKED = {0: [0, 1, 2, 3, 4], 7: [0, 1, 2, 3, 4]}


def test_every_record_from_where_the_client_started_passes() -> None:
    got = [("t", 0, 2), ("t", 7, 1), ("t", 0, 3), ("t", 7, 2), ("t", 7, 3)]
    assert busy_check("t", ACKED, got) == Delivery()


def test_each_planted_fault_is_found() -> None:
    assert busy_check("t", ACKED, []) == Delivery(lost=10)  # a client that got nothing
    assert busy_check("t", ACKED, [("t", 0, 0), ("t", 0, 1)]) == Delivery(lost=5)  # a busy partition dropped
    assert busy_check("t", ACKED, [("t", 0, 1), ("t", 0, 3), ("t", 7, 4)]).lost == 1  # a gap
    assert busy_check("t", ACKED, [("t", 0, 1), ("t", 0, 1), ("t", 7, 4)]).duplicated == 1
    assert busy_check("t", ACKED, [("t", 0, 1), ("t", 7, 4), ("t", 3, 0)]).unexpected == 1  # not a busy partition
    assert busy_check("t", ACKED, [("t", 0, 2), ("t", 0, 1), ("t", 7, 4)]).out_of_order == 1


def test_fetch_split_divides_the_window_by_its_client_fetches() -> None:
    # a terminate window: the upstream link carried a bit less than the client link
    d = {"fetches": 4.0, "client_to_proxy": 800.0, "proxy_to_client": 3200.0, "proxy_to_upstream": 720.0,
         "upstream_to_proxy": 3000.0}
    assert fetch_split(d, 10) == {"upstream_request_bytes_per_fetch": 180.0,
                                  "upstream_response_bytes_per_fetch": 750.0, "records_per_fetch": 2.5,
                                  "upstream_over_client_bytes": 0.93}
    # a window without a fetch or a byte divides by one, not by zero
    empty = dict.fromkeys(d, 0.0)
    assert fetch_split(empty, 0) == {"upstream_request_bytes_per_fetch": 0.0,
                                     "upstream_response_bytes_per_fetch": 0.0, "records_per_fetch": 0.0,
                                     "upstream_over_client_bytes": 0.0}
