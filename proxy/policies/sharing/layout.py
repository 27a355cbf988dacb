"""The slices of a KIP-848 consumer group (``group.protocol=consumer``), as a pure function of the group's state as
its coordinator describes it (ConsumerGroupDescribe), so every Sluice of the group reaches the same layout.

In a KIP-848 group the broker assigns partitions (GroupMetadataManager.consumerGroupHeartbeat, with a server-side
assignor): with more members than partitions, some members get none. Sluice does not change what the broker
assigns; it hands opted-in clients a layout on top of it (:mod:`.heartbeats`):

- **who opted in, and what each client may be reading**: the broker keeps each member's client id from its latest
  ConsumerGroupHeartbeat's request header (``ConsumerGroupMember.Builder.setClientId(context.clientId())``) and shows
  it in ConsumerGroupDescribe. A sharing Sluice appends :data:`MARK`, the topics it lets the member share and the
  member's *claims* (the slices its client holds or is about to be handed) to the client id of that member's
  heartbeats only (its fetches, commits and quotas keep the client's own), so every Sluice of the group - and one
  restarted - reads them from Kafka. A slice is handed to a client only when no other member claims an
  overlapping one (:meth:`.keys.Slice.overlaps`): KIP-848's revoke-before-assign, for slices, across Sluices that
  change their layouts at their own members' heartbeats;
- **the layout**, for each topic whose opted-in subscribed members outnumber its partitions: each partition the
  broker has handed to an opted-in member for good (in its current and its target assignment: ConsumerGroupDescribe
  shows a partition being revoked in its old owner's current assignment until the client let it go, so a
  partition on the move is laid out for nobody) is shared by key-hash slices between its holder (slice 0)
  and the opted-in members the broker gave no partition of the topic (neither current nor target), those taken in
  member-id order, round robin over the held partitions in partition order. Other topics, and partitions of
  members that did not opt in, stay as the broker assigned them.

Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from ...wire.model import Message, TopicPartition
from .keys import Slice

#: appended to an opted-in member's client id in its ConsumerGroupHeartbeat requests, followed by the topics it may
#: share, comma-separated (Kafka topic names hold only ASCII letters, digits, '.', '_' and '-': Topic.validate),
#: then "|" and its claims, comma-separated "topic index:partition:slice index/slice count"
MARK = "#sluice-share="
Claims = Mapping[TopicPartition, Slice]


def mark_client_id(client_id: str, topics: Iterable[str], claims: Claims | None = None) -> str:
    ts = sorted(topics)
    index = {t: i for i, t in enumerate(ts)}
    held = ",".join(f"{index[t]}:{p}:{s}" for (t, p), s in sorted((claims or {}).items()) if t in index)
    return f"{client_id}{MARK}{','.join(ts)}|{held}"


def read_mark(client_id: str | None) -> tuple[frozenset[str], dict[TopicPartition, Slice]] | None:
    """The topics a marked client id lets its member share and the slices it claims (None: not marked). A claim
    that cannot be read is left out (a client id is the client's to choose)."""
    if not client_id or MARK not in client_id:
        return None
    topics_text, _, claims_text = client_id.rpartition(MARK)[2].partition("|")
    ts = [t for t in topics_text.split(",") if t]
    claims: dict[TopicPartition, Slice] = {}
    for c in claims_text.split(","):
        try:
            ti, part, s = c.split(":")
            claims[(ts[int(ti)], int(part))] = Slice.parse(s)
        except (ValueError, IndexError):
            continue
    return frozenset(ts), claims


@dataclass(frozen=True, slots=True)
class DescribedMember:
    member_id: str
    #: topics its Sluice lets it share (None: no Sluice marked it)
    marked: frozenset[str] | None
    subscribed: frozenset[str]
    #: topic -> partitions, the broker's current and target assignment of the member
    current: dict[str, frozenset[int]]
    target: dict[str, frozenset[int]]
    #: the slices its Sluice says its client holds or is being handed
    claims: Mapping[TopicPartition, Slice] = field(default_factory=dict)


@dataclass(slots=True)
class Layout:
    """Every member's slices of the shared topics' partitions, and, per shared topic, how many share each
    partition; ``topic_ids`` names the topics the description named (heartbeats name topics by id)."""

    group_epoch: int = -1
    stable: bool = False
    slices: dict[str, dict[TopicPartition, Slice]] = field(default_factory=dict)
    shared: dict[str, dict[int, int]] = field(default_factory=dict)
    topic_ids: dict[str, bytes] = field(default_factory=dict)
    #: per member, its claims as described
    claims: dict[str, Mapping[TopicPartition, Slice]] = field(default_factory=dict)
    #: per member, the topics its client id is marked for as described (none: not marked)
    marked: dict[str, frozenset[str]] = field(default_factory=dict)
    #: how many members the group has: no partition is split in more slices (:func:`.reads.read_counts`)
    members: int = 0

    def of(self, member_id: str) -> dict[TopicPartition, Slice]:
        return self.slices.get(member_id, {})

    def claimed_by_others(self, member_id: str, tp: TopicPartition, s: Slice) -> bool:
        """Whether a member other than ``member_id`` claims a slice of ``tp`` that overlaps ``s``."""
        return any(other != member_id and (c := cs.get(tp)) is not None and c.overlaps(s)
                   for other, cs in self.claims.items())


def compute(members: Iterable[DescribedMember], shareable: Callable[[str], bool]) -> Layout:
    """The layout of a group with ``members``; a topic is shared only where ``shareable`` allows it (every Sluice of
    a group must share the same topics: docs/cooperative-consumption.md)."""
    ms = sorted(members, key=lambda m: m.member_id)
    out = Layout()
    for topic in sorted({t for m in ms for t in (m.marked or ())}):
        if not shareable(topic):
            continue
        opted = [m for m in ms if m.marked is not None and topic in m.marked and topic in m.subscribed]
        partitions = {p for m in ms for p in (*m.current.get(topic, ()), *m.target.get(topic, ()))}
        if not partitions or len(opted) <= len(partitions):
            continue
        # a partition the broker is moving (in a member's current assignment and not its target: being revoked;
        # in its target only: not handed yet) is laid out for nobody until it has moved
        held = {p: m.member_id for m in opted
                for p in m.current.get(topic, frozenset()) & m.target.get(topic, frozenset())}
        if not held:
            continue
        idle = [m.member_id for m in opted if not m.current.get(topic) and not m.target.get(topic)]
        parts = sorted(held)
        sharers = {p: [held[p]] for p in parts}
        for j, member in enumerate(idle):
            sharers[parts[j % len(parts)]].append(member)
        counts: dict[int, int] = {}
        for p, who in sharers.items():
            counts[p] = len(who)
            for k, member in enumerate(who):
                out.slices.setdefault(member, {})[(topic, p)] = Slice(k, len(who))
        if any(n > 1 for n in counts.values()):
            out.shared[topic] = counts
    # a topic laid out with no partition split keeps the broker's assignment: drop its whole slices
    for member, tps in list(out.slices.items()):
        kept = {tp: s for tp, s in tps.items() if tp[0] in out.shared}
        if kept:
            out.slices[member] = kept
        else:
            del out.slices[member]
    return out


def from_description(group: Message, shareable: Callable[[str], bool]) -> Layout:
    """The layout of a group from its ConsumerGroupDescribe entry (ConsumerGroupDescribeResponse.json)."""
    ids: dict[str, bytes] = {}

    def parts(assignment: Message | None) -> dict[str, frozenset[int]]:
        out: dict[str, frozenset[int]] = {}
        for t in (assignment.topic_partitions if assignment is not None else ()):
            ids[t.topic_name] = bytes(t.topic_id)
            out[t.topic_name] = frozenset(t.partitions)
        return out

    members = []
    for m in group.members:
        mark = read_mark(m.client_id)
        members.append(DescribedMember(m.member_id, mark[0] if mark is not None else None,
                                       frozenset(m.subscribed_topic_names or ()), parts(m.assignment),
                                       parts(m.target_assignment), mark[1] if mark is not None else {}))
    out = compute(members, shareable)
    out.claims = {m.member_id: m.claims for m in members if m.claims}
    out.marked = {m.member_id: m.marked or frozenset() for m in members}
    out.group_epoch = group.group_epoch
    out.members = len(group.members)
    out.stable = group.group_state.lower() == "stable"
    out.topic_ids = ids
    return out
