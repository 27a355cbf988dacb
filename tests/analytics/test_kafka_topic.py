"""The analytics job over the access-log topic ([logging.access_log_kafka]) on a real broker: generated sidecar logs
produced as the sink does (a key per Sluice process, the event's time as the record's timestamp) plus the events of a
real Sluice run with its Kafka sink on.

- batch over the whole topic: every table equals what plain Python computes from the records read back;
- batch over a time range (Kafka's startingTimestamp/endingTimestamp): exactly the records in it;
- Structured Streaming (``sluice stream``): run in small micro-batches over the generated events, then started again
  from its checkpoint after the real Sluice's events arrived - its per-minute tables equal the batch job's over the
  same events; a replayed micro-batch changes nothing; the live report renders them. The stream also lands every
  record in the access-log table, once, and the report over that table equals the report over the topic.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from proxy.analytics import landed, live
from proxy.analytics.job import JobResult, run_job
from proxy.analytics.landed import LandedTable
from proxy.analytics.minutes import live_report
from proxy.analytics.source import KafkaTopic, classify, parse_kafka_rows
from rig.kafka import KafkaBroker
from tests.analytics.conftest import sorted_rows
from tests.analytics.kafka_data import (
    REAL_CONSUMER,
    REAL_KEY,
    Record,
    create_log_topic,
    generated_records,
    oracle_of,
    produce,
    read_topic,
    real_sluice_to_topic,
    rows_of,
)
from tests.analytics.oracle import epoch_us

pytestmark = pytest.mark.broker

MALFORMED = 8


@dataclass
class Topic:
    source: KafkaTopic
    records: list[Record]  # everything in the topic, read back
    generated: list[Record]
    live_dir: Path
    batch: JobResult


@pytest.fixture(scope="module")
def topic(spark: SparkSession, kafka_broker: KafkaBroker, tmp_path_factory: pytest.TempPathFactory) -> Topic:
    base = tmp_path_factory.mktemp("kafka-topic")
    name = f"access-log-{uuid.uuid4().hex[:8]}"
    create_log_topic(kafka_broker.bootstrap, name)
    source = KafkaTopic(kafka_broker.bootstrap, name)
    generated = generated_records(base / "gen", 2_000, files=2, malformed=MALFORMED, seed=5)
    produce(kafka_broker.bootstrap, name, generated)
    live_dir = base / "live"
    # The stream in small micro-batches: the two processes' partitions are read in different batches, so minutes
    # are updated by several batches (as late events do).
    live.run_stream(spark, source, str(live_dir), once=True, max_records_per_batch=700)
    first = live.current_tables(spark, str(live_dir)).version
    assert first is not None and first >= 2
    # More events, from a real Sluice; the stream picks up where its checkpoint says.
    real_sluice_to_topic(kafka_broker.bootstrap, kafka_broker.bootstrap, name)
    live.run_stream(spark, source, str(live_dir), once=True)
    second = live.current_tables(spark, str(live_dir)).version
    assert second is not None and second > first
    batch = run_job(spark, source, base / "batch")
    return Topic(source, read_topic(kafka_broker.bootstrap, name), generated, live_dir, batch)


def sums(row: object) -> tuple[int, ...]:
    return tuple(row[c] for c in ("requests", "bytes_client_to_proxy", "bytes_proxy_to_upstream",  # type: ignore[index]
                                  "bytes_upstream_to_proxy", "bytes_proxy_to_client"))


def test_batch_over_the_topic_equals_plain_python(spark: SparkSession, topic: Topic) -> None:
    oracle = oracle_of(topic.records)
    c = topic.batch.counts
    assert (c.lines, c.valid, c.malformed) == (len(topic.records), len(oracle.rows), MALFORMED)
    assert c.files == 3  # the Sluice processes: two generated sidecars and the real one, by message key
    tables = topic.batch.tables
    assert {r["client_id"]: sums(r) for r in spark.read.parquet(tables["by_client"]).collect()} == oracle.by_client()
    assert {r["api"]: sums(r) for r in spark.read.parquet(tables["by_api"]).collect()} == oracle.by_api()
    conns = {(r["source"], r["conn_id"]): sums(r) for r in spark.read.parquet(tables["by_connection"]).collect()}
    assert conns == oracle.by_connection()
    assert any(source == REAL_KEY for source, _ in conns)
    parts = {(r["topic"], r["partition"]): (r["fetch_bytes"], r["fetches"], r["empty_fetches"], r["produce_bytes"],
                                            r["produces"])
             for r in spark.read.parquet(tables["partition_bytes"]).collect()}
    assert parts == oracle.partitions()
    assert REAL_CONSUMER in {r["client_id"] for r in spark.read.parquet(tables["by_client"]).collect()}


def test_batch_over_a_time_range_reads_exactly_the_records_in_it(spark: SparkSession, topic: Topic) -> None:
    t0 = min(r.timestamp_ms for r in topic.generated)
    start = datetime.fromtimestamp(t0 / 1000, UTC) + timedelta(seconds=120)
    end = start + timedelta(seconds=180)
    inside = [r for r in topic.records if start.timestamp() * 1000 <= r.timestamp_ms < end.timestamp() * 1000]
    oracle = oracle_of(inside)
    assert 0 < len(inside) < len(topic.generated)
    ranged = KafkaTopic(topic.source.bootstrap_servers, topic.source.topic, start, end)
    result = run_job(spark, ranged, topic.live_dir.parent / "ranged")
    assert (result.counts.lines, result.counts.valid) == (len(inside), len(oracle.rows))
    got = {r["client_id"]: sums(r) for r in spark.read.parquet(result.tables["by_client"]).collect()}
    assert got == oracle.by_client()
    assert epoch_us(min(r["ts"] for r in oracle.rows)) >= start.timestamp() * 1e6 - 1000  # within the ms of the range


def test_the_streams_tables_equal_the_batch_jobs(spark: SparkSession, topic: Topic) -> None:
    current = live.current_tables(spark, str(topic.live_dir))
    for name, spec in live.MINUTE_TABLES.items():
        streamed = rows_of(spark, current.paths[name], spec.columns)
        batched = rows_of(spark, topic.batch.tables[name], spec.columns)
        assert streamed == batched, name
        assert streamed, name  # every table has rows: the events carry every optional field
    lines = {r["class"]: r["lines"]
             for r in spark.read.parquet(current.paths["lines"]).select("class", "lines").collect()}
    assert lines == {"valid": len(oracle_of(topic.records).rows), "malformed": MALFORMED}
    # bytes per client per minute: the real consumer's fetched bytes are all there
    consumer = spark.read.parquet(current.paths["client_minute"]).filter(F.col("client_id") == REAL_CONSUMER)
    assert consumer.agg(F.sum("bytes_proxy_to_client")).collect()[0][0] >= 60 * 512


def test_the_stream_lands_every_record_once_and_the_report_over_it_equals_the_topics(
        spark: SparkSession, topic: Topic, tmp_path: Path) -> None:
    # A stream of its own (the fixture's keeps only the per-minute tables: one test's time limit, one stream), in
    # two micro-batches or more.
    out, table = str(tmp_path / "live"), str(tmp_path / "access_log")
    live.run_stream(spark, topic.source, out, once=True, max_records_per_batch=len(topic.records) // 2 + 1,
                    table=table)
    version = live.current_tables(spark, out).version
    assert version is not None and version >= 1
    assert spark.read.format("delta").load(table).count() == len(topic.records)
    # A crash between landing a batch and committing the per-minute tables: Spark replays the batch, it lands again,
    # and the table skips it (the same stream, the same batch id).
    replay = spark.read.format("kafka").options(**topic.source.reader_options()).load()
    landed.land(landed.landed_rows(classify(parse_kafka_rows(replay))), table, writer_id=live.writer_id_of(out),
                batch_id=version)
    assert spark.read.format("delta").load(table).count() == len(topic.records)
    said: list[str] = []
    from_table = run_job(spark, LandedTable(table), tmp_path / "report", progress=said.append)
    assert "reading the landed rollups" in said  # landed per micro-batch beside the lines, merged by the report
    assert from_table.counts == topic.batch.counts
    assert from_table.tables.keys() == topic.batch.tables.keys()
    for name in topic.batch.tables:
        assert sorted_rows(spark, from_table.tables[name]) == sorted_rows(spark, topic.batch.tables[name]), name


def test_a_replayed_micro_batch_is_not_counted_twice(spark: SparkSession, topic: Topic) -> None:
    out = str(topic.live_dir)
    before = live.current_tables(spark, out)
    assert before.version is not None
    spec = live.MINUTE_TABLES["client_minute"]
    rows = rows_of(spark, before.paths["client_minute"], spec.columns)
    # What Spark does after a crash between the tables' commit and its own: the same batch id again.
    replay = spark.read.format("kafka").options(**topic.source.reader_options()).load()
    live.apply_batch(spark, out, None, replay, before.version, lambda _m: None)
    after = live.current_tables(spark, out)
    assert after.version == before.version
    assert rows_of(spark, after.paths["client_minute"], spec.columns) == rows
    # and a stream started again with nothing new leaves the tables as they are
    live.run_stream(spark, topic.source, out, once=True)
    assert rows_of(spark, live.current_tables(spark, out).paths["client_minute"], spec.columns) == rows


def test_the_live_report_shows_the_current_tables(spark: SparkSession, topic: Topic, tmp_path: Path) -> None:
    summary = live_report(spark, str(topic.live_dir), tmp_path)
    page = (tmp_path / "report.html").read_text()
    assert summary["lines"]["malformed"] == MALFORMED
    for title in ("Per minute: bytes by client", "Per minute: bytes by topic, starvation",
                  "Per minute: throttle target vs achieved"):
        assert title in page
    assert "No data" not in page and page.count('src="data:image/png;base64,') == 3
    batch_page = topic.batch.report.read_text()
    assert "Per minute: bytes by client" in batch_page and "client_minute" in batch_page
