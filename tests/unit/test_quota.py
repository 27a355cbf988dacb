"""proxy/core/rate.py: the window arithmetic of Kafka's SimpleRate over a SampledTotal (KIP-73's quota)."""

from __future__ import annotations

import pytest

from proxy.core.rate import WindowedRate


def test_partial_first_window_counts_as_one_whole_window() -> None:
    q = WindowedRate(bound=100, samples=11, window_s=1.0)
    q.record(50, now=10.0)
    # SimpleRate.windowSize = max(elapsed, one window): 50 bytes 0.1 s after start is 50 B/s, not 500
    assert q.rate(10.1) == pytest.approx(50.0)
    assert not q.exceeded(10.1)
    q.record(60, now=10.2)
    assert q.rate(10.2) == pytest.approx(110.0)
    assert q.exceeded(10.2)


def test_rate_over_elapsed_time_once_past_one_window() -> None:
    q = WindowedRate(bound=0, samples=11, window_s=1.0)
    for i in range(5):
        q.record(100, now=float(i))  # one sample per second
    assert q.rate(5.0) == pytest.approx(500 / 5.0)
    assert q.rate(4.0) == pytest.approx(500 / 4.0)
    assert not q.exceeded(5.0)  # bound 0 = unbounded


def test_sample_rollover_starts_the_new_sample_at_the_record_time() -> None:
    q = WindowedRate(samples=3, window_s=1.0)
    q.record(10, now=0.0)
    q.record(10, now=0.99)  # same sample
    q.record(10, now=1.5)  # sample 0 is complete (1.5 - 0 >= 1): sample 1 starts at 1.5, not at 1.0
    q.record(10, now=2.2)  # sample 1 is not complete (2.2 - 1.5 < 1): same sample
    assert q.total(2.2) == 40
    assert q.window_size(2.2) == pytest.approx(2.2)
    q.record(10, now=2.6)  # sample 2 starts at 2.6
    assert q.total(2.6) == 50
    # 3.0: sample 0 (started at 0.0) is 3 windows old: obsolete, reset
    assert q.total(3.0) == 30
    assert q.window_size(3.0) == pytest.approx(3.0 - 1.5)
    q.record(10, now=3.7)  # sample 2 complete: slot 0 is reused, starting at 3.7
    assert q.total(3.7) == 40
    assert q.window_size(3.7) == pytest.approx(3.7 - 1.5)


def test_idle_gap_forgets_old_samples() -> None:
    q = WindowedRate(bound=100, samples=11, window_s=1.0)
    q.record(5000, now=0.0)
    assert q.exceeded(5.0)
    # 11 s later every sample is obsolete (purgeObsoleteSamples): reset to empty, starting now
    assert q.total(11.0) == 0
    assert q.rate(11.0) == 0.0
    assert not q.exceeded(11.0)
    q.record(50, now=11.5)
    assert q.rate(11.6) == pytest.approx(50.0)


def test_idle_time_earns_no_burst_credit() -> None:
    """Kafka's window runs from the oldest sample, bytes or not: zeros recorded (fetches with nothing throttled) and
    samples reset by a read (a scrape) during an idle spell let the next burst through at up to the whole window's
    bound. Sluice's window starts at the oldest sample that recorded bytes."""
    q = WindowedRate(bound=100, samples=11, window_s=1.0)
    q.record(5000, now=0.0)
    assert q.rate(12.0) == 0.0  # a scrape: every sample obsolete
    for t in range(13, 22):
        q.record(0, now=float(t))  # idle fetches
    assert q.headroom(22.0) == pytest.approx(100.0)  # one window's worth, not 10 s of it
    q.record(100, now=22.0)
    assert not q.exceeded(22.5) and q.headroom(22.5) == pytest.approx(0.0)
    q.record(1, now=22.5)
    assert q.exceeded(22.6)


def test_throttle_time_is_time_until_rate_falls_to_bound() -> None:
    q = WindowedRate(bound=100, samples=11, window_s=1.0)
    q.record(300, now=0.0)
    assert q.throttle_time(0.5) == pytest.approx(2.5)  # 300 bytes at 100 B/s: 3 s after the sample began
    assert q.rate(3.0) == pytest.approx(100.0)
    assert q.throttle_time(3.0) == 0.0


def test_reconfigure_keeps_history_unless_the_shape_changes() -> None:
    q = WindowedRate(bound=100)
    q.record(1000, now=0.0)
    q.reconfigure(100, 11, 1.0, now=0.5)  # same bound (e.g. only the topics changed): history kept
    assert q.total(0.5) == 1000 and q.exceeded(0.5)
    q.reconfigure(2000, 5, 2.0, now=0.5)
    assert q.total(0.5) == 0


def test_a_changed_bound_applies_from_the_change() -> None:
    """Raised mid-move, the new bound holds from the change on: no re-measurement of the past 10 s against it."""
    q = WindowedRate(bound=100)
    for t in range(10):
        q.record(100, now=float(t))  # at the bound for 10 s
    q.reconfigure(200, 11, 1.0, now=10.0)
    assert q.headroom(10.0) == pytest.approx(200.0)  # one window of the new bound, not 10 s of unused credit
    # lowered while over the bound: the excess is still owed
    q2 = WindowedRate(bound=100)
    q2.record(500, now=0.0)
    q2.reconfigure(50, 11, 1.0, now=1.0)
    assert q2.total(1.0) == 400 and q2.exceeded(1.0)


def test_bytes_sent_with_no_bound_are_measured_against_the_first_one() -> None:
    """From no bound (0) to one: what the window holds beyond the new bound is owed (exceeded at once, as Kafka's
    quota is), what it leaves unused is no credit."""
    q = WindowedRate(bound=0)
    q.record(1000, now=0.0)
    q.reconfigure(2, 11, 1.0, now=1.0)
    assert q.total(1.0) == 1000 - 2 and q.exceeded(1.0)
    idle = WindowedRate(bound=0)
    idle.record(10, now=0.0)
    idle.reconfigure(100, 11, 1.0, now=5.0)
    assert idle.total(5.0) == 0 and idle.headroom(5.0) == pytest.approx(100.0)


def test_a_pace_bound_keeps_a_client_from_repeating_a_burst() -> None:
    """A slow first record then a catch-up: the windowed rate alone lets the next second carry two seconds' worth
    (and, when those samples leave the window, a stall and a burst again); with burst_s the catch-up is bounded."""
    plain, paced = WindowedRate(bound=100), WindowedRate(bound=100, burst_s=0.5)
    for q in (plain, paced):
        q.record(10, now=0.0)
    # 1.5 s later: the windowed rate has 1.5 s of credit (less the 10 bytes), the pace only burst_s ahead of now
    assert plain.throttle_time(1.5) == 0.0 and paced.throttle_time(1.5) == 0.0
    for q in (plain, paced):
        q.record(140, now=1.5)
    assert plain.throttle_time(1.5) == 0.0  # 150 bytes over 1.5 s: at the bound, nothing owed
    assert paced.throttle_time(1.5) == pytest.approx(0.9)  # 140 bytes from 1.5 at 100 B/s: 2.9, less 0.5 ahead
    q = WindowedRate(bound=100, burst_s=0.5)
    q.record(100, now=0.0)
    assert q.throttle_time(0.0) == pytest.approx(0.5)  # 1 s of pace ahead, 0.5 s allowed
    q.reconfigure(200, 11, 1.0, now=0.0)  # a doubled bound: the pace's lead halves, to what is allowed
    assert q.throttle_time(0.0) == 0.0
    q.record(100, now=0.0)
    assert q.throttle_time(0.0) == pytest.approx(0.5)
