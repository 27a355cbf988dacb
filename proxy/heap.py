"""The C heap of a long-running relay: freed response memory is kept for the next response (glibc's mallopt).

Every collected Fetch response is a run of reads (uvloop hands each one over as ``bytes`` of up to 256 KiB) and
then one frame of the response's size, megabytes for a consumer; they are all freed once the reply is written,
and the next fetch allocates the same again. glibc's defaults adapt to that badly (mallopt(3)): its mmap
threshold starts at 128 KiB and rises to the size of each mapped block freed, and the heap is trimmed whenever
more than twice that is free at its top. A fetch cycle that frees more than that hands the pages back to the
kernel, and the next one faults each of them in again (a zeroed page per 4 KiB). Which way a run goes depends on
the largest block it happened to map first. Measured in ``bench.passthrough --policies all``
(docs/PERFORMANCE.md): runs with 170-190k minor faults per GiB relayed spent 0.93-0.99 CPU-s per GiB and read
0.77-0.80x direct; runs with ~1k spent 0.72-0.75 and read 0.85x.

So ``sluice run`` fixes both thresholds: blocks up to 32 MiB (glibc's largest mmap threshold on 64-bit, its own
dynamic ceiling) come from the heap, and the heap keeps up to 32 MiB free at its top before trimming: room for a
fetch cycle of responses up to ~10 MiB each, where glibc's own trim threshold follows the largest block it
happened to map (2-6 MiB for 1-3 MiB responses). Setting either turns the dynamic adjustment off (mallopt(3)).
The cost is at most 32 MiB of freed memory still resident after a burst. An operator's own
``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_TRIM_THRESHOLD_`` (glibc's environment tunables) wins: then nothing is
changed. Other C libraries (musl, macOS) are left alone.
"""

from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Mapping

#: mallopt(3) parameters (glibc malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 32 * 1024 * 1024  # DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: the most mallopt accepts
TRIM_THRESHOLD = 32 * 1024 * 1024

_TUNABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def _glibc() -> ctypes.CDLL | None:
    """This process's C library when it is glibc (mallopt and malloc_trim are glibc's), else None."""
    return ctypes.CDLL(None) if platform.libc_ver()[0] == "glibc" else None


def keep_freed_memory(environ: Mapping[str, str] = os.environ) -> dict[str, int] | None:
    """Fix glibc's mmap and trim thresholds for this process; the values set, or None when nothing was (not
    glibc, an operator's tunable set, or mallopt refused)."""
    libc = None if any(name in environ for name in _TUNABLES) else _glibc()
    if libc is None:
        return None
    mallopt = libc.mallopt
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    # mallopt returns 1 on success, 0 on error
    if not (mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        return None
    return {"mmap_threshold": MMAP_THRESHOLD, "trim_threshold": TRIM_THRESHOLD}


def release_startup_garbage() -> bool:
    """Hand the heap's free pages back to the kernel once (glibc's malloc_trim(0)): whether it was called.

    Start-up frees a few MiB (the settings' validation, the modules' loading) that the trim threshold set above keeps
    resident for good, since nothing is freed at the heap's top afterwards; ``malloc_trim`` releases the free pages
    anywhere in the heap (madvise), not only at its top. Called once, when Sluice is ready: idle RSS is what a fleet
    of sidecars pays per instance (``bench.footprint``'s ``idle_rss_mib``, ~2 MiB less)."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
