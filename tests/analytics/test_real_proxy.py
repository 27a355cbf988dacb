"""The job over the access log of a real Sluice run: kafka-python clients (an admin, a producer and a consumer
group member, each with its own client_id) through an in-process Sluice in front of the rig's real Kafka broker,
with every policy applying to the consumer's fetches (a size budget, a throttle, fetch sessions in terminate
mode), so the log carries every optional field. The aggregates must equal what plain Python computes from the
same JSON lines."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from proxy.analytics.job import JobResult, run_job
from proxy.analytics.source import read_access_logs
from rig.kafka import KafkaBroker
from rig.kafka_python_group import wait_partitions_known
from rig.proxy_thread import ProxyThread
from tests.analytics.conftest import local_path, table
from tests.analytics.oracle import BYTES, Oracle

pytestmark = pytest.mark.broker

ADMIN = "analytics-admin"
PRODUCER = "analytics-producer"
CONSUMER = "analytics-consumer"
RECORDS = 300
VALUE = b"v" * 1024
THROTTLE_BPS = 500_000_000


@dataclass
class Run:
    result: JobResult
    oracle: Oracle
    path: Path  # the access log


def traffic(bootstrap: str, topic: str) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id=ADMIN)
    try:
        admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])
    finally:
        admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap, client_id=PRODUCER, acks="all", linger_ms=5)
    try:
        for i in range(RECORDS):
            producer.send(topic, key=str(i).encode(), value=VALUE)
        producer.flush(timeout=60)
    finally:
        producer.close(timeout=10)
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, client_id=CONSUMER, group_id=f"g-{topic}",
                             auto_offset_reset="earliest", enable_auto_commit=False)
    try:
        wait_partitions_known(consumer, topic, 2)
        got = 0
        deadline = time.monotonic() + 60
        while got < RECORDS and time.monotonic() < deadline:
            got += sum(len(batch) for batch in consumer.poll(timeout_ms=500).values())
        consumer.commit()
    finally:
        consumer.close()
    assert got == RECORDS


@pytest.fixture(scope="module")
def run(spark: SparkSession, kafka_broker: KafkaBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    base = tmp_path_factory.mktemp("real-proxy")
    path = base / "access.jsonl"
    topic = f"analytics-{uuid.uuid4().hex[:8]}"
    # A budget far above any response makes Sluice decode Fetch responses (without trimming anything), so the
    # access log carries per-partition bytes; a throttle far above the traffic writes the throttle fields
    # without delaying anything; terminate mode writes the session fields (kafka-python's own session is served
    # by Sluice, which runs its own upstream).
    with ProxyThread(kafka_broker.bootstrap, **{
            "logging.access_log": str(path),
            "size_limit.budgets": [{"client_id": CONSUMER, "fetch_max_bytes": 64 << 20}],
            "throttle.leader_rate_bytes": THROTTLE_BPS,
            "throttle.topics": [{"topic": topic, "replicas": "*"}],
            "throttle.consumers": [{"client_id": CONSUMER}],
            "sessions.mode": "terminate"}) as proxy:
        traffic(proxy.bootstrap, topic)
    # leaving the block stopped the proxy and closed its access log: every line is written and flushed
    result = run_job(spark, [str(path)], base / "out")
    yield Run(result, Oracle.read([path]), path)


def sums(row: object) -> tuple[int, ...]:
    return (row["requests"], *[row[b] for b in BYTES])  # type: ignore[index]


def test_every_line_of_a_real_run_is_valid(run: Run) -> None:
    c = run.result.counts
    assert c.lines == c.valid == len(run.oracle.rows) > 0
    assert (c.malformed, c.incomplete, c.other_schema, c.other_event) == (0, 0, 0, 0)
    assert c.files == 1


def test_latencies_are_measured_in_microseconds(spark: SparkSession, run: Run) -> None:
    """latency_ms comes from a high-resolution clock: uvloop's loop.time() counts whole milliseconds, with which
    nearly every line of a local run read 0.000 (and every one ended in .000). The values keep their microseconds
    through the analytics' schema."""
    written = re.findall(r'"latency_ms":([^,]*),', run.path.read_text())
    assert len(written) == len(run.oracle.rows) > 0
    assert all(re.fullmatch(r"[0-9]+\.[0-9]{3}", w) for w in written), written
    whole = [w for w in written if w.endswith(".000")]
    assert len(whole) <= len(written) // 10, f"{len(whole)} of {len(written)} latencies in whole ms: {written}"
    for api in ("ApiVersions", "Metadata", "Produce", "Fetch"):
        assert any(r["latency_ms"] % 1 for r in run.oracle.rows if r["api"] == api), api
    logs = read_access_logs(spark, [str(run.path)])
    try:
        assert logs.counts.lines == logs.counts.valid == len(written)
        parsed = sorted(r["latency_ms"] for r in logs.events.select("latency_ms").collect())
    finally:
        logs.release()
    assert parsed == sorted(float(w) for w in written)


def test_bytes_and_requests_per_client_id(spark: SparkSession, run: Run) -> None:
    got = {r["client_id"]: sums(r) for r in table(spark, run.result.tables["by_client"]).collect()}
    assert got == run.oracle.by_client()
    assert {ADMIN, PRODUCER, CONSUMER} <= set(got)
    # The producer sent every record's value through Sluice; the consumer received every one back.
    assert got[PRODUCER][1] > RECORDS * len(VALUE)
    assert got[CONSUMER][4] > RECORDS * len(VALUE)


def test_requests_per_api(spark: SparkSession, run: Run) -> None:
    got = {r["api"]: sums(r) for r in table(spark, run.result.tables["by_api"]).collect()}
    assert got == run.oracle.by_api()
    assert {"ApiVersions", "Metadata", "CreateTopics", "Produce", "Fetch", "FindCoordinator", "JoinGroup",
            "SyncGroup", "OffsetCommit"} <= set(got)


def test_over_time_connections_errors_and_latency(spark: SparkSession, run: Run) -> None:
    bucket_s = run.result.bucket_s
    traffic_rows = table(spark, run.result.tables["traffic_over_time"]).withColumn("t", F.unix_seconds("bucket"))
    assert {(r["t"], r["client_id"], r["api"]): sums(r) for r in traffic_rows.collect()} == run.oracle.traffic(
        bucket_s)
    conns = {(local_path(r["source"]), r["conn_id"]): sums(r)
             for r in table(spark, run.result.tables["by_connection"]).collect()}
    assert conns == run.oracle.by_connection()
    assert len(conns) >= 3  # at least one connection per client
    listeners = {r["listener"]: sums(r) for r in table(spark, run.result.tables["by_listener"]).collect()}
    assert listeners == run.oracle.by_listener()
    upstreams = {r["upstream"]: sums(r) for r in table(spark, run.result.tables["by_upstream"]).collect()}
    assert upstreams == run.oracle.by_upstream()
    errors = {(r["api"], r["error_code"]): r["responses"]
              for r in table(spark, run.result.tables["error_codes"]).collect()}
    assert errors == run.oracle.error_codes()
    latency = {r["api"]: (r["measured"], r["p50_ms"], r["p95_ms"], r["p99_ms"], r["max_ms"], r["mean_ms"])
               for r in table(spark, run.result.tables["latency_by_api"]).collect()}
    assert latency == run.oracle.latency_by_api()


def test_bytes_per_partition(spark: SparkSession, run: Run) -> None:
    parts = table(spark, run.result.tables["partition_bytes"]).collect()
    got = {(r["topic"], r["partition"]): (r["fetch_bytes"], r["fetches"], r["empty_fetches"], r["produce_bytes"],
                                          r["produces"]) for r in parts}
    assert got == run.oracle.partitions()
    # both partitions of the topic delivered records, and together at least every value consumed
    topic_parts = {k: v for k, v in got.items() if k[0].startswith("analytics-")}
    assert len(topic_parts) == 2 and all(v[0] > 0 for v in topic_parts.values())
    assert sum(v[0] for v in topic_parts.values()) >= RECORDS * len(VALUE)


def test_throttle_and_session_fields_of_a_real_run(spark: SparkSession, run: Run) -> None:
    bucket_s = run.result.bucket_s
    throttle = {(r["t"], local_path(r["source"])): (r["target_bps"], r["throttled_bytes"])
                for r in table(spark, run.result.tables["throttle_over_time"])
                .withColumn("t", F.unix_seconds("bucket")).collect()}
    assert throttle == run.oracle.throttle(bucket_s)
    assert {v[0] for v in throttle.values()} == {THROTTLE_BPS}
    assert sum(v[1] for v in throttle.values()) >= RECORDS * len(VALUE)  # every value counted against it
    client, upstream = run.oracle.sessions()
    saved = table(spark, run.result.tables["session_savings"]).agg(
        F.sum("client_bytes").alias("c"), F.sum("upstream_bytes").alias("u")).collect()
    assert (saved[0]["c"], saved[0]["u"]) == (client, upstream) and client >= RECORDS * len(VALUE)
    assert upstream > 0


def test_report_has_every_section(run: Run) -> None:
    page = run.result.report.read_text()
    # the log carries every optional field: no section lacks data
    assert "No data in these logs" not in page
    assert "saved on the upstream link" in page
    assert page.count('src="data:image/png;base64,') >= 11
    assert CONSUMER in page and PRODUCER in page
    assert all(name in run.result.tables for name in ("partition_bytes", "throttle_over_time", "session_savings"))
    assert Path(run.result.tables["by_client"]).is_dir()
