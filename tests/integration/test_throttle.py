"""KIP-73 throttles through Sluice against the real broker, judged from the client's side and by counts, never by
a clock (rates are measured in bench/throttle.py):

- every byte a throttled fetcher receives of a throttled topic was counted against the quota, for clients with
  fetch sessions (the Java consumer, kafka-python: their incremental requests list only the partitions that
  changed, while the responses carry every partition with news) and without (confluent-kafka), in passthrough
  and terminate mode, and partitions were held back;
- throttled partitions are held back while unthrottled ones keep flowing; a rate changed through the admin API
  applies to the next fetch;
- the follower side holds fetch-session clients back too (their partitions cannot be left out of the request);
- every record arrives once, in order, unchanged.

The throttled client's client.id matches a [[throttle.consumers]] glob; the throttled topic is listed with
replicas = "*". Records are 64 KiB, one batch each.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from kafka import KafkaConsumer

from proxy import reconfigure
from proxy.admin import AdminServer
from proxy.wire.records import walk_batches
from rig.java_tools import JavaTools
from rig.kafka import KafkaBroker
from rig.kafka_python_group import wait_partitions_known
from rig.proxy_thread import ProxyThread
from rig.raw import RawClient
from tests.support.consume import consume
from tests.support.topics import create_topic, produce_values

pytestmark = pytest.mark.broker

MiB = 1 << 20
PARTITIONS = 3
VALUE = 64 * 1024
PER_PARTITION = 107  # 3 x 107 x 64 KiB = 20.06 MiB of values (~20.1 MiB of batches)
TOTAL = PARTITIONS * PER_PARTITION
#: fast enough for a test, slow enough that every client goes over it within the first window
RATE = 8 * MiB

LEFT_OUT = "sluice_throttle_left_out_partitions_total"
COUNTED = "sluice_throttle_bytes_total"


def value_of(key: bytes) -> bytes:
    return (key * (VALUE // len(key) + 1))[:VALUE]


def _produce(bootstrap: str, topic: str) -> None:
    create_topic(bootstrap, topic, PARTITIONS)
    keys = [(p, f"p{p}-{i:04d}".encode()) for i in range(PER_PARTITION) for p in range(PARTITIONS)]
    produce_values(bootstrap, topic, ((p, k, value_of(k)) for p, k in keys), acks=1, linger_ms=5,
                   max_request_size=4 * MiB)


@pytest.fixture(scope="module")
def topics(kafka_broker: KafkaBroker) -> Iterator[tuple[str, str]]:
    stamp = int(time.time() * 1000)
    slow, free = f"throttled-{stamp}", f"unthrottled-{stamp}"
    _produce(kafka_broker.bootstrap, slow)
    _produce(kafka_broker.bootstrap, free)
    yield slow, free


def throttle_settings(slow: str, leader: int = 0, follower: int = 0) -> dict[str, object]:
    return {"leader_rate_bytes": leader, "follower_rate_bytes": follower,
            "topics": [{"topic": slow, "replicas": "*"}], "consumers": [{"client_id": "backfill-*"}]}


def throttled_proxy(kafka_broker: KafkaBroker, slow: str, leader: int = 0, follower: int = 0,
                    mode: str = "passthrough") -> ProxyThread:
    return ProxyThread(kafka_broker.bootstrap, **{"sessions.mode": mode}, **{
        f"throttle.{k}": v for k, v in throttle_settings(slow, leader, follower).items()})


def check_once_in_order(records: list[tuple[bytes, bytes]]) -> None:
    """Every record of the backlog, once, in order per partition, its value unchanged."""
    seen: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    for key, value in records:
        assert value == value_of(key), f"record {key!r} changed"
        p, i = key.decode().split("-")
        seen[int(p[1:])].append(int(i))
    assert all(seen[p] == list(range(PER_PARTITION)) for p in range(PARTITIONS)), {
        p: len(v) for p, v in seen.items()}


# ------------------------------------------------------------------------------------------------ raw fetches


def records_of(view: Any) -> dict[int, tuple[int, int, int]]:
    """partition -> (high watermark, complete batches, their bytes)."""
    out = {}
    for _, part in view.partitions():
        assert part.error_code == 0, part
        walk = walk_batches(part.records or b"")
        out[part.partition_index] = (part.high_watermark, len(walk.batches), walk.complete_size)
    return out


def test_throttled_partitions_are_held_back_while_unthrottled_ones_flow(kafka_broker: KafkaBroker,
                                                                         topics: tuple[str, str]) -> None:
    """At 1 B/s the first throttled batch passes (the bound is not reached yet: KIP-74's progress guarantee),
    then the throttled partitions stay in every response with their high watermark and no records, while the
    unthrottled topic, fetched on the same connection, comes back whole."""
    slow, free = topics
    start = dict.fromkeys(range(PARTITIONS), 0)
    with throttled_proxy(kafka_broker, slow, leader=1) as sluice, \
            RawClient("127.0.0.1", sluice.proxy.bootstrap_port, client_id="backfill-raw") as client:
        first = records_of(client.fetch(12, slow, start, max_wait_ms=0))
        assert sum(n for _, n, _ in first.values()) == 1  # one batch: the first throttled batch
        held = records_of(client.fetch(12, slow, {p: int(first[p][1]) for p in start}, max_wait_ms=0))
        assert held == dict.fromkeys(range(PARTITIONS), (PER_PARTITION, 0, 0))
        flowing = records_of(client.fetch(12, free, start, max_wait_ms=0))
        assert all(n > 0 for _, n, _ in flowing.values())
        assert sluice.total(LEFT_OUT, side="leader") == 2 * PARTITIONS  # all three, in both responses
        assert sluice.total(COUNTED, side="leader") == sum(size for _, _, size in first.values())


def test_rate_change_through_admin_api_applies_to_the_next_fetch(kafka_broker: KafkaBroker,
                                                                  topics: tuple[str, str]) -> None:
    slow, _ = topics
    start = dict.fromkeys(range(PARTITIONS), 0)
    with throttled_proxy(kafka_broker, slow, leader=1) as sluice, \
            RawClient("127.0.0.1", sluice.proxy.bootstrap_port, client_id="backfill-change") as client:
        admin = AdminServer(sluice.settings.admin.model_copy(update={"enabled": True, "port": 0}),
                            sluice.proxy.ready, sluice.proxy.metrics)
        reconfigure.add_routes(admin, sluice.proxy)
        sluice.call(admin.start())
        try:
            offsets = {p: n for p, (_, n, _) in records_of(client.fetch(12, slow, start, max_wait_ms=0)).items()}
            assert records_of(client.fetch(12, slow, offsets, max_wait_ms=0)) == \
                dict.fromkeys(range(PARTITIONS), (PER_PARTITION, 0, 0))
            body = json.dumps(throttle_settings(slow, leader=1_000_000_000)).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{admin.port}/throttles", data=body, method="PUT",
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=10) as resp:
                assert resp.status == 200
            after = records_of(client.fetch(12, slow, offsets, max_wait_ms=0))
            assert all(n > 0 for _, n, _ in after.values()), after
            with urllib.request.urlopen(f"http://127.0.0.1:{admin.port}/throttles", timeout=10) as resp:
                assert json.loads(resp.read())["leader_rate_bytes"] == 1_000_000_000
            assert sluice.total("sluice_throttle_rate_limit_bytes", side="leader") == 1_000_000_000
        finally:
            sluice.call(admin.stop())


# -------------------------------------------------------------------------------------------- real clients


def consume_java(bootstrap: str, topic: str, java_tools: JavaTools, name: str) -> list[tuple[bytes, bytes]]:
    lines = java_tools.console_consume(bootstrap, topic, max_messages=TOTAL, print_key=True,
                                       group=f"java-{name}-{time.time()}", timeout=120,
                                       consumer_props={"client.id": f"backfill-java-{name}",
                                                       "max.partition.fetch.bytes": 256 * 1024})
    return [(k.encode(), v.encode()) for k, v in (line.split("\t", 1) for line in lines)]


def consume_kafka_python(bootstrap: str, topic: str, name: str) -> list[tuple[bytes, bytes]]:
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, client_id=f"backfill-kp-{name}",
                             group_id=f"kp-{name}-{time.time()}", auto_offset_reset="earliest",
                             enable_auto_commit=False, max_partition_fetch_bytes=256 * 1024,
                             # 30 s, not kafka-python's 10: on a saturated machine its heartbeat thread was late
                             # often enough for the coordinator to drop the member again and again (nothing read
                             # in 120 s, then LeaveGroup answered UNKNOWN_MEMBER_ID); the test is the throttle's
                             session_timeout_ms=30_000)
    got: list[tuple[bytes, bytes]] = []
    try:
        wait_partitions_known(consumer, topic, PARTITIONS)
        deadline = time.monotonic() + 120
        while len(got) < TOTAL and time.monotonic() < deadline:
            for msgs in consumer.poll(timeout_ms=500).values():
                got.extend((m.key, m.value) for m in msgs)
    finally:
        consumer.close()
    return got


def consume_confluent(bootstrap: str, topic: str, name: str) -> list[tuple[bytes, bytes]]:
    got = []
    for msg in consume({"bootstrap.servers": bootstrap, "client.id": f"backfill-ck-{name}",
                        "max.partition.fetch.bytes": 256 * 1024}, topic, deadline_s=120):
        key, value = msg.key(), msg.value()
        assert key is not None and value is not None, msg
        got.append((key, value))
    return got


def consume_with(client: str, bootstrap: str, topic: str, java_tools: JavaTools,
                 name: str) -> list[tuple[bytes, bytes]]:
    if client == "java":
        return consume_java(bootstrap, topic, java_tools, name)
    if client == "kafka-python":
        return consume_kafka_python(bootstrap, topic, name)
    return consume_confluent(bootstrap, topic, name)


@pytest.mark.parametrize("mode", ["passthrough", "terminate"])
@pytest.mark.parametrize("client", ["java", "kafka-python", "confluent"])
def test_every_byte_a_client_receives_was_counted(kafka_broker: KafkaBroker, topics: tuple[str, str],
                                                  java_tools: JavaTools, client: str, mode: str) -> None:
    """The client reads the whole throttled backlog: every record once, in order; the record bytes it received
    (keys and values: the batches' own overhead makes Sluice's count a little larger) were all counted against
    the leader quota, and partitions were held back. The Java consumer and kafka-python use fetch sessions
    (the Java consumer with topic ids, Fetch v17: their names come from Sluice's own lookups); confluent-kafka
    (librdkafka) does not. Before the fix, a Java consumer had ~11% of what it received counted."""
    slow, _ = topics
    with throttled_proxy(kafka_broker, slow, leader=RATE, mode=mode) as sluice:
        records = consume_with(client, sluice.bootstrap, slow, java_tools, f"{client}-{mode}")
        counted = sluice.total(COUNTED, side="leader")
        held = sluice.total(LEFT_OUT, side="leader")
    check_once_in_order(records)
    received = sum(len(k) + len(v) for k, v in records)
    assert counted >= received, f"{client}/{mode}: {received} B received, {counted} B counted"
    assert held > 0, f"{client}/{mode}: the throttle never held a partition back"


@pytest.mark.parametrize("client", ["kafka-python", "confluent"])
def test_follower_side_holds_back_session_and_sessionless_fetchers(kafka_broker: KafkaBroker,
                                                                   topics: tuple[str, str], java_tools: JavaTools,
                                                                   client: str) -> None:
    """Only a follower rate: throttled partitions are left out of session-less requests (confluent-kafka) and,
    since a fetch session's partitions cannot be left out of its request, their records out of the response
    (kafka-python). Either way every received byte counts against the follower quota."""
    slow, _ = topics
    with throttled_proxy(kafka_broker, slow, follower=RATE) as sluice:
        records = consume_with(client, sluice.bootstrap, slow, java_tools, f"{client}-follower")
        counted = sluice.total(COUNTED, side="follower")
        held = sluice.total(LEFT_OUT, side="follower")
    check_once_in_order(records)
    received = sum(len(k) + len(v) for k, v in records)
    assert counted >= received, f"{client}: {received} B received, {counted} B counted"
    assert held > 0, f"{client}: the follower side never held a partition back"
