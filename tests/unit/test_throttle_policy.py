"""KIP-73 throttles, sans-IO: replica-list parsing, who is throttled, leader and follower decisions, the
in-sync exemption (KAFKA-4313) and what leaving records out does to a client's fetch session."""

from __future__ import annotations

import fnmatch
from typing import Any

import pytest

from proxy.app import load_settings
from proxy.config import ConfigError
from proxy.policies.throttle.policy import (
    CONSUMER,
    ReplicaSet,
    Throttles,
    ThrottleState,
    enforce,
    parse_replicas,
    plan_request,
)
from proxy.policies.topic_rules import TopicRules
from proxy.wire.fetch_fast import FetchPartition, FetchResponseView, FetchTopic
from proxy.wire.fetch_request_fast import FetchEdit, decode_fetch_request
from proxy.wire.messages import encode_request, request_codec
from proxy.wire.model import Message

MB = 1_000_000
NO_IDS: Any = {}.get  # topic id -> name, for the v12 requests below (named topics)


# --------------------------------------------------------------------------------------------- parsing


def test_wildcard_list_and_empty() -> None:
    assert parse_replicas("*") == ReplicaSet(everything=True)
    assert parse_replicas("") == ReplicaSet()
    rs = parse_replicas(" 0:101, 1:102 ,0:103")
    assert rs.pairs == {(0, 101), (1, 102), (0, 103)}
    assert rs.throttled(0, 101) and rs.throttled(0, 103) and not rs.throttled(0, 102)
    assert rs.throttled(1, CONSUMER) and not rs.throttled(2, CONSUMER)  # consumers: the listed partitions
    assert ReplicaSet(everything=True).throttled(7, CONSUMER)


@pytest.mark.parametrize("bad", ["0", "0:", ":1", "a:1", "0:1,", "0:1;1:2", "-1:2", "0:1:2", "**", "0 :1x"])
def test_invalid_replica_strings_name_key_and_item(bad: str) -> None:
    with pytest.raises(ValueError, match="replicas"):
        parse_replicas(bad, "replicas")
    with pytest.raises(ConfigError) as e:
        load_settings(None, env={}).with_overrides(
            {"throttle.topics": [{"topic": "t", "replicas": "*"}, {"topic": "u", "replicas": bad}]})
    assert e.value.key == "throttle.topics[1].replicas"
    assert "partition:broker" in str(e.value)


def test_settings_to_snapshot() -> None:
    s = load_settings(None, env={}).with_overrides({
        "throttle.leader_rate_bytes": 5 * MB, "throttle.topics": [{"topic": "t", "replicas": "0:1"}],
        "throttle.consumers": [{"client_id": "backfill-*"}]})
    t = Throttles.from_settings(s.throttle)
    assert t.active and t.leader_rate == 5 * MB and t.samples == 11 and t.window_s == 1.0
    consumer = decode_fetch_request(encode_request(
        Message(request_api_key=1, request_api_version=12, correlation_id=1, client_id="c"),
        request_codec(1, 12).default()))
    follower = decode_fetch_request(encode_request(
        Message(request_api_key=1, request_api_version=12, correlation_id=1, client_id="c"),
        request_codec(1, 12).default().replace(replica_id=1)))
    assert t.fetcher("backfill-7", consumer) == CONSUMER and t.fetcher("backfill-7", None) == CONSUMER
    assert t.fetcher("live", consumer) is None
    assert t.fetcher("broker-1-fetcher-0", follower) == 1  # replica fetches are throttled by broker id
    assert t.throttled("t", 0, 1) and not t.throttled("t", 0, 2) and t.throttled("t", 0, CONSUMER)
    assert not t.throttled("u", 0, 1) and not t.throttled(None, 0, 1)
    assert not Throttles.from_settings(load_settings(None, env={}).throttle).active
    with pytest.raises(ConfigError) as e:
        load_settings(None, env={}).with_overrides({"throttle.leader_rate_bytes": -1})
    assert e.value.key == "throttle.leader_rate_bytes"


# -------------------------------------------------------------------------------------- topic globs


def globbed(*entries: tuple[str, str]) -> Throttles:
    """A snapshot from [[throttle.topics]] entries (topic, replicas), in this order, through validation."""
    s = load_settings(None, env={}).with_overrides({
        "throttle.leader_rate_bytes": 1000,
        "throttle.topics": [{"topic": topic, "replicas": replicas} for topic, replicas in entries]})
    return Throttles.from_settings(s.throttle)


def test_globs_match_topic_names_case_sensitively() -> None:
    t = globbed(("orders-*", "*"), ("inv?ntory", "0:1"), ("log-[a-c]", "*"), ("m[!x]", "*"))
    assert t.throttled("orders-eu", 3, CONSUMER) and t.throttled("orders-", 0, 7)
    assert not t.throttled("Orders-eu", 0, CONSUMER)  # Kafka topic names are case-sensitive, so are globs
    assert not t.throttled("orders", 0, CONSUMER) and not t.throttled("my-orders-eu", 0, CONSUMER)
    assert t.throttled("inventory", 0, 1) and not t.throttled("inventory", 0, 2)  # the entry's own replicas
    assert not t.throttled("inventry", 0, 1)  # ? is exactly one character
    assert t.throttled("log-b", 0, 1) and not t.throttled("log-d", 0, 1)
    assert t.throttled("my", 0, 1) and not t.throttled("mx", 0, 1)
    assert t.active and t.globs == ("orders-*", "inv?ntory", "log-[a-c]", "m[!x]")


def test_star_matches_every_topic() -> None:
    t = globbed(("*", "0:5"))
    assert t.throttled("anything", 0, 5) and t.throttled("a.b_c-d", 0, CONSUMER) and not t.throttled("x", 1, 5)
    assert not t.throttled(None, 0, 5)  # an unknown topic id stays unthrottled


def test_exact_name_wins_over_globs_and_first_glob_wins_among_globs() -> None:
    t = globbed(("orders-*", "*"), ("o*", "0:7"), ("orders-audit", ""), ("*", "1:9"))
    # The exact entry comes after two matching globs in file order, and still wins: it exempts orders-audit.
    assert t.entry("orders-audit") == "orders-audit" and not t.throttled("orders-audit", 0, CONSUMER)
    # orders-eu matches "orders-*", "o*" and "*": the first in file order applies, entries are not merged.
    assert t.entry("orders-eu") == "orders-*" and t.throttled("orders-eu", 3, 1)
    assert t.entry("ops") == "o*" and t.throttled("ops", 0, 7) and not t.throttled("ops", 1, 9)
    assert t.entry("payments") == "*" and t.throttled("payments", 1, 9) and not t.throttled("payments", 0, 7)
    # Reordering the globs is a different configuration: the snapshot says so.
    assert globbed(("o*", "0:7"), ("orders-*", "*")).entry("orders-eu") == "o*"
    assert globbed(("o*", "0:7"), ("orders-*", "*")) != globbed(("orders-*", "*"), ("o*", "0:7"))
    assert globbed(("o*", "0:7"), ("orders-*", "*")) == globbed(("o*", "0:7"), ("orders-*", "*"))


def test_glob_resolution_runs_once_per_topic_name(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, str]] = []
    real = fnmatch.fnmatchcase

    def counting(name: str, pattern: str) -> bool:
        calls.append((name, pattern))
        return real(name, pattern)

    monkeypatch.setattr(fnmatch, "fnmatchcase", counting)
    t = globbed(("a-*", "0:1"), ("b-*", "*"), ("exact", "*"))
    # Per partition per fetch: the globs are tried for a name the first time only, hits and misses alike.
    for _ in range(3):
        assert all(t.throttled("b-1", p, CONSUMER) for p in range(100))
        assert not any(t.throttled("zzz", p, CONSUMER) for p in range(100))
        assert all(t.throttled("exact", p, CONSUMER) for p in range(100))
    assert calls == [("b-1", "a-*"), ("b-1", "b-*"), ("zzz", "a-*"), ("zzz", "b-*")]
    # A new snapshot (every reconfiguration) starts afresh.
    calls.clear()
    assert globbed(("a-*", "0:1"), ("b-*", "*")).throttled("b-1", 0, CONSUMER)
    assert calls == [("b-1", "a-*"), ("b-1", "b-*")]


def test_glob_resolution_memo_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = fnmatch.fnmatchcase

    def counted(name: str, pattern: str) -> bool:
        calls.append(name)
        return real(name, pattern)

    monkeypatch.setattr(fnmatch, "fnmatchcase", counted)
    monkeypatch.setattr(TopicRules, "RESOLVED_MAX", 2)
    t = globbed(("exact", ""), ("t-*", "*"))
    for name in ("t-1", "t-2", "t-1", "t-2"):
        assert t.throttled(name, 0, CONSUMER)
    assert calls == ["t-1", "t-2"]  # two names fit
    assert t.throttled("t-3", 0, CONSUMER)  # a third starts the memo again ...
    assert t.throttled("t-1", 0, CONSUMER)  # ... so t-1 is resolved anew, with the same answer
    assert calls == ["t-1", "t-2", "t-3", "t-1"]
    assert not t.throttled("exact", 0, CONSUMER)  # an exact name never needs a glob
    assert calls == ["t-1", "t-2", "t-3", "t-1"]


@pytest.mark.parametrize("topic", ["orders", "orders-*", "*", "?", "a.b_c-D9", "log-[a-c]", "m[!x]*", "[-_.]x",
                                   "x" * 249, "*" + "x" * 249])
def test_valid_topic_names_and_globs(topic: str) -> None:
    [entry] = load_settings(None, env={}).with_overrides({"throttle.topics": [{"topic": topic}]}).throttle.topics
    assert entry.topic == topic  # kept as configured


@pytest.mark.parametrize(("topic", "reason"), [
    ("", "must be a topic name or a glob"),
    (" orders", "' ' at position 0 cannot occur in a topic name"),
    ("orders/eu", "'/' at position 6 cannot occur in a topic name"),
    ("ordérs", "'é' at position 3 cannot occur"),
    ("orders-[eu", "'[' at position 7 is never closed"),
    ("orders]", "']' at position 6 closes no '['"),
    ("x[]", "set at position 1 is empty"),
    ("x[!]", "set at position 1 is empty"),
    ("x[a/]", "'/' in the set at position 1 can never match"),
    ("x[z-a]", "range 'z-a' is empty"),
    (".", "Kafka forbids '.' and '..'"),
    ("..", "Kafka forbids '.' and '..'"),
    ("x" * 250, "longer than the 249 characters"),
    ("?" * 250 + "*", "can never match: every name it matches is longer than the 249"),
])
def test_invalid_topic_names_and_globs_name_the_key(topic: str, reason: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_settings(None, env={}).with_overrides(
            {"throttle.topics": [{"topic": "ok"}, {"topic": topic, "replicas": "*"}]})
    assert e.value.key == "throttle.topics[1].topic"
    assert reason in e.value.reason and "\n" not in str(e.value) and len(str(e.value)) < 300


def test_duplicate_topic_entries_are_refused() -> None:
    base = load_settings(None, env={})
    with pytest.raises(ConfigError) as e:
        base.with_overrides({"throttle.topics": [{"topic": "a-*"}, {"topic": "b"}, {"topic": "a-*", "replicas": ""}]})
    assert e.value.key == "throttle.topics[2].topic"
    assert e.value.reason.startswith("'a-*' is already throttle.topics[0]: one entry per topic name or glob")
    # Different entries that match the same topics are fine: precedence decides (see above).
    base.with_overrides({"throttle.topics": [{"topic": "a-*"}, {"topic": "a-1"}, {"topic": "*"}]})


# ------------------------------------------------------------------------------------- leader side


def edit(version: int, body: Message) -> FetchEdit:
    """The request as the pipeline hands it to the policy: a frame decoded by the fast path."""
    header = Message(request_api_key=1, request_api_version=version, correlation_id=1, client_id="backfill-1")
    return FetchEdit(decode_fetch_request(encode_request(header, body)))


def fetch_request(offsets: dict[tuple[str, int], int], epoch: int = -1, max_wait_ms: int = 500) -> FetchEdit:
    topics: dict[str, list[Message]] = {}
    for (t, p), off in offsets.items():
        topics.setdefault(t, []).append(Message(partition=p, current_leader_epoch=-1, fetch_offset=off,
                                                last_fetched_epoch=-1, log_start_offset=-1,
                                                partition_max_bytes=1 << 20))
    return edit(12, request_codec(1, 12).default().replace(
        replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=50 << 20, session_id=0,
        session_epoch=epoch, topics=[Message(topic=t, partitions=ps) for t, ps in topics.items()]))


def batch(size: int, base_offset: int = 0) -> bytes:
    """One record batch of exactly ``size`` bytes (at least ~70) starting at ``base_offset``."""
    from proxy.wire.records import Record, encode_batch, new_batch

    value = size - 70
    while True:
        out = encode_batch(new_batch([Record(offset_delta=0, value=b"x" * value)], base_offset=base_offset))
        if len(out) == size:
            return out
        value += size - len(out)


def response(parts: dict[tuple[str, int], tuple[int, int]],
             base: dict[tuple[str, int], int] | None = None) -> FetchResponseView:
    """(topic, partition) -> (high watermark, record bytes: one batch starting at ``base`` (default 0))."""
    topics: dict[str, list[FetchPartition]] = {}
    for (t, p), (hw, size) in parts.items():
        records = memoryview(batch(size, (base or {}).get((t, p), 0)) if size else b"")
        topics.setdefault(t, []).append(FetchPartition(p, high_watermark=hw, last_stable_offset=hw,
                                                       log_start_offset=0, records=records))
    return FetchResponseView(12, topics=[FetchTopic(t, partitions=ps) for t, ps in topics.items()])


def snapshot(leader: int = 1000, follower: int = 0, replicas: str = "*") -> Throttles:
    return Throttles(leader_rate=leader, follower_rate=follower, topics={"t": parse_replicas(replicas)},
                     consumers=("backfill-*",))


def sizes(view: FetchResponseView) -> dict[tuple[str, int], int]:
    return {(t.topic, p.partition_index): len(p.records or b"") for t, p in view.partitions()}


def test_leader_under_quota_passes_and_records_all_throttled_bytes() -> None:
    t = snapshot()
    st = ThrottleState(t)
    req = fetch_request({("t", 0): 0, ("t", 1): 0, ("u", 0): 0})
    ticket = plan_request(req, CONSUMER, t, st, NO_IDS, 0.0)
    assert set(ticket.offsets) == {("t", 0), ("t", 1)}  # u is not throttled
    view = response({("t", 0): (100, 600), ("t", 1): (100, 300), ("u", 0): (100, 5000)})
    out = enforce(view, ticket, t, st, NO_IDS, 0.0)
    assert out.left_out == 0 and out.sent_bytes == 900 and out.mute_s == 0
    assert st.leader.total(0.0) == 900  # only throttled partitions count
    assert st.sum_lag(0.0) == 200


def test_leader_over_quota_leaves_records_out_keeps_partition_and_hw() -> None:
    t = snapshot(leader=1000)
    st = ThrottleState(t)
    st.leader.record(5000, 0.0)
    req = fetch_request({("t", 0): 0, ("t", 1): 0, ("u", 0): 0})
    ticket = plan_request(req, CONSUMER, t, st, NO_IDS, 0.1)
    view = response({("t", 0): (100, 600), ("t", 1): (100, 300), ("u", 0): (100, 5000)})
    out = enforce(view, ticket, t, st, NO_IDS, 0.1)
    assert out.left_out == 2 and out.changed
    assert sizes(view) == {("t", 0): 0, ("t", 1): 0, ("u", 0): 5000}  # unthrottled keeps flowing
    assert [(p.error_code, p.high_watermark) for _, p in view.partitions()] == [(0, 100)] * 3
    assert out.mute_s == 0  # data went back (u): no pacing


def test_only_throttled_left_out_paces_the_fetcher_by_max_wait_or_recovery() -> None:
    t = snapshot(leader=1000)
    st = ThrottleState(t)
    st.leader.record(1500, 0.0)  # rate 1500 B/s over the first window; back to 1000 B/s at 1.5 s
    ticket = plan_request(fetch_request({("t", 0): 0}, max_wait_ms=500), CONSUMER, t, st, NO_IDS, 0.2)
    out = enforce(response({("t", 0): (100, 700)}), ticket, t, st, NO_IDS, 0.2)
    assert out.left_out == 1 and out.mute_s == pytest.approx(0.5)  # capped by max_wait_ms
    ticket = plan_request(fetch_request({("t", 0): 0}, max_wait_ms=500), CONSUMER, t, st, NO_IDS, 1.3)
    out = enforce(response({("t", 0): (100, 700)}), ticket, t, st, NO_IDS, 1.3)
    assert out.mute_s == pytest.approx(0.2)


def test_in_sync_partition_is_exempt_but_counted() -> None:
    """KAFKA-4313: a fetcher at the high watermark is not throttled; its bytes still count."""
    t = snapshot(leader=1000)
    st = ThrottleState(t)
    st.leader.record(5000, 0.0)
    # a replica fetcher at HW 100 still gets the records above it (leaders send up to the log end): its first
    # batch starts at the high watermark
    ticket = plan_request(fetch_request({("t", 0): 100, ("t", 1): 40}), 7, t, st, NO_IDS, 0.5)
    view = response({("t", 0): (100, 250), ("t", 1): (100, 400)}, base={("t", 0): 100, ("t", 1): 40})
    out = enforce(view, ticket, t, st, NO_IDS, 0.5)
    assert sizes(view) == {("t", 0): 250, ("t", 1): 0}
    assert out.left_out == 1 and out.sent_bytes == 250
    assert st.leader.total(0.5) == 5250
    assert st.sum_lag(0.5) == 60


def test_replica_list_selects_by_broker_id() -> None:
    t = snapshot(leader=1, replicas="0:101")
    st = ThrottleState(t)
    st.leader.record(10, 0.0)
    for fetcher, expect in ((101, 0), (102, 300)):
        ticket = plan_request(fetch_request({("t", 0): 0}), fetcher, t, st, NO_IDS, 0.0)
        view = response({("t", 0): (100, 300)})
        enforce(view, ticket, t, st, NO_IDS, 0.0)
        assert sizes(view)[("t", 0)] == expect


def test_glob_selected_partitions_are_left_out_over_quota() -> None:
    t = globbed(("orders-*", "*"), ("orders-audit", ""))
    st = ThrottleState(t)
    st.leader.record(5000, 0.0)  # over the 1000 B/s quota
    req = fetch_request({("orders-eu", 0): 0, ("orders-audit", 0): 0, ("payments", 0): 0})
    ticket = plan_request(req, CONSUMER, t, st, NO_IDS, 0.1)
    assert set(ticket.offsets) == {("orders-eu", 0)}
    view = response({("orders-eu", 0): (100, 600), ("orders-audit", 0): (100, 300), ("payments", 0): (100, 200)})
    out = enforce(view, ticket, t, st, NO_IDS, 0.1)
    assert out.left_out == 1
    assert sizes(view) == {("orders-eu", 0): 0, ("orders-audit", 0): 300, ("payments", 0): 200}


def test_topic_ids_resolved_through_names() -> None:
    tid = bytes(range(16))
    t = snapshot(leader=1)
    st = ThrottleState(t)
    st.leader.record(10, 0.0)
    req = edit(16, request_codec(1, 16).default().replace(max_wait_ms=0, session_epoch=-1, topics=[Message(
        topic_id=tid, partitions=[Message(partition=0, current_leader_epoch=-1, fetch_offset=0,
                                          last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1)])]))
    names = {tid: "t"}.get
    ticket = plan_request(req, CONSUMER, t, st, names, 0.0)
    view = FetchResponseView(16, topics=[FetchTopic(topic_id=tid, partitions=[
        FetchPartition(0, high_watermark=9, records=memoryview(batch(100)))])])
    assert enforce(view, ticket, t, st, names, 0.0).left_out == 1
    assert plan_request(req, CONSUMER, t, st, NO_IDS, 0.0).offsets == {}  # unknown id: not throttled


# ------------------------------------------------------------------------------------- follower side


def test_follower_over_quota_leaves_out_of_out_of_sync_partitions_of_sessionless_requests() -> None:
    t = snapshot(leader=0, follower=1000)
    st = ThrottleState(t)
    st.high_watermarks[("t", 1)] = 50  # seen in an earlier response
    st.follower.record(5000, 0.0)
    req = fetch_request({("t", 0): 0, ("t", 1): 50, ("u", 0): 0})
    ticket = plan_request(req, CONSUMER, t, st, NO_IDS, 0.1)
    assert ticket.left_out == 1 and not ticket.emptied
    # t-0 (never seen, so not in sync) is left out; t-1 (at its HW) stays; u is not throttled
    assert list(req.partitions) == [("t", 1), ("u", 0)] and req.changed
    assert list(decode_fetch_request(req.encode()).partitions()) == [("t", 1), ("u", 0)]
    # the bytes handed on for throttled partitions are recorded on the follower side
    enforce(response({("t", 1): (60, 100), ("u", 0): (9, 999)}, base={("t", 1): 50}), ticket, t, st, NO_IDS, 0.1)
    assert st.follower.total(0.1) == 5100


def test_follower_leaving_everything_out_paces_the_fetcher() -> None:
    t = snapshot(leader=0, follower=1000)
    st = ThrottleState(t)
    st.follower.record(1200, 0.0)
    req = fetch_request({("t", 0): 0})
    ticket = plan_request(req, CONSUMER, t, st, NO_IDS, 0.5)
    assert ticket.emptied and req.partitions == {}
    assert not decode_fetch_request(req.encode()).has_partitions
    out = enforce(FetchResponseView(12), ticket, t, st, NO_IDS, 0.5)
    assert out.mute_s == pytest.approx(0.5)  # min(max_wait 0.5, 1.2 - 0.5 s)


@pytest.mark.parametrize("epoch", [0, 5])
def test_follower_leaves_session_requests_alone(epoch: int) -> None:
    t = snapshot(leader=0, follower=1000)
    st = ThrottleState(t)
    st.follower.record(5000, 0.0)
    req = fetch_request({("t", 0): 0}, epoch=epoch)
    ticket = plan_request(req, CONSUMER, t, st, NO_IDS, 0.1)
    assert ticket.left_out == 0 and list(req.partitions) == [("t", 0)] and not req.changed


def test_follower_over_quota_leaves_records_of_session_partitions_out_of_the_response() -> None:
    """A fetch session's partitions cannot be left out of its request, so the follower side leaves their
    records out of the response instead (in-sync partitions stay; only bytes handed on count)."""
    t = snapshot(leader=0, follower=1000)
    st = ThrottleState(t)
    st.follower.record(5000, 0.0)
    req = fetch_request({("t", 0): 0}, epoch=4, max_wait_ms=500)
    ticket = plan_request(req, CONSUMER, t, st, NO_IDS, 0.1)
    view = response({("t", 0): (100, 300), ("t", 1): (100, 300), ("u", 0): (100, 300)}, base={("t", 1): 100})
    out = enforce(view, ticket, t, st, NO_IDS, 0.1)
    assert out.follower_left_out == 1 and out.left_out == 0 and out.changed
    assert sizes(view) == {("t", 0): 0, ("t", 1): 300, ("u", 0): 300}  # t-1 is in sync: kept, counted
    assert st.follower.total(0.1) == 5300


def test_follower_holding_back_all_of_a_session_response_paces_the_fetcher() -> None:
    t = snapshot(leader=0, follower=1000)
    st = ThrottleState(t)
    st.follower.record(1200, 0.0)
    ticket = plan_request(fetch_request({("t", 0): 0}, epoch=2), CONSUMER, t, st, NO_IDS, 0.5)
    out = enforce(response({("t", 0): (100, 300)}), ticket, t, st, NO_IDS, 0.5)
    assert out.follower_left_out == 1 and out.mute_s == pytest.approx(0.5)


# ------------------------------------------------------------------------------------------- sessions


@pytest.mark.parametrize("leader_exceeded", [False, True])
def test_every_throttled_partition_of_a_session_response_counts_listed_or_not(leader_exceeded: bool) -> None:
    """KIP-227: an incremental request lists only the partitions that changed (here: none), while the response
    carries every partition of the session with news. Each of them is metered and held back like a listed one
    (metering only the listed ones let a Java consumer read 56 MB with 6 MB counted)."""
    t = snapshot(leader=1000)
    st = ThrottleState(t)
    if leader_exceeded:
        st.leader.record(5000, 0.0)
    ticket = plan_request(fetch_request({}, epoch=7), CONSUMER, t, st, NO_IDS, 0.1)
    assert ticket.session and ticket.offsets == {}
    view = response({("t", 0): (500, 400), ("t", 1): (500, 300), ("u", 0): (500, 200)})
    out = enforce(view, ticket, t, st, NO_IDS, 0.1)
    if leader_exceeded:
        assert out.left_out == 2 and out.sent_bytes == 0
        assert sizes(view) == {("t", 0): 0, ("t", 1): 0, ("u", 0): 200}
        assert st.leader.total(0.1) == 5000
    else:
        assert out.left_out == 0 and out.sent_bytes == 700 and st.leader.total(0.1) == 700
    assert st.sum_lag(0.1) == 1000  # lag from the batches' offsets: 500 - 0, twice




class FakeSession:
    """The checks of the Java client's FetchSessionHandler.handleResponse: a full response must hold exactly
    the session's partitions (verifyFullFetchResponsePartitions); an incremental one only partitions of the
    session (verifyIncrementalFetchResponsePartitions)."""

    def __init__(self, partitions: set[tuple[str, int]]) -> None:
        self.partitions = partitions

    def full_ok(self, view: FetchResponseView) -> bool:
        return {(t.topic, p.partition_index) for t, p in view.partitions()} == self.partitions

    def incremental_ok(self, view: FetchResponseView) -> bool:
        return {(t.topic, p.partition_index) for t, p in view.partitions()} <= self.partitions


def test_leaving_records_out_keeps_full_and_incremental_sessions_valid() -> None:
    t = snapshot(leader=1)
    st = ThrottleState(t)
    st.leader.record(100, 0.0)
    session = FakeSession({("t", 0), ("t", 1), ("u", 0)})
    for epoch in (0, 3):
        req = fetch_request({("t", 0): 0, ("t", 1): 0, ("u", 0): 0}, epoch=epoch)
        ticket = plan_request(req, CONSUMER, t, st, NO_IDS, 0.0)
        assert len(req.partitions) == 3 and not req.changed  # the request is not edited inside a session
        view = response({("t", 0): (10, 100), ("t", 1): (10, 100), ("u", 0): (10, 100)})
        assert enforce(view, ticket, t, st, NO_IDS, 0.0).left_out == 2
        assert session.full_ok(view) if epoch == 0 else session.incremental_ok(view)


def test_reconfigure_applies_new_bound_and_keeps_rate_history() -> None:
    t = snapshot(leader=1000)
    st = ThrottleState(t)
    st.leader.record(3000, 0.0)
    assert st.leader.exceeded(0.5)
    st.reconfigure(snapshot(leader=10_000))
    assert not st.leader.exceeded(0.5) and st.leader.total(0.5) == 3000


def test_truncated_trailing_batch_of_throttled_partition_is_dropped_and_not_counted() -> None:
    """The truncated tail is dropped and counted out by the throttle, which records the partition as walked; the
    size limit, after it on the way to the client, keeps that partition's bytes without walking it again and walks
    only the one nobody walked (u is not throttled)."""
    from proxy.policies.size_limit.policy import Budget
    from proxy.policies.size_limit.policy import enforce as enforce_budget
    from proxy.wire.records import Record, encode_batch, new_batch

    whole = encode_batch(new_batch([Record(offset_delta=0, value=b"v" * 100)], base_offset=0))
    tail = encode_batch(new_batch([Record(offset_delta=0, value=b"w" * 100)], base_offset=1))[:40]
    t = snapshot(leader=10_000)
    st = ThrottleState(t)
    ticket = plan_request(fetch_request({("t", 0): 0, ("u", 0): 0}), CONSUMER, t, st, NO_IDS, 0.0)
    view = FetchResponseView(12, topics=[
        FetchTopic("t", partitions=[FetchPartition(0, high_watermark=5, records=memoryview(whole + tail))]),
        FetchTopic("u", partitions=[FetchPartition(0, high_watermark=5, records=memoryview(whole + tail))])])
    out = enforce(view, ticket, t, st, NO_IDS, 0.0)
    assert out.trimmed_bytes == 40 and out.changed and out.sent_bytes == len(whole)
    assert sizes(view) == {("t", 0): len(whole), ("u", 0): len(whole) + 40}  # unthrottled: untouched
    t0, u0 = (p for _, p in view.partitions())
    assert view.whole == {id(t0)}
    limited = enforce_budget(view, Budget(fetch_max_bytes=1 << 20), None)
    assert limited.trimmed_bytes == 40  # u's tail: the size limit's own walk
    assert sizes(view) == {("t", 0): len(whole), ("u", 0): len(whole)}
    assert view.whole == {id(t0), id(u0)}


def test_below_the_bound_the_batches_that_fit_the_headroom_pass() -> None:
    """A large response below the bound: whole batches up to the quota's headroom pass, the rest is held back for
    later fetches, so the rate follows the bound instead of arriving in bursts."""
    from proxy.wire.records import walk_batches

    t = snapshot(leader=1000)
    st = ThrottleState(t)
    records = b"".join(batch(300, base_offset=i) for i in range(5))
    view = FetchResponseView(12, topics=[FetchTopic("t", partitions=[
        FetchPartition(0, high_watermark=50, records=memoryview(records))])])
    ticket = plan_request(fetch_request({("t", 0): 0}), CONSUMER, t, st, NO_IDS, 0.0)
    out = enforce(view, ticket, t, st, NO_IDS, 0.0)
    assert sizes(view) == {("t", 0): 900}  # headroom 1000 B (1000 B/s over one window): three whole batches
    assert [b.base_offset for b in walk_batches(view.topics[0].partitions[0].records or b"").batches] == [0, 1, 2]
    assert out.left_out == 1 and out.sent_bytes == 900 and out.mute_s == 0
    assert st.leader.total(0.0) == 900


def test_a_batch_larger_than_the_headroom_passes_while_the_bound_is_not_reached() -> None:
    """KIP-74's progress guarantee: below the bound, the first throttled batch passes whatever its size; the
    next fetch finds the bound exceeded and is held back."""
    t = snapshot(leader=1000)
    st = ThrottleState(t)
    ticket = plan_request(fetch_request({("t", 0): 0}), CONSUMER, t, st, NO_IDS, 0.0)
    view = response({("t", 0): (100, 2500)})
    assert enforce(view, ticket, t, st, NO_IDS, 0.0).sent_bytes == 2500 and sizes(view) == {("t", 0): 2500}
    ticket = plan_request(fetch_request({("t", 0): 1}), CONSUMER, t, st, NO_IDS, 0.1)
    view = response({("t", 0): (100, 300)}, base={("t", 0): 1})
    out = enforce(view, ticket, t, st, NO_IDS, 0.1)
    assert out.left_out == 1 and sizes(view) == {("t", 0): 0} and out.mute_s > 0
