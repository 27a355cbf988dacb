"""The landed table (proxy/analytics/landed.py): generated logs - several files, gzip, malformed lines of every
kind, lines of another schema or event, the optional fields - landed into a Delta table, and the report over the
table equals the report over the JSON lines it came from, table by table. A time range reads only its lines; the
table is partitioned by the lines' date and hour.

The report reads the rollups landed beside the lines when its windows allow, and the lines otherwise: both equal the
report over the JSON - whether the logs landed in one batch or in two (rows of one window in each, a batch replayed),
with a bucket the rollups cannot give (15 s), or from a table landed before the rollups existed."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bench.support.gen_logs import generate
from proxy.analytics.job import JobOptions, JobResult, run_job
from proxy.analytics.landed import ROLLUPS, LandedTable, land, land_logs, landed_rows, sibling
from proxy.analytics.source import classify, read_access_logs_raw
from tests.analytics.conftest import sluice, sorted_rows
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


@dataclass
class Report:
    result: JobResult
    progress: list[str]


def _report(spark: SparkSession, logs: list[str] | LandedTable, out: Path, options: JobOptions = OPTIONS) -> Report:
    said: list[str] = []
    return Report(run_job(spark, logs, out, options, progress=said.append), said)


def _land_in_two_batches(spark: SparkSession, logs: Path, uri: str, *, without_rollups: bool = False) -> None:
    """The plain files as micro-batch 0, the rest as batch 1 (landed twice: a replay), as a stream lands them.
    ``without_rollups``: batch 0 lands as a Sluice before the rollups did (only the lines)."""
    def rows(paths: list[Path]) -> Any:
        return landed_rows(classify(read_access_logs_raw(spark, [str(p) for p in paths])))

    land(rows([logs / "plain"]), uri, writer_id="test-stream", batch_id=0)
    if without_rollups:
        for name in ROLLUPS:
            shutil.rmtree(sibling(uri, name))
    for _ in range(2):
        land(rows([logs / "gz", logs / "hand-made.jsonl"]), uri, writer_id="test-stream", batch_id=1)


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
def table_report(spark: SparkSession, landed: Landed) -> Report:
    return _report(spark, LandedTable(landed.uri), landed.logs.parent / "from-table")


@pytest.fixture(scope="module")
def from_table(table_report: Report) -> JobResult:
    return table_report.result


def _summary(result: JobResult) -> dict[str, Any]:
    s = result.summary()
    return {k: v for k, v in s.items() if k not in ("report", "seconds", "tables")}


def _assert_equal(spark: SparkSession, got: JobResult, want: JobResult) -> None:
    assert got.tables.keys() == want.tables.keys()
    for name in want.tables:
        assert sorted_rows(spark, got.tables[name]) == sorted_rows(spark, want.tables[name]), name
    assert _summary(got) == _summary(want)


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
                                                                   table_report: Report) -> None:
    assert "reading the landed rollups" in table_report.progress
    from_table = table_report.result
    _assert_equal(spark, from_table, from_json)
    c = from_table.counts
    page = from_table.report.read_text()
    assert "First 5 malformed line(s)" in page and f"{c.malformed:,} malformed lines" in page


def test_latency_percentiles_are_those_of_the_quantized_latencies(spark: SparkSession, landed: Landed,
                                                                  from_table: JobResult) -> None:
    got = {r["api"]: (r["measured"], r["p50_ms"], r["p95_ms"], r["p99_ms"], r["max_ms"], r["mean_ms"])
           for r in spark.read.parquet(from_table.tables["latency_by_api"]).collect() if r["measured"]}
    assert got == landed.oracle.latency_by_api()


def test_two_batches_and_a_replay_land_the_same_tables(spark: SparkSession, landed: Landed, from_json: JobResult,
                                                       tmp_path: Path) -> None:
    uri = str(tmp_path / "access_log")
    _land_in_two_batches(spark, landed.logs, uri)
    # rows of one window in both batches: the rollup holds them apart, the report merges them
    windows = spark.read.format("delta").load(sibling(uri, "counts")).groupBy("window").agg(
        F.count_distinct("source").alias("sources"))
    assert windows.filter(F.col("sources") > 1).count() > 0
    report = _report(spark, LandedTable(uri), tmp_path / "out")
    assert "reading the landed rollups" in report.progress
    _assert_equal(spark, report.result, from_json)


def test_a_bucket_the_rollups_cannot_give_reads_the_lines(spark: SparkSession, landed: Landed,
                                                          tmp_path: Path) -> None:
    options = JobOptions(bucket_s=15, rate_window_s=10)  # a 5-second rollup window
    want = run_job(spark, [str(landed.logs)], tmp_path / "json", options)
    report = _report(spark, LandedTable(landed.uri), tmp_path / "table", options)
    assert any(m.startswith("reading the landed lines: the report's windows (5 s") for m in report.progress)
    _assert_equal(spark, report.result, want)


def test_a_table_landed_before_the_rollups_keeps_reading_its_lines(spark: SparkSession, landed: Landed,
                                                                    from_json: JobResult, tmp_path: Path) -> None:
    uri = str(tmp_path / "access_log")
    _land_in_two_batches(spark, landed.logs, uri, without_rollups=True)
    # rollups of batch 1 alone would miss batch 0's lines: none are landed
    assert not any(Path(sibling(uri, name)).exists() for name in ROLLUPS)
    report = _report(spark, LandedTable(uri), tmp_path / "out")
    assert "reading the landed lines: the table has no rollups (landed before them)" in report.progress
    _assert_equal(spark, report.result, from_json)


@pytest.mark.parametrize("offset_s", [0, 3], ids=["on-window-boundaries", "off-them"])
def test_a_time_range_reads_exactly_its_lines(spark: SparkSession, landed: Landed, tmp_path: Path,
                                              offset_s: int) -> None:
    rows = landed.oracle.rows
    first = min(epoch_us(r["ts"]) for r in rows) // 10_000_000 * 10
    start = datetime.fromtimestamp(first + 120 + offset_s, UTC)
    end = start + timedelta(seconds=180)
    inside = [r for r in rows if start.timestamp() * 1e6 <= epoch_us(r["ts"]) < end.timestamp() * 1e6]
    assert 0 < len(inside) < len(rows)
    # 10-second buckets (3 minutes would get 2-second ones, which only the lines give)
    report = _report(spark, LandedTable(landed.uri, start, end), tmp_path, JobOptions(bucket_s=10, rate_window_s=10))
    # the rollups hold 10-second windows: a range between their boundaries is read from the lines
    assert ("reading the landed rollups" in report.progress) == (offset_s == 0)
    result = report.result
    assert result.counts.valid == len(inside)
    assert result.counts.first_ts is not None and result.counts.first_ts >= start
    assert result.counts.last_ts is not None and result.counts.last_ts < end
    requests = spark.read.parquet(result.tables["by_api"]).agg(F.sum("requests")).collect()[0][0]
    assert requests == len(inside)


def test_sluice_report_reads_the_table(landed: Landed, from_json: JobResult, tmp_path: Path) -> None:
    # the module's last test: `sluice report` stops the Spark session it ran in, the module's
    rc, out, err = sluice("report", "--table", landed.uri, "--out", str(tmp_path), "--rate-window", "10s",
                          "--conf", "spark.sql.shuffle.partitions=4")
    assert rc == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    expected = _summary(from_json)
    assert {k: summary[k] for k in expected} == expected
    assert f"table {landed.uri}" in (tmp_path / "report.html").read_text()
