"""Fetch responses read as they stream by the size limit, the throttle and the quota (Policy.stream_fetch): a
response within every policy's bounds streams through (its first bytes reach the client before its last one
reached Sluice) and leaves the metrics, the mute, the access-log line and the policies' state as the collected path
leaves them for the same response; one that a policy may have to cut, or one another policy needs whole, is
collected."""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import Any

import pytest
from structlog.testing import capture_logs

from bench.pipeline_cpu import request_frame
from proxy.policies.size_limit.policy import Budget, Fairness, enforce
from proxy.policies.terminate.sessions import LEGACY
from proxy.policies.throttle.policy import CONSUMER, Throttles, ThrottleState, Ticket, account, parse_replicas
from proxy.policies.throttle.policy import enforce as throttle_enforce
from proxy.wire.fetch_fast import FetchPartition, FetchResponseView, FetchTopic, decode_frame
from proxy.wire.fetch_stream import FetchStreamer
from proxy.wire.records import Record, encode_batch, new_batch
from rig.core_rig import CoreRig, sized

CLIENT = "bench-client"  # the client id of bench.pipeline_cpu's requests
NO_IDS: Any = {}.get  # topic id -> name: v12 names its topics


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[list[MutableMapping[str, Any]]]:
    with capture_logs() as events:  # kept, not printed
        yield events


def batch(base: int, value: int = 300) -> bytes:
    return encode_batch(new_batch([Record(offset_delta=0, value=b"x" * value)], base_offset=base))


def view(truncated: bool = False) -> FetchResponseView:
    """Three throttled partitions of "t" (one in sync: its first batch at the high watermark; one empty) and one
    of "u", not throttled."""
    tail = batch(9)[:30] if truncated else b""
    return FetchResponseView(12, topics=[
        FetchTopic("t", partitions=[
            FetchPartition(0, high_watermark=50, last_stable_offset=50, log_start_offset=0,
                           records=batch(3) + batch(4) + tail),
            FetchPartition(1, high_watermark=7, last_stable_offset=7, log_start_offset=0, records=batch(7)),
            FetchPartition(2, high_watermark=0, last_stable_offset=0, log_start_offset=0, records=b""),
        ]),
        FetchTopic("u", partitions=[
            FetchPartition(0, high_watermark=9, last_stable_offset=9, log_start_offset=0, records=batch(8)),
        ]),
    ])


def frame(v: FetchResponseView, corr: int) -> bytes:
    buffers, _ = v.encode_frame(corr)
    return b"".join(bytes(b) for b in buffers)[4:]


KEYS = [("t", 0), ("t", 1), ("t", 2), ("u", 0)]
SIZE = len(frame(view(), 1))
LARGEST = max(len(p.records or b"") for t in view().topics for p in t.partitions)
EVERY_POLICY = {
    "throttle.leader_rate_bytes": 10_000_000, "throttle.topics": [{"topic": "t"}],
    "throttle.consumers": [{"client_id": CLIENT}],
    "quota.entries": [{"client_id": CLIENT, "fetch_rate_bytes": 1000}],  # a few KB: throttled, muted
}


def budget(partition_max_bytes: int) -> dict[str, Any]:
    return {"size_limit.budgets": [{"client_id": CLIENT, "fetch_max_bytes": 1 << 20,
                                    "partition_max_bytes": partition_max_bytes}]}


def run(overrides: dict[str, Any], responses: list[bytes]) -> tuple[CoreRig, list[bytes], list[bool]]:
    """Each response to a fetch of KEYS, delivered in two halves: what the client got, and whether it got bytes
    of each before its second half arrived (streamed). The mutes are waited out in between."""
    rig = CoreRig(overrides)
    conn, port = rig.connect()
    replies, early = [], []
    for corr, response in enumerate(responses, 1):
        conn.client_data(sized(request_frame(12, corr, dict.fromkeys(KEYS, 0), LEGACY)))
        wire = sized(response)
        conn.upstream_data(wire[: len(wire) // 2])
        early.append(bool(port.client))
        conn.upstream_data(wire[len(wire) // 2 :])
        replies.append(port.take_client())
        rig.advance(10)
    return rig, replies, early


def comparable(rig: CoreRig) -> list[dict[str, Any]]:
    return [{k: v for k, v in line.items() if k not in ("latency_ms", "ts")} for line in rig.lines()]


FIGURES = [("sluice_quota_bytes_total", {"kind": "fetch"}), ("sluice_quota_throttle_seconds_total", {}),
           ("sluice_throttle_bytes_total", {"side": "leader"}), ("sluice_size_limit_trimmed_bytes_total", {})]


def figures(rig: CoreRig) -> list[float]:
    return [rig.metrics.total(name, **labels) for name, labels in FIGURES]


def test_a_response_within_every_bound_streams_and_ends_as_collected() -> None:
    responses = [frame(view(), 1), frame(view(), 2)]
    streamed, s_replies, s_early = run({**EVERY_POLICY, **budget(SIZE)}, responses)
    # a partition cap above every partition but below the whole response: the size limit may have to cut, so
    # the same response is collected (and nothing is cut from it)
    collected, c_replies, c_early = run({**EVERY_POLICY, **budget(LARGEST)}, responses)
    assert s_early == [True, True] and c_early == [False, False]
    assert s_replies == c_replies  # byte for byte, the quota's throttle time included
    assert all(decode_frame(r[4:], 12)[2].throttle_time_ms > 0 for r in s_replies)  # the quota's, over 1000 B/s
    lines = comparable(streamed)
    assert lines == comparable(collected)
    assert lines[1]["quota_throttle_time_ms"] > 0 and lines[0]["throttled_bytes"] == 3 * len(batch(0))
    assert lines[0]["decoded"] and lines[0]["partitions"] == [
        {"topic": t, "partition": p, "bytes": len(part.records or b"")}
        for (t, p), part in zip(KEYS, (p for t in view().topics for p in t.partitions), strict=True)]
    assert figures(streamed) == figures(collected) and figures(streamed)[2] > 0
    assert streamed.ports[0].named("call_later") == collected.ports[0].named("call_later")  # the quota's mute
    s_throttle, c_throttle = streamed.proxy.policy("throttle").state, collected.proxy.policy("throttle").state
    assert s_throttle.high_watermarks == c_throttle.high_watermarks == {("t", 0): 50, ("t", 1): 7, ("t", 2): 0}


def test_a_truncated_trailing_batch_streams_to_the_client_but_is_not_counted() -> None:
    response = frame(view(truncated=True), 1)
    policies = {**EVERY_POLICY, "quota.entries": []}
    streamed, [reply], [early] = run({**policies, **budget(len(response))}, [response])
    collected, [trimmed], _ = run({**policies, **budget(LARGEST + 30)}, [response])
    assert early and reply == sized(response)  # as the broker sent it (clients discard the tail)
    assert len(trimmed) == len(reply) - 30  # the collected path drops it
    assert streamed.lines()[0]["throttled_bytes"] == collected.lines()[0]["throttled_bytes"] == 3 * len(batch(0))


def test_headroom_short_of_the_response_collects_it() -> None:
    """The throttle streams only a response its headroom covers whole; short of it, the response is collected
    (here the headroom, above what the records need, leaves it whole)."""
    rates = {**EVERY_POLICY, "throttle.leader_rate_bytes": 1000, "quota.entries": []}
    rig, [reply], [early] = run(rates, [frame(view(), 1)])
    assert not early and reply == sized(frame(view(), 1))
    assert rig.lines()[0]["throttled_bytes"] == 3 * len(batch(0))


def test_a_policy_that_needs_the_whole_response_collects_it_for_all() -> None:
    """Terminate rebuilds every response: the size limit and the quota read the collected view as before."""
    rig, _, [early] = run({**EVERY_POLICY, **budget(SIZE), "sessions.mode": "terminate"}, [frame(view(), 1)])
    assert not early and rig.lines()[0]["quota_throttle_time_ms"] > 0


def test_the_rotation_learns_the_same_partitions_either_way() -> None:
    """The size limit's fairness bookkeeping from the walk's partitions (whole batches only) is enforce's."""
    for truncated in (False, True):
        v = view(truncated)
        body = frame(v, 1)[4:]
        walk = FetchStreamer(12, len(body))
        walk.watch()
        walk.feed(body)
        streamed, collected = Fairness(), Fairness()
        for f in (streamed, collected):
            f.rank([("u", 0), ("t", 2)])  # seen before: first in the rotation
        CoreRig(budget(SIZE)).proxy.policy("size_limit")._stream_finish(streamed, walk)
        enforce(v, Budget(1 << 20), collected)
        assert list(streamed._order) == list(collected._order) == [("t", 2), ("u", 0), ("t", 0), ("t", 1)]


@pytest.mark.parametrize("offsets", [{}, {("t", 0): 1}])
def test_the_throttle_accounts_a_streamed_response_as_enforce_does(offsets: dict[tuple[str, int], int]) -> None:
    t = Throttles(leader_rate=10_000_000, topics={"t": parse_replicas("*")})
    for truncated in (False, True):
        v = view(truncated)
        body = frame(v, 1)[4:]
        walk = FetchStreamer(12, len(body))
        walk.watch()
        for i in range(0, len(body), 7):
            walk.feed(body[i : i + 7])
        a, b = ThrottleState(t), ThrottleState(t)
        ticket = Ticket(CONSUMER, dict(offsets), 0.5)
        assert walk.seen is not None
        got = account(walk.seen, ticket, t, a, NO_IDS, 100.0)
        want = throttle_enforce(v, Ticket(CONSUMER, dict(offsets), 0.5), t, b, NO_IDS, 100.0)
        assert (got.sent_bytes, got.mute_s, got.unnamed) == (want.sent_bytes, want.mute_s, want.unnamed)
        assert a.high_watermarks == b.high_watermarks and a.sum_lag(100.0) == b.sum_lag(100.0) > 0
        assert a.leader.rate(100.0) == b.leader.rate(100.0)


def test_a_streamed_response_holds_its_memory_until_it_is_written() -> None:
    """The proxy-wide bound (size_limit.global_max_bytes) counts a streamed response as a collected one: its real
    size from its prefix until its last byte is written."""
    rig = CoreRig({**EVERY_POLICY, **budget(SIZE), "size_limit.global_max_bytes": 1 << 20})
    conn, port = rig.connect()
    conn.client_data(sized(request_frame(12, 1, dict.fromkeys(KEYS, 0), LEGACY)))
    wire = sized(frame(view(), 1))
    conn.upstream_data(wire[:100])
    assert port.client and rig.memory.held == SIZE  # streaming: the reservation became the response's size
    conn.upstream_data(wire[100:])
    assert port.take_client() and rig.memory.held == 0
