"""Leader failover through Sluice on the session's 3-broker cluster (and multi-broker faults).

A topic with RF 3 and min.insync.replicas 2; an idempotent Java producer (VerifiableProducer, acks=all) and readers
of every kind (the Java console consumer in a group; kafka-python, confluent-kafka and aiokafka assigned to every
partition, each reading to the topic's end offsets) all through one Sluice. Mid-produce, the leader of the busiest
partition is killed -9; once the controller has moved its leaderships the produce goes on, then the broker is
restarted and rejoins every ISR. Outcome, from the clients' side: every acknowledged record consumed, in order per
partition, unchanged (the assigned readers exactly once; the group member at least once, a redelivery being the very
record at that offset); the Java clients only ever connected to Sluice's ports.

Then the errors a client gets after such a move, straight from the broker and through Sluice, on the same requests:
a Produce sent to a follower gets NOT_LEADER_OR_FOLLOWER with the current leader (KIP-951 NodeEndpoints, rewritten to
Sluice's port for that leader, never the broker's address); a Fetch naming an older leader epoch FENCED_LEADER_EPOCH,
a newer one UNKNOWN_LEADER_EPOCH (a consumer's Fetch v11+ to a follower is served there, KIP-392, so the follower
case is a Produce): Sluice passes Kafka's errors on as Kafka sends them.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from proxy.wire.messages import request_codec
from proxy.wire.model import Message
from proxy.wire.records import Record, encode_batch, new_batch
from rig.cluster import KafkaCluster, PartitionState
from rig.java_tools import CONSOLE_CONSUMER, JavaTools
from rig.kafka import end_offsets
from rig.raw import RawClient
from rig.sluice_process import SluiceProcess
from tests.clients.test_sessions_clients import LineReader
from tests.support.cluster_checks import (
    VERIFIABLE_PRODUCER,
    Reader,
    acked_records,
    check_at_least_once_in_order,
    check_exactly,
    remote_ports,
    sluice_node_ports,
)

pytestmark = pytest.mark.broker

PARTITIONS = 3
TOTAL = 3000  # records, produced at RATE/s: the kill lands mid-produce
RATE = 250
NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH = 6, 74, 75
FETCH_VERSION = 17  # the Java consumer's (KIP-951 NodeEndpoints from v16)
PRODUCE_VERSION = 11  # topics by name; KIP-951 NodeEndpoints from v10


@pytest.fixture(scope="module")
def sluice(kafka_cluster: KafkaCluster) -> Any:
    """Sluice in front of the whole cluster for clients, a free port per broker node."""
    with SluiceProcess(kafka_cluster.bootstrap, extra_env={"SLUICE_LISTEN__BROKER_PORT_BASE": "0"}) as proc:
        yield proc


def _acked_count(lines: list[str]) -> int:
    return sum('"producer_send_success"' in ln for ln in lines)


def test_leader_kill9_and_restart_every_client_follows(kafka_cluster: KafkaCluster, sluice: SluiceProcess,
                                                       java_tools: JavaTools, unique_topic: str,
                                                       tmp_path: Path) -> None:
    topic = unique_topic
    java_tools.create_topic(sluice.bootstrap, topic, partitions=PARTITIONS, replication_factor=3,
                            config={"min.insync.replicas": 2})
    kafka_cluster.wait_partitions(topic, lambda s: len(s) == PARTITIONS and all(len(p.isr) == 3 for p in s),
                                  what="every ISR full")
    readers = [Reader(kind, sluice.bootstrap, topic, PARTITIONS) for kind in Reader.KINDS]
    # No --max-messages: a group member may be handed records again after a rebalance, so a count could stop it
    # before the last record; it reads until it has shown every record acknowledged (below), and exits by itself
    # only on an error or after 120 s without a record, which the test counts as a failure.
    consumer = java_tools.spawn(CONSOLE_CONSUMER, [
        "--bootstrap-server", sluice.bootstrap, "--topic", topic, "--from-beginning", "--group", f"g-{topic}",
        "--timeout-ms", "120000",
        "--property", "print.partition=true", "--property", "print.offset=true",
        "--consumer-property", "client.id=sluice-test-failover-java", "--consumer-property", "fetch.max.wait.ms=200",
    ])  # fmt: skip
    config = tmp_path / "producer.properties"
    # VerifiableProducer sets retries=0 unless told otherwise; an idempotent producer needs them (and keeps the
    # order per partition across retries with up to 5 requests in flight).
    config.write_text("enable.idempotence=true\nretries=2147483647\nlinger.ms=5\ndelivery.timeout.ms=120000\n"
                      "client.id=sluice-test-failover-producer\n")
    producer = java_tools.spawn(VERIFIABLE_PRODUCER, [
        "--bootstrap-server", sluice.bootstrap, "--topic", topic, "--max-messages", str(TOTAL),
        "--throughput", str(RATE), "--acks", "-1", "--value-prefix", "1", "--producer.config", str(config),
    ])  # fmt: skip
    out, perr = LineReader(producer.stdout), LineReader(consumer.stdout)
    cerr, producer_err = LineReader(consumer.stderr), LineReader(producer.stderr)

    def acked(n: int, within: float, what: str) -> None:
        deadline = time.monotonic() + within
        while _acked_count(out.lines) < n:
            # the producer's output read to its end, not its exit: on a loaded machine the reader thread can be
            # hundreds of lines behind a producer that has sent everything and exited
            assert time.monotonic() < deadline and not out.ended, (
                f"{what}: {_acked_count(out.lines)} of {n} acknowledged; producer exit {producer.poll()}, "
                f"stdout {out.lines[-3:]}, stderr {producer_err.lines[-10:]}")
            out.wait_for(len(out.lines) + 1, 0.5)

    victim = -1
    try:
        acked(TOTAL // 3, 90, "a third")
        busiest = Counter(p for p, _, _ in acked_records(out.lines)[0]).most_common(1)[0][0]
        victim = next(s.leader for s in kafka_cluster.partitions(topic) if s.partition == busiest)
        peers = [n for n in kafka_cluster.node_ids if n != victim]
        java_ports_before = remote_ports(producer.pid) | remote_ports(consumer.pid)
        kafka_cluster.broker(victim).kill()
        moved = kafka_cluster.wait_partitions(
            topic, lambda s: all(p.leader in peers for p in s), timeout=60, what=f"leaders off broker {victim}")
        assert all(victim not in p.isr for p in moved), moved
        acked(2 * TOTAL // 3, 90, "two thirds, with a broker down")
        kafka_cluster.broker(victim).start()
        kafka_cluster.wait_partitions(topic, lambda s: all(len(p.isr) == 3 for p in s), timeout=90,
                                      what=f"broker {victim} back in every ISR")
        assert producer.wait(120) == 0, "the verifiable producer failed"
        java_ports_after = remote_ports(consumer.pid) if consumer.poll() is None else set()
    finally:
        if victim > 0 and not kafka_cluster.broker(victim).is_running:
            kafka_cluster.broker(victim).start()  # the next test gets its cluster back
        if producer.poll() is None:
            producer.kill()
    records, errors = acked_records(out.drain(30))
    assert not errors, f"sends that failed: {errors[:3]}"
    assert len(records) == TOTAL, f"{len(records)} of {TOTAL} acknowledged"
    ends = end_offsets(kafka_cluster.bootstrap, topic)
    got = {r.kind: r.join(120, ends) for r in readers}
    # The group member: until it has shown every acknowledged record (by partition and offset), bounded; still
    # running then (an error or its idle timeout would have ended it), so it is stopped, not waited for.
    wanted = {(p, o) for p, o, _ in records}
    deadline = time.monotonic() + 120
    while not wanted <= {(p, o) for p, o, _ in _console_records(perr.lines)} and time.monotonic() < deadline:
        perr.wait_for(len(perr.lines) + 1, 1.0)
    exited = consumer.poll()
    consumer.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        consumer.wait(10)
    if consumer.poll() is None:
        consumer.kill()
    java = _console_records(perr.drain(10))
    for kind, consumed in got.items():
        check_exactly(consumed, records, kind, PARTITIONS)
    check_at_least_once_in_order(java, records, "Java console consumer (group)", PARTITIONS)
    assert exited is None, f"the Java console consumer exited ({exited}) before it had every record"
    # The Java clients connected only to Sluice (its bootstrap and per-broker ports), never to a broker directly.
    brokers = {b.port for b in kafka_cluster.brokers}
    seen = java_ports_before | java_ports_after
    assert seen and not seen & brokers, f"Java clients connected to brokers directly: {seen & brokers}"
    logged = [ln for ln in cerr.drain(5) if "ERROR" in ln]
    assert not logged, f"the Java console consumer logged errors: {logged[:5]}"


def _console_records(lines: list[str]) -> list[tuple[int, int, str]]:
    """The records among ConsoleConsumer's lines: "Partition:P\tOffset:O\tVALUE" (DefaultMessageFormatter with
    print.partition and print.offset)."""
    out = []
    for line in lines:
        if line.startswith("Partition:"):
            part, off, value = line.split("\t")
            out.append((int(part.removeprefix("Partition:")), int(off.removeprefix("Offset:")), value))
    return out


def _fetch(port: int, topic_id: bytes, epoch: int) -> tuple[int, int, list[tuple[int, int]]]:
    """A consumer's Fetch of partition 0 naming ``epoch`` as the leader epoch it knows: (error, leader, endpoints)."""
    body = request_codec(1, FETCH_VERSION).default().replace(
        max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
        topics=[Message(topic_id=topic_id, partitions=[Message(
            partition=0, current_leader_epoch=epoch, fetch_offset=0, last_fetched_epoch=-1,
            log_start_offset=-1, partition_max_bytes=1 << 20)])],
    )  # fmt: skip
    with RawClient("127.0.0.1", port, client_id="sluice-test-errors") as client:
        resp = client.request(1, FETCH_VERSION, body)
    p = resp.responses[0].partitions[0]
    return p.error_code, p.current_leader.leader_id, [(n.node_id, n.port) for n in resp.node_endpoints]


def _produce(port: int, topic: str) -> tuple[int, int, list[tuple[int, int]]]:
    """An acks=all Produce of one record to partition 0: (error, leader, endpoints)."""
    batch = encode_batch(new_batch([Record(value=b"to-a-follower")]))
    body = request_codec(0, PRODUCE_VERSION).default().replace(
        transactional_id=None, acks=-1, timeout_ms=10_000,
        topic_data=[Message(name=topic, partition_data=[Message(index=0, records=batch)])],
    )
    with RawClient("127.0.0.1", port, client_id="sluice-test-errors") as client:
        resp = client.request(0, PRODUCE_VERSION, body)
    p = resp.responses[0].partition_responses[0]
    return p.error_code, p.current_leader.leader_id, [(n.node_id, n.port) for n in resp.node_endpoints]


def test_not_leader_and_fencing_errors_as_kafka_sends_them(kafka_cluster: KafkaCluster, sluice: SluiceProcess,
                                                          java_tools: JavaTools, unique_topic: str) -> None:
    java_tools.create_topic(sluice.bootstrap, unique_topic, partitions=1, replication_factor=3)
    (state,) = kafka_cluster.wait_partitions(unique_topic, lambda s: len(s) == 1 and len(s[0].isr) == 3)
    # A leader election, so the partition has an older epoch to be fenced with.
    state = _elect_another(kafka_cluster, unique_topic, state)
    leader, follower = state.leader, next(n for n in state.isr if n != state.leader)
    with RawClient("127.0.0.1", kafka_cluster.broker(leader).port) as raw:
        topic_id = raw.topic_ids([unique_topic])[unique_topic]
    ports = sluice_node_ports(sluice)
    cases: dict[str, tuple[Callable[[int], tuple[int, int, list[tuple[int, int]]]], int, int]] = {
        # what is sent -> (the request, to which node, the error Kafka answers)
        "a produce to a follower": (lambda port: _produce(port, unique_topic), follower, NOT_LEADER_OR_FOLLOWER),
        "a fetch with an older epoch": (lambda port: _fetch(port, topic_id, state.leader_epoch - 1), leader,
                                        FENCED_LEADER_EPOCH),
        "a fetch with a newer epoch": (lambda port: _fetch(port, topic_id, state.leader_epoch + 1), leader,
                                       UNKNOWN_LEADER_EPOCH),
    }
    for what, (send, node, error) in cases.items():
        direct = send(kafka_cluster.broker(node).port)
        proxied = send(ports[node])
        assert direct[0] == error, f"{what}: the broker answered {direct}"
        assert proxied[:2] == direct[:2], f"{what}: through Sluice {proxied}, directly {direct}"
        # KIP-951: the leader's endpoint as Kafka sends it, at Sluice's port for that leader
        assert [n for n, _ in proxied[2]] == [n for n, _ in direct[2]], (what, proxied, direct)
        assert all(port == ports[n] for n, port in proxied[2]), f"{what}: a broker address leaked: {proxied}"
    # the follower's answer names the new leader, at Sluice's port
    assert _produce(ports[follower], unique_topic)[1:] == (leader, [(leader, ports[leader])])


def _elect_another(cluster: KafkaCluster, topic: str, state: PartitionState) -> PartitionState:
    """Stop the leader (controlled shutdown moves its leadership), start it again: the epoch goes up."""
    old = state.leader
    cluster.broker(old).stop()
    try:
        cluster.wait_partitions(topic, lambda s: s[0].leader not in (old, -1), what="leadership moved")
    finally:
        cluster.broker(old).start()
    (new,) = cluster.wait_partitions(topic, lambda s: len(s[0].isr) == 3, timeout=90, what="ISR full again")
    assert new.leader_epoch > state.leader_epoch
    return new
