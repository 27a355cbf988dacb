"""The request-side Fetch policies together on the chain: KIP-74 clamp and fairness order, KIP-73 follower-side
leave-out and KIP-227 terminate mode edit one decoded request (FetchEdit), which is encoded at most once, to the
bytes the construct codec writes for the same edits."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.core.exchange import Exchange
from proxy.policies.size_limit.policy import Budget
from proxy.policies.throttle.policy import Ticket
from proxy.wire import fetch_request_fast, views
from proxy.wire.fetch_request_fast import (
    FetchParams,
    PartitionKey,
    decode_fetch_request,
    encode_fetch_request,
)
from proxy.wire.messages import encode_request, request_codec
from proxy.wire.model import Message
from rig.chain_rig import Clock, SansIOProxy

BUDGET = Budget(100_000, 10_000)
IDS = {"a": bytes([0xA]) * 16, "b": bytes([0xB]) * 16}
ORDER = [("a", 0), ("a", 1), ("b", 0), ("b", 1), ("a", 2)]  # "a" twice: two topic entries on the wire


def header(version: int, corr: int = 9) -> Message:
    return Message(request_api_key=1, request_api_version=version, correlation_id=corr, client_id="app")


def construct_frame(version: int, order: list[tuple[str, int]], max_bytes: int, pmb: int, epoch: int = -1) -> bytes:
    """A Fetch request frame written by the construct codec: ``order``'s partitions, consecutive partitions of
    one topic under one topic entry (Java's FetchRequest.Builder)."""
    topics: list[tuple[str, list[Message]]] = []
    for t, p in order:
        if not topics or topics[-1][0] != t:
            topics.append((t, []))
        topics[-1][1].append(Message(partition=p, current_leader_epoch=3, fetch_offset=10 + p, last_fetched_epoch=-1,
                                     log_start_offset=-1, partition_max_bytes=pmb))
    body = request_codec(1, version).default().replace(max_wait_ms=500, min_bytes=1, max_bytes=max_bytes)
    body.topics = [Message(**({"topic_id": IDS[t]} if version >= 13 else {"topic": t}), partitions=ps)
                   for t, ps in topics]
    if version >= 7:
        body = body.replace(session_id=0, session_epoch=epoch)
    return encode_request(header(version), body)


def proxy(terminate: bool, budget: Budget = BUDGET) -> SansIOProxy:
    p = SansIOProxy({
        "size_limit.budgets": [{"client_id": "a*", "fetch_max_bytes": budget.fetch_max_bytes,
                                "partition_max_bytes": budget.partition_max_bytes}],
        "size_limit.global_max_bytes": 1 << 30,
        "throttle.leader_rate_bytes": 1000, "throttle.follower_rate_bytes": 1000,
        "throttle.topics": [{"topic": "b", "replicas": "*"}], "throttle.consumers": [{"client_id": "app"}],
        "sessions.mode": "terminate" if terminate else "passthrough",
    }, clock=Clock(0.1))
    for name, tid in IDS.items():
        p.names.learn(tid, name)
    state = p.policy("throttle").state
    state.follower.record(5000, 0.0)  # the follower quota is exceeded
    state.high_watermarks[("b", 1)] = 11  # b-1 is in sync (fetch offset 11): never left out
    return p


def state_of(p: SansIOProxy, ex: Exchange, name: str) -> Any:
    """A policy's per-request state."""
    policy = p.policy(name)
    return ex.states[ex.policies.index(policy)] if policy in ex.policies[: len(ex.states)] else None


@pytest.mark.parametrize("terminate", [False, True])
@pytest.mark.parametrize("version", [5, 7, 11, 12, 13, 15, 16, 18])
def test_clamp_reorder_throttle_terminate_encode_like_the_construct_codec(version: int, terminate: bool) -> None:
    """The representative case: a 100 kB / 10 kB budget (clamped from 50 MiB / 1 MiB), a connection whose
    rotation served a-0 last (so it goes to the back), b throttled for this consumer with the follower quota
    exceeded (b-0 left out, b-1 in sync stays), then terminate mode (the first session request: a full one,
    session 0 epoch 0). The upstream frame is what the construct codec writes for those edits (the same bytes
    the construct-based policies produced before the fast path, checked when they were replaced)."""
    p = proxy(terminate)
    fairness = p.conn.states[p.policy("size_limit")]
    key = (lambda t, i: (IDS[t], i)) if version >= 13 else (lambda t, i: (t, i))
    fairness.rank([key(t, i) for t, i in ORDER])
    fairness.served([key("a", 0)])
    ex = p.request(construct_frame(version, ORDER, 50 << 20, 1 << 20))
    expected_order = [("a", 1), ("b", 1), ("a", 2), ("a", 0)]
    session = terminate and version >= 7
    assert ex.frame == construct_frame(version, expected_order, 100_000, 10_000, epoch=0 if session else -1)
    assert state_of(p, ex, "size_limit")[0] == Budget(100_000, 10_000) and ex.reserve == 100_000 and ex.collect
    ticket, _ = state_of(p, ex, "throttle")
    assert isinstance(ticket, Ticket) and ticket.left_out == 1 and ticket.offsets == {("b", 1): 11}
    attempt = state_of(p, ex, "terminate")
    if session:
        assert attempt is not None and attempt.ticket.full
        assert list(attempt.ticket.wanted) == [key(t, i) for t, i in expected_order]
        assert attempt.ticket.request.max_bytes == 100_000  # a re-sent request (replan) keeps the edits
    else:
        assert attempt is None


class Calls:
    """Counts calls of a wrapped function."""

    def __init__(self, fn: Any) -> None:
        self.fn, self.n = fn, 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.n += 1
        return self.fn(*args, **kwargs)


def large_frame(version: int, n: int) -> bytes:
    """A session-less consumer Fetch of ``n`` partitions asking for 1 MiB each (two topics)."""
    small = decode_fetch_request(encode_request(header(version), request_codec(1, version).default().replace(
        max_wait_ms=500, min_bytes=1, max_bytes=50 << 20)))
    half = n // 2
    send: dict[PartitionKey, FetchParams] = {("a" if i < half else "b", i % half): FetchParams(5) for i in range(n)}
    return encode_fetch_request(small, 0, -1, send, [])


@pytest.mark.parametrize("terminate", [False, True])
def test_a_10000_partition_size_limited_request_is_decoded_once_and_encoded_once(
        monkeypatch: pytest.MonkeyPatch, terminate: bool) -> None:
    decodes = Calls(decode_fetch_request)
    encodes = Calls(encode_fetch_request)
    monkeypatch.setattr(views, "decode_fetch_request", decodes)
    monkeypatch.setattr(fetch_request_fast, "encode_fetch_request", encodes)  # FetchEdit.encode
    monkeypatch.setattr("proxy.policies.terminate.policy.encode_fetch_request", encodes)
    p = proxy(terminate)
    frame = large_frame(12, 10_000)
    ex = p.request(frame)
    assert (decodes.n, encodes.n) == (1, 1)
    sent = decode_fetch_request(ex.frame)
    assert sent.max_bytes == 100_000 and sent.partition_count == 5_000  # b-*: left out by the throttle
    assert {q.partition_max_bytes for q in sent.partitions().values()} == {10_000}
    assert (state_of(p, ex, "terminate") is not None) == terminate


def test_a_request_no_policy_changes_is_relayed_as_received(monkeypatch: pytest.MonkeyPatch) -> None:
    encodes = Calls(encode_fetch_request)
    monkeypatch.setattr(fetch_request_fast, "encode_fetch_request", encodes)
    p = proxy(False, budget=Budget(100 << 20, 2 << 20))  # larger than the request asks for
    state = p.policy("throttle").state
    state.follower = type(state.follower)(1000, 11, 1.0)  # quota not exceeded
    frame = large_frame(12, 1_000)
    ex = p.request(frame)  # the first rotation order is the request's own
    assert ex.frame is frame and encodes.n == 0
    assert state_of(p, ex, "size_limit") is not None and state_of(p, ex, "throttle")[0].left_out == 0
