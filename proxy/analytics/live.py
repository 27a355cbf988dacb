"""Per-minute aggregates of the access log, kept current by a Structured Streaming query over the access-log topic.

    sluice stream --kafka HOST:PORT --topic sluice-access-log --out live/     # until Ctrl-C / SIGTERM
    sluice stream ... --once                                                  # what is there now, then stop
    sluice report --live live/ --out report/                                  # the report of the current tables

The tables (``MINUTE_TABLES``), per epoch-aligned minute: bytes and requests per client_id and API
(``client_minute``); fetched and produced bytes, fetches and empty fetches per topic-partition (``topic_minute``:
a partition fetched without bytes while others of its topic got some is starving); throttled bytes and the throttle
in force per Sluice process (``throttle_minute``); and the count of lines per class (``lines``). The batch job writes
the same tables from the same function (:func:`minute_tables`), so a stream and a batch over the same events give
equal tables - the tests hold them to it.

How the stream keeps them current, exactly once:

- The query reads the topic (Spark's Kafka source; its offsets in ``OUT/checkpoint``) and hands each micro-batch to
  :func:`apply_batch` (``foreachBatch``). A micro-batch is a plain DataFrame: it is parsed and classified as the
  batch job does (``source``), aggregated per minute, and *merged* into the current tables by key: sums add, maxima
  and minima combine. Every table is mergeable that way, so late events (a sidecar whose sink was cut off and sent
  its buffer later) land in their own minute whenever they arrive - there is no watermark and nothing is dropped
  as late; and no state store either: the tables themselves are the state.
- Version ``N`` (the micro-batch id) is written whole to ``OUT/tables/v-N/<table>/`` and committed by a marker file
  written last (``_COMMITTED``); readers and the next batch use the newest committed version. A batch replayed
  after a crash (Spark re-runs the last uncommitted one with the same offsets) finds its own version committed and
  skips it, or rewrites its uncommitted one: no event is counted twice. Older versions are deleted, the previous
  one kept for readers still reading it.
- ``keep_s`` bounds the tables: minutes older than that (before the newest minute) are left out of new versions.
- With ``table``, each micro-batch's lines are also appended to the landed access-log table (proxy/analytics/
  landed.py), with their rollups in its sibling tables (10-second windows: what ``sluice report --table`` reads
  instead of the lines), once: a replayed batch is skipped by each table itself (Delta's idempotent writes).

The files go through Hadoop's FileSystem API, so ``OUT`` may be any filesystem Spark writes (on a cluster, one
the executors share: hdfs://, s3a://, or a shared mount).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from proxy.analytics import landed
from proxy.analytics.aggregates import (
    BYTE_COLUMNS,
    MINUTE_S,
    PARTITION_SUMS,
    partition_rollup,
    rebucket,
    with_bucket,
)
from proxy.analytics.source import CLASSES, CORRUPT_COLUMN, InputCounts, KafkaTopic, classify, parse_kafka_rows

__all__ = ["MINUTE_TABLES", "LiveTables", "current_tables", "lines_from_counts", "lines_table", "merge",
           "minute_tables", "run_stream", "topic_minute"]

COMMITTED = "_COMMITTED"
VERSION_PREFIX = "v-"


@dataclass(frozen=True)
class TableSpec:
    """How a table merges: rows with equal ``keys`` combine their other columns by sum, max or min."""

    description: str
    keys: tuple[str, ...]
    sums: tuple[str, ...]
    maxes: tuple[str, ...] = ()
    mins: tuple[str, ...] = ()

    def combine(self) -> list[Column]:
        return [*(F.sum(c).alias(c) for c in self.sums), *(F.max(c).alias(c) for c in self.maxes),
                *(F.min(c).alias(c) for c in self.mins)]

    @property
    def columns(self) -> tuple[str, ...]:
        return (*self.keys, *self.sums, *self.maxes, *self.mins)


MINUTE_TABLES: dict[str, TableSpec] = {
    "client_minute": TableSpec(
        "requests, bytes (4 directions) and requests with errors per minute, client_id and API",
        ("minute", "client_id", "api"), ("requests", *BYTE_COLUMNS, "requests_with_errors")),
    "topic_minute": TableSpec(
        "per minute and topic-partition: fetched bytes, fetches, fetches without bytes (starvation), produced bytes",
        ("minute", "topic", "partition"), PARTITION_SUMS),
    "throttle_minute": TableSpec(
        "per minute and Sluice process: throttled bytes and requests, the throttle in force (largest, smallest)",
        ("minute", "source"), ("throttled_bytes", "requests"), ("target_bps",), ("min_target_bps",)),
    "lines": TableSpec("lines read, by class (valid, malformed, incomplete, other schema, other event)",
                       ("class",), ("lines",)),
}


# ------------------------------------------------------------------------------------------------ aggregates


def minute_tables(events: DataFrame) -> dict[str, DataFrame]:
    """The per-minute tables (all but ``lines``) from valid events (``source.LogInput.events`` or a micro-batch's)."""
    m = with_bucket(events, MINUTE_S, "minute")
    has_errors = F.coalesce(F.size(F.col("error_codes")), F.lit(0)) > 0
    client = m.groupBy("minute", "client_id", "api").agg(
        F.count(F.lit(1)).alias("requests"), *(F.sum(c).alias(c) for c in BYTE_COLUMNS),
        F.count_if(has_errors).alias("requests_with_errors"))
    throttle = (
        m.filter(F.col("throttle_target_bps").isNotNull())
        .groupBy("minute", "source")
        .agg(
            F.sum(F.coalesce(F.col("throttled_bytes"), F.lit(0))).alias("throttled_bytes"),
            F.count(F.lit(1)).alias("requests"),
            F.max("throttle_target_bps").alias("target_bps"),
            F.min("throttle_target_bps").alias("min_target_bps"),
        )
    )
    return {"client_minute": client, "topic_minute": topic_minute(partition_rollup(events, MINUTE_S)),
            "throttle_minute": throttle}


def topic_minute(parts: DataFrame) -> DataFrame:
    """``topic_minute`` from a partition rollup (``aggregates.partition_rollup``) whose window divides a minute."""
    return parts.groupBy(rebucket("window", MINUTE_S).alias("minute"), "topic", "partition").agg(
        *(F.sum(c).alias(c) for c in PARTITION_SUMS))


def lines_from_counts(spark: SparkSession, counts: InputCounts) -> DataFrame:
    """The ``lines`` table of a batch (the classes that occurred), from the counts the batch job took."""
    rows = [(c, getattr(counts, c)) for c in CLASSES if getattr(counts, c)]
    return spark.createDataFrame(rows, "class string, lines long")


def lines_table(classified: DataFrame) -> DataFrame:
    """Lines per class, from rows with ``_class`` (source.classify)."""
    return classified.groupBy(F.col("_class").alias("class")).agg(F.count(F.lit(1)).alias("lines"))


def merge(name: str, current: DataFrame | None, update: DataFrame) -> DataFrame:
    """``update``'s rows merged into ``current`` (either may have rows the other lacks), by ``name``'s spec."""
    spec = MINUTE_TABLES[name]
    update = update.select(*spec.columns)
    if current is None:
        return update
    return current.select(*spec.columns).unionByName(update).groupBy(*spec.keys).agg(*spec.combine())


# ------------------------------------------------------------------------------------------------ versions


class _Store:
    """``OUT/tables/v-N/<table>/`` + ``v-N/_COMMITTED``, through Hadoop's FileSystem (any filesystem Spark writes)."""

    def __init__(self, spark: SparkSession, root: str) -> None:
        self.spark = spark
        self.root = root.rstrip("/") + "/tables"
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        self._jvm = jvm
        self._path = jvm.org.apache.hadoop.fs.Path(self.root)
        self._fs = self._path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())

    def version_path(self, version: int) -> str:
        return f"{self.root}/{VERSION_PREFIX}{version:012d}"

    def _hpath(self, path: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(path)

    def versions(self) -> Iterator[tuple[int, bool]]:
        """(version, committed), any order."""
        if not self._fs.exists(self._path):
            return
        for status in self._fs.listStatus(self._path):
            name = status.getPath().getName()
            if status.isDirectory() and name.startswith(VERSION_PREFIX) and name[len(VERSION_PREFIX):].isdigit():
                version = int(name[len(VERSION_PREFIX):])
                yield version, bool(self._fs.exists(self._hpath(f"{self.version_path(version)}/{COMMITTED}")))

    def latest(self) -> int | None:
        committed = [v for v, ok in self.versions() if ok]
        return max(committed) if committed else None

    def commit(self, version: int) -> None:
        self._fs.create(self._hpath(f"{self.version_path(version)}/{COMMITTED}"), True).close()

    def prune(self, keep: set[int]) -> None:
        for version, _ in list(self.versions()):
            if version not in keep:
                self._fs.delete(self._hpath(self.version_path(version)), True)


@dataclass
class LiveTables:
    version: int | None
    tables: dict[str, DataFrame] = field(default_factory=dict)
    paths: dict[str, str] = field(default_factory=dict)


def current_tables(spark: SparkSession, out: str) -> LiveTables:
    """The newest committed version of the tables under ``out`` (no tables before the first micro-batch)."""
    store = _Store(spark, out)
    version = store.latest()
    if version is None:
        return LiveTables(None)
    paths = {name: f"{store.version_path(version)}/{name}" for name in MINUTE_TABLES}
    return LiveTables(version, {name: spark.read.parquet(p) for name, p in paths.items()}, paths)


# ------------------------------------------------------------------------------------------------ the stream


def apply_batch(spark: SparkSession, out: str, keep_s: int | None, batch: DataFrame, batch_id: int,
                 say: Callable[[str], None], table: str | None = None) -> None:
    store = _Store(spark, out)
    base = store.latest()
    if base is not None and base >= batch_id:
        say(f"batch {batch_id}: already applied (version {base})")
        return
    classified = classify(parse_kafka_rows(batch)).persist()
    try:
        if table is not None:
            # Landed first: a crash before the tables' commit replays this batch, and the table skips what it
            # already holds from this stream (its checkpoint names it) at this batch id.
            landed.land(landed.landed_rows(classified), table, writer_id=writer_id_of(out), batch_id=batch_id)
        updates = minute_tables(classified.filter(F.col("_class") == "valid").drop(CORRUPT_COLUMN, "_class"))
        updates["lines"] = lines_table(classified)
        target = store.version_path(batch_id)
        for name, update in updates.items():
            current = spark.read.parquet(f"{store.version_path(base)}/{name}") if base is not None else None
            merged = merge(name, current, update)
            if keep_s is not None and "minute" in MINUTE_TABLES[name].keys:
                newest = merged.agg(F.max("minute")).collect()[0][0]
                if newest is not None:
                    merged = merged.filter(F.col("minute") >= F.lit(newest) - F.expr(f"INTERVAL {keep_s} SECONDS"))
            merged.coalesce(1).write.mode("overwrite").parquet(f"{target}/{name}")
    finally:
        classified.unpersist()
    store.commit(batch_id)
    store.prune({batch_id} | ({base} if base is not None else set()))
    say(f"batch {batch_id}: version {batch_id} committed")


def writer_id_of(out: str) -> str:
    """The stream's id in the landed table's commits: its checkpoint, which is what makes batch ids mean the same
    records across restarts."""
    return f"sluice-stream:{out.rstrip('/')}/checkpoint"


def run_stream(
    spark: SparkSession,
    topic: KafkaTopic,
    out: str,
    *,
    trigger_s: float = 10.0,
    once: bool = False,
    keep_s: int | None = None,
    max_records_per_batch: int | None = None,
    table: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> None:
    """Run the query until it is stopped (SIGINT/SIGTERM) or, with ``once``, until it has processed what the
    topic held when it started (Trigger.AvailableNow). ``topic.start`` applies to a query's first start only; after
    that the checkpoint says where to go on. ``table``: also land every line there (proxy/analytics/landed.py; the
    session needs Delta Lake)."""
    say = progress or (lambda _msg: None)
    reader = spark.readStream.format("kafka").options(**topic.reader_options(streaming=True))
    if max_records_per_batch:
        reader = reader.option("maxOffsetsPerTrigger", str(max_records_per_batch))
    writer = (
        reader.load()
        .writeStream.queryName("sluice-access-log")
        .option("checkpointLocation", f"{out.rstrip('/')}/checkpoint")
        .foreachBatch(lambda df, batch_id: apply_batch(spark, out, keep_s, df, batch_id, say, table))
    )
    writer = writer.trigger(availableNow=True) if once else writer.trigger(processingTime=f"{trigger_s} seconds")
    query = writer.start()
    say(f"stream started: {topic.topic} -> {out}")
    if once:
        query.awaitTermination()
        return
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop.is_set() and query.isActive:
            query.awaitTermination(1)  # seconds: returns at once when the query fails or ends
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))
    finally:
        query.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        say("stream stopped")

