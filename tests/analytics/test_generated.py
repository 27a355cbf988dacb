"""The job over generated logs with everything a fleet's logs can hold: several files, a directory tree, gzip, a
gzip file cut short, malformed lines of every kind, lines of another schema version or event, unknown fields, and
the fields later access-log versions add (per-partition bytes, throttle, session bytes). Every table is checked
against the oracle (plain-Python json over the same files)."""

from __future__ import annotations

import base64
import io
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from PIL import Image
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bench.support.gen_logs import generate
from proxy.analytics.job import JobOptions, JobResult, run_job
from tests.analytics.conftest import local_path, table
from tests.analytics.oracle import BYTES, Oracle, jain

ADAPTIVE = "spark.sql.adaptive.enabled"
MALFORMED_PLAIN = 11
MALFORMED_GZ = 6

VALID = {
    "schema": 1, "event": "request", "ts": "2025-01-31T12:03:00.000001Z", "conn_id": 900, "client_id": None,
    "api": "Metadata", "api_key": 3, "version": 12, "correlation_id": 1, "listener": "127.0.0.1:19092",
    "upstream": "kafka-1:9092", "bytes_client_to_proxy": 50, "bytes_proxy_to_upstream": 50,
    "bytes_upstream_to_proxy": 700, "bytes_proxy_to_client": 702, "latency_ms": None, "error_codes": [3, 5],
    "decoded": True,
}
HAND_MADE = [
    json.dumps({**VALID, "future_field": {"nested": [1, 2]}, "another": "ignored"}),  # valid: unknown fields ignored
    json.dumps({**VALID, "conn_id": 901, "ts": "2025-01-31T12:04:00Z"}),  # valid: no fraction digits
    "",  # blank: not a line at all
    "{}",  # incomplete
    json.dumps({k: v for k, v in VALID.items() if k != "upstream"}),  # incomplete: a schema-1 field missing
    json.dumps({**VALID, "schema": 2}),  # other schema
    json.dumps({**VALID, "event": "debug"}),  # other event
    json.dumps({**VALID, "correlation_id": "x"}),  # malformed: wrong type in a field no aggregate reads
    json.dumps({**VALID, "ts": "yesterday"}),  # malformed: not a timestamp
    "[1, 2",  # malformed
]


@dataclass
class Run:
    result: JobResult
    oracle: Oracle
    logs: Path
    #: spark.sql.adaptive.enabled as each progress message of the job saw it (job.JOB_CONF)
    adaptive_during: set[str]


@pytest.fixture(scope="module")
def run(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    base = tmp_path_factory.mktemp("generated")
    logs = base / "logs"
    generate(logs / "plain", 20_000, files=2, malformed=MALFORMED_PLAIN, extensions=True, span_s=600, seed=1)
    generate(logs / "gz", 10_000, files=1, compress=True, malformed=MALFORMED_GZ, extensions=True, span_s=600,
             seed=2)
    # A sidecar killed mid-write: its gzip file ends in the middle of a deflate block.
    src = generate(base / "cut-src", 4_000, compress=True, extensions=True, span_s=600, seed=3).files[0]
    (logs / "cut").mkdir()
    data = src.read_bytes()
    (logs / "cut" / "killed.jsonl.gz").write_bytes(data[: len(data) // 2])
    (logs / "hand-made.jsonl").write_text("\n".join(HAND_MADE) + "\n", encoding="utf-8")

    adaptive: set[str] = set()
    result = run_job(spark, [str(logs.absolute())], base / "out", JobOptions(rate_window_s=10),
                     progress=lambda _msg: adaptive.add(str(spark.conf.get(ADAPTIVE))))
    yield Run(result, Oracle.read([logs.absolute()]), logs, adaptive)


def test_the_jobs_settings_hold_while_it_runs_and_the_sessions_come_back(spark: SparkSession, run: Run) -> None:
    """Adaptive execution is off for the job's queries (job.JOB_CONF: it only added Spark jobs over small tables)
    and the session's own value is back afterwards."""
    assert run.adaptive_during == {"false"}
    assert spark.conf.get(ADAPTIVE) == "true"  # what session.py sets on every session


def rows(spark: SparkSession, r: Run, name: str, *columns: Any) -> list[Any]:
    return table(spark, r.result.tables[name]).select(*columns).collect()


def sums(row: Any) -> tuple[int, ...]:
    return (row["requests"], *[row[b] for b in BYTES])


# ------------------------------------------------------------------------------------------------------ input


def test_every_line_is_classified_and_malformed_lines_are_counted(run: Run) -> None:
    c = run.result.counts
    o = run.oracle.classes
    assert c.malformed == o["malformed"] == MALFORMED_PLAIN + MALFORMED_GZ + 3
    assert (c.valid, c.incomplete, c.other_schema, c.other_event) == (
        o["valid"], o["incomplete"], o["other_schema"], o["other_event"])
    assert (c.incomplete, c.other_schema, c.other_event) == (2, 1, 1)
    assert c.lines == sum(o.values())
    assert 30_000 + 2 < c.valid < 34_000 + 2  # the cut file contributes only its complete lines
    assert c.files == 5
    summary = json.loads((run.result.out / "summary.json").read_text())
    assert summary["malformed"] == c.malformed and summary["valid"] == c.valid
    page = run.result.report.read_text()
    assert f"{c.malformed:,} malformed lines" in page
    assert "not JSON" in page and "First 5 malformed line(s)" in page


# ---------------------------------------------------------------------------------------------------- traffic


def test_traffic_over_time_per_client_and_api(spark: SparkSession, run: Run) -> None:
    bucket_s = run.result.bucket_s
    assert bucket_s == 10  # 10 minutes of logs: 5 s buckets would be 121 (a span touches one more), 10 s 61
    got = {
        (r["t"], r["client_id"], r["api"]): sums(r)
        for r in rows(spark, run, "traffic_over_time", F.unix_seconds("bucket").alias("t"), "client_id", "api",
                      "requests", *BYTES)
    }
    assert got == run.oracle.traffic(bucket_s)


def test_bytes_and_requests_per_client_and_api(spark: SparkSession, run: Run) -> None:
    assert {r["client_id"]: sums(r) for r in rows(spark, run, "by_client", "*")} == run.oracle.by_client()
    by_api = rows(spark, run, "by_api", "*")
    assert {r["api"]: sums(r) for r in by_api} == run.oracle.by_api()
    errors = run.oracle.requests_with_errors()
    assert {r["api"]: r["requests_with_errors"] for r in by_api} == {a: errors.get(a, 0) for a in run.oracle.by_api()}
    apis = {r["api"]: r["requests"] / run.result.counts.valid for r in by_api}
    assert apis["Fetch"] > 0.4 and apis["Produce"] > 0.2  # the generator's realistic mix


def test_connections_listeners_upstreams(spark: SparkSession, run: Run) -> None:
    got = {(local_path(r["source"]), r["conn_id"]): sums(r) for r in rows(spark, run, "by_connection", "*")}
    assert got == run.oracle.by_connection()
    assert {r["listener"]: sums(r) for r in rows(spark, run, "by_listener", "*")} == run.oracle.by_listener()
    assert {r["upstream"]: sums(r) for r in rows(spark, run, "by_upstream", "*")} == run.oracle.by_upstream()


def test_latency_percentiles_and_error_codes(spark: SparkSession, run: Run) -> None:
    got_latency = {r["api"]: (r["measured"], r["p50_ms"], r["p95_ms"], r["p99_ms"], r["max_ms"], r["mean_ms"])
                   for r in rows(spark, run, "latency_by_api", "*") if r["measured"]}
    assert got_latency == run.oracle.latency_by_api()
    got = {(r["api"], r["error_code"]): r["responses"] for r in rows(spark, run, "error_codes", "*")}
    assert got == run.oracle.error_codes()
    assert ("Metadata", 3) in got and ("Metadata", 5) in got  # the hand-made lines' codes


def test_inbound_rate_and_throttle_recommendation(spark: SparkSession, run: Run) -> None:
    got = {(r["upstream"], r["t"]): (r["bytes"], r["bps"])
           for r in rows(spark, run, "inbound_rate", "upstream", F.unix_seconds("window").alias("t"), "bytes", "bps")}
    want = run.oracle.inbound(10)
    assert {k: v[0] for k, v in got.items()} == want
    assert all(bps == b / 10 for b, bps in got.values())
    rec = run.result.recommendation
    peak = max(want.values()) / 10
    assert rec.inbound_bps == peak
    assert rec.low_bps == peak and rec.high_bps == pytest.approx(125_000_000 - peak / 3)
    page = run.result.report.read_text()
    assert "Safe throttle range (KIP-73, IN &lt; T &lt; N - IN/R" in page
    assert "Move time (KIP-73): time = bytes to move / (T - IN)" in page


# ------------------------------------------------------------------------------------ fields of later versions


def test_partition_bytes_and_fairness(spark: SparkSession, run: Run) -> None:
    parts = rows(spark, run, "partition_bytes", "*")
    got = {(r["topic"], r["partition"]): (r["fetch_bytes"], r["fetches"], r["empty_fetches"], r["produce_bytes"],
                                          r["produces"]) for r in parts}
    want = run.oracle.partitions()
    assert got == want
    for r in rows(spark, run, "partition_fairness", "*"):
        fetched = [v[0] for (topic, _p), v in want.items() if topic == r["topic"] and v[1] > 0]
        assert r["partitions"] == len(fetched)
        assert r["jain_index"] == pytest.approx(jain(fetched))
        assert 0.3 < r["jain_index"] < 0.95  # the generator skews partitions: fair-ish, not perfectly
    overall = jain([v[0] for v in want.values() if v[1] > 0])
    assert f"J = {overall:.3f}" in run.result.report.read_text()
    per_bucket = rows(spark, run, "fairness_over_time", "jain_index")
    assert len(per_bucket) >= 55 and all(0 < r["jain_index"] <= 1 for r in per_bucket)


def test_throttle_target_vs_achieved_and_session_savings(spark: SparkSession, run: Run) -> None:
    bucket_s = run.result.bucket_s
    got = {(r["t"], local_path(r["source"])): (r["target_bps"], r["throttled_bytes"], r["achieved_bps"])
           for r in rows(spark, run, "throttle_over_time", F.unix_seconds("bucket").alias("t"), "source",
                         "target_bps", "throttled_bytes", "achieved_bps")}
    assert {k: v[:2] for k, v in got.items()} == run.oracle.throttle(bucket_s)
    assert all(achieved == throttled / bucket_s for _t, throttled, achieved in got.values())
    page = run.result.report.read_text()
    held = re.search(r"held \(achieved &lt;= target \+ 5%\) in ([\d,]+) of ([\d,]+) process-buckets", page)
    assert held is not None and 0 < int(held[1].replace(",", "")) < int(held[2].replace(",", ""))

    client, upstream = run.oracle.sessions()
    saved = rows(spark, run, "session_savings", F.sum("client_bytes").alias("c"), F.sum("upstream_bytes").alias("u"))
    assert (saved[0]["c"], saved[0]["u"]) == (client, upstream)
    assert "saved on the upstream link" in page


# ----------------------------------------------------------------------------------------------- the report


def test_report_is_self_contained_with_png_charts(run: Run) -> None:
    page = run.result.report.read_text()
    assert "http://" not in page and "https://" not in page and "<script" not in page
    images = re.findall(r'<img alt="([^"]*)" src="data:image/png;base64,([^"]+)"', page)
    assert len(images) >= 14
    for alt, data in images:
        with Image.open(io.BytesIO(base64.b64decode(data))) as im:
            assert im.format == "PNG" and im.width >= 800 and im.height >= 200, alt
            assert len(im.convert("RGB").getcolors(1 << 16) or range(1 << 16)) > 20, alt  # drawn, not blank
    assert "No data in these logs" not in page


def test_spark_listens_on_loopback_only(spark: SparkSession) -> None:
    """The JVM this session started (a child of this process) accepts connections on 127.0.0.1 only."""
    listening = [
        c.laddr
        for child in psutil.Process().children(recursive=True)
        for c in child.net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    ]
    assert listening, "no Spark JVM listening sockets found"
    assert {addr.ip for addr in listening} <= {"127.0.0.1", "::ffff:127.0.0.1"}, listening


def test_logs_without_a_single_valid_line_still_give_a_report(spark: SparkSession, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "bad.jsonl").write_text("not json\n{}\n" + "\n".join(HAND_MADE[-3:]) + "\n", encoding="utf-8")
    (logs / "empty.jsonl").write_text("", encoding="utf-8")
    result = run_job(spark, [str(logs)], tmp_path / "out")
    c = result.counts
    assert (c.lines, c.valid, c.malformed, c.incomplete) == (5, 0, 4, 1)
    page = result.report.read_text()
    assert "No valid requests in these logs." in page and "No inbound traffic in these logs" in page
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["valid"] == 0
