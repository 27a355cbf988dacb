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

Two inputs, one classification: files (``read_access_logs``; a row's ``source`` is its file) and a Kafka topic the
access-log sink ([logging.access_log_kafka]) produces to (``read_access_log_topic``: a batch over a time range of
the records' Kafka timestamps; a row's ``source`` is the message key, the Sluice process that wrote it). Each
message's value is one access-log line, parsed with the same schema and options by ``from_json``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from proxy.analytics.schema import (
    CORRUPT_COLUMN,
    OPTIONAL_FIELDS,
    REQUIRED_FIELDS,
    SCHEMA_VERSION,
    access_log_schema,
)

__all__ = ["CLASSES", "RECEIVED", "InputCounts", "KafkaTopic", "LogInput", "classify", "load", "parse_kafka_rows",
           "read_access_log_topic", "read_access_logs", "read_access_logs_raw"]

#: the line classes, in the order the report lists them
CLASSES = ("valid", "malformed", "incomplete", "other_schema", "other_event")
# No timestampFormat: Spark's ISO-8601 parser reads `ts` (see schema.py).
JSON_OPTIONS = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_COLUMN}

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
#: when a line arrived (a Kafka record's timestamp, a file's modification time): where the landed table files a
#: line without a readable ``ts``
RECEIVED = "received"
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

    @classmethod
    def from_row(cls, row: Row) -> InputCounts:
        """From an aggregate row with the lines of each class (``CLASSES``: every line has one), ``files``, the
        valid rows carrying each optional field (``opt_<field>``) and the first and last ``ts`` of the valid rows
        (``first_us``, ``last_us``: epoch microseconds, as collected timestamps would be converted with this
        Python's local zone); a sum over no rows (null) counts 0."""

        def n(key: str) -> int:
            return int(row[key] or 0)

        def utc(us: int | None) -> datetime | None:
            return None if us is None else datetime.fromtimestamp(us / 1e6, UTC)

        return cls(lines=sum(n(k) for k in CLASSES), valid=n("valid"), malformed=n("malformed"),
                   incomplete=n("incomplete"), other_schema=n("other_schema"), other_event=n("other_event"),
                   first_ts=utc(row["first_us"]), last_ts=utc(row["last_us"]), files=n("files"),
                   optional_rows={k: n(f"opt_{k}") for k in OPTIONAL_FIELDS})


@dataclass
class LogInput:
    events: DataFrame  # valid rows only, cached; plus `source` (the file a row came from)
    counts: InputCounts
    malformed_samples: list[str]
    _cached: DataFrame

    def release(self) -> None:
        self._cached.unpersist()


@dataclass(frozen=True)
class KafkaTopic:
    """The access-log topic: where it is and, for a batch, which records (by Kafka timestamp: when the sink
    produced the event, within milliseconds of its ``ts``). ``start`` inclusive, ``end`` exclusive; None = from the
    earliest / to the latest offset. ``options``: further Kafka consumer settings, without the ``kafka.`` prefix
    (e.g. ``security.protocol``)."""

    bootstrap_servers: str
    topic: str
    start: datetime | None = None
    end: datetime | None = None
    options: Mapping[str, str] = field(default_factory=dict)

    def reader_options(self, streaming: bool = False) -> dict[str, str]:
        opts = {f"kafka.{k}": v for k, v in self.options.items()}
        opts.update({"kafka.bootstrap.servers": self.bootstrap_servers, "subscribe": self.topic,
                     # Records the topic's retention deleted before they were read are skipped, not fatal.
                     "failOnDataLoss": "false"})
        if self.start is not None:
            opts["startingTimestamp"] = str(_epoch_ms(self.start))
            # a start after the last record: nothing, instead of Spark's default error
            opts["startingOffsetsByTimestampStrategy"] = "latest"
        else:
            opts["startingOffsets"] = "earliest"
        if not streaming:
            if self.end is not None:
                opts["endingTimestamp"] = str(_epoch_ms(self.end))
            else:
                opts["endingOffsets"] = "latest"
        return opts


def _epoch_ms(t: datetime) -> int:
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return round(t.timestamp() * 1000)


def parse_kafka_rows(raw: DataFrame) -> DataFrame:
    """Kafka records (key, value, topic, partition, ...) -> the access-log schema's columns, ``CORRUPT_COLUMN`` and
    ``source`` (the message key; ``topic-partition`` for records without one) and ``received`` (the record's Kafka
    timestamp)."""
    source = F.coalesce(F.col("key").cast("string"), F.concat_ws("-", F.col("topic"), F.col("partition")))
    parsed = F.from_json(F.col("value").cast("string"), access_log_schema(), JSON_OPTIONS)
    return raw.select(parsed.alias("_j"), source.alias("source"), F.col("timestamp").alias(RECEIVED)).select(
        "_j.*", "source", RECEIVED)


def classify(parsed: DataFrame) -> DataFrame:
    """Adds ``_class`` (one of ``CLASSES``) to parsed rows."""
    return parsed.withColumn("_class", _classify())


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
    return load(read_access_logs_raw(spark, paths))


def read_access_logs_raw(spark: SparkSession, paths: list[str]) -> DataFrame:
    """The parsed lines of ``paths``, unclassified, with ``source`` and ``received``."""
    raw = spark.read.schema(access_log_schema()).options(**JSON_OPTIONS).option("recursiveFileLookup", "true").json(
        paths)
    # _metadata is the file source's hidden per-row column; the path identifies which proxy wrote a row, since
    # conn_id is only unique within one proxy process. The file's modification time is when its lines arrived, as
    # near as a file says: the landed table files a line without a readable ts under it (proxy/analytics/landed.py).
    return raw.select("*", F.col("_metadata.file_path").alias("source"),
                      F.col("_metadata.file_modification_time").alias(RECEIVED))


def read_access_log_topic(spark: SparkSession, topic: KafkaTopic) -> LogInput:
    """The records of ``topic`` in its time range, as one batch (Spark's Kafka source: the spark-sql-kafka
    connector, see proxy/analytics/session.py)."""
    raw = spark.read.format("kafka").options(**topic.reader_options()).load()
    return load(parse_kafka_rows(raw))


def load(parsed: DataFrame, *, classified: bool = False, cache: bool = True) -> LogInput:
    """Classify (unless ``classified``: ``_class`` is there already), cache, count: the common part of every input.
    ``cache=False`` for a columnar input (the landed table): each aggregation reads just its columns from the files,
    which costs less than building the in-memory cache of them all."""
    rows = (parsed if classified else classify(parsed)).select(*CACHED_COLUMNS, *OPTIONAL_FIELDS, "source", "_class",
                                                                CORRUPT_COLUMN)
    cached = rows.persist(StorageLevel.MEMORY_AND_DISK) if cache else rows

    valid = F.col("_class") == "valid"
    aggs = [
        *[F.count_if(F.col("_class") == k).alias(k) for k in CLASSES],
        # A set, not count_distinct: a distinct aggregate beside others makes Spark duplicate every row (Expand)
        # to aggregate it separately; the set of file paths is small, merged per task.
        F.size(F.collect_set(F.col("source"))).alias("files"),
        *[F.count_if(valid & F.col(name).isNotNull()).alias(f"opt_{name}") for name in OPTIONAL_FIELDS],
        F.min(F.when(valid, F.unix_micros(F.col("ts")))).alias("first_us"),
        F.max(F.when(valid, F.unix_micros(F.col("ts")))).alias("last_us"),
    ]
    counts = InputCounts.from_row(cached.agg(*aggs).collect()[0])
    samples: list[str] = []
    if counts.malformed:
        samples = [
            str(r[0])[:SAMPLE_CHARS]
            for r in cached.filter(F.col("_class") == "malformed").select(CORRUPT_COLUMN).limit(SAMPLE_MALFORMED)
            .collect()
        ]
    events = cached.filter(valid).drop(CORRUPT_COLUMN, "_class")
    return LogInput(events=events, counts=counts, malformed_samples=samples, _cached=cached)
