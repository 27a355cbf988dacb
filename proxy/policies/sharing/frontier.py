"""What is already consumed in a shared partition, from what Kafka stores: the stable offset, each slice's start,
the committed-work filter, and the commit metadata that lets any Sluice find it all again.

Individual commits per slice (an offset commit model beyond one offset per partition), on today's
brokers: one writer per slice. A member's commit for a shared partition is its slice's position, stored as the
partition's committed offset in a group of the slice's own (:func:`slice_group`, a "simple" commit: generation
-1, no member id); only the member holding the slice writes it. What is known done in the partition is then
(:class:`Frontier`):

- every record below ``base``, the group's own committed offset (the stable offset Sluice wrote, or an offset a
  consumer without Sluice committed for the whole partition);
- for each slice with a position ``p``: every record of the slice's keys below ``p``, whatever the generation
  that wrote it (slices are named by index and count, so a slice that comes back in a later layout reads its own
  earlier position).

So ``frontier(h)`` = max(base, the position of every known slice holding hash ``h``), and

- the **stable offset** = min over all hashes of ``frontier(h)``: every record below it is done. It is what the
  group's plain commit holds, so lag tools and a member without Sluice see a safe position. Positions read late
  are lower than the truth, never higher, so a stale read only lowers it: never ahead of the true minimum.
- a new slice **starts** at min over its hashes of ``frontier(h)`` (a new range starts at the stable offset,
  refined to the slice), and the records of its keys at or above that start but below ``frontier(h)``
  were committed by an earlier slice: they are filtered out (:meth:`Frontier.done_table`) - the slices' own
  offsets are the reference when the client polls. No gap, no duplicate for committed work.

Which slices to read is the list of *layouts* (slice counts) in the plain commit's metadata (and every count up to
the largest known, :func:`.reads.read_counts`, as concurrent commits can drop one)
(proto/codecs/SharingCommitMetadata.json), trimmed to those with a position above the stable offset and to
``offset.metadata.max.bytes``: dropping a layout only forgets positions, which can deliver committed records again
(duplicates), never skip one.
"""

from __future__ import annotations

import base64
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache

from ...kafka_acls import SLICE_GROUP_INFIX
from ...wire.compiler import Codec, compiled_for
from ...wire.errors import CodecError
from ...wire.model import Message
from ...wire.schema import sluice_spec
from .keys import HASH_SPACE, Slice, bound, slice_of

#: the commit metadata Sluice writes starts with this (anything else is a client's own metadata)
PREFIX = "SLUICE1:"
_VERSION = 0


def slice_group(group: str, s: Slice) -> str:
    """The group that holds slice ``s``'s positions for ``group``: the group id first, so ACLs on a prefix of the
    group id cover it."""
    return f"{group}{SLICE_GROUP_INFIX}{s.index}-of-{s.count}"


@dataclass(slots=True)
class DoneTable:
    """Within one slice: a record at ``offset`` with key hash ``h`` was committed by an earlier slice when
    ``offset < positions[bisect_right(bounds, h) - 1]``."""

    bounds: list[int]
    positions: list[int]
    #: no record at or above this offset is done
    ceiling: int

    def done(self, offset: int, h: int | None) -> bool:
        if offset >= self.ceiling:
            return False
        i = bisect_right(self.bounds, 0 if h is None else h) - 1
        return offset < self.positions[i]


@dataclass(slots=True)
class Frontier:
    """What is known consumed in one partition (see the module docstring)."""

    base: int = -1
    #: committed positions of slices (their own groups), only those with one
    positions: dict[Slice, int] = field(default_factory=dict)

    @property
    def layouts(self) -> set[int]:
        return {s.count for s in self.positions}

    def at(self, h: int) -> int:
        best = self.base
        for s, p in self.positions.items():
            if p > best and slice_of(h, s.count) == s.index:
                best = p
        return best

    def segments(self, lo: int = 0, hi: int = HASH_SPACE) -> list[tuple[int, int]]:
        """(first hash, frontier) of each run of hashes in [lo, hi) with one frontier, in order."""
        cuts = {lo}
        for count in self.layouts:
            first = -((-lo * count) >> 31)  # the first slice starting at or after lo
            for i in range(max(first, 0), count + 1):
                b = bound(i, count)
                if b >= hi:
                    break
                if b > lo:
                    cuts.add(b)
        out: list[tuple[int, int]] = []
        for c in sorted(cuts):
            value = self.at(c)
            if not out or out[-1][1] != value:
                out.append((c, value))
        return out

    def stable(self) -> int:
        """The stable offset: every record below it is done (-1: nothing known)."""
        return min(v for _, v in self.segments())

    def start(self, s: Slice) -> int:
        """Where slice ``s`` starts: the lowest frontier over its hashes."""
        return min(v for _, v in self.segments(s.lo, s.hi))

    def furthest(self) -> int:
        return max([self.base, *self.positions.values()])

    def done_table(self, s: Slice) -> DoneTable | None:
        """The committed-work filter for a member holding ``s``, None when nothing above its start is done."""
        segs = self.segments(s.lo, s.hi)
        if len(segs) == 1:
            return None
        return DoneTable([lo for lo, _ in segs], [v for _, v in segs], max(v for _, v in segs))

    def with_position(self, s: Slice, position: int) -> Frontier:
        """A copy knowing that slice ``s`` is at ``position`` (never lowering what is known of it)."""
        positions = dict(self.positions)
        if s.whole:
            return Frontier(max(self.base, position), positions)
        if position > positions.get(s, -1):
            positions[s] = position
        return Frontier(self.base, positions)

    def worth_keeping(self, current: int) -> list[int]:
        """Layouts whose positions say more than the stable offset, most useful first (the highest position
        above it), the ``current`` layout always first when it splits the partition."""
        stable = self.stable()
        best: dict[int, int] = {}
        for s, p in self.positions.items():
            if p > stable:
                best[s.count] = max(best.get(s.count, -1), p)
        order = sorted(best, key=lambda k: (-best[k], k))
        if current > 1:
            order = [current, *(k for k in order if k != current)]
        return order


# ------------------------------------------------------------------------------------------- metadata


@cache
def _codec() -> Codec:
    return compiled_for(sluice_spec("SharingCommitMetadata"), _VERSION)


def encode_metadata(layouts: Iterable[int], client: str | None, max_bytes: int) -> str | None:
    """The plain commit's metadata: ``layouts`` (most useful first) and the client's own metadata, within
    ``max_bytes`` (offset.metadata.max.bytes): layouts are dropped from the end until it fits; with none left the
    client's metadata is returned as it was (None: none)."""
    kept = list(layouts)
    # Each layout is an int32 in the struct: start from the most that can fit (base64 makes 3 bytes 4 characters)
    overhead = 2 + 4 + 2 + len((client or "").encode("utf-8"))  # version, array count, string length, string
    fit = ((max_bytes - len(PREFIX)) * 3 // 4 - overhead) // 4
    del kept[max(fit, 0) :]
    while kept:
        raw = _VERSION.to_bytes(2, "big") + _codec().encode(Message(layouts=kept, client_metadata=client))
        text = PREFIX + base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")
        if len(text) <= max_bytes:
            return text
        kept.pop()
    return client


def decode_metadata(text: str | None) -> tuple[list[int], str | None] | None:
    """(layouts, the client's metadata) from a plain commit's metadata; None when it is not Sluice's."""
    if not text or not text.startswith(PREFIX):
        return None
    body = text[len(PREFIX) :]
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        if int.from_bytes(raw[:2], "big") != _VERSION:
            return None
        msg = _codec().decode(raw[2:])
    except (ValueError, CodecError):
        return None
    layouts = [k for k in msg.layouts if 1 < k <= 1 << 16]
    return layouts, msg.client_metadata
