"""The landed table (proxy/analytics/landed.py): generated logs - several files, gzip, malformed lines of every
kind, lines of another schema or event, the optional fields - landed into a Delta table, and the report over the
table equals the report over the JSON lines it came from, table by table. A time range reads only its lines; the
table is partitioned by the lines' date and hour."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bench.gen_logs import generate
from proxy.analytics.job import JobOptions, JobResult, run_job
from proxy.analytics.landed import LandedTable, land_logs
from tests.analytics.conftest import sorted_rows
from tests.analytics.oracle import Oracle, epoch_us
from tests.analytics.test_generated import HAND_MADE

# One Spark job per test's setup at most (the fixtures are module-scoped, set up by the first test that uses them):
# each test's time limit then covers one job, also on a busy machine.
OPTIONS = JobOptions(rate_window_s=10)


@dataclass
class Landed:
    uri: str
    logs: Path
    oracle: Oracle


@pytest.fixture(scope="module")
def landed(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Landed:
    base = tmp_path_factory.mktemp("landed")
    logs = base / "logs"
    generate(logs / "plain", 6_000, files=2, malformed=5, extensions=True, span_s=600, seed=11)
    generate(logs / "gz", 3_000, files=1, compress=True, malformed=3, extensions=True, span_s=600, seed=12)
    (logs / "hand-made.jsonl").write_text("\n".join(HAND_MADE) + "\n", encoding="utf-8")
    uri = str(base / "access_log")
    land_logs(spark, [str(logs.absolute())], uri)
    return Landed(uri, logs.absolute(), Oracle.read([logs.absolute()]))


@pytest.fixture(scope="module")
def from_json(spark: SparkSession, landed: Landed) -> JobResult:
    return run_job(spark, [str(landed.logs)], landed.logs.parent / "from-json", OPTIONS)


@pytest.fixture(scope="module")
def from_table(spark: SparkSession, landed: Landed) -> JobResult:
    return run_job(spark, LandedTable(landed.uri), landed.logs.parent / "from-table", OPTIONS)


def _summary(result: JobResult) -> dict[str, Any]:
    s = result.summary()
    return {k: v for k, v in s.items() if k not in ("report", "seconds", "tables")}


def test_the_table_keeps_every_line_partitioned_by_date_and_hour(spark: SparkSession, landed: Landed) -> None:
    # one query (each costs seconds on a busy machine): per class, the partitions its lines are in, how many lines
    # keep their text, and how many sit in another partition than their ts's date and hour (UTC)
    rows = spark.read.format("delta").load(landed.uri).groupBy("class").agg(
        F.count(F.lit(1)).alias("lines"),
        F.count("line").alias("with_text"),
        F.collect_set(F.struct(F.col("date").cast("string"), "hour")).alias("parts"),
        F.count_if(F.col("ts").isNotNull() & ((F.col("date") != F.to_date("ts")) | (F.col("hour") != F.hour("ts"))))
        .alias("misfiled"),
    ).collect()
    assert {r["class"]: r["lines"] for r in rows} == {k: v for k, v in landed.oracle.classes.items() if v}
    # malformed lines keep their text; the others do not need it
    assert {r["class"]: r["with_text"] for r in rows if r["with_text"]} == {"malformed": landed.oracle.classes[
        "malformed"]}
    assert sum(r["misfiled"] for r in rows) == 0
    parts = {tuple(p) for r in rows for p in r["parts"]}
    assert ("2025-01-31", 12) in parts  # the hand-made lines at 12:03 and 12:04


def test_the_report_over_the_json_counts_every_line(landed: Landed, from_json: JobResult) -> None:
    c = from_json.counts
    o = landed.oracle.classes
    assert (c.valid, c.malformed, c.incomplete, c.other_schema, c.other_event) == (
        o["valid"], o["malformed"], o["incomplete"], o["other_schema"], o["other_event"])


def test_the_report_over_the_table_equals_the_report_over_the_json(spark: SparkSession, from_json: JobResult,
                                                                   from_table: JobResult) -> None:
    assert from_table.tables.keys() == from_json.tables.keys()
    for name in from_json.tables:
        assert sorted_rows(spark, from_table.tables[name]) == sorted_rows(spark, from_json.tables[name]), name
    assert _summary(from_table) == _summary(from_json)
    c = from_table.counts
    page = from_table.report.read_text()
    assert "First 5 malformed line(s)" in page and f"{c.malformed:,} malformed lines" in page


def test_a_time_range_reads_exactly_its_lines(spark: SparkSession, landed: Landed, tmp_path: Path) -> None:
    rows = landed.oracle.rows
    first = min(epoch_us(r["ts"]) for r in rows)
    start = datetime.fromtimestamp(first / 1e6, UTC).replace(microsecond=0) + timedelta(seconds=120)
    end = start + timedelta(seconds=180)
    inside = [r for r in rows if start.timestamp() * 1e6 <= epoch_us(r["ts"]) < end.timestamp() * 1e6]
    assert 0 < len(inside) < len(rows)
    result = run_job(spark, LandedTable(landed.uri, start, end), tmp_path)
    assert result.counts.valid == len(inside)
    assert result.counts.first_ts is not None and result.counts.first_ts >= start
    assert result.counts.last_ts is not None and result.counts.last_ts < end


def test_sluice_report_reads_the_table(landed: Landed, from_json: JobResult, tmp_path: Path) -> None:
    # its own process: `sluice report` stops the Spark session it ran in, which here would be the module's
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    proc = subprocess.run(
        [sys.executable, "-m", "proxy", "report", "--table", landed.uri, "--out", str(tmp_path), "--rate-window", "10s",
         "--conf", "spark.sql.shuffle.partitions=4", "--conf", "spark.driver.memory=1g"],
        capture_output=True, text=True, timeout=600, check=False, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    expected = _summary(from_json)
    assert {k: summary[k] for k in expected} == expected
    assert f"table {landed.uri}" in (tmp_path / "report.html").read_text()
