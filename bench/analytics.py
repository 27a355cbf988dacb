"""Analytics benchmark: the Spark job (``proxy.analytics``, what ``sluice report --logs`` runs) over generated
access logs, on local[2], compared with another revision's job on the same data in the same run.

``python -m bench.analytics [--rows 10000000] [--compare REV] [--files 4] [--clients 64] [--topics 24]
[--malformed N] [--cache-dir DIR] [--master local[2]]``

The logs (``bench.support.gen_logs`` with the optional per-partition/throttle/session fields, so every report section
runs) are generated once and kept in ``--cache-dir`` (default: ``sluice-bench-analytics`` in the temporary directory),
keyed by the generator's parameters and source: a later run with the same parameters reads them again instead of
spending a minute or two writing ~5 GB. The default data set is a fleet's hour: 10M request lines from 4 sidecars, each
serving 64 client_ids (Zipf-like shares; one throttled) over 24 topics (~260 partitions), 1 line in 10,000 malformed.

The landed table: the same logs landed once (``proxy.analytics.landed.land_logs``, in its own process; kept in the
cache directory beside the logs, keyed by them and the landing code), and the same job over it (``sluice report
--table``), in the order JSON, table, table, JSON.

Each job runs in its own process with its own Spark session (a fresh JVM): first an unmeasured warm-up job over 100k
rows (the JVM compiles the hot paths during its first job; that is start-up cost, not throughput), then the measured
job: read, classify, every Parquet table, the HTML report - ``run_job`` end to end. ``--compare REV`` also runs the
job of git revision REV (its ``proxy/`` package, extracted from git) the same way, twice each, in the order REV,
this tree, this tree, REV (ABBA: whatever the machine's state drifts by, e.g. a page cache warmed by the first job,
lands on both sides alike), over the JSON lines and, when REV has the landed table, over it too (``baseline_landed``,
around this tree's jobs over the table); each side's figures are the mean of its two jobs.

Prints JSON lines: the data set (generated or cached), the landed table (landed or cached), one line per job - seconds
and rows/s, the phases (read: parse + classify + counts; tables; report), and the Spark JVM's CPU seconds in each phase,
which say more than wall seconds on a shared machine - and a last line ``{"summary": "analytics", "rows": ...,
"rows_per_s": ..., "landed_rows_per_s": ..., "baseline_rows_per_s": ..., "speedup": ...,
"baseline_landed_rows_per_s": ..., "landed_speedup": ..., "goals", "met", "tables_equal", "every_line_read",
"correct"}`` (bench/support/verdict.py). The checks: every Parquet table of every job - over the JSON
lines and over the landed table - holds the same rows (floats to 9 significant digits), so a faster job that changed a
result shows here (``tables_equal``); every job read every line generated, valid as valid and malformed as malformed
(``every_line_read``); the exit status is 1 when either fails. Goals: 250k rows/s over the JSON lines, 1M over the
landed table (``--check`` exits 1 when one is missed). ``--smoke``: 2,000 lines over 2 files, no warm-up, one job
over the lines and one over the table (``--in-process``: in this process, as tests/analytics runs it in its Spark
session: CI's smoke run of this bench, without a second JVM's start).

``--cold``: what a user waits for instead - ``sluice report`` run as a command, a fresh JVM each and no warm-up, over
the landed table and over the JSON lines, each in the order table, JSON, JSON, table; with ``--compare REV``, REV's
``sluice report`` (its ``proxy`` package) before and after each of this tree's runs of a source, ABBA. The figure is
the seconds from the command's start to its exit; the check is the same (every report's ``summary.json`` counts
every line; every run's tables equal, digested in one Spark session at the end). A line per run, then
``{"summary": "analytics_cold", "landed_s", "json_s", ...}`` with no goal: start-up is not what the goals measure.

Measured figures are in docs/PERFORMANCE.md (Analytics).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bench.support.gen_logs as gen_logs
from bench.support.gen_logs import Deployment, generate
from bench.support.revision import REPO, extract_revision
from bench.support.verdict import add_options, at_least, emit, exit_status, summary
from rig.cpu import cpu_seconds

WARMUP_ROWS = 100_000
SPAN_S = 3600.0
#: the job over JSON lines at 250k rows/s, over the landed table at 1M rows/s (on local[2])
GOALS = {"rows_per_s": at_least(250_000), "landed_rows_per_s": at_least(1_000_000)}
#: what the landed table's layout depends on: a change to these lands the cached tables again
LANDING_SOURCES = ("proxy/analytics/landed.py", "proxy/analytics/source.py", "proxy/analytics/schema.py",
                   "proxy/analytics/aggregates.py")  # the rollups landed beside the lines


# ------------------------------------------------------------------------------------------------- the data


def cached_logs(cache: Path, rows: int, *, files: int, clients: int, topics: int, malformed: int) -> Path:
    """The generated logs for these parameters, written on first use; a directory is complete once its marker
    exists (a run killed while generating leaves no marker, and the next run starts over)."""
    source = Path(gen_logs.__file__).read_bytes()
    params = {"rows": rows, "files": files, "clients": clients, "topics": topics, "malformed": malformed,
              "span_s": SPAN_S, "generator": hashlib.sha256(source).hexdigest()[:16]}
    key = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:12]
    logs = cache / f"logs-{rows}-{key}"
    marker = logs / "_COMPLETE.json"
    if marker.exists():
        info = json.loads(marker.read_text())
        emit({"bench": "analytics", "stage": "data", "cached": True, "dir": str(logs), **info})
        return logs
    shutil.rmtree(logs, ignore_errors=True)
    result = generate(logs, rows, files=files, malformed=malformed, extensions=True, span_s=SPAN_S,
                      deployment=Deployment.sized(clients, topics))
    info = {**params, "bytes": result.bytes, "gen_s": round(result.seconds, 1)}
    marker.write_text(json.dumps(info))  # not read as a log: Spark skips files whose names start with _
    emit({"bench": "analytics", "stage": "data", "cached": False, "dir": str(logs), **info})
    return logs


def checked(args: list[str], cwd: Path, what: str) -> str:
    """Run ``args`` in ``cwd`` to its end: its standard output; RuntimeError naming ``what`` (with the end of its
    standard error) if it failed."""
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc.stdout


def child(args: list[str], what: str) -> Any:
    """``python -m bench.analytics ARGS`` (a worker mode) in a process of its own: the JSON of its last line."""
    return json.loads(checked([sys.executable, "-m", "bench.analytics", *args], REPO, what).strip().splitlines()[-1])


def landed_table(cache: Path, logs: Path, master: str) -> Path:
    """The Delta table ``logs`` land as (``proxy.analytics.landed.land_logs``, in a worker process), landed on first
    use and kept beside them, keyed by the logs and the landing code; complete once its marker exists."""
    code = hashlib.sha256(b"".join((REPO / f).read_bytes() for f in LANDING_SOURCES)).hexdigest()[:12]
    table = cache / f"landed-{logs.name}-{code}"
    marker = cache / f"{table.name}.complete.json"
    if marker.exists():
        emit({"bench": "analytics", "stage": "landed", "cached": True, "table": str(table),
              **json.loads(marker.read_text())})
        return table
    shutil.rmtree(table, ignore_errors=True)
    info: dict[str, Any] = child(["--land", str(logs), "--out", str(table), "--master", master], f"landing {logs}")
    marker.write_text(json.dumps(info))
    emit({"bench": "analytics", "stage": "landed", "cached": False, "table": str(table), **info})
    return table


def land_worker(logs: Path, table: Path, master: str) -> dict[str, Any]:
    from proxy.analytics.landed import land_logs
    from proxy.analytics.session import build_session

    spark = build_session(master, app_name="sluice-bench-analytics-land", delta=True)
    try:
        cpu = _jvm_cpu()
        t, c = time.monotonic(), cpu()
        land_logs(spark, [str(logs)], str(table))
        land_s, land_cpu = time.monotonic() - t, cpu() - c
        lines = spark.read.format("delta").load(str(table)).count()
    finally:
        spark.stop()
    size = sum(f.stat().st_size for f in table.rglob("*") if f.is_file())
    return {"lines": lines, "land_s": round(land_s, 1), "land_cpu_s": round(land_cpu, 1),
            "land_rows_per_s": round(lines / land_s), "table_bytes": size}


# ------------------------------------------------------------------------------------------------- a job


def rounded(value: Any) -> Any:
    """Rows compared across jobs: floats to 9 significant digits (sums of doubles may differ in the last bits
    with the order Spark adds them in), everything else as is."""
    if isinstance(value, float):
        return float(f"{value:.9g}")
    if isinstance(value, list | tuple):
        return [rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    return value


def table_digests(spark: Any, tables: dict[str, str]) -> dict[str, str]:
    out = {}
    for name, path in sorted(tables.items()):
        rows = sorted(json.dumps(rounded(r.asDict(recursive=True)), sort_keys=True, default=str)
                      for r in spark.read.parquet(path).collect())
        out[name] = hashlib.sha256("\n".join(rows).encode()).hexdigest()[:16]
    return out


class _Phases:
    """Wall, Spark-JVM CPU and Python CPU seconds at the job's progress messages: the job says when it has read and
    counted the lines (``N lines: ...``), written its tables (``wrote N tables``) and the report (``report: PATH``).
    The Python process's CPU is the driver's side: planning calls through py4j, and drawing the report's charts."""

    MARKS = (("read", " lines: "), ("tables", "wrote "), ("report", "report: "))

    def __init__(self, jvm_cpu: Callable[[], float]) -> None:
        self.jvm_cpu = jvm_cpu
        self.start = self._now()
        self.marks: dict[str, tuple[float, float, float]] = {}

    def _now(self) -> tuple[float, float, float]:
        return time.monotonic(), self.jvm_cpu(), time.process_time()

    def __call__(self, message: str) -> None:
        for key, text in self.MARKS:
            if text in message or message.startswith(text):
                self.marks.setdefault(key, self._now())

    def split(self) -> dict[str, float]:
        out: dict[str, float] = {}
        prev = self.start
        for key, _text in self.MARKS:
            mark = self.marks.get(key, prev)
            out[f"{key}_s"] = round(mark[0] - prev[0], 2)
            out[f"{key}_cpu_s"] = round(mark[1] - prev[1], 1)
            out[f"{key}_py_cpu_s"] = round(mark[2] - prev[2], 1)
            prev = mark
        return out


def _jvm_cpu() -> Callable[[], float]:
    """CPU seconds (user + system) of this process's Spark JVM so far (rig/cpu.py)."""
    import psutil

    java = [p for p in psutil.Process().children(recursive=True) if p.name() == "java"]
    assert len(java) == 1, f"expected one Spark JVM, found {len(java)}"
    pid = java[0].pid
    return lambda: cpu_seconds(pid)


def measured_job(spark: Any, cpu: Callable[[], float], logs: Any, out: Path) -> dict[str, Any]:
    """One measured run of the job over ``logs`` (JSON lines' paths, or a landed table), with its tables' digests."""
    from proxy.analytics.job import run_job

    phases = _Phases(cpu)
    result = run_job(spark, logs, out, progress=phases)
    job_s = time.monotonic() - phases.start[0]
    job_cpu = cpu() - phases.start[1]
    job_py_cpu = time.process_time() - phases.start[2]
    return {
        "lines": result.counts.lines,
        "valid": result.counts.valid,
        "malformed": result.counts.malformed,
        "job_s": round(job_s, 2),
        "job_cpu_s": round(job_cpu, 1),
        "job_py_cpu_s": round(job_py_cpu, 1),
        **phases.split(),
        "rows_per_s": round(result.counts.lines / job_s),
        "tables": table_digests(spark, result.tables),
    }


def worker(code: Path, logs: Path, warmup: Path, out: Path, master: str, landed: bool = False) -> dict[str, Any]:
    """One job in this process, importing ``proxy`` from ``code`` (this tree, or a revision extracted from git);
    ``landed``: ``logs`` and ``warmup`` are landed tables (``sluice report --table``), not JSON lines."""
    sys.path.insert(0, str(code))
    import proxy
    from proxy.analytics.job import run_job
    from proxy.analytics.session import build_session

    assert Path(proxy.__file__).resolve().is_relative_to(code.resolve()), proxy.__file__

    def source(path: Path) -> Any:  # a revision before the landed table has no job.Logs
        if landed:
            from proxy.analytics.landed import LandedTable

            return LandedTable(str(path))
        return [str(path)]

    started = time.monotonic()
    # a revision before the landed table has no ``delta`` parameter
    spark = (build_session(master, app_name="sluice-bench-analytics", delta=True) if landed
             else build_session(master, app_name="sluice-bench-analytics"))
    try:
        cpu = _jvm_cpu()
        session_s = time.monotonic() - started
        t = time.monotonic()
        run_job(spark, source(warmup), out / "warmup")
        warmup_s = time.monotonic() - t
        result = measured_job(spark, cpu, source(logs), out / "job")
    finally:
        spark.stop()
    return {"session_s": round(session_s, 1), "warmup_s": round(warmup_s, 1), **result}


def smoke_worker(logs: Path, out: Path, master: str) -> dict[str, Any]:
    """``--smoke`` in one Spark session (each session costs a JVM's start and its JIT warm-up, most of a smoke
    run's time): ``logs`` landed into a table under ``out``, the job over the lines, the job over the table."""
    from proxy.analytics.landed import LandedTable, land_logs
    from proxy.analytics.session import build_session

    spark = build_session(master, app_name="sluice-bench-analytics-smoke", delta=True)
    try:
        cpu = _jvm_cpu()
        land_logs(spark, [str(logs)], str(out / "table"))
        return {"current": measured_job(spark, cpu, [str(logs)], out / "current"),
                "landed": measured_job(spark, cpu, LandedTable(str(out / "table")), out / "landed")}
    finally:
        spark.stop()


def run_worker(code: Path, logs: Path, warmup: Path, scratch: Path, master: str, landed: bool = False
               ) -> dict[str, Any]:
    """``worker`` in a child process (one JVM per job: neither job inherits the other's heap, JIT or caches)."""
    out = Path(tempfile.mkdtemp(prefix="job-", dir=scratch))
    args = ["--worker", str(code), "--logs", str(logs), "--warmup", str(warmup), "--out", str(out), "--master",
            master, *(["--landed"] if landed else [])]
    try:
        result: dict[str, Any] = child(args, f"job for {code}")
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return result


# ------------------------------------------------------------------------------------------------- cold


def cold_run(code: Path, source: list[str], out: Path, master: str) -> dict[str, Any]:
    """``sluice report`` as a user runs it (``python -m proxy report``, ``code``'s package), over ``source``
    (``--table URI`` or ``--logs PATH``) into ``out``: its seconds, start to exit, and its summary.json."""
    args = [sys.executable, "-m", "proxy", "report", *source, "--out", str(out), "--master", master]
    started = time.monotonic()
    checked(args, code, f"sluice report of {code}")
    seconds = time.monotonic() - started
    report: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return {"seconds": round(seconds, 2), "lines": report["lines"], "valid": report["valid"],
            "malformed": report["malformed"], "tables": report["tables"]}


def digest_worker(tables: Path) -> dict[str, dict[str, str]]:
    """``--digest``: the digests of every run's tables (``tables``: a JSON file, run -> its tables), in one session."""
    from proxy.analytics.session import build_session

    runs: dict[str, dict[str, str]] = json.loads(tables.read_text())
    spark = build_session("local[2]", app_name="sluice-bench-analytics-digest")
    try:
        return {run: table_digests(spark, t) for run, t in runs.items()}
    finally:
        spark.stop()


def measure_cold(a: argparse.Namespace, cache: Path, logs: Path) -> tuple[dict[str, list[dict[str, Any]]], bool]:
    """``--cold``'s runs, each source's ABBA (REV around this tree's with ``--compare``), each run's line emitted;
    the runs by side and source, and whether every run's tables are equal."""
    table = landed_table(cache, logs, a.master)
    scratch = Path(tempfile.mkdtemp(prefix="sluice-bench-analytics-cold-"))
    try:
        sides = [("current", REPO, "working tree")]
        if a.compare:
            code = scratch / "baseline"
            sides = [("baseline", code, extract_revision(a.compare, code)), *sides]
        order = [*sides, *reversed(sides)] * (1 if a.compare else 2)  # REV, this, this, REV; or this four times
        runs: dict[str, list[dict[str, Any]]] = {}
        outputs: dict[str, dict[str, str]] = {}
        for source, args in (("landed", ["--table", str(table)]), ("json", ["--logs", str(logs)])):
            for side, code, rev in order:
                name = f"{side}_{source}"
                out = scratch / f"{name}-{len(runs.get(name, []))}"
                r = cold_run(code, args, out, a.master)
                outputs[out.name] = r.pop("tables")
                runs.setdefault(name, []).append(r)
                emit({"bench": "analytics", "cold": name, "revision": rev, "rows": a.rows,
                      "load_avg_1m": round(os.getloadavg()[0], 2), **r})
        listing = scratch / "tables.json"
        listing.write_text(json.dumps(outputs))
        digests = list(child(["--digest", str(listing)], "digesting the tables").values())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return runs, all(d == digests[0] for d in digests)


def cold_summary(a: argparse.Namespace, runs: dict[str, list[dict[str, Any]]], equal: bool, malformed: int
                 ) -> dict[str, Any]:
    def mean(name: str) -> float:
        return round(statistics.mean(r["seconds"] for r in runs[name]), 2)

    figures: dict[str, Any] = {"rows": a.rows, "landed_s": mean("current_landed"), "json_s": mean("current_json")}
    if a.compare:
        figures |= {"compare": a.compare, "baseline_landed_s": mean("baseline_landed"),
                    "baseline_json_s": mean("baseline_json")}
        figures |= {"speedup_landed": round(figures["baseline_landed_s"] / figures["landed_s"], 3),
                    "speedup_json": round(figures["baseline_json_s"] / figures["json_s"], 3)}
    figures["order"] = "ABBA"
    return summary("analytics_cold", figures, {}, checks={
        "tables_equal": equal,
        "every_line_read": all(r["valid"] == a.rows and r["malformed"] == malformed for rs in runs.values()
                               for r in rs)})


# ------------------------------------------------------------------------------------------------- main


def mean_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One side's figures over its jobs: the first job's line with rows/s, seconds and CPU seconds averaged."""
    out = dict(runs[0])
    for key in ("rows_per_s", "job_s", "job_cpu_s"):
        out[key] = round(sum(r[key] for r in runs) / len(runs), 3)
    return out


def measure(a: argparse.Namespace, cache: Path, logs: Path) -> dict[str, list[dict[str, Any]]]:
    """The measured jobs (each in a process of its own, after a warm-up job): over the lines and over the landed
    table, ABBA, and with ``--compare`` the baseline's around them; each job's line emitted."""
    warmup = cached_logs(cache, WARMUP_ROWS, files=a.files, clients=a.clients, topics=a.topics, malformed=10)
    warmup_table = landed_table(cache, warmup, a.master)
    table = landed_table(cache, logs, a.master)
    scratch = Path(tempfile.mkdtemp(prefix="sluice-bench-analytics-"))
    try:
        current = ("current", REPO, "working tree")
        landed = ("landed", REPO, "working tree")
        jobs: list[tuple[str, Path, str]] = [current, landed, landed, current]  # ABBA
        if a.compare:
            code = scratch / "baseline"
            rev = extract_revision(a.compare, code)
            baseline = ("baseline", code, rev)
            # REV's job over the landed table too, around this tree's (a revision before the table has none)
            around = [baseline, ("baseline_landed", code, rev)] if (code / "proxy/analytics/landed.py").exists() \
                else [baseline]
            jobs = [*around, *jobs, *reversed(around)]
        runs: dict[str, list[dict[str, Any]]] = {}
        for name, code, rev in jobs:
            if name in ("landed", "baseline_landed"):
                r = run_worker(code, table, warmup_table, scratch, a.master, landed=True)
            else:
                r = run_worker(code, logs, warmup, scratch, a.master)
            runs.setdefault(name, []).append(r)
            emit({"bench": "analytics", "job": name, "revision": rev, "rows": a.rows,
                  "load_avg_1m": round(os.getloadavg()[0], 2), **r})
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return runs


def smoke(logs: Path, master: str, *, in_process: bool = False) -> dict[str, list[dict[str, Any]]]:
    """``--smoke``: :func:`smoke_worker` in a child process (its own JVM, as every job's), or with ``in_process``
    in this one (the Spark session already running here, if any); each job's line emitted."""
    scratch = Path(tempfile.mkdtemp(prefix="sluice-bench-analytics-smoke-"))
    try:
        if in_process:
            jobs: dict[str, dict[str, Any]] = smoke_worker(logs, scratch, master)
        else:
            jobs = child(["--smoke-worker", str(logs), "--out", str(scratch), "--master", master],
                         "the smoke run's jobs")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for name, r in jobs.items():
        emit({"bench": "analytics", "job": name, "revision": "working tree", **r})
    return {name: [r] for name, r in jobs.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000, help="request lines (default 10M)")
    ap.add_argument("--files", type=int, default=4, help="log files, one per sidecar (default 4)")
    ap.add_argument("--clients", type=int, default=64, help="client_ids per sidecar (default 64)")
    ap.add_argument("--topics", type=int, default=24, help="topics (default 24)")
    ap.add_argument("--malformed", type=int, default=None, help="malformed lines (default rows / 10,000)")
    ap.add_argument("--compare", metavar="REV", help="first run the job of this git revision on the same data")
    ap.add_argument("--cache-dir", default=str(Path(tempfile.gettempdir()) / "sluice-bench-analytics"),
                    help="where generated logs are kept between runs")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--logs", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--warmup", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--landed", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--land", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--smoke-worker", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--digest", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--cold", action="store_true",
                    help="time `sluice report` as a user runs it (a fresh JVM, no warm-up) instead (module docstring)")
    ap.add_argument("--in-process", action="store_true",
                    help="--smoke's jobs in this process (tests/analytics: in its Spark session, whose JVM is up)")
    add_options(ap, "2,000 lines over 2 files landed, one job over the lines and one over the table, in one Spark "
                    "session, no warm-up")
    a = ap.parse_args(argv)
    if a.smoke:
        a.rows, a.files = 2_000, 2
    if a.worker is not None:
        print(json.dumps(worker(a.worker, a.logs, a.warmup, a.out, a.master, a.landed)), flush=True)
        return 0
    if a.land is not None:
        print(json.dumps(land_worker(a.land, a.out, a.master)), flush=True)
        return 0
    if a.smoke_worker is not None:
        print(json.dumps(smoke_worker(a.smoke_worker, a.out, a.master)), flush=True)
        return 0
    if a.digest is not None:
        print(json.dumps(digest_worker(a.digest)), flush=True)
        return 0
    if a.cold and a.smoke:
        ap.error("--cold has no smoke run (a JVM's start per run is what it measures)")

    cache = Path(a.cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    malformed = a.rows // 10_000 if a.malformed is None else a.malformed
    emit({"bench": "analytics", "stage": "start", "master": a.master, "cpus": os.cpu_count(),
          "load_avg_1m": round(os.getloadavg()[0], 2)})
    logs = cached_logs(cache, a.rows, files=a.files, clients=a.clients, topics=a.topics, malformed=malformed)
    if a.cold:
        cold_runs, equal = measure_cold(a, cache, logs)
        cold_line = cold_summary(a, cold_runs, equal, malformed)
        emit(cold_line)
        return exit_status(cold_line, a.check)
    runs = smoke(logs, a.master, in_process=a.in_process) if a.smoke else measure(a, cache, logs)
    results = {name: mean_of(rs) for name, rs in runs.items()}
    cur = results["current"]
    figures: dict[str, Any] = {"rows": cur["lines"], "rows_per_s": cur["rows_per_s"], "job_s": cur["job_s"],
                               "job_cpu_s": cur["job_cpu_s"], "landed_rows_per_s": results["landed"]["rows_per_s"],
                               "landed_job_s": results["landed"]["job_s"],
                               "landed_job_cpu_s": results["landed"]["job_cpu_s"]}
    base = results.get("baseline")
    every = [r["tables"] for rs in runs.values() for r in rs]
    differing = sorted(n for n in set().union(*every) if len({t.get(n) for t in every}) > 1)
    figures.update({"tables_differing": differing, "order": "AB" if a.smoke else "ABBA"})
    if base is not None:
        figures.update({
            "baseline_rows_per_s": base["rows_per_s"],
            "speedup": round(cur["rows_per_s"] / base["rows_per_s"], 2),
            "cpu_ratio": round(base["job_cpu_s"] / cur["job_cpu_s"], 2) if cur["job_cpu_s"] else None,
        })
    base_landed = results.get("baseline_landed")
    if base_landed is not None:
        figures.update({
            "baseline_landed_rows_per_s": base_landed["rows_per_s"],
            "baseline_landed_job_cpu_s": base_landed["job_cpu_s"],
            "landed_speedup": round(results["landed"]["rows_per_s"] / base_landed["rows_per_s"], 2),
        })
    line = summary("analytics", figures, GOALS, checks={
        "tables_equal": not differing,
        # every job read every line generated: the valid ones as valid, the malformed ones as malformed
        "every_line_read": all(r["valid"] == a.rows and r["malformed"] == malformed for rs in runs.values()
                               for r in rs)})
    emit(line)
    return exit_status(line, a.check)


if __name__ == "__main__":
    sys.exit(main())
