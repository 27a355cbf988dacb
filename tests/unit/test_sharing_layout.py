"""The slices of a KIP-848 group from its description (proxy/policies/sharing/layout.py): pure, every Sluice the
same."""

from __future__ import annotations

from proxy.policies.sharing.keys import WHOLE, Slice
from proxy.policies.sharing.layout import DescribedMember, Layout, compute, mark_client_id, read_mark

T = "orders"


def member(mid: str, current: list[int], target: list[int] | None = None, *, marked: bool = True,
           topics: tuple[str, ...] = (T,)) -> DescribedMember:
    return DescribedMember(mid, frozenset(topics) if marked else None, frozenset(topics),
                           {T: frozenset(current)} if current else {},
                           {T: frozenset(current if target is None else target)} if (current or target) else {})


def test_the_mark_round_trips_in_a_client_id() -> None:
    cid = mark_client_id("consumer-g-1", {"b", "a"}, {("b", 2): Slice(1, 3), ("a", 0): Slice(0, 1)})
    assert cid == "consumer-g-1#sluice-share=a,b|0:0:0/1,1:2:1/3"
    assert read_mark(cid) == ({"a", "b"}, {("a", 0): Slice(0, 1), ("b", 2): Slice(1, 3)})
    assert read_mark("consumer-g-1") is None and read_mark(None) is None
    # a client's own client id may hold anything after the mark: what cannot be read is no claim
    assert read_mark("x#sluice-share=a|0:0:9/2,7:1:0/1,junk") == ({"a"}, {})


def test_a_slice_claimed_by_another_member_waits() -> None:
    lay = Layout(claims={"m1": {(T, 0): Slice(0, 2)}, "m2": {(T, 1): Slice(0, 1)}})
    assert not lay.claimed_by_others("m3", (T, 0), Slice(1, 2))
    assert lay.claimed_by_others("m3", (T, 0), Slice(0, 1)) and lay.claimed_by_others("m3", (T, 0), Slice(0, 4))
    assert lay.claimed_by_others("m3", (T, 1), Slice(2, 3)) and not lay.claimed_by_others("m2", (T, 1), WHOLE)


def test_six_members_of_three_partitions_two_slices_each_whatever_the_order() -> None:
    ms = [member("m1", [0]), member("m2", [1]), member("m3", [2]), member("m4", []), member("m5", []),
          member("m6", [])]
    lay = compute(ms, lambda t: True)
    assert lay.shared == {T: {0: 2, 1: 2, 2: 2}}
    assert lay.of("m1") == {(T, 0): Slice(0, 2)} and lay.of("m4") == {(T, 0): Slice(1, 2)}
    assert lay.of("m5") == {(T, 1): Slice(1, 2)} and lay.of("m6") == {(T, 2): Slice(1, 2)}
    assert compute(reversed(ms), lambda t: True).slices == lay.slices


def test_five_members_of_three_partitions() -> None:
    lay = compute([member("a", [0]), member("b", [1]), member("c", [2]), member("d", []), member("e", [])],
                  lambda t: True)
    assert lay.shared == {T: {0: 2, 1: 2, 2: 1}}
    assert lay.of("c") == {(T, 2): Slice(0, 1)}


def test_not_outnumbered_or_not_shareable_or_not_marked_is_the_brokers() -> None:
    three = [member("a", [0]), member("b", [1]), member("c", [2])]
    assert compute(three, lambda t: True).slices == {}
    four = [*three, member("d", [])]
    assert compute(four, lambda t: False).slices == {}
    # a member no Sluice marked is neither a sharer nor counted; its partition stays whole with it
    lay = compute([member("a", [0]), member("b", [1], marked=False), member("c", []), member("d", [])],
                  lambda t: True)
    assert lay.shared == {T: {0: 3}}
    assert lay.of("b") == {} and lay.of("d") == {(T, 0): Slice(2, 3)}


def test_a_partition_being_moved_is_laid_out_for_nobody() -> None:
    # p1 revoked from b (in nobody's current assignment), to be c's (its target): neither shares it yet, and c,
    # about to hold a partition, is not an idle sharer either
    lay = compute([member("a", [0], [0]), member("b", [], []), member("c", [], [1]), member("d", [2], [2]),
                   member("e", [], [])], lambda t: True)
    assert all((T, 1) not in lay.of(m) for m in "abcde")
    assert lay.of("c") == {}
    assert lay.of("b") == {(T, 0): Slice(1, 2)} and lay.of("e") == {(T, 2): Slice(1, 2)}
