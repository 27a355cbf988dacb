"""What is known consumed in a shared partition (proxy/policies/sharing/frontier.py): the stable offset, each
slice's start, the committed-work filter, and the commit metadata (round trip, size bound)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.policies.sharing.frontier import (
    PREFIX,
    Frontier,
    decode_metadata,
    encode_metadata,
    slice_group,
)
from proxy.policies.sharing.keys import HASH_SPACE, WHOLE, Slice
from proxy.policies.sharing.reads import DENSE_MAX, read_counts


def test_stable_offset_is_the_minimum_over_the_slices() -> None:
    f = Frontier(100, {Slice(0, 3): 150, Slice(1, 3): 130, Slice(2, 3): 170})
    assert f.stable() == 130 and f.furthest() == 170


def test_a_slice_without_a_position_holds_the_stable_offset_at_the_base() -> None:
    assert Frontier(100, {Slice(0, 2): 150}).stable() == 100
    assert Frontier(-1, {}).stable() == -1


def test_commits_behind_change_nothing() -> None:
    f = Frontier(100, {Slice(0, 2): 150, Slice(1, 2): 140})
    assert f.with_position(Slice(0, 2), 120).positions[Slice(0, 2)] == 150
    assert f.with_position(WHOLE, 90).base == 100 and f.with_position(WHOLE, 145).stable() == 145


def test_new_layout_starts_each_slice_at_the_lowest_frontier_of_its_keys() -> None:
    # two slices committed 150 (first half of the keys) and 130 (second half); three slices now
    f = Frontier(100, {Slice(0, 2): 150, Slice(1, 2): 130})
    assert f.start(Slice(0, 3)) == 150  # inside the first half
    assert f.start(Slice(1, 3)) == 130  # straddles both halves
    assert f.start(Slice(2, 3)) == 130
    # the straddling slice: records at 130..149 of first-half keys were committed by slice 0/2
    table = f.done_table(Slice(1, 3))
    assert table is not None
    first_half, second_half = HASH_SPACE // 2 - 1, HASH_SPACE // 2 + 1
    assert table.done(140, first_half) and not table.done(150, first_half)
    assert not table.done(140, second_half) and table.done(129, second_half)
    assert f.done_table(Slice(0, 3)) is None  # one frontier over its keys: its start says it all


def test_null_keys_belong_to_the_first_slice_for_the_filter_too() -> None:
    table = Frontier(0, {Slice(0, 2): 50, Slice(1, 2): 10}).done_table(WHOLE)
    assert table is not None and table.done(40, None) and not table.done(50, None)


@settings(max_examples=80, deadline=None)
@given(st.integers(-1, 1000), st.dictionaries(
    st.integers(2, 7).flatmap(lambda k: st.tuples(st.integers(0, k - 1), st.just(k))).map(lambda t: Slice(*t)),
    st.integers(0, 2000), max_size=8), st.integers(0, HASH_SPACE - 1))
def test_stable_and_start_are_lower_bounds_of_every_keys_frontier(base: int, positions: dict[Slice, int],
                                                                   h: int) -> None:
    f = Frontier(base, positions)
    # the frontier of a key: the base, and every known slice holding it
    expected = max([base, *(p for s, p in positions.items() if s.holds(h))])
    assert f.at(h) == expected
    assert f.stable() <= expected
    assert f.stable() == min(v for _, v in f.segments())
    for count in (1, 2, 3, 5):
        s = Slice((h * count) >> 31, count)
        assert f.start(s) <= expected
        table = f.done_table(s)
        if table is not None:  # the filter says "done" exactly below the key's frontier
            assert table.done(expected - 1, h) and not table.done(expected, h)


def test_layouts_worth_keeping() -> None:
    f = Frontier(100, {Slice(0, 2): 150, Slice(1, 2): 100, Slice(0, 3): 120, Slice(2, 3): 110})
    # stable = 100: layout 2 (150 above it) before layout 3 (120); the current layout first whatever it holds
    assert f.worth_keeping(1) == [2, 3]
    assert f.worth_keeping(5) == [5, 2, 3]
    assert Frontier(100, {Slice(0, 2): 100, Slice(1, 2): 100}).worth_keeping(1) == []


def test_metadata_round_trip() -> None:
    text = encode_metadata([3, 2], "client's own", 4096)
    assert text is not None and text.startswith(PREFIX)
    assert decode_metadata(text) == ([3, 2], "client's own")
    assert decode_metadata(encode_metadata([2], None, 4096)) == ([2], None)
    assert decode_metadata("anything a client wrote") is None and decode_metadata(None) is None
    assert decode_metadata(PREFIX + "!!not base64") is None


def test_metadata_stays_within_offset_metadata_max_bytes() -> None:
    layouts = list(range(2, 3000))
    for limit in (4096, 1024, 300):
        text = encode_metadata(layouts, "md", limit)
        assert text is not None and len(text) <= limit
        kept, client = decode_metadata(text)  # type: ignore[misc]
        assert kept == layouts[: len(kept)] and client == "md"  # the most useful first, the rest dropped
    # no room for any layout: the client's metadata as it was (positions forgotten = duplicates, never loss)
    assert encode_metadata([2, 3], "x" * 5000, 4096) == "x" * 5000
    assert encode_metadata([], None, 4096) is None


def test_slice_groups_are_named_after_the_group() -> None:
    assert slice_group("orders-app", Slice(1, 3)) == "orders-app.sluice-slice-1-of-3"


def test_every_layout_count_up_to_the_largest_known_is_read() -> None:
    """The group's commit metadata can lose a layout to a concurrent commit (reads.py): every count from 2 up to the
    largest known (or the group's members) is read, within DENSE_MAX; a count known above it is read too."""
    assert read_counts({2}) == {2}
    assert read_counts({4}) == {2, 3, 4}
    assert read_counts({2}, most=5) == {2, 3, 4, 5}  # a group of 5 whose layouts of 3 to 5 were all dropped
    assert read_counts({1}) == set()
    assert read_counts({3, 40}, most=100) == set(range(2, DENSE_MAX + 1)) | {40}
