"""Every fetch policy at once on a locked-down cluster (conftest ``locked_broker``: the authorizer on, nothing allowed
without an ACL, SASL/SCRAM). The consumers log in through Sluice as bob (their SASL login passes through it: the
broker authorizes bob), granted one topic and their groups; Sluice owns the fetch sessions on both sides (KIP-227
terminate), holds each fetch to a small KIP-74 budget, throttles the topic (KIP-73) and meters bob under a client
quota, and logs in as ``sluice`` for its own requests (the topic names of Fetch v13+), with the ACLs
proxy/kafka_acls.py documents. A low-rate topic's shape: one record per batch, every codec. Both kinds of consumer,
the Java client and kafka-python (fetch sessions), librdkafka and aiokafka (none), and franz-go (a session too, the
newest versions first): every record once, in order, unchanged. Then bob's Read of the topic is revoked while they
wait for more, caught up: each is told TOPIC_AUTHORIZATION_FAILED, the error Kafka defines (the Java client's
TopicAuthorizationException), through Sluice's own sessions upstream and the ones it serves the clients, instead of
being left fetching nothing. And KIP-932 share consumers under the same policies, bob granted the topic and the share
group only: every record once."""

from __future__ import annotations

import functools
import time
import uuid
from collections import defaultdict

import pytest
from confluent_kafka import Consumer, KafkaError
from confluent_kafka.admin import AdminClient, NewTopic

from proxy.kafka_acls import Grant, grants
from rig.java_tools import JavaTools
from rig.proxy_thread import ProxyThread
from rig.secure_broker import LOCKED_USERS, SecureBroker, allow, revoke, scram_client
from tests.clients.test_share_policies import consume_all
from tests.support.faults import wait_until
from tests.support.sharing import (
    Member,
    check_exactly_once,
    java_member,
    members_of,
    produce_one_per_batch,
    python_member,
    wait_for_all,
)

pytestmark = pytest.mark.broker

PARTITIONS, RECORDS = 3, 240
#: the consumers run by rig.group_consumer (and rig/go/consumer), each in a group of its own: franz-go (its own fetch
#: session, the newest versions first), kafka-python (a session) and aiokafka (none)
PYTHON_RUN = ("franz-go", "kafka-python", "aiokafka")
#: bounds of the consumers' waits, far above what the policies' rates make them take (~30 kB at ~30 kB/s)
READ_S, TOLD_S = 90.0, 60.0


def locked_sluice(broker: SecureBroker, topic: str) -> ProxyThread:
    """Sluice in front of the broker's SASL_SSL listener, logged in as ``sluice``, with every fetch policy on:
    terminated sessions, a 4 KiB budget, ``topic`` throttled, bob's fetches under a quota."""
    return ProxyThread(broker.sasl_ssl, **{
        **broker.sluice_login(), "sessions.mode": "terminate",
        "size_limit.budgets": [{"client_id": "*", "fetch_max_bytes": 4096}],
        "throttle.leader_rate_bytes": 40_000, "throttle.topics": [{"topic": topic}],
        "throttle.consumers": [{"client_id": "*"}],
        "quota.entries": [{"name": "bob", "principal": "bob", "fetch_rate_bytes": 30_000}]})


def locked_topic(broker: SecureBroker, prefix: str, groups: list[str] | None = None) -> str:
    """A new topic, Sluice's documented ACLs on it, and bob's: Read on it and on ``groups`` (named after it)."""
    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.plaintext, "log_level": 0})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    allow(broker.plaintext, "User:sluice", grants(["instance"], {
        "topic": topic, "group": topic, "shared_topic": topic, "access_log_topic": topic}))
    allow(broker.plaintext, "User:bob", [Grant("Topic", topic, "literal", "Read"),
                                         *(Grant("Group", f"{g}-{topic}", "literal", "Read") for g in groups or [])])
    return topic


def stopped(member: Member) -> bool:
    return member.proc.poll() is not None


def test_every_policy_on_a_locked_cluster_delivers_everything_and_says_what_kafka_refuses(
        locked_broker: SecureBroker, java_tools: JavaTools) -> None:
    topic = locked_topic(locked_broker, "locked-all", ["java", "rd", *PYTHON_RUN])
    java_group, rd_group = f"java-{topic}", f"rd-{topic}"
    produced = produce_one_per_batch(locked_broker.plaintext, topic, RECORDS, keys=24, tag="locked")
    with locked_sluice(locked_broker, topic) as sluice, \
            members_of(java_member(java_tools, sluice.bootstrap, topic, java_group, "locked-java",
                                   props=scram_client("bob", java=True)),
                       *(python_member(client, sluice.bootstrap, topic, f"{client}-{topic}", f"locked-{client}",
                                       sasl=("bob", LOCKED_USERS["bob"])) for client in PYTHON_RUN)) as members:
        java, franz, *pythons = members
        rd = Consumer({"bootstrap.servers": sluice.bootstrap, "group.id": rd_group, "client.id": "locked-rdkafka",
                       "auto.offset.reset": "earliest", "log_level": 0, **scram_client("bob")})
        try:
            rd.subscribe([topic])
            got: dict[int, list[tuple[int, str, str]]] = defaultdict(list)
            deadline = time.monotonic() + READ_S
            while sum(map(len, got.values())) < RECORDS and time.monotonic() < deadline:
                m = rd.poll(0.5)
                if m is None:
                    continue
                assert m.error() is None, m.error()
                key, value, partition, offset = m.key(), m.value(), m.partition(), m.offset()
                assert key is not None and value is not None and partition is not None and offset is not None
                got[partition].append((offset, key.decode(), value.decode()))
            received = [(k, v) for records in got.values() for _, k, v in records]
            assert sorted(received) == sorted(produced), "librdkafka: records missing, repeated or changed"
            for records in got.values():
                assert [o for o, _, _ in records] == sorted({o for o, _, _ in records})  # in offset order
            for member in members:  # each its own group: each gets every record
                wait_for_all([member], {v for _, v in produced})
                check_exactly_once([member], produced)
            # the policies had their hand on these fetches (the budget is the requests' max_bytes, which the broker
            # keeps to, so it changes no response and has no count of its own here)
            assert sluice.total("sluice_upstream_fetch_requests_total", kind="incremental") > 0  # terminate
            assert sluice.total("sluice_throttle_bytes_total") > 0
            assert sluice.total("sluice_quota_bytes_total") > 0

            revoke(locked_broker.plaintext, "User:bob", [Grant("Topic", topic, "literal", "Read")])
            told: list[KafkaError] = []

            def rd_told() -> bool:
                m = rd.poll(0.5)
                if m is not None:
                    error = m.error()
                    assert error is not None, f"a record after the revocation: {m.value()!r}"
                    told.append(error)
                return any(e.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED for e in told)

            wait_until(rd_told, TOLD_S, lambda: f"librdkafka to be told TOPIC_AUTHORIZATION_FAILED (told {told})")
            wait_until(lambda: any("TOPIC_AUTHORIZATION_FAILED" in e.get("fetch_error", "") for e in franz.reported()),
                       TOLD_S, lambda: f"franz-go to be told TOPIC_AUTHORIZATION_FAILED (said {franz.reported()[-3:]})")
            # the Java client, kafka-python and aiokafka raise it from poll: each consumer stops with it
            for member, raised in ((java, "TopicAuthorizationException"),
                                   *((m, "TopicAuthorizationFailedError") for m in pythons)):
                wait_until(functools.partial(stopped, member), TOLD_S, f"{member.client_id} to stop on {raised}")
                assert raised in member.stderr_text(400), member.stderr_text()
        finally:
            rd.close()


def test_share_consumers_on_a_locked_cluster_under_their_principals_quota_get_every_record_once(
        locked_broker: SecureBroker, java_tools: JavaTools) -> None:
    """KIP-932 share consumers (Kafka's console share consumer) logging in through Sluice as bob, granted the topic
    and the share group only, their ShareFetch budgeted, throttled and held by the quota on their principal: every
    record of a low-rate topic once (none acquired twice: no lock lapsed while Sluice held a response)."""
    topic = locked_topic(locked_broker, "locked-share", ["share"])
    group = f"share-{topic}"
    java_tools.share_group_from_earliest(locked_broker.plaintext, group)
    produced = produce_one_per_batch(locked_broker.plaintext, topic, RECORDS, keys=24, tag="shared")
    with locked_sluice(locked_broker, topic) as sluice:
        got = consume_all(java_tools, sluice.bootstrap, topic, group, {v for _, v in produced}, within=READ_S,
                          props=scram_client("bob", java=True))
        metered = sluice.total("sluice_quota_bytes_total", entry="bob", kind="fetch")
        throttled = sluice.total("sluice_throttle_bytes_total")
    assert sorted(got) == sorted(v for _, v in produced), f"{len(got)} delivered for {len(produced)} records"
    assert metered > 0 and throttled > 0
