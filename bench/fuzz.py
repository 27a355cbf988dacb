"""Fuzz everything Sluice parses, unbounded: the targets of the suite's bounded fuzz tests (rig/fuzz_targets.py:
the frame reader on both sides, the streaming Fetch walker, every decoder and view, the Fetch fast paths, the
connection core under random events with the policies on), each for a time budget.

``python -m bench.fuzz [--minutes 10] [--targets a,b,...] [--engine auto|hypothesis|atheris]``

Engines:

- ``hypothesis``: each target as a hypothesis test with random draws, run in batches until its budget is spent;
  a failure is reported with its draws (shrunk to a minimal example with ``--shrink``, which takes unbounded
  time);
- ``atheris`` (coverage-guided libFuzzer, ``pip install atheris``, the ``fuzz`` extra): the very same targets
  driven through hypothesis' ``fuzz_one_input`` (libFuzzer mutates the bytes hypothesis draws from), the
  ``proxy`` package instrumented for coverage; each target in a subprocess (libFuzzer exits on a crash: the
  target is started again, with the corpus it built, until its budget is spent); a crash input is kept
  (``--artifacts``, by default ~/.cache/sluice/fuzz/TARGET/) and replayed through hypothesis for its traceback
  and draws (``--replay TARGET:FILE`` does it again);
- ``auto`` (the default): atheris when it is importable, else hypothesis.

The budget is split evenly between the targets. One JSON line per target: ``{"bench": "fuzz", "target",
"engine", "seconds", "inputs", "crashes", "found": [{"error", "where", "example"}]}`` (``inputs``: the inputs run,
shrinking included; ``crashes``: distinct failures, by exception type and the line that raised it), then
``{"summary": "fuzz", "engine", "minutes", "inputs", "crashes", "targets": {target: [inputs, crashes]}}``.
Exit status 1 when anything crashed or a target ran no input (the summary's verdict, bench/support/verdict.py;
fuzzing has no goal: ``"goals": {}``). ``--smoke``: five seconds in all (each target at least one batch of 5). Every
crash found becomes an explicit regression test.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.support.verdict import add_options, emit, exit_status, summary

REPO = Path(__file__).resolve().parents[1]
BATCH = 200  # hypothesis examples per batch at most (the budget is checked between batches)
FIRST_BATCH = 5  # a target's first batch: the pace it sets sizes the next ones


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The core logs every rejected frame and closed connection: millions of lines under fuzzing."""
    import structlog

    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    try:
        yield
    finally:
        structlog.configure(**saved)


def _where(exc: BaseException) -> str:
    """The line that raised ``exc``: the innermost frame in Sluice's code (else the innermost frame)."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "/proxy/" in f.filename or "/rig/fuzz_targets" in f.filename]
    f = (ours or frames)[-1]
    return f"{os.path.relpath(f.filename, REPO)}:{f.lineno} ({f.name})"


def _notes(exc: BaseException) -> str:
    """Hypothesis' account of a failure: the draws (each cut short) and the @reproduce_failure line."""
    lines = "\n".join(getattr(exc, "__notes__", [])).splitlines()
    return "\n".join(line if len(line) <= 400 else line[:400] + "..." for line in lines)[-6000:]


def _hypothesis_test(target: Any, **kwargs: Any) -> Any:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    return settings(deadline=None, database=None, suppress_health_check=list(HealthCheck), **kwargs)(
        given(st.data())(target))


def run_hypothesis(name: str, seconds: float, shrink: bool = False, batch: int = BATCH) -> dict[str, Any]:
    from hypothesis import Phase

    from rig.fuzz_targets import TARGETS

    target = TARGETS[name]
    inputs = 0

    def counted(data: Any) -> None:
        nonlocal inputs
        inputs += 1
        target(data)

    found: dict[str, dict[str, str]] = {}
    start = time.monotonic()
    # The budget is checked between batches, so a batch is sized to what is left of it at the pace of the last
    # one (a first one of 5): a batch of 200 took 700 s at the lowest CPU priority beside CI's test sessions.
    size = min(batch, FIRST_BATCH)
    while (left := seconds - (time.monotonic() - start)) > 0:
        # Shrinking has no time bound (minutes for a large example): only with --shrink.
        phases = [Phase.generate, Phase.shrink] if shrink else [Phase.generate]
        test = _hypothesis_test(counted, max_examples=size, report_multiple_bugs=True, phases=phases,
                                print_blob=True)
        began, before = time.monotonic(), inputs
        try:
            test()
        except Exception as e:  # the target's failure, shrunk (several distinct ones come as a group)
            for sub in (e.exceptions if isinstance(e, BaseExceptionGroup) else [e]):
                error = f"{type(sub).__name__}: {sub}"[:500]
                key = f"{type(sub).__name__} at {_where(sub)}"
                found.setdefault(key, {"error": error, "where": _where(sub), "example": _notes(sub)})
        per_input = (time.monotonic() - began) / max(1, inputs - before)
        size = max(1, min(batch, int((left - (time.monotonic() - began)) / per_input)))
    return {"seconds": round(time.monotonic() - start, 1), "inputs": inputs, "found": list(found.values())}


# ------------------------------------------------------------------------------------------------ atheris

_STATS = re.compile(r"stat::number_of_executed_units:\s*(\d+)")


def run_atheris(name: str, seconds: float, workdir: Path, artifacts: Path) -> dict[str, Any]:
    corpus = workdir / name / "corpus"
    crashes = artifacts / name
    corpus.mkdir(parents=True, exist_ok=True)
    crashes.mkdir(parents=True, exist_ok=True)
    inputs = 0
    found: dict[str, dict[str, str]] = {}
    seen: set[Path] = set()
    started = time.time()
    start = time.monotonic()
    while (left := seconds - (time.monotonic() - start)) >= 2:
        cmd = [sys.executable, "-m", "bench.fuzz", "--worker", name, f"-max_total_time={int(left)}",
               "-print_final_stats=1", f"-artifact_prefix={crashes}/", "-rss_limit_mb=2048", "-timeout=60",
               "-print_pcs=0", str(corpus)]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, errors="replace", check=False)
        inputs += sum(int(n) for n in _STATS.findall(proc.stderr))
        new = [p for p in sorted(crashes.iterdir()) if p not in seen and p.stat().st_mtime >= started]
        seen.update(new)
        for path in new:
            error, where, example = replay(name, path.read_bytes())
            found.setdefault(f"{error.split(':')[0]} at {where}", {
                "error": error, "where": where, "input": str(path), "example": example})
        if not new and proc.returncode != 0:  # not a crash of the target: libFuzzer itself failed
            raise RuntimeError(f"atheris worker for {name} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return {"seconds": round(time.monotonic() - start, 1), "inputs": inputs, "found": list(found.values())}


def replay(name: str, data: bytes) -> tuple[str, str, str]:
    """A crash input of the atheris engine, run again through hypothesis: (error, where, the draws)."""
    from rig.fuzz_targets import TARGETS

    test = _hypothesis_test(_recording(TARGETS[name]))
    try:
        test.hypothesis.fuzz_one_input(data)
    except Exception as e:
        return f"{type(e).__name__}: {e}"[:500], _where(e), _notes(e)
    return "no longer fails", "", ""


def _recording(target: Any) -> Any:
    """``target`` with its draws noted on the exception it raises (fuzz_one_input reports none)."""

    def run(data: Any) -> None:
        drawn: list[str] = []

        class Recorder:
            def draw(self, strategy: Any, label: str | None = None) -> Any:
                value = data.draw(strategy, label=label)
                drawn.append(f"Draw ({label}): {value!r}")
                return value

        try:
            target(Recorder())
        except Exception as e:
            e.add_note("\n".join(drawn))
            raise

    return run


def worker(name: str, argv: list[str]) -> None:
    """One atheris run of ``name`` (libFuzzer's flags in ``argv``): the proxy package instrumented for
    coverage, the target driven through hypothesis' fuzz_one_input."""
    import atheris

    with _quiet():
        with atheris.instrument_imports(include=["proxy"]):
            from rig import fuzz_targets as fuzz
        test = _hypothesis_test(fuzz.TARGETS[name])
        atheris.Setup([sys.argv[0], *argv], test.hypothesis.fuzz_one_input)
        atheris.Fuzz()


# --------------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["--worker"]:
        worker(args_in[1], args_in[2:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="the whole run's budget, split between targets")
    ap.add_argument("--targets", default="", help="comma-separated target names (default: every target)")
    ap.add_argument("--engine", choices=["auto", "hypothesis", "atheris"], default="auto")
    ap.add_argument("--artifacts", type=Path, default=Path.home() / ".cache" / "sluice" / "fuzz",
                    help="atheris: where crash inputs are kept (one directory per target)")
    ap.add_argument("--replay", metavar="TARGET:FILE", help="run one crash input again and print its draws")
    ap.add_argument("--batch", type=int, default=BATCH, help="hypothesis: examples per batch")
    ap.add_argument("--shrink", action="store_true",
                    help="hypothesis: shrink a failure to a minimal example (unbounded time)")
    add_options(ap, "every target for about half a second, batches of 5")
    args = ap.parse_args(args_in)
    if args.smoke:
        args.minutes, args.batch = 5 / 60, 5
    from rig.fuzz_targets import TARGETS

    if args.replay:
        name, _, path = args.replay.partition(":")
        error, where, example = replay(name, Path(path).read_bytes())
        print(json.dumps({"target": name, "error": error, "where": where}))
        print(example)
        return 0 if error == "no longer fails" else 1

    names = [t for t in args.targets.split(",") if t] or list(TARGETS)
    unknown = [t for t in names if t not in TARGETS]
    if unknown:
        ap.error(f"unknown targets {unknown}; known: {', '.join(TARGETS)}")
    engine = args.engine
    if engine == "auto":
        engine = "atheris" if importlib.util.find_spec("atheris") is not None else "hypothesis"
    per_target = args.minutes * 60 / len(names)
    totals: dict[str, list[int]] = {}
    with tempfile.TemporaryDirectory(prefix="sluice-fuzz-") as tmp, _quiet():
        for name in names:
            if engine == "atheris":
                result = run_atheris(name, per_target, Path(tmp), args.artifacts)
            else:
                result = run_hypothesis(name, per_target, args.shrink, args.batch)
            line = {"bench": "fuzz", "target": name, "engine": engine, "seconds": result["seconds"],
                    "inputs": result["inputs"], "crashes": len(result["found"]), "found": result["found"]}
            print(json.dumps(line), flush=True)
            totals[name] = [result["inputs"], len(result["found"])]
    crashes = sum(c for _, c in totals.values())
    # the check: nothing crashed, and every target was run (a target that ran no input checked nothing)
    line = summary("fuzz", {"engine": engine, "minutes": round(args.minutes, 3),
                            "inputs": sum(i for i, _ in totals.values()), "crashes": crashes, "targets": totals}, {},
                   checks={"every_target_ran": all(inputs > 0 for inputs, _ in totals.values())},
                   errors=[f"{name}: {c} crashes" for name, (_, c) in totals.items() if c])
    emit(line)
    return exit_status(line, args.check)


if __name__ == "__main__":
    sys.exit(main())
