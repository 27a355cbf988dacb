"""A process's CPU time (user + system, every thread, those ended too), read to the nanosecond.

psutil's ``cpu_times()`` reads /proc/PID/stat, counted in clock ticks (10 ms here): a bench that divides a few
hundred milliseconds of CPU by its sends or its GiB got a figure that moved by several percent with the tick alone
(2,200 produce round trips at ~68 us are 150 ms of CPU, +-10 ms). Linux gives every process a CPU-time clock
(clock_getcpuclockid(3); the kernel's CPUCLOCK_SCHED of the process, kernel/time/posix-cpu-timers.c), the scheduler's
runtime in nanoseconds summed over the thread group, which ``clock_gettime`` reads for any process the caller can
see. Python has no ``clock_getcpuclockid``, so the clock id is made as glibc makes it: ``(~pid << 3) | 2``.
"""

from __future__ import annotations

import time

import psutil

__all__ = ["cpu_seconds"]

_CPUCLOCK_SCHED = 2  # the process-wide scheduler clock (include/linux/posix-timers.h: CPUCLOCK_SCHED)


def cpu_seconds(pid: int) -> float:
    """CPU seconds process ``pid`` used so far; psutil's tick-counted figure where the clock cannot be read (not
    Linux, another PID namespace)."""
    try:
        return time.clock_gettime((~pid << 3) | _CPUCLOCK_SCHED)
    except (OSError, OverflowError, AttributeError):
        t = psutil.Process(pid).cpu_times()
        return float(t.user + t.system)
