"""Cooperative consumption on a locked-down cluster (conftest ``locked_broker``: the authorizer on, nothing allowed
without an ACL, SASL/SCRAM over TLS). Sluice's upstream is the broker's SASL_SSL listener; the consumers (Kafka's
Java client) log in through Sluice as bob; Sluice's own requests - the broker list, the topic names of Fetch v13+,
the slice groups' offsets and the group descriptions - and its access log to Kafka log in as ``sluice``, granted
exactly the README's ``instance`` ACLs (proxy/kafka_acls.py). Four consumers share a 2-partition topic: every
record consumed once, each partition's records in offset order (so each key's in the order produced), each key at
one consumer, every consumer receives records, the group's committed offsets end at the partitions' end offsets,
the access-log topic gets the requests, and no call of Sluice's was refused. And the grant a consumer group usually
gets, the group by its literal name, given to Sluice instead: its slice groups refused, the group is consumed
unshared (classic and KIP-848 groups; Java consumers, and franz-go's in a classic group), and the missing prefix
grant is named."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from structlog.testing import capture_logs

from proxy.kafka_acls import Grant, acl_command, grants
from proxy.policies.sharing.access import RECHECK_S
from proxy.server import Proxy
from rig.java_tools import JavaTools
from rig.kafka import end_offsets
from rig.proxy_thread import ProxyThread
from rig.raw import RawClient
from rig.secure_broker import LOCKED_USERS, SecureBroker, allow, scram_client
from tests.support.faults import wait_until
from tests.support.sharing import (
    Member,
    check_exactly_once,
    check_keys_at_one_consumer,
    java_member,
    members_of,
    produce,
    python_member,
    settled,
    stable_members,
    wait_for_all,
)
from tests.support.topics import committed_offsets

pytestmark = pytest.mark.broker

PARTITIONS, CONSUMERS = 2, 4
SVC = "sluice"
#: the consumers' login through Sluice (the application's principal, not Sluice's)
BOB = scram_client("bob", java=True)


def locked_sluice(broker: SecureBroker, topics: str, **settings: object) -> ProxyThread:
    """A sharing Sluice in front of ``broker``'s SASL_SSL listener, logged in as ``sluice``, sharing ``topics``."""
    return ProxyThread(broker.sasl_ssl, **{"sharing.enabled": True, "sharing.topics": [{"topic": topics}],
                                           **broker.sluice_login(SVC), **settings})


def test_sharing_on_a_locked_cluster_with_sluices_documented_acls(locked_broker: SecureBroker,
                                                                   java_tools: JavaTools) -> None:
    topic = f"share-sasl-{uuid.uuid4().hex[:8]}"
    group, access_log = f"g-{topic}", f"access-{topic}"
    admin = AdminClient({"bootstrap.servers": locked_broker.plaintext, "log_level": 0})
    for name, partitions in ((topic, PARTITIONS), (access_log, 1)):
        admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
    allow(locked_broker.plaintext, f"User:{SVC}", grants(["instance"], {
        "topic": topic, "group": group, "shared_topic": topic, "access_log_topic": access_log}))
    # the application's own ACLs (its operators', not Sluice's): consume the topic in its group
    allow(locked_broker.plaintext, "User:bob", [Grant("Topic", topic, "literal", "Read"),
                                                Grant("Group", group, "literal", "Read")])
    tls = {"security.protocol": "SASL_SSL", "ssl.ca.location": str(locked_broker.ca.cert),
           "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": SVC, "sasl.password": LOCKED_USERS[SVC]}
    with capture_logs() as events, locked_sluice(locked_broker, "share-sasl-*", **{
            "logging.access_log_kafka.enabled": True, "logging.access_log_kafka.topic": access_log,
            "logging.access_log_kafka.properties": tls}) as sluice, \
            members_of(*(java_member(java_tools, sluice.bootstrap, topic, group, f"sasl-share-{i}", props=BOB)
                         for i in range(CONSUMERS))) as members:
        assert sluice.proxy.router.upstream  # the brokers were learnt at start, through Sluice's own login
        settled(lambda: (sluice.total("sluice_sharing_partitions", group=group),
                         sluice.total("sluice_sharing_assignments_total")))
        assert sluice.total("sluice_sharing_partition_members", group=group) == CONSUMERS // PARTITIONS
        produced = produce(locked_broker.plaintext, topic, 800, keys=40, tag="sasl")
        wait_for_all(members, {v for _, v in produced})
        check_exactly_once(members, produced)
        check_keys_at_one_consumer(members)
        assert all(m.received for m in members), [len(m.received) for m in members]

        ends = {p: admin_end(locked_broker, topic, p) for p in range(PARTITIONS)}

        def committed() -> dict[int, int]:
            return committed_offsets(admin, group, topic, PARTITIONS)

        # the console consumers commit every 5 s; Sluice commits the group's stable offset, the slices' minimum
        wait_until(lambda: committed() == ends, 60, lambda: f"committed {committed()} to reach {ends}")
        assert sluice.total("sluice_sharing_group_calls_total", outcome="ok") > 0
        assert sluice.total("sluice_sharing_group_calls_total", outcome="failed") == 0
        # A Fetch v13+ names topics by id; Sluice looks up an id no Metadata response named (a replica fetcher's):
        # here one of a topic no client read through it, as such a fetch makes it
        with RawClient(locked_broker.broker.host, locked_broker.broker.port) as direct:  # to the broker, a super user
            unseen = direct.topic_ids([access_log])[access_log]
        resolved = sluice.total("sluice_topic_name_lookups_total", outcome="resolved")
        assert sluice.call(_name_of(sluice.proxy, unseen)) == access_log
        assert sluice.total("sluice_topic_name_lookups_total", outcome="resolved") == resolved + 1
        sluice.proxy.access_log.flush()
        wait_until(lambda: end_offsets(locked_broker.plaintext, access_log)[0] > 0, 30, "the access log in Kafka")
    refused = [e for e in events if e["event"] in ("kafka_not_authorized", "group_call_failed", "topic_lookup_failed",
                                                   "access_log_kafka_delivery_failed", "access_log_kafka_error")]
    assert not refused, refused


def member(client: str, tools: JavaTools, bootstrap: str, topic: str, group: str, client_id: str,
           protocol: str) -> Member:
    """A consumer of ``group`` logged in as bob through Sluice: Kafka's Java client, or franz-go (classic only)."""
    if client == "java":
        return java_member(tools, bootstrap, topic, group, client_id, props=BOB, protocol=protocol)
    assert protocol == "classic"  # rig/go/consumer speaks the classic protocol
    return python_member(client, bootstrap, topic, group, client_id, sasl=("bob", LOCKED_USERS["bob"]))


@pytest.mark.parametrize("client, protocol", [("java", "classic"), ("java", "consumer"), ("franz-go", "classic")])
def test_a_group_whose_slice_groups_sluice_may_not_use_is_consumed_unshared(locked_broker: SecureBroker,
                                                                             java_tools: JavaTools,
                                                                             client: str, protocol: str) -> None:
    """Sluice's principal granted the group by its literal name, the grant a consumer group usually gets, instead of the
    prefix the ACL table asks for: every slice group is refused. The group is consumed as without Sluice (two of
    the four consumers get a partition each; every record once, in order; its commits the group's own, reaching
    the partitions' ends), both protocols (and franz-go, the newest versions first, in a classic group), and what
    is missing is said: the prefix grant. Before, the classic consumers' OffsetFetch was told to retry for as
    long as the grant was missing, and they consumed nothing. Once the grant is added, the group is shared within
    RECHECK_S, with nothing consumed before coming again."""
    topic = f"share-lit-{uuid.uuid4().hex[:8]}"
    group = f"g-{topic}"
    admin = AdminClient({"bootstrap.servers": locked_broker.plaintext, "log_level": 0})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    documented = grants(["instance"], {"topic": topic, "group": group, "shared_topic": topic,
                                       "access_log_topic": topic})
    literal = [Grant(g.resource, g.name, "literal", g.operation) for g in documented if g.name in (topic, group)]
    assert any(g.resource == "Group" and g.name == group for g in literal)
    allow(locked_broker.plaintext, f"User:{SVC}", literal)
    allow(locked_broker.plaintext, "User:bob", [Grant("Topic", topic, "literal", "Read"),
                                                Grant("Group", group, "literal", "Read")])
    with capture_logs() as events, locked_sluice(locked_broker, "share-lit-*") as sluice, \
            members_of(*(member(client, java_tools, sluice.bootstrap, topic, group, f"lit-{client}-{protocol}-{i}",
                                protocol) for i in range(CONSUMERS))) as members:
        settled(lambda: (stable_members(admin, group) == CONSUMERS, 0))
        produced = produce(locked_broker.plaintext, topic, 400, keys=40, tag="literal")
        wait_for_all(members, {v for _, v in produced})
        check_exactly_once(members, produced)
        assert sum(1 for m in members if m.received) == PARTITIONS  # a partition each: not shared
        assert sluice.total("sluice_sharing_assignments_total") == 0
        assert sluice.total("sluice_sharing_not_shared_total", reason="slice_groups_refused") >= 1
        ends = {p: admin_end(locked_broker, topic, p) for p in range(PARTITIONS)}

        def committed() -> dict[int, int]:
            return committed_offsets(admin, group, topic, PARTITIONS)

        wait_until(lambda: committed() == ends, 60, lambda: f"committed {committed()} to reach {ends}")
        # The prefix grant added: at a heartbeat RECHECK_S later Sluice finds it, and the group is shared (classic:
        # its members rejoin; KIP-848: marked again, the layout hands the slices)
        allow(locked_broker.plaintext, f"User:{SVC}", [g for g in documented if g.resource == "Group"])
        settled(lambda: (sluice.total("sluice_sharing_partitions", group=group),
                         sluice.total("sluice_sharing_assignments_total")), timeout=RECHECK_S + 90)
        assert sluice.total("sluice_sharing_partition_members", group=group) == CONSUMERS // PARTITIONS
        more = produce(locked_broker.plaintext, topic, 400, keys=40, tag="granted")
        wait_for_all(members, {v for _, v in more})
        check_exactly_once(members, produced + more)  # nothing consumed before the grant came again
        assert all(m.received for m in members)
    said = [e for e in events if e["event"] == "sharing_slice_groups_refused"]
    assert said and all(e["group"] == group for e in said)
    missing = [e for e in events if e["event"] == "kafka_not_authorized"]
    assert [e["grant"] for e in missing] == [acl_command(f"User:{SVC}", "Group", group, ("Read", "Describe"),
                                                         "prefixed")]


async def _name_of(proxy: Proxy, topic_id: bytes) -> str | None:
    settled = asyncio.Event()
    proxy.names.wait([topic_id], settled.set)
    await asyncio.wait_for(settled.wait(), 30)
    return proxy.names.get(topic_id)


def admin_end(broker: SecureBroker, topic: str, partition: int) -> int:
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": broker.plaintext, "group.id": "end-offsets", "log_level": 0})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)[1])
    finally:
        consumer.close()
