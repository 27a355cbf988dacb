"""The classic group protocol through a sharing-enabled Sluice (rebalances that hand one partition to several
members at once, for unmodified clients):

- a member's **JoinGroup** request: its subscription metadata is marked (the topics this Sluice lets it share) and
  partitions it shares without holding slice 0 are left out of its OwnedPartitions (:mod:`.marker`);
- the **JoinGroup** response to the leader: the markers are read (kept for its SyncGroup) and removed;
- the leader's **SyncGroup** request: for each shared topic whose marked members outnumber its partitions, the
  assignment is rewritten by the key-range assignor (:mod:`.assignor`) and each marked member's slices
  are appended to its assignment; the rewrite is logged (``sharing_assignment``);
- a member's **SyncGroup** response: its slices are read and removed; the member's partitions of shared topics are
  what its fetches are filtered by;
- **Heartbeat**: a member whose slices this Sluice does not know (it restarted) is recovered from the group
  (:func:`~.offsets.recover`); a member Sluice must make rejoin is answered REBALANCE_IN_PROGRESS until its
  JoinGroup, as the coordinator answers every heartbeat while a rebalance runs (its client then sends JoinGroup);
- **fencing**: a Heartbeat, JoinGroup or SyncGroup the coordinator answers with a fencing error
  (:data:`~.members.FENCED`: its session expired, a rebalance went on without it, another instance took its
  ``group.instance.id``) marks the member fenced in the generation it holds, as a refused OffsetCommit does
  (:meth:`.Member.fence`), and so does a JoinGroup answered (the coordinator refuses its commits until its
  SyncGroup: ClassicGroup.validateOffsetCommit, COMPLETING_REBALANCE); its SyncGroup answered clears it;
- KIP-848 groups (``group.protocol=consumer``, ConsumerGroupHeartbeat) are :mod:`.heartbeats`'.

A partition the client keeps across a rebalance: clients go on from their own position in it without reading its
committed offset again, and with the records they fetched already (cooperative rebalancing always; kafka-python's
eager rebalancing too: ``SubscriptionState.assign_from_subscribed`` keeps the state of partitions in both
assignments). With a new slice that holds keys the old one did not, that position may be past records of those keys
no one consumed yet; with a narrower one, the client still delivers the records it fetched of the keys it lost,
which their next holder starts from the old slice's last commit: twice. So a partition whose slice changes is left
out of the member's assignment this generation and the member is made to rejoin: in the next generation the
partition is new to it, and it starts from its slice's committed position (what Kafka's cooperative protocol does
for a partition that moves: revoke first, assign in the next round; KIP-848 groups likewise, :mod:`.heartbeats`).
The slices compared are every one the client may still keep a position under (:attr:`.Member.may_keep`): those it
last took up (its Heartbeat named their generation) and those handed since. A client can throw a finished join away
unread and join again (kafka-python 3.0.12), so the partition left out is left out again until its client is seen
to take up an assignment without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...accesslog import get_logger
from ...core.exchange import ConnectionInfo, Exchange
from ...wire.errors import CodecError
from ...wire.model import Message, TopicPartition
from ...wire.views import MessageResponse, ResponseView
from . import assignor, marker, offsets
from .access import Checking
from .keys import WHOLE
from .members import Member, PartitionState, member_key
from .state import LeaderRound, SharingState

log = get_logger("sluice.sharing")

CONSUMER = "consumer"
#: Kafka Streams' assignor (StreamsPartitionAssignor's name): it maps each partition to one task, and an
#: assignment with slices added fails its check (TaskAssignmentException: assigned partitions != active tasks)
STREAMS_ASSIGNOR = "stream"
REBALANCE_IN_PROGRESS = 27
MEMBER_ID_REQUIRED = 79


@dataclass(slots=True)
class GroupTicket:
    member: Member | None
    collision: bool


# ------------------------------------------------------------------------------------------- JoinGroup


def join_request(p: SharingState, ex: Exchange, info: ConnectionInfo) -> GroupTicket | Checking | None:
    body = ex.body
    if body.protocol_type != CONSUMER:
        return None
    ex.collect = True  # the answer says the member id, and the leader's lists the members' markers
    if not p.opted_in(ex):
        return GroupTicket(None, False)  # not marked; the response may still be the leader's to clean
    if any(proto.name == STREAMS_ASSIGNOR for proto in body.protocols):
        p.not_shared("streams_group", ex.client_id, body.group_id,
                     detail="a Kafka Streams member: its tasks own whole partitions, Sluice does not share them")
        return GroupTicket(None, False)
    check = p.access.check(body.group_id) if _subscribes_shareable(p, body) else None
    if check is not None:  # may Sluice's login use the group's slice groups? (.access) Asked before a first share
        ex.pending = check
        return Checking(body.group_id)
    m, collision = p.members.attach(member_key(ex), info.conn_id, body.group_id, body.member_id, p.clock())
    m.rejoin.discard(body.member_id)  # it rejoins: its heartbeats are the coordinator's to answer again
    if collision:
        p.not_shared("client_id_collision", ex.client_id, body.group_id)
        return GroupTicket(m, True)
    if p.access.refused(body.group_id) is not None:
        # Not marked: the leader's assignment goes on as the client's assignor made it. Its marks of the last
        # generation stay, so a partition it held a slice of and now gets whole is first left out and it rejoins
        # (sync_response): new to the client, it starts from the group's committed offset
        p.said_refused(ex.client_id, body.group_id)
        return GroupTicket(m, False)
    holds = m.partitions or {}

    def not_owned(tp: TopicPartition) -> bool:
        state = holds.get(tp)
        return state is not None and state.slice.index != 0

    protocols = []
    marked: frozenset[str] = frozenset()
    for proto in body.protocols:
        try:
            metadata, topics = marker.mark_subscription(bytes(proto.metadata), p.shareable, not_owned)
        except CodecError as e:
            p.not_shared("bad_marker", ex.client_id, body.group_id, detail=f"subscription unreadable: {e}")
            return GroupTicket(m, False)
        marked |= topics
        protocols.append(proto.replace(metadata=metadata))
    m.marked = marked
    if marked:
        ex.body = body.replace(protocols=protocols)
    return GroupTicket(m, False)


def _subscribes_shareable(p: SharingState, body: Message) -> bool:
    """Whether a JoinGroup subscribes a topic this Sluice shares (in any of its protocols): only a group it may
    share has its slice groups checked, so a group it never would is neither asked about nor reported refused. An
    unreadable subscription is not: it is reported when marked (bad_marker)."""
    for proto in body.protocols:
        try:
            if any(p.shareable(t) for t in marker.subscribed_topics(bytes(proto.metadata))):
                return True
        except CodecError:
            continue
    return False


def join_response(p: SharingState, ex: Exchange, response: ResponseView, info: ConnectionInfo,
                  ticket: GroupTicket) -> None:
    assert isinstance(response, MessageResponse)
    body = response.body
    group = ex.body.group_id
    if ticket.member is not None and body.member_id and not ticket.collision:
        p.members.learn_member_id(ticket.member.key, info.conn_id, group, body.member_id)
        ticket.member.member_id = body.member_id
        if body.error_code == 0:
            ticket.member.generation = body.generation_id
            ticket.member.protocol = body.protocol_name or ""
            # until its SyncGroup the coordinator refuses the member's commits (REBALANCE_IN_PROGRESS), and the
            # slices it still holds are of the generation before: the next one may hand them to others
            ticket.member.fence(REBALANCE_IN_PROGRESS, body.generation_id)
    elif ticket.member is not None and body.member_id:
        p.members.learn_member_id(ticket.member.key, info.conn_id, group, body.member_id)
    if ticket.member is not None and not ticket.collision and body.error_code:
        ticket.member.fence(body.error_code, ticket.member.held)  # JoinGroup names no generation: the one it holds
    if body.error_code or not body.members:
        return
    # The leader's answer: every member's metadata. Markers are read for the leader's SyncGroup and removed.
    members: dict[str, assignor.MemberInfo] = {}
    marked: dict[str, frozenset[str]] = {}
    subscribed: dict[str, frozenset[str]] = {}
    changed = False
    cleaned = []
    for entry in body.members:
        instance = entry.get("group_instance_id")
        members[entry.member_id] = assignor.MemberInfo(entry.member_id, instance)
        try:
            metadata, topics = marker.strip_subscription(bytes(entry.metadata))
        except CodecError as e:
            p.not_shared("bad_marker", ex.client_id, group, detail=f"member {entry.member_id}: {e}")
            cleaned.append(entry)
            continue
        if topics is not None:
            marked[entry.member_id] = topics
            entry = entry.replace(metadata=metadata)
            changed = True
        try:
            subscribed[entry.member_id] = frozenset(marker.subscribed_topics(bytes(entry.metadata)))
        except CodecError:
            marked.pop(entry.member_id, None)
        cleaned.append(entry)
    p.rounds[group] = LeaderRound(body.generation_id, body.protocol_name or "", members, marked, subscribed)
    if changed:
        body.members = cleaned
        response.changed = True


# ------------------------------------------------------------------------------------------- SyncGroup


def sync_request(p: SharingState, ex: Exchange, info: ConnectionInfo) -> GroupTicket | None:
    body = ex.body
    if body.get("protocol_type") not in (None, CONSUMER):
        return None
    m: Member | None = None
    collision = False
    if p.opted_in(ex):
        m, collision = p.members.attach(member_key(ex), info.conn_id, body.group_id, body.member_id, p.clock())
    if body.assignments:
        _rewrite(p, ex, body)
    if m is None:
        return None
    ex.collect = True  # the answer holds the member's slices
    return GroupTicket(m, collision)


def _rewrite(p: SharingState, ex: Exchange, body: Message) -> None:
    """The leader's assignments, rewritten by the key-range assignor where marked members outnumber partitions."""
    group = body.group_id
    round_ = p.rounds.get(group)
    if round_ is None or round_.generation != body.generation_id or not round_.marked:
        return
    decoded: dict[str, tuple[int, Message, dict[str, list[int]]]] = {}
    for a in body.assignments:
        try:
            decoded[a.member_id] = marker.assigned(bytes(a.assignment))
        except CodecError as e:
            p.not_shared("bad_assignment", ex.client_id, group, detail=f"member {a.member_id}: {e}")
            return
    eligible: dict[str, list[str]] = {}
    for topic in sorted({t for ts in round_.marked.values() for t in ts}):
        if not p.shareable(topic):
            continue
        members = [m for m, ts in round_.marked.items()
                   if topic in ts and topic in round_.subscribed.get(m, ()) and m in decoded]
        eligible[topic] = assignor.ordered(round_.members[m] for m in members)
    plan = assignor.rewrite(round_.protocol, {m: parts for m, (_, _, parts) in decoded.items()}, eligible)
    if not plan.shared:
        return
    assignments = []
    for a in body.assignments:
        version, msg, parts = decoded[a.member_id]
        new_parts = plan.partitions[a.member_id]
        if a.member_id in round_.marked:
            slices = {tp: s for tp, s in plan.slices.get(a.member_id, {}).items()}
            data = marker.write_assignment(version, msg, new_parts, slices)
        elif new_parts != parts:
            data = marker.write_assignment(version, msg, new_parts, None)
        else:
            data = bytes(a.assignment)
        assignments.append(a.replace(assignment=data))
    ex.body = body.replace(assignments=assignments)
    p.metrics.sharing_assignments.inc()
    log.info("sharing_assignment", group=group, generation=body.generation_id, protocol=round_.protocol,
             members=len(decoded), shared={t: {str(part): n for part, n in sorted(c.items())}
                                           for t, c in sorted(plan.shared.items())},
             slices={m: {f"{t}-{part}": str(s) for (t, part), s in sorted(ss.items())}
                     for m, ss in sorted(plan.slices.items())})


def sync_response(p: SharingState, ex: Exchange, response: ResponseView, info: ConnectionInfo,
                  ticket: GroupTicket) -> None:
    assert isinstance(response, MessageResponse)
    body = response.body
    m = ticket.member
    if m is None:
        return
    if body.error_code:
        m.fence(body.error_code, ex.body.generation_id)
        return
    member_id = ex.body.member_id
    data = bytes(body.assignment or b"")
    try:
        core, slices = marker.strip_assignment(data)
    except CodecError as e:
        # Slices this Sluice cannot read cannot be enforced: the member gets no records of shared topics until
        # it has rejoined (its client ignores the trailer, like any reader)
        p.not_shared("bad_assignment", ex.client_id, m.group, detail=str(e))
        m.partitions, m.blocked = {}, True
        m.rejoin.add(member_id)
        return
    parsed: tuple[int, Message, dict[str, list[int]]] | None = None
    if core:
        try:
            parsed = marker.assigned(core)
        except CodecError as e:
            p.not_shared("bad_assignment", ex.client_id, m.group, detail=str(e))
    parts = parsed[2] if parsed is not None else {}
    drop: set[TopicPartition] = set()
    if ticket.collision or p.members.collides(m.key):
        # Two consumers behind one key: their fetches cannot be told apart, so no slice can be enforced. Slices
        # given before the collision was seen are not consumed; the member rejoins, unmarked.
        drop = {tp for tp, s in (slices or {}).items() if not s.whole}
        m.partitions, m.blocked = {}, bool(drop)
    else:
        handed = {(t, part): (slices or {}).get((t, part), WHOLE)
                  for t, ps in parts.items() if t in m.marked and p.shareable(t) for part in ps}
        before = m.partitions or {}
        # A partition the client keeps with another slice: the client would go on from its old position, past
        # records of keys it did not hold, or deliver the records it fetched of keys it lost (the module docstring).
        # What the client keeps is what it last took up, which need not be what Sluice last handed (Member.may_keep)
        drop = {tp for tp, s in handed.items()
                if (tp in before and before[tp].slice != s) or any(k != s for k in m.may_keep.get(tp, ()))}
        for tp in drop:
            del handed[tp]
        m.hold({tp: before.get(tp) or PartitionState(s) for tp, s in handed.items()})
        for tp, s in handed.items():
            m.may_keep.setdefault(tp, set()).add(s)
        m.handed_at = ex.body.generation_id
        m.blocked = False
        m.generation = ex.body.generation_id
        m.fenced_at = None  # it holds this generation's slices now
        if m.recovering is not None:  # the group said it anew: a recovery still running must not overwrite it
            m.recovering.settle()
            m.recovering = None
    new: bytes | None = None
    if drop and parsed is not None:
        for t, part in drop:
            if part in parts.get(t, []):
                parts[t].remove(part)
        new = marker.write_assignment(parsed[0], parsed[1], parts, None)
        p.rejoin(m, member_id)
    elif core != data:
        new = core
    if new is not None:
        body.assignment = new
        response.changed = True
    p.update_gauges(m.group)


# -------------------------------------------------------------------------------------------- Heartbeat


def heartbeat_request(p: SharingState, ex: Exchange, info: ConnectionInfo) -> Any:
    body = ex.body
    if not p.opted_in(ex):
        return None
    m, collision = p.members.attach(member_key(ex), info.conn_id, body.group_id, body.member_id, p.clock())
    if body.generation_id == m.handed_at:
        # Its client took up the assignment last handed (a client heartbeats a generation once its join is done):
        # it keeps positions under those slices only
        m.may_keep = {tp: {st.slice} for tp, st in (m.partitions or {}).items()}
    if body.member_id in m.rejoin:
        ex.collect = True  # its answer says REBALANCE_IN_PROGRESS (heartbeat_response)
        return m
    if p.access.refused(body.group_id) is not None:
        p.access.check(body.group_id)  # asked again now and then: once granted, the members rejoin, marked (.access)
    if not m.known and m.recovering is None and m.kip848 is None:
        offsets.recover(p, m)
    if collision:
        return None
    if m.generation < 0:  # a member this Sluice did not see join (it restarted): its heartbeats name its generation
        m.generation = body.generation_id
    ex.collect = True  # the answer says whether the coordinator fenced the member
    return m


def heartbeat_response(p: SharingState, ex: Exchange, response: ResponseView, info: ConnectionInfo,
                       m: Member) -> None:
    assert isinstance(response, MessageResponse)
    body = response.body
    m.fence(body.error_code, ex.body.generation_id)
    if body.error_code == 0 and ex.body.member_id in m.rejoin:
        # A member Sluice makes rejoin: every heartbeat until its JoinGroup is answered REBALANCE_IN_PROGRESS, as the
        # coordinator answers every heartbeat while a rebalance runs (GroupMetadataManager's classic heartbeat).
        # librdkafka ignores that answer while its application has not yet taken up the assignment just handed
        # (join-state WAIT_ASSIGN_CALL: rdkafka_cgrp.c, rd_kafka_cgrp_handle_Heartbeat) and heartbeats meanwhile, so
        # one answer is not enough. The heartbeat still reaches the coordinator: the member's session stays alive
        # however long its application takes
        body.error_code = REBALANCE_IN_PROGRESS
        response.changed = True
