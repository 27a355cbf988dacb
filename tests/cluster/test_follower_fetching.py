"""Consumers fetching from the closest replica (KIP-392) through Sluice, on the session's 3-broker cluster, each
broker a rack of its own with Kafka's rack-aware replica selector (tests/cluster/conftest.py).

A consumer that names its rack (client.rack) sends it in each Fetch (RackId, v11+); the partition's leader answers
with the in-sync replica of that rack to read from (PreferredReadReplica) and no records, and the consumer fetches
from that broker from then on, at the address the cluster's metadata gives for it: Sluice's listener for that
node. What a cloud deployment saves (no cross-zone reads) holds only if Sluice passes the redirection on and serves
the follower's listener, with every policy that rebuilds Fetch responses on: Sluice terminating fetch sessions and
byte budgets. One consumer of each kind, each in the rack of a follower that leads none of the topic's partitions:
without fetch sessions (confluent-kafka/librdkafka, aiokafka), with them (the Java consumer, kafka-python), newest
versions first (franz-go). Each must get every record once, in order; and every record byte each received came from
the follower (the access log names the broker that served each Fetch)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rig.cluster import KafkaCluster, rack_of
from rig.java_tools import JavaTools
from rig.proxy_thread import ProxyThread
from rig.topics import create_topic
from tests.support.sharing import (
    check_exactly_once,
    java_member,
    members_of,
    produce_one_per_batch,
    python_member,
    wait_for_all,
)
from tests.support.topics import wait_group_coordinator

pytestmark = pytest.mark.broker

PARTITIONS = 2
RECORDS = 200
SLUICE = {
    "sessions.mode": "terminate",
    "size_limit.budgets": [{"client_id": "rack-*", "fetch_max_bytes": 4096, "partition_max_bytes": 1024}],
}
PYTHON_CLIENTS = ("confluent", "aiokafka", "kafka-python")


def test_consumers_naming_their_rack_read_from_its_follower_through_sluice(
        kafka_cluster: KafkaCluster, java_tools: JavaTools, unique_topic: str, tmp_path: Path) -> None:
    topic = unique_topic
    create_topic(kafka_cluster.bootstrap, topic, partitions=PARTITIONS, replication_factor=3)
    states = kafka_cluster.wait_partitions(topic, lambda s: len(s) == PARTITIONS and all(len(p.isr) == 3 for p in s),
                                           what="every ISR full")
    # a broker leading none of the topic's partitions (3 brokers, 2 leaders): a follower of both
    follower = min(set(kafka_cluster.node_ids) - {s.leader for s in states})
    rack = rack_of(follower)
    # a low-rate topic's shape: a record per batch, every codec; acknowledged by every replica (acks=all)
    produced = produce_one_per_batch(kafka_cluster.bootstrap, topic, RECORDS, keys=20, tag="rack")
    access = tmp_path / "access.jsonl"
    with ProxyThread(kafka_cluster.bootstrap, **SLUICE, **{"logging.access_log": str(access)}) as sluice:
        group = f"g-{topic}"
        wait_group_coordinator(kafka_cluster.bootstrap, f"{group}-confluent")  # librdkafka's, in assign mode
        with members_of(
                *(python_member(client, sluice.bootstrap, topic, f"{group}-{client}", f"rack-{client}",
                                assign=PARTITIONS, rack=rack) for client in PYTHON_CLIENTS),
                python_member("franz-go", sluice.bootstrap, topic, f"{group}-franz", "rack-franz-go", rack=rack),
                java_member(java_tools, sluice.bootstrap, topic, f"{group}-java", "rack-java",
                            props={"client.rack": rack})) as members:
            for m in members:
                wait_for_all([m], {v for _, v in produced})
                check_exactly_once([m], produced)
        sluice.proxy.access_log.flush()
    # Which broker served the record bytes each consumer received: Sluice's access log, per Fetch
    served: dict[str, dict[str, int]] = {m.client_id: {} for m in members}
    for line in map(json.loads, access.read_text().splitlines()):
        if line["api"] == "Fetch" and line["client_id"] in served:
            record_bytes = sum(p["bytes"] for p in line.get("partitions", ()) if p["topic"] == topic)
            if record_bytes:
                by_broker = served[line["client_id"]]
                by_broker[line["upstream"]] = by_broker.get(line["upstream"], 0) + record_bytes
    follower_address = kafka_cluster.broker(follower).bootstrap
    assert all(list(by_broker) == [follower_address] for by_broker in served.values()), \
        f"record bytes by the broker that served them (the follower in the consumers' rack: {follower_address}): " \
        f"{served}"
