"""Cooperative consumption behind a SASL listener: Sluice's upstream is the broker's SASL_PLAINTEXT listener, the
consumers (Kafka's Java client) log in through Sluice as bob, and Sluice's own requests - the broker list, the
slice groups' offsets and the group descriptions - log in with Sluice's own identity ([upstream.sasl],
SCRAM-SHA-512). Four consumers share a 2-partition topic: every record consumed once, each partition's records
in offset order (so each key's in the order produced), each key at one consumer, every consumer receives records,
and the group's committed offsets end at the partitions' end offsets."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from rig.java_tools import JavaTools
from rig.proxy_thread import ProxyThread
from rig.secure_broker import SASL_USERS, SecureBroker, create_scram_user
from tests.support.faults import wait_until
from tests.support.sharing import (
    Member,
    check_exactly_once,
    check_keys_at_one_consumer,
    java_member,
    produce,
    settled,
    wait_for_all,
)
from tests.support.topics import committed_offsets

pytestmark = pytest.mark.broker

PARTITIONS, CONSUMERS = 2, 4
SVC, SVC_PASSWORD = "sluice-share-svc", "svc-share-pw-7Qd"


@contextlib.contextmanager
def members_of(*members: Member) -> Iterator[list[Member]]:
    try:
        yield list(members)
    finally:
        for m in members:
            m.stop()


def test_sharing_behind_a_sasl_listener_with_sluices_own_login(secure_broker: SecureBroker,
                                                               java_tools: JavaTools) -> None:
    topic = f"share-sasl-{uuid.uuid4().hex[:8]}"
    group = f"g-{topic}"
    admin = AdminClient({"bootstrap.servers": secure_broker.plaintext, "log_level": 0})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    create_scram_user(secure_broker.plaintext, SVC, SVC_PASSWORD, ("SCRAM-SHA-512",))
    bob = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
           "sasl.jaas.config": f'org.apache.kafka.common.security.scram.ScramLoginModule required '
                               f'username="bob" password="{SASL_USERS["bob"]}";'}
    with ProxyThread(secure_broker.sasl_plaintext, **{
            "sharing.enabled": True, "sharing.topics": [{"topic": "share-sasl-*"}],
            "upstream.sasl.mechanism": "SCRAM-SHA-512", "upstream.sasl.username": SVC,
            "upstream.sasl.password": SVC_PASSWORD}) as sluice, \
            members_of(*(java_member(java_tools, sluice.bootstrap, topic, group, f"sasl-share-{i}", props=bob)
                         for i in range(CONSUMERS))) as members:
        assert sluice.proxy.router.upstream  # the brokers were learnt at start, through Sluice's own login
        settled(lambda: (sluice.total("sluice_sharing_partitions", group=group),
                         sluice.total("sluice_sharing_assignments_total")))
        assert sluice.total("sluice_sharing_partition_members", group=group) == CONSUMERS // PARTITIONS
        produced = produce(secure_broker.plaintext, topic, 800, keys=40, tag="sasl")
        wait_for_all(members, {v for _, v in produced})
        check_exactly_once(members, produced)
        check_keys_at_one_consumer(members)
        assert all(m.received for m in members), [len(m.received) for m in members]

        ends = {p: admin_end(secure_broker, topic, p) for p in range(PARTITIONS)}

        def committed() -> dict[int, int]:
            return committed_offsets(admin, group, topic, PARTITIONS)

        # the console consumers commit every 5 s; Sluice commits the group's stable offset, the slices' minimum
        wait_until(lambda: committed() == ends, 60, lambda: f"committed {committed()} to reach {ends}")
        assert sluice.total("sluice_sharing_group_calls_total", outcome="ok") > 0
        assert sluice.total("sluice_sharing_group_calls_total", outcome="failed") == 0


def admin_end(broker: SecureBroker, topic: str, partition: int) -> int:
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": broker.plaintext, "group.id": "end-offsets", "log_level": 0})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)[1])
    finally:
        consumer.close()
