"""Access-log topics for the analytics tests: generated sidecar logs produced to a real broker as the sink does (one
key per Sluice process, the event's time as the record's timestamp), a real Sluice run with its Kafka sink on, and
the topic read back with plain Python for the oracle."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, KafkaProducer
from pyspark.sql import SparkSession

from bench.support.gen_logs import generate
from rig.kafka_python_group import wait_partitions_known
from rig.proxy_thread import ProxyThread
from tests.analytics.oracle import Oracle, classify, epoch_us

REAL_KEY = "real-sluice"
REAL_CONSUMER = "topic-consumer"
REAL_PRODUCER = "topic-producer"
REAL_RECORDS = 60
PARTITIONS = 2


@dataclass(frozen=True)
class Record:
    key: str
    value: str
    timestamp_ms: int


def create_log_topic(bootstrap: str, name: str) -> None:
    """Two partitions (two keys land apart, so micro-batches interleave minutes); kept forever: the generated
    events are dated 2025, and time-based retention must not delete them under the test."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, PARTITIONS, 1, config={"retention.ms": "-1"})])
    for future in futures.values():
        future.result(60)


def generated_records(base: Path, rows: int, files: int, malformed: int, seed: int) -> list[Record]:
    """gen_logs' sidecar files as records: key = the file (the process), timestamp = the line's ts (a malformed
    line gets its predecessor's), in time order."""
    result = generate(base, rows, files=files, malformed=malformed, extensions=True, span_s=600, seed=seed)
    records = []
    for path in result.files:
        last_ms = 0
        for line in path.read_text().splitlines():
            _kind, obj = classify(line)
            if obj is not None:
                last_ms = epoch_us(obj["ts"]) // 1000
            records.append(Record(path.stem, line, last_ms))
    # In time order across the processes, as live sidecars produce: Kafka finds a timestamp's offset through each
    # partition's time index, which assumes timestamps rise with offsets.
    return sorted(records, key=lambda r: r.timestamp_ms)


def produce(bootstrap: str, topic: str, records: list[Record]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20,
                         "log_level": 0})
    for r in records:
        while True:
            try:
                producer.produce(topic, r.value.encode(), r.key.encode(), timestamp=r.timestamp_ms)
                break
            except BufferError:
                producer.poll(0.1)  # the local queue is full: let it drain (bounded by delivery)
    assert producer.flush(60) == 0


def read_topic(bootstrap: str, topic: str) -> list[Record]:
    """Every record of the topic, partition by partition (bounded by the end offsets taken first)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"oracle-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False, "log_level": 0})
    out: list[Record] = []
    try:
        for p in range(PARTITIONS):
            _low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            consumer.assign([TopicPartition(topic, p, 0)])
            got = 0
            deadline = time.monotonic() + 60
            while got < high:
                assert time.monotonic() < deadline, f"partition {p}: {got} of {high} records read"
                for msg in consumer.consume(1000, timeout=0.5):
                    key, value = msg.key(), msg.value()
                    if msg.error() is None:
                        assert key is not None and value is not None, msg
                        out.append(Record(key.decode(), value.decode(), msg.timestamp()[1]))
                        got += 1
    finally:
        consumer.close()
    return out


def oracle_of(records: list[Record]) -> Oracle:
    o = Oracle()
    for r in records:
        if not r.value.strip():
            continue
        kind, obj = classify(r.value)
        o.classes[kind] += 1
        if obj is not None:
            obj["_source"] = r.key
            o.rows.append(obj)
    return o


def real_sluice_to_topic(upstream: str, log_bootstrap: str, log_topic: str) -> None:
    """kafka-python clients through a Sluice whose access log goes only to the topic; a size budget and a throttle
    far above the traffic make the consumer's fetch events carry `partitions` and the throttle fields."""
    data_topic = f"topic-data-{uuid.uuid4().hex[:8]}"
    with ProxyThread(upstream, **{
            "logging.access_log_kafka.enabled": True,
            "logging.access_log_kafka.bootstrap_servers": [log_bootstrap],
            "logging.access_log_kafka.topic": log_topic,
            "logging.access_log_kafka.key": REAL_KEY,
            "size_limit.budgets": [{"client_id": REAL_CONSUMER, "fetch_max_bytes": 64 << 20}],
            "throttle.leader_rate_bytes": 500_000_000,
            "throttle.topics": [{"topic": data_topic, "replicas": "*"}],
            "throttle.consumers": [{"client_id": REAL_CONSUMER}]}) as sluice:
        producer = KafkaProducer(bootstrap_servers=sluice.bootstrap, client_id=REAL_PRODUCER, linger_ms=5)
        try:
            for i in range(REAL_RECORDS):
                producer.send(data_topic, key=str(i).encode(), value=b"v" * 512)
            producer.flush(60)
        finally:
            producer.close(timeout=10)
        consumer = KafkaConsumer(data_topic, bootstrap_servers=sluice.bootstrap, client_id=REAL_CONSUMER,
                                 group_id=f"g-{data_topic}", auto_offset_reset="earliest", enable_auto_commit=False)
        try:
            wait_partitions_known(consumer, data_topic, 1)  # auto-created by the producer: the broker's num.partitions
            got = 0
            deadline = time.monotonic() + 60
            while got < REAL_RECORDS and time.monotonic() < deadline:
                got += sum(len(b) for b in consumer.poll(timeout_ms=500).values())
        finally:
            consumer.close()
        assert got == REAL_RECORDS
    # leaving the block stopped Sluice: its sink flushed every event (bounded by flush_timeout_s)
    assert sluice.total("sluice_access_log_dropped_total") == 0


def rows_of(spark: SparkSession, path: str, columns: tuple[str, ...]) -> list[tuple[object, ...]]:
    """A Parquet table's rows as sorted tuples (None sorts first), for equality across runs."""
    got = [tuple(r) for r in spark.read.parquet(path).select(*columns).collect()]
    return sorted(got, key=lambda t: json.dumps(t, default=str))


__all__ = ["Record", "create_log_topic", "generated_records", "oracle_of", "produce",
           "read_topic", "real_sluice_to_topic", "rows_of"]
