"""The key-range assignor of the cooperative-consumption draft KIP (proxy/policies/sharing/assignor.py)."""

from __future__ import annotations

from collections import Counter

import pytest

from proxy.policies.sharing.assignor import MemberInfo, ordered, rewrite, split
from proxy.policies.sharing.keys import Slice


def by_partition(out: dict[str, tuple[int, Slice]]) -> dict[int, list[str]]:
    parts: dict[int, list[tuple[int, str]]] = {}
    for member, (p, s) in out.items():
        parts.setdefault(p, []).append((s.index, member))
    return {p: [m for _, m in sorted(ms)] for p, ms in sorted(parts.items())}


def test_seed_round_robin_example() -> None:
    # The draft KIP's example: 5 consumers, 1 topic of 3 partitions -> tp1: M1, M4; tp2: M2, M5; tp3: M3
    out = split("roundrobin", [0, 1, 2], ["M1", "M2", "M3", "M4", "M5"])
    assert by_partition(out) == {0: ["M1", "M4"], 1: ["M2", "M5"], 2: ["M3"]}
    assert out["M1"] == (0, Slice(0, 2)) and out["M4"] == (0, Slice(1, 2)) and out["M3"] == (2, Slice(0, 1))


def test_seed_range_reverse_assign_example() -> None:
    # The draft KIP's example: 5 consumers over topics of 2 and 3 partitions, "reverse-assign" (contiguous):
    # t1p0: c1, c2, c3; t1p1: c4, c5 / t2p0: c1, c2; t2p1: c3, c4; t2p2: c5
    members = ["c1", "c2", "c3", "c4", "c5"]
    assert by_partition(split("range", [0, 1], members)) == {0: ["c1", "c2", "c3"], 1: ["c4", "c5"]}
    assert by_partition(split("range", [0, 1, 2], members)) == {0: ["c1", "c2"], 1: ["c3", "c4"], 2: ["c5"]}


@pytest.mark.parametrize("protocol", ["range", "roundrobin", "cooperative-sticky"])
@pytest.mark.parametrize(("members", "partitions"), [(4, 3), (7, 3), (6, 3), (10, 4), (65, 2)])
def test_uneven_cases_give_every_member_one_slice_and_tile_each_partition(protocol: str, members: int,
                                                                       partitions: int) -> None:
    names = [f"m{i:02d}" for i in range(members)]
    out = split(protocol, list(range(partitions)), names)
    assert set(out) == set(names)
    counts = Counter(p for p, _ in out.values())
    assert max(counts.values()) - min(counts.values()) <= 1  # members spread evenly over partitions
    for p, n in counts.items():
        slices = sorted(s for q, s in out.values() if q == p)
        assert slices == [Slice(i, n) for i in range(n)]  # the partition's slices tile its hash space


def test_no_split_when_members_do_not_outnumber_partitions() -> None:
    with pytest.raises(ValueError):
        split("range", [0, 1, 2], ["a", "b", "c"])
    plan = rewrite("range", {"a": {"t": [0]}, "b": {"t": [1]}, "c": {"t": [2]}}, {"t": ["a", "b", "c"]})
    assert plan.shared == {} and plan.partitions == {"a": {"t": [0]}, "b": {"t": [1]}, "c": {"t": [2]}}


def test_rewrite_shares_only_eligible_members_and_keeps_other_topics() -> None:
    # the client's assignment: x (not marked) holds t-0 and u-0; four marked members share t's 3 partitions
    assignment = {"x": {"t": [0], "u": [0]}, "a": {"t": [1]}, "b": {"t": [2], "u": [1]}, "c": {}, "d": {}}
    plan = rewrite("roundrobin", assignment, {"t": ["a", "b", "c", "d"]})
    assert plan.partitions["x"] == {"u": [0]}  # a member without Sluice gets no shared slice of t
    assert plan.partitions["b"]["u"] == [1]  # other topics keep the client's assignment
    assert {m: plan.slices[m] for m in "abcd"} == {
        "a": {("t", 0): Slice(0, 2)}, "b": {("t", 1): Slice(0, 1)}, "c": {("t", 2): Slice(0, 1)},
        "d": {("t", 0): Slice(1, 2)}}
    assert plan.shared == {"t": {0: 2, 1: 1, 2: 1}}


def test_members_ordered_as_kafkas_assignors_order_them() -> None:
    # AbstractPartitionAssignor.MemberInfo: group instance ids first (static members), then member ids
    members = [MemberInfo("m-b"), MemberInfo("m-a"), MemberInfo("m-z", "inst-2"), MemberInfo("m-y", "inst-1")]
    assert ordered(members) == ["m-y", "m-z", "m-a", "m-b"]
