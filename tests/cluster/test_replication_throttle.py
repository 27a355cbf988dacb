"""Replication through Sluice (KIP-73, leader and follower side) on the session's 3-broker cluster, judged by counts.

Every broker's REPLICATION listener is advertised at a Sluice sidecar in front of it (rig/cluster.py), so a follower
fetches from the leader through the leader's sidecar: Fetch v18 from ``broker-N-fetcher-0`` with incremental
sessions (KIP-227) and no ApiVersions. A one-partition topic on broker 1 is moved to [1, 2] with
``kafka-reassign-partitions`` while broker 1's sidecar throttles the new replica ("0:2") at a rate far below what the
machine moves, on the leader side, then (another topic) on the follower side. What must hold, from Sluice's counters
and the cluster's state, never the clock:

- partitions were held back on the side that is throttled (``sluice_throttle_left_out_partitions_total{side}``), none
  on the other;
- raised while the move runs (a live ``PUT /throttles``), the throttle lets the move finish;
- every byte of the moved log was counted against the quota, exactly (``sluice_throttle_bytes_total`` grew by the
  size of the partition's segments): each partition a session response carries is metered, and the topic id of a
  connection that never sends Metadata was named by Sluice's own lookup;
- the follower never sent ApiVersions, and fetched with v18;
- the move completes (broker 2 joins the ISR).

Then the in-sync exemption (KAFKA-4313, ReplicationQuotaManager): with all three replicas in sync and the throttle
still at 1 kB/s on every replica of the topic, 2 MB produced with acks=all are all acknowledged (a throttled follower
would need ~2,000 s for them) and no partition is held back, while the followers' bytes are still counted.

The wall-clock side (a 200 MB move within +/-10% of ``sluice throttle plan``, a live change, a consumer's rate) is
``python -m bench.reassign``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from rig.cluster import KafkaCluster
from rig.java_tools import JavaTools
from rig.reassign import clear_throttles, create_on, fill, log_bytes, put_throttles, reassign, wait_in_sync
from rig.sluice_process import SluiceProcess

pytestmark = pytest.mark.broker

MOVE_BYTES = 6_000_000  # 600 records of 10 kB: ~0.1 s unthrottled here, minutes at the throttle below
THROTTLE = 200_000  # B/s: the move is held back from its first response on


@pytest.fixture
def sidecar(kafka_cluster: KafkaCluster) -> Iterator[SluiceProcess]:
    """Broker 1's sidecar, its throttle cleared after the test (the cluster is the session's)."""
    proc = kafka_cluster.sidecars[1]
    try:
        yield proc
    finally:
        clear_throttles(proc.admin_url)


def _counts(sidecar: SluiceProcess) -> dict[str, float]:
    out = {f"left_out_{side}": sidecar.metric("sluice_throttle_left_out_partitions_total", {"side": side})
           for side in ("leader", "follower")}
    out["bytes"] = sidecar.metric("sluice_throttle_bytes_total", {"side": "leader"})
    out["api_versions"] = sum(sidecar.metric("sluice_requests_total", {"api": "ApiVersions", "version": str(v)})
                              for v in range(5))
    out["fetch_v18"] = sidecar.metric("sluice_requests_total", {"api": "Fetch", "version": "18"})
    return out


@pytest.mark.parametrize("side", ["leader", "follower"])
def test_a_move_is_throttled_through_the_leaders_sidecar(kafka_cluster: KafkaCluster, sidecar: SluiceProcess,
                                                         java_tools: JavaTools, unique_topic: str, tmp_path: Path,
                                                         side: str) -> None:
    direct = kafka_cluster.broker(1).bootstrap
    create_on(java_tools, direct, unique_topic, [1])
    fill(java_tools, direct, unique_topic, MOVE_BYTES)
    size = log_bytes(kafka_cluster, 1, unique_topic)
    put_throttles(sidecar.admin_url, {f"{side}_rate_bytes": THROTTLE,
                                      "topics": [{"topic": unique_topic, "replicas": "0:2"}]})
    before = _counts(sidecar)
    reassign(java_tools, kafka_cluster.bootstrap, unique_topic, [1, 2], tmp_path)
    # Held back from the first responses on: once the counter says so, raise the throttle while the move runs (a
    # live change, applied from the next fetch) to a rate it reaches, and let it finish.
    held = _wait_counts(sidecar, lambda c: c[f"left_out_{side}"] > before[f"left_out_{side}"])
    put_throttles(sidecar.admin_url, {f"{side}_rate_bytes": 50_000_000,
                                      "topics": [{"topic": unique_topic, "replicas": "0:2"}]})
    wait_in_sync(kafka_cluster, unique_topic, 2, timeout=120)
    after = _counts(sidecar)
    other = "follower" if side == "leader" else "leader"
    assert held["bytes"] - before["bytes"] < size, "nothing was held back: the whole log passed at once"
    assert after[f"left_out_{other}"] == before[f"left_out_{other}"], (before, after)
    # Every byte of the moved log counted against the quota, exactly: every partition a session response carries
    # is metered (the follower's incremental requests list it only when its fetch offset changes).
    assert after["bytes"] - before["bytes"] == size, (size, before, after)
    assert after["api_versions"] == before["api_versions"], "a replica fetcher sent ApiVersions"
    assert after["fetch_v18"] > before["fetch_v18"]


def test_moved_bytes_all_counted_and_in_sync_replicas_exempt(kafka_cluster: KafkaCluster, sidecar: SluiceProcess,
                                                              java_tools: JavaTools, unique_topic: str,
                                                              tmp_path: Path) -> None:
    direct = kafka_cluster.broker(1).bootstrap
    create_on(java_tools, direct, unique_topic, [1, 3], config={"min.insync.replicas": 2})
    kafka_cluster.wait_partitions(unique_topic, lambda s: s and len(s[0].isr) == 2, what="[1, 3] in sync")
    fill(java_tools, direct, unique_topic, MOVE_BYTES)
    size = log_bytes(kafka_cluster, 1, unique_topic)
    # A rate the move can reach: every byte of it is counted while the throttle is on.
    put_throttles(sidecar.admin_url, {"leader_rate_bytes": 50_000_000,
                                      "topics": [{"topic": unique_topic, "replicas": "*"}]})
    before = _counts(sidecar)
    reassign(java_tools, kafka_cluster.bootstrap, unique_topic, [1, 3, 2], tmp_path)
    wait_in_sync(kafka_cluster, unique_topic, 2, timeout=120)
    moved = _counts(sidecar)
    assert moved["bytes"] - before["bytes"] >= size, "bytes of the move not counted against the quota"
    # Now every replica is in sync; throttle them all to 1 kB/s and produce 2 MB with acks=all (min ISR 2).
    put_throttles(sidecar.admin_url, {"leader_rate_bytes": 1_000, "topics": [{"topic": unique_topic, "replicas": "*"}]})
    before = _counts(sidecar)
    acked = _produce_acks_all(direct, unique_topic, records=200, size=10_000)
    after = _counts(sidecar)
    assert acked == 200
    assert after["left_out_leader"] == before["left_out_leader"], "an in-sync replica was held back"
    # both followers' copies of the 2 MB were counted (in sync: not throttled, but counted)
    assert after["bytes"] - before["bytes"] >= 2 * 200 * 10_000, (before, after)


def _wait_counts(sidecar: SluiceProcess, ok: Callable[[dict[str, float]], bool],
                 timeout: float = 60.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        counts = _counts(sidecar)
        if ok(counts):
            return counts
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {counts}"
        time.sleep(0.2)  # poll interval of the condition


def _produce_acks_all(bootstrap: str, topic: str, *, records: int, size: int) -> int:
    acked = 0

    def done(err: object, _msg: object) -> None:
        nonlocal acked
        if err is None:
            acked += 1

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "client.id": "sluice-test-in-sync", "message.timeout.ms": 60_000})
    for _ in range(records):
        producer.produce(topic, b"i" * size, partition=0, on_delivery=done)
        producer.poll(0)
    assert producer.flush(90) == 0, "records left unacknowledged"
    return acked
