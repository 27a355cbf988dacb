"""The analytics job: access logs -> Parquet aggregates + a self-contained HTML report (+ a JSON summary).

    run_job(spark, ["logs/"], "out/")     # -> out/parquet/<table>/, out/report.html, out/summary.json
    run_job(spark, KafkaTopic("kafka:9092", "sluice-access-log", start, end), "out/")   # the topic, a time range
    run_job(spark, LandedTable("live/access_log", start, end), "out/")   # the table `sluice stream` lands

Steps: read and classify every line once - from files or from the access-log topic - caching the valid rows (``source``;
the landed table is not cached but read column by column, classified when it landed: ``landed``); pick the time-bucket
size from the span of the logs (``buckets``); roll the events up once and write each aggregate (``aggregates``) as
Parquet. Over a landed table the rollups landed beside its lines replace the lines - the counts, the rollup, the
partition rollup and the latency histogram, re-aggregated to the report's windows - whenever those windows and the
table's time range fall on the landed windows' boundaries (``landed.rollups_missing``, ``landed.windows_unusable``; the
progress line says which it reads and why). Each table is read back from its Parquet, so the report (``sections``,
``minutes``, ``charts``, ``html``) is built from exactly what was written, from small tables; size a replication
throttle from the measured inbound rates (``kip73``). The per-minute tables (``live.MINUTE_TABLES``) are written
too: the tables ``sluice stream`` keeps current from the topic, computed here mostly from the rollup (the stream
computes them from its events: the tests hold both to the same result).

The same code runs on local[N] and on a cluster: the aggregates are plain DataFrame operations (no Python UDFs, so
no Python workers and no serialisation per row). On a cluster the Parquet destination must be a filesystem the
executors share (``parquet_uri``, e.g. hdfs:// or s3a://); the report and summary are written by the driver.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession

from proxy.analytics import aggregates as agg
from proxy.analytics import drawing, landed, live
from proxy.analytics.buckets import choose_bucket_seconds
from proxy.analytics.html import render
from proxy.analytics.kip73 import InboundRate, Recommendation, ThrottleInputs, recommend
from proxy.analytics.landed import LandedRollups, LandedTable
from proxy.analytics.sections import ReportContext, build_sections, inbound_rates
from proxy.analytics.source import InputCounts, KafkaTopic, LogInput, read_access_log_topic, read_access_logs

__all__ = ["JobOptions", "JobResult", "run_job"]

REPORT_NAME = "report.html"
SUMMARY_NAME = "summary.json"
#: every table the job may write, with what it holds (the report lists them)
ALL_TABLES: dict[str, str] = {**agg.TABLES, **{n: t.description for n, t in live.MINUTE_TABLES.items()}}


@dataclass(frozen=True)
class JobOptions:
    bucket_s: int | None = None  # None: chosen from the span of the logs (at most ~120 buckets)
    rate_window_s: int = 10  # inbound-rate windows; Kafka's quota window is 11 x 1 s samples, 10 s is close
    top_n: int = 8
    table_rows: int = 20
    throttle: ThrottleInputs = field(default_factory=ThrottleInputs)
    parquet_uri: str | None = None  # default: OUT/parquet


@dataclass(frozen=True)
class JobResult:
    out: Path
    report: Path
    counts: InputCounts
    bucket_s: int
    tables: dict[str, str]  # name -> Parquet location
    recommendation: Recommendation
    seconds: float

    def summary(self) -> dict[str, Any]:
        c = self.counts
        r = self.recommendation
        return {
            "report": str(self.report),
            "seconds": round(self.seconds, 3),
            "lines": c.lines,
            "valid": c.valid,
            "malformed": c.malformed,
            "incomplete": c.incomplete,
            "other_schema": c.other_schema,
            "other_event": c.other_event,
            "files": c.files,
            "first_ts": c.first_ts.isoformat() if c.first_ts else None,
            "last_ts": c.last_ts.isoformat() if c.last_ts else None,
            "bucket_s": self.bucket_s,
            "optional_fields": c.optional_rows,
            "tables": self.tables,
            "throttle": {
                "inbound_bps": r.inbound_bps,
                "busiest_upstream": r.busiest_upstream,
                "safe_low_bps": r.low_bps,
                "safe_high_bps": r.high_bps,
                "feasible": r.feasible,
                "recommended_bps": r.throttle_bps,
                "move_time_s": r.move_time_s,
            },
        }


def _is_local(uri: str) -> bool:
    return urlparse(uri).scheme in ("", "file")


def _local_path(uri: str) -> Path:
    return Path(urlparse(uri).path) if uri.startswith("file:") else Path(uri)


class _Writer:
    """Writes a table as Parquet (overwriting) and returns it read back from the Parquet."""

    def __init__(self, spark: SparkSession, root: str, say: Callable[[str], None]) -> None:
        self.spark = spark
        self.say = say
        self.root = root.rstrip("/")
        self.written: dict[str, DataFrame] = {}
        self.paths: dict[str, str] = {}
        if _is_local(root):
            # Tables an earlier run wrote but this one will not (an optional section without data) must not
            # linger next to fresh ones and be mistaken for this run's.
            for name in ALL_TABLES:
                shutil.rmtree(_local_path(root) / name, ignore_errors=True)

    def __call__(self, name: str, df: DataFrame) -> DataFrame:
        path = f"{self.root}/{name}"
        started = time.monotonic()
        # One file per table: they are small, and one file is what a person opening the directory expects.
        df.coalesce(1).write.mode("overwrite").parquet(path)
        # Read back with the schema it was written with: inferring it from the file's footer is a Spark job of
        # its own per table (ParquetFileFormat.inferSchema), ~0.1-0.3 s each, for what the writer already knows.
        # A file source reads every column as nullable (DataSource.resolveRelation), so this is the inferred schema.
        back = self.spark.read.schema(df.schema).parquet(path)
        self.written[name] = back
        self.paths[name] = path
        self.say(f"table {name}: {time.monotonic() - started:.1f} s")
        return back


Logs = Sequence[str] | KafkaTopic | LandedTable


def _range(start: datetime | None, end: datetime | None) -> str:
    if start is None and end is None:
        return ""
    return f" from {start.isoformat() if start else 'the start'} to {end.isoformat() if end else 'the end'}"


def describe(logs: Logs) -> str:
    if isinstance(logs, LandedTable):
        return f"table {logs.uri}{_range(logs.start, logs.end)}"
    if isinstance(logs, KafkaTopic):
        return f"topic {logs.topic} at {logs.bootstrap_servers}{_range(logs.start, logs.end)}"
    return f"{len(logs)} path(s)"


class _FromEvents:
    """The aggregates' inputs computed from the events (JSON lines, the topic, or the landed lines): the same
    methods as ``landed.LandedRollups``, which reads them precomputed."""

    def __init__(self, inp: LogInput) -> None:
        self.inp = inp
        self.counts = inp.counts
        self.malformed_samples = inp.malformed_samples

    def rollup(self, window_s: int) -> DataFrame:
        return agg.rollup(self.inp.events, window_s)

    def partition_rollup(self, window_s: int) -> DataFrame:
        return agg.partition_rollup(self.inp.events, window_s)

    def latency_histogram(self) -> DataFrame:
        return agg.latency_histogram(self.inp.events)

    def minute_tables(self) -> dict[str, DataFrame]:
        return live.minute_tables(self.inp.events)

    def release(self) -> None:
        self.inp.release()


def _bucket_s(opts: JobOptions, counts: InputCounts) -> int:
    return opts.bucket_s or choose_bucket_seconds(counts.span_s)


def _read(spark: SparkSession, logs: Logs, opts: JobOptions, say: Callable[[str], None]) -> _FromEvents | LandedRollups:
    """The job's input: a landed table's rollups when they hold the report's tables exactly (landed.py), else the
    lines, read and classified."""
    if isinstance(logs, LandedTable):
        why = landed.rollups_missing(spark, logs)
        if why is None:
            rollups = landed.landed_rollups(spark, logs)
            bucket_s = _bucket_s(opts, rollups.counts)
            why = landed.windows_unusable(agg.rollup_window_s(bucket_s, opts.rate_window_s),
                                          agg.partition_rollup_window_s(bucket_s))
            if why is None:
                say("reading the landed rollups")
                return rollups
        say(f"reading the landed lines: {why}")
        return _FromEvents(landed.read_landed(spark, logs))
    if isinstance(logs, KafkaTopic):
        return _FromEvents(read_access_log_topic(spark, logs))
    return _FromEvents(read_access_logs(spark, [str(p) for p in logs]))


#: Spark settings for the job's own queries, restored after it. Adaptive execution off: it runs each query stage as
#: a Spark job of its own (AdaptiveSparkPlanExec materializes the shuffle stages one by one) to re-plan the rest from
#: their sizes, and after the read every query here is over small tables - a rollup, the Parquet tables - where
#: there is nothing to re-plan and the extra jobs were the cost (half of the job's Spark jobs, measured at 2M lines:
#: docs/PERFORMANCE.md, Analytics). The results do not depend on it (the tests, bench.analytics).
#: It holds over the session's own value (session.py turns adaptive execution on for every other query: landing, the
#: stream) and over ``sluice report --conf``'s, for the job's queries only.
JOB_CONF = {"spark.sql.adaptive.enabled": "false"}


@contextmanager
def _session_conf(spark: SparkSession, conf: dict[str, str]) -> Iterator[None]:
    """``conf`` set on the session while the block runs, the previous values (or their absence) restored after."""
    before = {k: spark.conf.get(k, None) for k in conf}
    for k, v in conf.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, old in before.items():
            if old is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, old)


def run_job(
    spark: SparkSession,
    logs: Logs,
    out: str | Path,
    options: JobOptions | None = None,
    *,
    progress: Callable[[str], None] | None = None,
) -> JobResult:
    """Run the whole job over files (``logs``: paths), the access-log topic (a :class:`KafkaTopic`; the session
    needs the Kafka connector: ``build_session(kafka=True)``) or the landed table (a :class:`LandedTable`; the
    session needs Delta Lake: ``build_session(delta=True)``). Malformed input lines are counted, never fatal; an
    input path that matches nothing raises Spark's AnalysisException (``sluice report`` checks local paths before
    starting Spark)."""
    with _session_conf(spark, JOB_CONF):
        return _run_job(spark, logs, out, options, progress)


def _run_job(spark: SparkSession, logs: Logs, out: str | Path, options: JobOptions | None,
             progress: Callable[[str], None] | None) -> JobResult:
    opts = options or JobOptions()
    started = time.monotonic()
    drawing.start()  # the charts' worker, ready by the report
    say = progress or (lambda _msg: None)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    parquet_root = opts.parquet_uri or str((out_dir / "parquet").resolve())

    say(f"reading {describe(logs)}")
    src = _read(spark, logs, opts, say)
    try:
        counts = src.counts
        say(f"{counts.lines:,} lines: {counts.valid:,} valid, {counts.malformed:,} malformed")
        bucket_s = _bucket_s(opts, counts)
        write = _Writer(spark, parquet_root, say)
        inbound = _write_tables(spark, src, write, counts, bucket_s, opts)
        say(f"wrote {len(write.written)} tables under {parquet_root}")
    finally:
        src.release()  # every later query reads the small Parquet tables, not the cached events
    rates = inbound_rates(inbound, counts.span_s, opts.rate_window_s)
    rec = recommend(rates, opts.throttle)
    report = _write_report(out_dir, logs, src, write, counts, bucket_s, opts, rec, rates)
    result = JobResult(
        out=out_dir,
        report=report,
        counts=counts,
        bucket_s=bucket_s,
        tables=dict(write.paths),
        recommendation=rec,
        seconds=time.monotonic() - started,
    )
    (out_dir / SUMMARY_NAME).write_text(json.dumps(result.summary(), indent=2) + "\n", encoding="utf-8")
    say(f"report: {report}")
    return result


def _write_tables(spark: SparkSession, src: _FromEvents | LandedRollups, write: _Writer, counts: InputCounts,
                  bucket_s: int, opts: JobOptions) -> DataFrame:
    """Every table of the report, written with ``write``; the inbound rates' table (the throttle recommendation
    reads it)."""
    # The rollup is read by eight tables, each through its view of it (aggregates.rollup_views: one scan of the
    # rollup for all of them), kept in memory while they are written (the views are small, see aggregates).
    window_s = agg.rollup_window_s(bucket_s, opts.rate_window_s)
    views = agg.rollup_views(src.rollup(window_s)).persist(StorageLevel.MEMORY_AND_DISK)

    def view(name: str) -> DataFrame:
        return agg.rollup_view(views, name)

    try:
        traffic = write("traffic_over_time", agg.traffic_over_time(view("traffic"), bucket_s))
        connections = write("by_connection", agg.by_connection(view("connections")))
        inbound = write("inbound_rate", agg.inbound_rate(view("inbound"), opts.rate_window_s))
        write("error_codes", agg.error_codes(view("errors")))
        if counts.has("throttle_target_bps"):
            write("throttle_over_time", agg.throttle_over_time(view("throttle"), bucket_s))
        if counts.has("session_upstream_bytes"):
            write("session_savings", agg.session_savings(view("session"), bucket_s))
        minute = agg.minute_tables_from_rollup(views, window_s) or src.minute_tables()
        write("client_minute", minute["client_minute"])
        write("throttle_minute", minute["throttle_minute"])
    finally:
        views.unpersist()
    write("lines", live.lines_from_counts(spark, counts))
    write("by_client", agg.by_client(traffic))
    write("by_api", agg.by_api(traffic))
    write("by_listener", agg.by_listener(connections))
    write("by_upstream", agg.by_upstream(connections))
    write("latency_by_api", agg.latency_by_api(src.latency_histogram()))
    if counts.has("partitions"):
        # one scan of the partitions for all three: the per-minute and per-bucket sums re-aggregate its windows
        parts = src.partition_rollup(agg.partition_rollup_window_s(bucket_s)).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            per_minute = write("topic_minute", live.topic_minute(parts))
            write("fairness_over_time", agg.fairness_over_time(parts, bucket_s))
        finally:
            parts.unpersist()
        totals = write("partition_bytes", agg.partition_bytes(per_minute))
        write("partition_fairness", agg.partition_fairness(totals))
    return inbound


def _write_report(out_dir: Path, logs: Logs, src: _FromEvents | LandedRollups, write: _Writer, counts: InputCounts,
                  bucket_s: int, opts: JobOptions, rec: Recommendation, rates: list[InboundRate]) -> Path:
    """report.html, from the tables written."""
    ctx = ReportContext(
        counts=counts,
        bucket_s=bucket_s,
        rate_window_s=opts.rate_window_s,
        top_n=opts.top_n,
        table_rows=opts.table_rows,
        tables=write.written,
        paths=write.paths,
        malformed_samples=src.malformed_samples,
        recommendation=rec,
        inbound=rates,
    )
    sections = build_sections(ctx, ALL_TABLES)
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    origin = (f"{describe(logs)} ({counts.files:,} Sluice process(es))" if isinstance(logs, KafkaTopic | LandedTable)
              else f"{counts.files:,} log file(s)")
    meta = (
        f"Generated {generated} from {origin}, {counts.lines:,} lines "
        f"({counts.valid:,} valid, {counts.malformed:,} malformed). Sluice access-log schema 1."
    )
    report = out_dir / REPORT_NAME
    report.write_text(render("Sluice traffic report", meta, sections), encoding="utf-8")
    return report
