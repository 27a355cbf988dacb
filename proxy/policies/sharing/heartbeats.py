"""KIP-848 consumer groups (``group.protocol=consumer``) through a sharing-enabled Sluice: ConsumerGroupHeartbeat
rewritten so the broker always sees the group it assigned while each opted-in client sees its slices.

The broker computes the assignment and checks what members say they own (GroupMetadataManager
.consumerGroupHeartbeat): a member whose epoch lags is fenced unless it comes with its previous epoch and owned
partitions inside what the broker assigned it (``throwIfConsumerGroupMemberEpochIsInvalid``), and a member asked to
revoke partitions keeps its epoch until a heartbeat's owned partitions no longer hold them (CurrentAssignmentBuilder,
UNREVOKED_PARTITIONS). So both directions are rewritten, per member:

- the **request**: before it goes on, the group is described (ConsumerGroupDescribe) when the member's epoch moved
  past the layout's, the group is not stable or a slice waits for another member to let it go. The client id is
  marked (:func:`.layout.mark_client_id`) with the topics this Sluice lets the member share and its claims: the
  slices its client holds, and those it is about to be handed (a new slice only when no other member claims an
  overlapping one). Its owned partitions, sent whenever the client sends them or they changed, are the broker's
  assignment of the member, plus the partitions the broker revoked that the client still holds (so the broker
  hands a revoked partition to its next holder only once this client let it go);
- the **response**: the assignment handed to the client is the member's layout (:mod:`.layout`) for the shared
  topics and the broker's for the others, less new slices its request did not claim, sent whenever it differs
  from what the client was handed (the broker sends one only when its own changed). Its slices are what its
  fetches are filtered by and its commits merged by, as for classic groups (:mod:`.fetch`, :mod:`.offsets`).

Rebalances are KIP-848's incremental reconciliation, on the layout: a partition whose slice changes (narrower or
wider) is first left out of what the client is handed and handed again once the client no longer owns it: new to
the client, it starts from its slice's committed position (what the classic path does with a rejoin, groups.py), and
until then the client's commits are its old slice's (kept as released once it let go: a KIP-848 member's commit is
checked for its epoch, not its partitions). Kept with a wider slice, the client would skip records of the keys it
gains; with a narrower one, deliver records of the keys it loses that it had fetched already while their next holder
starts them from the old slice's last commit. Other partitions are not touched, so the partition's other members go
on.

Members' commits carry their member epoch (OffsetCommit v9+); the coordinator checks the member and its epoch, not
which partitions it was assigned, for a commit at the current epoch (ConsumerGroup.validateOffsetCommit), so a
member commits the partitions of its slices like any.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...accesslog import get_logger
from ...core.exchange import ConnectionInfo, Exchange, Signal
from ...wire.api_keys import ApiKey
from ...wire.messages import response_codec
from ...wire.model import Message, TopicPartition
from ...wire.views import MessageRequest, MessageResponse, ResponseView, local_response
from . import layout as layouts
from .access import Checking
from .group_calls import GroupCall
from .keys import WHOLE, Slice
from .members import (
    COORDINATOR_NOT_AVAILABLE,
    HeartbeatState,
    IdPartition,
    Member,
    PartitionState,
    learnt,
    member_key,
    read_state,
)
from .reads import FrontierRead
from .state import SharingState

log = get_logger("sluice.sharing")

UNKNOWN_MEMBER_ID = 25
GROUP_ID_NOT_FOUND = 69
FENCED_MEMBER_EPOCH = 110


@dataclass(slots=True)
class HeartbeatTicket:
    member: Member
    state: HeartbeatState
    call: GroupCall | None = None
    #: a member learnt from its group's description (resume): its slices, and the read of their frontiers (or the
    #: recovery already reading them, offsets.recover) the heartbeat waits for
    claims: dict[TopicPartition, Slice] = field(default_factory=dict)
    read: Signal | None = None


def _ids(topics: list[Message] | None) -> set[IdPartition] | None:
    if topics is None:
        return None
    return {(bytes(t.topic_id), p) for t in topics for p in t.partitions}


def _topics(parts: set[IdPartition]) -> list[Message]:
    by_topic: dict[bytes, list[int]] = {}
    for tid, part in parts:
        by_topic.setdefault(tid, []).append(part)
    return [Message(topic_id=tid, partitions=sorted(ps)) for tid, ps in sorted(by_topic.items())]


def _names(p: SharingState, m: Member) -> dict[bytes, str]:
    lay = p.layouts.get(m.group)
    return {tid: name for name, tid in lay.topic_ids.items()} if lay is not None else {}


def _name(p: SharingState, names: dict[bytes, str], tid: bytes) -> str | None:
    return names.get(tid) or p.names.get(tid)


# ------------------------------------------------------------------------------------------------ request


def request(p: SharingState, ex: Exchange, info: ConnectionInfo) -> HeartbeatTicket | Checking | None:
    body = ex.body
    check = p.access.check(body.group_id) if body.member_epoch >= 0 and _subscribes_shareable(p, ex) else None
    if check is not None:  # may Sluice's login use the group's slice groups? (.access) Asked before a first share
        ex.pending = check
        return Checking(body.group_id)
    m, collision = p.members.attach(member_key(ex), info.conn_id, body.group_id, body.member_id, p.clock())
    if collision:
        p.not_shared("client_id_collision", ex.client_id, body.group_id)
        return None
    st = m.kip848
    epoch = body.member_epoch
    if epoch == 0:  # a member joining (again): nothing it held is left (KIP-848: epoch 0)
        st = m.kip848 = HeartbeatState(marked=st.marked if st is not None else frozenset(),
                                       shareable=st.shareable if st is not None else frozenset(), broker=set(),
                                       owned=set(), given=set())
        m.hold({})
    elif st is None:  # a member this Sluice has not seen join (it restarted): learnt from the group's description
        st = m.kip848 = HeartbeatState()
    if epoch < 0:
        return None  # leaving (-1; -2: a static member's temporary leave): relayed as it is
    if body.subscribed_topic_names is not None:
        st.marked = st.shareable = frozenset(t for t in body.subscribed_topic_names if p.shareable(t))
    if body.get("subscribed_topic_regex"):
        p.not_shared("kip848_group", ex.client_id, body.group_id,
                     detail="a regular-expression subscription (KIP-848): Sluice shares topics subscribed by name")
        st.marked = st.shareable = frozenset()
    owned = _ids(body.topic_partitions)
    if owned is not None:
        st.owned = owned
        st.revoking &= owned
        st.widening &= owned
        if m.partitions is not None:  # partitions the client let go are no longer filtered for it, nor claimed
            ids = {name: tid for tid, name in _names(p, m).items()}
            m.hold({tp: state for tp, state in m.partitions.items() if ids.get(tp[0]) is None
                    or (ids[tp[0]], tp[1]) in owned | (st.given or set())})
    refused = p.access.refused(body.group_id) is not None
    if st.marked and refused:
        # Sluice may not use the group's slice groups (.access): nothing is laid out for it (_desired), so the
        # client is handed the broker's assignment, a slice that widens to its whole partition revoked first and
        # handed again once the client let it go and no other member claims a slice of it (as any slice that
        # changes, response). Once its client holds what the broker assigned it, whole, the member goes unmarked:
        # relayed as without Sluice (the broker sends an assignment only when its own changes, so not before)
        p.said_refused(ex.client_id, body.group_id)
        if st.broker is not None and st.given == st.broker and not st.widening \
                and all(state.slice.whole for state in (m.partitions or {}).values()):
            st.marked = frozenset()
    elif st.shareable and not st.marked and not refused:
        st.marked = st.shareable  # the slice groups granted since (.access): marked again, shared from here on
        st.unseen = True
    ticket = HeartbeatTicket(m, st)
    ex.collect = True
    lay = p.layouts.get(m.group)
    if (st.marked or st.broker is None) and (lay is None or not lay.stable or st.epoch > lay.group_epoch
                                             or st.broker is None or st.waiting or st.unseen or _new(p, m, st)):
        ticket.call = p.submit(GroupCall(describe_consumer={m.group}))
        ex.pending = ticket.call
        return ticket
    _forward(p, ex, ticket)
    return ticket


def _subscribes_shareable(p: SharingState, ex: Exchange) -> bool:
    """Whether the member subscribes a topic this Sluice shares: as this heartbeat says, or as an earlier one said (a
    client sends its subscription only when it changes). Only then are the group's slice groups checked."""
    names = ex.body.subscribed_topic_names
    if names is not None:
        return any(p.shareable(t) for t in names)
    m = p.members.get(member_key(ex))
    return m is not None and m.kip848 is not None and bool(m.kip848.shareable)


def resume(p: SharingState, ex: Exchange, info: ConnectionInfo, ticket: HeartbeatTicket) -> HeartbeatTicket | None:
    if ticket.read is not None:
        return _read_back(p, ex, ticket)
    call = ticket.call
    assert call is not None
    m, st = ticket.member, ticket.state
    entry = call.described_consumer.get(m.group) if call.error is None else None
    if entry is None or entry.error_code:
        code = entry.error_code if entry is not None else None
        if code != GROUP_ID_NOT_FOUND:  # not found: a group its first member is creating, described next time
            # e.g. no DESCRIBE on the group for Sluice's own principal: the layout cannot be known, so no new
            # slice is handed; the client keeps what it holds and is told, at worst, the broker's assignment
            failure = f"ConsumerGroupDescribe failed: {call.error or code or 'no answer'}"
            p.not_shared("kip848_group", m.key[1], m.group, detail=failure)
            if st.broker is None:
                # A member this Sluice did not see join (it restarted): the slices its client holds are not known,
                # so its heartbeat would go on with a client id without them, which the broker stores
                # (GroupMetadataManager.consumerGroupHeartbeat: setClientId), and the next description would find
                # none to learn. Answered as a coordinator that is away instead, the broker keeps the last one; the
                # client finds the coordinator and sends it again, and that one describes the group again. Should
                # the description keep failing, the member's session ends and it joins anew (epoch 0). Its commits
                # meanwhile are refused too (Member.unreadable)
                learnt(m, failure)
                _unavailable(ex)
                return ticket
    else:
        m.unreadable = None  # described: what the member holds is learnt below, or it holds nothing
        if st.broker is None and any(x.member_id == m.member_id for x in entry.members):
            # this Sluice did not see the member join (it restarted): learnt from the group
            claims = recovered(p, m, entry)
            st = ticket.state = m.kip848  # type: ignore[assignment]
            if m.partitions is None and claims:
                # Its slices' frontiers are read before the heartbeat goes on, as a classic member's recovery reads them
                # (offsets.recover): made without them, a slice had no committed-work filter (records an earlier layout
                # committed delivered again) and no known position, which offsets.advance never commits on, so a member
                # with nothing more to commit left the group's stable offset short of the partition's end for good.
                # Its fetches are withheld meanwhile (m.recovering), as they are until the description is in
                ticket.claims = claims
                if m.recovering is None:  # else an offset request's recovery is reading them already: waited for
                    m.recovering = FrontierRead(p, m.group, claims)
                ticket.read = ex.pending = m.recovering
                return ticket
            if m.partitions is None:
                m.partitions = {}
        else:
            lay = p.layouts[m.group] = layouts.from_description(entry, p.shareable)
            if st.unseen and lay.marked.get(m.member_id) == st.marked:
                st.unseen = False
    _forward(p, ex, ticket)
    return ticket


def _unavailable(ex: Exchange) -> None:
    """Answer the heartbeat ``ex`` with COORDINATOR_NOT_AVAILABLE: the client looks for its coordinator and sends it
    again (a KIP-848 consumer retries on it, as on any coordinator error)."""
    h = ex.header
    body = response_codec(ApiKey.CONSUMER_GROUP_HEARTBEAT, h.api_version).default().replace(
        error_code=COORDINATOR_NOT_AVAILABLE, error_message="Sluice could not describe the group")
    ex.answer = local_response(ApiKey.CONSUMER_GROUP_HEARTBEAT, h.api_version, h.correlation_id, body)


def _read_back(p: SharingState, ex: Exchange, ticket: HeartbeatTicket) -> HeartbeatTicket | None:
    """The heartbeat of a member learnt from its group's description, once its slices' frontiers are read (resume):
    its slices' states made from them (:func:`.members.read_state`, as after an OffsetFetch), and the heartbeat
    sent on."""
    m, read = ticket.member, ticket.read
    ticket.read = None
    if isinstance(read, FrontierRead) and m.recovering is read:
        m.recovering = None
        learnt(m, read.error)
        if read.error is None and m.partitions is None:
            m.partitions = {tp: read_state(s, read.frontiers[tp]) for tp, s in ticket.claims.items()}
            p.update_gauges(m.group)
    if m.kip848 is not None:
        ticket.state = m.kip848  # (learnt again by an offset request's recovery while this one waited)
    _forward(p, ex, ticket)  # the claims it holds kept in its client id, its owned partitions the broker's
    if m.partitions is None:
        # The read failed (a timeout, the coordinator moving): as a failed description, the member stays unknown,
        # its fetches withheld, and its next heartbeat describes the group and reads again. Its answer is not
        # looked at (it would make the slices' states without their positions, response)
        m.kip848 = None
        return None
    return ticket


def _new(p: SharingState, m: Member, st: HeartbeatState) -> bool:
    """Whether the layout as known would hand the client a slice it was not handed: the claims are read anew
    first."""
    given = st.given or set()
    return any(k not in given for k in _desired(p, m, st, _names(p, m)))


def recovered(p: SharingState, m: Member, entry: Message) -> dict[TopicPartition, Slice]:
    """A member a restarted Sluice did not see join, from its group's ConsumerGroupDescribe entry: the broker's
    assignment of it, the topics and the slices its client holds (its previous Sluice's claims, in its client id),
    and the group's layout. Returns those slices, whose frontiers the caller reads (:func:`.offsets.recover`)."""
    p.layouts[m.group] = layouts.from_description(entry, p.shareable)
    mine = next(x for x in entry.members if x.member_id == m.member_id)
    mark = layouts.read_mark(mine.client_id)
    st = m.kip848 = HeartbeatState()
    st.broker = {(bytes(t.topic_id), part) for t in mine.assignment.topic_partitions for part in t.partitions}
    st.marked = st.shareable = frozenset(t for t in (mark[0] if mark is not None else ()) if p.shareable(t))
    claims = {tp: s for tp, s in (mark[1] if mark is not None else {}).items() if tp[0] in st.marked}
    ids = {t.topic_name: bytes(t.topic_id) for t in mine.assignment.topic_partitions}
    ids.update(p.layouts[m.group].topic_ids)
    names = {tid: name for name, tid in ids.items()}
    # what it was handed: its claims of the topics it shares, the broker's assignment of the others
    st.given = {(ids[t], part) for t, part in claims if t in ids} | {
        k for k in st.broker if names.get(k[0]) not in st.marked}
    log.info("sharing_member_recovered", group=m.group, member_id=m.member_id, client_id=m.key[1],
             protocol="consumer", partitions={f"{t}-{part}": str(s) for (t, part), s in sorted(claims.items())})
    return claims


def _forward(p: SharingState, ex: Exchange, ticket: HeartbeatTicket) -> None:
    """The request as the broker gets it: the client id marked with the member's claims, and the owned partitions
    in the broker's terms."""
    body, m, st = ex.body, ticket.member, ticket.state
    if st.marked:
        lay = p.layouts.get(m.group)
        names = _names(p, m)
        given = st.given or set()
        # new slices no other member claims: claimed now, handed in the answer (see the module docstring)
        st.cleared = set()
        st.waiting = False
        # the slices its client holds; of a member learnt whose slices' read failed (_read_back), those learnt: left
        # out, the broker would keep its client id without them and the next description would learn none
        claims = ({tp: state.slice for tp, state in m.partitions.items()} if m.partitions is not None
                  else dict(ticket.claims))
        for k, s in _desired(p, m, st, names).items():
            name = _name(p, names, k[0])
            if k in given or name is None or name not in st.marked:
                continue
            held = (m.partitions or {}).get((name, k[1]))
            if held is not None and held.slice != s:
                # Taken away from the client (not in what it was last handed) while it still owns the partition,
                # now laid out to it again with another slice: handed now, the client would go on from its own
                # position with it (see response). Like a partition in KIP-848, assigned again only once its
                # owner's heartbeat no longer lists it (CurrentAssignmentBuilder), it waits for the client to let
                # it go; until then the mark claims the slice the client holds
                st.waiting = True
                continue
            if lay is not None and lay.claimed_by_others(m.member_id, (name, k[1]), s):
                st.waiting = True
                continue
            st.cleared.add(k)
            claims[(name, k[1])] = s
        view = ex.request
        assert isinstance(view, MessageRequest)
        view.header.client_id = layouts.mark_client_id(ex.client_id or "", st.marked, claims)
    changes: dict[str, Any] = {}
    if st.broker is not None:
        report = st.broker | st.revoking
        if body.topic_partitions is not None or report != st.reported:
            changes["topic_partitions"] = _topics(report)
            st.reported = report
    ex.body = body.replace(**changes)  # re-encoded, the header too


# ----------------------------------------------------------------------------------------------- response


def _desired(p: SharingState, m: Member, st: HeartbeatState, names: dict[bytes, str]) -> dict[IdPartition, Slice]:
    """What the member's client should hold: its layout's slices of the shared topics it is marked for, the broker's
    assignment of the other topics (whole)."""
    lay = p.layouts.get(m.group)
    refused = p.access.refused(m.group) is not None  # nothing laid out: the broker's assignment, whole
    laid_out = {t for t in (lay.shared if lay is not None and not refused else ()) if t in st.marked}
    out: dict[IdPartition, Slice] = {}
    for tid, part in st.broker or ():
        if _name(p, names, tid) not in laid_out:
            out[(tid, part)] = WHOLE
    if lay is not None:
        for (name, part), s in lay.of(m.member_id).items():
            if name in laid_out:
                out[(lay.topic_ids[name], part)] = s
    return out


def response(p: SharingState, ex: Exchange, response: ResponseView, info: ConnectionInfo,
             ticket: HeartbeatTicket) -> None:
    assert isinstance(response, MessageResponse)
    body = response.body
    m, st = ticket.member, ticket.state
    if body.error_code:
        # fenced (its session expired, its epoch is behind, another instance took its group.instance.id): Sluice
        # commits none of its slices on itself while it holds this epoch (Member.fence)
        m.fence(body.error_code, ex.body.member_epoch)
        if body.error_code in (UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH):  # the client rejoins with epoch 0
            m.kip848 = None
            m.hold({})
        return
    st.epoch = body.member_epoch
    if body.assignment is not None:
        new = _ids(body.assignment.topic_partitions) or set()
        old = st.broker or set()
        st.revoking = ((st.revoking | (old - new)) & (st.owned or set())) - new
        st.broker = new
    if st.broker is None:
        # A member this Sluice did not see join whose group it could not describe (resume: a timeout, the coordinator
        # moving): the slices its client holds are not known, and it is not taken as holding none (its fetches would
        # get every slice's records). It stays unknown, its fetches withheld as a classic member's are until its
        # recovery (offsets.recover), and its next heartbeat describes the group again (request)
        return
    if not st.marked:
        if m.partitions is None:
            m.partitions = {}  # nothing to share: its fetches go through whole
        return
    names = _names(p, m)
    out = _desired(p, m, st, names)
    held = m.partitions if m.partitions is not None else {}
    given_before = st.given or set()
    for k, s in list(out.items()):
        name = _name(p, names, k[0])
        if name is None or name not in st.marked:
            continue  # a topic it does not share: the broker's, as it came
        before = held.get((name, k[1]))
        if k not in given_before and k not in st.cleared:
            del out[k]  # not claimed yet (another member may still hold an overlapping slice)
            st.waiting = True
        elif k in st.widening or (before is not None and before.slice != s):
            # Another slice of a partition the client keeps (handed to it last time, or taken away and still
            # owned) is revoked first and handed again once the client let it go (KIP-848 revokes before it
            # assigns, CurrentAssignmentBuilder), then started from its slice's committed position. A wider one
            # kept would go on from the client's position, past records of keys it did not hold (lost); a narrower
            # one, past records of the keys it loses that the client fetched already (it prefetches) and will
            # deliver and commit as its new slice's, while their next holder starts them from the old slice's
            # last commit (delivered twice). Until then the client's commits are its old slice's
            st.widening.add(k)
            del out[k]
    given = set(out)
    if body.assignment is not None or given != st.given:
        body.assignment = Message(topic_partitions=_topics(given))
        response.changed = True
        if given != st.given and any(not s.whole for s in out.values()):
            log.info("sharing_assignment", group=m.group, member_id=m.member_id, epoch=body.member_epoch,
                     protocol="consumer",
                     slices={f"{names.get(t, t.hex())}-{part}": str(s) for (t, part), s in sorted(out.items())})
            p.metrics.sharing_assignments.inc()
        st.given = given
    partitions: dict[Any, PartitionState] = {}
    for (tid, part), s in out.items():
        name = _name(p, names, tid)
        if name is None or name not in st.marked:
            continue
        before = held.get((name, part))
        partitions[(name, part)] = before if before is not None else PartitionState(s)  # (the same slice: above)
    ids = {name: tid for tid, name in names.items()}
    for tp, state in held.items():  # partitions taken away that the client still owns: filtered as before
        held_id = ids.get(tp[0])
        if tp not in partitions and held_id is not None and (held_id, tp[1]) in (st.owned or set()):
            partitions[tp] = state
    m.hold(partitions)
    p.update_gauges(m.group)
