"""A windowed byte rate with a bound: Kafka's ``SimpleRate`` over a ``SampledTotal``, as KIP-73's
ReplicationQuotaManager uses it (group LeaderReplication/FollowerReplication, "byte-rate").

Sans-IO: every call takes ``now`` (seconds, any monotonic origin); nothing here reads a clock.

Arithmetic, following org.apache.kafka.common.metrics.stats.{SampledStat, Rate, SimpleRate}:

- ``samples`` samples of ``window_s`` each (default 11 x 1 s, replication.quota.window.num/size.seconds).
- ``record(n, now)`` adds ``n`` to the current sample; when the current sample is complete
  (``now - start >= window_s``) recording moves to the next slot, which restarts at ``now`` (SampledStat.record:
  a sample starts when it is first written, it is not aligned to a grid).
- Before measuring, samples older than ``samples * window_s`` are reset (purgeObsoleteSamples): an idle gap
  forgets the traffic before it.
- ``rate(now) = total / max(now - oldest_start, window_s)`` (SimpleRate.windowSize): the elapsed time since the
  oldest live sample began, but never less than one window. So a partial first window is measured as a whole
  window, and a burst right after start is not divided by a tiny elapsed time (unlike ``Rate``, which pretends
  ``samples - 1`` full windows have passed and so lets ten windows' worth through at first).
- ``exceeded(now)``: ``rate(now) > bound`` (ReplicationQuotaManager.isQuotaExceeded); a bound of 0 means none
  (Kafka's default is Long.MAX_VALUE).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(slots=True)
class _Sample:
    start: float
    total: int = 0


class WindowedRate:
    """Bytes per second over ``samples`` x ``window_s`` seconds, compared against ``bound`` (0 = unbounded)."""

    def __init__(self, bound: int = 0, samples: int = 11, window_s: float = 1.0) -> None:
        if samples < 1 or window_s <= 0:
            raise ValueError("samples must be >= 1 and window_s > 0")
        self.bound = bound
        self.samples = samples
        self.window_s = window_s
        self._samples: list[_Sample] = []
        self._current = 0

    def reconfigure(self, bound: int, samples: int, window_s: float) -> None:
        """New bound (applies at once); a new sample shape restarts the history (Kafka re-creates the sensor)."""
        self.bound = bound
        if (samples, window_s) != (self.samples, self.window_s):
            if samples < 1 or window_s <= 0:
                raise ValueError("samples must be >= 1 and window_s > 0")
            self.samples, self.window_s = samples, window_s
            self._samples, self._current = [], 0

    # ------------------------------------------------------------------ SampledStat

    def record(self, n: int, now: float) -> None:
        if not self._samples:
            self._samples.append(_Sample(now))
            self._current = 0
        sample = self._samples[self._current]
        if now - sample.start >= self.window_s:  # Sample.isComplete: advance, the new sample starts now
            self._current = (self._current + 1) % self.samples
            if self._current == len(self._samples):
                self._samples.append(_Sample(now))
            else:
                self._samples[self._current] = _Sample(now)
            sample = self._samples[self._current]
        sample.total += n

    def _purge(self, now: float) -> None:
        expire = self.samples * self.window_s
        for i, s in enumerate(self._samples):
            if now - s.start >= expire:
                self._samples[i] = _Sample(now)  # Sample.reset(now)

    def total(self, now: float) -> int:
        self._purge(now)
        return sum(s.total for s in self._samples)

    def window_size(self, now: float) -> float:
        """SimpleRate.windowSize: time since the oldest live sample began, at least one window."""
        self._purge(now)
        oldest = min((s.start for s in self._samples), default=now)
        return max(now - oldest, self.window_s)

    # ------------------------------------------------------------------ Rate / quota

    def rate(self, now: float) -> float:
        return self.total(now) / self.window_size(now)

    def exceeded(self, now: float) -> bool:
        return bool(self.bound) and self.rate(now) > self.bound

    def headroom(self, now: float) -> float:
        """Bytes that may be recorded now with ``rate`` staying at or below the bound (inf when unbounded;
        <= 0 when the bound is reached)."""
        if not self.bound:
            return math.inf
        return self.bound * self.window_size(now) - self.total(now)

    def throttle_time(self, now: float) -> float:
        """Seconds until ``rate`` falls to the bound if nothing more is recorded (an upper bound: samples that
        expire meanwhile only lower it). 0 when not exceeded. Used to pace a fetcher that got nothing back."""
        if not self.exceeded(now):
            return 0.0
        total, elapsed = self.total(now), now - min(s.start for s in self._samples)
        return max(0.0, total / self.bound - elapsed)
