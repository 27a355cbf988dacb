"""The key-range assignor, applied over whatever assignment the group leader's client computed.

For each shared topic whose opted-in members outnumber its partitions (with m consumers > n partitions
the assignment goes by partitions instead of by consumers),
every partition of the topic is given to one or more of those members, each holding an even key-hash slice of it
(:class:`~proxy.policies.sharing.keys.Slice`); members that did not opt in get none of the topic's partitions
(they would read everything). Other topics keep the client's assignment. The shape follows the assignor the group
chose (the client's assignor, reversed onto slices):

- ``range`` (Kafka's RangeAssignor: contiguous ranges): members in contiguous runs per partition, the first
  ``m % n`` partitions one member more. 5 members over 2 partitions: p0 c1 c2 c3, p1 c4 c5.
- any other (roundrobin, cooperative-sticky, sticky, custom ones): round robin over the partitions, a key-range
  round-robin assignor: member j goes to partition j % n. 5 members, 3 partitions: p0 M1 M4, p1 M2 M5,
  p2 M3.

Members are ordered as Kafka's assignors order them (AbstractPartitionAssignor.MemberInfo: by group instance id
when they have one, those first, else by member id), so every Sluice computes the same slices from the same
group. Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .keys import Slice

RANGE = "range"


@dataclass(frozen=True, slots=True)
class MemberInfo:
    member_id: str
    instance_id: str | None = None

    def sort_key(self) -> tuple[int, str]:
        return (0, self.instance_id) if self.instance_id else (1, self.member_id)


def ordered(members: Iterable[MemberInfo]) -> list[str]:
    """Member ids in Kafka's assignor order."""
    return [m.member_id for m in sorted(members, key=MemberInfo.sort_key)]


def split(protocol: str, partitions: Sequence[int], members: Sequence[str]) -> dict[str, tuple[int, Slice]]:
    """Each member's (partition, slice) when ``members`` (in order) share ``partitions`` (more members than
    partitions; each member gets exactly one slice)."""
    parts = sorted(partitions)
    n, m = len(parts), len(members)
    if not n or m <= n:
        raise ValueError(f"{m} members do not outnumber {n} partitions")
    out: dict[str, tuple[int, Slice]] = {}
    if protocol == RANGE:
        per, extra = divmod(m, n)
        j = 0
        for i, p in enumerate(parts):
            size = per + (1 if i < extra else 0)
            for k in range(size):
                out[members[j + k]] = (p, Slice(k, size))
            j += size
    else:
        for j, member in enumerate(members):
            p = parts[j % n]
            count = (m - 1 - j % n) // n + 1  # how many of the m members land on partition j % n
            out[member] = (p, Slice(j // n, count))
    return out


@dataclass(slots=True)
class Rewrite:
    """What :func:`rewrite` decided: every member's partitions, the slices of the members that share, and, per
    shared topic, how many members share each partition."""

    partitions: dict[str, dict[str, list[int]]]
    slices: dict[str, dict[tuple[str, int], Slice]]
    shared: dict[str, dict[int, int]]


def rewrite(protocol: str, assignment: Mapping[str, Mapping[str, Sequence[int]]],
            eligible: Mapping[str, Sequence[str]]) -> Rewrite:
    """The leader client's ``assignment`` (member -> topic -> partitions) with the topics whose ``eligible``
    members (topic -> opted-in members subscribed to it, in assignor order) outnumber their partitions shared by
    slices. A topic's partitions are those the client assigned to anyone (a standard assignor assigns them all)."""
    out = {member: {t: list(ps) for t, ps in topics.items()} for member, topics in assignment.items()}
    slices: dict[str, dict[tuple[str, int], Slice]] = {}
    shared: dict[str, dict[int, int]] = {}
    for topic, members in sorted(eligible.items()):
        parts = sorted({p for topics in assignment.values() for p in topics.get(topic, ())})
        members = [m for m in members if m in out]
        if not parts or len(members) <= len(parts):
            continue
        for topics in out.values():
            topics.pop(topic, None)
        counts: dict[int, int] = {}
        for member, (p, s) in split(protocol, parts, members).items():
            out[member].setdefault(topic, []).append(p)
            slices.setdefault(member, {})[(topic, p)] = s
            counts[p] = s.count
        shared[topic] = counts
    return Rewrite(out, slices, shared)
