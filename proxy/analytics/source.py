"""Reading access logs: many JSON-lines files (gzip or not), one explicit schema, malformed lines counted.

One scan of the input: the parsed rows are cached (memory, spilling to disk) and a single aggregation counts
every kind of line. The aggregations that follow read the cache, not the JSON again - JSON parsing is most of
the job's cost. Only the columns the aggregates use are cached (narrower rows build faster), but every schema
field is still parsed, because the classification below checks them all: Spark's JSON reader converts only the
fields a query references, and a bad value in a field nobody referenced would otherwise pass as valid.

Lines fall into exactly one class:

- ``malformed``: not JSON, or a value of the wrong type (Spark's corrupt-record column is set);
- ``other_schema``: a ``schema`` other than 1 (a future incompatible log; left out, not guessed at);
- ``other_event``: schema 1 but ``event`` is not ``"request"``;
- ``incomplete``: valid JSON of schema 1 lacking a field schema 1 always writes (``REQUIRED_FIELDS``);
- ``valid``: everything else; the only rows the aggregates see.

Blank lines are skipped by Spark's reader and are not counted at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from proxy.analytics.schema import (
    CORRUPT_COLUMN,
    OPTIONAL_FIELDS,
    REQUIRED_FIELDS,
    SCHEMA_VERSION,
    TIMESTAMP_FORMAT,
    access_log_schema,
)

__all__ = ["InputCounts", "LogInput", "read_access_logs"]

# What the aggregates read (besides the optional fields and the source file).
CACHED_COLUMNS = (
    "ts",
    "conn_id",
    "client_id",
    "api",
    "listener",
    "upstream",
    "bytes_client_to_proxy",
    "bytes_proxy_to_upstream",
    "bytes_upstream_to_proxy",
    "bytes_proxy_to_client",
    "latency_ms",
    "error_codes",
)
SAMPLE_MALFORMED = 5  # example malformed lines shown in the report
SAMPLE_CHARS = 300


@dataclass(frozen=True)
class InputCounts:
    lines: int
    valid: int
    malformed: int
    incomplete: int
    other_schema: int
    other_event: int
    first_ts: datetime | None
    last_ts: datetime | None
    files: int
    # optional field -> number of valid rows carrying it (0: the field is absent from these logs)
    optional_rows: dict[str, int] = field(default_factory=dict)

    @property
    def span_s(self) -> float:
        if self.first_ts is None or self.last_ts is None:
            return 0.0
        return (self.last_ts - self.first_ts).total_seconds()

    def has(self, optional_field: str) -> bool:
        return self.optional_rows.get(optional_field, 0) > 0


@dataclass
class LogInput:
    events: DataFrame  # valid rows only, cached; plus `source` (the file a row came from)
    counts: InputCounts
    malformed_samples: list[str]
    _cached: DataFrame

    def release(self) -> None:
        self._cached.unpersist()


def _classify() -> Column:
    corrupt = F.col(CORRUPT_COLUMN).isNotNull()
    missing = F.lit(False)
    for name in REQUIRED_FIELDS:
        missing = missing | F.col(name).isNull()
    return (
        F.when(corrupt, "malformed")
        .when(F.col("schema").isNull(), "incomplete")
        .when(F.col("schema") != SCHEMA_VERSION, "other_schema")
        .when(F.col("event").isNull(), "incomplete")
        .when(F.col("event") != "request", "other_event")
        .when(missing, "incomplete")
        .otherwise("valid")
    )


def read_access_logs(spark: SparkSession, paths: list[str]) -> LogInput:
    """Parse ``paths`` (files, directories - read recursively - or globs; ``.gz`` decompressed by extension)."""
    raw = (
        spark.read.schema(access_log_schema())
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", CORRUPT_COLUMN)
        .option("timestampFormat", TIMESTAMP_FORMAT)
        .option("recursiveFileLookup", "true")
        .json(paths)
    )
    # _metadata is the file source's hidden per-row column; the path identifies which proxy wrote a row, since
    # conn_id is only unique within one proxy process.
    parsed = raw.withColumn("source", F.col("_metadata.file_path")).withColumn("_class", _classify())
    cached = parsed.select(*CACHED_COLUMNS, *OPTIONAL_FIELDS, "source", "_class", CORRUPT_COLUMN).persist(
        StorageLevel.MEMORY_AND_DISK
    )

    valid = F.col("_class") == "valid"
    aggs = [
        F.count(F.lit(1)).alias("lines"),
        *[F.count_if(F.col("_class") == k).alias(k) for k in ("valid", "malformed", "incomplete")],
        *[F.count_if(F.col("_class") == k).alias(k) for k in ("other_schema", "other_event")],
        # A set, not count_distinct: a distinct aggregate beside others makes Spark duplicate every row (Expand)
        # to aggregate it separately; the set of file paths is small, merged per task.
        F.size(F.collect_set(F.col("source"))).alias("files"),
        *[F.count_if(valid & F.col(name).isNotNull()).alias(f"opt_{name}") for name in OPTIONAL_FIELDS],
        # epoch microseconds as well: collected timestamps would be converted with this Python's local zone
        F.min(F.when(valid, F.unix_micros(F.col("ts")))).alias("first_us"),
        F.max(F.when(valid, F.unix_micros(F.col("ts")))).alias("last_us"),
    ]
    row = cached.agg(*aggs).collect()[0]

    def utc(us: int | None) -> datetime | None:
        return None if us is None else datetime.fromtimestamp(us / 1e6, UTC)

    counts = InputCounts(
        lines=int(row["lines"]),
        valid=int(row["valid"]),
        malformed=int(row["malformed"]),
        incomplete=int(row["incomplete"]),
        other_schema=int(row["other_schema"]),
        other_event=int(row["other_event"]),
        first_ts=utc(row["first_us"]),
        last_ts=utc(row["last_us"]),
        files=int(row["files"]),
        optional_rows={name: int(row[f"opt_{name}"]) for name in OPTIONAL_FIELDS},
    )
    samples: list[str] = []
    if counts.malformed:
        samples = [
            str(r[0])[:SAMPLE_CHARS]
            for r in cached.filter(F.col("_class") == "malformed").select(CORRUPT_COLUMN).limit(SAMPLE_MALFORMED)
            .collect()
        ]
    events = cached.filter(valid).drop(CORRUPT_COLUMN, "_class")
    return LogInput(events=events, counts=counts, malformed_samples=samples, _cached=cached)
