"""Replica moves on the rig's cluster (rig/cluster.py), as an operator makes them: ``kafka-reassign-partitions`` from
the jars, a throttle set on a Sluice sidecar through its admin API (``PUT /throttles``) or Kafka's own
(``--throttle``), and the move timed until the new replica is in sync. Shared by ``bench.reassign`` and the cluster
tests, which move less data and judge by counts rather than time.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rig.cluster import KafkaCluster
from rig.java_tools import JavaTools, PerfResult
from rig.kafka import RigError

REASSIGN = "org.apache.kafka.tools.reassign.ReassignPartitionsCommand"


def create_on(tools: JavaTools, bootstrap: str, topic: str, replicas: Sequence[int],
              config: Mapping[str, object] | None = None) -> None:
    """A one-partition topic whose replicas are exactly ``replicas`` (``--replica-assignment``)."""
    args = ["--create", "--topic", topic, "--replica-assignment", ":".join(map(str, replicas))]
    for key, value in (config or {}).items():
        args += ["--config", f"{key}={value}"]
    tools.topics(bootstrap, *args)


def fill(tools: JavaTools, bootstrap: str, topic: str, total_bytes: int, record_size: int = 10_000) -> PerfResult:
    """About ``total_bytes`` of record values, as fast as the producer goes (uncompressed, acks=1: set-up, not
    the subject of any measurement)."""
    return tools.producer_perf(bootstrap, topic, num_records=max(1, total_bytes // record_size),
                               record_size=record_size,
                               producer_props={"acks": 1, "linger.ms": 20, "batch.size": 1 << 20,
                                               "compression.type": "none"})


def log_bytes(cluster: KafkaCluster, node: int, topic: str, partition: int = 0) -> int:
    """The partition's log on ``node`` (its segment files): the bytes a move copies."""
    directory = cluster.broker(node).data_dir / f"{topic}-{partition}"
    return sum(f.stat().st_size for f in directory.glob("*.log"))


def put_throttles(admin_url: str, section: Mapping[str, Any], timeout: float = 10.0) -> dict[str, Any]:
    """``PUT /throttles`` on a Sluice: the whole ``[throttle]`` section, as ``sluice throttle set --file`` does."""
    req = urllib.request.Request(f"{admin_url}/throttles", data=json.dumps(section).encode(), method="PUT",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return dict(json.loads(resp.read()))


def clear_throttles(admin_url: str) -> None:
    put_throttles(admin_url, {"leader_rate_bytes": 0, "follower_rate_bytes": 0, "topics": [], "consumers": []})


def reassign(tools: JavaTools, bootstrap: str, topic: str, replicas: Sequence[int], work: Path, *,
             throttle: int | None = None) -> None:
    """``kafka-reassign-partitions --execute`` of partition 0 onto ``replicas``; with ``throttle`` Kafka's own
    replication throttle (bytes/s, leader and follower side, on the moving replicas: KIP-73's invocation)."""
    plan = work / f"reassign-{topic}.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": topic, "partition": 0, "replicas": list(replicas)}]}))
    args = ["--bootstrap-server", bootstrap, "--reassignment-json-file", str(plan), "--execute"]
    if throttle is not None:
        args += ["--throttle", str(throttle)]
    tools.run(REASSIGN, args, timeout=120)


def verify(tools: JavaTools, bootstrap: str, topic: str, replicas: Sequence[int], work: Path) -> str:
    """``--verify``: reports the move and, once it is complete, removes Kafka's throttle configs."""
    plan = work / f"reassign-{topic}.json"
    if not plan.exists():
        plan.write_text(json.dumps({"version": 1, "partitions": [
            {"topic": topic, "partition": 0, "replicas": list(replicas)}]}))
    args = ["--bootstrap-server", bootstrap, "--reassignment-json-file", str(plan), "--verify"]
    return tools.run(REASSIGN, args, timeout=120).stdout


def wait_in_sync(cluster: KafkaCluster, topic: str, node: int, timeout: float) -> float:
    """Poll until ``node`` is in partition 0's ISR (the move is done); the monotonic time it was seen."""
    deadline = time.monotonic() + timeout
    while True:
        states = cluster.partitions(topic)
        if states and node in states[0].isr:
            return time.monotonic()
        if time.monotonic() >= deadline:
            raise RigError(f"{topic}: broker {node} not in sync after {timeout:.0f}s: {states}")
        time.sleep(0.1)  # poll interval of the condition (the bench's resolution)
