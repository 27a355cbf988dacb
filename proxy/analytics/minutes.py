"""The report's per-minute sections, from the per-minute tables (``live.MINUTE_TABLES``): the batch report shows
them next to its other sections, and the live report (``sluice report --live DIR``, :func:`live_report`) shows only
them, from the tables ``sluice stream`` keeps current.

- bytes per client per minute (the top ``top_n`` clients drawn, the rest summed as "(other)");
- fetched bytes per topic per minute, and starvation: partitions fetched without bytes in a minute in which their
  topic delivered bytes to others (a partition nobody's fetch returned anything for, in a quiet minute, is idle);
- the throttle's target vs the achieved rate, per minute (all Sluice processes).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from proxy.analytics import charts
from proxy.analytics.aggregates import in_order
from proxy.analytics.drawing import draw
from proxy.analytics.html import Chart, Section, Table, render
from proxy.analytics.live import MINUTE_S, MINUTE_TABLES, current_tables
from proxy.analytics.source import CLASSES

__all__ = ["live_report", "minute_sections"]

OTHER = "(other)"
NO_CLIENT_ID = "(none)"


def _utc(seconds: int) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def _per_minute(rows: list[Any], label: Callable[[Any], str], order: list[str]) -> tuple[list[datetime],
                                                                                          dict[str, list[float]]]:
    """Rows (t, label value, bytes) -> zero-filled per-second rates per minute, per label."""
    values: dict[str, dict[int, float]] = {}
    for r in rows:
        by_t = values.setdefault(label(r), {})
        by_t[int(r["t"])] = by_t.get(int(r["t"]), 0.0) + float(r["v"])
    present = sorted({t for v in values.values() for t in v})
    times = list(range(present[0], present[-1] + MINUTE_S, MINUTE_S)) if present else []
    if len(times) > 5000:
        times = present
    return [_utc(t) for t in times], {k: [values[k].get(t, 0.0) / MINUTE_S for t in times]
                                      for k in order if k in values}


def clients_section(tables: dict[str, DataFrame], top_n: int, table_rows: int) -> Section:
    s = Section("minute-clients", "Per minute: bytes by client")
    s.paragraphs.append(
        "Client bytes (client to Sluice + Sluice to client) per second, per minute, for the "
        f"{top_n} largest clients; the rest are summed as {OTHER}.")
    df = tables.get("client_minute")
    client_bytes = F.col("bytes_client_to_proxy") + F.col("bytes_proxy_to_client")
    totals = (in_order(df.groupBy("client_id").agg(F.sum("requests").alias("requests"),
                                                   F.sum(client_bytes).alias("bytes"),
                                                   F.count_distinct("minute").alias("minutes")),
                       F.col("bytes").desc(), F.col("client_id").asc_nulls_first()).collect()
              if df is not None else [])
    if not totals:
        s.no_data = "No requests yet."
        return s
    assert df is not None
    top = [r["client_id"] for r in totals[:top_n]]
    keep = F.col("client_id").isin([c for c in top if c is not None])
    if None in top:
        keep = keep | F.col("client_id").isNull()
    label = F.when(keep, F.coalesce(F.col("client_id"), F.lit(NO_CLIENT_ID))).otherwise(F.lit(OTHER))
    rows = (df.groupBy(F.unix_seconds("minute").alias("t"), label.alias("c"))
            .agg(F.sum(F.col("bytes_client_to_proxy") + F.col("bytes_proxy_to_client")).alias("v")).collect())
    order = [NO_CLIENT_ID if c is None else c for c in top] + ([OTHER] if len(totals) > len(top) else [])
    times, data = _per_minute(rows, lambda r: r["c"], order)
    s.charts.append(Chart("Client bytes per second per minute", draw(charts.time_series,
        "Client bytes per second by client_id, per minute", times, data, ylabel="bytes/s", stacked=True)))
    s.tables.append(Table(
        f"Top {min(table_rows, len(totals))} clients (of {len(totals):,})", ["client_id", "requests", "bytes",
                                                                              "minutes active"],
        [(NO_CLIENT_ID if r["client_id"] is None else r["client_id"], r["requests"], r["bytes"], r["minutes"])
         for r in totals[:table_rows]]))
    return s


def topics_section(tables: dict[str, DataFrame], top_n: int, table_rows: int) -> Section:
    s = Section("minute-topics", "Per minute: bytes by topic, starvation")
    df = tables.get("topic_minute")
    # no topics when the table has no rows: the query that ranks them also says whether there is any (a query of
    # its own for that was a Spark job, ~0.1 s of planning and scheduling)
    topics = (in_order(df.groupBy("topic").agg(F.sum("fetch_bytes").alias("bytes")), F.col("bytes").desc(),
                       "topic").collect() if df is not None else [])
    if df is None or not topics:
        s.no_data = ("No per-partition bytes: the access log carries them (`partitions`) only for fetches Sluice "
                     "decoded (a size limit, throttle or terminate-mode session applied).")
        return s
    s.paragraphs.append(
        "Fetched record bytes per second, per minute and topic. A partition starves in a minute when it was fetched "
        "and returned no bytes while other partitions of its topic returned some.")
    top = [r["topic"] for r in topics[:top_n]]
    label = F.when(F.col("topic").isin(top), F.col("topic")).otherwise(F.lit(OTHER))
    rows = (df.groupBy(F.unix_seconds("minute").alias("t"), label.alias("c"))
            .agg(F.sum("fetch_bytes").alias("v")).collect())
    times, data = _per_minute(rows, lambda r: r["c"], top + ([OTHER] if len(topics) > len(top) else []))
    s.charts.append(Chart("Fetched bytes per second per topic", draw(charts.time_series,
        "Fetched bytes per second by topic, per minute", times, data, ylabel="bytes/s", stacked=True)))
    busy = df.groupBy("minute", "topic").agg(F.sum("fetch_bytes").alias("topic_bytes"))
    starved = (
        df.join(busy, ["minute", "topic"])
        .withColumn("starved", (F.col("fetches") > 0) & (F.col("fetch_bytes") == 0) & (F.col("topic_bytes") > 0))
        .groupBy("topic", "partition")
        .agg(F.count_if("starved").alias("starved_minutes"), F.sum("empty_fetches").alias("empty_fetches"),
             F.sum("fetch_bytes").alias("fetch_bytes"), F.count_if(F.col("fetches") > 0).alias("minutes_fetched"))
        .filter(F.col("starved_minutes") > 0)
        .orderBy(F.col("starved_minutes").desc(), "topic", "partition")
        .limit(table_rows).collect()
    )
    if starved:
        s.tables.append(Table(
            "Starving partitions", ["topic", "partition", "starved minutes", "minutes fetched", "empty fetches",
                                    "fetched bytes"],
            [(r["topic"], str(r["partition"]), r["starved_minutes"], r["minutes_fetched"], r["empty_fetches"],
              r["fetch_bytes"]) for r in starved], text_columns=2))
    else:
        s.paragraphs.append("No partition starved: every fetched partition returned bytes in each minute in which "
                            "its topic did.")
    return s


def throttle_section(tables: dict[str, DataFrame]) -> Section:
    s = Section("minute-throttle", "Per minute: throttle target vs achieved")
    df = tables.get("throttle_minute")
    rows = (in_order(df.groupBy(F.unix_seconds("minute").alias("t"))
                     .agg(F.sum("target_bps").alias("target"), F.sum("throttled_bytes").alias("v")), "t").collect()
            if df is not None else [])
    if not rows:
        s.no_data = "No throttled fetches (the access log's `throttle_target_bps`)."
        return s
    s.paragraphs.append("Throttled record bytes per second (achieved) against the throttle in force (target), per "
                        "minute, summed over the Sluice processes.")
    times = [_utc(int(r["t"])) for r in rows]
    s.charts.append(Chart("Throttle per minute", draw(charts.time_series,
        "Throttle target vs achieved rate, per minute", times,
        {"target": [float(r["target"]) for r in rows], "achieved": [float(r["v"]) / MINUTE_S for r in rows]},
        ylabel="bytes/s")))
    return s


def minute_sections(tables: dict[str, DataFrame], top_n: int = 8, table_rows: int = 20) -> list[Section]:
    return [clients_section(tables, top_n, table_rows), topics_section(tables, top_n, table_rows),
            throttle_section(tables)]


def live_report(spark: SparkSession, live_dir: str, out: str | Path, *, top_n: int = 8,
                table_rows: int = 20) -> dict[str, Any]:
    """``OUT/report.html`` (+ ``summary.json``) from the newest committed tables of ``sluice stream``."""
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    current = current_tables(spark, live_dir)
    lines = {r["class"]: int(r["lines"]) for r in current.tables["lines"].collect()} if current.tables else {}
    sections = minute_sections(current.tables, top_n, table_rows)
    inp = Section("input", "Input")
    total = sum(lines.values())
    inp.paragraphs.append(
        f"{total:,} lines read from the topic so far (version {current.version}); malformed lines are counted "
        "and skipped." if current.version is not None else "The stream has not committed a micro-batch yet.")
    inp.tables.append(Table("Lines by class", ["class", "lines"], [(c, lines.get(c, 0)) for c in CLASSES]))
    tables = Section("tables", "Parquet tables")
    tables.tables.append(Table("Current tables", ["table", "path", "contents"],
                               [(n, current.paths[n], MINUTE_TABLES[n].description) for n in current.paths],
                               text_columns=3))
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    meta = f"Generated {generated} from the live tables in {live_dir}. Sluice access-log schema 1."
    report = out_dir / "report.html"
    report.write_text(render("Sluice traffic report (live)", meta, [inp, *sections, tables]), encoding="utf-8")
    summary = {"report": str(report), "version": current.version, "lines": lines, "tables": current.paths}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary
