"""Reading a shared partition's :class:`~proxy.policies.sharing.frontier.Frontier` from Kafka: the group's own
committed offset (and in its metadata, the layouts to read), and the position of every slice of the current and
remembered layouts, each in its slice's group. Two rounds at most: the layouts named in the metadata are known only
once it is read.

Every layout count up to the largest known is read, not only those the metadata names (:func:`read_counts`): the
group's commit is one value that every member of a partition writes, each with the layouts it read just before, so
two members committing at once can each drop the other's layout (the one landing last wins). A position dropped
that way says records of its keys were committed; a new slice started without it delivers them again.

Sans-IO: each round is a :class:`.group_calls.GroupCall` the I/O layer carries out; a :class:`FrontierRead` is the
:class:`~proxy.core.exchange.Pending` a request (or a recovery) waits for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from ...core.exchange import Signal
from ...wire.model import TopicPartition
from .frontier import Frontier, decode_metadata, slice_group
from .group_calls import Committed, GroupCall
from .keys import Slice

if TYPE_CHECKING:
    from .state import SharingState

#: the most layout counts read densely (every count from 2 up); above it, only the counts named
DENSE_MAX = 16


def read_counts(known: set[int], most: int = 0) -> set[int]:
    """The layout counts whose slice groups are read, given the counts ``known`` (the member's own, what it read
    before, what the metadata names) and ``most``, the largest count the group can have had (its members, when
    known): every count from 2 up to the largest of those, so a layout the metadata lost to a concurrent group
    commit (the module docstring) is read all the same, and ``known`` itself."""
    top = min(max([most, *known], default=0), DENSE_MAX)
    return {k for k in known if k > 1} | set(range(2, top + 1))


def _groups(group: str, tp: TopicPartition, layouts: set[int]) -> list[tuple[str, Slice]]:
    return [(slice_group(group, Slice(i, k)), Slice(i, k)) for k in sorted(layouts) if k > 1 for i in range(k)]


class FrontierRead(Signal):
    """The frontiers of ``slices``' partitions in ``group``, read through ``p``'s group calls; every layout count up
    to the largest the group can have had is read (:func:`read_counts`: a KIP-848 group's member count, from its
    latest description; none known for a classic group)."""

    def __init__(self, p: SharingState, group: str, slices: Mapping[TopicPartition, Slice],
                 layouts: Mapping[TopicPartition, set[int]] | None = None) -> None:
        super().__init__()
        self.submit = p.submit
        self.group = group
        self.slices = dict(slices)
        #: the outcome: per partition, the frontier, the group's own commit, and each slice's commit as read
        self.frontiers: dict[TopicPartition, Frontier] = {}
        self.plain: dict[TopicPartition, Committed] = {}
        self.read: dict[TopicPartition, dict[Slice, Committed]] = {tp: {} for tp in self.slices}
        self.error: str | None = None
        known = p.layouts.get(group)
        self._most = known.members if known is not None else 0
        self._layouts = {tp: read_counts({s.count} | set((layouts or {}).get(tp, ())), self._most)
                         for tp, s in self.slices.items()}
        self._round(self._layouts, first=True)

    def _round(self, layouts: Mapping[TopicPartition, set[int]], first: bool) -> None:
        reads: dict[str, set[TopicPartition]] = {}
        if first:
            reads[self.group] = set(self.slices)
        for tp, ks in layouts.items():
            for name, _ in _groups(self.group, tp, ks):
                reads.setdefault(name, set()).add(tp)
        call = GroupCall(reads=reads)
        self.submit(call)
        call.on_settled(lambda: self._settled(call, layouts, first))

    def _settled(self, call: GroupCall, layouts: Mapping[TopicPartition, set[int]], first: bool) -> None:
        if not call.ok:
            self.error = call.error or "read failed"
            self.settle()
            return
        more: dict[TopicPartition, set[int]] = {}
        for tp in self.slices:
            if first:
                self.plain[tp] = call.offsets.get(self.group, {}).get(tp, Committed())
                meta = decode_metadata(self.plain[tp].metadata)
                if meta is not None:
                    extra = read_counts(self._layouts[tp] | set(meta[0]), self._most) - self._layouts[tp]
                    if extra:
                        more[tp] = extra
                        self._layouts[tp] |= extra
            for name, s in _groups(self.group, tp, layouts.get(tp, set())):
                committed = call.offsets.get(name, {}).get(tp)
                if committed is not None:
                    self.read[tp][s] = committed
        if more:
            self._round(more, first=False)
            return
        for tp in self.slices:
            positions = {s: c.offset for s, c in self.read[tp].items() if c.offset >= 0}
            self.frontiers[tp] = Frontier(self.plain[tp].offset, positions)
        self.settle()
