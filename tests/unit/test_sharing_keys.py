"""Kafka's key hash and the even key-hash slices (proxy/policies/sharing/keys.py)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.partitioner.default import murmur2 as kafka_python_murmur2

from proxy.policies.sharing.keys import HASH_SPACE, WHOLE, Slice, bound, key_hash, murmur2, slice_of


@pytest.mark.parametrize(("key", "expected"), [
    (b"21", -973932308), (b"foobar", -790332482), (b"a-little-bit-long-string", -985981536),
    (b"abc", 479470107), (b"", 275646681)])
def test_murmur2_vectors(key: bytes, expected: int) -> None:
    # The vectors of Kafka's UtilsTest.testMurmur2 , plus the empty key.
    assert murmur2(key) == expected


def test_partition_of_a_key_matches_kafkas_default_partitioner() -> None:
    # Kafka's DefaultPartitioner (Utils.murmur2): "abc" on 12 partitions -> 3
    assert key_hash(b"abc") == 479470107
    assert key_hash(b"abc") % 12 == 3  # type: ignore[operator]
    assert key_hash(b"21") == -973932308 & 0x7FFFFFFF
    assert key_hash(None) is None


@given(st.binary(max_size=64))
def test_murmur2_equals_kafka_pythons_implementation(key: bytes) -> None:
    # kafka-python's DefaultPartitioner murmur2 (a port of the Java one), as an unsigned 32-bit value
    assert murmur2(key) & 0xFFFFFFFF == kafka_python_murmur2(key)


@pytest.mark.parametrize("count", [1, 2, 3, 5, 6, 7, 1000, 65536])
def test_slices_tile_the_hash_space(count: int) -> None:
    slices = [Slice(i, count) for i in range(count)]
    assert slices[0].lo == 0 and slices[-1].hi == HASH_SPACE
    assert all(a.hi == b.lo for a, b in itertools.pairwise(slices))
    assert all(s.hi - s.lo in (HASH_SPACE // count, HASH_SPACE // count + 1) for s in slices)  # even


@given(st.integers(0, HASH_SPACE - 1), st.integers(1, 70000))
def test_a_hash_is_in_exactly_the_slice_slice_of_names(h: int, count: int) -> None:
    i = slice_of(h, count)
    assert 0 <= i < count
    assert bound(i, count) <= h < bound(i + 1, count)


def test_null_keys_go_to_the_first_slice() -> None:
    assert Slice(0, 3).holds(None) and not Slice(1, 3).holds(None) and not Slice(2, 3).holds(None)
    assert WHOLE.holds(None) and WHOLE.holds(0) and WHOLE.holds(HASH_SPACE - 1)


def test_slice_parse_and_containment() -> None:
    assert Slice.parse("1/3") == Slice(1, 3) and str(Slice(1, 3)) == "1/3"
    with pytest.raises(ValueError):
        Slice.parse("3/3")
    with pytest.raises(ValueError):
        Slice.parse("a/b")
    assert WHOLE.contains(Slice(1, 2)) and Slice(0, 2).contains(Slice(0, 4)) and Slice(0, 2).contains(Slice(1, 4))
    assert not Slice(1, 2).contains(Slice(1, 3)) and not Slice(0, 2).contains(WHOLE)
