"""Client quotas (proxy/policies/quota) through Sluice, on the real broker, with real clients: every record
produced is acknowledged and consumed once, in order; the throttle time reaches the client (librdkafka's
throttle callback, the Java producer's produce-throttle-time-avg, kafka-python's throttle-time metrics, and for
aiokafka, which has no such metric, the access log); a raw client that ignores throttle_time_ms is held all the
same (Sluice does not read its next request before the throttle time it was told has passed).

Which entry governs a client (Kafka's order of precedence, exemptions) is tests/unit/test_quota_entities.py's; here
the wiring on the real broker: a more specific entry wins over a catch-all and an exempt client is never throttled,
the SASL principal the broker accepted selects its entry, and so does the client address a PROXY protocol v2 header
carries."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import struct
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

from proxy.core.proxy_protocol import V2_SIGNATURE
from proxy.wire.messages import request_codec
from proxy.wire.model import Message
from proxy.wire.records import Record, encode_batch, new_batch
from rig.java_tools import JavaTools
from rig.kafka_python_group import wait_partitions_known
from rig.proxy_thread import ProxyThread
from rig.raw import RawClient
from rig.secure_broker import SASL_USERS, SecureBroker
from tests.support.records import Rec, assert_same_records, make_records, rec_of
from tests.support.topics import create_topic

pytestmark = pytest.mark.broker

RATE = 200_000  # bytes/s, for producers and consumers alike
N, VALUE_SIZE = 600, 1000  # ~600 KB: about three seconds' worth, so each client is throttled
ENTRIES = [
    {"name": "producers", "client_id": "quota-p-*", "produce_rate_bytes": RATE},
    {"name": "consumers", "client_id": "quota-c-*", "fetch_rate_bytes": RATE},
    {"name": "raw", "client_id": "quota-raw", "produce_rate_bytes": 100_000},
    # a catch-all below the globs above, and one client exempt from it
    {"name": "everyone", "client_id": "<default>", "produce_rate_bytes": 100_000},
    {"name": "exempt", "client_id": "quota-exempt", "produce_rate_bytes": 0},
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
    try:
        wait_partitions_known(consumer, unique_topic, 2)
        deadline = time.monotonic() + 90
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
    # Sluice did not read a request before the time it told the client to wait had passed since it read the one
    # before (the answer went out after that, and the wait runs from the answer). A line's ts - latency_ms is when
    # its request was read: both are taken at the same moment, after the answer was written, so a delay there (the
    # test's thread holding the GIL) cancels out, where ts alone would be late. Timers may fire up to 2 ms early
    # (libuv counts milliseconds), so 2 ms is allowed for that.
    for before, after in pairwise(mine):
        assert _read_at(after) >= _read_at(before) + before["quota_throttle_time_ms"] / 1000 - 0.002, (before, after)


def _read_at(line: dict[str, Any]) -> float:
    """When the access-log ``line``'s request was read."""
    ts = datetime.strptime(line["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()
    return ts - line["latency_ms"] / 1000


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


def _produce_raw(raw: RawClient, topic: str, requests: int, value_size: int = 50_000) -> list[int]:
    """``requests`` Produce v9 requests of one ``value_size`` record each, each sent once the previous answer is in;
    the throttle_time_ms of each answer (every record acknowledged)."""
    batch = encode_batch(new_batch([Record(offset_delta=0, value=b"x" * value_size)]))
    body = request_codec(0, 9).default().replace(acks=1, timeout_ms=30_000, topic_data=[
        Message(name=topic, partition_data=[Message(index=0, records=batch)])])
    throttles = []
    for _ in range(requests):
        answer = raw.request(0, 9, body)
        assert [p.error_code for t in answer.responses for p in t.partition_responses] == [0]
        throttles.append(answer.throttle_time_ms)
    return throttles


def test_the_most_specific_entry_governs_and_an_exempt_client_is_never_held(sluice: ProxyThread,
                                                                           unique_topic: str) -> None:
    create_topic(sluice.bootstrap, unique_topic, 1)
    host, port = sluice.bootstrap.split(":")
    throttled = {}
    for client_id in ("quota-other", "quota-exempt"):
        with RawClient(host, int(port), client_id=client_id) as raw:
            throttled[client_id] = _produce_raw(raw, unique_topic, 4)  # 200 KB at once: twice a 100 KB/s quota
    assert any(throttled["quota-other"]) and not any(throttled["quota-exempt"]), throttled
    assert sluice.total("sluice_quota_requests_total", entry="everyone", api="Produce") >= 4
    assert sluice.total("sluice_quota_requests_total", entry="exempt", api="Produce") == 0


def _v2(src: str, sport: int) -> bytes:
    """A PROXY protocol v2 header (HAProxy's spec): TCP over IPv4 from ``src``:``sport``."""
    addrs = socket.inet_aton(src) + socket.inet_aton("127.0.0.1") + struct.pack(">HH", sport, 19092)
    return V2_SIGNATURE + b"\x21\x11" + struct.pack(">H", len(addrs)) + addrs


def test_the_client_address_of_a_proxy_protocol_header_selects_its_entry(kafka_broker: Any, unique_topic: str) -> None:
    create_topic(kafka_broker.bootstrap, unique_topic, 1)
    entries = [{"name": "office", "client_address": "10.9.0.0/16", "produce_rate_bytes": 100_000, "shared": True}]
    with ProxyThread(kafka_broker.bootstrap, **{"quota.entries": entries, "listen.proxy_protocol": "v2"}) as p:
        host, port = p.bootstrap.split(":")
        throttled = {}
        for n, src in enumerate(("10.9.1.7", "10.9.200.3", "198.51.100.9")):
            with RawClient(host, int(port), client_id="quota-addr") as raw:
                raw.sock.sendall(_v2(src, 40000 + n))
                throttled[src] = _produce_raw(raw, unique_topic, 2)
        assert p.total("sluice_quota_requests_total", entry="office", api="Produce") == 4
    # one quota for the network (shared): the second host is over it from its first request; the third not in it
    assert throttled["10.9.1.7"][0] == 0 and all(throttled["10.9.200.3"]), throttled
    assert not any(throttled["198.51.100.9"]), throttled


def test_the_sasl_principal_selects_its_entry(secure_broker: SecureBroker, unique_topic: str) -> None:
    entries = [{"name": "alice", "principal": "alice", "produce_rate_bytes": 20_000},
               {"name": "users", "principal": "<default>", "produce_rate_bytes": 10_000_000}]
    create_topic(secure_broker.plaintext, unique_topic, 1)
    with ProxyThread(secure_broker.sasl_plaintext, **{"quota.entries": entries}) as p:
        throttled: dict[str, list[float]] = {}
        acked: dict[str, list[int]] = {}
        for user in ("alice", "bob"):
            throttled[user], acked[user] = [], []
            times, acks = throttled[user], acked[user]

            def on_throttle(event: Any, times: list[float] = times) -> None:
                times.append(event.throttle_time)

            def on_delivery(err: Any, _message: Any, acks: list[int] = acks) -> None:
                acks.append(0 if err else 1)

            producer = Producer({"bootstrap.servers": p.bootstrap, "security.protocol": "SASL_PLAINTEXT",
                                 "sasl.mechanism": "PLAIN", "sasl.username": user, "sasl.password": SASL_USERS[user],
                                 "client.id": "quota-sasl", "linger.ms": 0, "log_level": 0,
                                 "throttle_cb": on_throttle})
            for _ in range(40):  # 40 KB: two seconds of alice's quota, nothing to bob's
                producer.produce(unique_topic, b"s" * 1000, on_delivery=on_delivery)
            assert producer.flush(60) == 0 and sum(acked[user]) == 40
        assert p.total("sluice_quota_requests_total", entry="alice", api="Produce") > 0
        assert p.total("sluice_quota_requests_total", entry="users", api="Produce") > 0
    assert throttled["alice"] and max(throttled["alice"]) > 0
    assert not any(throttled["bob"]), throttled["bob"]
