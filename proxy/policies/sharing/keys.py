"""Key hashes and key-hash slices: which member of a shared partition a record belongs to.

- The hash is the one Kafka's default partitioner puts records in partitions with (``BuiltInPartitioner
  .partitionForKey``: ``Utils.toPositive(Utils.murmur2(key))``, i.e. 32-bit MurmurHash2 with seed 0x9747b28c,
  as Apache Kafka's ``Utils.murmur2`` computes it, masked with 0x7fffffff). So a key's records that one
  partition holds stay together, and the hash space is [0, 2^31).
- A partition shared by ``count`` members is split into ``count`` even slices of that space (key ranges split by
  the number of shares, over Kafka's 31-bit positive hash): slice ``index`` is
  [ceil(index * 2^31 / count), ceil((index + 1) * 2^31 / count)), so a hash ``h`` is in slice
  ``(h * count) >> 31`` exactly (no rounding case is left over), and slices of every count tile the space.
- A record with a null key has no hash: it goes to slice 0 (documented; any fixed slice keeps such records
  once and in order, and the first is the one a single member also holds).
"""

from __future__ import annotations

from dataclasses import dataclass

#: size of the hash space: Kafka's toPositive keeps 31 bits
HASH_SPACE = 1 << 31
_MASK32 = 0xFFFFFFFF
_SEED = 0x9747B28C  # Utils.murmur2's seed
_M = 0x5BD1E995
_R = 24
#: the most slices a partition is split into (a member needs at least one hash of its own)
MAX_SLICES = 1 << 16


def murmur2(data: bytes) -> int:
    """32-bit MurmurHash2 of ``data`` as Kafka's ``Utils.murmur2`` computes it, as a signed int32 (Java's int).

    Austin Appleby's MurmurHash2 (4-byte little-endian words, multiply-xorshift mixing), with Kafka's choices:
    the seed 0x9747b28c, the length mixed into the initial value, the trailing 1-3 bytes folded in before the
    final avalanche (h ^= h >>> 13; h *= m; h ^= h >>> 15)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK32
    whole = length & ~3
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK32
        k ^= k >> _R
        k = (k * _M) & _MASK32
        h = ((h * _M) & _MASK32) ^ k
    left = length & 3
    if left:
        tail = int.from_bytes(data[whole:], "little")  # the 1-3 trailing bytes, first byte lowest
        h = ((h ^ tail) * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def key_hash(key: bytes | None) -> int | None:
    """The partitioner's positive hash of a record key (``murmur2(key) & 0x7fffffff``); None for a null key."""
    return None if key is None else positive_hash(key)


def positive_hash(key: bytes) -> int:
    """:func:`key_hash` of a key that is not null."""
    return murmur2(key) & 0x7FFFFFFF


@dataclass(frozen=True, slots=True, order=True)
class Slice:
    """Slice ``index`` of ``count`` even slices of the hash space. ``Slice(0, 1)`` is the whole partition."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if not 0 < self.count <= MAX_SLICES or not 0 <= self.index < self.count:
            raise ValueError(f"slice {self.index}/{self.count}: need 0 <= index < count <= {MAX_SLICES}")

    @property
    def whole(self) -> bool:
        return self.count == 1

    @property
    def lo(self) -> int:
        return bound(self.index, self.count)

    @property
    def hi(self) -> int:
        """Exclusive upper bound."""
        return bound(self.index + 1, self.count)

    def contains(self, other: Slice) -> bool:
        """Whether every hash of ``other`` is in this slice."""
        return self.lo <= other.lo and other.hi <= self.hi

    def overlaps(self, other: Slice) -> bool:
        """Whether some hash is in both slices."""
        return self.lo < other.hi and other.lo < self.hi

    def holds(self, h: int | None) -> bool:
        """Whether a record with key hash ``h`` (None: a null key) belongs to this slice."""
        if h is None:
            return self.index == 0
        return (h * self.count) >> 31 == self.index

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    @classmethod
    def parse(cls, text: str) -> Slice:
        """``"i/k"`` (slice i of k); ValueError otherwise."""
        index, sep, count = text.partition("/")
        if not sep or not index.strip().isdigit() or not count.strip().isdigit():
            raise ValueError(f'{text!r} is not a slice "index/count", e.g. "0/3"')
        return cls(int(index), int(count))


WHOLE = Slice(0, 1)


def bound(index: int, count: int) -> int:
    """The first hash of slice ``index`` of ``count``: ceil(index * 2^31 / count)."""
    return -((-index * HASH_SPACE) // count)


def slice_of(h: int | None, count: int) -> int:
    """The index of the slice of ``count`` that key hash ``h`` falls in (a null key: 0)."""
    return 0 if h is None else (h * count) >> 31
