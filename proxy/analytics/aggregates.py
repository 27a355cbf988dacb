"""The aggregates, as Spark DataFrames over the valid access-log rows (one function per table).

The events are scanned as few times as possible - each scan of 10M cached rows costs seconds:

- ``rollup`` (one scan): requests, bytes, errors, throttle and session sums per fine time window, log file,
  connection, client_id, API, listener, upstream and list of error codes. Its cardinality follows the deployment
  (windows x connections x APIs; error codes are rare), not the traffic, so 10M rows roll up to a few hundred
  thousand. ``traffic_over_time``, ``by_connection``, ``inbound_rate``, ``throttle_over_time``,
  ``session_savings`` and ``error_codes`` are re-aggregations of it: the window is a divisor of both the report's
  bucket and the rate window, so each coarser bucket is an exact union of windows.
- ``partition_rollup`` (one scan, when the logs carry ``partitions``): per-partition sums per window, the window a
  divisor of both a minute and the report's bucket; ``topic_minute`` (live.py), ``partition_bytes`` and
  ``fairness_over_time`` are re-aggregations of it.
- ``latency_histogram`` (one scan): per API and quantized latency (whole microseconds, 3 significant digits) a
  count, an exact sum and the max; ``latency_by_api``'s percentiles are exact over it (nearest rank), so they
  depend on the values alone - not on the order Spark sees them in, nor on how the input was split: histograms of
  parts (the landed table's micro-batches and windows) re-sum to the histogram of the whole.

Every column of the three is a sum, a min or a max, and every table derived from them re-aggregates them by sums,
minima and maxima over coarser keys: a finer rollup, or rows of one key computed apart (the rollups ``landed.py``
lands per micro-batch), give the same tables without being merged first.

The remaining tables derive from written ones. Every table is written as Parquet under ``OUT/parquet/<name>/``;
``TABLES`` describes each for the report. Sums are of longs (no overflow before 2^63 bytes) and rates divide by
the bucket or window length in seconds.

Byte columns keep the access log's four directions. "Client bytes" where one figure is needed means
``bytes_client_to_proxy + bytes_proxy_to_client``: the traffic a client caused on its side of Sluice.
"""

from __future__ import annotations

import math

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

__all__ = [
    "BYTE_COLUMNS",
    "TABLES",
    "by_api",
    "by_client",
    "by_connection",
    "by_listener",
    "by_upstream",
    "error_codes",
    "fairness_over_time",
    "in_order",
    "inbound_rate",
    "latency_by_api",
    "latency_histogram",
    "minute_tables_from_rollup",
    "partition_bytes",
    "partition_fairness",
    "partition_rollup",
    "partition_rollup_window_s",
    "rebucket",
    "rollup",
    "rollup_view",
    "rollup_views",
    "rollup_window_s",
    "session_savings",
    "throttle_over_time",
    "traffic_over_time",
    "with_bucket",
]

BYTE_COLUMNS = ("bytes_client_to_proxy", "bytes_proxy_to_upstream", "bytes_upstream_to_proxy", "bytes_proxy_to_client")
#: the latency percentiles of ``latency_by_api``, in percent
PERCENTILES = (50, 95, 99)
#: significant decimal digits a latency (in microseconds) keeps in the histogram (``quantized_us``)
LATENCY_DIGITS = 3
#: larger latencies (31 years) are not measurements: left out, like a missing one
MAX_LATENCY_MS = 1e12
# error_codes is a key so that error_codes() needs no scan of its own: most responses carry none, so it adds few
# rows (an array key groups by its elements, in order).
ROLLUP_KEYS = ("window", "source", "conn_id", "client_id", "api", "listener", "upstream", "error_codes")
#: the per-minute tables' bucket (live.py: what `sluice stream` keeps current)
MINUTE_S = 60
PARTITION_SUMS = ("fetch_bytes", "fetches", "empty_fetches", "produce_bytes", "produces")

TABLES: dict[str, str] = {
    "traffic_over_time": "requests and bytes (4 directions) per time bucket, client_id and API",
    "by_client": "requests and bytes per client_id (from traffic_over_time)",
    "by_api": "requests, bytes and requests with errors per API (from traffic_over_time)",
    "latency_by_api": "latency p50/p95/p99 (nearest rank; latencies in whole microseconds kept to 3 significant "
                      "digits: exact below 1 ms, within 0.5 % above), max and mean per API, milliseconds",
    "error_codes": "responses per API and Kafka error code",
    "by_connection": "requests and bytes per connection: log file + conn_id",
    "by_listener": "requests, bytes and connections per Sluice listener (from by_connection)",
    "by_upstream": "requests, bytes and connections per upstream broker (from by_connection)",
    "inbound_rate": "bytes_upstream_to_proxy per upstream broker per rate window, and its rate",
    "partition_bytes": "bytes, fetches and produces per topic-partition (from the events' `partitions`)",
    "partition_fairness": "Jain's index of fetched bytes across the partitions of each topic (from partition_bytes)",
    "fairness_over_time": "Jain's index of fetched bytes across partitions per time bucket",
    "throttle_over_time": "throttle target vs achieved rate per time bucket and log file",
    "session_savings": "client-facing vs upstream fetch-session bytes per time bucket",
}


def in_order(df: DataFrame, *order: str | Column) -> DataFrame:
    """A small table's rows sorted by ``order``, as ``df.orderBy(*order)`` sorts them, for the report to collect.
    A global sort plans a range exchange whose bounds Spark samples in a Spark job of its own before the query's
    (RangePartitioner), so each ``orderBy(...).collect()`` was two jobs, ~0.1 s of planning and scheduling each; in
    one partition, sorted there, it is one. The same order: the same sort over the same rows, and rows equal in
    ``order`` keep the order they are read in, as through the exchange from a one-file table (the written tables
    are). Only for tables the driver collects whole anyway: one task sorts them."""
    return df.coalesce(1).sortWithinPartitions(*order)


def _sum_all(*columns: str) -> list[Column]:
    return [F.sum(c).alias(c) for c in columns]


def _resum() -> list[Column]:
    return _sum_all("requests", *BYTE_COLUMNS)


def with_bucket(events: DataFrame, bucket_s: int, name: str = "bucket") -> DataFrame:
    """Adds ``name`` (timestamp): the start of the ``bucket_s``-second bucket holding ``ts``, epoch-aligned."""
    start_s = F.floor(F.unix_micros(F.col("ts")) / F.lit(bucket_s * 1_000_000)) * F.lit(bucket_s)
    return events.withColumn(name, F.timestamp_seconds(start_s))


def rebucket(column: str, bucket_s: int) -> Column:
    """An epoch-aligned window start, moved to the start of its ``bucket_s`` bucket."""
    return F.timestamp_seconds(F.floor(F.unix_seconds(F.col(column)) / F.lit(bucket_s)) * F.lit(bucket_s))


def rollup_window_s(bucket_s: int, rate_window_s: int) -> int:
    """The rollup's window: the largest that divides both the report's bucket and the inbound-rate window."""
    return math.gcd(bucket_s, rate_window_s)


def rollup(events: DataFrame, window_s: int) -> DataFrame:
    """From the events: one row per (window, source, conn_id, client_id, api, listener, upstream, error_codes)."""
    throttled = F.col("throttle_target_bps").isNotNull()
    session = F.col("session_upstream_bytes").isNotNull()
    has_errors = F.coalesce(F.size(F.col("error_codes")), F.lit(0)) > 0
    return (
        with_bucket(events, window_s, "window")
        .groupBy(*ROLLUP_KEYS)
        .agg(
            F.count(F.lit(1)).alias("requests"),
            *_sum_all(*BYTE_COLUMNS),
            F.count_if(has_errors).alias("requests_with_errors"),
            F.min("ts").alias("first_ts"),
            F.max("ts").alias("last_ts"),
            # the optional fields (null sums and maxima where the logs lack them)
            F.count_if(throttled).alias("throttle_requests"),
            F.max("throttle_target_bps").alias("target_bps"),
            F.min("throttle_target_bps").alias("min_target_bps"),
            F.sum(F.when(throttled, F.coalesce(F.col("throttled_bytes"), F.lit(0)))).alias("throttled_bytes"),
            F.count_if(session).alias("session_requests"),
            F.sum(F.when(session, F.col("bytes_proxy_to_client"))).alias("session_client_bytes"),
            F.sum("session_upstream_bytes").alias("session_upstream_bytes"),
        )
    )


#: what the tables derived from the rollup need of it, each a coarser rollup (the same columns, keyed by fewer of
#: the rollup's keys): ``rollup_views`` computes them all in one aggregation, and each table re-aggregates its view
#: instead of the rollup, by the same sums, minima and maxima.
ROLLUP_VIEWS: dict[str, tuple[str, ...]] = {
    "traffic": ("window", "client_id", "api"),  # traffic_over_time, client_minute
    "inbound": ("window", "upstream"),  # inbound_rate
    "connections": ("source", "conn_id", "listener", "upstream", "client_id"),  # by_connection
    "errors": ("api", "error_codes"),  # error_codes
    "throttle": ("window", "source"),  # throttle_over_time, throttle_minute
    "session": ("window",),  # session_savings
}
_VIEW_KEYS = tuple(dict.fromkeys(key for keys in ROLLUP_VIEWS.values() for key in keys))


def rollup_views(rolled: DataFrame) -> DataFrame:
    """Every view of ``ROLLUP_VIEWS`` of the rollup (or of any re-aggregation of it: the landed rollups unmerged),
    in one aggregation over grouping sets; ``rollup_view`` takes one out. Why: the rollup grows with the windows
    times the connections (760k rows at 10M lines: docs/PERFORMANCE.md, Analytics), and each of the eight tables
    that read it scanned all of it in a Spark job of its own, after a job that cached it; the views together are a
    sixth of it (the connections without windows, the windows without connections), made by one job that reads the
    rollup once, and the tables' jobs then read only their view."""
    return rolled.groupingSets([list(keys) for keys in ROLLUP_VIEWS.values()], *_VIEW_KEYS).agg(
        *_sum_all("requests", *BYTE_COLUMNS, "requests_with_errors"),
        F.min("first_ts").alias("first_ts"),
        F.max("last_ts").alias("last_ts"),
        F.sum("throttle_requests").alias("throttle_requests"),
        F.max("target_bps").alias("target_bps"),
        F.min("min_target_bps").alias("min_target_bps"),
        *_sum_all("throttled_bytes", "session_requests", "session_client_bytes", "session_upstream_bytes"),
        F.grouping_id().alias("_view"),
    )


def rollup_view(views: DataFrame, name: str) -> DataFrame:
    """The view ``name`` (``ROLLUP_VIEWS``) of ``rollup_views``: its rows, its keys and the rollup's sums. A row of
    a view is told by ``grouping_id()``, which sets bit n-1-i when the i-th of the n grouping columns is not among
    the set's keys (its value is then null, which a key's own null would be too)."""
    keys = ROLLUP_VIEWS[name]
    view = sum(1 << (len(_VIEW_KEYS) - 1 - i) for i, key in enumerate(_VIEW_KEYS) if key not in keys)
    return views.filter(F.col("_view") == view).drop("_view", *(key for key in _VIEW_KEYS if key not in keys))


def traffic_over_time(rolled: DataFrame, bucket_s: int) -> DataFrame:
    """``requests_with_errors`` rides along so ``by_api`` needs no scan of its own."""
    return rolled.groupBy(rebucket("window", bucket_s).alias("bucket"), "client_id", "api").agg(
        *_sum_all("requests", *BYTE_COLUMNS, "requests_with_errors")
    )


def by_client(traffic: DataFrame) -> DataFrame:
    return traffic.groupBy("client_id").agg(*_sum_all("requests", *BYTE_COLUMNS, "requests_with_errors"))


def by_api(traffic: DataFrame) -> DataFrame:
    return traffic.groupBy("api").agg(*_sum_all("requests", *BYTE_COLUMNS, "requests_with_errors"))


def latency_us() -> Column:
    """``latency_ms`` in whole microseconds (half up: floor(ms * 1000 + 0.5), plain IEEE arithmetic, so Python
    computes the same), null when not measured: null, NaN, infinite, negative or beyond ``MAX_LATENCY_MS``."""
    ms = F.col("latency_ms")
    return F.when(ms.between(0.0, MAX_LATENCY_MS), F.floor(ms * 1000.0 + 0.5).cast("long"))


def quantized_us(us: Column) -> Column:
    """``us`` kept to its ``LATENCY_DIGITS`` most significant decimal digits, the rest rounded half up: below
    1 ms exact, above it within 0.5 % (the step is at most 1 % of the value). Integer arithmetic only (the digit
    count from the decimal string, not a logarithm), so the oracle reproduces it exactly."""
    extra = F.greatest(F.length(us.cast("string")) - F.lit(LATENCY_DIGITS), F.lit(0))
    scale = F.pow(F.lit(10), extra).cast("long")
    x = us + F.floor(scale / 2).cast("long")  # scale is 1 or a multiple of 10: exact halves
    return F.when(extra == 0, us).otherwise(x - x % scale)


def latency_histogram(events: DataFrame, window_s: int | None = None) -> DataFrame:
    """One row per (``window`` when ``window_s`` is given, api, ``latency_us``: the quantized latency, null for
    requests without a measured one): ``latencies`` (how many), ``sum_us`` (exact sum of their unquantized
    microseconds), ``max_ms`` (the largest ``latency_ms``). Every column merges by sum or max, so histograms of
    any split of the events - files, micro-batches, windows - re-sum to the histogram of all of them."""
    us = latency_us()
    keyed = with_bucket(events, window_s, "window") if window_s else events
    keys = ["window"] if window_s else []
    return keyed.groupBy(*keys, "api", quantized_us(us).alias("latency_us")).agg(*_latency_sums(
        F.count(us), F.sum(us), F.max(F.when(us.isNotNull(), F.col("latency_ms")))))


def _latency_sums(latencies: Column, sum_us: Column, max_ms: Column) -> list[Column]:
    return [latencies.alias("latencies"), sum_us.alias("sum_us"), max_ms.alias("max_ms")]


def latency_by_api(histogram: DataFrame) -> DataFrame:
    """Per API, from ``latency_histogram`` (or the landed ones, any number of rows per value): ``measured``, the
    percentiles ``PERCENTILES`` (nearest rank: the smallest quantized latency whose cumulative count reaches
    ceil(p/100 x measured)), the exact max and the mean of the unquantized microseconds, in milliseconds. Exact
    over the histogram, so the result depends on the values alone, never on the order or split of the input."""
    values = histogram.groupBy("api", "latency_us").agg(*_latency_sums(
        F.sum("latencies"), F.sum("sum_us"), F.max("max_ms")))
    cumulative = Window.partitionBy("api").orderBy("latency_us").rowsBetween(Window.unboundedPreceding,
                                                                            Window.currentRow)
    ranked = values.withColumn("_cum", F.sum("latencies").over(cumulative)).withColumn(
        "measured", F.sum("latencies").over(Window.partitionBy("api")))

    def percentile(p: int) -> Column:
        # integer ceil(p x measured / 100): a double p/100 would put e.g. 0.95 x 100 one rank too high
        reached = F.col("_cum") >= F.expr(f"(measured * {p} + 99) div 100")
        return (F.min(F.when(reached & F.col("latency_us").isNotNull(), F.col("latency_us"))) / 1000.0).alias(
            f"p{p}_ms")

    return ranked.groupBy("api").agg(
        F.max("measured").alias("measured"),
        *[percentile(p) for p in PERCENTILES],
        F.max("max_ms").alias("max_ms"),
        F.when(F.max("measured") > 0, F.sum("sum_us").cast("double") / F.max("measured") / 1000.0).alias("mean_ms"),
    )


def error_codes(rolled: DataFrame) -> DataFrame:
    """One row per (api, error code): how many responses carried it (a response with two codes counts for each),
    from the rollup, whose rows are per list of codes."""
    return (
        rolled.filter(F.size(F.col("error_codes")) > 0)
        .select("api", F.explode(F.col("error_codes")).alias("error_code"), "requests")
        .groupBy("api", "error_code")
        .agg(F.sum("requests").alias("responses"))
    )


def by_connection(rolled: DataFrame) -> DataFrame:
    """A connection is (source file, conn_id): conn_id is unique only within one proxy process, and each process
    writes its own file. (A log rotated mid-connection splits it into one row per file.) Sluice pairs each client
    connection with one listener and one upstream, so grouping by them does not split connections; client_id is
    per request, so the smallest one seen is shown and ``several_client_ids`` says whether there were others."""
    connection = ("source", "conn_id", "listener", "upstream")
    # Summed per client_id first, then per connection. A string's min and max cannot be kept in a hash aggregation's
    # buffer (Spark's HashAggregateExec takes fixed-width buffer fields only), so grouping the rollup by the
    # connection alone sorted every rollup row (SortAggregate: ~1 s of wall at 10M lines, 760k rows); grouped by
    # client_id too, the sums hash-aggregate, and only the result (about a row per connection) is sorted for the
    # min and max. Sums of sums, minima of minima: the same table.
    per_client = rolled.groupBy(*connection, "client_id").agg(
        *_resum(),
        F.min("first_ts").alias("first_ts"),
        F.max("last_ts").alias("last_ts"),
    )
    return per_client.groupBy(*connection).agg(
        F.min("client_id").alias("client_id"),
        (F.min("client_id") != F.max("client_id")).alias("several_client_ids"),
        *_resum(),
        F.min("first_ts").alias("first_ts"),
        F.max("last_ts").alias("last_ts"),
    )


def _by_endpoint(connections: DataFrame, column: str) -> DataFrame:
    return connections.groupBy(column).agg(*_resum(), F.count(F.lit(1)).alias("connections"))


def by_listener(connections: DataFrame) -> DataFrame:
    return _by_endpoint(connections, "listener")


def by_upstream(connections: DataFrame) -> DataFrame:
    return _by_endpoint(connections, "upstream")


def inbound_rate(rolled: DataFrame, window_s: int) -> DataFrame:
    """Inbound = bytes_upstream_to_proxy (what brokers sent through Sluice), per upstream and ``window_s`` window.
    Windows without traffic have no row (their rate is 0)."""
    return (
        rolled.groupBy("upstream", rebucket("window", window_s).alias("window"))
        .agg(F.sum("bytes_upstream_to_proxy").alias("bytes"))
        .withColumn("bps", F.col("bytes") / F.lit(float(window_s)))
    )


def throttle_over_time(rolled: DataFrame, bucket_s: int) -> DataFrame:
    """Per bucket and Sluice process (log file), since each process enforces its own throttle: target (the
    largest throttle in force in the bucket, bytes/s) vs achieved (throttled bytes / bucket)."""
    return (
        rolled.filter(F.col("throttle_requests") > 0)
        .groupBy(rebucket("window", bucket_s).alias("bucket"), "source")
        .agg(
            F.max("target_bps").alias("target_bps"),
            F.min("min_target_bps").alias("min_target_bps"),
            F.sum("throttled_bytes").alias("throttled_bytes"),
            F.sum("throttle_requests").alias("requests"),
        )
        .withColumn("achieved_bps", F.col("throttled_bytes") / F.lit(float(bucket_s)))
    )


def session_savings(rolled: DataFrame, bucket_s: int) -> DataFrame:
    """What clients received vs what the upstream fetch sessions carried for them; ``saved_bytes`` can be negative
    (a session costs a little when every partition changes)."""
    return (
        rolled.filter(F.col("session_requests") > 0)
        .groupBy(rebucket("window", bucket_s).alias("bucket"))
        .agg(
            F.sum("session_client_bytes").alias("client_bytes"),
            F.sum("session_upstream_bytes").alias("upstream_bytes"),
            F.sum("session_requests").alias("requests"),
        )
        .withColumn("saved_bytes", F.col("client_bytes") - F.col("upstream_bytes"))
    )


def _jain(n: Column, total: Column, total_sq: Column) -> Column:
    """(sum x)^2 / (n sum x^2) in doubles; null when undefined (no partitions or all zero)."""
    t = total.cast("double")
    return F.when(total_sq > 0, F.least(F.lit(1.0), (t * t) / (n.cast("double") * total_sq.cast("double"))))


def partition_rollup_window_s(bucket_s: int) -> int:
    """The partition rollup's window: the largest that divides both a minute (``topic_minute``) and the bucket."""
    return math.gcd(bucket_s, 60)


def partition_rollup(events: DataFrame, window_s: int) -> DataFrame:
    """From the events' optional ``partitions`` array: one row per (window, topic, partition) with ``PARTITION_SUMS``.
    ``empty_fetches``: fetches that returned the partition no bytes - many of them next to busy neighbours is what
    starvation looks like. Rows of other APIs carrying partitions give the partition a row with zero sums."""
    is_fetch = F.col("api") == "Fetch"
    is_produce = F.col("api") == "Produce"
    b = F.coalesce(F.col("p.bytes"), F.lit(0))
    return (
        with_bucket(events.filter(F.col("partitions").isNotNull()), window_s, "window")
        .select("window", "api", F.explode(F.col("partitions")).alias("p"))
        .groupBy("window", F.col("p.topic").alias("topic"), F.col("p.partition").alias("partition"))
        .agg(
            F.sum(F.when(is_fetch, b).otherwise(0)).alias("fetch_bytes"),
            F.count_if(is_fetch).alias("fetches"),
            F.count_if(is_fetch & (b == 0)).alias("empty_fetches"),
            F.sum(F.when(is_produce, b).otherwise(0)).alias("produce_bytes"),
            F.count_if(is_produce).alias("produces"),
        )
    )


def partition_bytes(parts: DataFrame) -> DataFrame:
    """Totals per topic-partition, from ``partition_rollup`` (or a coarser re-aggregation of it: the same sums)."""
    return parts.groupBy("topic", "partition").agg(*_sum_all(*PARTITION_SUMS))


def partition_fairness(partitions: DataFrame) -> DataFrame:
    """Per topic, over its partitions that were fetched at least once (a partition nobody fetched is idle, not
    starved)."""
    fetched = partitions.filter(F.col("fetches") > 0).withColumn("_x", F.col("fetch_bytes").cast("double"))
    return (
        fetched.groupBy("topic")
        .agg(
            F.count(F.lit(1)).alias("partitions"),
            F.sum("fetch_bytes").alias("fetch_bytes"),
            F.sum(F.col("_x") * F.col("_x")).alias("_sq"),
            F.count_if(F.col("fetch_bytes") == 0).alias("partitions_without_bytes"),
        )
        .withColumn("jain_index", _jain(F.col("partitions"), F.col("fetch_bytes"), F.col("_sq")))
        .drop("_sq")
    )


def fairness_over_time(parts: DataFrame, bucket_s: int) -> DataFrame:
    """Jain's index across all fetched partitions, per bucket: a dip shows when some partitions fell behind. From
    ``partition_rollup`` (its window divides ``bucket_s``); a partition counts in a bucket if it was fetched in it."""
    per_partition = (
        parts.groupBy(rebucket("window", bucket_s).alias("bucket"), "topic", "partition")
        .agg(F.sum("fetch_bytes").cast("double").alias("_x"), F.sum("fetches").alias("_fetches"))
        .filter(F.col("_fetches") > 0)
    )
    return (
        per_partition.groupBy("bucket")
        .agg(
            F.count(F.lit(1)).alias("partitions"),
            F.sum("_x").alias("fetch_bytes"),
            F.sum(F.col("_x") * F.col("_x")).alias("_sq"),
        )
        .withColumn("jain_index", _jain(F.col("partitions"), F.col("fetch_bytes"), F.col("_sq")))
        .drop("_sq")
    )


def minute_tables_from_rollup(views: DataFrame, window_s: int) -> dict[str, DataFrame] | None:
    """``client_minute`` and ``throttle_minute`` re-aggregated from the batch job's rollup (its ``rollup_views``: no
    scan of the events), when its window divides a minute (else None: compute them from the events)."""
    if MINUTE_S % window_s:
        return None
    minute = rebucket("window", MINUTE_S).alias("minute")
    client = rollup_view(views, "traffic").groupBy(minute, "client_id", "api").agg(
        *_sum_all("requests", *BYTE_COLUMNS, "requests_with_errors"))
    throttle = rollup_view(views, "throttle").filter(F.col("throttle_requests") > 0).groupBy(minute, "source").agg(
        F.sum("throttled_bytes").alias("throttled_bytes"),
        F.sum("throttle_requests").alias("requests"),
        F.max("target_bps").alias("target_bps"),
        F.min("min_target_bps").alias("min_target_bps"),
    )
    return {"client_minute": client, "throttle_minute": throttle}
