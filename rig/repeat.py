"""Run pytest on the same tests N times, each run its own session (its own broker), and print how often each test
failed: the repeat table of ``make test-repeat N=10 K=<pytest -k>``. A failure that shows once in a hundred runs
is found here, not in a red build that passes on rerun.

    python -m rig.repeat --runs 10 -k "sharing and kafka" -m broker tests/clients

Every run's JUnit XML is read for each test's outcome (passed, failed: failures and errors both, skipped); a run
that ends without its XML (killed by ``--run-timeout``, a crash) is a row of its own. The XML (with each test's
captured log and output) and the output of every run that failed are kept in ``--keep`` (default: a new
directory in the temporary directory, named at the end): a flake seen once must be diagnosable from that run.
Exit status 1 if anything failed, so a target looping the suite is red when a flake showed up once.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Table:
    runs: int = 0
    seen: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    #: the first failure message of each test, to say what failed
    first: dict[str, str] = field(default_factory=dict)
    #: runs that ended without a report: (run, why)
    lost: list[tuple[int, str]] = field(default_factory=list)

    def read(self, run: int, junit: Path) -> None:
        """One run's outcomes from its JUnit XML."""
        root = ET.parse(junit).getroot()
        for case in root.iter("testcase"):
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            self.seen[name] += 1
            bad = case.find("failure")
            if bad is None:
                bad = case.find("error")
            if bad is not None:
                self.failed[name] += 1
                message = (bad.get("message") or "").splitlines()
                self.first.setdefault(name, f"run {run}: {message[0][:200]}" if message else f"run {run}")

    def lines(self) -> list[str]:
        """The table: every test that failed at least once, then the totals."""
        out = [f"# {self.runs} runs, {len(self.seen)} tests, {sum(self.seen.values())} test runs, "
               f"{sum(self.failed.values())} failures, {len(self.lost)} runs without a report"]
        out.append(f"{'failed':>6} {'runs':>5}  test")
        for name, n in sorted(self.failed.items(), key=lambda kv: (-kv[1], kv[0])):
            out.append(f"{n:>6} {self.seen[name]:>5}  {name}  ({self.first[name]})")
        for run, why in self.lost:
            out.append(f"{'-':>6} {'-':>5}  run {run} ended without a report: {why}")
        if not self.failed and not self.lost:
            out.append(f"{0:>6} {self.runs:>5}  every test, every run")
        return out


def run_once(run: int, pytest_args: list[str], keep: Path, timeout: float | None, table: Table) -> None:
    junit = keep / f"run-{run}.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "junit_logging=all",
           f"--junitxml={junit}", *pytest_args]
    started = time.monotonic()
    output = ""
    try:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=timeout)
        code: int | str = proc.returncode
        output = proc.stdout or ""
    except subprocess.TimeoutExpired as e:
        code = "timed out"
        output = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
    tail = output.strip().splitlines()[-1:]
    table.runs += 1
    failures = sum(table.failed.values())
    if junit.exists():
        table.read(run, junit)
    else:
        table.lost.append((run, f"exit {code}"))
    if code != 0 or sum(table.failed.values()) != failures:
        (keep / f"run-{run}.out").write_text(output)
    else:
        junit.unlink(missing_ok=True)
    print(f"# run {run}: exit {code} in {time.monotonic() - started:.0f} s {tail[0] if tail else ''}",
          file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rig.repeat", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", "-n", type=int, default=10)
    p.add_argument("--run-timeout", type=float, default=None, help="seconds; a run over it is killed")
    p.add_argument("--keep", type=Path, default=None, help="where failing runs' XML and output are kept")
    a, pytest_args = p.parse_known_args(argv)
    keep: Path = a.keep or Path(tempfile.mkdtemp(prefix="sluice-repeat-"))
    keep.mkdir(parents=True, exist_ok=True)
    table = Table()
    for run in range(1, a.runs + 1):
        run_once(run, pytest_args, keep, a.run_timeout, table)
    print("\n".join(table.lines()))
    failed = bool(table.failed or table.lost)
    if failed:
        print(f"# the failing runs' JUnit XML (captured logs included) and output: {keep}")
    elif a.keep is None and not any(keep.iterdir()):
        keep.rmdir()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
