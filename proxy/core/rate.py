"""A windowed rate with a bound: Kafka's ``SimpleRate`` over a ``SampledTotal``, as KIP-73's
ReplicationQuotaManager uses it (group LeaderReplication/FollowerReplication, "byte-rate") and ClientQuotaManager
(KIP-13/KIP-124): the rate every policy that bounds one measures with.

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
- One departure from Kafka: the window runs from the oldest sample *that recorded bytes*. Kafka's window also
  runs over empty samples (recorded zeros, or obsolete samples reset to the time a rate was read: a metrics
  scrape, or the quota check of a fetch with nothing throttled), so after an idle spell the next burst gets
  ``bound x idle time`` of credit, up to the whole 11 s window: a throttled move that began a few seconds after
  the previous one ran its first ~25-100 MB at full speed under a 10 MB/s throttle (bench.reassign). Idle time
  earns no credit here; the rate is bounded from the first byte.
- ``exceeded(now)``: ``rate(now) > bound`` (ReplicationQuotaManager.isQuotaExceeded); a bound of 0 means none
  (Kafka's default is Long.MAX_VALUE).
- ``throttle_time(now)``: how long until the rate is back at the bound if nothing more is recorded: Kafka's
  client-quota throttle time (ClientQuotaManager, QuotaUtils.throttleTime: ``(rate - bound) / bound * window``)
  for this rate, whose window is the time elapsed since its oldest sample: ``total / bound - elapsed``.
- With ``burst_s`` (the client quotas'; Kafka has none), also never more than ``burst_s`` ahead of the bound's pace
  (a GCRA: each record moves the time its bytes would have taken at the bound, from no earlier than ``now``), so
  the throttle time is at least how far the pace is ahead of ``now + burst_s``. A windowed rate alone lets a
  client repeat its history: the bytes of an uneven sample (a slow first fetch, then a second's catch-up) leave
  the window eleven seconds later in one step, the client is muted or let through in a burst accordingly, and the
  samples it then fills are as uneven again (a Java share consumer at 5 MB/s: a 0.4 MB second, then an 11 MB one,
  every 11 s). The pace bound keeps a sample from holding much more than its second's worth, and the echo dies.
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

    def __init__(self, bound: int = 0, samples: int = 11, window_s: float = 1.0, burst_s: float = 0.0) -> None:
        if samples < 1 or window_s <= 0:
            raise ValueError("samples must be >= 1 and window_s > 0")
        self.bound = bound
        self.samples = samples
        self.window_s = window_s
        #: the pace bound (module docstring; 0 = none) and the time the bytes recorded so far would take at the bound
        self.burst_s = burst_s
        self._paced = -math.inf
        self._samples: list[_Sample] = []
        self._current = 0
        # Kept as the samples change, so that measuring (every quota check, every throttled partition's fetch)
        # walks no sample until one can have expired: the sum of the samples' totals, when the oldest sample began
        # (inf: none) and when the oldest that recorded bytes began (inf: none did)
        self._total = 0
        self._first = math.inf
        self._first_bytes = math.inf

    def reconfigure(self, bound: int, samples: int, window_s: float, now: float | None = None) -> None:
        """A new bound applies from ``now``: the window restarts there, carrying the bytes recorded beyond the old
        bound (a debt) but not the credit it left unused. Kafka keeps the history and compares it with the new
        bound, so a throttle raised from 10 to 20 MB/s after 10 s let ~100 MB through at once (the whole window
        re-measured against 20 MB/s; bench.reassign's live change): here the new rate holds from the next window
        on, which is what an operator who changes it mid-move expects (KIP-73: "speed up or slow down replica
        movement"). Bytes recorded while there was no bound (0) are measured against the new one: what exceeds it
        is a debt (Kafka's quota, exceeded at once), what it leaves unused is no credit. A new sample shape restarts
        the history (Kafka re-creates the sensor)."""
        if bound and self.bound and now is not None and self._paced > now:
            self._paced = now + (self._paced - now) * self.bound / bound  # what is ahead, at the new pace
        if (samples, window_s) != (self.samples, self.window_s):
            if samples < 1 or window_s <= 0:
                raise ValueError("samples must be >= 1 and window_s > 0")
            self.samples, self.window_s = samples, window_s
            self._samples, self._current = [], 0
        elif bound != self.bound and now is not None and self._samples:
            debt = self.total(now) - (self.bound or bound) * self.window_size(now)
            self._samples = [_Sample(now, int(debt))] if debt > 0 else []
            self._current = 0
        self.bound = bound
        self._recount()

    def _recount(self) -> None:
        """The running figures from the samples (after any change to them but a record into the current one)."""
        samples = self._samples
        self._total = sum(s.total for s in samples)
        self._first = min((s.start for s in samples), default=math.inf)
        self._first_bytes = min((s.start for s in samples if s.total), default=math.inf)

    # ------------------------------------------------------------------ SampledStat

    def record(self, n: int, now: float) -> None:
        if not self._samples:
            self._samples.append(_Sample(now))
            self._current = 0
            self._first = now
        sample = self._samples[self._current]
        if now - sample.start >= self.window_s:  # Sample.isComplete: advance, the new sample starts now
            self._current = (self._current + 1) % self.samples
            if self._current == len(self._samples):
                self._samples.append(_Sample(now))
            else:
                self._samples[self._current] = _Sample(now)
                self._recount()  # a sample replaced: its bytes leave the total, the oldest may be another
            sample = self._samples[self._current]
        sample.total += n
        self._total += n
        if n and sample.start < self._first_bytes:
            self._first_bytes = sample.start
        if self.burst_s and self.bound:
            paced = self._paced
            self._paced = (paced if paced > now else now) + n / self.bound  # (no max(): a call per request)

    def _purge(self, now: float) -> None:
        expire = self.samples * self.window_s
        if now - self._first < expire:
            return  # no sample is old enough to expire (the test below, for the oldest)
        if all(now - s.start >= expire for s in self._samples):
            self._samples, self._current = [], 0  # all idle: no history, no credit (module docstring)
        else:
            for i, s in enumerate(self._samples):
                if now - s.start >= expire:
                    self._samples[i] = _Sample(now)  # Sample.reset(now)
        self._recount()

    def total(self, now: float) -> int:
        self._purge(now)
        return self._total

    def window_size(self, now: float) -> float:
        """SimpleRate.windowSize: time since the oldest live sample began, at least one window."""
        self._purge(now)
        return max(now - self._oldest(now), self.window_s)

    def _oldest(self, now: float) -> float:
        """When the oldest sample that recorded bytes began (``now`` if none did: no history)."""
        first = self._first_bytes
        return now if first == math.inf else first

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
        expire meanwhile only lower it). 0 when not exceeded. Paces a fetcher that got nothing back (KIP-73),
        and is the client quotas' throttle time (KIP-219); with ``burst_s``, at least the pace's lead over it."""
        bound = self.bound
        if not bound:
            return 0.0
        pace = self._paced - now - self.burst_s if self.burst_s else 0.0
        # ``exceeded``'s figures read in place, purged once (a quota checks on every request: no call it can spare)
        if now - self._first >= self.samples * self.window_s:
            self._purge(now)
        first = self._first_bytes
        total, elapsed = self._total, (now - first if first != math.inf else 0.0)
        window = self.window_s
        if total / (elapsed if elapsed > window else window) > bound:  # exceeded: Kafka's time, or the pace's
            wait = total / bound - elapsed
            pace = wait if wait > pace else pace
        return pace if pace > 0.0 else 0.0

