"""Every bench, one after the other: ``python -m bench [--smoke] [--check] [--only a,b] [--skip c,d] [--jobs N]
[--list]``.

The benches are the modules of bench/ itself (bench/support/ holds what they share); each runs as ``python -m
bench.NAME`` with ``--smoke`` and ``--check`` passed on. Without ``--smoke`` (``make bench``) their JSON lines go
to stdout as they come. With ``--smoke`` (``make bench-smoke``, CI) each bench's output is kept and, when it ends,
one line says how it went, ``{"bench": "smoke", "name", "seconds", "exit", "met", "correct"}``, followed by its
summary line (all of its output and the tail of its stderr when it failed); a bench passes when it exits 0 and its
last line is a summary carrying the verdict (bench/support/verdict.py). ``--jobs N`` runs N smoke runs at once, each
picking its ports from a part of its own of the rig's port range (rig/kafka.py SLUICE_PORT_RANGE), so two never
pick the same one. The last line: ``{"summary": "bench", "benches", "seconds", "failed": [...]}``; the exit status is
1 when any bench failed.
"""

from __future__ import annotations

import argparse
import json
import os
import pkgutil
import queue
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rig.kafka import PORT_RANGE_ENV, listen_port_range

HERE = Path(__file__).resolve().parent
#: a smoke run that takes longer than this has hung: a guard, not a measure (the whole set is sized for under 5
#: minutes on an idle machine; CI runs it at the lowest CPU priority beside three test sessions, where the CPU-bound
#: ones wait for the cycles the tests leave: bench.analytics's Spark jobs went past 600 s there)
SMOKE_TIMEOUT_S = 1200.0


def benches() -> list[str]:
    """The modules of bench/ (not its packages, not this runner)."""
    return sorted(m.name for m in pkgutil.iter_modules([str(HERE)]) if not m.ispkg and not m.name.startswith("_"))


def last_summary(stdout: str) -> dict[str, Any] | None:
    """The bench's last line, if it is a summary line carrying the verdict."""
    lines = stdout.strip().splitlines()
    try:
        line = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    if isinstance(line, dict) and "summary" in line and "met" in line and "correct" in line:
        return line
    return None


def port_ranges(jobs: int) -> list[str]:
    """The rig's port range split into ``jobs`` parts, as SLUICE_PORT_RANGE values."""
    ports = listen_port_range()
    if len(ports) < jobs * 100:
        raise SystemExit(f"{len(ports)} ports to share between {jobs} smoke runs: set {PORT_RANGE_ENV} wider")
    size = len(ports) // jobs
    return [f"{ports.start + i * size}-{ports.start + (i + 1) * size - 1}" for i in range(jobs)]


def smoke(name: str, extra: list[str], ports: queue.SimpleQueue[str]) -> tuple[dict[str, Any], str]:
    """One bench's smoke run, on a part of the port range no other run has meanwhile: its result line, and what to
    print after it."""
    start = time.monotonic()
    mine = ports.get()
    try:
        proc = subprocess.run([sys.executable, "-m", f"bench.{name}", "--smoke", *extra], cwd=HERE.parent,
                              env={**os.environ, PORT_RANGE_ENV: mine}, capture_output=True, text=True,
                              timeout=SMOKE_TIMEOUT_S)
        code, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:
        code = -1
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = (e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")) + \
            f"\nkilled after {SMOKE_TIMEOUT_S:.0f} s"
    finally:
        ports.put(mine)
    line = last_summary(out)
    result = {"bench": "smoke", "name": name, "seconds": round(time.monotonic() - start, 1), "exit": code,
              "met": None if line is None else line["met"], "correct": None if line is None else line["correct"]}
    passed = code == 0 and line is not None
    shown = json.dumps(line) if passed else f"{out.rstrip()}\n# stderr, last lines:\n" + "\n".join(
        err.rstrip().splitlines()[-40:])
    return result | {"passed": passed}, shown


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="each bench's smoke run, judged (CI)")
    ap.add_argument("--check", action="store_true", help="passed on: a bench whose goal is not met fails too")
    ap.add_argument("--only", default="", help="comma-separated bench names (default: all)")
    ap.add_argument("--skip", default="", help="comma-separated bench names left out")
    ap.add_argument("--jobs", type=int, default=1, help="with --smoke: benches run at once (default 1)")
    ap.add_argument("--list", action="store_true", help="print the benches' names and exit")
    args = ap.parse_args(argv)
    names = benches()
    def named(option: str) -> list[str]:
        given = [n.strip() for n in option.split(",") if n.strip()]
        if unknown := [n for n in given if n not in names]:
            ap.error(f"unknown benches {unknown}; known: {', '.join(names)}")
        return given

    if args.only:
        names = named(args.only)
    if args.skip:
        skipped = named(args.skip)
        names = [n for n in names if n not in skipped]
    if args.list:
        print("\n".join(names))
        return 0
    extra = ["--check"] if args.check else []
    start = time.monotonic()
    failed: list[str] = []
    if not args.smoke:
        for name in names:
            print(f"# bench.{name}", file=sys.stderr, flush=True)
            if subprocess.run([sys.executable, "-m", f"bench.{name}", *extra], cwd=HERE.parent).returncode:
                failed.append(name)
    else:
        jobs = max(1, args.jobs)
        ports: queue.SimpleQueue[str] = queue.SimpleQueue()
        for part in port_ranges(jobs):
            ports.put(part)
        with ThreadPoolExecutor(jobs) as pool:
            for result, shown in pool.map(lambda n: smoke(n, extra, ports), names):
                passed = result.pop("passed")
                print(json.dumps(result), flush=True)
                print(shown, flush=True)
                if not passed:
                    failed.append(result["name"])
    print(json.dumps({"summary": "bench", "smoke": args.smoke, "benches": len(names),
                      "seconds": round(time.monotonic() - start, 1), "failed": failed}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
