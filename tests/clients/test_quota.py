"""Client quotas (proxy/policies/quota) through Sluice, on the real broker, with real clients: every record
produced is acknowledged and consumed once, in order; the throttle time reaches the client (librdkafka's
throttle callback, the Java producer's produce-throttle-time-avg, kafka-python's throttle-time metrics, and for
aiokafka, which has no such metric, the access log); a raw client that ignores throttle_time_ms is held all the
same (Sluice does not read its next request before the throttle time it was told has passed)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from confluent_kafka import Consumer, KafkaException, Producer
from kafka import KafkaConsumer, KafkaProducer

from proxy.wire.messages import request_codec
from proxy.wire.model import Message
from proxy.wire.records import Record, encode_batch, new_batch
from rig.java_tools import JavaTools
from rig.proxy_thread import ProxyThread
from rig.raw import RawClient
from tests.support.records import Rec, assert_same_records, make_records, rec_of
from tests.support.topics import create_topic

pytestmark = pytest.mark.broker

RATE = 200_000  # bytes/s, for producers and consumers alike
N, VALUE_SIZE = 600, 1000  # ~600 KB: about three seconds' worth, so each client is throttled
ENTRIES = [
    {"name": "producers", "client_id": "quota-p-*", "produce_rate_bytes": RATE},
    {"name": "consumers", "client_id": "quota-c-*", "fetch_rate_bytes": RATE},
    {"name": "raw", "client_id": "quota-raw", "produce_rate_bytes": 100_000},
]


@pytest.fixture(scope="module")
def access_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("quota") / "access.log"


@pytest.fixture(scope="module")
def sluice(kafka_broker: Any, access_log: Path) -> Iterator[ProxyThread]:
    with ProxyThread(kafka_broker.bootstrap, **{"quota.entries": ENTRIES, "logging.access_log": str(access_log)}) as p:
        yield p


def test_confluent_kafka_is_throttled_and_loses_nothing(sluice: ProxyThread, unique_topic: str) -> None:
    create_topic(sluice.bootstrap, unique_topic, 2)
    records = make_records(N, 2, value_size=VALUE_SIZE, tag="ck")
    throttled: list[float] = []
    producer = Producer({"bootstrap.servers": sluice.bootstrap, "client.id": "quota-p-ck", "acks": "all",
                         "linger.ms": 5, "throttle_cb": lambda ev: throttled.append(ev.throttle_time)})
    errors: list[object] = []
    acked: list[int] = []
    for r in records:
        producer.produce(unique_topic, value=r.value, key=r.key, partition=r.partition, timestamp=r.timestamp_ms,
                         headers=list(r.headers),
                         on_delivery=lambda err, _m: errors.append(err) if err else acked.append(1))
        producer.poll(0)
    assert producer.flush(60) == 0
    assert not errors and len(acked) == N
    assert throttled and max(throttled) > 0  # librdkafka's throttle callback: the time reached the client

    fetch_throttled: list[float] = []
    consumer = Consumer({"bootstrap.servers": sluice.bootstrap, "client.id": "quota-c-ck",
                         "group.id": f"g-{unique_topic}", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "max.partition.fetch.bytes": 100_000,
                         "throttle_cb": lambda ev: fetch_throttled.append(ev.throttle_time)})
    consumer.subscribe([unique_topic])
    got: list[Rec] = []
    deadline = time.monotonic() + 90
    try:
        while (len(got) < N or not fetch_throttled) and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is None:
                continue
            if m.error():
                raise KafkaException(m.error())
            got.append(rec_of(m))
    finally:
        consumer.close()
    assert_same_records(records, got)
    assert fetch_throttled and max(fetch_throttled) > 0
    assert sluice.total("sluice_quota_throttle_seconds_total", entry="producers", api="Produce") > 0
    assert sluice.total("sluice_quota_throttle_seconds_total", entry="consumers", api="Fetch") > 0


def test_kafka_python_is_throttled_and_loses_nothing(sluice: ProxyThread, unique_topic: str) -> None:
    create_topic(sluice.bootstrap, unique_topic, 2)
    records = make_records(N, 2, value_size=VALUE_SIZE, tag="kp")
    producer = KafkaProducer(bootstrap_servers=sluice.bootstrap, client_id="quota-p-kp", acks="all", linger_ms=5)
    try:
        futures = [producer.send(unique_topic, key=r.key, value=r.value, headers=list(r.headers),
                                 partition=r.partition, timestamp_ms=r.timestamp_ms) for r in records]
        producer.flush(timeout=60)
        assert all(f.get(timeout=0).offset >= 0 for f in futures)  # every record acknowledged
        assert _max_metric(producer.metrics(), "throttle-time-max") > 0
    finally:
        producer.close(timeout=10)
    consumer = KafkaConsumer(unique_topic, bootstrap_servers=sluice.bootstrap, client_id="quota-c-kp",
                             group_id=f"g-{unique_topic}", auto_offset_reset="earliest", enable_auto_commit=False,
                             max_partition_fetch_bytes=100_000)
    got: list[Rec] = []
    deadline = time.monotonic() + 90
    try:
        while len(got) < N and time.monotonic() < deadline:
            for _tp, msgs in consumer.poll(timeout_ms=500).items():
                got.extend(Rec(m.partition, m.key, m.value, tuple((k, v) for k, v in m.headers), m.timestamp)
                           for m in msgs)
        assert _max_metric(consumer.metrics(), "throttle-time-max") > 0
    finally:
        consumer.close()
    assert_same_records(records, got)


def _max_metric(metrics: dict[str, dict[str, float]], name: str) -> float:
    """The largest value of a kafka-python metric over its groups (per connection, per node)."""
    values = [v for group in metrics.values() for k, v in group.items() if k == name and isinstance(v, float)]
    assert values, f"no {name} metric in {sorted(metrics)}"
    return max(values)


def test_java_client_gets_the_throttle_time(sluice: ProxyThread, java_tools: JavaTools, unique_topic: str) -> None:
    create_topic(sluice.bootstrap, unique_topic, 2)
    records = 3000
    sent = java_tools.producer_perf(sluice.bootstrap, unique_topic, num_records=records, record_size=200,
                                    producer_props={"client.id": "quota-p-java", "acks": "all"},
                                    print_metrics=True)
    assert sent.records == records
    match = re.search(r"producer-metrics:produce-throttle-time-avg:\{client-id=quota-p-java\}\s*:\s*([\d.]+)",
                      sent.stdout)
    assert match and float(match.group(1)) > 0, sent.stdout[-3000:]
    read = java_tools.consumer_perf(sluice.bootstrap, unique_topic, messages=records, group=f"g-{unique_topic}",
                                    consumer_props={"client.id": "quota-c-java"})
    assert read.records == records
    assert sluice.total("sluice_quota_throttled_total", entry="consumers", api="Fetch") > 0


def test_a_client_that_ignores_throttle_time_is_held(sluice: ProxyThread, access_log: Path,
                                                     unique_topic: str) -> None:
    create_topic(sluice.bootstrap, unique_topic, 1)
    batch = encode_batch(new_batch([Record(offset_delta=0, value=b"x" * 50_000)]))
    body = request_codec(0, 9).default().replace(acks=1, timeout_ms=30_000, topic_data=[
        Message(name=unique_topic, partition_data=[Message(index=0, records=batch)])])
    host, port = sluice.bootstrap.split(":")
    throttles: list[int] = []
    with RawClient(host, int(port), client_id="quota-raw") as raw:
        for _ in range(8):  # each request sent as soon as the previous answer is in: the hint is ignored
            answer = raw.request(0, 9, body)
            assert [p.error_code for t in answer.responses for p in t.partition_responses] == [0]
            throttles.append(answer.throttle_time_ms)
    assert sum(1 for t in throttles if t > 0) >= 5  # 400 KB at 100 KB/s: throttled from the third request on
    sluice.proxy.access_log.flush()
    lines = [json.loads(line) for line in access_log.read_text().splitlines()]
    mine = [ln for ln in lines if ln["client_id"] == "quota-raw" and ln["api"] == "Produce"]
    assert [ln["quota_throttle_time_ms"] for ln in mine] == throttles
    # Sluice did not read a request before the time it told the client to wait had passed since the answer
    # (the line's ts is when the answer was written; ts - latency_ms when its request was read). Timers may fire
    # up to 2 ms early (libuv counts milliseconds), so 2 ms is allowed for that.
    for before, after in pairwise(mine):
        answered = _ts(before["ts"])
        read = _ts(after["ts"]) - after["latency_ms"] / 1000
        assert read >= answered + before["quota_throttle_time_ms"] / 1000 - 0.002, (before, after)


def _ts(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


async def test_aiokafka_is_throttled_and_loses_nothing(sluice: ProxyThread, access_log: Path,
                                                       unique_topic: str) -> None:
    # aiokafka exposes no throttle metric: what it was told is read from the access log
    create_topic(sluice.bootstrap, unique_topic, 2)
    records = make_records(N, 2, value_size=VALUE_SIZE, tag="aio")
    producer = AIOKafkaProducer(bootstrap_servers=sluice.bootstrap, client_id="quota-p-aio", acks="all",
                                linger_ms=5)
    await producer.start()
    try:
        batch = [await producer.send(unique_topic, value=r.value, key=r.key, partition=r.partition,
                                     timestamp_ms=r.timestamp_ms, headers=list(r.headers)) for r in records]
        acked = await asyncio.gather(*batch)
    finally:
        await producer.stop()
    assert len(acked) == N and all(md.offset >= 0 for md in acked)
    consumer = AIOKafkaConsumer(unique_topic, bootstrap_servers=sluice.bootstrap, client_id="quota-c-aio",
                                group_id=f"g-{unique_topic}", auto_offset_reset="earliest",
                                enable_auto_commit=False, max_partition_fetch_bytes=100_000)
    await consumer.start()
    got: list[Rec] = []
    try:
        async with asyncio.timeout(90):
            while len(got) < N:
                for _tp, msgs in (await consumer.getmany(timeout_ms=500)).items():
                    got += [Rec(m.partition, m.key, m.value, tuple(m.headers), m.timestamp) for m in msgs]
    finally:
        await consumer.stop()
    assert_same_records(records, got)
    sluice.proxy.access_log.flush()
    lines = [json.loads(line) for line in access_log.read_text().splitlines()]
    told = {c: max((ln.get("quota_throttle_time_ms", 0) for ln in lines if ln["client_id"] == c), default=0)
            for c in ("quota-p-aio", "quota-c-aio")}
    assert all(told.values()), told
