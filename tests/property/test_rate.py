"""The windowed rate (proxy/core/rate.py) against a model that recomputes everything from the samples on every
measurement, as its docstring states the arithmetic (Kafka's SampledStat/SimpleRate with the credit rule): the rate
keeps running figures so that measuring walks no sample until one can have expired, and must give the very same
totals, rates, headroom and throttle times after any sequence of records, measurements, idle gaps and bound
changes."""

from __future__ import annotations

import math
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.rate import WindowedRate


@dataclass
class _S:
    start: float
    total: int = 0


class Model:
    """Every figure from the samples themselves, at every call."""

    def __init__(self, bound: int, samples: int, window_s: float) -> None:
        self.bound, self.n, self.window_s = bound, samples, window_s
        self.samples: list[_S] = []
        self.current = 0

    def record(self, n: int, now: float) -> None:
        if not self.samples:
            self.samples, self.current = [_S(now)], 0
        if now - self.samples[self.current].start >= self.window_s:
            self.current = (self.current + 1) % self.n
            if self.current == len(self.samples):
                self.samples.append(_S(now))
            else:
                self.samples[self.current] = _S(now)
        self.samples[self.current].total += n

    def purge(self, now: float) -> None:
        expire = self.n * self.window_s
        if self.samples and all(now - s.start >= expire for s in self.samples):
            self.samples, self.current = [], 0
            return
        self.samples = [_S(now) if now - s.start >= expire else s for s in self.samples]

    def total(self, now: float) -> int:
        self.purge(now)
        return sum(s.total for s in self.samples)

    def window_size(self, now: float) -> float:
        self.purge(now)
        oldest = min((s.start for s in self.samples if s.total), default=now)
        return max(now - oldest, self.window_s)

    def rate(self, now: float) -> float:
        return self.total(now) / self.window_size(now)

    def headroom(self, now: float) -> float:
        return math.inf if not self.bound else self.bound * self.window_size(now) - self.total(now)

    def throttle_time(self, now: float) -> float:
        if not (self.bound and self.rate(now) > self.bound):
            return 0.0
        total = self.total(now)
        oldest = min((s.start for s in self.samples if s.total), default=now)
        return max(0.0, total / self.bound - (now - oldest))

    def reconfigure(self, bound: int, now: float) -> None:
        if bound != self.bound and self.samples:
            debt = self.total(now) - (self.bound or bound) * self.window_size(now)
            self.samples, self.current = ([_S(now, int(debt))] if debt > 0 else []), 0
        self.bound = bound


# (what, amount or bound, seconds later): records of 0-5000 bytes, measurements, bound changes; gaps from none to
# longer than the whole window (11 x 0.25 s), so samples advance, expire one by one and all at once
OPS = st.lists(st.tuples(st.sampled_from(["record", "record", "record", "measure", "bound"]),
                         st.integers(0, 5000),
                         st.sampled_from([0.0, 0.001, 0.1, 0.25, 0.3, 1.0, 2.9, 4.0])), max_size=80)


@settings(max_examples=300, deadline=None)
@given(bound=st.sampled_from([0, 1000, 20_000]), ops=OPS)
def test_the_running_figures_equal_the_figures_from_the_samples(bound: int, ops: list[tuple[str, int, float]]) -> None:
    rate, model = WindowedRate(bound, 11, 0.25), Model(bound, 11, 0.25)
    now = 100.0
    for what, x, gap in ops:
        now += gap
        if what == "record":
            rate.record(x, now)
            model.record(x, now)
        elif what == "bound":
            rate.reconfigure(x // 2, 11, 0.25, now)
            model.reconfigure(x // 2, now)
        else:
            assert rate.total(now) == model.total(now)
            assert rate.window_size(now) == model.window_size(now)
            assert rate.rate(now) == model.rate(now)
            assert rate.headroom(now) == model.headroom(now)
            assert rate.throttle_time(now) == model.throttle_time(now)
    assert rate.throttle_time(now) == model.throttle_time(now) and rate.total(now) == model.total(now)
