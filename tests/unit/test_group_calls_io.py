"""Sluice's own group requests (sharing's GroupCall, run by proxy/io/cluster.py) against a local misbehaving
broker, as the sharing policy makes them: each call settles, ok or failed, and is counted once in
sluice_sharing_group_calls_total{outcome}; a call cut off mid-answer by its deadline leaves nothing behind for the
next call; a group the cluster refuses for want of an ACL fails its call at once, saying which, in one log
event."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from structlog.testing import capture_logs

from proxy.core.broker_calls import BrokerCalls
from proxy.io.cluster import OwnRequests
from proxy.policies.sharing.group_calls import Committed, GroupCall
from proxy.policies.sharing.policy import Sharing
from proxy.tls import TlsContexts
from proxy.wire.messages import response_codec
from proxy.wire.model import Message
from rig.chain_rig import SansIOProxy
from tests.support.misbehaving_broker import Broker, frame, running

FIND_COORDINATOR, OFFSET_COMMIT, OFFSET_FETCH = 10, 8, 9
TOPIC = "orders"
#: the offset each group has committed on the broker, per partition (the answers tell the groups apart)
COMMITTED = {"a": 11, "b": 22}


GROUP_AUTHORIZATION_FAILED = 30  # Errors.java


def coordinator_is(broker: Broker, header: Message, body: Message, denied: frozenset[str] = frozenset()) -> bytes:
    host, port = broker.address
    return frame(FIND_COORDINATOR, 4, header.correlation_id, response_codec(FIND_COORDINATOR, 4).default().replace(
        coordinators=[Message(key=k, node_id=1, host=host, port=port, error_message=None,
                              error_code=GROUP_AUTHORIZATION_FAILED if k in denied else 0)
                      for k in body.coordinator_keys]))


def offsets_of(header: Message, body: Message) -> bytes:
    return frame(OFFSET_FETCH, 8, header.correlation_id, response_codec(OFFSET_FETCH, 8).default().replace(groups=[
        Message(group_id=g.group_id, error_code=0, topics=[Message(name=t.name, partitions=[
            Message(partition_index=p, committed_offset=COMMITTED[g.group_id], committed_leader_epoch=3,
                    metadata=f"md-{g.group_id}", error_code=0) for p in t.partition_indexes]) for t in g.topics])
        for g in body.groups]))


def committed(header: Message, body: Message) -> bytes:
    return frame(OFFSET_COMMIT, 8, header.correlation_id, response_codec(OFFSET_COMMIT, 8).default().replace(
        topics=[Message(name=t.name, partitions=[Message(partition_index=p.partition_index, error_code=0)
                                                 for p in t.partitions]) for t in body.topics]))


@dataclass
class Rig:
    broker: Broker
    sharing: Sharing
    own: OwnRequests
    proxy: SansIOProxy
    #: how OffsetFetch is answered: None = right; else the misbehaviour's name
    offset_fetch: str | None = None
    #: set when an OffsetFetch arrived and was not (fully) answered
    unanswered: asyncio.Event | None = None
    #: the OffsetCommit requests the broker got
    commits: list[Message] | None = None
    #: the groups FindCoordinator refuses (GROUP_AUTHORIZATION_FAILED)
    denied: frozenset[str] = frozenset()

    def outcomes(self) -> dict[str, float]:
        return {o: self.proxy.metrics.total("sluice_sharing_group_calls_total", outcome=o) for o in ("ok", "failed")}

    async def call(self, call: GroupCall) -> GroupCall:
        done = asyncio.Event()
        call.on_settled(done.set)
        self.sharing.submit(call)
        await asyncio.wait_for(done.wait(), 30.0)
        return call


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    state: list[Rig] = []

    async def behave(header: Message, body: Message, writer: asyncio.StreamWriter) -> None:
        r = state[0]
        api = header.request_api_key
        if api == FIND_COORDINATOR:
            writer.write(coordinator_is(r.broker, header, body, r.denied))
        elif api == OFFSET_COMMIT:
            assert r.commits is not None
            r.commits.append(body)
            writer.write(committed(header, body))
        elif r.offset_fetch is None:
            writer.write(offsets_of(header, body))
        else:
            data = offsets_of(header, body)
            assert r.unanswered is not None
            r.unanswered.set()
            if r.offset_fetch == "cut_off":
                writer.write(data[:len(data) // 2])  # the rest never comes
            elif r.offset_fetch == "hang_up":
                writer.close()
            elif r.offset_fetch == "other_correlation_id":
                writer.write(frame(OFFSET_FETCH, 8, header.correlation_id + 1, response_codec(OFFSET_FETCH, 8)
                                   .default().replace(groups=[])))

    async with running(behave) as broker:
        host, port = broker.address
        proxy = SansIOProxy({"sharing.enabled": True, "sharing.topics": [{"topic": TOPIC}],
                             "upstream.bootstrap_servers": [f"{host}:{port}"]})
        sharing = proxy.policy("sharing")
        assert isinstance(sharing.calls, BrokerCalls)
        own = OwnRequests(proxy.settings.upstream, TlsContexts(proxy.settings), proxy.router, proxy.names,
                          sharing.calls, proxy.metrics, [broker.address])
        own.start(asyncio.get_running_loop())
        state.append(Rig(broker, sharing, own, proxy, unanswered=asyncio.Event(), commits=[]))
        yield state[0]
        await own.close()


def reads(group: str) -> GroupCall:
    return GroupCall(reads={group: {(TOPIC, 0), (TOPIC, 1)}}, deadline_s=1.0)


async def test_a_call_answered_is_settled_with_its_answers_and_counted_ok(rig: Rig) -> None:
    call = await rig.call(GroupCall(commits={"a": {(TOPIC, 0): (5, "mine")}}, reads={"b": {(TOPIC, 0)}}))
    assert call.ok and call.committed == {"a": {(TOPIC, 0): 0}}
    assert call.offsets == {"b": {(TOPIC, 0): Committed(22, 3, "md-b")}}
    assert rig.outcomes() == {"ok": 1, "failed": 0}


async def test_commits_are_simple_unless_made_as_a_member_of_the_group(rig: Rig) -> None:
    call = await rig.call(GroupCall(commits={"a": {(TOPIC, 0): (5, None)}, "b": {(TOPIC, 1): (6, None)}},
                                    as_member={"b": (7, "member-1", None)}))
    assert call.ok
    assert rig.commits is not None
    sent = {c.group_id: (c.generation_id_or_member_epoch, c.member_id) for c in rig.commits}
    assert sent == {"a": (-1, ""), "b": (7, "member-1")}


async def test_a_call_cut_off_mid_answer_fails_at_its_bound_and_the_next_call_gets_its_own_answer(rig: Rig) -> None:
    rig.offset_fetch = "cut_off"
    first = await rig.call(reads("a"))
    assert first.error == "TimeoutError" and not first.offsets
    assert rig.outcomes() == {"ok": 0, "failed": 1}
    rig.offset_fetch = None
    second = await rig.call(reads("b"))
    assert second.ok and second.offsets == {"b": {(TOPIC, 0): Committed(22, 3, "md-b"),
                                                  (TOPIC, 1): Committed(22, 3, "md-b")}}
    assert rig.outcomes() == {"ok": 1, "failed": 1}


@pytest.mark.parametrize("misbehaviour", ["hang_up", "other_correlation_id"])
async def test_a_broker_that_hangs_up_or_answers_another_request_fails_the_call(rig: Rig, misbehaviour: str) -> None:
    rig.offset_fetch = misbehaviour
    call = await rig.call(reads("a"))
    assert call.settled and call.error is not None and not call.offsets
    assert rig.outcomes() == {"ok": 0, "failed": 1}
    rig.offset_fetch = None
    assert (await rig.call(reads("a"))).offsets["a"][(TOPIC, 1)].offset == 11
    assert rig.outcomes() == {"ok": 1, "failed": 1}


async def test_a_call_in_flight_when_sluice_stops_fails_and_closes_its_connection(rig: Rig) -> None:
    rig.offset_fetch = "cut_off"
    call = reads("a")
    rig.sharing.submit(call)
    assert rig.unanswered is not None
    await asyncio.wait_for(rig.unanswered.wait(), 30.0)
    await rig.own.close()
    await asyncio.wait_for(rig.broker.client_closed.wait(), 30.0)
    assert call.error == "cancelled: Sluice is stopping"
    assert rig.outcomes() == {"ok": 0, "failed": 1}


async def test_a_group_refused_for_want_of_an_acl_fails_the_call_at_once_naming_it(rig: Rig) -> None:
    rig.denied = frozenset({"a"})
    with capture_logs() as events:
        for _ in range(2):
            call = await rig.call(reads("a"))
            assert call.error == "User:ANONYMOUS may not Describe Group:a", call.error
    refused = [e for e in events if e["event"] == "kafka_not_authorized"]
    assert [(e["principal"], e["resource"], e["operation"]) for e in refused] == [
        ("User:ANONYMOUS", "Group:a", "Describe")]  # once, however often it is refused
    assert rig.outcomes() == {"ok": 0, "failed": 2}
    assert (await rig.call(reads("b"))).ok
