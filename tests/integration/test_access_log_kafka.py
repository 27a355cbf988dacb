"""The access log as a Kafka stream ([logging.access_log_kafka], proxy/accesslog_kafka.py), end to end: kafka-python
clients through an in-process Sluice in front of the rig's broker, the access log written to a file *and* produced
to a topic on a second, separate broker - which is then killed for a while and restarted.

- the events arrive in the topic: the same JSON lines as the file, keyed by the Sluice process, each a valid
  schema-1 request (the analytics' rules), and they describe the requests the clients made;
- while the sink's broker is down, client traffic is unaffected (every record once, in order), the small buffer
  fills and the events beyond it are dropped and counted (``sluice_access_log_dropped_total``);
- after the restart, events flow again; in the end the topic holds exactly the file's lines minus the dropped
  ones, in order, none twice.

No sleeps: every wait is a bounded poll of a real condition (a metric, a topic's contents).
"""

from __future__ import annotations

import asyncio
import io
import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from kafka import KafkaConsumer, KafkaProducer

from proxy.accesslog import AccessLog, KeptListing
from proxy.accesslog_kafka import KafkaAccessLogSink
from proxy.app import load_settings
from proxy.metrics import Metrics
from rig.kafka import KafkaBroker
from rig.kafka_python_group import wait_partitions_known
from rig.proxy_thread import ProxyThread
from tests.analytics.oracle import classify
from tests.support.topics import create_topic

pytestmark = pytest.mark.broker

BUFFER = 100
KEY = "sluice-under-test"
VALUE = b"x" * 200


@pytest.fixture(scope="module")
def sink_broker() -> Iterator[KafkaBroker]:
    """The cluster the access log goes to: not the one the clients use, so it can go away alone."""
    with KafkaBroker() as broker:
        yield broker


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)  # poll interval of a real condition, bounded by the deadline


class TopicReader:
    """Reads the access-log topic (one partition) from the start, accumulating (key, value) in order."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4().hex[:6]}",
                                  "enable.auto.commit": False, "log_level": 0})
        self.consumer.assign([TopicPartition(topic, 0, 0)])
        self.messages: list[tuple[str, str]] = []

    def read(self) -> list[dict[str, Any]]:
        for msg in self.consumer.consume(500, timeout=0.2):
            key, value = msg.key(), msg.value()
            if msg.error() is None and key is not None and value is not None:
                self.messages.append((key.decode(), value.decode()))
        return [json.loads(v) for _, v in self.messages]

    def close(self) -> None:
        self.consumer.close()


def produce_one_by_one(bootstrap: str, topic: str, client_id: str, values: list[bytes],
                       until: Callable[[], bool] = lambda: False) -> int:
    """One Produce request per record (flush after each): each is an access-log event. Stops early once ``until``
    holds after at least one record; returns how many were sent."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, client_id=client_id, acks="all", linger_ms=0)
    sent = 0
    try:
        for value in values:
            producer.send(topic, value=value).get(timeout=30)
            sent += 1
            if until():
                break
    finally:
        producer.close(timeout=10)
    return sent


def consume_all(bootstrap: str, topic: str, client_id: str, expected: int) -> list[bytes]:
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, client_id=client_id, group_id=f"g-{client_id}",
                             auto_offset_reset="earliest", enable_auto_commit=False)
    got: list[bytes] = []
    try:
        wait_partitions_known(consumer, topic, 1)  # create_topic's default
        deadline = time.monotonic() + 60
        while len(got) < expected and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                got.extend(r.value for r in batch)
    finally:
        consumer.close()
    return got


def test_access_log_events_reach_the_topic_survive_an_outage_of_its_broker_and_never_slow_clients(
        kafka_broker: KafkaBroker, sink_broker: KafkaBroker, tmp_path: Path) -> None:
    suffix = uuid.uuid4().hex[:8]
    log_topic, data_topic = f"access-log-{suffix}", f"data-{suffix}"
    create_topic(sink_broker.bootstrap, log_topic)
    path = tmp_path / "access.jsonl"
    reader = TopicReader(sink_broker.bootstrap, log_topic)
    try:
        with ProxyThread(kafka_broker.bootstrap, **{
                "logging.access_log": str(path),
                "logging.access_log_kafka.enabled": True,
                "logging.access_log_kafka.bootstrap_servers": [sink_broker.bootstrap],
                "logging.access_log_kafka.topic": log_topic,
                "logging.access_log_kafka.key": KEY,
                "logging.access_log_kafka.buffer_events": BUFFER,
                "logging.access_log_kafka.linger_ms": 5}) as sluice:

            def dropped(reason: str | None = None) -> float:
                labels = {"reason": reason} if reason else {}
                return sluice.total("sluice_access_log_dropped_total", **labels)

            def buffered() -> float:
                return sluice.total("sluice_access_log_buffered_events")

            # 1. Traffic through Sluice; its events arrive in the topic. (The first events wait in the buffer
            # until the sink's producer is connected: let the admin's few drain before the traffic starts.)
            create_topic(sluice.bootstrap, data_topic)
            wait_for(lambda: buffered() == 0, "the sink connected")
            first = [b"a%03d" % i + VALUE for i in range(30)]
            assert produce_one_by_one(sluice.bootstrap, data_topic, "before-producer", first) == len(first)
            assert consume_all(sluice.bootstrap, data_topic, "before-consumer", len(first)) == first
            wait_for(lambda: buffered() == 0, "the events acknowledged by the sink's broker")
            events: list[dict[str, Any]] = []

            def has(client_id: str, api: str) -> bool:
                events[:] = reader.read()
                return any(e["client_id"] == client_id and e["api"] == api for e in events)

            wait_for(lambda: has("before-consumer", "Fetch"), "the consumer's fetches in the topic")
            assert dropped() == 0
            assert all(classify(json.dumps(e))[0] == "valid" for e in events)
            produces = [e for e in events if e["client_id"] == "before-producer" and e["api"] == "Produce"]
            assert len(produces) == len(first)  # one Produce request per record, each logged once
            assert all(e["bytes_client_to_proxy"] > len(VALUE) for e in produces)
            fetched = sum(e["bytes_proxy_to_client"] for e in events
                          if e["client_id"] == "before-consumer" and e["api"] == "Fetch")
            assert fetched >= len(first) * len(VALUE)
            assert {"ApiVersions", "Metadata", "CreateTopics", "FindCoordinator", "JoinGroup"} <= {
                e["api"] for e in events}

            # 2. The sink's broker dies. Clients notice nothing; the buffer fills, later events are dropped.
            sink_broker.kill()
            during = [b"b%04d" % i + VALUE for i in range(BUFFER * 4)]
            sent = produce_one_by_one(sluice.bootstrap, data_topic, "during-producer", during,
                                      until=lambda: dropped("buffer_full") >= 5)
            assert dropped("buffer_full") >= 5 and sent < len(during)
            # every record once, in order, before and during the outage
            assert consume_all(sluice.bootstrap, data_topic, "during-consumer", len(first) + sent) == [
                *first, *during[:sent]]

            # 3. The broker comes back: the buffered events are delivered and new ones flow again.
            sink_broker.start()
            wait_for(lambda: buffered() == 0, "the buffered events delivered")
            full = dropped()
            after = [b"c%03d" % i + VALUE for i in range(5)]
            assert produce_one_by_one(sluice.bootstrap, data_topic, "after-producer", after) == len(after)
            wait_for(lambda: has("after-producer", "Produce"), "events produced after the restart")
            assert dropped() == full
        # Sluice stopped: the file is closed, the sink flushed.
        dropped_total = dropped()
        assert dropped_total == dropped("buffer_full") > 0
        lines = path.read_text().splitlines()
        wait_for(lambda: len(reader.read()) >= len(lines) - dropped_total, "every event delivered read back")
        events = reader.read()
    finally:
        reader.close()

    assert {k for k, _ in reader.messages} == {KEY}
    topic_lines = [v for _, v in reader.messages]
    assert len(set(topic_lines)) == len(topic_lines)  # none twice (an idempotent producer: retries do not repeat)
    # the same lines as the file, in the same order, less exactly the dropped ones
    assert is_subsequence(topic_lines, lines)
    assert len(lines) - len(topic_lines) == dropped_total
    assert sum(1 for e in events if e["client_id"] == "during-producer" and e["api"] == "Produce") < sent
    assert all(classify(line)[0] == "valid" for line in topic_lines)


def test_a_large_consumers_fetch_lines_reach_the_topic_whole(kafka_broker: KafkaBroker) -> None:
    """A session-less consumer's Fetch lines list every partition it fetches, ~75 bytes each with a topic name of
    production length: at 40,000 partitions a line is ~3 MB, past librdkafka's default message.max.bytes
    (1,000,000), which refused it before it was buffered (dropped as delivery_failed). Every line now reaches the
    topic whole and in order among small ones, compressed under the topic's default max.message.bytes."""
    topic = f"access-log-large-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_broker.bootstrap, topic)
    metrics = Metrics()
    settings = load_settings(None, env={}).with_overrides({
        "logging.access_log_kafka.enabled": True, "logging.access_log_kafka.topic": topic,
        "logging.access_log_kafka.key": KEY, "logging.access_log_kafka.linger_ms": 5}).logging.access_log_kafka
    sink = KafkaAccessLogSink(settings, [kafka_broker.bootstrap], metrics)
    lines = io.StringIO()
    log = AccessLog(lines)
    log.attach_sink(sink)
    name = "com.example.payments.settlement-events.v2"
    keys = [(name, i) for i in range(40_000)]
    for corr in range(6):
        listing = KeptListing(keys, {name: name}, {(name, corr * 7): 100 + corr}) if corr % 2 == 0 else None
        log.record(1, "large-consumer", "Fetch", 1, 12, corr, 100, 100, 5_000, 5_000, 1.0, [], "bootstrap",
                   "broker:9092", True, listing)
    written = lines.getvalue().splitlines()
    assert max(len(line) for line in written) > 3_000_000
    asyncio.run(sink.close(30))
    assert metrics.total("sluice_access_log_dropped_total") == 0
    reader = TopicReader(kafka_broker.bootstrap, topic)
    try:
        wait_for(lambda: len(reader.read()) >= len(written), "every line in the topic")
    finally:
        reader.close()
    assert [value for _, value in reader.messages] == written


def is_subsequence(sub: list[str], seq: list[str]) -> bool:
    it = iter(seq)
    return all(any(s == x for x in it) for s in sub)
