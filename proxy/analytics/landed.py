"""The access log landed as a table: every line, parsed and classified once, in a Delta Lake table partitioned by
time - what ``sluice stream`` writes beside its per-minute tables and ``sluice report --table`` reads.

    land_logs(spark, ["logs/"], "lake/access_log")              # files -> the table (a backfill; tests, bench)
    run_stream(spark, topic, "live/", table="lake/access_log")  # the topic -> the table, each micro-batch
    run_job(spark, LandedTable("lake/access_log"), "out/")      # the report from the table

Why a table: the JSON lines are parsed once, when they land, instead of at every report. Parsing is most of a
report's cost (Spark's JSON reader: ~8 of ~13 CPU-us per line), while a columnar table is read a column
at a time, and only the columns a query uses.

What a row holds: every field of the access-log schema (``schema.access_log_schema``; fields a line lacks are null),
``source`` (the Sluice process: the file or the record's key), ``received`` (the record's Kafka timestamp, or the
file's modification time), ``class`` (``source.CLASSES``: lines of every class are kept, so the report from the
table counts malformed and incomplete lines as the report from the JSON does) and ``line`` (the raw text, for
malformed lines only). Partitioned by ``date`` and ``hour`` (UTC) of ``ts`` - of ``received`` for a line without a
readable ``ts`` - so a time range reads only its partitions.

Why Delta Lake, not bare Parquet: a micro-batch lands atomically (a reader sees all of it or none of it), and a
micro-batch Spark replays after a crash is not landed twice: each write carries the stream's id and the batch id
(Delta's ``txnAppId``/``txnVersion``: a write whose version the table already holds for that id is skipped - Delta's
documented idempotent writes from ``foreachBatch``). The files under the table are Parquet. The release matching the
pinned Spark is resolved from Maven Central (proxy/analytics/session.py).

The rollups: every landing also writes, from the same rows and in the same way (one commit per table, the same
``txnAppId``/``txnVersion``), four sibling Delta tables of the lines table, ``<uri>_<name>`` (``ROLLUPS``), each per
``LANDED_WINDOW_S`` window (the latency per hour) and partitioned by the window's ``date`` and ``hour``:

- ``_rollup``: ``aggregates.rollup`` of the valid rows - requests, bytes, errors, throttle and session sums per
  (window, source, conn_id, client_id, api, listener, upstream, error codes);
- ``_partitions``: ``aggregates.partition_rollup`` - per-partition sums per (window, topic, partition);
- ``_latency``: ``aggregates.latency_histogram`` - per (hour, api, quantized latency) a count, an exact sum of
  microseconds and the max (``LATENCY_WINDOW_S``: per 10 s it was half as big as the lines);
- ``_counts``: what ``read_landed`` counts from the lines (``counts_rollup``) - lines per (window, source, class),
  valid rows carrying each optional field, first and last ``ts``, a few malformed lines.

Rows of one window come from every micro-batch that held some of its lines, so every column is a sum, a min or a
max, and every table the report derives from a rollup re-aggregates it by sums, minima and maxima over the report's
coarser keys: the same tables as from the lines, from a few rows per window instead of every line, unmerged
(``LandedRollups``; job.py falls back to the lines when the report's windows or time range do not fall on
``LANDED_WINDOW_S`` boundaries). The rollups are written before the lines and
``_counts`` last of them: a table whose lines exist without ``_counts`` was landed before the rollups existed (or
by an older Sluice) and gets none, ever - rollups of only its later batches would miss lines; such a table is read
from its lines, as is one landed again from its logs with this version.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from proxy.analytics import aggregates as agg
from proxy.analytics.schema import CORRUPT_COLUMN, OPTIONAL_FIELDS, V1_FIELDS
from proxy.analytics.source import (
    CLASSES,
    RECEIVED,
    SAMPLE_CHARS,
    SAMPLE_MALFORMED,
    InputCounts,
    LogInput,
    classify,
    load,
    read_access_logs_raw,
)

__all__ = ["LANDED_WINDOW_S", "LATENCY_WINDOW_S", "PARTITION_COLUMNS", "ROLLUPS", "LandedRollups", "LandedTable",
           "counts_rollup", "land", "land_logs", "landed_rollups", "landed_rows", "read_landed", "rollups_missing",
           "sibling", "windows_unusable"]

PARTITION_COLUMNS = ("date", "hour")
FORMAT = "delta"
#: the landed rollups' window: it divides the default rate window (10 s), a minute and every bucket of the report's
#: ladder from 10 s up (buckets.py), so the report's rollups are exact re-aggregations of it
LANDED_WINDOW_S = 10
#: the latency histograms' window: per 10-s window they held more than half as many rows as lines (measured at 2M
#: lines: 1.12M rows, each API's latencies nearly all distinct within 10 s), per hour a few thousand; a time range
#: not on hour boundaries takes its latencies from the lines (two columns of them)
LATENCY_WINDOW_S = 3600
#: the sibling tables, in the order they are written (``_counts`` last: its presence says the others are there)
ROLLUPS = ("rollup", "partitions", "latency", "counts")


@dataclass(frozen=True)
class LandedTable:
    """The landed table at ``uri`` (a path or any filesystem URI Spark reads); ``start`` (inclusive) and ``end``
    (exclusive): only lines of that time range (by ``ts``, or ``received`` for lines without one)."""

    uri: str
    start: datetime | None = None
    end: datetime | None = None


def sibling(uri: str, name: str) -> str:
    """Where the rollup ``name`` (``ROLLUPS``) of the lines table ``uri`` is: beside it, ``<uri>_<name>``."""
    return f"{uri.rstrip('/')}_{name}"


def _line_time() -> Column:
    return F.coalesce(F.col("ts"), F.col(RECEIVED))


def _partitioned_by(t: Column) -> list[Column]:
    # UTC: the session's time zone (session.py)
    return [F.to_date(t).alias("date"), F.hour(t).alias("hour")]


def landed_rows(classified: DataFrame) -> DataFrame:
    """Parsed, classified rows (``source.classify``) as the table's columns."""
    return classified.select(
        *V1_FIELDS, *OPTIONAL_FIELDS, "source", RECEIVED,
        F.col("_class").alias("class"),
        F.when(F.col("_class") == "malformed", F.col(CORRUPT_COLUMN)).alias("line"),
        *_partitioned_by(_line_time()),
    )


def counts_rollup(rows: DataFrame) -> DataFrame:
    """Per (window of the line's time, source, class): lines, valid rows carrying each optional field
    (``opt_<field>``), first and last ``ts`` of the valid rows (epoch microseconds) - ``InputCounts`` by sums,
    minima, maxima and the set of sources - and up to ``SAMPLE_MALFORMED`` malformed lines (``samples``: the report
    shows any few, so it need not open the lines table for them)."""
    valid = F.col("class") == "valid"
    ts_us = F.unix_micros(F.col("ts"))
    window = agg.rebucket("_t", LANDED_WINDOW_S).alias("window")
    return rows.withColumn("_t", _line_time()).groupBy(window, "source", "class").agg(
        F.count(F.lit(1)).alias("lines"),
        *[F.count_if(valid & F.col(name).isNotNull()).alias(f"opt_{name}") for name in OPTIONAL_FIELDS],
        F.min(F.when(valid, ts_us)).alias("first_us"),
        F.max(F.when(valid, ts_us)).alias("last_us"),
        F.slice(F.collect_list("line"), 1, SAMPLE_MALFORMED).alias("samples"),  # line: malformed lines only
    )


def _rollups(rows: DataFrame) -> dict[str, DataFrame]:
    """The sibling tables' rows for ``rows`` (``landed_rows``), each with its window's date and hour."""
    valid = rows.filter(F.col("class") == "valid")
    tables = {
        "rollup": agg.rollup(valid, LANDED_WINDOW_S),
        "partitions": agg.partition_rollup(valid, LANDED_WINDOW_S),
        "latency": agg.latency_histogram(valid, LATENCY_WINDOW_S),
        "counts": counts_rollup(rows),
    }
    return {name: df.select("*", *_partitioned_by(F.col("window"))) for name, df in tables.items()}


def _exists(spark: SparkSession, uri: str) -> bool:
    """Whether a Delta table is at ``uri`` (its log directory), through Hadoop's FileSystem (any filesystem)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    log = jvm.org.apache.hadoop.fs.Path(f"{uri.rstrip('/')}/_delta_log")
    return bool(log.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).exists(log))


def _append(df: DataFrame, uri: str, writer_id: str | None, batch_id: int | None) -> None:
    w = df.write.format(FORMAT).mode("append").partitionBy(*PARTITION_COLUMNS)
    if writer_id is not None and batch_id is not None:
        w = w.option("txnAppId", writer_id).option("txnVersion", batch_id)
    w.save(uri)


def land(rows: DataFrame, table: str, *, writer_id: str | None = None, batch_id: int | None = None) -> None:
    """Append ``rows`` (``landed_rows``) to ``table``, and their rollups to its siblings, one commit per table,
    creating them on first use. With ``writer_id`` and ``batch_id`` (a stream's micro-batch), a batch a table
    already holds from that writer is skipped by that table."""
    spark = rows.sparkSession
    # rows read once (a JSON backfill parses its files once), however many tables are written from them
    rows = rows.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        if not _exists(spark, table) or _exists(spark, sibling(table, ROLLUPS[-1])):
            for name, df in _rollups(rows).items():
                _append(df, sibling(table, name), writer_id, batch_id)
        _append(rows, table, writer_id, batch_id)
    finally:
        rows.unpersist()


def land_logs(spark: SparkSession, paths: list[str], table: str) -> None:
    """Land access-log files (``paths`` as ``source.read_access_logs`` takes them) into ``table``."""
    land(landed_rows(classify(read_access_logs_raw(spark, paths))), table)


def _utc(t: datetime) -> datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def _in_range(df: DataFrame, table: LandedTable, t: Column) -> DataFrame:
    """``df``'s rows whose time ``t`` is in the table's range."""
    # The partition columns first, so Spark skips whole partitions; then the exact bounds.
    if table.start is not None:
        start = _utc(table.start)
        day = start.astimezone(UTC).date()
        df = df.filter((F.col("date") > F.lit(day)) | ((F.col("date") == F.lit(day))
                                                       & (F.col("hour") >= start.astimezone(UTC).hour)))
        df = df.filter(t >= F.lit(start))
    if table.end is not None:
        end = _utc(table.end)
        df = df.filter(F.col("date") <= F.lit(end.astimezone(UTC).date())).filter(t < F.lit(end))
    return df


def _lines(spark: SparkSession, table: LandedTable) -> DataFrame:
    return _in_range(spark.read.format(FORMAT).load(table.uri), table, _line_time())


def read_landed(spark: SparkSession, table: LandedTable) -> LogInput:
    """The table's lines (of its time range) as the report's input: the same counts, samples and events as reading
    the JSON lines they were landed from."""
    rows = _lines(spark, table).select("*", F.col("class").alias("_class"), F.col("line").alias(CORRUPT_COLUMN))
    return load(rows, classified=True, cache=False)


# ------------------------------------------------------------------------------------------------ the rollups


@dataclass
class LandedRollups:
    """The landed rollups of a table's time range, as the report reads them (job.py): the counts, the malformed
    samples, and each rollup as landed (of the time range; the tables derived from it merge its rows)."""

    counts: InputCounts
    malformed_samples: list[str]
    tables: dict[str, DataFrame]  # ROLLUPS, of the time range, unmerged

    # The landed rows are handed over unmerged: every table the job derives from a rollup re-aggregates it by
    # sums, minima and maxima over coarser keys (aggregates.py), so a key's rows from several micro-batches, or
    # windows finer than the report's, give the same table as their merge would - without the merge, a hash
    # aggregation over every landed row on all eight keys (~3 of the tables phase's ~22 JVM CPU-s at 2M lines:
    # docs/PERFORMANCE.md, Analytics).
    def rollup(self, window_s: int) -> DataFrame:
        return self.tables["rollup"]

    def partition_rollup(self, window_s: int) -> DataFrame:
        return self.tables["partitions"]

    def latency_histogram(self) -> DataFrame:
        return self.tables["latency"]

    def minute_tables(self) -> dict[str, DataFrame]:
        """``client_minute`` and ``throttle_minute`` from the landed windows (they divide a minute)."""
        minute = agg.minute_tables_from_rollup(agg.rollup_views(self.rollup(LANDED_WINDOW_S)), LANDED_WINDOW_S)
        assert minute is not None, "LANDED_WINDOW_S divides a minute"
        return minute

    def release(self) -> None:
        """Nothing cached: the rollups are small and read as they are used."""


def _aligned(t: datetime | None, window_s: int = LANDED_WINDOW_S) -> bool:
    return t is None or round(_utc(t).timestamp() * 1_000_000) % (window_s * 1_000_000) == 0


def rollups_missing(spark: SparkSession, table: LandedTable) -> str | None:
    """Why ``table``'s rollups cannot be read whatever the report's windows (None: they can)."""
    if not all(_exists(spark, sibling(table.uri, name)) for name in ROLLUPS):
        return "the table has no rollups (landed before them)"
    if not (_aligned(table.start) and _aligned(table.end)):
        return f"the time range is not on {LANDED_WINDOW_S}-second boundaries"
    return None


def windows_unusable(window_s: int, partition_window_s: int) -> str | None:
    """Why the report's rollup windows cannot be merged from the landed ones (None: they can)."""
    if window_s % LANDED_WINDOW_S or partition_window_s % LANDED_WINDOW_S:
        return (f"the report's windows ({window_s} s, {partition_window_s} s) are not multiples of the landed "
                f"{LANDED_WINDOW_S} s")
    return None


def _counts(counts: DataFrame) -> tuple[InputCounts, list[str]]:
    """The counts and the malformed samples of the ``_counts`` rollup, from one collect of its rows. Why not an
    aggregation and a query for the samples: each is a Spark job over the table (~0.1-0.2 s of planning and
    scheduling each in a report of ~12 s), for a table of a few rows per window and source (~1,500 at 10M lines),
    whose sums the driver takes as cheaply. The same figures: sums of longs, minima and maxima, the distinct sources;
    the samples are the first ``SAMPLE_MALFORMED`` of the malformed rows' samples in the order the scan reads them,
    which is the order a ``limit`` over the same scan took them in (partition by partition, each in file order)."""
    rows = counts.select("source", "class", "lines", *[f"opt_{name}" for name in OPTIONAL_FIELDS], "first_us",
                         "last_us", F.when(F.col("class") == "malformed", F.col("samples")).alias("samples")).collect()
    lines = {k: sum(r["lines"] for r in rows if r["class"] == k) for k in CLASSES}
    first = [r["first_us"] for r in rows if r["first_us"] is not None]
    last = [r["last_us"] for r in rows if r["last_us"] is not None]
    row = {**lines, "files": len({r["source"] for r in rows if r["source"] is not None}),
           **{f"opt_{name}": sum(r[f"opt_{name}"] or 0 for r in rows) for name in OPTIONAL_FIELDS},
           "first_us": min(first) if first else None, "last_us": max(last) if last else None}
    samples = [str(s)[:SAMPLE_CHARS] for r in rows if r["samples"] for s in r["samples"]][:SAMPLE_MALFORMED]
    return InputCounts.from_row(Row(**row)), samples


def landed_rollups(spark: SparkSession, table: LandedTable) -> LandedRollups:
    """The rollups of ``table``'s time range (``rollups_missing`` must have said None)."""
    tables = {name: _in_range(spark.read.format(FORMAT).load(sibling(table.uri, name)), table, F.col("window"))
              for name in ROLLUPS}
    if not (_aligned(table.start, LATENCY_WINDOW_S) and _aligned(table.end, LATENCY_WINDOW_S)):
        tables["latency"] = agg.latency_histogram(_lines(spark, table).filter(F.col("class") == "valid"))
    counts, samples = _counts(tables["counts"])
    return LandedRollups(counts, samples, tables)
