"""RequestTallies (proxy/metrics.py): the per-request counter and latency histogram kept as plain numbers and
exported at scrape time."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import accumulate

import pytest

from proxy import metrics
from proxy.metrics import LATENCY_BUCKETS, RequestTallies


def _tallies() -> RequestTallies:
    return RequestTallies("t_requests", "requests", "t_latency_seconds", "latency", LATENCY_BUCKETS)


def test_a_scrape_exports_counts_by_api_and_version_and_a_cumulative_histogram() -> None:
    t = _tallies()
    t.observe("Fetch", 16, 0.002)
    t.observe("Fetch", 16, 0.5)
    t.observe("Produce", 11, 0.001)
    counter, histogram = t.collect()
    assert {(s.labels["api"], s.labels["version"]): s.value for s in counter.samples
            if s.name == "t_requests_total"} == {("Fetch", "16"): 2, ("Produce", "11"): 1}
    fetch = {s.labels["le"]: s.value for s in histogram.samples
             if s.name == "t_latency_seconds_bucket" and s.labels["api"] == "Fetch"}
    assert fetch["+Inf"] == 2 and list(fetch.values()) == sorted(fetch.values())
    assert [s.value for s in histogram.samples if s.name == "t_latency_seconds_sum" and s.labels["api"] == "Fetch"
            ] == [pytest.approx(0.502)]


def test_a_new_api_met_while_a_scrape_runs_on_another_thread_leaves_the_scrape_whole(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The event loop may count a request of an API it has not seen before while another thread is in the middle of
    a scrape (rig/proxy_thread.py reads a live proxy's metrics so): the scrape must finish with what it had, not
    fail with "dictionary changed size during iteration" (seen once in tests/clients/test_sharing.py)."""
    t = _tallies()
    t.observe("Fetch", 16, 0.002)
    t.observe("Metadata", 12, 0.001)

    def accumulate_while_the_loop_runs(values: Iterable[float]) -> Iterator[float]:
        t.observe(f"Api{len(t.latency)}", 0, 0.001)  # what the loop's thread does between two of the scrape's steps
        return accumulate(values)

    monkeypatch.setattr(metrics, "accumulate", accumulate_while_the_loop_runs)
    _, histogram = t.collect()
    assert {s.labels["api"] for s in histogram.samples} == {"Fetch", "Metadata"}


def test_versions_outside_the_per_api_list_are_counted_too() -> None:
    t = _tallies()
    for version in (0, metrics.MAX_VERSION_INDEXED, metrics.MAX_VERSION_INDEXED + 1, -1, 32767):
        t.observe("Produce", version, 0.001)
    t.observe("Produce", 0, 0.001)
    counter, _ = t.collect()
    assert {s.labels["version"]: s.value for s in counter.samples if s.name == "t_requests_total"} == {
        "0": 2, str(metrics.MAX_VERSION_INDEXED): 1, str(metrics.MAX_VERSION_INDEXED + 1): 1, "-1": 1, "32767": 1}


@pytest.mark.parametrize("seconds", [0.0, 0.00004, 0.00005, 0.00005000001, 0.0003, 0.001, 0.0049, 9.99, 10.0, 10.5,
                                     1e6])
def test_each_latency_lands_in_the_first_bucket_whose_bound_is_not_below_it(seconds: float) -> None:
    """Prometheus' ``le``: an observation equal to a bound is in that bound's bucket; above the last, only in +Inf."""
    t = _tallies()
    t.observe("Fetch", 16, seconds)
    _, histogram = t.collect()
    buckets = {s.labels["le"]: s.value for s in histogram.samples if s.name == "t_latency_seconds_bucket"}
    first = next((b for b in LATENCY_BUCKETS if seconds <= b), None)
    assert buckets == {le: (1.0 if (first is not None and float(le) >= first) or le == "+Inf" else 0.0)
                       for le in buckets}
