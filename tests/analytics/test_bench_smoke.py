"""``python -m bench.analytics --smoke``, CI's smoke run of the analytics bench (``make bench-smoke`` runs it in a
process of its own): here in-process, in the Spark session this directory's tests share, whose JVM already has the
Kafka connector and Delta Lake - one JVM start less in a CI run that is CPU-bound. Its whole path but the child
process: the logs generated, landed, the job over the lines and over the table, their tables compared, the verdict."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

from pyspark.sql import SparkSession

from bench.analytics import main


def test_the_analytics_benchs_smoke_run_passes_its_checks(spark: SparkSession, tmp_path: Path) -> None:
    # ``spark``: the JVM is the shared session's (started with both connectors); the smoke run stops the session
    # when done, and the next module's fixture starts another in the same JVM
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["--smoke", "--in-process", "--cache-dir", str(tmp_path / "cache")])
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    summary = lines[-1]
    assert (rc, summary["summary"], summary["correct"]) == (0, "analytics", True), summary
    assert summary["tables_equal"] and summary["every_line_read"] and summary["rows"] == 2_000
    assert [line["job"] for line in lines if "job" in line] == ["current", "landed"]
