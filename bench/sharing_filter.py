"""Cooperative consumption's per-batch cost on a low-rate topic, in-process (no broker, no sockets): what Sluice
executes to filter record sets of one-record batches (proxy/policies/sharing/fetch.py ``filter_records``) for the
two members of a partition, the second served from what the first one's pass kept in the cache, as one Sluice
serving both does.

``python -m bench.sharing_filter [--batches 500] [--keys 6000] [--compare REV]``

Record sets of ``--batches`` uncompressed one-record batches (200-byte values, keys drawn from ``--keys``, as
``bench.sharing --batch-records 1`` produces them), filtered for slices 0/2 and 1/2 with one cache (its metrics
callbacks off: the same in every revision). The keys' hashes are warm (a run over other record sets first), as they
are over most of a run. Counted, not timed, first: the Python bytecodes executed per batch (``sys.settrace`` with
``f_trace_opcodes``), which do not move with the machine's load, with the functions that execute most; then the
microseconds per batch (the fastest of 5 passes over 20 record sets, for both members), which do; and the
microseconds per record set of 4 batches (``us_per_small_set``, both members, the fastest of 5 passes over 500:
a long poll's answer while records trickle in, where what is done once per record set counts). The check: the
two members' records together are every record once.

JSON lines: ``{"bench": "sharing_filter", "revision", "opcodes_per_batch", "us_per_batch", "us_per_small_set",
"top": [[opcodes per batch, function], ...], "correct"}``, with ``--compare REV`` first the same line for REV's
``proxy`` package (extracted with ``git archive``, run in a process of its own); last ``{"summary":
"sharing_filter", "opcodes_per_batch", "us_per_batch", "us_per_small_set", ["opcodes_ratio", "us_ratio",
"small_set_ratio" (this tree / REV),] "goals": {}, "every_record_once", ...}`` (bench/support/verdict.py; no goal:
a figure to compare, not a target).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.support.revision import REPO, extract_revision, short_revision
from bench.support.verdict import add_options, emit, exit_status, summary

#: record sets timed (each filtered for both members)
TIMED_SETS = 20
#: --smoke's record sets
SMOKE_BATCHES = 50
#: the small record sets: batches in each, and how many are timed
SMALL_SET, SMALL_SETS = 4, 500


def record_sets(count: int, batches: int, keys: int) -> list[bytes]:
    from proxy.wire.records import Record, encode_batch, new_batch

    rng = random.Random(1)
    return [b"".join(encode_batch(new_batch(
        [Record(key=b"key-%d" % rng.randrange(keys), value=b"%08d" % (first + i) + b"v" * 192)],
        base_offset=first + i, base_timestamp=1_700_000_000_000 + first + i, producer_id=7, producer_epoch=0,
        base_sequence=first + i)) for i in range(batches)) for first in range(0, count * batches, batches)]


def measure(batches: int, keys: int) -> dict[str, Any]:
    from proxy.policies.sharing.fetch import BatchCache, filter_records
    from proxy.policies.sharing.keys import Slice
    from proxy.wire.records import iter_batches

    sets = record_sets(TIMED_SETS + 1, batches, keys)
    members = (Slice(0, 2), Slice(1, 2))

    def both(cache: Any, rs: bytes) -> list[Any]:
        return [filter_records(memoryview(rs), s, None, cache, "t", 0) for s in members]

    cache = BatchCache(64 << 20)
    for rs in sets[1:]:  # the keys' hashes remembered, as over most of a run
        both(cache, rs)
    counts: dict[str, int] = {}

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        name = f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}"

        def local(frame: Any, event: str, arg: Any) -> Any:
            if event == "opcode":
                counts[name] = counts.get(name, 0) + 1
            return local
        return local

    sys.settrace(tracer)
    try:
        out = both(cache, sets[0])
    finally:
        sys.settrace(None)
    kept = sorted(h.base_offset for o in out for h in iter_batches(o.records))
    correct = kept == [h.base_offset for h in iter_batches(sets[0])]
    small = record_sets(SMALL_SETS, SMALL_SET, keys)
    for rs in small:
        both(cache, rs)
    best, best_small = fastest(both, sets[1:]), fastest(both, small)
    total = sum(counts.values())
    return {"bench": "sharing_filter", "batches": batches, "keys": keys,
            "opcodes_per_batch": round(total / batches, 1),
            "us_per_batch": round(best / (TIMED_SETS * batches) * 1e6, 2),
            "us_per_small_set": round(best_small / SMALL_SETS * 1e6, 2),
            "top": [[round(n / batches, 1), k] for k, n in sorted(counts.items(), key=lambda kv: -kv[1])[:8]],
            "correct": correct}


def fastest(both: Any, sets: list[bytes]) -> float:
    """The fastest of 5 passes filtering ``sets`` for both members, each pass with a cache of its own."""
    from proxy.policies.sharing.fetch import BatchCache

    best = float("inf")
    for _ in range(5):
        cache = BatchCache(64 << 20)
        start = time.perf_counter()
        for rs in sets:
            both(cache, rs)
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sharing_filter", description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, default=500)
    p.add_argument("--keys", type=int, default=6000)
    p.add_argument("--compare", metavar="REV", help="also run REV's proxy package, in a process of its own")
    add_options(p, f"record sets of {SMOKE_BATCHES} batches")
    args = p.parse_args(argv)
    if args.smoke:
        args.batches = SMOKE_BATCHES
    runs = []
    if args.compare:
        with tempfile.TemporaryDirectory() as tmp:
            extract_revision(args.compare, Path(tmp))
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([tmp, str(REPO)])}
            run = subprocess.run([sys.executable, "-m", "bench.sharing_filter", "--batches", str(args.batches),
                                  "--keys", str(args.keys)], env=env, cwd=tmp, capture_output=True, text=True,
                                 check=False)
            lines = [json.loads(x) for x in run.stdout.splitlines() if x.startswith("{")]
            before = next((x for x in lines if x.get("bench") == "sharing_filter"), None)
            if before is None:
                raise SystemExit(f"{args.compare}: no figures ({run.stderr.strip()[-500:]})")
            before["revision"] = short_revision(args.compare)
            runs.append(before)
            emit(before)
    after = {**measure(args.batches, args.keys), "revision": "this tree"}
    runs.append(after)
    emit(after)
    figures: dict[str, Any] = {k: after[k] for k in ("opcodes_per_batch", "us_per_batch", "us_per_small_set")}
    if args.compare:
        figures["opcodes_ratio"] = round(after["opcodes_per_batch"] / runs[0]["opcodes_per_batch"], 3)
        figures["us_ratio"] = round(after["us_per_batch"] / runs[0]["us_per_batch"], 3)
        figures["small_set_ratio"] = round(after["us_per_small_set"] / runs[0]["us_per_small_set"], 3)
    line = summary("sharing_filter", figures, {}, checks={"every_record_once": all(r["correct"] for r in runs)})
    emit(line)
    return exit_status(line, args.check)


if __name__ == "__main__":
    sys.exit(main())
