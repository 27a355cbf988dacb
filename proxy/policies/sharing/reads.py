"""Reading a shared partition's :class:`~proxy.policies.sharing.frontier.Frontier` from Kafka: the group's own
committed offset (and in its metadata, the layouts to read), and the position of every slice of the current and
remembered layouts, each in its slice's group. Two rounds at most: the layouts named in the metadata are known only
once it is read. Sans-IO: each round is a :class:`.group_calls.GroupCall` the I/O layer carries out; a
:class:`FrontierRead` is the :class:`~proxy.core.exchange.Pending` a request (or a recovery) waits for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ...core.exchange import Signal
from ...wire.model import TopicPartition
from .frontier import Frontier, decode_metadata, slice_group
from .group_calls import Committed, GroupCall
from .keys import Slice


def _groups(group: str, tp: TopicPartition, layouts: set[int]) -> list[tuple[str, Slice]]:
    return [(slice_group(group, Slice(i, k)), Slice(i, k)) for k in sorted(layouts) if k > 1 for i in range(k)]


class FrontierRead(Signal):
    """The frontiers of ``slices``' partitions in ``group`` (after ``commits``, made first in the same call)."""

    def __init__(self, submit: Callable[[GroupCall], GroupCall], group: str, slices: Mapping[TopicPartition, Slice],
                 layouts: Mapping[TopicPartition, set[int]] | None = None,
                 commits: dict[str, dict[TopicPartition, tuple[int, str | None]]] | None = None) -> None:
        super().__init__()
        self.submit = submit
        self.group = group
        self.slices = dict(slices)
        #: the outcome: per partition, the frontier, the group's own commit, and each slice's commit as read
        self.frontiers: dict[TopicPartition, Frontier] = {}
        self.plain: dict[TopicPartition, Committed] = {}
        self.read: dict[TopicPartition, dict[Slice, Committed]] = {tp: {} for tp in self.slices}
        self.error: str | None = None
        self._layouts = {tp: {s.count} | set((layouts or {}).get(tp, ())) for tp, s in self.slices.items()}
        self._round(self._layouts, commits, first=True)

    def _round(self, layouts: Mapping[TopicPartition, set[int]],
               commits: dict[str, dict[TopicPartition, tuple[int, str | None]]] | None, first: bool) -> None:
        reads: dict[str, set[TopicPartition]] = {}
        if first:
            reads[self.group] = set(self.slices)
        for tp, ks in layouts.items():
            for name, _ in _groups(self.group, tp, ks):
                reads.setdefault(name, set()).add(tp)
        call = GroupCall(commits=commits or {}, reads=reads)
        self.submit(call)
        call.on_settled(lambda: self._settled(call, layouts, first))

    def _settled(self, call: GroupCall, layouts: Mapping[TopicPartition, set[int]], first: bool) -> None:
        if not call.ok:
            failed = {g: c for g, parts in call.committed.items() for c in parts.values() if c}
            self.error = call.error or f"commit refused: {failed}"
            self.settle()
            return
        more: dict[TopicPartition, set[int]] = {}
        for tp in self.slices:
            if first:
                self.plain[tp] = call.offsets.get(self.group, {}).get(tp, Committed())
                meta = decode_metadata(self.plain[tp].metadata)
                if meta is not None:
                    extra = set(meta[0]) - self._layouts[tp]
                    if extra:
                        more[tp] = extra
                        self._layouts[tp] |= extra
            for name, s in _groups(self.group, tp, layouts.get(tp, set())):
                committed = call.offsets.get(name, {}).get(tp)
                if committed is not None:
                    self.read[tp][s] = committed
        if more:
            self._round(more, None, first=False)
            return
        for tp in self.slices:
            positions = {s: c.offset for s, c in self.read[tp].items() if c.offset >= 0}
            self.frontiers[tp] = Frontier(self.plain[tp].offset, positions)
        self.settle()
