"""KIP-73 throttles through Sluice against the real broker, in the style of Kafka's ReplicationQuotasTest
(shouldThrottleOldSegments: 20 MB at 5 MB/s takes 0.9x..1.5x of 4 s; rate within (0.5x, 1.1x) of the throttle).

The throttled fetcher is a raw session-less fetch loop (tests/support/raw.py) so what is fetched, and when, is
exactly controlled and timed: responses of at most 1 MiB, records of 64 KiB (one batch each). Its client.id
matches a [[throttle.consumers]] glob; the throttled topic is listed with replicas = "*". Every fetched batch is
checked to start where the previous one ended, so every record arrives once, in order.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from kafka import KafkaConsumer

from proxy import reconfigure
from proxy.admin import AdminServer
from proxy.wire.records import walk_batches
from rig.proxy_thread import ProxyThread
from tests.support.kafka import create_topic, produce_values
from tests.support.raw import RawClient

pytestmark = pytest.mark.broker

MiB = 1 << 20
PARTITIONS = 3
VALUE = 64 * 1024
PER_PARTITION = 107  # 3 x 107 x 64 KiB = 20.06 MiB of values (~20.1 MiB of batches)


def _produce(bootstrap: str, topic: str) -> None:
    create_topic(bootstrap, topic, PARTITIONS)
    keys = [(p, f"p{p}-{i:04d}".encode()) for i in range(PER_PARTITION) for p in range(PARTITIONS)]
    produce_values(bootstrap, topic, ((p, k, (k * (VALUE // len(k) + 1))[:VALUE]) for p, k in keys),
                   acks=1, linger_ms=5, max_request_size=4 * MiB)


@pytest.fixture(scope="module")
def topics(kafka_broker) -> Iterator[tuple[str, str]]:  # type: ignore[no-untyped-def]
    stamp = int(time.time() * 1000)
    slow, free = f"throttled-{stamp}", f"unthrottled-{stamp}"
    _produce(kafka_broker.bootstrap, slow)
    _produce(kafka_broker.bootstrap, free)
    yield slow, free


def throttle_settings(slow: str, rate: int) -> dict[str, object]:
    return {"leader_rate_bytes": rate, "topics": [{"topic": slow, "replicas": "*"}],
            "consumers": [{"client_id": "backfill-*"}]}


def throttled_proxy(kafka_broker, slow: str, rate: int) -> ProxyThread:  # type: ignore[no-untyped-def]
    return ProxyThread(kafka_broker.bootstrap, **{f"throttle.{k}": v for k, v in throttle_settings(slow, rate).items()})


@dataclass
class Drain:
    """A raw fetch loop over every partition of a topic, timing the record bytes received."""

    port: int
    topic: str
    client_id: str
    samples: list[tuple[float, int]] = field(default_factory=list)  # (monotonic time, record bytes)
    start: float = 0.0
    end: float = 0.0
    fetches: int = 0
    error: BaseException | None = None

    @property
    def total(self) -> int:
        return sum(n for _, n in self.samples)

    @property
    def elapsed(self) -> float:
        return self.end - self.start

    def bytes_between(self, a: float, b: float) -> int:
        return sum(n for t, n in self.samples if a <= t < b)

    def run(self) -> None:
        try:
            self._run()
        except BaseException as e:  # reported by the test thread
            self.error = e

    def _run(self) -> None:
        offsets = {p: 0 for p in range(PARTITIONS)}
        with RawClient("127.0.0.1", self.port, client_id=self.client_id) as c:
            self.start = time.monotonic()
            while any(o < PER_PARTITION for o in offsets.values()) and self.fetches < 20_000:
                view = c.fetch(12, self.topic, {p: o for p, o in offsets.items() if o < PER_PARTITION},
                               max_bytes=MiB, partition_max_bytes=256 * 1024, max_wait_ms=500)
                self.fetches += 1
                got = 0
                for _, part in view.partitions():
                    assert part.error_code == 0, part
                    assert part.high_watermark == PER_PARTITION
                    walk = walk_batches(part.records or b"")
                    for batch in walk.batches:
                        assert batch.base_offset == offsets[part.partition_index], "gap or duplicate"
                        offsets[part.partition_index] = batch.next_offset
                    got += walk.complete_size
                if got:
                    self.samples.append((time.monotonic(), got))
            self.end = time.monotonic()
        assert all(o == PER_PARTITION for o in offsets.values()), offsets


def metric(name: str, labels: dict[str, str] | None = None) -> float:
    value = REGISTRY.get_sample_value(name, labels or {})
    return 0.0 if value is None else value


def test_throttled_backfill_at_5mib_s_while_unthrottled_topic_flows(kafka_broker, topics: tuple[str, str]) -> None:  # type: ignore[no-untyped-def]
    slow, free = topics
    rate = 5 * MiB
    left_out_before = metric("sluice_throttle_left_out_partitions_total", {"side": "leader"})
    with throttled_proxy(kafka_broker, slow, rate) as sluice:
        throttled = Drain(sluice.proxy.bootstrap_port, slow, "backfill-1")
        unthrottled = Drain(sluice.proxy.bootstrap_port, free, "backfill-2")
        threads = [threading.Thread(target=d.run) for d in (throttled, unthrottled)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert throttled.error is None and unthrottled.error is None, (throttled.error, unthrottled.error)
        assert metric("sluice_throttle_rate_limit_bytes", {"side": "leader"}) == rate
        assert metric("sluice_throttle_byte_rate", {"side": "leader"}) > 0
    measured = throttled.total / throttled.elapsed
    expected = throttled.total / rate  # ~4 s
    print(f"throttled: {throttled.total} B in {throttled.elapsed:.2f} s = {measured / MiB:.2f} MiB/s "
          f"({throttled.fetches} fetches; expected {expected:.2f} s); unthrottled: {unthrottled.total} B in "
          f"{unthrottled.elapsed:.2f} s")
    assert 0.9 * expected <= throttled.elapsed <= 1.5 * expected
    assert 0.5 * rate < measured < 1.1 * rate
    # The unthrottled topic, fetched at the same time through the same proxy, was not held to the throttle.
    assert unthrottled.elapsed < 0.5 * throttled.elapsed
    assert metric("sluice_throttle_left_out_partitions_total", {"side": "leader"}) > left_out_before


def test_rate_change_through_admin_api_applies_within_2s(kafka_broker, topics: tuple[str, str]) -> None:  # type: ignore[no-untyped-def]
    slow, _ = topics
    low, high = 2 * MiB, 10 * MiB
    with throttled_proxy(kafka_broker, slow, low) as sluice:
        admin = AdminServer(sluice.settings.admin.model_copy(update={"enabled": True, "port": 0}),
                            sluice.proxy.ready)
        reconfigure.add_routes(admin, sluice.proxy)
        sluice.call(admin.start())
        try:
            drain = Drain(sluice.proxy.bootstrap_port, slow, "backfill-change")
            thread = threading.Thread(target=drain.run)
            thread.start()
            deadline = time.monotonic() + 30
            while drain.total < 6 * MiB and time.monotonic() < deadline and thread.is_alive():
                thread.join(0.05)  # polling progress, bounded by the deadline
            body = json.dumps(throttle_settings(slow, high)).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{admin.port}/throttles", data=body, method="PUT",
                                         headers={"Content-Type": "application/json"})
            changed_at = time.monotonic()
            with urllib.request.urlopen(req, timeout=10) as resp:
                assert resp.status == 200
            thread.join(60)
            assert drain.error is None, drain.error
            with urllib.request.urlopen(f"http://127.0.0.1:{admin.port}/throttles", timeout=10) as resp:
                assert b'"leader_rate_bytes": %d' % high in resp.read()
        finally:
            sluice.call(admin.stop())
    before = drain.bytes_between(changed_at - 2.0, changed_at) / 2.0
    after_end = min(changed_at + 2.0, drain.end)
    after = drain.bytes_between(changed_at, after_end) / (after_end - changed_at)
    print(f"before the change {before / MiB:.2f} MiB/s, within 2 s after {after / MiB:.2f} MiB/s")
    assert 0.5 * low < before < 1.1 * low
    assert after > 2 * low


def test_kafka_python_consumer_gets_every_record_once_in_order_under_throttle(kafka_broker,  # type: ignore[no-untyped-def]
                                                                               topics: tuple[str, str]) -> None:
    slow, _ = topics
    left_out_before = metric("sluice_throttle_left_out_partitions_total", {"side": "leader"})
    with throttled_proxy(kafka_broker, slow, 10 * MiB) as sluice:
        consumer = KafkaConsumer(slow, bootstrap_servers=sluice.bootstrap, client_id="backfill-kp",
                                 group_id=f"kp-throttle-{time.time()}", auto_offset_reset="earliest",
                                 enable_auto_commit=False, max_partition_fetch_bytes=256 * 1024)
        seen: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
        deadline = time.monotonic() + 90
        while sum(map(len, seen.values())) < PARTITIONS * PER_PARTITION and time.monotonic() < deadline:
            for tp, msgs in consumer.poll(timeout_ms=500).items():
                for m in msgs:
                    p, i = m.key.decode().split("-")
                    assert int(p[1:]) == tp.partition
                    seen[tp.partition].append(int(i))
                    assert m.offset == int(i)
        consumer.close()
    assert all(seen[p] == list(range(PER_PARTITION)) for p in range(PARTITIONS)), {
        p: len(v) for p, v in seen.items()}
    # the throttle was in force (records were left out) and the client's fetch session survived it
    assert metric("sluice_throttle_left_out_partitions_total", {"side": "leader"}) > left_out_before


def test_java_consumer_with_sessions_and_topic_ids_gets_every_record_under_throttle(  # type: ignore[no-untyped-def]
        kafka_broker, topics: tuple[str, str], java_tools) -> None:
    """The Java consumer fetches with v17 (topic ids, resolved from the Metadata Sluice relayed) in incremental
    fetch sessions, whose FetchSessionHandler rejects a full response that lacks a session partition: records
    left out while the partition is kept must not break it."""
    slow, _ = topics
    left_out_before = metric("sluice_throttle_left_out_partitions_total", {"side": "leader"})
    rate = 10 * MiB
    with throttled_proxy(kafka_broker, slow, rate) as sluice:
        started = time.monotonic()
        lines = java_tools.console_consume(sluice.bootstrap, slow, max_messages=PARTITIONS * PER_PARTITION,
                                           print_key=True, group=f"java-throttle-{time.time()}", timeout=120,
                                           consumer_props={"client.id": "backfill-java",
                                                           "max.partition.fetch.bytes": 256 * 1024})
        elapsed = time.monotonic() - started
    seen: dict[str, list[int]] = {}
    for line in lines:
        key, value = line.split("\t", 1)
        assert value.encode() == (key.encode() * (VALUE // len(key) + 1))[:VALUE]
        p, i = key.split("-")
        seen.setdefault(p, []).append(int(i))
    assert seen == {f"p{p}": list(range(PER_PARTITION)) for p in range(PARTITIONS)}
    assert metric("sluice_throttle_left_out_partitions_total", {"side": "leader"}) > left_out_before
    # the throttle held the Java consumer too (its JVM start-up is included, so this is only a lower bound)
    assert elapsed >= 0.9 * PARTITIONS * PER_PARTITION * VALUE / rate
