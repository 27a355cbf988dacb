"""KIP-74 budgets, sans-IO: what a response keeps, in which order, and what the request asks the broker for."""

from __future__ import annotations

import pytest

from proxy.core.memory import HeldBytes
from proxy.policies.size_limit.policy import (
    Budget,
    BudgetRule,
    Fairness,
    SizeLimits,
    clamp_request,
    enforce,
    reorder_request,
)
from proxy.wire.fetch_fast import FetchPartition, FetchResponseView, FetchTopic
from proxy.wire.fetch_request_fast import FetchEdit, decode_fetch_request
from proxy.wire.messages import encode_request, request_codec
from proxy.wire.model import Message
from proxy.wire.records import Record, encode_batch, new_batch, walk_batches


def batch(offset: int, value_size: int, records: int = 1) -> bytes:
    return encode_batch(new_batch([Record(offset_delta=i, value=b"v" * value_size) for i in range(records)],
                                  base_offset=offset))


def records(*sizes: int, offset: int = 0) -> bytes:
    out = b""
    for s in sizes:
        out += batch(offset, s)
        offset += 1
    return out


def response(*partitions: bytes, errors: dict[int, int] | None = None) -> FetchResponseView:
    parts = [FetchPartition(i, error_code=(errors or {}).get(i, 0), high_watermark=1000 + i,
                            last_stable_offset=900 + i, log_start_offset=7, records=memoryview(r))
             for i, r in enumerate(partitions)]
    return FetchResponseView(12, topics=[FetchTopic("t", partitions=parts)])


def kept(view: FetchResponseView) -> list[int]:
    return [len(p.records or b"") for _, p in view.partitions()]


def test_first_batch_larger_than_budget_is_kept_whole() -> None:
    big = records(5000)
    view = response(big, records(100))
    out = enforce(view, Budget(fetch_max_bytes=1000), None)
    assert kept(view) == [len(big), 0]
    assert out.deferred_partitions == 1 and out.trimmed_bytes == len(records(100))


def test_budget_exhausted_mid_list_cuts_at_batch_boundaries() -> None:
    p0, p1, p2 = records(300, 300, 300), records(300, 300), records(300)
    one = len(batch(0, 300))
    view = response(p0, p1, p2)
    enforce(view, Budget(fetch_max_bytes=4 * one + 10), None)
    assert kept(view) == [3 * one, one, 0]
    for _, p in view.partitions():
        assert walk_batches(p.records or b"").truncated == 0  # never a partial batch of our own making


def test_partition_cap_applies_to_every_partition_but_the_first_batch_rule_only_once() -> None:
    one = len(batch(0, 300))
    view = response(records(300, 300), records(300, 300), records(2000))
    enforce(view, Budget(fetch_max_bytes=0, partition_max_bytes=one + 5), None)
    assert kept(view) == [one, one, 0]


def test_partitions_and_metadata_are_preserved() -> None:
    view = response(records(100), b"", records(100), errors={1: 6})
    enforce(view, Budget(fetch_max_bytes=10), None)
    parts = [p for _, p in view.partitions()]
    assert [p.partition_index for p in parts] == [0, 1, 2]
    assert [p.error_code for p in parts] == [0, 6, 0]  # errors pass through
    assert [(p.high_watermark, p.last_stable_offset, p.log_start_offset) for p in parts] == [
        (1000, 900, 7), (1001, 901, 7), (1002, 902, 7)]


def test_truncated_trailing_batch_from_broker() -> None:
    full = records(100, 100)
    truncated = full + batch(2, 100)[:30]
    for budget in (1 << 20, len(full) + 10):
        view = response(truncated)
        out = enforce(view, Budget(fetch_max_bytes=budget), None)
        assert kept(view) == [len(full)] and out.trimmed_bytes == 30  # the broker's partial batch is dropped
    view = response(batch(0, 100)[:30], records(100))  # nothing but a partial batch: deferred, not an error
    enforce(view, Budget(fetch_max_bytes=1 << 20), None)
    assert kept(view) == [0, len(records(100))]


def test_records_known_whole_are_not_walked_again_unless_the_budget_cuts_them() -> None:
    """A partition an earlier policy walked (``whole``: the throttle, before the size limit on the way to the
    client) is kept as it is when it fits; one that does not fit is still cut at a batch boundary. Every partition
    the budget walked is marked whole for whoever reads it next."""
    full = records(100, 100)
    truncated = full + batch(2, 100)[:30]
    view = response(truncated, truncated)
    view.whole.add(id(view.topics[0].partitions[0]))  # trusted: a tail here would be the earlier walker's to drop
    out = enforce(view, Budget(fetch_max_bytes=1 << 20), None)
    assert kept(view) == [len(truncated), len(full)] and out.trimmed_bytes == 30
    assert view.whole == {id(p) for _, p in view.partitions()}
    assert view == response(truncated, full)  # what Sluice knows is not on the wire: equal
    view = response(full)
    view.whole.add(id(view.topics[0].partitions[0]))
    out = enforce(view, Budget(fetch_max_bytes=len(full) - 1), None)
    assert kept(view) == [len(batch(0, 100))] and out.trimmed_bytes == len(full) - len(batch(0, 100))


def test_empty_responses_and_unlimited_budget_change_nothing() -> None:
    view = response(b"", b"")
    out = enforce(view, Budget(fetch_max_bytes=10), None)
    assert kept(view) == [0, 0] and not out.limited
    view = response(records(100, 100))
    assert not enforce(view, Budget(), None).limited


def test_fairness_rotates_served_partitions_to_the_back() -> None:
    fair = Fairness()
    one = len(batch(0, 500))
    served = []
    for _ in range(4):
        view = response(*(records(500, 500, 500) for _ in range(4)))
        enforce(view, Budget(fetch_max_bytes=one * 3), fair)
        served.append([i for i, n in enumerate(kept(view)) if n])
    assert served == [[0], [1], [2], [3]]  # a client that never rotates still reaches every partition


def fetch_frame(version: int = 12, epoch: int = -1, **fields: object) -> bytes:
    """A Fetch request frame (construct codec) with three partitions of topic "a" asking for 1 MiB each."""
    body = request_codec(1, version).default().replace(max_bytes=50 << 20, session_epoch=epoch, **fields)
    body.topics = [Message(topic="a", partitions=[
        Message(partition=i, current_leader_epoch=0, fetch_offset=0, last_fetched_epoch=-1, log_start_offset=-1,
                partition_max_bytes=1 << 20) for i in range(3)])]
    header = Message(request_api_key=1, request_api_version=version, correlation_id=1, client_id="c")
    return encode_request(header, body)


def test_request_clamped_and_reordered() -> None:
    req = FetchEdit(decode_fetch_request(fetch_frame()))
    assert clamp_request(req, Budget(fetch_max_bytes=100_000, partition_max_bytes=10_000)) and req.changed
    assert req.max_bytes == 100_000 and {p.partition_max_bytes for p in req.partitions.values()} == {10_000}
    assert decode_fetch_request(req.encode()).max_bytes == 100_000  # MaxBytes is written back
    assert not clamp_request(req, Budget(fetch_max_bytes=100_000, partition_max_bytes=10_000))  # already within
    fair = Fairness()
    fair.rank([("a", 0), ("a", 1), ("a", 2)])
    fair.served([("a", 0)])
    assert reorder_request(req, fair)
    assert list(req.partitions) == [("a", 1), ("a", 2), ("a", 0)]
    assert list(decode_fetch_request(req.encode()).partitions()) == [("a", 1), ("a", 2), ("a", 0)]
    incremental = FetchEdit(decode_fetch_request(fetch_frame(epoch=5)))  # the broker's session order rules
    assert not reorder_request(incremental, fair) and not incremental.changed


def test_clamp_without_a_partition_cap_uses_the_budget_and_keeps_smaller_values() -> None:
    req = FetchEdit(decode_fetch_request(fetch_frame()))
    req.partitions[("a", 1)] = req.partitions[("a", 1)]._replace(partition_max_bytes=500)
    assert clamp_request(req, Budget(fetch_max_bytes=2000))
    assert [p.partition_max_bytes for p in req.partitions.values()] == [2000, 500, 2000]
    unchanged = FetchEdit(decode_fetch_request(fetch_frame()))
    assert not clamp_request(unchanged, Budget(fetch_max_bytes=100 << 20)) and not unchanged.changed


def test_rules_first_match_and_replicas() -> None:
    limits = SizeLimits(rules=(
        BudgetRule(Budget(1000), client_id="batch-*"),
        BudgetRule(Budget(10 << 20), replicas=True),
        BudgetRule(Budget(5000), client_id="*"),
    ))
    assert limits.budget_for("batch-7", False) == Budget(1000)
    assert limits.budget_for("web", False) == Budget(5000)
    assert limits.budget_for("batch-7", True) == Budget(10 << 20)
    follower = request_codec(1, 15).default().replica_state.replace(replica_id=2)
    assert decode_fetch_request(fetch_frame(15, replica_state=follower)).replica_id == 2  # KIP-903: tagged
    assert decode_fetch_request(fetch_frame(15, replica_state=follower)).from_follower
    assert decode_fetch_request(fetch_frame(12, replica_id=3)).from_follower
    assert decode_fetch_request(fetch_frame(12, replica_id=0)).from_follower  # broker 0 is a follower too
    assert not decode_fetch_request(fetch_frame(12)).from_follower  # a consumer: -1
    assert not decode_fetch_request(fetch_frame(12, replica_id=-2)).from_follower  # an observer (KIP-392's -2)


def test_held_bytes_waits_in_order_and_always_progresses() -> None:
    granted: list[str] = []
    held = HeldBytes(1000)
    assert held.reserve(600, lambda: granted.append("a"))
    assert not held.reserve(600, lambda: granted.append("b"))
    assert not held.reserve(100, lambda: granted.append("c"))  # fits, but waits behind b: arrival order
    held.release(600)
    assert granted == ["b", "c"] and held.held == 700
    held.release(700)
    assert held.reserve(5000, lambda: None)  # larger than the bound: granted when nothing else is held


@pytest.mark.parametrize("budget", [Budget(1), Budget(0, 1)])
def test_budget_smaller_than_a_record_still_progresses(budget: Budget) -> None:
    view = response(records(100, 100), records(100))
    enforce(view, budget, None)
    assert kept(view)[0] == len(batch(0, 100)) and kept(view)[1:] == [0]
