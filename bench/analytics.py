"""Analytics benchmark: the Spark job (``proxy.analytics``) over generated access logs, on local[2].

``python -m bench.analytics [--sizes 1000000,10000000] [--files 4] [--dir DIR] [--master local[2]]``

One Spark session for the whole run. First an unmeasured warm-up job over 100k rows (the JVM compiles the hot
paths during its first job; that is start-up cost, not throughput), then for each size: generate the logs
(``bench.gen_logs``, with the optional per-partition/throttle/session fields, so every report section runs), run
the whole job (read, classify, cache, 14 Parquet tables, report) and delete the logs again (10M rows are ~4.5 GB).

Prints one JSON line per size: rows, generation time, job time split into read (parse + classify + cache + counts),
tables and report, and rows/s of the whole job. The last line is
``{"summary": "analytics", "rows": ..., "rows_per_s": ...}`` for the largest size. Before a size whose predicted
time (from the previous size's rate) exceeds ``--budget-s`` it says so and runs it anyway.

Measured on this project's 2-core machine (shared with other work, so +-15%): 1M rows in ~34 s (~30k rows/s,
about half of it fixed cost: JVM-side planning of ~40 small jobs and the report), 10M rows (4.9 GB of JSON) in
~115-130 s (~76-86k rows/s: reading, parsing and caching ~70%, the aggregates ~25%); generating the 10M rows takes
~55-65 s.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.gen_logs import generate

WARMUP_ROWS = 100_000
SPAN_S = 3600.0


def emit(line: dict[str, Any]) -> None:
    print(json.dumps(line), flush=True)


class _Phases:
    """Times the job's phases from its progress messages (the job reports each one as it finishes)."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.marks: dict[str, float] = {}

    def __call__(self, message: str) -> None:
        now = time.monotonic() - self.start
        for key, prefix in (("read", "lines:"), ("tables", "wrote "), ("report", "report:")):
            if message.startswith(prefix) or (key == "read" and prefix in message):
                self.marks.setdefault(key, now)

    def split(self) -> dict[str, float]:
        read = self.marks.get("read", 0.0)
        tables = self.marks.get("tables", read)
        report = self.marks.get("report", tables)
        return {"read_s": round(read, 2), "tables_s": round(tables - read, 2), "report_s": round(report - tables, 2)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000000,10000000", help="rows per run, comma-separated")
    ap.add_argument("--files", type=int, default=4, help="log files per run (sidecars); default 4")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temporary one)")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--budget-s", type=float, default=300.0, help="warn before a size predicted to take longer")
    a = ap.parse_args(argv)
    sizes = [int(s) for s in a.sizes.split(",") if s]

    from proxy.analytics.job import run_job
    from proxy.analytics.session import build_session

    scratch = Path(tempfile.mkdtemp(prefix="sluice-bench-analytics-", dir=a.dir))
    try:
        free = shutil.disk_usage(scratch).free
        started = time.monotonic()
        spark = build_session(a.master, app_name="sluice-bench-analytics")
        emit({"bench": "analytics", "stage": "session", "master": a.master,
              "seconds": round(time.monotonic() - started, 2), "scratch": str(scratch), "free_gib": free >> 30})
        try:
            logs = scratch / "warmup"
            generate(logs, WARMUP_ROWS, files=a.files, extensions=True, span_s=SPAN_S)
            t = time.monotonic()
            run_job(spark, [str(logs)], scratch / "out")
            emit({"bench": "analytics", "stage": "warmup", "rows": WARMUP_ROWS,
                  "seconds": round(time.monotonic() - t, 2)})
            shutil.rmtree(logs)

            last: dict[str, Any] | None = None
            for rows in sizes:
                if last is not None:
                    predicted = rows / last["rows_per_s"]
                    if predicted > a.budget_s:
                        # Linear in rows from the previous size: an overestimate, since the report and the
                        # per-table Spark jobs cost the same seconds at any size.
                        emit({"bench": "analytics", "note": f"{rows} rows predicted to take up to {predicted:.0f} s "
                              f"(> {a.budget_s:.0f} s budget); running anyway", "predicted_s": round(predicted)})
                logs = scratch / f"logs-{rows}"
                gen = generate(logs, rows, files=a.files, extensions=True, span_s=SPAN_S)
                phases = _Phases()
                result = run_job(spark, [str(logs)], scratch / "out", progress=phases)
                job_s = time.monotonic() - phases.start
                last = {
                    "bench": "analytics",
                    "rows": rows,
                    "files": a.files,
                    "log_bytes": gen.bytes,
                    "gen_s": round(gen.seconds, 2),
                    "gen_rows_per_s": round(rows / gen.seconds),
                    "job_s": round(job_s, 2),
                    **phases.split(),
                    "rows_per_s": round(result.counts.lines / job_s),
                    "mib_per_s": round(gen.bytes / job_s / 2**20, 1),
                }
                emit(last)
                shutil.rmtree(logs)
        finally:
            spark.stop()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if last is not None:
        emit({"summary": "analytics", "rows": last["rows"], "rows_per_s": last["rows_per_s"],
              "job_s": last["job_s"], "gen_rows_per_s": last["gen_rows_per_s"]})


if __name__ == "__main__":
    main()
