"""Cooperative consumption (proxy/policies/sharing/) with real clients against the real broker: the
Java client (Kafka's console consumer), confluent-kafka, kafka-python and aiokafka, 6 consumers of a 3-partition
topic, each with its own Sluice and all through one Sluice; a consumer killed with -9; every Sluice killed and
restarted; a member without Sluice; KIP-848 groups (group.protocol=consumer); two consumers with one client.id;
standalone consumers (assign()), on a compacted topic too; transactions; members whose application takes its time
over an assignment.

Everything is judged from the clients' side (tests/support/sharing.py): every consumer receives records; together
they receive every record exactly once, unchanged; each consumer gets each partition's records in offset order;
while the group does not change, each key's records go to one consumer. After a kill -9, nothing is lost and no
record the killed consumer had committed is delivered again (records it had not committed may be: at least once).
"""

from __future__ import annotations

import contextlib
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from proxy.fleet.topics import read_to_end
from proxy.policies.sharing.frontier import slice_group
from proxy.policies.sharing.keys import key_hash, positive_hash, slice_of
from proxy.policies.sharing.policy import Sharing
from proxy.wire.messages import request_codec
from proxy.wire.model import Message
from rig.java_tools import CONFIG_COMMAND, JavaTools
from rig.kafka import KIP848_SETTLE_S, KafkaBroker
from rig.proxy_thread import ProxyThread
from rig.raw import RawClient
from rig.sluice_process import SluiceProcess
from tests.support.faults import wait_until
from tests.support.sharing import (
    CLASSIC_SETTLE_S,
    Member,
    check_exactly_once,
    check_in_key_order,
    check_in_order,
    check_keys_at_one_consumer,
    check_members_alive,
    describe_twice,
    java_member,
    members_of,
    one_slice_run,
    produce,
    produce_one_per_batch,
    produce_tail,
    python_member,
    settled,
    stable_members,
    wait_for_all,
    wait_for_end_commits,
)
from tests.support.topics import committed_offsets, created_again, topic_id

pytestmark = pytest.mark.broker

PARTITIONS = 3
CONSUMERS = 6
SHARING = {"sharing.enabled": True, "sharing.topics": [{"topic": "share-*"}]}
PYTHON_CLIENTS = ["confluent", "kafka-python", "aiokafka"]
GO_CLIENTS = ["franz-go", "kafka-go"]


def new_topic(broker: KafkaBroker, name: str, partitions: int = PARTITIONS) -> str:
    topic = f"share-{name}"[:200]
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    return topic


@pytest.fixture(scope="module")
def sluice(kafka_broker: KafkaBroker) -> Iterator[ProxyThread]:
    with ProxyThread(kafka_broker.bootstrap, **SHARING) as p:
        yield p


def spawn(client: str, bootstrap: str, topic: str, group: str, client_id: str, tools: JavaTools,
          **kwargs: Any) -> Member:
    protocol = kwargs.get("protocol", "classic")
    if client == "java":
        return java_member(tools, bootstrap, topic, group, client_id, props=kwargs.get("props"), protocol=protocol)
    return python_member(client, bootstrap, topic, group, client_id, work_ms=kwargs.get("work_ms", 0),
                         strategy=kwargs.get("strategy", "range"), protocol=protocol)


def settled_on(sluice: ProxyThread, group: str, assignments_before: float, protocol: str = "classic") -> None:
    """The group has settled: its coordinator holds it Stable with all six members, and this Sluice's shared
    partitions and assignments rewritten stopped changing (for as long as the protocol's rebalances take)."""
    admin = AdminClient({"bootstrap.servers": sluice.settings.upstream.bootstrap_servers[0]})
    settled(lambda: (sluice.total("sluice_sharing_partitions", group=group),
                     sluice.total("sluice_sharing_assignments_total") - assignments_before)
            if stable_members(admin, group) == CONSUMERS else (0.0, 0.0),
            quiet_s=KIP848_SETTLE_S if protocol == "consumer" else CLASSIC_SETTLE_S)


def consumed_once(broker: KafkaBroker, topic: str, members: list[Member], tag: str, n: int = 600,
                  one_per_batch: bool = False, before: list[tuple[str, str]] | None = None) -> list[tuple[str, str]]:
    """Produce ``n`` records of 60 keys once the group settled (``one_per_batch``: each in a batch of its own, every
    codec in turn): every one received exactly once, in order, each key's records by one consumer, those of
    ``before`` (records produced just before) too. The records produced, ``before``'s first."""
    produced = [*(before or []), *(produce_one_per_batch(broker.bootstrap, topic, n, keys=60, tag=tag)
                                  if one_per_batch else produce(broker.bootstrap, topic, n, keys=60, tag=tag))]
    wait_for_all(members, {v for _, v in produced})
    check_exactly_once(members, produced)
    check_keys_at_one_consumer(members)
    return produced


def shared_state(proxies: list[Any], group: str) -> tuple[float, float]:
    """What the Sluices say of the group: partitions shared by the members behind them, assignments rewritten."""
    return (sum(p.total("sluice_sharing_partitions", group=group) for p in proxies),
            sum(p.total("sluice_sharing_assignments_total") for p in proxies))


# --------------------------------------------------------------------------- 6 consumers, 6 Sluices / 1 Sluice


#: the clients that speak KIP-848's protocol (group.protocol=consumer: the broker assigns, Sluice lays slices over it)
KIP848_CLIENTS = ["java", "confluent"]


@pytest.mark.parametrize(("client", "protocol"), [(c, "classic") for c in ["java", *PYTHON_CLIENTS, *GO_CLIENTS]]
                         + [(c, "consumer") for c in KIP848_CLIENTS])
def test_six_consumers_each_with_its_own_sluice(kafka_broker: KafkaBroker, java_tools: JavaTools, client: str,
                                                protocol: str, unique_topic: str) -> None:
    """Six consumers of three partitions, each through a Sluice of its own, records produced one per batch (a
    low-rate topic's shape: most of a member's batches hold the other slice's records only): every record exactly
    once, in order, each key at one consumer, and the group's commits at the partitions' end, the last records of
    a partition being another slice's for one of its two members (Sluice commits that member's slice on)."""
    topic = new_topic(kafka_broker, unique_topic)
    group = f"g-{topic}"
    with contextlib.ExitStack() as stack:
        proxies = [stack.enter_context(ProxyThread(kafka_broker.bootstrap, **SHARING)) for _ in range(CONSUMERS)]
        members = stack.enter_context(members_of(*(
            spawn(client, p.bootstrap, topic, group, f"{client}-{i}", java_tools, protocol=protocol)
            for i, p in enumerate(proxies))))
        # each Sluice sees its own member: 6 shared slices in all, 2 per partition, in a group its coordinator
        # holds Stable with all six (a Sluice's figures stay as they were while a rebalance runs)
        admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
        settled(lambda: shared_state(proxies, group)
                if shared_state(proxies, group)[0] == CONSUMERS and stable_members(admin, group) == CONSUMERS
                else (0, 0),
                quiet_s=KIP848_SETTLE_S if protocol == "consumer" else CLASSIC_SETTLE_S)
        consumed_once(kafka_broker, topic, members, client, one_per_batch=True)
        assert all(m.received for m in members), [len(m.received) for m in members]
        assert sum(p.total("sluice_sharing_records_filtered_total", reason="other_slice") for p in proxies) > 0
        # the stable offset reaches the end, whether the client commits its position or its last record + 1 (the
        # console consumer auto-commits every 5 s)
        wait_for_end_commits(kafka_broker.bootstrap, topic, group, PARTITIONS, proxies=proxies)


@pytest.mark.parametrize("client", PYTHON_CLIENTS)
def test_six_consumers_through_one_sluice_one_killed_mid_way(sluice: ProxyThread, kafka_broker: KafkaBroker,
                                                           java_tools: JavaTools, client: str,
                                                           unique_topic: str) -> None:
    topic = new_topic(kafka_broker, unique_topic)
    group = f"g-{topic}"
    before = sluice.total("sluice_sharing_assignments_total")
    with members_of(*(spawn(client, sluice.bootstrap, topic, group, f"{client}-{i}", java_tools, work_ms=3)
                      for i in range(CONSUMERS))) as members:
        settled_on(sluice, group, before)
        assert sluice.total("sluice_sharing_partition_members", group=group) == 2
        produced = produce(kafka_broker.bootstrap, topic, 1500, keys=90, tag=client)
        victim = members[1]
        wait_until(lambda: len(victim.received) >= 60, 60, "the victim to consume")
        victim.kill()
        wait_for_all(members, {v for _, v in produced})
        check_after_kill(members, victim, produced, check_in_order)


def check_after_kill(members: list[Member], victim: Member, produced: list[tuple[str, str]],
                     in_order: Any) -> None:
    """After ``victim`` was killed: nothing lost, none of its committed records delivered again, every other record
    exactly once, each consumer's records ``in_order``, every survivor served."""
    survivors = [m for m in members if m is not victim]
    committed, uncommitted = victim.committed()
    assert committed, "the victim committed nothing before it was killed"
    again = {g.value for m in survivors for g in m.received}
    assert not committed & again, "records the killed consumer had committed were delivered again"
    assert uncommitted <= again, "records the killed consumer had not committed were lost"
    counts: dict[str, int] = {}
    for m in members:
        for g in m.received:
            counts[g.value] = counts.get(g.value, 0) + 1
    victims = {g.value for g in victim.received}
    assert not [v for v, n in counts.items() if n > 1 and v not in victims]
    assert set(counts) == {v for _, v in produced}
    for m in members:
        in_order(m)
    assert all(m.received for m in survivors)


#: the client kinds of one group (kafka-go as its group's leader cannot read the others' subscriptions: "unable to
#: read metadata for member", so it has a group of its own; sarama decodes a member's subscription to its last byte
#: and refuses what it does not know, so it has one too)
GROUPS = {"mixed": ["java", "confluent", "kafka-python", "aiokafka", "franz-go", "confluent"],
          "kafka-go": ["kafka-go"] * CONSUMERS, "sarama": ["sarama"] * CONSUMERS}


@pytest.mark.parametrize("kinds", list(GROUPS))
def test_one_record_batches_of_every_codec_reach_every_client_once(sluice: ProxyThread, kafka_broker: KafkaBroker,
                                                                   java_tools: JavaTools, kinds: str,
                                                                   unique_topic: str) -> None:
    """Records produced one per batch, each codec in turn (so every client reads every codec): most of a member's
    batches hold only the other slice's records, and none reaches it emptied (librdkafka reported a partition whose
    batches were all emptied MSG_SIZE_TOO_LARGE, kafka-go read a record from every batch and went back to an offset
    of its own, franz-go stalled on an empty snappy batch). In a group that stays as it settled: every record
    exactly once, each consumer's in offset order (so each key's in produced order), each key at one consumer, and
    the group's commits at the partitions' end."""
    topic = new_topic(kafka_broker, unique_topic)
    group = f"g-{topic}"
    before = sluice.total("sluice_sharing_assignments_total")
    filtered = sluice.total("sluice_sharing_records_filtered_total", reason="other_slice")
    with members_of(*(spawn(kind, sluice.bootstrap, topic, group, f"{kinds}-{kind}-{i}", java_tools)
                      for i, kind in enumerate(GROUPS[kinds]))) as members:
        settled_on(sluice, group, before)
        assignments = sluice.total("sluice_sharing_assignments_total")
        produced = produce_one_per_batch(kafka_broker.bootstrap, topic, 300, keys=60, tag=kinds)
        wait_for_all(members, {v for _, v in produced})
        check_exactly_once(members, produced)
        check_keys_at_one_consumer(members)
        assert all(m.received for m in members), [len(m.received) for m in members]
        # no fetch errors: franz-go and sarama report each partition's; kafka-go's reader, given a partition with no
        # records below its high watermark, takes the connection for broken ("unexpected EOF") and dials again (its
        # read timeouts on this busy machine, "i/o timeout", are its own: they come without Sluice in the path too)
        assert not [e for m in members for e in m.reported() if "fetch_error" in e
                    and ("kafka-go" not in m.client_id or "unexpected EOF" in e["fetch_error"])]
        assert sluice.total("sluice_sharing_records_filtered_total", reason="other_slice") - filtered >= 300
        assert sluice.total("sluice_sharing_assignments_total") == assignments  # the group stayed as it settled
        wait_for_end_commits(kafka_broker.bootstrap, topic, group, PARTITIONS, proxies=[sluice])


def test_java_cooperative_sticky_through_one_sluice(sluice: ProxyThread, kafka_broker: KafkaBroker,
                                                    java_tools: JavaTools, unique_topic: str) -> None:
    topic = new_topic(kafka_broker, unique_topic)
    group = f"g-{topic}"
    before = sluice.total("sluice_sharing_assignments_total")
    props = {"partition.assignment.strategy": "org.apache.kafka.clients.consumer.CooperativeStickyAssignor"}
    with members_of(*(java_member(java_tools, sluice.bootstrap, topic, group, f"java-coop-{i}", props=props)
                      for i in range(CONSUMERS))) as members:
        settled_on(sluice, group, before)
        consumed_once(kafka_broker, topic, members, "coop")
        assert all(m.received for m in members), [len(m.received) for m in members]


# ------------------------------------------------------------------------------------- every Sluice restarted


def test_every_sluice_killed_and_restarted_positions_come_back_from_kafka(kafka_broker: KafkaBroker,
                                                                          java_tools: JavaTools,
                                                                          unique_topic: str) -> None:
    topic = new_topic(kafka_broker, unique_topic)
    group = f"g-{topic}"
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        config = Path(tmp) / "sluice.toml"
        config.write_text('[sharing]\nenabled = true\n[[sharing.topics]]\ntopic = "share-*"\n')
        # 3 Sluices, 2 consumers each. Recovery needs the Sluices back within the members' session: at the rig's 6 s a
        # Sluice's start beside CI's busy sessions outlasted it, every member was fenced and joined again, and no
        # Sluice recovered one (as the KIP-848 test below found). These members get Kafka's default session (45 s,
        # KIP-735).
        sluices = [stack.enter_context(SluiceProcess(kafka_broker.bootstrap, {"SLUICE_CONFIG": str(config)}))
                   for _ in range(3)]
        members = stack.enter_context(members_of(*(
            python_member("confluent", sluices[i % 3].bootstrap, topic, group, f"restart-{i}", work_ms=3,
                          session_timeout_ms=45_000)
            for i in range(CONSUMERS))))

        settled(lambda: state(sluices, group))
        produced = restart_all_mid_way(kafka_broker, topic, members, sluices, "restart")
        check_after_restart(members, produced, check_in_order)
        recovered = sum(1 for s in sluices for e in s.log_events() if e.get("event") == "sharing_member_recovered")
        assert recovered >= 1


def restart_all_mid_way(broker: KafkaBroker, topic: str, members: list[Member], sluices: list[SluiceProcess],
                        tag: str, timeout: float = 90.0) -> list[tuple[str, str]]:
    """Produce 1500 records; once 300 are consumed, kill every Sluice with -9 and restart it; wait for every record.
    The records produced."""
    produced = produce(broker.bootstrap, topic, 1500, keys=90, tag=tag)
    wait_until(lambda: sum(len(m.received) for m in members) >= 300, 60, "consumption to start")
    for s in sluices:
        s.kill()
    # restarted together: one after the other, the last one's members were without a Sluice for three starts (on a
    # starved machine ~10 s each, spawn to ready), past their session timeout: fenced, they joined again
    for s in sluices:
        s.restart(wait=False)
    for s in sluices:
        s.wait_ready()
    try:
        wait_for_all(members, {v for _, v in produced}, timeout=timeout)
    except AssertionError as e:
        for s in sluices:  # the consumers are described by members_of; where each Sluice stood, here
            e.add_note(f"Sluice {s.bootstrap}, the end of its log:\n{s.log_tail(30)}")
        raise
    return produced


def state(sluices: list[SluiceProcess], group: str) -> tuple[float, float]:
    """What the Sluices say of the group: partitions shared by the members behind them, assignments rewritten."""
    return (sum(s.metric("sluice_sharing_partitions", {"group": group}) for s in sluices),
            sum(s.metric("sluice_sharing_assignments_total") for s in sluices))


def check_after_restart(members: list[Member], produced: list[tuple[str, str]], in_order: Any) -> None:
    """Positions came back from Kafka (every Sluice learnt its members' slices again from the group): every record
    consumed, no record delivered again once a consumer had committed it (records whose commit had not succeeded
    may be, to their slice's owner), each consumer's records ``in_order``.

    "Once committed" is in time: a commit that failed (in flight at the kill, or refused after the consumer's
    session timed out while its Sluice was down) leaves its records to be consumed again from the slice's last
    commit, at least once as without Sluice (KafkaConsumer's javadoc, "Offsets and Consumer Position"), and the
    consumer that gets them commits them then: covered by a commit by the end, yet delivered twice, rightly."""
    committed: dict[str, float] = {}
    for m in members:
        for v, t in m.committed_at().items():
            committed[v] = min(t, committed.get(v, t))
    again = [r[3] for m in members for t, r in m.timed_records() if (c := committed.get(r[3])) is not None and t > c]
    assert {g.value for m in members for g in m.received} == {v for _, v in produced}
    assert not again, f"{len(again)} records delivered again after they were committed: {again[:5]}\n" \
                      f"{describe_twice(members, again[:5])}"
    for m in members:
        in_order(m)


# ------------------------------------------------------------------------------------- other members, other modes


@pytest.mark.parametrize("leader", ["through-sluice", "without-sluice"])
def test_mixed_group_member_without_sluice_never_gets_a_record_twice(sluice: ProxyThread, kafka_broker: KafkaBroker,
                                                                    leader: str, unique_topic: str) -> None:
    """Five members through Sluice, one (kafka-python) straight to the broker. When the group's leader goes
    through Sluice, the five share the partitions and the sixth gets none of them (it would read everything);
    when the leader is the member without Sluice, it reads the markers, ignores them (as every client's reader
    does) and assigns whole partitions: nothing is shared, nothing breaks."""
    topic = new_topic(kafka_broker, unique_topic)
    group = f"g-{topic}"
    before = sluice.total("sluice_sharing_assignments_total")
    def direct_member() -> Member:
        return python_member("kafka-python", kafka_broker.bootstrap, topic, group, "direct")

    def through(i: int) -> Member:
        return python_member("confluent", sluice.bootstrap, topic, group, f"mixed-{i}")

    first = direct_member() if leader == "without-sluice" else through(0)
    wait_until(lambda: first.assignment is not None, 60, "the first member (the leader) to join")
    others = [through(i) for i in range(1, 5)] + [through(0) if leader == "without-sluice" else direct_member()]
    with members_of(first, *others) as members:
        direct = next(m for m in members if m.client_id == "direct")
        # settled: every member has an assignment and none changed for 3 s
        settled(lambda: (float(all(m.assignment is not None for m in members)),
                         float(hash(str([m.assignment for m in members])))), quiet_s=3)
        consumed_once(kafka_broker, topic, members, "mixed")
        if leader == "through-sluice":
            assert direct.assignment == []  # a member without Sluice is never given a shared slice
            assert sluice.total("sluice_sharing_assignments_total") > before
        else:
            assert sluice.total("sluice_sharing_assignments_total") == before  # nothing rewritten
            assert direct.received  # the leader's own assignor gave it a whole partition


def test_one_kip848_consumer_is_served_whole(sluice: ProxyThread, kafka_broker: KafkaBroker,
                                            java_tools: JavaTools, unique_topic: str) -> None:
    """A KIP-848 group that does not outnumber its partitions: the broker's assignment, every record."""
    topic = new_topic(kafka_broker, unique_topic)
    produced = produce(kafka_broker.bootstrap, topic, 300, keys=30, tag="848")
    before = sluice.total("sluice_sharing_assignments_total")
    lines = java_tools.console_consume(sluice.bootstrap, topic, max_messages=300, group=f"g-{topic}",
                                       consumer_props={"group.protocol": "consumer", "client.id": "java-848"},
                                       timeout=90)
    assert sorted(lines) == sorted(v for _, v in produced)  # every record once: nothing broken
    assert sluice.total("sluice_sharing_assignments_total") == before  # nothing to split
    assert sluice.total("sluice_frames_rejected_total", reason="unknown_api") == 0


def test_two_consumers_with_one_client_id_behind_one_sluice_are_not_shared(sluice: ProxyThread,
                                                                         kafka_broker: KafkaBroker,
                                                                         unique_topic: str) -> None:
    topic = new_topic(kafka_broker, unique_topic)
    group = f"g-{topic}"
    before = sluice.total("sluice_sharing_not_shared_total", reason="client_id_collision")
    assignments = sluice.total("sluice_sharing_assignments_total")
    with members_of(*(python_member("confluent", sluice.bootstrap, topic, group, cid)
                      for cid in ("same", "dup-1", "dup-2", "same", "dup-3", "dup-4"))) as members:
        settled_on(sluice, group, assignments)
        consumed_once(kafka_broker, topic, members, "dup")
        # the two "same" consumers are never given a slice: a partition one of them read, it read whole
        for m in members:
            if m.client_id == "same":
                mine = {g.partition for g in m.received}
                others = {g.partition for o in members if o is not m for g in o.received}
                assert not mine & others, f"a consumer behind a colliding client.id shared partitions {mine & others}"
    assert sluice.total("sluice_sharing_not_shared_total", reason="client_id_collision") > before


def test_standalone_consumers_read_their_configured_slices(kafka_broker: KafkaBroker, unique_topic: str) -> None:
    topic = new_topic(kafka_broker, unique_topic)
    group = f"g-{topic}"
    produced = produce(kafka_broker.bootstrap, topic, 600, keys=60, tag="standalone")
    produced += produce_tail(kafka_broker.bootstrap, topic, PARTITIONS, 2, "standalone")
    standalone = [{"client_id": "slice-0", "topic": topic, "slice": "0/2"},
                  {"client_id": "slice-1", "topic": topic, "slice": "1/2"}]
    with ProxyThread(kafka_broker.bootstrap, **SHARING, **{"sharing.standalone": standalone}) as proxy, \
            members_of(*(python_member("confluent", proxy.bootstrap, topic, group, f"slice-{i}", assign=PARTITIONS)
                         for i in range(2))) as members:
        wait_for_all(members, {v for _, v in produced})
        check_exactly_once(members, produced)
        check_keys_at_one_consumer(members)
        assert all(m.received for m in members)
        wait_until(lambda: all(m.committed()[0] >= {g.value for g in m.received} for m in members), 30,
                   "the last commits")
    # The group's own committed offset is each partition's stable offset: the lower of the two slices' positions,
    # each moved past the other slice's records after its consumer's last one (librdkafka commits last record + 1):
    # the partition's end
    wait_for_end_commits(kafka_broker.bootstrap, topic, group, PARTITIONS)


@pytest.mark.parametrize("client", ["confluent", "java", "kafka-python"])
def test_a_topic_created_again_under_standalone_slices_is_read_from_its_start(
        kafka_broker: KafkaBroker, java_tools: JavaTools, unique_topic: str, client: str) -> None:
    """A topic deleted and created again under running consumers: a new topic (a new id, KIP-516) whose offsets
    count from 0 again. Two standalone slices of one partition; the old topic's records are all of slice 0, so
    Sluice read the old log for slice 1's member and found nothing of its there. The new topic's records are all
    of slice 1, and its member, which never received a record, is at offset 0: every one of them reaches it once,
    in order, and no record of the old topic reaches either member again. Clients naming topics by id (Fetch
    v13+) without a fetch session (confluent-kafka) and with one (the Java client), and one naming them by name in
    a fetch session of its own (kafka-python, Fetch v12)."""
    topic = new_topic(kafka_broker, unique_topic, 1)
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap, "log_level": 0})
    old_id = topic_id(admin, topic)
    standalone = [{"client_id": f"again-{i}", "topic": topic, "slice": f"{i}/2"} for i in range(2)]
    with ProxyThread(kafka_broker.bootstrap, **SHARING, **{"sharing.standalone": standalone}) as proxy, \
            members_of(*(java_member(java_tools, proxy.bootstrap, topic, f"g-{topic}", f"again-{i}", partition=0)
                         if client == "java" else
                         python_member(client, proxy.bootstrap, topic, f"g-{topic}", f"again-{i}", assign=1)
                         for i in range(2))) as members:
        old = one_slice_run(kafka_broker.bootstrap, topic, 1, 60, "old")
        wait_for_all(members, {v for _, v in old})
        assert not members[1].received
        admin.delete_topics([topic])[topic].result(30)
        wait_until(lambda: created_again(admin, kafka_broker.bootstrap, topic, 1, old_id), 60,
                   "the topic created again")
        keys = [k for k in (f"again-{j}" for j in range(40)) if slice_of(key_hash(k.encode()), 2) == 1][:5]
        new = produce_one_per_batch(kafka_broker.bootstrap, topic, 60, keys, "new", partition=0)
        wait_for_all(members, {v for _, v in old + new})
        check_exactly_once(members, old + new)
        assert [g.value for g in members[1].received] == [v for _, v in new]
        assert [g.offset for g in members[1].received] == list(range(len(new)))


def test_transactions_only_committed_records_once(sluice: ProxyThread, kafka_broker: KafkaBroker,
                                                 unique_topic: str) -> None:
    topic = new_topic(kafka_broker, unique_topic)
    group = f"g-{topic}"
    before = sluice.total("sluice_sharing_assignments_total")
    # librdkafka reads read_committed by default (isolation.level)
    with members_of(*(python_member("confluent", sluice.bootstrap, topic, group, f"txn-{i}")
                      for i in range(CONSUMERS))) as members:
        settled_on(sluice, group, before)
        producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "transactional.id": f"tx-{topic}"})
        producer.init_transactions(30)
        kept: list[tuple[str, str]] = []
        for t in range(6):
            producer.begin_transaction()
            batch = [(f"key-{i % 30}", f"txn{t}-{i:04d}") for i in range(100)]
            for k, v in batch:
                producer.produce(topic, key=k.encode(), value=v.encode())
            # Every record acknowledged inside its transaction before it ends: an aborted transaction's records are
            # then in the log for the consumers to skip (aborting with records still queued purges them unsent), and
            # abort_transaction() called right after produce() can fail with a fatal INVALID_TXN_STATE (librdkafka,
            # confluentinc/librdkafka#4849, open; seen here on Kafka 4.1.2)
            assert producer.flush(30) == 0
            if t % 3 == 1:
                producer.abort_transaction(30)
            else:
                producer.commit_transaction(30)
                kept += batch
        wait_for_all(members, {v for _, v in kept})
        check_exactly_once(members, kept)  # the aborted transactions' records never show up (read_committed)


@pytest.mark.parametrize(("client", "protocol"), [("confluent", "classic"), ("kafka-python", "classic"),
                                                  ("aiokafka", "classic"), ("confluent", "consumer")],
                         ids=["confluent", "kafka-python", "aiokafka", "confluent-kip848"])
def test_a_member_slow_to_take_up_its_assignment_still_rejoins_when_its_slice_changed(
        sluice: ProxyThread, kafka_broker: KafkaBroker, unique_topic: str, client: str, protocol: str) -> None:
    """A member whose slice changed under a partition it keeps is left out of it one generation and made to rejoin:
    Sluice answers its heartbeats REBALANCE_IN_PROGRESS, as the coordinator answers every heartbeat while a
    rebalance runs. librdkafka ignores that answer while its application has not yet taken up its assignment
    (join-state WAIT_ASSIGN_CALL: rdkafka_cgrp.c, rd_kafka_cgrp_handle_Heartbeat), and it heartbeats meanwhile: an
    answer given only once is lost, and the member never rejoins. Three consumers each hold a partition whole, and
    each assignment takes their application 1.5 s (its callback on an assignment: restoring state, say, while
    heartbeats go every 0.5 s; kafka-python and aiokafka too, which act on the first answer); three more join and
    the partitions are split. The range assignor orders members by member id (the client id first), and the names
    interleave, so the first three keep their partitions with narrower slices: each is made to rejoin while its
    application still works on the assignment that left its partition out. Every record is received once. In a
    KIP-848 group (``confluent-kip848``) no one rejoins: a partition whose slice changed is left out of what its
    client is handed and handed again once the client let it go, each step a heartbeat, the callbacks as slow."""
    topic = new_topic(kafka_broker, unique_topic)
    group = f"g-{topic}"
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    before = sluice.total("sluice_sharing_assignments_total")
    rejoins = sluice.total("sluice_sharing_rejoins_total")
    with contextlib.ExitStack() as stack:
        members = stack.enter_context(members_of(*(
            python_member(client, sluice.bootstrap, topic, group, f"m-{2 * i}-slow", assign_ms=1500,
                          protocol=protocol)
            for i in range(PARTITIONS))))

        def each_holds_one() -> bool:
            check_members_alive()
            return stable_members(admin, group) == PARTITIONS and all(m.assignment for m in members)

        wait_until(each_holds_one, 90, lambda: f"a partition each: {[m.assignment for m in members]}")
        members += stack.enter_context(members_of(*(
            python_member(client, sluice.bootstrap, topic, group, f"m-{2 * i + 1}", protocol=protocol)
            for i in range(CONSUMERS - PARTITIONS))))
        settled_on(sluice, group, before, protocol)
        if protocol == "classic":  # a partition left out, its member to rejoin (KIP-848: handed again once let go)
            assert sluice.total("sluice_sharing_rejoins_total") > rejoins
        consumed_once(kafka_broker, topic, members, "slow")
        assert all(m.received for m in members), [len(m.received) for m in members]


def test_mixed_clients_with_fetch_sessions_budgets_and_throttles(kafka_broker: KafkaBroker, java_tools: JavaTools,
                                                                unique_topic: str) -> None:
    """Java (its own fetch sessions, Fetch v17) and confluent-kafka (session-less) consumers in one group (both
    "range"), through a Sluice that also terminates fetch sessions, holds fetches to small KIP-74 budgets (4 KiB a
    partition: many fetches, each filtered) and throttles these consumers: filtering comes first (right after
    terminate builds the client's response), the throttle and the budgets apply to what is left. Records one per
    batch: a fetch that gets nothing for its member goes upstream again from the read-ahead cursor, through
    Sluice's own upstream session, and the Java client's partitions move on in its session. The records start
    with a run of one slice's keys in each partition, longer than two of the budgets: whether the consumers keep up
    with the producer or lag behind it (each answer then holds many records, some of every member's), the member
    holding the other slice has fetches answered with nothing of its own."""
    topic = new_topic(kafka_broker, unique_topic)
    group = f"g-{topic}"
    settings = {**SHARING, "sessions.mode": "terminate",
                "size_limit.budgets": [{"client_id": "mix-*", "fetch_max_bytes": 16384,
                                        "partition_max_bytes": 4096}],
                "throttle.leader_rate_bytes": 50_000_000, "throttle.topics": [{"topic": "share-*"}],
                "throttle.consumers": [{"client_id": "mix-*"}]}
    with ProxyThread(kafka_broker.bootstrap, **settings) as proxy, members_of(
            *(java_member(java_tools, proxy.bootstrap, topic, group, f"mix-java-{i}") for i in range(3)),
            *(python_member("confluent", proxy.bootstrap, topic, group, f"mix-ck-{i}") for i in range(3))) as members:
        settled_on(proxy, group, 0)
        assert proxy.total("sluice_sharing_partition_members", group=group) == 2
        # 200 one-record batches are at least 200 * 61 bytes (a v2 batch's header): more than twice 4 KiB
        run = one_slice_run(kafka_broker.bootstrap, topic, PARTITIONS, 200, "mix-run")
        consumed_once(kafka_broker, topic, members, "mix", one_per_batch=True, before=run)
        assert all(m.received for m in members), [len(m.received) for m in members]
        assert proxy.total("sluice_upstream_fetch_requests_total", kind="incremental") > 0  # Sluice's sessions
        # The read-ahead cursor at work (cursor.py), in either of its ways: a fetch answered with nothing for its
        # member goes upstream again from the cursor at once (fetched_again: the broker had held it a while), or
        # is answered empty and the member's next fetch moves past what Sluice read (moved)
        read_ahead = sum(proxy.total("sluice_sharing_read_ahead_total", event=e) for e in ("moved", "fetched_again"))
        assert read_ahead > 0
        metered = proxy.total("sluice_throttle_bytes_total", side="leader")
        assert 0 < metered < proxy.total("sluice_sharing_filtered_bytes_total")  # metered after filtering


def test_a_compacted_topic_with_gaps_reaches_every_client_once(kafka_broker: KafkaBroker, unique_topic: str) -> None:
    """A changelog-shaped topic (cleanup.policy=compact, records one per batch, every codec) whose cleaner has
    really run before anyone reads it: most offsets are gone, so fetch offsets, read-ahead cursors and slice
    positions land in gaps and batches start past the offset fetched. Three slices read from the start by
    standalone consumers (a group's first member would read the whole history alone before the others join), each a
    client kind: with fetch sessions (kafka-python) and without (confluent-kafka, aiokafka), through one Sluice
    that also terminates fetch sessions and holds fetches to small budgets. Kafka's guarantee for a compacted topic
    is the consumers' here (the cleaner may go on removing superseded records while they read): each key's latest
    record arrives, every record the log still holds at the end was received, nothing is received twice or that
    was never produced, each consumer's records in offset order, each key at one consumer; the group's commits
    reach the partitions' ends."""
    topic = f"share-{unique_topic}"[:200]
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1, config={
        "cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01"})])[topic].result(30)
    produced = produce_one_per_batch(kafka_broker.bootstrap, topic, 300, keys=30, tag="cmp")
    filler = Producer({"bootstrap.servers": kafka_broker.bootstrap, "acks": "all", "log_level": 0})

    def log() -> set[str]:
        return {v.decode() for _, v, _ in read_to_end({"bootstrap.servers": kafka_broker.bootstrap}, topic,
                                                      f"direct-{topic}", 30, lambda denied: None) if v is not None}

    def compacted() -> bool:
        # Each look appends a superseding record of its partition's own key, so the active segment (never cleaned)
        # rolls and the log stays dirty enough for the cleaner's next pass.
        partition = len(produced) % PARTITIONS
        key, value = f"filler-{partition}", f"filler-{len(produced):06d}"
        filler.produce(topic, key=key.encode(), value=value.encode(), partition=partition)
        assert filler.flush(30) == 0
        produced.append((key, value))
        return len(log()) < len(produced) // 2

    wait_until(compacted, 90, "the cleaner to remove superseded records")
    group = f"g-{topic}"
    clients = ["confluent", "kafka-python", "aiokafka"]
    settings = {**SHARING, "sessions.mode": "terminate",
                "sharing.standalone": [{"client_id": f"cmp-{i}", "topic": topic, "slice": f"{i}/{len(clients)}"}
                                       for i in range(len(clients))],
                "size_limit.budgets": [{"client_id": "cmp-*", "fetch_max_bytes": 16384, "partition_max_bytes": 4096}]}
    with ProxyThread(kafka_broker.bootstrap, **settings) as proxy, members_of(
            *(python_member(client, proxy.bootstrap, topic, group, f"cmp-{i}", assign=PARTITIONS)
              for i, client in enumerate(clients))) as members:
        wait_for_all(members, set(dict(produced).values()))  # each key's last record, which the cleaner keeps
        check_exactly_once(members, produced, required=log())
        check_keys_at_one_consumer(members)
        assert all(m.received for m in members), [len(m.received) for m in members]
    wait_for_end_commits(kafka_broker.bootstrap, topic, group, PARTITIONS)


# ----------------------------------------------------------------------- KIP-848 groups (group.protocol=consumer)


def kip848_sidecars(stack: contextlib.ExitStack, broker: KafkaBroker, n: int) -> list[SluiceProcess]:
    """``n`` Sluice processes with sharing on (killable with -9, unlike a ProxyThread)."""
    tmp = stack.enter_context(tempfile.TemporaryDirectory())
    config = Path(tmp) / "sluice.toml"
    config.write_text('[sharing]\nenabled = true\n[[sharing.topics]]\ntopic = "share-*"\n')
    return [stack.enter_context(SluiceProcess(broker.bootstrap, {"SLUICE_CONFIG": str(config)})) for _ in range(n)]


def test_kip848_consumer_and_its_sluice_killed_mid_way_nothing_lost(kafka_broker: KafkaBroker,
                                                                    unique_topic: str) -> None:
    """6 KIP-848 consumers (confluent-kafka), a Sluice each; one consumer and its Sluice killed with -9 while
    consuming. The broker fences the member when its session times out, the others' layout takes its slice back
    (a widened slice is revoked, then handed again from its committed position): every record is consumed, none the
    killed consumer had committed is delivered again, each key's records in order at each consumer."""
    topic = new_topic(kafka_broker, unique_topic)
    group = f"g-{topic}"
    with contextlib.ExitStack() as stack:
        sluices = kip848_sidecars(stack, kafka_broker, CONSUMERS)
        members = stack.enter_context(members_of(*(
            python_member("confluent", s.bootstrap, topic, group, f"kill848-{i}", work_ms=3, protocol="consumer")
            for i, s in enumerate(sluices))))
        # every member holds a slice (6 shared slices, 2 per partition): a KIP-848 group's layout settles over
        # several heartbeats, each Sluice's at its own member's
        settled(lambda: state(sluices, group) if state(sluices, group)[0] == CONSUMERS else (0, 0),
                quiet_s=KIP848_SETTLE_S)
        produced = produce(kafka_broker.bootstrap, topic, 1500, keys=90, tag="kill848")
        victim = members[1]
        wait_until(lambda: len(victim.received) >= 60, 60, "the victim to consume")
        victim.kill()
        sluices[1].kill()
        # the broker fences the killed member after group.consumer.session.timeout.ms (rig/kafka.py GROUP_SESSION_MS)
        wait_for_all(members, {v for _, v in produced}, timeout=180)
        # a layout laid out again moves slices between survivors too: each key's records in order
        check_after_kill(members, victim, produced, check_in_key_order)


def test_kip848_member_without_sluice_keeps_whole_partitions(kafka_broker: KafkaBroker, unique_topic: str) -> None:
    """Five KIP-848 members through their Sluices, one straight to the broker: its client id carries no opt-in, so
    no layout counts it; what the broker assigns it stays whole with it, the five share the rest. Every record once,
    each key at one consumer."""
    topic = new_topic(kafka_broker, unique_topic)
    group = f"g-{topic}"
    with contextlib.ExitStack() as stack:
        sluices = kip848_sidecars(stack, kafka_broker, CONSUMERS - 1)
        members = stack.enter_context(members_of(
            *(python_member("confluent", s.bootstrap, topic, group, f"with848-{i}", protocol="consumer")
              for i, s in enumerate(sluices)),
            python_member("confluent", kafka_broker.bootstrap, topic, group, "direct848", protocol="consumer")))
        # settled: what the members hold unchanged for KIP848_SETTLE_S (each Sluice changes its member's slices at
        # that member's heartbeat)
        settled(lambda: (state(sluices, group)[0], float(hash(str([m.assignment for m in members])))),
                quiet_s=KIP848_SETTLE_S)
        consumed_once(kafka_broker, topic, members, "direct848")


def test_kip848_every_sluice_killed_and_restarted(kafka_broker: KafkaBroker, java_tools: JavaTools,
                                                  unique_topic: str) -> None:
    """6 KIP-848 consumers behind 3 Sluices (2 each), every Sluice killed with -9 and restarted mid-way: each learns
    its members back from the group (the broker's assignment, and the slices each client holds, from the client ids
    their heartbeats carried), without a rebalance. Every record consumed, none a consumer had committed delivered
    again, each key's records in order."""
    topic = new_topic(kafka_broker, unique_topic)
    group = f"g-{topic}"
    with contextlib.ExitStack() as stack:
        sluices = kip848_sidecars(stack, kafka_broker, 3)
        # Recovery without a rebalance needs the Sluices back within the members' session: the rig's brokers give
        # KIP-848 groups 10 s (rig/kafka.py GROUP_SESSION_MS), which a Sluice's start alone reached on a starved
        # machine (spawn to ready ~10 s beside 14 busy processes), so every member was fenced and joined again, and
        # no Sluice recovered one. This group gets Kafka's default session (45 s) through its own config (KIP-848
        # group configs, GroupConfig.CONSUMER_SESSION_TIMEOUT_MS_CONFIG)
        java_tools.run(CONFIG_COMMAND, ["--bootstrap-server", kafka_broker.bootstrap, "--alter", "--entity-type",
                                        "groups", "--entity-name", group, "--add-config",
                                        "consumer.session.timeout.ms=45000"])
        members = stack.enter_context(members_of(*(
            python_member("confluent", sluices[i % 3].bootstrap, topic, group, f"restart848-{i}", work_ms=3,
                          protocol="consumer") for i in range(CONSUMERS))))
        # every member holds a partition's slice (two members behind one Sluice may share a partition, so the
        # Sluices' gauges do not count them one each) and nothing changed for KIP848_SETTLE_S
        settled(lambda: (float(all(m.assignment for m in members)), float(hash(str([m.assignment for m in members])))),
                quiet_s=KIP848_SETTLE_S)
        produced = restart_all_mid_way(kafka_broker, topic, members, sluices, "restart848", timeout=180)
        check_after_restart(members, produced, check_in_key_order)
        recovered = [e for s in sluices for e in s.log_events() if e.get("event") == "sharing_member_recovered"]
        assert recovered and all(e.get("protocol") == "consumer" for e in recovered)


def test_mixed_classic_and_kip848_members_of_one_group(kafka_broker: KafkaBroker, unique_topic: str) -> None:
    """A consumer group part way through an upgrade (Kafka 4 lets classic members join a KIP-848 group): 2 classic
    members and 4 KIP-848 ones, a Sluice each. The broker assigns every member; the classic members' partitions
    stay whole (their heartbeats carry no opt-in, so no layout counts them), the KIP-848 members share the rest.
    Every record once, each key at one consumer."""
    topic = new_topic(kafka_broker, unique_topic)
    group = f"g-{topic}"
    with contextlib.ExitStack() as stack:
        proxies = [stack.enter_context(ProxyThread(kafka_broker.bootstrap, **SHARING)) for _ in range(CONSUMERS)]
        # The KIP-848 members first, until they hold every partition: the group is then a consumer group, which the
        # classic members join. Started together, a classic member's JoinGroup can reach the broker first; the group
        # is then a classic one, and the first KIP-848 heartbeat converts it online. That is another scenario, and
        # not Sluice's: the conversion fails every JoinGroup in flight with REBALANCE_IN_PROGRESS
        # (GroupMetadataManager.convertToConsumerGroup), and while the classic group is in its first rebalance the
        # broker answers the heartbeat with UNKNOWN_SERVER_ERROR (ConsumerGroup.fromClassicGroup reads a protocol
        # not chosen yet), fatal to librdkafka. Both seen in runs started
        # classic first (2 of 9).
        members = stack.enter_context(members_of(*(
            python_member("confluent", p.bootstrap, topic, group, f"upgrade-{i}", protocol="consumer")
            for i, p in enumerate(proxies[:4]))))

        def every_partition_held() -> bool:
            check_members_alive()
            return {p for m in members for _, p in m.assignment or ()} == set(range(PARTITIONS))

        wait_until(every_partition_held, 90, "the KIP-848 members to hold every partition")
        members += stack.enter_context(members_of(*(
            python_member("confluent", p.bootstrap, topic, group, f"upgrade-{i}", protocol="classic")
            for i, p in enumerate(proxies[4:], start=4))))
        settled(lambda: (float(all(m.assignment is not None for m in members[4:])),
                         float(hash(str([m.assignment for m in members])))), quiet_s=KIP848_SETTLE_S)
        consumed_once(kafka_broker, topic, members, "upgrade")


@pytest.mark.parametrize(("protocol", "unread"), [("classic", False), ("classic", True), ("consumer", False)],
                         ids=["classic", "classic-joins-left-unread", "consumer"])
def test_a_fenced_members_late_commit_and_heartbeat_are_refused_and_move_no_position(
        sluice: ProxyThread, kafka_broker: KafkaBroker, unique_topic: str, protocol: str, unread: bool,
        tmp_path: Path) -> None:
    """Two members share one partition through one Sluice: kafka-python in a classic group, or librdkafka in a
    KIP-848 one (group.protocol=consumer). a is stopped (SIGSTOP) until the coordinator fences it (its session
    times out: session.timeout.ms, or the broker's group.consumer.session.timeout.ms) and its slice is handed on:
    records produced meanwhile are b's, once b holds the partition whole. a's late commit and heartbeat, sent as a
    (its client id, member id and generation or member epoch) once it was fenced, are answered UNKNOWN_MEMBER_ID, as
    the coordinator answers them without Sluice (ClassicGroup / ConsumerGroup.validateOffsetCommit,
    GroupMetadataManager's heartbeats), and move no committed position: b gets every record a had not committed,
    once, in order.

    joins-left-unread: b's client leaves its first two joins after a's fencing unread and joins again, as
    kafka-python 3.0.12 does now and then (rig.group_consumer --unread-joins). Its position in the partition is still
    its slice's: the partition stays left out of its assignment until its client takes one up without it."""
    topic = f"share-{unique_topic}"[:200]
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    group = f"g-{topic}"
    client = "kafka-python" if protocol == "classic" else "confluent"
    unread_joins = tmp_path / "unread-joins"
    a, b = (python_member(client, sluice.bootstrap, topic, group, f"fence-{protocol}-{x}", protocol=protocol,
                          unread_joins=unread_joins if unread and x == "b" else None)
            for x in "ab")
    with members_of(a, b) as members:
        # both hold a slice of the partition, unchanged for a while (a KIP-848 layout moves over heartbeats)
        settled(lambda: (2.0, float(hash(str([m.assignment for m in members]))))
                if sluice.total("sluice_sharing_partition_members", group=group) == 2
                and (protocol != "classic" or stable_members(admin, group) == 2) else (0.0, 0.0),
                quiet_s=KIP848_SETTLE_S if protocol == "consumer" else CLASSIC_SETTLE_S)
        first = produce(kafka_broker.bootstrap, topic, 200, keys=40, tag="first")
        wait_for_all(members, {v for _, v in first}, late_s=0)  # (a duplicate, however late: check_exactly_once)
        wait_for_end_commits(kafka_broker.bootstrap, topic, group, 1, proxies=[sluice])
        sharing = sluice.proxy.policy("sharing")
        assert isinstance(sharing, Sharing)
        m = sharing.members.get(("127.0.0.1", a.client_id))
        assert m is not None and m.partitions
        member_id, generation, s = m.member_id, m.held, m.partitions[(topic, 0)].slice
        a.proc.send_signal(signal.SIGSTOP)
        if unread:
            unread_joins.write_text("2")  # b's next two joins: the rebalance once a's session times out
        try:
            # where a left its slice: read once a is stopped and the commits of it Sluice had read have landed (a
            # commit a sent as it was stopped moves it, legitimately: a had read those records; read before that,
            # the broker's figure was the one before it, and a's next record was taken for one a never had). Sluice
            # commits a slice's position one at a time (PartitionState.writing): none in flight, the broker's
            # figure Sluice's own, unchanged for a while
            def slice_position() -> tuple[float, float]:
                state = m.partitions.get((topic, 0)) if m.partitions is not None else None
                if state is None or state.in_flight is not None:
                    return 0.0, 0.0
                at = committed_offsets(admin, slice_group(group, s), topic, 1)[0]
                return (1.0, float(at)) if at == state.committed else (0.0, 0.0)

            settled(slice_position, timeout=30)
            before = committed_offsets(admin, slice_group(group, s), topic, 1)
            assert before[0] > 0
            second = produce(kafka_broker.bootstrap, topic, 100, keys=40, tag="second")

            def fenced() -> bool:
                ids = [x.member_id for x in admin.describe_consumer_groups([group])[group].result(30).members]
                return member_id not in ids and len(ids) == 1

            wait_until(fenced, 60, "the coordinator to fence the stopped member")
            wait_for_all([b], {v for _, v in second})  # a's slice handed on: b holds the partition whole
            left_unread = [e["join_left_unread"] for e in b.reported() if "join_left_unread" in e]
            assert left_unread == ([2, 1] if unread else [])
            commit = as_client(sluice, a.client_id, group, 8, 9, request_codec(8, 9).default().replace(
                group_id=group, generation_id_or_member_epoch=generation, member_id=member_id,
                group_instance_id=None, topics=[Message(name=topic, partitions=[Message(
                    partition_index=0, committed_offset=300, committed_leader_epoch=-1, committed_metadata="")])]))
            assert commit.topics[0].partitions[0].error_code == 25  # UNKNOWN_MEMBER_ID
            if protocol == "classic":
                heartbeat = as_client(sluice, a.client_id, group, 12, 4, request_codec(12, 4).default().replace(
                    group_id=group, generation_id=generation, member_id=member_id, group_instance_id=None))
            else:
                heartbeat = as_client(sluice, a.client_id, group, 68, 0, request_codec(68, 0).default().replace(
                    group_id=group, member_id=member_id, member_epoch=generation, rebalance_timeout_ms=-1))
            assert heartbeat.error_code == 25  # UNKNOWN_MEMBER_ID: its client must join again
        finally:
            a.kill()  # stopped: it would not end on SIGTERM
        # a's slice: where a left it, or further only over offsets that hold none of its records: until a's own
        # answers tell Sluice it was fenced (a is stopped: none come), Sluice moves a member's idle slice over
        # records of other slices as b reads them. a's late commit (300) would have passed a's next record.
        after = committed_offsets(admin, slice_group(group, s), topic, 1)
        produced = first + second  # one partition, produced in order: the offsets
        next_of_a = next(i for i, (key, _) in enumerate(produced)
                         if i >= before[0] and s.holds(positive_hash(key.encode())))
        assert before[0] <= after[0] <= next_of_a, (before, after, next_of_a)
        check_exactly_once(members, first + second)


def as_client(sluice: ProxyThread, client_id: str, group: str, api: int, version: int, body: Message) -> Message:
    """A request to ``group``'s coordinator through ``sluice`` as a consumer with ``client_id`` sends it (Sluice
    takes it as that member's), and its answer."""
    host, port = sluice.bootstrap.rsplit(":", 1)
    with RawClient(host, int(port), client_id=client_id) as raw:
        found = raw.request(10, 4, request_codec(10, 4).default().replace(key_type=0, coordinator_keys=[group]))
    coordinator = found.coordinators[0]
    with RawClient(coordinator.host, coordinator.port, client_id=client_id) as raw:
        return raw.request(api, version, body)
