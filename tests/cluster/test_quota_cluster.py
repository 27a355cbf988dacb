"""Client quotas (proxy/policies/quota) across a cluster: the session's 3 brokers, replicating through a Sluice
sidecar per broker.

- Followers through a catch-all quota: every sidecar gets a ``<default>`` client.id fetch and request quota that
  one follower's share of the topic's replication exceeds many times; the followers are neither counted nor held
  (every sidecar relays their fetches, none counts a byte of them), no partition leaves the ISR, while a consumer
  through a sidecar is counted under the same entry. Kafka never applies a client quota to replication.
- One quota for a fleet: three Sluice processes, one fleet, one fleet-scoped produce quota for one client.id, a
  producer of that client.id on each: every instance holds a third of it; one killed -9, the two left take half each
  (its share goes to them, from the usage reports, proxy/policies/quota/shares.py); every acknowledged record is
  stored once. What it looks like from the clients (the total per window) is ``python -m bench.quota --fleet 3``.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer

from rig.cluster import KafkaCluster
from rig.fleet import admin_json, fleet_env, start_fleet
from rig.kafka import end_offsets
from rig.sluice_process import SluiceProcess
from tests.support.faults import wait_until

pytestmark = pytest.mark.broker

FOLLOWER_QUOTA = 200_000  # B/s per follower (client.id <default>): a 3 MB topic is 5 s of it per replica
FLEET_QUOTA = 300_000  # B/s for the whole fleet


def _quotas(sidecar: SluiceProcess, body: dict[str, Any]) -> None:
    status, answer = admin_json(sidecar.admin_url, "/quotas", "PUT", body)
    assert status == 200, answer


@pytest.fixture
def catch_all(kafka_cluster: KafkaCluster) -> Iterator[list[SluiceProcess]]:
    """Every sidecar with a catch-all quota; cleared after the test (the cluster is the session's)."""
    sidecars = [kafka_cluster.sidecars[n] for n in sorted(kafka_cluster.sidecars)]
    entry = {"name": "all", "client_id": "<default>", "fetch_rate_bytes": FOLLOWER_QUOTA, "request_rate": 5}
    try:
        for sidecar in sidecars:
            _quotas(sidecar, {"entries": [entry]})
        yield sidecars
    finally:
        for sidecar in sidecars:
            _quotas(sidecar, {})


def _counted(sidecar: SluiceProcess) -> float:
    return (sidecar.metric("sluice_quota_bytes_total", {"entry": "all", "kind": "fetch"})
            + sidecar.metric("sluice_quota_requests_total", {"entry": "all", "api": "Fetch"})
            + sidecar.metric("sluice_quota_throttled_total", {"entry": "all", "api": "Fetch"}))


def _fetches(sidecar: SluiceProcess) -> float:
    return sum(sidecar.metric("sluice_requests_total", {"api": "Fetch", "version": str(v)}) for v in range(4, 19))


def test_followers_through_a_catch_all_quota_are_never_held(kafka_cluster: KafkaCluster,
                                                             catch_all: list[SluiceProcess], unique_topic: str) -> None:
    before = [_fetches(s) for s in catch_all]
    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    admin.create_topics([NewTopic(unique_topic, 3, 3, config={"min.insync.replicas": "3"})])[unique_topic].result(30)
    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap, "acks": "all", "linger.ms": 20,
                         "enable.idempotence": True, "log_level": 0})
    acked: list[int] = []
    for chunk in range(6):  # 3 MB with every replica in sync (min.insync.replicas 3), the ISR checked every 0.5 MB
        for i in range(50):
            producer.produce(unique_topic, b"r" * 10_000, partition=(chunk * 50 + i) % 3,
                             on_delivery=lambda err, _m: acked.append(0 if err else 1))
        assert producer.flush(60) == 0
        assert all(len(p.isr) == 3 for p in kafka_cluster.partitions(unique_topic)), \
            kafka_cluster.partitions(unique_topic)
    assert sum(acked) == 300
    for i, sidecar in enumerate(catch_all):
        assert _fetches(sidecar) > before[i]  # followers fetched through every sidecar...
        assert _counted(sidecar) == 0  # ...and not one byte or request of theirs was counted
    # the entry is in force: a consumer through a sidecar is counted under it
    consumer = KafkaConsumer(unique_topic, bootstrap_servers=catch_all[0].bootstrap, client_id="quota-consumer",
                             auto_offset_reset="earliest", enable_auto_commit=False, consumer_timeout_ms=20_000)
    try:
        got = 0
        for _ in consumer:
            got += 1
            if got == 50:
                break
    finally:
        consumer.close()
    assert got == 50 and sum(_counted(s) for s in catch_all) > 0


class Producing:
    """A producer of ``client_id`` through each instance, as fast as the quota lets it, until stopped."""

    def __init__(self, instances: list[SluiceProcess], topic: str, client_id: str) -> None:
        self.stops = [threading.Event() for _ in instances]
        self.acked = [0] * len(instances)
        self.failed: list[str] = []
        self._threads = [threading.Thread(target=self._run, args=(i, s.bootstrap, topic, client_id), daemon=True)
                         for i, s in enumerate(instances)]
        for t in self._threads:
            t.start()

    def _run(self, i: int, bootstrap: str, topic: str, client_id: str) -> None:
        producer = Producer({"bootstrap.servers": bootstrap, "client.id": client_id, "enable.idempotence": True,
                             "linger.ms": 5, "batch.size": 16_384, "queue.buffering.max.kbytes": 64,
                             "message.timeout.ms": 60_000, "log_level": 0})

        def delivered(err: Any, _msg: Any) -> None:
            if err is None:
                self.acked[i] += 1
            else:
                self.failed.append(str(err))

        while not self.stops[i].is_set():
            try:
                producer.produce(topic, b"f" * 4000, on_delivery=delivered)
            except BufferError:
                producer.poll(0.05)  # the queue is full until the quota lets acknowledgements through
        producer.flush(60)

    def join(self, *which: int) -> None:
        """Stop the producers ``which`` (default: all) once what they sent is acknowledged."""
        which = which or tuple(range(len(self._threads)))
        for i in which:
            self.stops[i].set()
        for i in which:
            self._threads[i].join(90)


def _fleet_view(instance: SluiceProcess) -> tuple[int, float]:
    """(live instances, this instance's bound on the client's produce rate) from its GET /quotas."""
    status, body = admin_json(instance.admin_url, "/quotas")
    assert status == 200, body
    rows = [r for r in body["status"]["entities"] if r["entry"] == "app" and r["kind"] == "produce"]
    return body["status"]["fleet"]["live_instances"], rows[0]["bound"] if rows else 0.0


def _near(value: float, target: float) -> bool:
    return abs(value - target) <= 0.03 * target  # shares follow usage: 2% steps (book.py SHARE_STEP)


def test_a_fleet_quota_is_shared_and_a_killed_instances_share_goes_to_the_others(
        kafka_cluster: KafkaCluster, unique_topic: str, tmp_path: Path) -> None:
    name = f"q-{uuid.uuid4().hex[:8]}"
    config = tmp_path / "sluice.toml"
    config.write_text(f'[quota]\nscope = "fleet"\n[[quota.entries]]\nname = "app"\nclient_id = "quota-fleet"\n'
                      f"produce_rate_bytes = {FLEET_QUOTA}\n")
    env = {**fleet_env(name, status_interval_s="1", usage_interval_s="0.5"), "SLUICE_CONFIG": str(config)}
    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    admin.create_topics([NewTopic(unique_topic, 3, 3)])[unique_topic].result(30)
    instances = start_fleet([kafka_cluster.bootstrap] * 3, env, together=True)
    producing: Producing | None = None
    try:
        producing = Producing(instances, unique_topic, "quota-fleet")
        views = lambda alive: [_fleet_view(i) for i in alive]  # noqa: E731
        wait_until(lambda: all(n == 3 and _near(b, FLEET_QUOTA / 3) for n, b in views(instances)), 60,
                   lambda: f"each of 3 instances holding a third: {views(instances)}")
        producing.join(2)  # its client gone first (its records all acknowledged), then the instance:
        instances[2].kill()  # kill -9, no goodbye: its reports just stop
        wait_until(lambda: all(n == 2 and _near(b, FLEET_QUOTA / 2) for n, b in views(instances[:2])), 60,
                   lambda: f"the 2 left holding half each: {views(instances[:2])}")
        producing.join()
        assert not producing.failed, producing.failed[:3]
        assert sum(end_offsets(kafka_cluster.bootstrap, unique_topic).values()) == sum(producing.acked)
    finally:
        if producing is not None:
            producing.join()
        for instance in instances:
            instance.close()
