"""rig/cpu.py: another process's CPU time to the nanosecond, its ended threads' included."""

from __future__ import annotations

import subprocess
import sys

import psutil

from rig.cpu import cpu_seconds

# Two threads burn CPU and end; the process then waits on stdin. It may still be on its way to that wait when the
# test reads its clock (a loaded machine schedules it late: 22 us more between two reads in a CI-like run), so the
# readings are bracketed, not compared for equality.
_CHILD = """
import sys, threading
def spin():
    x = 0
    for i in range(2_000_000):
        x += i
threads = [threading.Thread(target=spin) for _ in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("spun", flush=True)
sys.stdin.read()
"""


def test_a_process_cpu_time_counts_its_ended_threads_and_agrees_with_the_kernels_ticks() -> None:
    child = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "spun\n"
        precise = cpu_seconds(child.pid)
        ticks = psutil.Process(child.pid).cpu_times()
        after = cpu_seconds(child.pid)
        # the same time the kernel counts in 10 ms ticks (user and system each rounded down), to within them: read
        # between the two readings of the clock, the ticks lie between them, less at most a tick each
        assert precise <= after and ticks.user + ticks.system <= after
        assert precise <= ticks.user + ticks.system + 0.03
        assert precise > 0.05  # the ended threads' loops are in it (each ~0.1 s of CPU here)
        assert precise != round(precise, 2)  # finer than a tick
    finally:
        child.communicate("")
