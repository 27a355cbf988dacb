"""The report's sections: small queries over the written Parquet tables, turned into charts, tables and text.

Everything here reads the tables the job wrote (a few thousand rows at most), never the events, so building the
report costs seconds however large the logs were, and the report shows exactly what the Parquet holds. Charts
show the top ``top_n`` series and fold the rest into "other"; tables show ``table_rows`` rows - the Parquet has
them all.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property, reduce
from typing import Any

from kafka.errors import for_code
from pyspark.sql import Column, DataFrame, Row
from pyspark.sql import functions as F

from proxy.analytics import charts
from proxy.analytics.aggregates import BYTE_COLUMNS, in_order
from proxy.analytics.drawing import draw
from proxy.analytics.fairness import jain_index_from_sums
from proxy.analytics.html import Chart, Section, Table
from proxy.analytics.kip73 import InboundRate, Recommendation
from proxy.analytics.source import InputCounts
from proxy.analytics.units import fmt_bytes, fmt_duration, fmt_rate

__all__ = ["ReportContext", "build_sections", "inbound_rates"]

OTHER = "(other)"
NO_CLIENT_ID = "(none)"
MAX_FILLED_BUCKETS = 5000  # beyond this many buckets, plot only the buckets present instead of zero-filling
THROTTLE_TOLERANCE = 1.05  # achieved may exceed target by 5% in one bucket before it counts as not held
SHORT_BYTES = ("c->p", "p->u", "u->p", "p->c")  # the four directions, abbreviated for table headers


@dataclass(frozen=True)
class ReportContext:
    counts: InputCounts
    bucket_s: int
    rate_window_s: int
    top_n: int
    table_rows: int
    tables: dict[str, DataFrame]  # name -> the written table, read back
    paths: dict[str, str]  # name -> where it was written
    malformed_samples: list[str]
    recommendation: Recommendation
    inbound: list[InboundRate]

    @cached_property
    def rows(self) -> dict[str, int]:
        """Every table's row count, from one query (a count per table would be a Spark job each, ~0.1 s of
        planning and scheduling): the tables section lists them, and the sections that show a table's size read
        it here instead of counting it again."""
        counted = [df.groupBy().count().withColumn("name", F.lit(name)) for name, df in self.tables.items()]
        return {r["name"]: r["count"] for r in reduce(DataFrame.unionByName, counted).collect()} if counted else {}


def _ascending(value: Any) -> tuple[bool, Any]:
    """A sort key ordering values as Spark's ascending sort does: nulls first (strings by code point, as Spark's
    byte-wise UTF-8 order does)."""
    return (value is not None, value)


def _sum_or_null(a: int | None, b: int | None) -> int | None:
    """``a + b`` as Spark adds two columns: null when either is."""
    return None if a is None or b is None else a + b


def _descending(value: int | float | None) -> tuple[bool, int | float]:
    """A sort key ordering numbers as Spark's descending sort does: nulls last."""
    return (value is None, -value if value is not None else 0)


def _client(value: str | None) -> str:
    return NO_CLIENT_ID if value is None else value


def _file(source: str | None) -> str:
    """The log file's name without directories or extensions: which sidecar, in a chart label's space."""
    name = (source or "?").rsplit("/", 1)[-1]
    for ext in (".gz", ".jsonl", ".json", ".log"):
        name = name.removesuffix(ext)
    return name


def _client_bytes() -> Column:
    return F.col("bytes_client_to_proxy") + F.col("bytes_proxy_to_client")


def _epoch(column: str) -> Column:
    return F.unix_seconds(F.col(column))


def _utc(seconds: int) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


class _Series:
    """Values per (bucket, label) -> zero-filled aligned lists for a time-series chart, per second."""

    def __init__(self, bucket_s: int) -> None:
        self.bucket_s = bucket_s
        self.values: dict[str, dict[int, float]] = defaultdict(dict)

    def add(self, bucket: int, label: str, value: float) -> None:
        self.values[label][bucket] = self.values[label].get(bucket, 0.0) + value

    def times(self) -> list[int]:
        present = sorted({b for v in self.values.values() for b in v})
        if not present:
            return []
        filled = range(present[0], present[-1] + self.bucket_s, self.bucket_s)
        return list(filled) if len(filled) <= MAX_FILLED_BUCKETS else present

    def chart_data(self, order: Iterable[str] | None = None) -> tuple[list[datetime], dict[str, list[float]]]:
        times = self.times()
        labels = list(order) if order is not None else sorted(self.values)
        series = {
            label: [self.values[label].get(t, 0.0) / self.bucket_s for t in times]
            for label in labels
            if label in self.values
        }
        return [_utc(t) for t in times], series


def _labelled(column: str, keep: list[Any]) -> Column:
    """``column`` when among ``keep`` (null included, as the no-client-id label), else OTHER."""
    keep_values = [k for k in keep if k is not None]
    is_kept = F.col(column).isin(keep_values) if keep_values else F.lit(False)
    if None in keep:
        is_kept = is_kept | F.col(column).isNull()
    return F.when(is_kept, F.coalesce(F.col(column), F.lit(NO_CLIENT_ID))).otherwise(F.lit(OTHER))


def _label(value: Any, keep: set[Any]) -> str:
    return _client(value) if value in keep else OTHER


def _order(keep: list[Any], has_other: bool) -> list[str]:
    return [_client(k) for k in keep] + ([OTHER] if has_other else [])


# ------------------------------------------------------------------------------------------------------ input


def input_section(ctx: ReportContext) -> Section:
    c = ctx.counts
    s = Section("input", "Input")
    span = f"from {c.first_ts:%Y-%m-%d %H:%M:%S} to {c.last_ts:%Y-%m-%d %H:%M:%S} UTC" if c.first_ts else "no time span"
    s.paragraphs.append(
        f"{c.lines:,} lines in {c.files:,} file(s), {span}. {c.valid:,} valid requests are analysed. "
        f"{c.malformed:,} malformed lines (not JSON, or a value of the wrong type) were counted and skipped; "
        f"malformed lines never stop the job."
    )
    s.tables.append(
        Table(
            "Lines by class",
            ["class", "meaning", "lines"],
            [
                ("valid", "schema 1 requests with every required field", c.valid),
                ("malformed", "not JSON, or a value of the wrong type", c.malformed),
                ("incomplete", "valid JSON missing a field schema 1 always writes", c.incomplete),
                ("other schema", "a schema version other than 1 (not interpreted)", c.other_schema),
                ("other event", 'schema 1 but event is not "request"', c.other_event),
                ("total", "non-blank lines read", c.lines),
            ],
            text_columns=2,
        )
    )
    if ctx.malformed_samples:
        s.pre_caption = f"First {len(ctx.malformed_samples)} malformed line(s), shortened:"
        s.preformatted.extend(ctx.malformed_samples)
    return s


# ---------------------------------------------------------------------------------------------------- traffic


def traffic_section(ctx: ReportContext) -> Section:
    s = Section("traffic", "Traffic by client and API over time")
    s.paragraphs.append(
        f"Time buckets of {ctx.bucket_s} s; rates are per second within each bucket. Client bytes = bytes from the "
        f"client to Sluice + bytes from Sluice to the client. The {ctx.top_n} largest series are drawn; the rest "
        f"are summed as {OTHER}."
    )
    if ctx.counts.valid == 0:
        s.no_data = "No valid requests in these logs."
        return s
    n = ctx.top_n
    apis = ctx.tables["by_api"].collect()  # one row per API: a few dozen at most
    by_client = ctx.tables["by_client"]
    clients = by_client.orderBy(_client_bytes().desc(), F.col("client_id").asc_nulls_first()).limit(
        max(n, ctx.table_rows)).collect()
    client_count = ctx.rows["by_client"]

    def client_bytes(r: Row) -> int:
        return int(r["bytes_client_to_proxy"] + r["bytes_proxy_to_client"])

    top_clients = [r["client_id"] for r in clients[:n]]
    top_api_req = [r["api"] for r in sorted(apis, key=lambda r: (-r["requests"], r["api"]))[:n]]
    top_api_bytes = [r["api"] for r in sorted(apis, key=lambda r: (-client_bytes(r), r["api"]))[:n]]

    # One query for all four charts: traffic per bucket, client (top n or other) and API (kept by either ranking).
    traffic = ctx.tables["traffic_over_time"]
    keep_apis = sorted(set(top_api_req) | set(top_api_bytes))
    rows = (
        traffic.groupBy(
            _epoch("bucket").alias("t"),
            _labelled("client_id", top_clients).alias("client"),
            F.when(F.col("api").isin(keep_apis), F.col("api")).otherwise(F.lit(OTHER)).alias("api"),
        )
        .agg(F.sum("requests").alias("requests"), F.sum(_client_bytes()).alias("bytes"))
        .collect()
    )
    series = {key: _Series(ctx.bucket_s) for key in ("api_req", "api_bytes", "client_req", "client_bytes")}
    req_keep, bytes_keep = set(top_api_req), set(top_api_bytes)
    for r in rows:
        t, req, nbytes = int(r["t"]), float(r["requests"]), float(r["bytes"])
        series["api_req"].add(t, _label(r["api"], req_keep), req)
        series["api_bytes"].add(t, _label(r["api"], bytes_keep), nbytes)
        series["client_req"].add(t, r["client"], req)
        series["client_bytes"].add(t, r["client"], nbytes)
    many_apis = len(apis) > n
    many_clients = client_count > len(top_clients)
    for key, title, order, ylabel, stacked in (
        ("api_req", "Requests per second by API", _order(top_api_req, many_apis), "requests/s", False),
        ("api_bytes", "Client bytes per second by API", _order(top_api_bytes, many_apis), "bytes/s", True),
        ("client_req", "Requests per second by client_id", _order(top_clients, many_clients), "requests/s", False),
        ("client_bytes", "Client bytes per second by client_id", _order(top_clients, many_clients), "bytes/s", True),
    ):
        times, data = series[key].chart_data(order)
        s.charts.append(Chart(title, draw(charts.time_series, title, times, data, ylabel=ylabel, stacked=stacked)))

    s.tables.append(
        Table(
            f"Top {min(ctx.table_rows, len(clients))} clients by client bytes (of {client_count:,})",
            ["client_id", "requests", "with errors", *SHORT_BYTES],
            [(_client(r["client_id"]), r["requests"], r["requests_with_errors"], *[r[c] for c in BYTE_COLUMNS])
             for r in clients[: ctx.table_rows]],
        )
    )
    s.tables.append(
        Table(
            "Per API",
            ["api", "requests", "with errors", *SHORT_BYTES],
            [(r["api"], r["requests"], r["requests_with_errors"], *[r[c] for c in BYTE_COLUMNS])
             for r in sorted(apis, key=lambda r: (-r["requests"], r["api"]))],
        )
    )
    s.paragraphs.append(
        "Byte columns: c->p client to Sluice, p->u Sluice to upstream, u->p upstream to Sluice, p->c Sluice to client."
    )
    return s


# ---------------------------------------------------------------------------------------------------- latency


def latency_section(ctx: ReportContext) -> Section:
    s = Section("latency", "Latency per API")
    s.paragraphs.append(
        "Request read -> response written, as Sluice measured it (so it includes the broker's time, e.g. a Fetch "
        "waiting for data). Percentiles are nearest-rank over the latencies in whole microseconds kept to 3 "
        "significant digits (exact below 1 ms, within 0.5 % above); max exact, mean of the whole microseconds."
    )
    rows = in_order(ctx.tables["latency_by_api"].filter(F.col("measured") > 0), F.col("measured").desc()).collect()
    if not rows:
        s.no_data = "No latencies in these logs."
        return s
    labels = [r["api"] for r in rows]
    groups = {p: [float(r[f"{p}_ms"]) for r in rows] for p in ("p50", "p95", "p99")}
    s.charts.append(
        Chart("Latency percentiles per API", draw(charts.grouped_bars, "Latency percentiles per API (log scale)",
                                                  labels, groups, ylabel="milliseconds", log=True))
    )
    s.tables.append(
        Table(
            "Latency per API, milliseconds",
            ["api", "requests", "p50", "p95", "p99", "max", "mean"],
            [(r["api"], r["measured"], r["p50_ms"], r["p95_ms"], r["p99_ms"], r["max_ms"], r["mean_ms"]) for r in rows],
        )
    )
    return s


# ----------------------------------------------------------------------------------------------------- errors


def error_name(code: int) -> str:
    return str(getattr(for_code(code), "message", "UNKNOWN"))


def errors_section(ctx: ReportContext) -> Section:
    s = Section("errors", "Error codes")
    s.paragraphs.append(
        "Non-zero Kafka error codes in responses Sluice decoded (responses relayed as bytes are not inspected, so "
        "this undercounts APIs Sluice does not decode)."
    )
    rows = in_order(ctx.tables["error_codes"], F.col("responses").desc(), "api", "error_code").collect()
    if not rows:
        s.no_data = "No error codes in these logs."
        return s
    shown = rows[: ctx.table_rows]
    labels = [f"{r['error_code']} {error_name(r['error_code'])} ({r['api']})" for r in shown]
    s.charts.append(
        Chart("Responses per error code", draw(charts.bars, "Responses per error code and API", labels,
                                                      [r["responses"] for r in shown], xlabel="responses"))
    )
    s.tables.append(
        Table(
            "Responses per error code",
            ["api", "code", "name", "responses"],
            [(r["api"], str(r["error_code"]), error_name(r["error_code"]), r["responses"]) for r in shown],
            text_columns=3,
        )
    )
    return s


# ------------------------------------------------------------------------------------------------ connections


def _endpoint_tables(ctx: ReportContext, rows: int) -> dict[str, tuple[Table, list[Row]]]:
    """Per listener and per upstream (``by_listener``, ``by_upstream``: a row per endpoint, a few dozen), the top
    ``rows`` by client bytes, then by name: the table and its rows. Both tables from one query, sorted here: a
    query each was a Spark job each (~0.1 s of planning and scheduling) for tables the driver sorts as cheaply. The
    same order as ``orderBy(client bytes desc, name)``: the name is the table's key, so no two rows tie."""
    columns = {"by_listener": "listener", "by_upstream": "upstream"}
    both = reduce(DataFrame.unionByName, [
        ctx.tables[name].select(F.lit(name).alias("_table"), F.col(column).alias("_name"), "connections",
                                "requests", *BYTE_COLUMNS)
        for name, column in columns.items()]).collect()
    out = {}
    for name, column in columns.items():
        top = sorted((r for r in both if r["_table"] == name),
                     key=lambda r: (_descending(_sum_or_null(r["bytes_client_to_proxy"], r["bytes_proxy_to_client"])),
                                    _ascending(r["_name"])))[:rows]
        table = Table(
            f"Per {column}",
            [column, "connections", "requests", *SHORT_BYTES],
            [(r["_name"] or "(unknown)", r["connections"], r["requests"], *[r[c] for c in BYTE_COLUMNS])
             for r in top],
        )
        out[column] = (table, top)
    return out


def connections_section(ctx: ReportContext) -> Section:
    s = Section("connections", "Connections, listeners and upstreams")
    s.paragraphs.append(
        "A connection is one client TCP connection to Sluice: (log file, conn_id). Sluice pairs it with one "
        "upstream connection, to the broker of the listener the client connected to."
    )
    conns = ctx.tables["by_connection"]
    if ctx.counts.valid == 0:
        s.no_data = "No valid requests in these logs."
        return s
    total = ctx.rows["by_connection"]
    top = conns.orderBy(_client_bytes().desc(), "source", "conn_id").limit(ctx.table_rows).collect()
    labels = [f"{_client(r['client_id'])} #{r['conn_id']} {_file(r['source'])}" for r in top]
    s.charts.append(
        Chart("Client bytes per connection", draw(charts.bars,
            f"Top {len(top)} connections by client bytes (of {total:,})", labels,
            [float(r["bytes_client_to_proxy"] + r["bytes_proxy_to_client"]) for r in top], xlabel="bytes"))
    )
    for column, (table, rows) in _endpoint_tables(ctx, ctx.table_rows).items():
        s.charts.append(
            Chart(f"Bytes per {column}", draw(charts.bars,
                f"Client bytes per {column}", [r["_name"] or "(unknown)" for r in rows],
                [float(r["bytes_client_to_proxy"] + r["bytes_proxy_to_client"]) for r in rows], xlabel="bytes"))
        )
        s.tables.append(table)
    s.tables.append(
        Table(
            f"Top {len(top)} connections by client bytes (of {total:,})",
            ["conn_id", "client_id", "listener", "upstream", "requests", *SHORT_BYTES, "log file"],
            [(str(r["conn_id"]), _client(r["client_id"]), r["listener"], r["upstream"], r["requests"],
              *[r[c] for c in BYTE_COLUMNS], _file(r["source"])) for r in top],
            text_columns=4,
        )
    )
    return s


# ------------------------------------------------------------------------------------------------- partitions


def _no_field(field: str, what: str) -> str:
    return (
        f"No data in these logs: {what} needs the access-log field `{field}`, which these logs do not carry "
        f"(it is added by a later Sluice version; schema 1 readers pick it up when present)."
    )


def partitions_section(ctx: ReportContext) -> Section:
    s = Section("partitions", "Partitions and fairness")
    if "partition_bytes" not in ctx.tables:
        s.no_data = _no_field("partitions", "per-partition bytes and fairness")
        return s
    # Every fetched partition's row, in the order the table is read (a row per partition: a few hundred), for the
    # sums, the most and the least fetched: one query where an aggregation and two sorted queries were a Spark job
    # each (~0.1 s of planning and scheduling). The same figures: the sums are added in the order the aggregation
    # read the rows (one task over the one-file table: the file's order), as doubles where it cast them; the sorts
    # are by fetched bytes, then by topic and partition, the table's key, so no two rows tie.
    fetched = ctx.tables["partition_bytes"].filter(F.col("fetches") > 0).collect()
    t = sq = 0.0
    for r in fetched:
        if r["fetch_bytes"] is not None:  # a sum leaves nulls out
            x = float(r["fetch_bytes"])
            t += x
            sq += x * x
    agg = {"n": len(fetched), "zero": sum(1 for r in fetched if r["fetch_bytes"] == 0)}
    jain = jain_index_from_sums(agg["n"], t, sq)
    jain_text = "undefined (no bytes fetched)" if jain is None else f"{jain:.3f}"
    s.paragraphs.append(
        f"Fairness is Jain's index J = (sum x)^2 / (n * sum x^2) over the bytes fetched per partition: 1 when every "
        f"fetched partition got the same bytes, 1/n when one got everything (k equally served of n gives k/n). "
        f"Across all {agg['n']:,} fetched partitions J = {jain_text}; {agg['zero']:,} partition(s) were fetched but "
        f"never returned bytes (starved, or simply idle)."
    )

    def by_bytes(descending: bool) -> list[Row]:
        return sorted(fetched, key=lambda r: ((_descending if descending else _ascending)(r["fetch_bytes"]),
                                              _ascending(r["topic"]), _ascending(r["partition"])))[: ctx.table_rows]

    top = by_bytes(descending=True)
    s.charts.append(
        Chart("Fetched bytes per partition", draw(charts.bars,
            f"Top {len(top)} partitions by fetched bytes", [f"{r['topic']}-{r['partition']}" for r in top],
            [float(r["fetch_bytes"]) for r in top], xlabel="bytes"))
    )
    over_time = in_order(ctx.tables["fairness_over_time"], "bucket").select(_epoch("bucket").alias("t"), "jain_index")
    rows = [r for r in over_time.collect() if r["jain_index"] is not None]
    if rows:
        s.charts.append(
            Chart("Fairness over time", draw(charts.time_series,
                "Jain's index of fetched bytes across partitions, per bucket", [_utc(r["t"]) for r in rows],
                {"J": [float(r["jain_index"]) for r in rows]}, ylabel="J (1 = fair)", hlines={"fair": 1.0}))
        )
    columns = ["topic", "partition", "fetched bytes", "fetches", "empty fetches", "produced bytes", "produces"]

    def part_rows(rs: Sequence[Row]) -> list[tuple[object, ...]]:
        return [(r["topic"], str(r["partition"]), r["fetch_bytes"], r["fetches"], r["empty_fetches"],
                 r["produce_bytes"], r["produces"]) for r in rs]

    s.tables.append(Table("Most fetched partitions", columns, part_rows(top), text_columns=2))
    if agg["n"] > len(top):  # otherwise the most-fetched table already lists every partition
        s.tables.append(Table("Least fetched partitions (fetched at least once)", columns,
                              part_rows(by_bytes(descending=False)), text_columns=2))
    fair = ctx.tables["partition_fairness"].orderBy(F.col("fetch_bytes").desc()).limit(ctx.table_rows).collect()
    s.tables.append(
        Table(
            "Fairness per topic",
            ["topic", "partitions", "fetched bytes", "without bytes", "Jain's index"],
            [(r["topic"], r["partitions"], r["fetch_bytes"], r["partitions_without_bytes"], r["jain_index"])
             for r in fair],
        )
    )
    return s


# --------------------------------------------------------------------------------------------------- throttle


def throttle_section(ctx: ReportContext) -> Section:
    s = Section("throttle", "Throttle: target vs achieved")
    if "throttle_over_time" not in ctx.tables:
        s.no_data = _no_field("throttle_target_bps", "the throttle's target and achieved rate")
        return s
    table = ctx.tables["throttle_over_time"]
    rows = table.select(_epoch("bucket").alias("t"), "source", "target_bps", "achieved_bps", "throttled_bytes")
    pairs = (rows.collect() if ctx.rows["throttle_over_time"] <= MAX_FILLED_BUCKETS * 4
             else rows.limit(MAX_FILLED_BUCKETS).collect())
    held = sum(1 for r in pairs if r["achieved_bps"] <= r["target_bps"] * THROTTLE_TOLERANCE)
    s.paragraphs.append(
        f"Each Sluice process (log file) enforces its own throttle. Per process and bucket: achieved = throttled "
        f"bytes / {ctx.bucket_s} s, target = the throttle in force (the largest, if it changed within the bucket). "
        f"The throttle held (achieved <= target + {THROTTLE_TOLERANCE - 1:.0%}) in {held:,} of {len(pairs):,} "
        f"process-buckets. The chart sums targets and achieved rates over all processes."
    )
    target: dict[int, float] = defaultdict(float)
    achieved: dict[int, float] = defaultdict(float)
    for r in pairs:
        target[int(r["t"])] += float(r["target_bps"])
        achieved[int(r["t"])] += float(r["achieved_bps"])
    buckets = sorted(target)
    times = [_utc(t) for t in buckets]
    data = {"target": [target[t] for t in buckets], "achieved": [achieved[t] for t in buckets]}
    s.charts.append(
        Chart("Throttle target vs achieved", draw(charts.time_series,
            "Throttle target vs achieved rate (all processes)", times, data, ylabel="bytes/s"))
    )
    worst = sorted(pairs, key=lambda r: r["achieved_bps"] / r["target_bps"] if r["target_bps"] else 0.0,
                   reverse=True)[: ctx.table_rows]
    s.tables.append(
        Table(
            "Process-buckets with the highest achieved/target ratio",
            ["bucket (UTC)", "log file", "target B/s", "achieved B/s", "throttled bytes"],
            [(f"{_utc(r['t']):%Y-%m-%d %H:%M:%S}", _file(r["source"]), r["target_bps"], r["achieved_bps"],
              r["throttled_bytes"]) for r in worst],
            text_columns=2,
        )
    )
    return s


# --------------------------------------------------------------------------------------------------- sessions


def sessions_section(ctx: ReportContext) -> Section:
    s = Section("sessions", "Fetch sessions: upstream vs client-facing bytes")
    if "session_savings" not in ctx.tables:
        s.no_data = _no_field("session_upstream_bytes", "session savings")
        return s
    rows = in_order(ctx.tables["session_savings"], "bucket").select(
        _epoch("bucket").alias("t"), "client_bytes", "upstream_bytes").collect()
    client = sum(int(r["client_bytes"]) for r in rows)
    upstream = sum(int(r["upstream_bytes"]) for r in rows)
    saved = client - upstream
    share = f"{saved / client:.1%}" if client else "n/a"
    s.paragraphs.append(
        f"Clients received {fmt_bytes(client)} while the upstream fetch sessions carried {fmt_bytes(upstream)} for "
        f"them: {fmt_bytes(saved)} saved on the upstream link ({share})."
    )
    s.charts.append(
        Chart("Session savings", draw(charts.time_series,
            "Client-facing vs upstream session bytes per second", [_utc(r["t"]) for r in rows],
            {"to clients": [r["client_bytes"] / ctx.bucket_s for r in rows],
             "from upstream sessions": [r["upstream_bytes"] / ctx.bucket_s for r in rows]},
            ylabel="bytes/s"))
    )
    return s


# ------------------------------------------------------------------------------------------- recommendation


def inbound_rates(inbound: DataFrame, span_s: float, window_s: int) -> list[InboundRate]:
    """Per upstream: peak and p95 over windows with traffic; mean over the whole span of the logs."""
    rows = inbound.groupBy("upstream").agg(
        F.max("bps").alias("peak"),
        F.percentile_approx("bps", 0.95, 10_000).alias("p95"),
        F.sum("bytes").alias("bytes"),
        F.count(F.lit(1)).alias("windows"),
    ).collect()
    span = max(span_s, float(window_s))
    return sorted(
        (
            InboundRate(
                upstream=r["upstream"] or "(unknown)",
                peak_bps=float(r["peak"]),
                p95_bps=float(r["p95"]),
                mean_bps=float(r["bytes"]) / span,
                windows=int(r["windows"]),
                window_s=window_s,
            )
            for r in rows
        ),
        key=lambda x: -x.peak_bps,
    )


def recommendation_section(ctx: ReportContext) -> Section:
    rec = ctx.recommendation
    s = Section("recommendation", "Throttle recommendation (KIP-73)")
    s.paragraphs.extend(rec.text)
    if ctx.inbound:
        s.tables.append(
            Table(
                f"Inbound rate per upstream broker ({ctx.rate_window_s} s windows)",
                ["upstream", "peak", "p95", "mean", "windows"],
                [(r.upstream, fmt_rate(r.peak_bps), fmt_rate(r.p95_bps), fmt_rate(r.mean_bps), r.windows)
                 for r in ctx.inbound[: ctx.table_rows]],
            )
        )
        top = [r.upstream for r in ctx.inbound[: ctx.top_n]]
        # Drawn per report bucket when that is a whole number of rate windows, else per rate window: never finer
        # than the windows IN was measured over, so the IN line and the curves are the same kind of rate.
        step = ctx.bucket_s if ctx.bucket_s % ctx.rate_window_s == 0 else ctx.rate_window_s
        series = _Series(step)
        rows = ctx.tables["inbound_rate"].groupBy(
            "upstream", F.floor(_epoch("window") / step).alias("b")).agg(F.sum("bytes").alias("v")).collect()
        for r in rows:
            label = r["upstream"] or "(unknown)"
            series.add(int(r["b"]) * step, label if label in top else OTHER, float(r["v"]))
        times, data = series.chart_data([*top, OTHER])
        refs = {f"IN (peak {ctx.rate_window_s} s window)": rec.inbound_bps}
        if rec.throttle_bps is not None:
            refs["recommended T"] = rec.throttle_bps
        s.charts.append(
            Chart("Inbound rate per upstream", draw(charts.time_series,
                f"Inbound rate per upstream broker (bytes_upstream_to_proxy, {step} s steps)", times, data,
                ylabel="bytes/s", hlines=refs))
        )
    if rec.examples:
        s.tables.append(
            Table(
                "Move time at throttles across the safe range",
                ["throttle T", "bytes to move", "move time"],
                [(fmt_rate(t), fmt_bytes(b), fmt_duration(m)) for t, b, m in rec.examples],
                text_columns=3,
            )
        )
    return s


# ---------------------------------------------------------------------------------------------------- tables


def tables_section(ctx: ReportContext, descriptions: dict[str, str]) -> Section:
    s = Section("tables", "Parquet tables")
    s.paragraphs.append("Every aggregate behind this report, in full, for further analysis (Spark, pandas, DuckDB).")
    counts = ctx.rows
    s.tables.append(
        Table(
            "Tables written",
            ["table", "path", "contents", "rows"],
            [(name, ctx.paths[name], descriptions.get(name, ""), counts.get(name, 0)) for name in ctx.tables],
            text_columns=3,
        )
    )
    return s


SECTIONS: tuple[Callable[[ReportContext], Section], ...] = (
    input_section,
    traffic_section,
    latency_section,
    errors_section,
    connections_section,
    partitions_section,
    throttle_section,
    sessions_section,
    recommendation_section,
)


def build_sections(ctx: ReportContext, descriptions: dict[str, str]) -> list[Section]:
    from proxy.analytics.minutes import minute_sections  # it reads the live module's tables: imported when needed

    built = [build(ctx) for build in SECTIONS]
    # the per-minute views right after the traffic over time (input, traffic, then these)
    return [*built[:2], *minute_sections(ctx.tables, ctx.top_n, ctx.table_rows), *built[2:],
            tables_section(ctx, descriptions)]
