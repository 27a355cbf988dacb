"""The access log landed as a table: every line, parsed and classified once, in a Delta Lake table partitioned by
time - what ``sluice stream`` writes beside its per-minute tables and ``sluice report --table`` reads.

    land_logs(spark, ["logs/"], "lake/access_log")              # files -> the table (a backfill; tests, bench)
    run_stream(spark, topic, "live/", table="lake/access_log")  # the topic -> the table, each micro-batch
    run_job(spark, LandedTable("lake/access_log"), "out/")      # the report from the table

Why a table: the JSON lines are parsed once, when they land, instead of at every report. Parsing is most of a
report's cost (Spark's JSON reader: ~8 of ~13 CPU-us per line, issue #24), while a columnar table is read a column
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
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from proxy.analytics.schema import CORRUPT_COLUMN, OPTIONAL_FIELDS, V1_FIELDS
from proxy.analytics.source import RECEIVED, LogInput, classify, load, read_access_logs_raw

__all__ = ["PARTITION_COLUMNS", "LandedTable", "land", "land_logs", "landed_rows", "read_landed"]

PARTITION_COLUMNS = ("date", "hour")
FORMAT = "delta"


@dataclass(frozen=True)
class LandedTable:
    """The landed table at ``uri`` (a path or any filesystem URI Spark reads); ``start`` (inclusive) and ``end``
    (exclusive): only lines of that time range (by ``ts``, or ``received`` for lines without one)."""

    uri: str
    start: datetime | None = None
    end: datetime | None = None


def _line_time() -> Column:
    return F.coalesce(F.col("ts"), F.col(RECEIVED))


def landed_rows(classified: DataFrame) -> DataFrame:
    """Parsed, classified rows (``source.classify``) as the table's columns."""
    t = _line_time()
    return classified.select(
        *V1_FIELDS, *OPTIONAL_FIELDS, "source", RECEIVED,
        F.col("_class").alias("class"),
        F.when(F.col("_class") == "malformed", F.col(CORRUPT_COLUMN)).alias("line"),
        # UTC: the session's time zone (session.py)
        F.to_date(t).alias("date"), F.hour(t).alias("hour"),
    )


def land(rows: DataFrame, table: str, *, writer_id: str | None = None, batch_id: int | None = None) -> None:
    """Append ``rows`` (``landed_rows``) to ``table`` in one commit, creating it on first use. With ``writer_id``
    and ``batch_id`` (a stream's micro-batch), a batch the table already holds from that writer is skipped."""
    w = rows.write.format(FORMAT).mode("append").partitionBy(*PARTITION_COLUMNS)
    if writer_id is not None and batch_id is not None:
        w = w.option("txnAppId", writer_id).option("txnVersion", batch_id)
    w.save(table)


def land_logs(spark: SparkSession, paths: list[str], table: str) -> None:
    """Land access-log files (``paths`` as ``source.read_access_logs`` takes them) into ``table``."""
    land(landed_rows(classify(read_access_logs_raw(spark, paths))), table)


def _utc(t: datetime) -> datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def read_landed(spark: SparkSession, table: LandedTable) -> LogInput:
    """The table's lines (of its time range) as the report's input: the same counts, samples and events as reading
    the JSON lines they were landed from."""
    df = spark.read.format(FORMAT).load(table.uri)
    t = _line_time()
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
    rows = df.select("*", F.col("class").alias("_class"), F.col("line").alias(CORRUPT_COLUMN))
    return load(rows, classified=True, cache=False)
