"""Cooperative consumption through the chain, sans-IO (proxy/policies/sharing/): the group protocol as a broker
would answer it, Sluice's own group requests served by an in-memory stand-in for the coordinators (a fake, as unit
tests of sans-IO logic may use; the real broker is in tests/clients/test_sharing.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest
from structlog.testing import capture_logs

from proxy.core.broker_calls import BrokerCalls, Work
from proxy.core.chain import ChainConnection
from proxy.core.exchange import Exchange
from proxy.policies.sharing import marker
from proxy.policies.sharing.access import RECHECK_S
from proxy.policies.sharing.frontier import decode_metadata, encode_metadata, slice_group
from proxy.policies.sharing.group_calls import Committed, GroupCall
from proxy.policies.sharing.keys import WHOLE, Slice, key_hash
from proxy.policies.sharing.policy import Sharing
from proxy.wire.fetch_fast import FetchPartition, FetchResponseView, FetchTopic, decode_frame
from proxy.wire.fetch_request_fast import FetchRequestView, decode_fetch_request
from proxy.wire.messages import (
    decode_request,
    decode_response,
    encode_consumer_protocol,
    encode_request,
    encode_response,
    request_codec,
    response_codec,
)
from proxy.wire.model import Message
from proxy.wire.records import Record, decode_batches, encode_batch, new_batch
from rig.chain_rig import SansIOProxy

GROUP, TOPIC = "g", "orders"
JOIN, SYNC, HEARTBEAT, OFFSET_FETCH, OFFSET_COMMIT, FETCH = 11, 14, 12, 9, 8, 1
V_JOIN, V_SYNC, V_HB, V_OF, V_OC, V_FETCH = 9, 5, 4, 9, 9, 12  # versions Java 4.x uses (Fetch v12: names)
#: Fetch by topic id (KIP-516: v13+), as the Java client 4.x sends it
V_FETCH_IDS = 17


class FakeCoordinators:
    """Group offsets and descriptions in memory, served as the I/O layer would (proxy/io/cluster.py)."""

    def __init__(self) -> None:
        self.offsets: dict[str, dict[tuple[str, int], Committed]] = {}
        self.described: dict[str, Message] = {}
        #: KIP-848 groups' ConsumerGroupDescribe entries
        self.described_consumer: dict[str, Message] = {}
        self.calls: list[GroupCall] = []
        self.down = False
        #: which calls fail as if the coordinator were down (the rest are answered)
        self.refuse: Callable[[GroupCall], bool] = lambda call: False
        #: calls held unanswered (a slow coordinator), until :meth:`release`
        self.held: list[Work] | None = None
        #: groups whose slice groups Sluice's login may not use (an authorizer with a literal grant on the group
        #: alone): a call naming one fails refused, as the I/O layer fails one whose FindCoordinator was refused
        self.denied: set[str] = set()

    def attach(self, calls: BrokerCalls) -> None:
        calls.on_work = lambda: self.run(calls.take())

    def release(self) -> None:
        held, self.held = self.held or [], None
        self.run(held)

    def run(self, calls: Iterable[Work]) -> None:
        if self.held is not None:
            self.held.extend(calls)
            return
        for call in calls:
            assert isinstance(call, GroupCall)
            self.calls.append(call)
            if self.down or self.refuse(call):
                call.fail("coordinator down")
                continue
            if any(g.startswith(f"{d}.sluice-slice-") for g in call.groups for d in self.denied):
                call.fail("not authorized to describe groups", refused=True)
                continue
            for group, commits in call.commits.items():
                for tp, (offset, md) in commits.items():
                    self.offsets.setdefault(group, {})[tp] = Committed(offset, -1, md)
                call.committed[group] = dict.fromkeys(commits, 0)
            for group, tps in call.reads.items():
                call.offsets[group] = {tp: self.offsets.get(group, {}).get(tp, Committed()) for tp in tps}
            for group in call.describe:
                call.described[group] = self.described.get(group, Message(members=[], protocol_data=""))
            for group in call.describe_consumer:
                # a classic group is not found by ConsumerGroupDescribe (GROUP_ID_NOT_FOUND)
                call.described_consumer[group] = self.described_consumer.get(
                    group, Message(error_code=69, group_id=group, members=[]))
            call.settle()


class Client:
    """One consumer's connections through the proxy (its coordinator and fetch connections are one here)."""

    def __init__(self, proxy: SansIOProxy, client_id: str, conn_id: int) -> None:
        self.proxy, self.client_id = proxy, client_id
        self.conn: ChainConnection = proxy.connect(conn_id)
        self.corr = 0
        self.member_id = ""

    def send(self, api: int, version: int, body: Message) -> Exchange:
        self.corr += 1
        header = Message(request_api_key=api, request_api_version=version, correlation_id=self.corr,
                         client_id=self.client_id)
        return self.proxy.request(encode_request(header, body), self.conn)

    def answer(self, ex: Exchange, body: Message) -> Message:
        h = ex.header
        frame = encode_response(h.api_key, h.api_version, Message(correlation_id=h.correlation_id), body)
        reply = self.proxy.respond(ex, frame, self.conn)
        return decode_response(h.api_key, h.api_version, reply[4:])[1]


def sent(ex: Exchange) -> Message:
    """The request as it goes upstream."""
    return decode_request(ex.frame)[1]


def subscription(topics: list[str], owned: dict[str, list[int]] | None = None) -> bytes:
    return encode_consumer_protocol("subscription", 1, Message(
        topics=topics, user_data=None,
        owned_partitions=[Message(topic=t, partitions=ps) for t, ps in (owned or {}).items()]))


def assignment(parts: dict[str, list[int]]) -> bytes:
    return encode_consumer_protocol("assignment", 0, Message(
        assigned_partitions=[Message(topic=t, partitions=ps) for t, ps in parts.items()], user_data=None))


def sharing_proxy(**overrides: Any) -> tuple[SansIOProxy, FakeCoordinators]:
    proxy = SansIOProxy({"sharing.enabled": True, "sharing.topics": [{"topic": "orders*"}],
                         "sharing.clients": ["app-*"], **overrides})
    fake = FakeCoordinators()
    fake.attach(proxy.policy("sharing").calls)
    return proxy, fake


def join(c: Client, protocol: str = "range", owned: dict[str, list[int]] | None = None) -> Exchange:
    body = request_codec(JOIN, V_JOIN).default().replace(
        group_id=GROUP, session_timeout_ms=10000, rebalance_timeout_ms=30000, member_id=c.member_id,
        group_instance_id=None, protocol_type="consumer", reason=None,
        protocols=[Message(name=protocol, metadata=subscription([TOPIC], owned))])
    return c.send(JOIN, V_JOIN, body)


def join_answer(c: Client, ex: Exchange, members: list[tuple[str, bytes]], generation: int = 1,
                protocol: str = "range", leader: str = "") -> Message:
    body = response_codec(JOIN, V_JOIN).default().replace(
        error_code=0, generation_id=generation, protocol_type="consumer", protocol_name=protocol,
        leader=leader or c.member_id, skip_assignment=False, member_id=c.member_id,
        members=[Message(member_id=m, group_instance_id=None, metadata=md) for m, md in members])
    return c.answer(ex, body)


def sync(c: Client, generation: int, assignments: dict[str, bytes]) -> Exchange:
    body = request_codec(SYNC, V_SYNC).default().replace(
        group_id=GROUP, generation_id=generation, member_id=c.member_id, group_instance_id=None,
        protocol_type="consumer", protocol_name="range",
        assignments=[Message(member_id=m, assignment=a) for m, a in assignments.items()])
    return c.send(SYNC, V_SYNC, body)


def sync_answer(c: Client, ex: Exchange, data: bytes) -> bytes:
    body = response_codec(SYNC, V_SYNC).default().replace(error_code=0, protocol_type="consumer",
                                                          protocol_name="range", assignment=data)
    return bytes(c.answer(ex, body).assignment)


def group_clients(proxy: SansIOProxy, n: int) -> list[Client]:
    """``n`` consumers' clients (app-1..app-n, member ids m1..mn), none joined yet."""
    clients = [Client(proxy, f"app-{i + 1}", i + 1) for i in range(n)]
    for i, c in enumerate(clients):
        c.member_id = f"m{i + 1}"
    return clients


def form_group(proxy: SansIOProxy, n: int, partitions: int = 3) -> tuple[list[Client], dict[str, bytes]]:
    """``n`` members join (member ids m1..mn, m1 the leader); the leader's client assigns with a range assignor
    (whole partitions); returns the clients and what each member's client got from its SyncGroup."""
    clients = group_clients(proxy, n)
    return clients, join_all(clients, 1, partitions)


def join_all(clients: list[Client], generation: int, partitions: int = 3) -> dict[str, bytes]:
    """Every member joins ``generation`` (the first one the leader), and the leader's client assigns with a range
    assignor (whole partitions): what each member's client got from its SyncGroup."""
    exchanges = [join(c) for c in clients]
    joined = [(c.member_id, bytes(sent(ex).protocols[0].metadata)) for c, ex in zip(clients, exchanges, strict=True)]
    for c, ex in zip(clients[1:], exchanges[1:], strict=True):
        join_answer(c, ex, [], generation=generation, leader=clients[0].member_id)
    seen = join_answer(clients[0], exchanges[0], joined, generation=generation)
    for m in seen.members:  # the leader client sees every member's metadata without its marker
        assert bytes(m.metadata) == subscription([TOPIC])
    client_plan = {c.member_id: assignment({TOPIC: [i]} if i < partitions else {}) for i, c in enumerate(clients)}
    return sync_all(clients, generation, client_plan)


#: what the broker stores for each member (the leader's SyncGroup as it went upstream), by member id
STORED: dict[str, bytes] = {}


def sync_all(clients: list[Client], generation: int, plan: dict[str, bytes]) -> dict[str, bytes]:
    """The leader (the first client) sends ``plan``; every member's SyncGroup is answered with what the broker
    stored for it (kept in :data:`STORED`). What each client got."""
    leader_ex = sync(clients[0], generation, plan)
    stored = {a.member_id: bytes(a.assignment) for a in sent(leader_ex).assignments}
    STORED.clear()
    STORED.update(stored)
    got = {clients[0].member_id: sync_answer(clients[0], leader_ex, stored[clients[0].member_id])}
    for c in clients[1:]:
        got[c.member_id] = sync_answer(c, sync(c, generation, {}), stored[c.member_id])
    return got


def regroup(leader: Client, others: list[Client], generation: int, plan: dict[str, bytes]) -> dict[str, bytes]:
    """``leader`` and ``others`` join ``generation`` (the leader's join answered with every member's metadata) and
    the leader's client assigns ``plan``: what each member's client got from its SyncGroup."""
    ex = join(leader)
    members = [(leader.member_id, bytes(sent(ex).protocols[0].metadata))]
    members += [(c.member_id, bytes(sent(join(c)).protocols[0].metadata)) for c in others]
    join_answer(leader, ex, members, generation=generation)
    return sync_all([leader, *others], generation, plan)


def heartbeat_answer(c: Client, generation: int, error: int = 0) -> int:
    """``c``'s member heartbeats ``generation`` and the coordinator answers ``error``: the error code its client
    gets. Every heartbeat reaches the coordinator (it keeps the member's session alive)."""
    ex = heartbeat(c, generation)
    assert ex.answer is None
    return int(c.answer(ex, response_codec(HEARTBEAT, V_HB).default().replace(error_code=error)).error_code)


def records(n: int) -> bytes:
    return encode_batch(new_batch([Record(offset_delta=i, key=b"k%d" % i, value=b"v%d" % i) for i in range(n)],
                                  base_offset=100))


def fetch(c: Client, data: bytes) -> list[tuple[int, bytes]]:
    body = request_codec(FETCH, V_FETCH).default().replace(
        replica_id=-1, max_wait_ms=500, min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0,
        session_epoch=-1, rack_id="", forgotten_topics_data=[], topics=[Message(topic=TOPIC, partitions=[
            Message(partition=0, current_leader_epoch=-1, fetch_offset=100, last_fetched_epoch=-1,
                    log_start_offset=-1, partition_max_bytes=1 << 20)])])
    ex = c.send(FETCH, V_FETCH, body)
    view = FetchResponseView(V_FETCH, topics=[FetchTopic(TOPIC, partitions=[
        FetchPartition(0, high_watermark=100 + 50, last_stable_offset=150, log_start_offset=0, records=data)])])
    buffers, _ = view.encode_frame(ex.header.correlation_id)
    reply = c.proxy.respond(ex, b"".join(bytes(b) for b in buffers)[4:], c.conn)
    out = decode_frame(reply[4:], V_FETCH)[2]
    ((_, part),) = out.partitions()
    return [(b.base_offset + r.offset_delta, r.key or b"") for b in decode_batches(part.records or b"")
            for r in b.records]


# --------------------------------------------------------------------------------------------------- tests


def test_five_members_share_three_partitions_as_the_seed_assigns_them() -> None:
    proxy, _ = sharing_proxy()
    clients, got = form_group(proxy, 5)
    # range: contiguous runs, the first partitions one member more: p0 m1 m2, p1 m3 m4, p2 m5
    expected = {"m1": (0, Slice(0, 2)), "m2": (0, Slice(1, 2)), "m3": (1, Slice(0, 2)), "m4": (1, Slice(1, 2)),
                "m5": (2, Slice(0, 1))}
    policy: Sharing = proxy.policy("sharing")
    for c in clients:
        part, s = expected[c.member_id]
        # the client sees a plain assignment, without Sluice's trailer
        assert got[c.member_id] == assignment({TOPIC: [part]})
        m = policy.members.get(("10.0.0.1", c.client_id))
        assert m is not None and {tp: st.slice for tp, st in (m.partitions or {}).items()} == {(TOPIC, part): s}
    assert proxy.metrics.total("sluice_sharing_assignments_total") == 1
    assert proxy.metrics.total("sluice_sharing_partitions", group=GROUP) == 2


def test_each_member_gets_only_its_keys() -> None:
    proxy, _ = sharing_proxy()
    clients, _ = form_group(proxy, 5)
    data = records(40)
    m1, m2 = fetch(clients[0], data), fetch(clients[1], data)
    assert all(Slice(0, 2).holds(key_hash(k)) for _, k in m1) and all(Slice(1, 2).holds(key_hash(k)) for _, k in m2)
    assert sorted(m1 + m2) == [(100 + i, b"k%d" % i) for i in range(40)]
    assert proxy.metrics.total("sluice_sharing_records_filtered_total", reason="other_slice") == 40


def offset_fetch(c: Client, partitions: list[int]) -> Exchange:
    body = request_codec(OFFSET_FETCH, V_OF).default().replace(require_stable=True, groups=[Message(
        group_id=GROUP, member_id=c.member_id, member_epoch=-1,
        topics=[Message(name=TOPIC, partition_indexes=partitions)])])
    return c.send(OFFSET_FETCH, V_OF, body)


def offset_fetch_answer(c: Client, ex: Exchange, offsets: dict[int, int]) -> dict[int, tuple[int, str]]:
    body = response_codec(OFFSET_FETCH, V_OF).default().replace(groups=[Message(
        group_id=GROUP, error_code=0, topics=[Message(name=TOPIC, partitions=[
            Message(partition_index=p, committed_offset=o, committed_leader_epoch=5, metadata="", error_code=0)
            for p, o in offsets.items()])])])
    out = c.answer(ex, body)
    return {p.partition_index: (p.committed_offset, p.metadata) for p in out.groups[0].topics[0].partitions}


def commit(c: Client, offsets: dict[int, int], metadata: str = "mine") -> Exchange:
    body = request_codec(OFFSET_COMMIT, V_OC).default().replace(
        group_id=GROUP, generation_id_or_member_epoch=1, member_id=c.member_id, group_instance_id=None,
        topics=[Message(name=TOPIC, partitions=[Message(partition_index=p, committed_offset=o,
                                                        committed_leader_epoch=-1, committed_metadata=metadata)
                                                for p, o in offsets.items()])])
    return c.send(OFFSET_COMMIT, V_OC, body)


def test_commits_store_slice_positions_and_the_group_gets_the_stable_offset() -> None:
    proxy, fake = sharing_proxy()
    clients, _ = form_group(proxy, 5)
    m1, m2 = clients[0], clients[1]
    fake.offsets[GROUP] = {(TOPIC, 0): Committed(100, 3, None)}  # committed before the group grew
    for c in (m1, m2):
        ex = offset_fetch(c, [0])
        assert offset_fetch_answer(c, ex, {0: 100}) == {0: (100, "")}
    ex = commit(m1, {0: 130})
    # m1's position is its slice's; the group's commit goes on with the stable offset: m2's slice is at 100
    part = sent(ex).topics[0].partitions[0]
    assert part.committed_offset == 100 and decode_metadata(part.committed_metadata) == ([2], None)
    assert slice_group(GROUP, Slice(0, 2)) not in fake.offsets  # the slice's commit follows the group's
    committed_answer(m1, ex)
    assert fake.offsets[slice_group(GROUP, Slice(0, 2))][(TOPIC, 0)] == Committed(130, -1, "mine")
    fake.offsets[GROUP][(TOPIC, 0)] = Committed(100, -1, part.committed_metadata)
    ex = commit(m2, {0: 120})
    part = sent(ex).topics[0].partitions[0]
    assert part.committed_offset == 120  # min(130, 120)
    committed_answer(m2, ex)
    assert proxy.metrics.total("sluice_sharing_stable_offset_lag", group=GROUP) == 10
    # a commit behind the slice's start changes nothing
    calls = len(fake.calls)
    ex = commit(m1, {0: 90})
    committed_answer(m1, ex)
    assert fake.offsets[slice_group(GROUP, Slice(0, 2))][(TOPIC, 0)].offset == 130
    assert sent(ex).topics[0].partitions[0].committed_offset >= 100 and len(fake.calls) == calls + 1


def committed_answer(c: Client, ex: Exchange) -> Message:
    """The coordinator's answer to the group's commit ``ex``: in, every partition."""
    body = response_codec(OFFSET_COMMIT, V_OC).default().replace(topics=[
        Message(name=t.name, partitions=[Message(partition_index=p.partition_index, error_code=0)
                                         for p in t.partitions]) for t in sent(ex).topics])
    return c.answer(ex, body)


def two_members_of_partition_0_at_100() -> tuple[FakeCoordinators, Client, Client]:
    """A group of 5 sharing 3 partitions: partition 0's two members, each having read the group's offset 100."""
    fake, clients = group_of_5_at_100()
    return fake, clients[0], clients[1]


def group_of_5_at_100() -> tuple[FakeCoordinators, list[Client]]:
    """A group of 5 sharing 3 partitions (generation 1): partition 0's two members (the first two clients), each
    having read the group's offset 100."""
    proxy, fake = sharing_proxy()
    clients, _ = form_group(proxy, 5)
    fake.offsets[GROUP] = {(TOPIC, 0): Committed(100, -1, None)}
    for c in clients[:2]:
        offset_fetch_answer(c, offset_fetch(c, [0]), {0: 100})
    return fake, clients


def test_two_members_committing_at_once_leave_the_group_at_the_stable_offset() -> None:
    """m1 and m2 each read the other's slice before the other's commit (stable 100 both); m2's commits land first,
    then m1's: m1 reads again once its slice's commit is in, and commits the stable offset, 120, as m1 (its
    generation)."""
    fake, m1, m2 = two_members_of_partition_0_at_100()
    first = commit(m1, {0: 130})
    assert sent(first).topics[0].partitions[0].committed_offset == 100  # m2's slice as read: at 100
    second = commit(m2, {0: 120})
    assert sent(second).topics[0].partitions[0].committed_offset == 100  # m1's slice as read: at 100
    fake.offsets[GROUP][(TOPIC, 0)] = Committed(100, -1, sent(second).topics[0].partitions[0].committed_metadata)
    calls = len(fake.calls)
    committed_answer(m2, second)
    assert not any(c.commits and GROUP in c.commits for c in fake.calls[calls:])  # read again: m1 still at 100
    fake.offsets[GROUP][(TOPIC, 0)] = Committed(100, -1, sent(first).topics[0].partitions[0].committed_metadata)
    calls = len(fake.calls)
    committed_answer(m1, first)
    assert fake.offsets[GROUP][(TOPIC, 0)].offset == 120
    raised = [c for c in fake.calls[calls:] if c.commits and GROUP in c.commits]
    assert len(raised) == 1 and raised[0].as_member == {GROUP: (1, m1.member_id, None)}
    assert fake.calls[-1].reads and not fake.calls[-1].commits  # read once more: nothing left to raise


@pytest.mark.parametrize("error", [22, 25, 27, 113])
def test_a_fenced_members_late_commit_gets_the_coordinators_error_and_moves_no_position(error: int) -> None:
    """A member the coordinator fenced (classic: ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS;
    KIP-848: STALE_MEMBER_EPOCH, ConsumerGroup.validateOffsetCommit) commits late, after its slice went to another
    member: the group's commit is refused with that error, which the client gets as the coordinator gave it, and
    the slice's position stays where the slice's next holder read it (a simple commit of it, which no coordinator
    checks, would have moved it past records the next holder has yet to deliver)."""
    fake, m1, _ = two_members_of_partition_0_at_100()
    calls = len(fake.calls)
    ex = commit(m1, {0: 130})
    body = response_codec(OFFSET_COMMIT, V_OC).default().replace(topics=[
        Message(name=TOPIC, partitions=[Message(partition_index=0, error_code=error)])])
    assert m1.answer(ex, body).topics[0].partitions[0].error_code == error
    assert not [c for c in fake.calls[calls:] if c.commits]  # no position committed, nothing read again
    assert slice_group(GROUP, Slice(0, 2)) not in fake.offsets
    assert fake.offsets[GROUP][(TOPIC, 0)].offset == 100


def test_a_commit_of_a_partition_released_is_its_old_slices_position_not_the_groups() -> None:
    """kafka-go commits messages read in an earlier generation under the current one (Reader.CommitMessages): m2,
    moved off partition 0 by the next generation, commits the position of its old slice there. That is the
    slice's position; the group's commit goes on with the stable offset (the other slice is at 100), not with
    m2's position, which would say the other slice's records up to it were done."""
    fake, m1, m2 = two_members_of_partition_0_at_100()  # m1 holds slice 0/2 of partition 0, m2 slice 1/2
    m0, m6 = Client(m1.proxy, "app-0", 10), Client(m1.proxy, "app-6", 16)
    m0.member_id, m6.member_id = "m0", "m6"
    # generation 2: m0, m1, m2, m6, in that order: partition 0 m0 m1, partition 1 m2 (whole), partition 2 m6
    members = [m0, m1, m2, m6]
    exchanges = [join(c) for c in members]
    joined = [(c.member_id, bytes(sent(ex).protocols[0].metadata)) for c, ex in zip(members, exchanges, strict=True)]
    for c, ex in zip(members[1:], exchanges[1:], strict=True):
        join_answer(c, ex, [], generation=2, leader="m0")
    join_answer(m0, exchanges[0], joined, generation=2)
    got = sync_all(members, 2, {"m0": assignment({TOPIC: [0]}), "m1": assignment({TOPIC: [1]}),
                                "m2": assignment({TOPIC: [2]}), "m6": assignment({})})
    assert got["m2"] == assignment({TOPIC: [1]})
    ex = commit(m2, {0: 130, 1: 50})
    committed_answer(m2, ex)
    assert fake.offsets[slice_group(GROUP, Slice(1, 2))][(TOPIC, 0)] == Committed(130, -1, "mine")
    parts = {part.partition_index: part for part in sent(ex).topics[0].partitions}
    assert parts[0].committed_offset == 100 and decode_metadata(parts[0].committed_metadata) == ([2], None)
    assert parts[1].committed_offset == 50  # partition 1, held whole and never shared: the client's own commit
    # m1 keeps partition 0 with the other slice: left out this generation (it rejoins), and its commit there is
    # still slice 0/2's; the stable offset is now the lower of the two slices' positions
    assert got["m1"] == assignment({})
    ex = commit(m1, {0: 120})
    committed_answer(m1, ex)
    assert fake.offsets[slice_group(GROUP, Slice(0, 2))][(TOPIC, 0)] == Committed(120, -1, "mine")
    assert sent(ex).topics[0].partitions[0].committed_offset == 120


def test_offset_fetch_answers_each_member_its_slices_position() -> None:
    proxy, fake = sharing_proxy()
    clients, _ = form_group(proxy, 5)
    fake.offsets[GROUP] = {(TOPIC, 0): Committed(100, -1, "x")}
    fake.offsets[slice_group(GROUP, Slice(0, 2))] = {(TOPIC, 0): Committed(140, -1, "m1's")}
    ex = offset_fetch(clients[0], [0])
    assert offset_fetch_answer(clients[0], ex, {0: 100}) == {0: (140, "m1's")}
    ex = offset_fetch(clients[1], [0])
    assert offset_fetch_answer(clients[1], ex, {0: 100}) == {0: (100, "x")}


def test_a_new_layout_filters_what_an_earlier_one_committed() -> None:
    # an earlier generation had 2 members on partition 0 (slices 0/2 at 130, 1/2 at 110); now it is whole
    proxy, fake = sharing_proxy()
    clients, _ = form_group(proxy, 3)
    fake.offsets[GROUP] = {(TOPIC, 0): Committed(110, -1, encode_metadata([2], None, 4096))}
    fake.offsets[slice_group(GROUP, Slice(0, 2))] = {(TOPIC, 0): Committed(130, -1, None)}
    fake.offsets[slice_group(GROUP, Slice(1, 2))] = {(TOPIC, 0): Committed(110, -1, None)}
    ex = offset_fetch(clients[0], [0])
    assert offset_fetch_answer(clients[0], ex, {0: 110}) == {0: (110, "")}
    got = fetch(clients[0], records(40))
    expected = [(100 + i, b"k%d" % i) for i in range(40)
                if 100 + i >= (130 if Slice(0, 2).holds(key_hash(b"k%d" % i)) else 110)]
    assert got == expected  # nothing committed is delivered again, nothing else left out
    assert proxy.metrics.total("sluice_sharing_records_filtered_total", reason="committed") == 40 - len(expected)


def refused_retriably(ex: Exchange) -> bool:
    """The OffsetCommit ``ex`` was answered by Sluice (nothing went to the coordinator), COORDINATOR_NOT_AVAILABLE
    for every partition: the client finds its coordinator and commits again."""
    if ex.answer is None:
        return False
    answer = decode_response(OFFSET_COMMIT, V_OC, ex.answer[4:])[1]
    return {p.error_code for t in answer.topics for p in t.partitions} == {15}


def test_failed_own_requests_fail_commits_and_offset_fetches_retriably() -> None:
    proxy, fake = sharing_proxy()
    clients, _ = form_group(proxy, 5)
    fake.down = True
    # answered by Sluice: the group's commit is not sent without the slice's
    assert refused_retriably(commit(clients[0], {0: 130}))
    assert not fake.offsets
    ex = offset_fetch(clients[0], [0])
    body = response_codec(OFFSET_FETCH, V_OF).default().replace(groups=[Message(
        group_id=GROUP, error_code=0, topics=[Message(name=TOPIC, partitions=[Message(
            partition_index=0, committed_offset=100, committed_leader_epoch=-1, metadata="", error_code=0)])])])
    assert clients[0].answer(ex, body).groups[0].error_code == 14  # COORDINATOR_LOAD_IN_PROGRESS: retried


def test_a_group_whose_slice_groups_sluices_login_may_not_use_is_consumed_unshared() -> None:
    """A locked-down cluster granting Sluice's principal the group by its literal name only: its slice groups are
    refused, so Sluice asks before sharing (one OffsetFetch of a slice group) and the group goes on as its clients
    assign it, their offsets the group's own; said, and asked again RECHECK_S later: granted by then, the group is
    made to rejoin and shared."""
    proxy, fake = sharing_proxy()
    fake.denied = {GROUP}
    plan = {"m1": assignment({TOPIC: [0]}), "m2": assignment({TOPIC: [1]}), "m3": assignment({TOPIC: [2]})}
    with capture_logs() as events:
        clients = group_clients(proxy, 5)
        exchanges = [join(c) for c in clients]
        for ex in exchanges:  # not marked: the leader's assignor sees the subscriptions as the clients sent them
            assert bytes(sent(ex).protocols[0].metadata) == subscription([TOPIC])
        joined = [(c.member_id, subscription([TOPIC])) for c in clients]
        for c, ex in zip(clients[1:], exchanges[1:], strict=True):
            join_answer(c, ex, [], leader="m1")
        join_answer(clients[0], exchanges[0], joined)
        got = sync_all(clients, 1, {c.member_id: plan.get(c.member_id, assignment({})) for c in clients})
    assert got == {c.member_id: plan.get(c.member_id, assignment({})) for c in clients}
    checks = [c for c in fake.calls if c.reads]
    assert [sorted(c.reads) for c in checks] == [[slice_group(GROUP, Slice(0, 2))]]  # asked once, not per member
    assert proxy.metrics.total("sluice_sharing_assignments_total") == 0
    # learnt once, and each member's join left unmarked
    assert proxy.metrics.total("sluice_sharing_not_shared_total", reason="slice_groups_refused") == 1 + 5
    said = [e for e in events if e["event"] == "sharing_slice_groups_refused"]
    assert said and "Read and Describe on the group id as a prefix" in said[0]["detail"]
    ex = offset_fetch(clients[0], [0])
    assert ex.pending is None and ex.answer is None  # the group's own offsets, relayed: nothing of Sluice's read
    assert offset_fetch_answer(clients[0], ex, {0: 100}) == {0: (100, "")}
    assert len(fetch(clients[0], records(40))) == 40  # partition 0 whole, nothing filtered
    # a rebalance soon after is not asked again; a heartbeat RECHECK_S later is, and once the grant exists, the
    # members are made to rejoin: the group is shared from the next generation
    join_all(clients, 2)
    assert heartbeat_answer(clients[0], 2) == 0
    assert len([c for c in fake.calls if c.reads]) == 1
    fake.denied = set()
    assert heartbeat_answer(clients[0], 2) == 0
    proxy.clock.now += RECHECK_S
    assert heartbeat_answer(clients[0], 2) == 27  # REBALANCE_IN_PROGRESS: granted now, it rejoins
    assert heartbeat_answer(clients[4], 2) == 27
    got = join_all(clients, 3)
    assert proxy.metrics.total("sluice_sharing_assignments_total") == 1
    assert got["m4"] != assignment({}) and marker.strip_assignment(STORED["m4"])[1]  # m4 holds a slice now


def test_a_refusal_learnt_from_a_shared_groups_calls_makes_its_members_rejoin_unshared() -> None:
    """The grant revoked from a group already shared: the first call refused files the group, its members holding
    slices are made to rejoin, unmarked; a partition kept with its slice widened to whole is left out one generation
    (as any slice that widens), then handed whole, its offsets the group's own."""
    proxy, fake = sharing_proxy()
    clients, _ = form_group(proxy, 5)  # m1 holds slice 0/2 of partition 0
    m1 = clients[0]
    fake.denied = {GROUP}
    assert refused_retriably(commit(m1, {0: 130}))  # one slice's position is never the group's commit
    assert GROUP not in fake.offsets
    assert proxy.metrics.total("sluice_sharing_not_shared_total", reason="slice_groups_refused") == 1
    assert heartbeat_answer(m1, 1) == 27  # REBALANCE_IN_PROGRESS: it rejoins
    plan = {"m1": assignment({TOPIC: [0]}), "m2": assignment({TOPIC: [1]}), "m3": assignment({TOPIC: [2]})}
    got = join_all(clients, 2)
    assert got["m1"] == assignment({})  # partition 0 left out: m1's client would go on from its slice's position
    assert heartbeat_answer(m1, 2) == 27
    got = join_all(clients, 3)
    assert got == {c.member_id: plan.get(c.member_id, assignment({})) for c in clients}
    ex = offset_fetch(m1, [0])
    assert ex.pending is None and ex.answer is None  # relayed: the group's commit, the slices' stable offset
    assert offset_fetch_answer(m1, ex, {0: 100}) == {0: (100, "")}
    ex = commit(m1, {0: 140})
    assert ex.answer is None and sent(ex).topics[0].partitions[0].committed_offset == 140
    assert len(fetch(m1, records(40))) == 40


def test_a_partition_kept_with_a_grown_slice_is_left_out_and_its_member_rejoins() -> None:
    proxy, _ = sharing_proxy()
    clients, _ = form_group(proxy, 5)  # m1 holds slice 0/2 of partition 0
    # the next generation has 3 members: no sharing, m1 gets partition 0 whole. Its client goes on from its
    # position in the partition, past records of the other half of the keys: the partition is left out this
    # generation, and m1 is made to rejoin, so that it starts it from the committed offset next time.
    m1, m3, m4 = clients[0], clients[2], clients[3]
    plan = {"m1": assignment({TOPIC: [0]}), "m3": assignment({TOPIC: [1]}), "m4": assignment({TOPIC: [2]})}
    got = regroup(m1, [m3, m4], 2, plan)
    assert got["m1"] == assignment({})  # partition 0 left out this generation
    assert got["m3"] == assignment({})  # so is partition 1 for m3 (slice 0/2 before)
    assert got["m4"] == assignment({TOPIC: [2]})  # 1/2 of partition 1 -> partition 2 whole: a new partition
    assert heartbeat_answer(m1, 2) == 27  # REBALANCE_IN_PROGRESS
    # and again, until its JoinGroup: librdkafka ignores the answer while its application has not taken up the
    # assignment yet (join-state WAIT_ASSIGN_CALL), as it ignores the coordinator's while a rebalance runs
    assert heartbeat_answer(m1, 2) == 27
    assert heartbeat_answer(m1, 2, error=25) == 25  # the coordinator's own error stands (UNKNOWN_MEMBER_ID)
    assert heartbeat_answer(m4, 2) == 0  # m4 was handed a partition new to it: nothing to rejoin for
    assert proxy.metrics.total("sluice_sharing_rejoins_total") == 2
    # in the generation after, the same assignment: partition 0 is new to m1's client, nothing left out
    assert regroup(m1, [m3, m4], 3, plan)["m1"] == assignment({TOPIC: [0]})
    assert heartbeat_answer(m1, 3) == 0  # it rejoined: its heartbeats are the coordinator's to answer again


def test_a_partition_left_out_stays_left_out_until_its_client_is_seen_to_take_up_an_assignment_without_it() -> None:
    """As above, but m1's client throws generation 2's finished join away unread and joins again (kafka-python
    3.0.12 does when poll()'s timeout ran out while the join was in flight): its position in partition 0 is still
    its slice 0/2's, past records of the other half of the keys. Generation 3 leaves partition 0 out again; once a
    Heartbeat names generation 3 (its client took that assignment up, without partition 0), generation 4 hands
    the partition whole, new to its client."""
    proxy, _ = sharing_proxy()
    clients, _ = form_group(proxy, 5)  # m1 holds slice 0/2 of partition 0
    m1, m3, m4 = clients[0], clients[2], clients[3]
    plan = {"m1": assignment({TOPIC: [0]}), "m3": assignment({TOPIC: [1]}), "m4": assignment({TOPIC: [2]})}
    assert regroup(m1, [m3, m4], 2, plan)["m1"] == assignment({})  # partition 0 left out, m1 to rejoin
    # no heartbeat of generation 2: its client may keep slice 0/2's
    assert regroup(m1, [m3, m4], 3, plan)["m1"] == assignment({})
    assert heartbeat_answer(m1, 3) == 27  # REBALANCE_IN_PROGRESS
    assert regroup(m1, [m3, m4], 4, plan)["m1"] == assignment({TOPIC: [0]})
    policy: Sharing = proxy.policy("sharing")
    m = policy.members.get(("10.0.0.1", "app-1"))
    assert m is not None and {tp: st.slice for tp, st in (m.partitions or {}).items()} == {(TOPIC, 0): WHOLE}


def test_a_partition_kept_with_a_narrower_slice_is_left_out_and_its_member_rejoins() -> None:
    """m1 holds partition 0 whole and its client has fetched records of every key; the next generation splits the
    partition between m1 and a new member. Narrowed in place, m1's client would still deliver the records it fetched
    of the keys it lost, which their new holder starts from the last commit: twice. So the partition is left out of
    m1's assignment this generation and m1 rejoins; in the generation after, it is new to m1's client, which starts
    from its slice's committed position."""
    proxy, _ = sharing_proxy()
    clients, got = form_group(proxy, 3)  # m1 holds partition 0 whole
    assert got["m1"] == assignment({TOPIC: [0]})
    m4 = Client(proxy, "app-4", 4)
    m4.member_id = "m1b"
    members = [clients[0], m4, *clients[1:]]  # range, by member id: p0 m1 m1b, p1 m2, p2 m3

    def generation(n: int) -> dict[str, bytes]:
        exchanges = [join(c) for c in members]
        joined = [(c.member_id, bytes(sent(ex).protocols[0].metadata))
                  for c, ex in zip(members, exchanges, strict=True)]
        for c, ex in zip(members[1:], exchanges[1:], strict=True):
            join_answer(c, ex, [], generation=n, leader="m1")
        join_answer(members[0], exchanges[0], joined, generation=n)
        return sync_all(members, n, {"m1": assignment({TOPIC: [0]}), "m1b": assignment({}),
                                     "m2": assignment({TOPIC: [1]}), "m3": assignment({TOPIC: [2]})})

    got = generation(2)
    assert got["m1"] == assignment({})  # slice 0/2 of the partition it held whole: left out this generation
    assert got["m1b"] == assignment({TOPIC: [0]})  # slice 1/2: a partition new to its client
    assert heartbeat_answer(clients[0], 2) == 27  # REBALANCE_IN_PROGRESS
    got = generation(3)
    assert got["m1"] == assignment({TOPIC: [0]}) and got["m1b"] == assignment({TOPIC: [0]})
    policy: Sharing = proxy.policy("sharing")
    m = policy.members.get(("10.0.0.1", "app-1"))
    assert m is not None and {tp: st.slice for tp, st in (m.partitions or {}).items()} == {(TOPIC, 0): Slice(0, 2)}


def test_collision_two_consumers_with_one_client_id_are_not_marked() -> None:
    proxy, _ = sharing_proxy()
    a, b = Client(proxy, "app-same", 1), Client(proxy, "app-same", 2)
    a.member_id = "ma"
    first = sent(join(a)).protocols[0].metadata
    b.member_id = "mb"
    second = sent(join(b)).protocols[0].metadata
    assert marker.strip_subscription(bytes(first))[1] == {TOPIC}
    assert marker.strip_subscription(bytes(second))[1] is None  # not marked
    assert proxy.metrics.total("sluice_sharing_not_shared_total", reason="client_id_collision") >= 1


def test_clients_not_opted_in_and_topics_not_shared_are_not_marked() -> None:
    proxy, fake = sharing_proxy(**{"sharing.topics": [{"topic": "orders*"}, {"topic": "orders", "shared": False}]})
    c = Client(proxy, "app-1", 1)
    assert marker.strip_subscription(bytes(sent(join(c)).protocols[0].metadata))[1] is None  # exempt topic
    assert not fake.calls  # a group it would never share: its slice groups are not asked about (.access)
    proxy, fake = sharing_proxy()
    c = Client(proxy, "other", 1)
    assert marker.strip_subscription(bytes(sent(join(c)).protocols[0].metadata))[1] is None  # not opted in
    assert not fake.calls


def test_a_kafka_streams_member_is_logged_and_not_shared() -> None:
    # Streams' assignor maps each partition to one task: slices added to its assignment break its task check
    proxy, _ = sharing_proxy()
    c = Client(proxy, "app-streams-1", 1)
    assert marker.strip_subscription(bytes(sent(join(c, protocol="stream")).protocols[0].metadata))[1] is None
    assert proxy.metrics.total("sluice_sharing_not_shared_total", reason="streams_group") == 1


def test_clients_opt_in_by_principal_or_address_as_well_as_client_id() -> None:
    """``sharing.clients`` takes client selectors: who authenticated (SASL principal) or where the client is."""
    proxy, _ = sharing_proxy(**{"sharing.clients": [{"principal": "etl-*"}, {"client_address": "10.9.0.0/16"}]})
    by_principal, by_address, neither = Client(proxy, "any-1", 1), Client(proxy, "any-2", 2), Client(proxy, "any-3", 3)
    by_principal.conn.info.principal = "etl-orders"
    by_address.conn = proxy.connect(2, host="10.9.4.2")
    marks = [marker.strip_subscription(bytes(sent(join(c)).protocols[0].metadata))[1]
             for c in (by_principal, by_address, neither)]
    assert marks == [{TOPIC}, {TOPIC}, None]


def test_malformed_marker_in_the_leaders_answer_is_logged_and_left() -> None:
    proxy, _ = sharing_proxy()
    leader = Client(proxy, "app-1", 1)
    leader.member_id = "m1"
    ex = join(leader)
    garbage = subscription([TOPIC]) + b"\x00\x00S\xff\xff" + (5).to_bytes(4, "big") + marker.MAGIC
    seen = join_answer(leader, ex, [("m1", bytes(sent(ex).protocols[0].metadata)), ("m2", garbage)])
    assert bytes(seen.members[1].metadata) == garbage  # unreadable: left as it is (clients ignore it)
    assert proxy.metrics.total("sluice_sharing_not_shared_total", reason="bad_marker") == 1


def test_unknown_member_fetches_are_withheld_then_pass_after_member_wait() -> None:
    proxy, _ = sharing_proxy(**{"sharing.member_wait_s": 5.0})
    c = Client(proxy, "app-9", 1)
    assert fetch(c, records(10)) == []
    assert proxy.metrics.total("sluice_sharing_withheld_partitions_total") == 1
    proxy.clock.now += 6
    assert len(fetch(c, records(10))) == 10  # no group member ever showed up: not a group consumer
    assert proxy.metrics.total("sluice_sharing_not_shared_total", reason="member_unknown") == 1


def test_restarted_sluice_recovers_slices_from_the_group() -> None:
    proxy, fake = sharing_proxy()
    clients, _ = form_group(proxy, 5)
    # A new Sluice (restarted): the member's client goes on fetching; its next heartbeat names the member, and
    # Sluice reads its assignment back from the group: the broker keeps it as the leader sent it, slices included
    m1, fake2 = restarted_m1(fake, clients[0])
    assert fetch(m1, records(10)) == []  # not known yet: withheld, not delivered unfiltered
    heartbeat_m1(m1)
    got = fetch(m1, records(40))
    assert got and all(Slice(0, 2).holds(key_hash(k)) for _, k in got)
    assert [e for e in fake2.calls if e.describe == {GROUP}]


def test_a_commit_of_a_member_a_restarted_sluice_failed_to_learn_is_refused_retriably() -> None:
    """A restarted Sluice's recovery of the member's slices failed (the describe timed out, the coordinator moved):
    its commit is refused retriably, as when Sluice's read for a commit fails. Before, it went on as the client sent
    it: the group's commit at m1's own position, 110, with m2's slice at 100, so m2's records 100-109 counted as
    done and were lost to the next holder of its keys after a rebalance. Once the group can be read, the commit goes
    on with the stable offset."""
    fake, clients = group_of_5_at_100()
    c, fake2 = restarted_m1(fake, clients[0])
    fake2.down = True
    assert refused_retriably(commit(c, {0: 110}))
    assert fake2.offsets[GROUP][(TOPIC, 0)].offset == 100
    fake2.down = False
    ex = commit(c, {0: 110})
    assert ex.answer is None and sent(ex).topics[0].partitions[0].committed_offset == 100


def restarted_m1(fake: FakeCoordinators, m1: Client) -> tuple[Client, FakeCoordinators]:
    """m1's client through a new (restarted) Sluice, whose coordinators hold ``fake``'s offsets and the group's
    description as the broker keeps it (m1's assignment as the leader sent it, slices included)."""
    m1_metadata = bytes(sent(join(m1)).protocols[0].metadata)
    restarted, fake2 = sharing_proxy()
    fake2.offsets = fake.offsets
    fake2.described[GROUP] = Message(protocol_data="range", members=[Message(
        member_id="m1", member_metadata=m1_metadata, member_assignment=STORED["m1"])])
    c = Client(restarted, "app-1", 7)
    c.member_id = "m1"
    return c, fake2


def heartbeat_m1(c: Client) -> None:
    """m1's heartbeat (generation 1): what names the member to a restarted Sluice."""
    c.send(HEARTBEAT, V_HB, request_codec(HEARTBEAT, V_HB).default().replace(
        group_id=GROUP, generation_id=1, member_id="m1", group_instance_id=None))


def test_an_idle_slice_of_a_member_a_restarted_sluice_recovered_is_committed_on() -> None:
    """A Sluice restarted before it committed an idle slice on (the partition's tail is the other slice's records):
    once it has read the member's slices and their positions back from the group, the member's fetches that find
    nothing of its slice commit it on and raise the group's stable offset, as before the restart. Before, a
    recovered slice's position counted as not known, so Sluice never committed it on, and a member with nothing
    more to commit left the group short of the partition's end for good."""
    fake, clients = group_of_5_at_100()
    m1, m2 = clients[0], clients[1]
    committed_answer(m1, commit(m1, {0: 110}))
    committed_answer(m2, commit(m2, {0: 120}))  # 110-119 are m2's slice's records: m1 has nothing more
    assert fake.offsets[GROUP][(TOPIC, 0)].offset == 110
    c, _ = restarted_m1(fake, m1)
    heartbeat_m1(c)
    answer_fetch(c, fetch_at(c, 110), one_per_batch(110, keys_in(Slice(0, 2), 10, other=True)), hw=120,
                 may_resend=False)
    assert fake.offsets[slice_group(GROUP, Slice(0, 2))][(TOPIC, 0)].offset == 120
    assert fake.offsets[GROUP][(TOPIC, 0)].offset == 120


TOPIC_ID = bytes(range(16))
CG_HEARTBEAT, V_CGH = 68, 1


def cg_described(epoch: int, members: list[tuple[str, str, list[int]]]) -> Message:
    """A ConsumerGroupDescribe entry: (member id, client id as the broker saw it, current = target partitions)."""
    def assigned(parts: list[int]) -> Message:
        return Message(topic_partitions=[Message(topic_id=TOPIC_ID, topic_name=TOPIC, partitions=parts)] if parts
                       else [])
    return Message(error_code=0, error_message=None, group_id=GROUP, group_state="Stable", group_epoch=epoch,
                   assignment_epoch=epoch, assignor_name="uniform", members=[
                       Message(member_id=mid, instance_id=None, rack_id=None, member_epoch=epoch, client_id=cid,
                               client_host="/127.0.0.1", subscribed_topic_names=[TOPIC], subscribed_topic_regex=None,
                               assignment=assigned(ps), target_assignment=assigned(ps)) for mid, cid, ps in members])


def cg_heartbeat(c: Client, epoch: int, owned: list[int] | None, subscribe: bool = False) -> Exchange:
    body = request_codec(CG_HEARTBEAT, V_CGH).default().replace(
        group_id=GROUP, member_id=c.member_id, member_epoch=epoch, rebalance_timeout_ms=30000,
        subscribed_topic_names=[TOPIC] if subscribe else None,
        topic_partitions=None if owned is None else [Message(topic_id=TOPIC_ID, partitions=owned)])
    return c.send(CG_HEARTBEAT, V_CGH, body)


def cg_answer(c: Client, ex: Exchange, epoch: int, assigned: list[int] | None) -> list[int] | None:
    """The broker's answer (``assigned`` None: no assignment in it, unchanged); the partitions the client is handed
    (None: none in the answer it gets)."""
    body = response_codec(CG_HEARTBEAT, V_CGH).default().replace(
        member_id=c.member_id, member_epoch=epoch, heartbeat_interval_ms=5000,
        assignment=None if assigned is None else Message(topic_partitions=[
            Message(topic_id=TOPIC_ID, partitions=assigned)]))
    got = c.answer(ex, body).assignment
    return None if got is None else sorted(p for t in got.topic_partitions for p in t.partitions)


def owned_sent(ex: Exchange) -> list[int] | None:
    tps = sent(ex).topic_partitions
    return None if tps is None else sorted(p for t in tps for p in t.partitions)


def test_kip848_group_shared_by_heartbeats_the_broker_seeing_its_own_assignment() -> None:
    """Two opted-in KIP-848 members of a one-partition topic: the broker assigns the partition to m1; each client is
    handed a slice of it once no other member claims an overlapping one, the broker is told each member owns what it
    assigned it, and the slice that widens when m2 leaves is revoked from m1's client first, then handed again."""
    proxy, fake = sharing_proxy()
    c1, c2 = Client(proxy, "app-1", 1), Client(proxy, "app-2", 2)
    c1.member_id, c2.member_id = "m1", "m2"

    def described(epoch: int, m1_claims: str, with_m2: bool = True) -> None:
        members = [("m1", f"app-1#sluice-share=orders|{m1_claims}", [0])]
        fake.described_consumer[GROUP] = cg_described(epoch, members + ([("m2", "app-2#sluice-share=orders|", [])]
                                                                        if with_m2 else []))

    described(2, "")
    ex = cg_heartbeat(c1, 0, [], subscribe=True)
    # the opt-in and the slice about to be handed, kept in the group by the broker
    assert decode_request(ex.frame)[0].client_id == "app-1#sluice-share=orders|0:0:0/2"
    assert cg_answer(c1, ex, 1, [0]) == [0]
    # m1's client still claims the whole partition (as described): m2's slice waits, nothing is handed
    described(2, "0:0:0/1")
    ex = cg_heartbeat(c2, 0, [], subscribe=True)
    assert decode_request(ex.frame)[0].client_id == "app-2#sluice-share=orders|"
    assert cg_answer(c2, ex, 2, []) == []
    described(2, "0:0:0/2")
    ex = cg_heartbeat(c2, 2, [])
    assert decode_request(ex.frame)[0].client_id == "app-2#sluice-share=orders|0:0:1/2"
    assert cg_answer(c2, ex, 2, None) == [0]  # m2: nothing from the broker, a slice of partition 0 from Sluice
    got1, got2 = fetch(c1, records(40)), fetch(c2, records(40))
    assert got1 and got2 and len(got1) + len(got2) == 40
    assert all(Slice(0, 2).holds(key_hash(k)) for _, k in got1)
    assert all(Slice(1, 2).holds(key_hash(k)) for _, k in got2)
    # m2's client owns partition 0; the broker hears that it owns what the broker assigned it: nothing
    ex = cg_heartbeat(c2, 2, [0])
    assert owned_sent(ex) == []
    assert cg_answer(c2, ex, 2, None) is None  # nothing changed: the answer goes as it came
    # m2 leaves: m1's partition is whole again. Its client keeps it from its own position, past records of m2's
    # keys, unless it is revoked first: handed nothing, then the partition again once the client let it go
    described(3, "0:0:0/2", with_m2=False)
    ex = cg_heartbeat(c1, 1, [0])
    assert owned_sent(ex) == [0]
    assert cg_answer(c1, ex, 3, None) is None  # a new epoch: the group is described before the next heartbeat goes
    ex = cg_heartbeat(c1, 3, None)
    assert cg_answer(c1, ex, 3, None) == []
    ex = cg_heartbeat(c1, 3, [])
    assert owned_sent(ex) == [0]  # the broker's own assignment: it never sees the partition revoked
    assert decode_request(ex.frame)[0].client_id == "app-1#sluice-share=orders|0:0:0/1"
    assert cg_answer(c1, ex, 3, None) == [0]
    assert len(fetch(c1, records(40))) == 40


def test_kip848_group_whose_slice_groups_sluices_login_may_not_use_is_consumed_unshared() -> None:
    """A KIP-848 group refused its slice groups: its members' heartbeats go unmarked (no opt-in in the client id,
    nothing claimed) and each client is handed what the broker assigned it."""
    proxy, fake = sharing_proxy()
    fake.denied = {GROUP}
    c1, c2 = Client(proxy, "app-1", 1), Client(proxy, "app-2", 2)
    c1.member_id, c2.member_id = "m1", "m2"
    fake.described_consumer[GROUP] = cg_described(2, [("m1", "app-1", [0]), ("m2", "app-2", [])])
    ex = cg_heartbeat(c1, 0, [], subscribe=True)
    assert decode_request(ex.frame)[0].client_id == "app-1"
    assert cg_answer(c1, ex, 1, [0]) == [0]
    ex = cg_heartbeat(c2, 0, [], subscribe=True)
    assert decode_request(ex.frame)[0].client_id == "app-2"
    assert cg_answer(c2, ex, 2, []) == []
    assert len(fetch(c1, records(40))) == 40
    assert [sorted(c.reads) for c in fake.calls if c.reads] == [[slice_group(GROUP, Slice(0, 2))]]


def test_kip848_refusal_learnt_from_a_shared_groups_calls_unshares_it_through_its_heartbeats() -> None:
    """A KIP-848 group shared, then its slice groups refused to Sluice's login: nothing is laid out any more, so each
    client is handed the broker's assignment as slices change: m2's slice taken back, m1's widened to the whole
    partition revoked first and handed again once m2's claim is gone (new to its client: from the group's committed
    offset). A member whose client holds what the broker assigned it goes unmarked."""
    proxy, fake = sharing_proxy()
    c1, c2 = Client(proxy, "app-1", 1), Client(proxy, "app-2", 2)
    c1.member_id, c2.member_id = "m1", "m2"
    fake.described_consumer[GROUP] = cg_described(2, [("m1", "app-1#sluice-share=orders|0:0:0/2", [0]),
                                                      ("m2", "app-2#sluice-share=orders|0:0:1/2", [])])
    ex = cg_heartbeat(c1, 0, [], subscribe=True)
    assert cg_answer(c1, ex, 2, [0]) == [0]
    ex = cg_heartbeat(c2, 0, [], subscribe=True)
    assert cg_answer(c2, ex, 2, []) == [0]
    assert len(fetch(c1, records(40))) + len(fetch(c2, records(40))) == 40  # shared: each its slice's keys
    fake.denied = {GROUP}
    assert refused_retriably(commit(c2, {0: 130}))
    ex = cg_heartbeat(c2, 2, [0])
    assert cg_answer(c2, ex, 2, None) == []  # m2's slice taken back: the broker assigned it nothing
    ex = cg_heartbeat(c2, 2, [])
    assert decode_request(ex.frame)[0].client_id == "app-2"  # holds what the broker assigned it: unmarked
    assert cg_answer(c2, ex, 2, None) is None
    fake.described_consumer[GROUP] = cg_described(2, [("m1", "app-1#sluice-share=orders|0:0:0/2", [0]),
                                                      ("m2", "app-2", [])])
    ex = cg_heartbeat(c1, 2, [0])
    assert cg_answer(c1, ex, 2, None) == []  # widened to whole: revoked from the client first
    ex = cg_heartbeat(c1, 2, [])
    assert cg_answer(c1, ex, 2, None) == [0]  # then handed whole, m2's claim gone
    ex = cg_heartbeat(c1, 2, [0])
    assert decode_request(ex.frame)[0].client_id == "app-1"
    assert cg_answer(c1, ex, 2, None) is None
    assert len(fetch(c1, records(40))) == 40
    ex = offset_fetch(c1, [0])
    assert ex.pending is None and ex.answer is None  # the group's own offsets, relayed
    # the grant added: a heartbeat RECHECK_S later asks again, and the member is marked again, shared from here on.
    # The group's epoch does not move, so the group is described at its heartbeats until the description shows its
    # mark: a layout of unmarked client ids lays out nothing
    fake.denied = set()
    proxy.clock.now += RECHECK_S

    def described() -> int:
        return len([c for c in fake.calls if c.describe_consumer])

    before = described()
    ex = cg_heartbeat(c2, 2, [])
    assert decode_request(ex.frame)[0].client_id == "app-2#sluice-share=orders|"
    assert cg_answer(c2, ex, 2, None) is None
    ex = cg_heartbeat(c2, 2, [])
    assert cg_answer(c2, ex, 2, None) is None and described() == before + 2  # not seen marked yet: again
    fake.described_consumer[GROUP] = cg_described(2, [("m1", "app-1#sluice-share=orders|", [0]),
                                                      ("m2", "app-2#sluice-share=orders|", [])])
    ex = cg_heartbeat(c2, 2, [])
    assert decode_request(ex.frame)[0].client_id == "app-2#sluice-share=orders|0:0:1/2"  # laid out: claimed
    assert cg_answer(c2, ex, 2, None) == [0]  # a slice of partition 0: shared again


def test_kip848_member_learnt_from_the_group_after_a_restart() -> None:
    """A Sluice that never saw the member join: its first heartbeat (epoch 5, nothing owned said) waits for the
    group's description, which gives the broker's assignment, the marked topics and the slice the client holds
    (its previous Sluice's claim): nothing to hand anew, its fetches filtered by that slice."""
    proxy, fake = sharing_proxy()
    c = Client(proxy, "app-2", 1)
    c.member_id = "m2"
    fake.described_consumer[GROUP] = cg_described(5, [("m1", "app-1#sluice-share=orders|0:0:0/2", [0]),
                                                      ("m2", "app-2#sluice-share=orders|0:0:1/2", [])])
    ex = cg_heartbeat(c, 5, None)
    assert decode_request(ex.frame)[0].client_id == "app-2#sluice-share=orders|0:0:1/2"
    assert owned_sent(ex) == []  # the broker's assignment of m2, as described
    assert cg_answer(c, ex, 5, None) is None  # it holds its layout already
    got = fetch(c, records(40))
    assert got and all(Slice(1, 2).holds(key_hash(k)) for _, k in got)


def test_kip848_member_a_restarted_sluice_failed_to_describe_gets_no_records_until_it_is_learnt() -> None:
    """A Sluice that never saw the member join fails to describe its group at the member's first heartbeat (the
    coordinator moving, a timeout): nothing is known of the slice its client holds, so its fetches are withheld, as
    a classic member's are until its recovery, and its heartbeat is answered COORDINATOR_NOT_AVAILABLE, not sent on:
    the broker stores each heartbeat's client id (GroupMetadataManager.consumerGroupHeartbeat), and one without the
    member's slices (this Sluice knows none) would leave the next description nothing to learn them from. The
    client sends it again, and that one describes the group again. Before, the failed description left the member
    taken as sharing nothing: its fetches got every slice's records."""
    proxy, fake = sharing_proxy()
    c = Client(proxy, "app-2", 1)
    c.member_id = "m2"
    fake.described_consumer[GROUP] = cg_described(5, [("m1", "app-1#sluice-share=orders|0:0:0/2", [0]),
                                                      ("m2", "app-2#sluice-share=orders|0:0:1/2", [])])
    fake.down = True
    ex = cg_heartbeat(c, 5, None)
    assert ex.answer is not None  # answered by Sluice: nothing went to the broker
    assert decode_response(CG_HEARTBEAT, V_CGH, ex.answer[4:])[1].error_code == 15  # COORDINATOR_NOT_AVAILABLE
    assert fetch(c, records(40)) == []
    # and its commit too: sent on, it would be the group's at its own position, the other slice's records below
    # it counted as done
    assert refused_retriably(commit(c, {0: 130}))
    fake.down = False
    ex = cg_heartbeat(c, 5, None)
    assert decode_request(ex.frame)[0].client_id == "app-2#sluice-share=orders|0:0:1/2"
    assert cg_answer(c, ex, 5, None) is None
    got = fetch(c, records(40))
    assert got and all(Slice(1, 2).holds(key_hash(k)) for _, k in got)


def test_kip848_an_idle_slice_of_a_member_a_restarted_sluice_learnt_from_its_heartbeat_is_committed_on() -> None:
    """The KIP-848 counterpart of a classic member's recovery: a Sluice restarted before it committed m1's idle
    slice on (110-119 are m2's slice's records, so m1 has nothing more to commit) learns m1 from the group's
    description at its first heartbeat, and reads its slice's position back from the group before the heartbeat
    goes on. m1's next fetch that finds nothing of its slice commits it on and raises the group's stable offset.
    Before, the slice's state was made without reading it (its position not known): Sluice never committed it on,
    and the group stayed short of the partition's end for good."""
    proxy, fake = sharing_proxy()
    fake.offsets = {GROUP: {(TOPIC, 0): Committed(110, -1, None)},
                    slice_group(GROUP, Slice(0, 2)): {(TOPIC, 0): Committed(110, -1, None)},
                    slice_group(GROUP, Slice(1, 2)): {(TOPIC, 0): Committed(120, -1, None)}}
    fake.described_consumer[GROUP] = cg_described(5, [("m1", "app-1#sluice-share=orders|0:0:0/2", [0]),
                                                      ("m2", "app-2#sluice-share=orders|0:0:1/2", [])])
    c = Client(proxy, "app-1", 1)
    c.member_id = "m1"
    assert cg_answer(c, cg_heartbeat(c, 5, None), 5, None) is None  # it holds its layout already
    assert idle_slice_committed_on(fake, c, 110, Slice(0, 2))
    assert fake.offsets[GROUP][(TOPIC, 0)].offset == 120


def test_kip848_member_whose_slices_a_restarted_sluice_failed_to_read_gets_no_records_until_it_is_learnt() -> None:
    """The group described, the read of the member's slices' positions fails (the coordinator moving, a timeout):
    its heartbeat goes on as learnt (its claims kept in its client id, its owned partitions the broker's), but the
    member stays unknown, its fetches withheld, and its next heartbeat describes the group and reads again. The
    member is named in the log once (``sharing_member_unreadable``), not at each try: the refusal behind it (no
    Read or Describe on the slice groups for Sluice's principal) is logged once per process, not per member."""
    proxy, fake = sharing_proxy()
    fake.described_consumer[GROUP] = cg_described(5, [("m1", "app-1#sluice-share=orders|0:0:0/2", [0]),
                                                      ("m2", "app-2#sluice-share=orders|0:0:1/2", [])])
    c = Client(proxy, "app-2", 1)
    c.member_id = "m2"
    fake.refuse = lambda call: bool(call.reads)
    with capture_logs() as events:
        ex = cg_heartbeat(c, 5, None)
        assert decode_request(ex.frame)[0].client_id == "app-2#sluice-share=orders|0:0:1/2"
        assert owned_sent(ex) == []
        assert cg_answer(c, ex, 5, None) is None
        assert fetch(c, records(40)) == []
        for _ in range(2):  # its next heartbeats read again, and fail again
            assert cg_answer(c, cg_heartbeat(c, 5, None), 5, None) is None
            assert fetch(c, records(40)) == []
    said = [(e["group"], e["member_id"], e["client_id"]) for e in events if e["event"] == "sharing_member_unreadable"]
    assert said == [(GROUP, "m2", "app-2")]
    fake.refuse = lambda call: False
    assert cg_answer(c, cg_heartbeat(c, 5, None), 5, None) is None
    got = fetch(c, records(40))
    assert got and all(Slice(1, 2).holds(key_hash(k)) for _, k in got)


def test_kip848_group_not_described_is_told_and_not_shared() -> None:
    """Without the group's description (here its coordinator down for Sluice's own requests) no layout is known:
    logged and counted, the client handed what the broker assigned it."""
    proxy, fake = sharing_proxy()
    fake.down = True
    c = Client(proxy, "app-1", 1)
    c.member_id = "m1"
    ex = cg_heartbeat(c, 0, [], subscribe=True)
    assert proxy.metrics.total("sluice_sharing_not_shared_total", reason="kip848_group") == 1
    assert cg_answer(c, ex, 1, [0]) == [0]
    assert len(fetch(c, records(10))) == 10


def test_kip848_member_not_opted_in_is_relayed_untouched() -> None:
    proxy, _ = sharing_proxy()
    c = Client(proxy, "other-1", 1)
    c.member_id = "x"
    ex = cg_heartbeat(c, 0, [], subscribe=True)
    assert decode_request(ex.frame)[0].client_id == "other-1" and ex.answer is None
    assert cg_answer(c, ex, 1, [0]) == [0]
    assert len(fetch(c, records(10))) == 10




def test_offset_fetch_and_commit_v10_name_topics_by_id() -> None:
    """OffsetFetch/OffsetCommit v10 (Kafka 4.2+; franz-go 1.22 uses them) name topics by id only: read like names
    (the id looked up while the request waits), answered in the id form the client used."""
    proxy, fake = sharing_proxy()
    clients, _ = form_group(proxy, 5)
    m1 = clients[0]
    fake.offsets[GROUP] = {(TOPIC, 0): Committed(100, -1, None)}
    fake.offsets[slice_group(GROUP, Slice(0, 2))] = {(TOPIC, 0): Committed(140, -1, None)}
    names = proxy.policy("sharing").names
    body = request_codec(OFFSET_FETCH, 10).default().replace(require_stable=True, groups=[Message(
        group_id=GROUP, member_id=m1.member_id, member_epoch=-1,
        topics=[Message(topic_id=TOPIC_ID, partition_indexes=[0])])])
    m1.corr += 1
    header = Message(request_api_key=OFFSET_FETCH, request_api_version=10, correlation_id=m1.corr,
                     client_id=m1.client_id)
    ex = proxy.chain.classify(encode_request(header, body), proxy.clock(), m1.conn.info)
    proxy.chain.on_request(m1.conn, ex)
    assert ex.pending is not None and not ex.pending.settled  # waits for the id's name
    assert names.take() == {TOPIC_ID}
    names.settle({TOPIC_ID: TOPIC})
    while ex.pending is not None:
        assert ex.pending.settled
        proxy.chain.on_request(m1.conn, ex)
    answer = response_codec(OFFSET_FETCH, 10).default().replace(groups=[Message(
        group_id=GROUP, error_code=0, topics=[Message(topic_id=TOPIC_ID, partitions=[Message(
            partition_index=0, committed_offset=100, committed_leader_epoch=-1, metadata="", error_code=0)])])])
    got = m1.answer(ex, answer).groups[0].topics[0]
    assert got.topic_id == TOPIC_ID and got.partitions[0].committed_offset == 140  # its slice's position
    body = request_codec(OFFSET_COMMIT, 10).default().replace(
        group_id=GROUP, generation_id_or_member_epoch=1, member_id=m1.member_id, group_instance_id=None,
        topics=[Message(topic_id=TOPIC_ID, partitions=[Message(partition_index=0, committed_offset=150,
                                                               committed_leader_epoch=-1, committed_metadata="")])])
    ex = m1.send(OFFSET_COMMIT, 10, body)
    topic = sent(ex).topics[0]
    assert topic.topic_id == TOPIC_ID and topic.partitions[0].committed_offset == 100  # the stable offset
    answer = response_codec(OFFSET_COMMIT, 10).default().replace(topics=[
        Message(topic_id=TOPIC_ID, partitions=[Message(partition_index=0, error_code=0)])])
    assert m1.answer(ex, answer).topics[0].topic_id == TOPIC_ID
    assert fake.offsets[slice_group(GROUP, Slice(0, 2))][(TOPIC, 0)].offset == 150


def test_a_commit_of_last_record_plus_one_moves_past_what_was_left_out() -> None:
    """franz-go and kafka-go commit "last record received + 1": the slice's position moves past the offsets
    Sluice left out of the member's fetches right after it (the other slice's records), so the stable offset
    reaches the partition's end; a commit within what the member was handed stays where it is."""
    fake, m1, m2 = two_members_of_partition_0_at_100()
    got = {c.member_id: [o for o, _ in fetch(c, records(40))] for c in (m1, m2)}
    # slice 0/2 holds 102, 106, ..., 139; slice 1/2 100, 101, 103, ..., 133
    assert got["m1"][:2] == [102, 106] and got["m1"][-1] == 139 and got["m2"][-1] == 133
    committed_answer(m1, commit(m1, {0: 103}))  # one past its first record: 103-105 were the other slice's
    assert fake.offsets[slice_group(GROUP, Slice(0, 2))][(TOPIC, 0)].offset == 106
    committed_answer(m1, commit(m1, {0: 140}))
    ex = commit(m2, {0: 134})  # its last record + 1: 134-139 were the other slice's
    committed_answer(m2, ex)
    assert fake.offsets[slice_group(GROUP, Slice(1, 2))][(TOPIC, 0)].offset == 140
    assert sent(ex).topics[0].partitions[0].committed_offset == 140  # the stable offset: the partition's end


# ------------------------------------------------------------------------------------------- read-ahead cursor


def keys_in(s: Slice, n: int, other: bool = False) -> list[bytes]:
    """``n`` keys of slice ``s`` (of the other slices with ``other``)."""
    found = (b"k%d" % i for i in range(10_000))
    return [k for k in found if s.holds(key_hash(k)) != other][:n]


def one_per_batch(first: int, keys: list[bytes], epoch: int = 0) -> bytes:
    """One record per batch from offset ``first``: a low-rate topic's shape."""
    return b"".join(encode_batch(new_batch([Record(key=k, value=b"v%d" % (first + i))], base_offset=first + i,
                                           partition_leader_epoch=epoch)) for i, k in enumerate(keys))


def fetch_at(c: Client, offset: int | None = 100, session: int = 0, epoch: int = -1,
             version: int = V_FETCH, topic_id: bytes = TOPIC_ID) -> Exchange:
    """The member's Fetch of partition 0 (``offset`` None: an incremental request that does not list it), the
    topic named by id from v13 (:data:`V_FETCH_IDS`)."""
    named = {"topic_id": topic_id} if version >= V_FETCH_IDS else {"topic": TOPIC}
    parts = [] if offset is None else [Message(**named, partitions=[Message(
        partition=0, current_leader_epoch=-1, fetch_offset=offset, last_fetched_epoch=0, log_start_offset=-1,
        partition_max_bytes=1 << 20)])]
    body = request_codec(FETCH, version).default().replace(
        replica_id=-1, max_wait_ms=500, min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=session,
        session_epoch=epoch, rack_id="", forgotten_topics_data=[], topics=parts)
    return c.send(FETCH, version, body)


def upstream(ex: Exchange) -> FetchRequestView:
    return decode_fetch_request(ex.frame)


def answer_fetch(c: Client, ex: Exchange, records: bytes = b"", hw: int = 110, error: int = 0,
                 session_id: int = 0, listed: bool = True, may_resend: bool = True,
                 topic_id: bytes = TOPIC_ID) -> FetchResponseView | None:
    """The broker's answer to what ``ex`` sent upstream (in its version); the client's reply, or None when Sluice
    sent the request upstream again instead."""
    version = ex.header.api_version
    parts = [FetchPartition(0, error, hw, hw, 0, records=records)] if listed else []
    topic = FetchTopic(topic_id=topic_id, partitions=parts) if version >= V_FETCH_IDS else FetchTopic(TOPIC,
                                                                                                     partitions=parts)
    view = FetchResponseView(version, session_id=session_id, topics=[topic])
    buffers, _ = view.encode_frame(ex.header.correlation_id)
    reply = c.proxy.respond(ex, b"".join(bytes(b) for b in buffers)[4:], c.conn, may_resend)
    if ex.resend:
        ex.resend = False  # as the connection core does, sending ex.frame
        return None
    return decode_frame(reply[4:], version)[2]


def partition_0(view: FetchResponseView | None) -> FetchPartition:
    assert view is not None
    ((_, part),) = view.partitions()
    return part


def test_a_session_less_fetch_of_a_member_holding_whole_partitions_is_not_the_policys() -> None:
    """Three members of three partitions hold one whole partition each: their session-less fetches (librdkafka,
    aiokafka) are not read at all (a low-rate topic's caught-up consumer sends many); a fetch in the client's
    session is, as the cursor keeps that session, and so is the next session-less one (it ends that session)."""
    proxy, _ = sharing_proxy()
    clients, _ = form_group(proxy, 3)
    sharing = proxy.policy("sharing")
    m1 = clients[0]
    data = one_per_batch(100, [b"a", b"b"])
    ex = fetch_at(m1)
    assert sharing not in ex.policies
    assert bytes(partition_0(answer_fetch(m1, ex, data)).records or b"") == data  # as the broker sent them
    session = fetch_at(m1, session=0, epoch=0)
    assert sharing in session.policies
    answer_fetch(m1, session, data, session_id=9)
    assert sharing in fetch_at(m1).policies  # ends the client's session: the cursor forgets it
    assert sharing not in fetch_at(m1).policies
    shared, _ = sharing_proxy()
    sharers, _ = form_group(shared, 5)  # members sharing partitions: every fetch is read
    assert shared.policy("sharing") in fetch_at(sharers[0]).policies


def test_a_fetch_answered_only_with_other_slices_records_goes_again_from_past_them() -> None:
    """Records one per batch, the member's slice 0/2 has none among ten: nothing is handed to it (no batch emptied),
    and within its wait the fetch goes upstream again from past what was read, so its long poll waits for its
    own records; they come in a response whose first batch starts past its fetch offset."""
    proxy, _ = sharing_proxy()
    clients, _ = form_group(proxy, 5)
    m1 = clients[0]  # slice 0/2 of partition 0
    ex = fetch_at(m1, 100)
    proxy.clock.now += 0.1
    assert answer_fetch(m1, ex, one_per_batch(100, keys_in(Slice(0, 2), 10, other=True))) is None
    again = upstream(ex)
    assert again.partitions()[(TOPIC, 0)].fetch_offset == 110 and again.max_wait_ms == 400
    mine = keys_in(Slice(0, 2), 1)
    got = partition_0(answer_fetch(m1, ex, one_per_batch(110, mine), hw=111))
    assert [(b.base_offset, [r.key for r in b.records]) for b in decode_batches(got.records or b"")] == [(110, mine)]
    assert proxy.metrics.total("sluice_sharing_read_ahead_total", event="fetched_again") == 1


def test_a_fetch_the_broker_answered_at_once_is_the_clients_to_send_again() -> None:
    """Other slices' records keep coming (the broker answered at once, before a tenth of the client's wait): the
    client gets the answer, with nothing for it, and fetches again itself, past what was read, as soon as Sluice
    would have; Sluice's loop does not carry every round of a busy partition."""
    proxy, _ = sharing_proxy()
    m1 = form_group(proxy, 5)[0][0]
    ex = fetch_at(m1, 100)
    proxy.clock.now += 0.02
    got = partition_0(answer_fetch(m1, ex, one_per_batch(100, keys_in(Slice(0, 2), 10, other=True))))
    assert not got.records and got.high_watermark == 100
    assert upstream(fetch_at(m1, 100)).partitions()[(TOPIC, 0)].fetch_offset == 110
    assert proxy.metrics.total("sluice_sharing_read_ahead_total", event="fetched_again") == 0


def test_a_wait_ending_with_nothing_for_the_member_shows_its_slices_end_and_its_next_fetch_starts_past() -> None:
    """kafka-go reads a partition with no records below the high watermark as a broken connection: read to the
    high watermark with nothing for the member, the partition's high watermark is the member's own offset."""
    proxy, _ = sharing_proxy()
    m1 = form_group(proxy, 5)[0][0]
    ex = fetch_at(m1, 100)
    proxy.clock.now += 0.6  # the client's wait is over
    got = partition_0(answer_fetch(m1, ex, one_per_batch(100, keys_in(Slice(0, 2), 10, other=True))))
    assert not got.records and (got.high_watermark, got.last_stable_offset) == (100, 100)
    assert upstream(fetch_at(m1, 100)).partitions()[(TOPIC, 0)].fetch_offset == 110
    assert proxy.metrics.total("sluice_sharing_read_ahead_total", event="moved") == 1


def test_a_moved_offset_the_broker_answers_out_of_range_sends_the_member_back_to_its_own() -> None:
    proxy, _ = sharing_proxy()
    m1 = form_group(proxy, 5)[0][0]
    answer_fetch(m1, fetch_at(m1, 100), one_per_batch(100, keys_in(Slice(0, 2), 10, other=True)),
                 may_resend=False)
    ex = fetch_at(m1, 100)
    assert upstream(ex).partitions()[(TOPIC, 0)].fetch_offset == 110
    got = partition_0(answer_fetch(m1, ex, hw=105, error=1))  # OFFSET_OUT_OF_RANGE: the log was truncated
    assert got.error_code == 0 and not got.records  # the broker answered Sluice's offset, not the member's
    assert upstream(fetch_at(m1, 100)).partitions()[(TOPIC, 0)].fetch_offset == 100
    assert proxy.metrics.total("sluice_sharing_read_ahead_total", event="forgotten") == 1


def test_a_topic_created_again_under_its_name_is_fetched_from_the_members_own_offset() -> None:
    """The topic is deleted and created again (KIP-516: a new topic id, offsets from 0 again) while its member
    runs. What Sluice read of the old topic says nothing of the new one: the member's next fetch, naming the new id,
    goes upstream from its own offset, and the new topic's records of its slice there reach it."""
    proxy, _ = sharing_proxy()
    proxy.policy("sharing").names.learn(TOPIC_ID, TOPIC)
    m1 = form_group(proxy, 5)[0][0]  # slice 0/2 of partition 0
    answer_fetch(m1, fetch_at(m1, 100, version=V_FETCH_IDS), one_per_batch(100, keys_in(M1_SLICE, 10, other=True)),
                 may_resend=False)
    assert upstream(fetch_at(m1, 100, version=V_FETCH_IDS)).partitions()[(TOPIC_ID, 0)].fetch_offset == 110
    new_id = bytes(range(16, 32))
    proxy.policy("sharing").names.learn(new_id, TOPIC)
    ex = fetch_at(m1, 100, version=V_FETCH_IDS, topic_id=new_id)
    assert upstream(ex).partitions()[(new_id, 0)].fetch_offset == 100
    mine = one_per_batch(100, keys_in(M1_SLICE, 10))
    got = partition_0(answer_fetch(m1, ex, mine, topic_id=new_id))
    assert bytes(got.records or b"") == mine


def test_the_old_topic_still_named_or_answered_does_not_take_the_member_back_to_it() -> None:
    """The topic created again has its partition led by another broker: the member fetches it by its new id on one
    connection, while its connection to the old leader still names the old id: answered UNKNOWN_TOPIC_ID, or, by a
    broker that has not applied the deletion yet, with the old topic's records. What Sluice reads of the new topic
    for the member stays, and nothing of the old one joins it: its next fetch moves past the other slices' records
    of the new topic, and only those."""
    proxy, _ = sharing_proxy()
    names = proxy.policy("sharing").names
    names.learn(TOPIC_ID, TOPIC)
    m1 = form_group(proxy, 5)[0][0]  # slice 0/2 of partition 0
    answer_fetch(m1, fetch_at(m1, 100, version=V_FETCH_IDS), one_per_batch(100, keys_in(M1_SLICE, 10, other=True)),
                 may_resend=False)
    new_id = bytes(range(16, 32))
    names.learn(new_id, TOPIC)
    other = Client(proxy, m1.client_id, 99)  # the member's connection to the new leader
    answer_fetch(other, fetch_at(other, 100, version=V_FETCH_IDS, topic_id=new_id),
                 one_per_batch(100, keys_in(M1_SLICE, 5, other=True)), hw=105, may_resend=False, topic_id=new_id)
    stale = fetch_at(m1, 100, version=V_FETCH_IDS)  # the old id, to the old leader
    assert upstream(stale).partitions()[(TOPIC_ID, 0)].fetch_offset == 100  # not moved by the new topic's reads
    assert partition_0(answer_fetch(m1, stale, hw=-1, error=100)).error_code == 100
    answer_fetch(m1, fetch_at(m1, 100, version=V_FETCH_IDS), one_per_batch(100, keys_in(M1_SLICE, 20, other=True)),
                 hw=120, may_resend=False)  # the old topic's records, from a broker that still has it
    assert upstream(fetch_at(other, 100, version=V_FETCH_IDS, topic_id=new_id)).partitions()[
        (new_id, 0)].fetch_offset == 105


def test_a_topic_gone_forgets_the_read_ahead_of_a_member_fetching_by_name() -> None:
    """Fetch v12 and older name topics by name: the answer says nothing of which topic the broker read. A topic
    deleted shows as UNKNOWN_TOPIC_OR_PARTITION while it is gone: the member's read-ahead goes with it, and its
    next fetch (of the topic created again) goes upstream from its own offset."""
    proxy, _ = sharing_proxy()
    m1 = form_group(proxy, 5)[0][0]
    answer_fetch(m1, fetch_at(m1, 100), one_per_batch(100, keys_in(M1_SLICE, 10, other=True)), may_resend=False)
    ex = fetch_at(m1, 100)
    assert upstream(ex).partitions()[(TOPIC, 0)].fetch_offset == 110
    assert partition_0(answer_fetch(m1, ex, hw=-1, error=3)).error_code == 3  # the client sees it as it is
    assert upstream(fetch_at(m1, 100)).partitions()[(TOPIC, 0)].fetch_offset == 100


def test_a_session_clients_fetch_goes_again_within_its_session() -> None:
    """A client with its own fetch session (the Java client): the fetch sent again is the session's next request,
    listing the partition at the cursor; the answer to it leaves out what did not change since the first, which
    the client gets from the first; the client's next request is numbered after Sluice's."""
    proxy, _ = sharing_proxy()
    m1 = form_group(proxy, 5)[0][0]
    ex = fetch_at(m1, 100, session=0, epoch=0)
    proxy.clock.now += 0.1
    assert answer_fetch(m1, ex, one_per_batch(100, keys_in(Slice(0, 2), 10, other=True)), session_id=9) is None
    again = upstream(ex)
    assert (again.session_id, again.session_epoch, again.max_wait_ms) == (9, 1, 400)
    assert again.partitions()[(TOPIC, 0)].fetch_offset == 110
    proxy.clock.now += 0.4
    got = answer_fetch(m1, ex, session_id=9, listed=False)  # the wait ran out, nothing changed
    assert got is not None and got.session_id == 9
    part = partition_0(got)  # from the first answer, as the member sees it
    assert not part.records and part.high_watermark == 100
    nxt = upstream(fetch_at(m1, None, session=9, epoch=1))
    assert nxt.session_epoch == 2 and not nxt.partitions()  # the next hop holds offset 110 already


def session_offset_after_other_slices(m1: Client) -> int:
    """In m1's fetch session 9 by topic id (its full request answered): an incremental request listing no topic,
    answered once the client's wait is over with other slices' records only (offsets 100-109), which m1 must get
    none of; the offset of partition 0 its next request goes upstream with."""
    ex = fetch_at(m1, None, session=9, epoch=1, version=V_FETCH_IDS)
    m1.proxy.clock.now += 0.6  # the client's wait is over: answered, with nothing for it
    got = answer_fetch(m1, ex, one_per_batch(100, keys_in(M1_SLICE, 10, other=True)), session_id=9)
    assert not partition_0(got).records
    nxt = upstream(fetch_at(m1, None, session=9, epoch=2, version=V_FETCH_IDS))
    return nxt.partitions()[(TOPIC_ID, 0)].fetch_offset


def test_a_session_fetch_withheld_before_its_member_was_known_still_reads_ahead_by_topic_id() -> None:
    """Fetch v13+ names topics by id, and a client in its fetch session (the Java client) names them in its full
    request only. A full request sent before Sluice knew the member (withheld: its SyncGroup not seen yet) still
    tells the connection its topic ids: once the member shares partition 0, its next fetches, listing no topic,
    move past the other slices' records Sluice read for it. They did not before: such a Java member fetched the
    same run of the other slice's records again and again, each answered at once with nothing (a client test saw
    218,707 fetches in 90 s, none of its own records)."""
    proxy, _ = sharing_proxy()
    proxy.policy("sharing").names.learn(TOPIC_ID, TOPIC)
    clients = group_clients(proxy, 5)
    m1 = clients[0]
    full = fetch_at(m1, 100, session=0, epoch=0, version=V_FETCH_IDS)
    got = answer_fetch(m1, full, one_per_batch(100, keys_in(M1_SLICE, 2)), session_id=9)
    assert not partition_0(got).records  # withheld: whose records they are is not known yet
    join_all(clients, 1)  # m1 holds slice 0/2 of partition 0
    assert session_offset_after_other_slices(m1) == 110
    assert proxy.metrics.total("sluice_sharing_read_ahead_total", event="moved") == 1


def test_a_session_fetch_whose_topic_id_was_not_known_at_its_full_request_reads_ahead_once_it_is() -> None:
    """Sluice's lookup of the topic id named by a session's full request failed (it is not waited for again for a
    while), so that request taught its connection nothing; the lookup succeeded later. The session's later
    requests name no topic, but their answers do: the connection learns the id from them, and the member's next
    fetch moves past the other slices' records."""
    proxy, _ = sharing_proxy()
    names = proxy.policy("sharing").names
    names.settle({}, not_found=[TOPIC_ID])  # the lookup failed
    m1 = form_group(proxy, 5)[0][0]  # m1 holds slice 0/2 of partition 0
    full = fetch_at(m1, 100, session=0, epoch=0, version=V_FETCH_IDS)
    answer_fetch(m1, full, hw=100, session_id=9)
    names.learn(TOPIC_ID, TOPIC)  # a later lookup found it
    assert session_offset_after_other_slices(m1) == 110


def test_records_of_a_topic_id_sluice_cannot_name_yet_are_withheld_from_a_sharing_member() -> None:
    """Sluice's lookup of a topic id failed, so it cannot tell whether the topic is one its member shares: the
    records are withheld (the answer paused, as for a member whose slices are not known yet), never handed whole
    to a member that holds a slice of them. Once the name is known, the fetch of the same offset gets the member's
    slice only."""
    proxy, _ = sharing_proxy()
    names = proxy.policy("sharing").names
    names.settle({}, not_found=[TOPIC_ID])  # the lookup failed
    m1 = form_group(proxy, 5)[0][0]  # m1 holds slice 0/2 of partition 0
    mine, others = keys_in(M1_SLICE, 3), keys_in(M1_SLICE, 3, other=True)
    data = one_per_batch(100, [k for pair in zip(mine, others, strict=True) for k in pair])
    ex = fetch_at(m1, 100, version=V_FETCH_IDS)
    assert not partition_0(answer_fetch(m1, ex, data, hw=106)).records
    assert ex.mute_s > 0
    assert proxy.metrics.total("sluice_sharing_withheld_partitions_total") == 1
    names.learn(TOPIC_ID, TOPIC)  # a later lookup found it
    got = partition_0(answer_fetch(m1, fetch_at(m1, 100, version=V_FETCH_IDS), data, hw=106))
    assert [r.key for b in decode_batches(got.records or b"") for r in b.records] == mine


def test_a_slice_idle_past_its_committed_position_is_committed_on_by_sluice() -> None:
    """A member whose slice has no record in the partition's tail has nothing new to commit: Sluice commits its
    slice's position past what its fetches read with nothing for it, so the stable offset can reach the end."""
    fake, m1, m2 = two_members_of_partition_0_at_100()
    committed_answer(m1, commit(m1, {0: 100}))
    m1.proxy.clock.now += 10
    answer_fetch(m1, fetch_at(m1, 100), one_per_batch(100, keys_in(Slice(0, 2), 10, other=True)),
                 may_resend=False)
    assert fake.offsets[slice_group(GROUP, Slice(0, 2))][(TOPIC, 0)].offset == 110
    assert m1.proxy.metrics.total("sluice_sharing_read_ahead_total", event="advanced") == 1
    answer_fetch(m1, fetch_at(m1, 100), one_per_batch(110, keys_in(Slice(0, 2), 5, other=True)), hw=115,
                 may_resend=False)
    assert fake.offsets[slice_group(GROUP, Slice(0, 2))][(TOPIC, 0)].offset == 110  # at most once a second
    m1.proxy.clock.now += 1
    answer_fetch(m1, fetch_at(m1, 100), hw=115, may_resend=False)
    assert fake.offsets[slice_group(GROUP, Slice(0, 2))][(TOPIC, 0)].offset == 115
    assert m2 is not None


def test_a_slice_sluice_failed_to_commit_on_is_committed_on_at_its_next_idle_fetch() -> None:
    """Sluice's own commit of an idle slice's position failed (its coordinator down, a timeout): the slice's
    position is still where the group last took it, so a later fetch that finds nothing of the slice commits it on
    again. Before, Sluice took the position as committed when it sent the commit, so after a failure the slice
    stayed short of the partition's end for good (a member with nothing of its own to commit never moves it): a
    CI run's kafka-go group stayed committed at 218 of 220 after every Sluice in the process stalled at once."""
    fake, m1, _ = two_members_of_partition_0_at_100()
    committed_answer(m1, commit(m1, {0: 100}))
    m1.proxy.clock.now += 10
    fake.down = True
    answer_fetch(m1, fetch_at(m1, 100), one_per_batch(100, keys_in(Slice(0, 2), 10, other=True)),
                 may_resend=False)
    assert (TOPIC, 0) not in fake.offsets.get(slice_group(GROUP, Slice(0, 2)), {})  # the commit failed
    assert m1.proxy.metrics.total("sluice_sharing_read_ahead_total", event="advanced") == 1
    fake.down = False
    m1.proxy.clock.now += 1
    answer_fetch(m1, fetch_at(m1, 100), hw=110, may_resend=False)
    assert fake.offsets[slice_group(GROUP, Slice(0, 2))][(TOPIC, 0)].offset == 110


def test_a_stable_offset_sluice_failed_to_raise_after_committing_a_slice_on_is_raised_at_the_next_idle_fetch() -> None:
    """Sluice committed an idle slice's position on, and its raise of the group's stable offset after it (the
    group's read, then the commit as the member) failed: the slice's position is where it should be, but the
    group's offset, what lag tools and a consumer without Sluice read, is short of it. A later fetch that finds
    nothing new of the slice raises it again: nothing else would (the member has nothing of its own to commit)."""
    fake, m1 = a_raise_failed_after_an_idle_commit()
    m1.proxy.clock.now += 1
    answer_fetch(m1, fetch_at(m1, 100), hw=110, may_resend=False)
    assert fake.offsets[GROUP][(TOPIC, 0)].offset == 110


def a_raise_failed_after_an_idle_commit() -> tuple[FakeCoordinators, Client]:
    """Partition 0's two members at 100; m2 commits 110; m1's idle slice is committed on to 110 by Sluice, whose
    raise of the group's stable offset after it fails (the group left at 100); the coordinator then answers again."""
    fake, m1, m2 = two_members_of_partition_0_at_100()
    committed_answer(m1, commit(m1, {0: 100}))
    committed_answer(m2, commit(m2, {0: 110}))  # m2 read its slice's records 100-109
    assert fake.offsets[GROUP][(TOPIC, 0)].offset == 100  # m1's slice holds the stable offset back
    m1.proxy.clock.now += 10
    fake.refuse = lambda call: bool(call.reads or call.as_member)  # the raise fails, the slice's commit does not
    answer_fetch(m1, fetch_at(m1, 100), one_per_batch(100, keys_in(Slice(0, 2), 10, other=True)),
                 may_resend=False)
    assert fake.offsets[slice_group(GROUP, Slice(0, 2))][(TOPIC, 0)].offset == 110
    assert fake.offsets[GROUP][(TOPIC, 0)].offset == 100
    fake.refuse = lambda call: False
    return fake, m1


def test_a_slice_position_sluice_failed_to_commit_after_the_members_commit_is_committed_at_its_next_idle_fetch(
) -> None:
    """The coordinator took a member's commit (the group's, at the stable offset), and Sluice's commit of the
    member's slice's position after it failed (a timeout, the coordinator moving): the client was answered as
    committed and commits nothing more once it has nothing new (it is at the partition's end), so a later fetch
    that finds nothing new of the slice commits that position. Before, the slice's position stayed where it was for
    good, and with it the group's stable offset: the other member's commit to the end left the group at 100."""
    fake, m1, m2 = two_members_of_partition_0_at_100()
    fake.refuse = lambda call: slice_group(GROUP, Slice(0, 2)) in call.commits  # m1's slice's commit fails
    committed_answer(m1, commit(m1, {0: 110}))
    assert (TOPIC, 0) not in fake.offsets.get(slice_group(GROUP, Slice(0, 2)), {})
    fake.refuse = lambda call: False
    committed_answer(m2, commit(m2, {0: 120}))  # m2 consumed its slice to the end
    assert fake.offsets[GROUP][(TOPIC, 0)].offset == 100  # m1's slice, as stored, holds the stable offset back
    m1.proxy.clock.now += 10
    answer_fetch(m1, fetch_at(m1, 110), one_per_batch(110, keys_in(Slice(0, 2), 10, other=True)), hw=120,
                 may_resend=False)
    assert fake.offsets[slice_group(GROUP, Slice(0, 2))][(TOPIC, 0)].offset == 120
    assert fake.offsets[GROUP][(TOPIC, 0)].offset == 120


def test_a_raise_owed_is_made_after_the_member_reads_its_offsets_again() -> None:
    """As above, the raise of the group's stable offset failed, then the member's client read its offsets again
    (an OffsetFetch: after a rebalance that kept its slice, a reset position). The state read back from Kafka knows
    nothing of the raise owed: before, the OffsetFetch replaced the state and the raise was never made, the
    group's offset short of the end for good."""
    fake, m1 = a_raise_failed_after_an_idle_commit()
    assert offset_fetch_answer(m1, offset_fetch(m1, [0]), {0: 100}) == {0: (110, "")}
    assert fake.offsets[GROUP][(TOPIC, 0)].offset == 100
    m1.proxy.clock.now += 1
    answer_fetch(m1, fetch_at(m1, 110), hw=110, may_resend=False)
    assert fake.offsets[GROUP][(TOPIC, 0)].offset == 110


def test_a_slice_position_owed_is_where_the_member_resumes_and_is_committed_after_it_reads_its_offsets_again(
) -> None:
    """As above, the coordinator took the member's commit at 110 and the commit of its slice's position failed;
    then its client read its offsets again. It was answered as committed at 110, so that is where it resumes (Kafka
    holds 100 for the slice: answered that, it would be handed records 100-109 of its slice again), and the
    position is still committed at its next idle fetch."""
    fake, m1, m2 = two_members_of_partition_0_at_100()
    fake.refuse = lambda call: slice_group(GROUP, Slice(0, 2)) in call.commits  # m1's slice's commit fails
    committed_answer(m1, commit(m1, {0: 110}))
    fake.refuse = lambda call: False
    assert offset_fetch_answer(m1, offset_fetch(m1, [0]), {0: 100}) == {0: (110, "")}
    committed_answer(m2, commit(m2, {0: 120}))
    m1.proxy.clock.now += 10
    answer_fetch(m1, fetch_at(m1, 110), one_per_batch(110, keys_in(Slice(0, 2), 10, other=True)), hw=120,
                 may_resend=False)
    assert fake.offsets[slice_group(GROUP, Slice(0, 2))][(TOPIC, 0)].offset == 120
    assert fake.offsets[GROUP][(TOPIC, 0)].offset == 120


def test_a_fenced_members_idle_slice_is_not_committed_on_by_sluice() -> None:
    """Once the coordinator refused a member's commit as fenced, Sluice no longer commits its idle slice on itself
    (a simple commit, which no coordinator checks: the slice may be another member's by now) until it holds a slice
    of another generation."""
    fake, m1, _ = two_members_of_partition_0_at_100()
    ex = commit(m1, {0: 105})
    m1.answer(ex, response_codec(OFFSET_COMMIT, V_OC).default().replace(topics=[
        Message(name=TOPIC, partitions=[Message(partition_index=0, error_code=25)])]))  # UNKNOWN_MEMBER_ID
    m1.proxy.clock.now += 10
    calls = len(fake.calls)
    answer_fetch(m1, fetch_at(m1, 100), one_per_batch(100, keys_in(Slice(0, 2), 10, other=True)),
                 may_resend=False)
    assert not [c for c in fake.calls[calls:] if c.commits]
    assert slice_group(GROUP, Slice(0, 2)) not in fake.offsets
    assert m1.proxy.metrics.total("sluice_sharing_read_ahead_total", event="advanced") == 0


#: the slice of partition 0 that group_of_5_at_100 gives m1
M1_SLICE = Slice(0, 2)


def heartbeat(c: Client, generation: int) -> Exchange:
    body = request_codec(HEARTBEAT, V_HB).default().replace(group_id=GROUP, generation_id=generation,
                                                            member_id=c.member_id, group_instance_id=None)
    return c.send(HEARTBEAT, V_HB, body)


def idle_slice_committed_on(fake: FakeCoordinators, c: Client, first: int, s: Slice = M1_SLICE) -> bool:
    """``c`` (slice ``s`` of partition 0: m1's by default) fetches 10 records of other slices from ``first``, a
    second after its last such fetch: whether Sluice then commits its slice's position on past them itself."""
    c.proxy.clock.now += 10
    answer_fetch(c, fetch_at(c, first), one_per_batch(first, keys_in(s, 10, other=True)), hw=first + 10,
                 may_resend=False)
    committed = fake.offsets.get(slice_group(GROUP, s), {}).get((TOPIC, 0))
    return committed is not None and committed.offset == first + 10


@pytest.mark.parametrize(("request_name", "error"), [
    ("heartbeat", 22), ("heartbeat", 25), ("heartbeat", 27), ("heartbeat", 82),
    ("join", 25), ("join", 82), ("sync", 25), ("sync", 27)])
def test_a_member_fenced_by_its_group_requests_answer_has_no_idle_slice_committed_on_until_a_new_generation(
        request_name: str, error: int) -> None:
    """A member that keeps fetching and never commits: the coordinator fences it in its Heartbeat's, JoinGroup's or
    SyncGroup's answer (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS, FENCED_INSTANCE_ID) as it would
    refuse its commit, and Sluice commits its idle slice on no more (a simple commit, which no coordinator checks:
    the slice may be another member's by now) until it holds a slice of a new generation."""
    fake, clients = group_of_5_at_100()
    m1 = clients[0]
    committed_answer(m1, commit(m1, {0: 100}))
    if request_name == "heartbeat":
        ex = heartbeat(m1, 1)
        m1.answer(ex, response_codec(HEARTBEAT, V_HB).default().replace(error_code=error))
    elif request_name == "join":
        m1.answer(join(m1), response_codec(JOIN, V_JOIN).default().replace(
            error_code=error, generation_id=-1, protocol_name=None, leader="", member_id="", members=[]))
    else:  # its JoinGroup answered (generation 2), its SyncGroup refused
        join_answer(m1, join(m1), [], generation=2, leader="m2")
        m1.answer(sync(m1, 2, {}), response_codec(SYNC, V_SYNC).default().replace(
            error_code=error, protocol_type="consumer", protocol_name="range", assignment=b""))
    assert not idle_slice_committed_on(fake, m1, 100)
    join_all(clients, 3)  # every member joins again: m1 holds slice 0/2 of partition 0 in generation 3
    assert idle_slice_committed_on(fake, m1, 110)


def test_a_member_between_its_joingroup_and_its_syncgroup_has_no_idle_slice_committed_on() -> None:
    """Its JoinGroup answered, a member's commits are refused until its SyncGroup (REBALANCE_IN_PROGRESS:
    ClassicGroup.validateOffsetCommit, COMPLETING_REBALANCE), and the new generation may hand the slices it still
    holds to others: Sluice commits none of them on itself until its SyncGroup is answered."""
    fake, clients = group_of_5_at_100()
    m1 = clients[0]
    committed_answer(m1, commit(m1, {0: 100}))
    exchanges = [join(c) for c in clients]
    joined = [(c.member_id, bytes(sent(ex).protocols[0].metadata)) for c, ex in zip(clients, exchanges, strict=True)]
    for c, ex in zip(clients[1:], exchanges[1:], strict=True):
        join_answer(c, ex, [], generation=2, leader="m1")
    join_answer(m1, exchanges[0], joined, generation=2)
    assert not idle_slice_committed_on(fake, m1, 100)
    sync_all(clients, 2, {c.member_id: assignment({TOPIC: [i]} if i < 3 else {}) for i, c in enumerate(clients)})
    assert idle_slice_committed_on(fake, m1, 110)


def test_a_fencing_answer_about_a_generation_the_member_left_says_nothing_of_the_one_it_holds() -> None:
    """Heartbeats of generation 1 answered ILLEGAL_GENERATION once the member holds generation 2 (sent before its
    rebalance, answered after it) neither fence it in generation 2 nor undo its fencing there."""
    fake, clients = group_of_5_at_100()
    m1 = clients[0]
    committed_answer(m1, commit(m1, {0: 100}))
    late, later = heartbeat(m1, 1), heartbeat(m1, 1)
    join_all(clients, 2)
    illegal_generation = response_codec(HEARTBEAT, V_HB).default().replace(error_code=22)
    m1.answer(late, illegal_generation)
    assert idle_slice_committed_on(fake, m1, 100)
    m1.answer(heartbeat(m1, 2), response_codec(HEARTBEAT, V_HB).default().replace(error_code=25))
    m1.answer(later, illegal_generation)
    assert not idle_slice_committed_on(fake, m1, 110)


def test_a_fetch_sent_again_goes_through_sluices_own_fetch_session_in_terminate_mode() -> None:
    """[sessions] mode = "terminate": the request sent again is the client's request as sharing made it, which
    terminate sends in its own upstream session like any other (the policies after the asking one take it as a new
    request); the client gets its session-less answer."""
    proxy, _ = sharing_proxy(**{"sessions.mode": "terminate"})
    m1 = form_group(proxy, 5)[0][0]
    ex = fetch_at(m1, 100)
    first = upstream(ex)
    assert (first.session_id, first.session_epoch) == (0, 0)  # terminate's full request opens its session
    proxy.clock.now += 0.1
    assert answer_fetch(m1, ex, one_per_batch(100, keys_in(Slice(0, 2), 10, other=True)), session_id=55) is None
    again = upstream(ex)
    assert (again.session_id, again.session_epoch) == (55, 1)  # terminate's own session, its next request
    assert again.partitions()[(TOPIC, 0)].fetch_offset == 110 and again.max_wait_ms == 400
    mine = keys_in(Slice(0, 2), 1)
    got = answer_fetch(m1, ex, one_per_batch(110, mine), hw=111, session_id=55)
    assert got is not None and got.session_id == 0  # the client's session-less answer
    assert [r.key for b in decode_batches(partition_0(got).records or b"") for r in b.records] == mine


def test_a_commit_of_a_slice_waits_for_sluices_own_commit_of_it_in_flight() -> None:
    """Sluice's own commit of a slice's position (an idle slice committed on) and the member's next commit are
    made one after the other, never at once: the later position lands last (group calls run concurrently, and a
    lower position landing last would deliver committed records again)."""
    fake, m1, _ = two_members_of_partition_0_at_100()
    committed_answer(m1, commit(m1, {0: 100}))
    m1.proxy.clock.now += 10
    fake.held = []
    answer_fetch(m1, fetch_at(m1, 100), one_per_batch(100, keys_in(Slice(0, 2), 10, other=True)),
                 may_resend=False)
    (advance,) = fake.held  # the slice committed on to 110, unanswered yet
    proxy = m1.proxy
    body = request_codec(OFFSET_COMMIT, V_OC).default().replace(
        group_id=GROUP, generation_id_or_member_epoch=1, member_id=m1.member_id, group_instance_id=None,
        topics=[Message(name=TOPIC, partitions=[Message(partition_index=0, committed_offset=130,
                                                        committed_leader_epoch=-1, committed_metadata="")])])
    header = Message(request_api_key=OFFSET_COMMIT, request_api_version=V_OC, correlation_id=99,
                     client_id=m1.client_id)
    ex = proxy.chain.classify(encode_request(header, body), proxy.clock(), m1.conn.info)
    proxy.chain.on_request(m1.conn, ex)
    assert ex.pending is advance and fake.held == [advance]  # the member's commit waits, nothing sent
    fake.release()
    while ex.pending is not None:
        assert ex.pending.settled
        proxy.chain.on_request(m1.conn, ex)
    committed_answer(m1, ex)
    assert [c.commits for c in fake.calls if c.commits][-1] == {slice_group(GROUP, Slice(0, 2)): {
        (TOPIC, 0): (130, "")}}
    assert fake.offsets[slice_group(GROUP, Slice(0, 2))][(TOPIC, 0)].offset == 130


# ------------------------------------------------------------------------------------------- slices changing


def sluice_of_slice(fake: FakeCoordinators, client_id: str, s: str) -> Client:
    """A Sluice of its own whose one consumer, ``client_id``, holds slice ``s`` of partition 0 (a standalone rule:
    a fixed slice, as a member holds one between two layouts), its group requests served by ``fake``."""
    proxy = SansIOProxy({"sharing.enabled": True, "sharing.topics": [{"topic": "orders*"}],
                         "sharing.standalone": [{"client_id": client_id, "topic": TOPIC, "slice": s}]})
    fake.attach(proxy.policy("sharing").calls)
    return Client(proxy, client_id, 1)


def test_a_layout_a_concurrent_group_commit_left_out_of_the_metadata_still_filters_its_commits() -> None:
    """Slices change several times within seconds (every member of a KIP-848 group fenced and rejoining): members of
    successive layouts commit at once. b (slice 2/4) reads the group's commit, then a (slice 0/3) commits 140 and
    its group commit, listing layout 3, lands; b's group commit lands last, listing only the layouts b read: the
    metadata is one value with many writers, the last one wins. c, a new slice 1/4, must still start past what a
    committed for the keys they share, or records a consumer committed are delivered again."""
    fake = FakeCoordinators()
    a, b, c = (sluice_of_slice(fake, f"app-{n}", s) for n, s in (("a", "0/3"), ("b", "2/4"), ("c", "1/4")))
    fake.offsets[GROUP] = {(TOPIC, 0): Committed(100, -1, None)}
    for m in (a, b):
        offset_fetch_answer(m, offset_fetch(m, [0]), {0: 100})
    late = commit(b, {0: 150})  # its reads are made now: the group's metadata names no layout yet
    first = commit(a, {0: 140})
    for ex, m in ((first, a), (late, b)):  # the group's commits land in this order
        part = sent(ex).topics[0].partitions[0]
        fake.offsets[GROUP][(TOPIC, 0)] = Committed(part.committed_offset, -1, part.committed_metadata)
        committed_answer(m, ex)
    assert decode_metadata(fake.offsets[GROUP][(TOPIC, 0)].metadata) == ([4], None)  # b read before a committed
    offset_fetch_answer(c, offset_fetch(c, [0]), {0: 100})
    done_by_a = {b"k%d" % i for i in range(40) if Slice(0, 3).holds(key_hash(b"k%d" % i))}
    expected = [(100 + i, b"k%d" % i) for i in range(40)
                if Slice(1, 4).holds(key_hash(b"k%d" % i)) and b"k%d" % i not in done_by_a]
    assert fetch(c, records(40)) == expected


def test_kip848_a_partition_handed_back_with_another_slice_before_the_client_let_it_go_waits_for_it() -> None:
    """Layouts changing at every heartbeat: m2 holds slice 1/3 of partition 0; the partition goes on the move (laid
    out for nobody) and m2's client is handed nothing, but still owns the partition (its revocation is not done);
    the next layout gives m2 slice 1/2, which is not inside 1/3. Handed at once, the client would go on from its own
    position, past records of the keys 1/2 adds that their last holder had not consumed: lost. So the partition is
    handed only once the client no longer owns it (KIP-848: a partition is assigned again only after its owner's
    heartbeat no longer lists it, CurrentAssignmentBuilder); it then starts from its slice's committed position.
    Meanwhile the client's mark claims the slice it holds, so no other member is handed the keys it still reads."""
    proxy, fake = sharing_proxy()
    c2 = Client(proxy, "app-2", 2)
    c2.member_id = "m2"

    def described(epoch: int, members: list[tuple[str, str, list[int]]], moving: bool = False) -> None:
        entry = cg_described(epoch, members)
        if moving:  # m1's partition 0 is being revoked: in its current assignment, not its target
            entry.group_state = "Reconciling"
            entry.members[0].target_assignment = Message(topic_partitions=[])
        fake.described_consumer[GROUP] = entry

    three = [("m1", "app-1#sluice-share=orders|0:0:0/3", [0]), ("m2", "app-2#sluice-share=orders|", []),
             ("m3", "app-3#sluice-share=orders|0:0:2/3", [])]
    described(2, three)
    ex = cg_heartbeat(c2, 0, [], subscribe=True)
    assert decode_request(ex.frame)[0].client_id == "app-2#sluice-share=orders|0:0:1/3"
    assert cg_answer(c2, ex, 2, []) == [0]  # slice 1/3
    described(3, three, moving=True)
    assert cg_answer(c2, cg_heartbeat(c2, 2, [0]), 3, None) is None  # a new epoch: described at the next heartbeat
    assert cg_answer(c2, cg_heartbeat(c2, 3, None), 3, None) == []  # nobody's partition while it moves
    described(4, [("m1", "app-1#sluice-share=orders|0:0:0/2", [0]), ("m2", "app-2#sluice-share=orders|0:0:1/3", [])])
    ex = cg_heartbeat(c2, 3, [0])  # its client still owns partition 0
    assert decode_request(ex.frame)[0].client_id == "app-2#sluice-share=orders|0:0:1/3"
    assert cg_answer(c2, ex, 4, None) is None  # still nothing for it (on main: partition 0, with slice 1/2)
    ex = cg_heartbeat(c2, 4, [])  # let go: now handed as a partition new to the client
    assert decode_request(ex.frame)[0].client_id == "app-2#sluice-share=orders|0:0:1/2"
    assert cg_answer(c2, ex, 4, None) == [0]
    fake.offsets[GROUP] = {(TOPIC, 0): Committed(100, -1, None)}
    offset_fetch_answer(c2, offset_fetch(c2, [0]), {0: 100})
    got = fetch(c2, records(40))
    assert got and all(Slice(1, 2).holds(key_hash(k)) for _, k in got)


def test_kip848_a_commit_of_a_partition_the_member_let_go_is_its_old_slices_position_not_the_groups() -> None:
    """A KIP-848 member's commit is checked for its member epoch only, not for the partitions it holds
    (ConsumerGroup.validateOffsetCommit): a client committing what it read of a partition it has since let go (an
    explicit commit of its last records after a revocation) is accepted. Relayed as it was, it would be the group's
    commit: the stable offset of every slice, records of the other slices below it taken as done (lost). It is the
    position of the slice the member held there, and the group's commit gets the stable offset."""
    proxy, fake = sharing_proxy()
    c2 = Client(proxy, "app-2", 2)
    c2.member_id = "m2"
    members = [("m1", "app-1#sluice-share=orders|0:0:0/2", [0]), ("m2", "app-2#sluice-share=orders|", [])]
    fake.described_consumer[GROUP] = cg_described(2, members)
    assert cg_answer(c2, cg_heartbeat(c2, 0, [], subscribe=True), 2, []) == [0]  # slice 1/2
    fake.offsets[GROUP] = {(TOPIC, 0): Committed(100, -1, None)}
    offset_fetch_answer(c2, offset_fetch(c2, [0]), {0: 100})
    moving = cg_described(3, members)  # m1's partition 0 moves: laid out for nobody, m2 is handed nothing
    moving.group_state = "Reconciling"
    moving.members[0].target_assignment = Message(topic_partitions=[])
    fake.described_consumer[GROUP] = moving
    assert cg_answer(c2, cg_heartbeat(c2, 2, [0]), 3, None) is None
    assert cg_answer(c2, cg_heartbeat(c2, 3, None), 3, None) == []
    assert cg_answer(c2, cg_heartbeat(c2, 3, []), 3, None) is None  # its client let partition 0 go
    ex = commit(c2, {0: 150})
    assert sent(ex).topics[0].partitions[0].committed_offset == 100  # m1's slice is at 100
    committed_answer(c2, ex)
    assert fake.offsets[slice_group(GROUP, Slice(1, 2))][(TOPIC, 0)].offset == 150


def test_kip848_a_member_its_heartbeats_answer_fenced_has_no_idle_slice_committed_on_until_a_new_epoch() -> None:
    """A KIP-848 member that keeps fetching and never commits: the broker answers its ConsumerGroupHeartbeat with
    FENCED_INSTANCE_ID (another instance took its group.instance.id: GroupMetadataManager), as it would refuse its
    commit, and Sluice commits its idle slice on no more until the broker answers it at another member epoch."""
    proxy, fake = sharing_proxy()
    c2 = Client(proxy, "app-2", 2)
    c2.member_id = "m2"
    fake.described_consumer[GROUP] = cg_described(2, [("m1", "app-1#sluice-share=orders|0:0:0/2", [0]),
                                                      ("m2", "app-2#sluice-share=orders|", [])])
    assert cg_answer(c2, cg_heartbeat(c2, 0, [], subscribe=True), 2, []) == [0]  # slice 1/2
    fake.offsets[GROUP] = {(TOPIC, 0): Committed(100, -1, None)}
    offset_fetch_answer(c2, offset_fetch(c2, [0]), {0: 100})
    ex = cg_heartbeat(c2, 2, [0])
    c2.answer(ex, response_codec(CG_HEARTBEAT, V_CGH).default().replace(error_code=82, member_id="m2",
                                                                         member_epoch=-1))
    assert not idle_slice_committed_on(fake, c2, 100, Slice(1, 2))
    assert cg_answer(c2, cg_heartbeat(c2, 2, [0]), 3, None) is None
    assert idle_slice_committed_on(fake, c2, 110, Slice(1, 2))


def test_kip848_a_narrower_slice_is_revoked_first_so_records_the_client_has_already_are_not_handed_twice() -> None:
    """m1 holds partition 0 whole and has fetched records 100-139 (its client prefetches), having committed 110 so
    far; m2 joins and the layout splits the partition. Narrowed at once, m1's client would still deliver the records
    of m2's keys it fetched (and commit them, as its new slice), while m2 started m2's slice at 110: those records
    twice, after they were committed. So a slice that changes is revoked from the client first, as KIP-848 revokes
    before it assigns (CurrentAssignmentBuilder): its commits up to then are its old slice's, and the new slices
    start past them."""
    proxy, fake = sharing_proxy()
    c1, c2 = Client(proxy, "app-1", 1), Client(proxy, "app-2", 2)
    c1.member_id, c2.member_id = "m1", "m2"

    def described(epoch: int, m1_claims: str, with_m2: bool = True, m2_claims: str = "") -> None:
        fake.described_consumer[GROUP] = cg_described(epoch, [("m1", f"app-1#sluice-share=orders|{m1_claims}", [0])]
                                                      + ([("m2", f"app-2#sluice-share=orders|{m2_claims}", [])]
                                                         if with_m2 else []))

    described(2, "", with_m2=False)
    assert cg_answer(c1, cg_heartbeat(c1, 0, [], subscribe=True), 2, [0]) == []  # claimed at the next heartbeat
    assert cg_answer(c1, cg_heartbeat(c1, 2, []), 2, None) == [0]  # whole
    fake.offsets[GROUP] = {(TOPIC, 0): Committed(100, -1, None)}
    offset_fetch_answer(c1, offset_fetch(c1, [0]), {0: 100})
    assert len(fetch(c1, records(40))) == 40  # records 100-139, in its client's queue
    committed_answer(c1, commit(c1, {0: 110}))  # a whole partition's commit is the group's own
    fake.offsets[GROUP][(TOPIC, 0)] = Committed(110, -1, None)
    described(3, "0:0:0/1")
    assert cg_answer(c2, cg_heartbeat(c2, 0, [], subscribe=True), 3, []) == []
    assert cg_answer(c2, cg_heartbeat(c2, 3, []), 3, None) is None  # described: m1's client holds it whole
    # the layout splits partition 0: m1's client is handed nothing until it let the partition go (on main it kept
    # it, narrowed to 0/2, at once)
    assert cg_answer(c1, cg_heartbeat(c1, 2, [0]), 3, None) == []
    ex = commit(c1, {0: 140})  # it delivered what it had fetched, and commits it before letting go
    assert sent(ex).topics[0].partitions[0].committed_offset == 140
    committed_answer(c1, ex)
    fake.offsets[GROUP][(TOPIC, 0)] = Committed(140, -1, None)
    ex = cg_heartbeat(c1, 3, [])  # let go: its new slice claimed, and handed as a partition new to the client
    assert decode_request(ex.frame)[0].client_id == "app-1#sluice-share=orders|0:0:0/2"
    assert cg_answer(c1, ex, 3, None) == [0]
    described(3, "0:0:0/2", m2_claims="")
    assert cg_answer(c2, cg_heartbeat(c2, 3, []), 3, None) == [0]
    # m2's slice starts past every record m1's client was handed and committed (narrowed at once: at 110)
    assert offset_fetch_answer(c2, offset_fetch(c2, [0]), {0: 140}) == {0: (140, "")}
