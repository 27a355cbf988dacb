"""proxy/heap.py: with the thresholds fixed, memory freed by one response is kept for the next instead of being handed
back to the kernel and faulted in again. Each case runs in a child interpreter: mallopt changes the process it runs
in, and pytest's own heap is not what is measured."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from proxy import heap

# A fetch cycle in miniature: 8 MiB in 1 MiB blocks (a collected response's reads and its frame), all freed, five
# times. After each round: the main arena's size (glibc's mallinfo2), and the minor faults since the first round.
CYCLE = """
import ctypes, json, resource, sys
from proxy.heap import keep_freed_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]

mallinfo2 = ctypes.CDLL(None).mallinfo2
mallinfo2.restype = MallInfo2
set_to = keep_freed_memory({}) if sys.argv[1] == "tuned" else None
arenas, faults = [], 0
for i in range(5):
    if i == 1:
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [b"\x01" * (1 << 20) for _ in range(8)]  # written, as reads are (calloc's zeroes are not)
    del blocks
    arenas.append(mallinfo2().arena)
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
print(json.dumps({"set": set_to, "arenas": arenas, "faults": faults}))
"""


def cycle(mode: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", CYCLE, mode], capture_output=True, text=True, check=True, timeout=60)
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_freed_responses_stay_in_the_heap_and_are_not_faulted_in_again() -> None:
    tuned = cycle("tuned")
    assert tuned["set"] == {"mmap_threshold": heap.MMAP_THRESHOLD, "trim_threshold": heap.TRIM_THRESHOLD}
    arenas = tuned["arenas"]
    assert isinstance(arenas, list) and min(arenas) >= 8 << 20  # every round's 8 MiB kept after it was freed
    # four rounds of 8 MiB reuse the first round's pages: 2,048 faults each if they were handed back
    assert isinstance(tuned["faults"], int) and tuned["faults"] < 256


def test_glibcs_own_thresholds_hand_the_same_memory_back() -> None:
    """What the test above guards against, so it can fail: with glibc's dynamic thresholds the heap is trimmed
    after each round (the blocks come from the heap once the first round's mmapped ones raised the threshold)."""
    default = cycle("default")
    assert default["set"] is None
    arenas = default["arenas"]
    assert isinstance(arenas, list) and max(arenas[1:]) < 8 << 20


@pytest.mark.parametrize("tunable", ["MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"])
def test_an_operators_tunable_wins(tunable: str) -> None:
    assert heap.keep_freed_memory({tunable: "131072"}) is None


def test_other_c_libraries_are_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap.platform, "libc_ver", lambda: ("", ""))
    assert heap.keep_freed_memory({}) is None


# Start-up in miniature: the thresholds fixed, 8 MiB of small objects built and freed (as the settings' validation
# and the modules' loading leave), then the one release Sluice makes when ready. Resident KiB before and after.
STARTUP = """
import json
from proxy.heap import keep_freed_memory, release_startup_garbage

def rss():
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS"))

keep_freed_memory({})
garbage = [bytearray(b"\\x01" * 1000) for _ in range(8 * 1024)]
keep = bytearray(100)  # above the freed blocks: the heap's top is not free, as after a real start
del garbage
before = rss()
released = release_startup_garbage()
print(json.dumps({"released": released, "before": before, "after": rss()}))
"""


def test_start_ups_freed_memory_goes_back_to_the_kernel_once_ready() -> None:
    out = subprocess.run([sys.executable, "-c", STARTUP], capture_output=True, text=True, check=True, timeout=60)
    result = json.loads(out.stdout)
    assert result["released"] is True
    assert result["before"] - result["after"] >= 6 * 1024  # most of the 8 MiB freed, no longer resident


def test_release_leaves_other_c_libraries_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap.platform, "libc_ver", lambda: ("", ""))
    assert heap.release_startup_garbage() is False
