"""The Spark schema of Sluice's access log (``proxy/accesslog.py``, schema version 1), given explicitly.

Explicit, never inferred: inference reads the data twice, guesses per file (an all-null column becomes a string
in one file and a long in another), and would turn a client_id that looks numeric into a number. With a fixed
schema, fields the job does not know are ignored (the access log's contract: adding a field keeps version 1), and
a line that is not JSON or has a value of the wrong type lands in ``CORRUPT_COLUMN`` (PERMISSIVE mode) instead of
failing the job.

``ts`` is parsed by Spark's own ISO-8601 parser (no ``timestampFormat``): the writer's
``2025-01-31T12:00:00.000001Z`` and other ISO-8601 forms (fewer fraction digits, an offset instead of ``Z``, no zone:
UTC) are timestamps, anything else makes the line malformed. A ``timestampFormat`` pattern would route every value
through java.time's DateTimeFormatter, several times the cost per line - measured as a tenth of the whole job.

``OPTIONAL_FIELDS`` are fields later issues add to the log (per-partition bytes, throttle and fetch-session
figures). They are part of the schema now so the same job reads old and new logs alike: in logs without them the
columns are null and the report says so.
"""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

__all__ = [
    "CORRUPT_COLUMN",
    "OPTIONAL_FIELDS",
    "REQUIRED_FIELDS",
    "SCHEMA_VERSION",
    "V1_FIELDS",
    "access_log_schema",
]

SCHEMA_VERSION = 1
CORRUPT_COLUMN = "_corrupt_record"

# Longs for every integer: ids and byte counts of a long-running proxy overflow 32 bits.
V1_FIELDS: dict[str, DataType] = {
    "schema": LongType(),
    "event": StringType(),
    "ts": TimestampType(),
    "conn_id": LongType(),
    "client_id": StringType(),
    "api": StringType(),
    "api_key": LongType(),
    "version": LongType(),
    "correlation_id": LongType(),
    "listener": StringType(),
    "upstream": StringType(),
    "bytes_client_to_proxy": LongType(),
    "bytes_proxy_to_upstream": LongType(),
    "bytes_upstream_to_proxy": LongType(),
    "bytes_proxy_to_client": LongType(),
    "latency_ms": DoubleType(),
    "error_codes": ArrayType(LongType()),
    "decoded": BooleanType(),
}

PARTITION_TYPE = StructType(
    [
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("bytes", LongType()),
    ]
)

OPTIONAL_FIELDS: dict[str, DataType] = {
    # per partition in the request/response: records bytes served (Fetch) or sent (Produce)
    "partitions": ArrayType(PARTITION_TYPE),
    # the KIP-73 throttle in force for this request's partitions, bytes/s (null: not throttled)
    "throttle_target_bps": LongType(),
    # bytes of this response that counted against that throttle
    "throttled_bytes": LongType(),
    # upstream fetch-session bytes attributable to this request (KIP-227), to compare with bytes_proxy_to_client
    "session_upstream_bytes": LongType(),
}

# Schema 1 writes every field on every line; only client_id and latency_ms may be null. A line lacking one of
# the others was not written by a schema-1 writer (or was edited), so it is counted as incomplete and left out.
# Checking them all also makes Spark parse them all (its JSON reader converts only the fields a query uses), so a
# wrong-typed value in any schema field is caught as malformed whatever the report needs.
REQUIRED_FIELDS = tuple(name for name in V1_FIELDS if name not in ("client_id", "latency_ms"))


def access_log_schema() -> StructType:
    """Version 1 fields, the optional fields, and the corrupt-record column (always last)."""
    fields = [StructField(name, dtype, nullable=True) for name, dtype in {**V1_FIELDS, **OPTIONAL_FIELDS}.items()]
    fields.append(StructField(CORRUPT_COLUMN, StringType(), nullable=True))
    return StructType(fields)
