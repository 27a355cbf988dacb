"""Commits and committed offsets of shared partitions (an individual commit per slice, on today's brokers; see
:mod:`.frontier` for what is stored where and why).

- **OffsetFetch** of a member holding slices: before the request goes on, Sluice reads each partition's frontier
  (:class:`~.reads.FrontierRead`); the broker's answer is then edited so the member gets its own slice's start
  (the lowest frontier over its keys) with the metadata it committed, and the member's fetches are filtered from
  then on by the committed-work filter of that frontier. If the read fails, the member is told to retry
  (COORDINATOR_LOAD_IN_PROGRESS), never given an offset Sluice cannot vouch for.
- **OffsetCommit** of such a member: its offset is its slice's position. Sluice reads the slices' positions, and
  the member's request goes on with the partition's stable offset instead (and the layouts to remember in its
  metadata), so the group's commit never gets ahead of what every slice has consumed. The coordinator checks that
  commit with the member's generation (classic: ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS,
  GroupMetadataManager / ClassicGroup.validateOffsetCommit) or member epoch (KIP-848: STALE_MEMBER_EPOCH,
  UNKNOWN_MEMBER_ID, ConsumerGroup.validateOffsetCommit); only once it is in does Sluice commit the slice's position
  in the slice's group (a simple commit, which no coordinator checks: skipped when it is not past the slice's
  start, a commit behind changes nothing). So a fenced member's late commit gets the coordinator's error and moves
  no position, as without Sluice. If Sluice's read fails, the client's commit fails with COORDINATOR_NOT_AVAILABLE
  (retriable) and nothing is written. A commit of a partition the member released at a SyncGroup (kafka-go commits
  what it read in an earlier generation) is the position of the slice it held there (``Member.released``).
- **Recovery** after a Sluice restart (:func:`recover`): a member's client keeps consuming while its new Sluice
  knows nothing; its first group request names the group and member id, and Sluice reads the member's assignment
  back from the group (DescribeGroups: the broker stores the assignment the leader sent, slices included) and the
  partitions' frontiers, without a rebalance. Its fetches of shared topics get no records until then, and should
  the recovery fail, its commits are refused retriably (:attr:`Member.unreadable`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...accesslog import get_logger
from ...core.exchange import ConnectionInfo, Exchange, Signal
from ...wire.api_keys import ApiKey
from ...wire.errors import CodecError
from ...wire.messages import response_codec
from ...wire.model import Message, TopicPartition
from ...wire.views import MessageResponse, ResponseView, local_response
from . import heartbeats, marker
from .frontier import Frontier, decode_metadata, encode_metadata, slice_group
from .group_calls import GroupCall
from .keys import WHOLE, Slice
from .members import COORDINATOR_NOT_AVAILABLE, Member, PartitionState, learnt, member_key, read_back, read_state
from .reads import FrontierRead
from .state import SharingState

log = get_logger("sluice.sharing")

COORDINATOR_LOAD_IN_PROGRESS = 14


def _member(p: SharingState, ex: Exchange, info: ConnectionInfo, group: str, member_id: str) -> Member | None:
    """The member a group's offset request speaks for: a configured standalone consumer, or the group member
    under this key (made if a member id says it is one, its slices then recovered)."""
    key = member_key(ex)
    m = p.members.get(key)
    if p.standalone_for(ex.client_id):
        m = p.members.standalone(key)
        m.group = group
        return m
    if m is None and not member_id:
        return None
    m, collision = p.members.attach(key, info.conn_id, group, member_id, p.clock())
    if collision:
        return None
    if not m.known and m.recovering is None and member_id and m.kip848 is None:
        recover(p, m)  # a KIP-848 member's are learnt from its heartbeats (heartbeats.py)
    return m


@dataclass(slots=True)
class OffsetTicket:
    member: Member
    group: str
    wanted: dict[TopicPartition, Slice]
    read: FrontierRead | None = None
    #: OffsetCommit: per partition, the offset and metadata the client committed
    commits: dict[TopicPartition, tuple[int, str | None]] = field(default_factory=dict)
    #: OffsetCommit: the slices' positions (slice group -> partition -> offset and metadata), committed once the
    #: group's commit of their partition is in (:func:`offset_commit_response`)
    slices: dict[str, dict[TopicPartition, tuple[int, str | None]]] = field(default_factory=dict)
    #: OffsetCommit: the partitions to read again once the commits are in (:func:`_raise_stable`): those whose stable
    #: offset went on below the member's own position (another slice's position, as read, held it back), and those
    #: whose slice's position is committed after the group's (another member's read may have missed it)
    recheck: dict[TopicPartition, Slice] = field(default_factory=dict)


def _name(p: SharingState, t: Message) -> str | None:
    """A request's or response's topic by name: OffsetFetch and OffsetCommit v10+ (Kafka 4.2+, KIP-848) name topics
    by id only, resolved like Fetch v13+'s through the topic names Sluice knows or looks up (the answer keeps the
    form the client used)."""
    return t.name if "name" in t.fields() else p.names.get(bytes(t.topic_id))


def _wait_for_names(p: SharingState, ex: Exchange, topics: list[Message] | None) -> Signal | None:
    """A Signal settled once the names of the topic ids among ``topics`` are known (or given up on), set as the
    request's wait; None when nothing is missing (names, or v9- topics by name)."""
    ids = [bytes(t.topic_id) for t in topics or () if "name" not in t.fields()]
    missing = p.names.missing(ids)
    if not missing:
        return None
    done = p.names.pending(missing)
    ex.pending = done
    return done


def _slice_for(p: SharingState, m: Member, tp: TopicPartition) -> Slice | None:
    if m.standalone:
        s = p.standalone_slice(m.key[1], tp)
        if s is not None and m.partitions is not None and tp not in m.partitions:
            m.partitions[tp] = PartitionState(s)
        return s
    state = (m.partitions or {}).get(tp)
    return state.slice if state is not None else None


# ------------------------------------------------------------------------------------------ OffsetFetch


def _requested(body: Message) -> list[tuple[str, list[Message] | None]]:
    """(group, topics or None for all) of an OffsetFetch request, any version."""
    if "groups" in body.fields():
        return [(g.group_id, g.topics) for g in body.groups]
    return [(body.group_id, body.topics)]


def offset_fetch_request(p: SharingState, ex: Exchange, info: ConnectionInfo) -> OffsetTicket | None:
    body = ex.body
    requested = _requested(body)
    if len(requested) != 1:
        return None  # several groups in one request: an admin tool, not a member
    group, topics = requested[0]
    member_id = body.groups[0].get("member_id") or "" if "groups" in body.fields() else ""
    m = _member(p, ex, info, group, member_id)
    if m is None:
        return None
    if not m.known:
        if m.recovering is None:
            return None
        ex.pending = m.recovering  # recovered first, then read as any member's
        return OffsetTicket(m, group, {})
    if _wait_for_names(p, ex, topics) is not None:
        return OffsetTicket(m, group, {})  # planned when the names are known
    return _plan_fetch(p, ex, m, group, topics)


def _plan_fetch(p: SharingState, ex: Exchange, m: Member, group: str,
                topics: list[Message] | None) -> OffsetTicket | None:
    if topics is None:
        wanted_tps = list(m.partitions or {})
    else:
        wanted_tps = [(name, part) for t in topics if (name := _name(p, t)) for part in t.partition_indexes]
    wanted = {tp: s for tp in wanted_tps if (s := _slice_for(p, m, tp)) is not None}
    if not wanted or _unshared(p, group, wanted):
        return None
    if (writing := _writing_any(m, wanted)) is not None:
        ex.pending = writing  # the slice's position is read once the commit of it in flight is in
        return OffsetTicket(m, group, {})
    ticket = OffsetTicket(m, group, wanted)
    ticket.read = FrontierRead(p, group, wanted, _layouts(m, wanted))
    ex.pending = ticket.read
    ex.collect = True  # the answer is edited: each partition's slice start
    return ticket


def _unshared(p: SharingState, group: str, wanted: dict[TopicPartition, Slice]) -> bool:
    """A group whose slice groups Sluice may not use (:mod:`.access`) and a member holding its partitions whole:
    its offsets are the group's own, relayed as they are (the slices' positions cannot be read: a partition shared
    before the refusal starts from the group's commit, the slices' stable offset, at least once). A member still
    holding a slice is refused retriably until it has rejoined (the commit of one slice's position as the group's
    could pass records of the other slices no one consumed)."""
    return p.access.refused(group) is not None and all(s.whole for s in wanted.values())


def _writing_any(m: Member, tps: Any) -> Signal | None:
    """A commit of the slice of one of ``tps`` in flight from this Sluice (:attr:`PartitionState.in_flight`)."""
    for tp in tps:
        state = (m.partitions or {}).get(tp)
        if state is not None and (writing := state.in_flight) is not None:
            return writing
    return None


def _layouts(m: Member, tps: Any) -> dict[TopicPartition, set[int]]:
    out: dict[TopicPartition, set[int]] = {}
    for tp in tps:
        state = (m.partitions or {}).get(tp) or m.released.get(tp)
        if state is not None and state.frontier is not None:
            out[tp] = state.frontier.layouts
    return out


def offset_fetch_resume(p: SharingState, ex: Exchange, info: ConnectionInfo, ticket: OffsetTicket) -> Any:
    if ticket.read is None:  # waited for the member's recovery or for topic names
        if not ticket.member.known:
            return None
        group, topics = _requested(ex.body)[0]
        if _wait_for_names(p, ex, topics) is not None:
            return ticket
        return _plan_fetch(p, ex, ticket.member, group, topics)
    return ticket


def offset_fetch_response(p: SharingState, ex: Exchange, response: ResponseView, info: ConnectionInfo,
                          ticket: OffsetTicket) -> None:
    assert isinstance(response, MessageResponse)
    body = response.body
    read = ticket.read
    if read is None:
        return
    m = ticket.member
    if read.error is not None:
        log.warning("sharing_offsets_unavailable", group=ticket.group, client_id=ex.client_id, error=read.error)
        if "groups" in body.fields():
            for g in body.groups:
                g.error_code = COORDINATOR_LOAD_IN_PROGRESS
        else:
            body.error_code = COORDINATOR_LOAD_IN_PROGRESS
            for t in body.topics:
                for part in t.partitions:
                    part.error_code = COORDINATOR_LOAD_IN_PROGRESS
        response.changed = True
        return
    topics = body.groups[0].topics if "groups" in body.fields() else body.topics
    for t in topics:
        name = _name(p, t)
        for part in t.partitions:
            tp = (name or "", part.partition_index)
            s = ticket.wanted.get(tp)
            if s is None or part.error_code:
                continue
            state = read_back(s, read.frontiers[tp], (m.partitions or {}).get(tp))
            start = state.start
            if m.partitions is not None:
                m.partitions[tp] = state
            plain = read.plain[tp]
            if s.whole:
                meta = decode_metadata(plain.metadata)
                client_md = meta[1] if meta is not None else plain.metadata
            else:
                own = read.read[tp].get(s)
                client_md = own.metadata if own is not None and own.offset >= 0 else plain_client(plain.metadata)
            part.committed_offset = start
            if "committed_leader_epoch" in part.fields():
                part.committed_leader_epoch = plain.leader_epoch if start == plain.offset else -1
            part.metadata = client_md if client_md is not None else ""
    response.changed = True


def plain_client(metadata: str | None) -> str | None:
    meta = decode_metadata(metadata)
    return meta[1] if meta is not None else metadata


# ----------------------------------------------------------------------------------------- OffsetCommit


def offset_commit_request(p: SharingState, ex: Exchange, info: ConnectionInfo) -> OffsetTicket | None:
    body = ex.body
    m = _member(p, ex, info, body.group_id, body.member_id)
    if m is None:
        return None
    if not m.known:
        if m.recovering is None:
            _refuse_unreadable(ex, m)
            return None
        ex.pending = m.recovering
        return OffsetTicket(m, body.group_id, {})
    if _wait_for_names(p, ex, body.topics) is not None:
        return OffsetTicket(m, body.group_id, {})  # planned when the names are known
    return _plan_commit(p, ex, m, body)


def _plan_commit(p: SharingState, ex: Exchange, m: Member, body: Message) -> OffsetTicket | None:
    group = body.group_id
    commits: dict[TopicPartition, tuple[int, str | None]] = {}
    wanted: dict[TopicPartition, Slice] = {}
    own: dict[str, dict[TopicPartition, tuple[int, str | None]]] = {}
    for t in body.topics:
        name = _name(p, t)
        if not name:
            continue
        for part in t.partitions:
            tp = (name, part.partition_index)
            s = _slice_for(p, m, tp)
            state = (m.partitions or {}).get(tp)
            if s is None:
                # A partition the member no longer holds: its client commits what it read in an earlier
                # generation (kafka-go). Relayed as it is, it would be the group's commit, the stable offset of
                # every slice; it is the position of the slice the member held
                state = m.released.get(tp)
                if state is None:
                    continue
                s = state.slice
            if s.whole and state is not None and state.frontier is not None and not state.frontier.positions:
                continue  # a whole partition no slice ever consumed: the client's commit is the plain one
            if state is not None and (writing := state.in_flight) is not None:
                # a commit of this slice is in flight from this Sluice (the client's previous one, or
                # offsets.advance): this one is sent after it, so the later position lands last
                ex.pending = writing
                return OffsetTicket(m, group, {})
            wanted[tp] = s
            offset = part.committed_offset
            if state is not None and offset >= 0:
                offset = state.gaps.position(offset)
            commits[tp] = (offset, part.committed_metadata)
            start = state.start if state is not None else -1
            if not s.whole and offset > start and offset >= 0:
                own.setdefault(slice_group(group, s), {})[tp] = commits[tp]
    if not wanted or _unshared(p, group, wanted):
        return None
    ticket = OffsetTicket(m, group, wanted, commits=commits, slices=own)
    ticket.read = FrontierRead(p, group, wanted, _layouts(m, wanted))
    ex.pending = ticket.read
    return ticket


def _writing(state: PartitionState, commit: Signal) -> None:
    """``commit`` of the slice's position is in flight: the next one waits for it (:attr:`PartitionState.writing`)."""
    state.writing = commit

    def done() -> None:
        if state.writing is commit:
            state.writing = None

    commit.on_settled(done)


def _refuse_commit(ex: Exchange) -> None:
    """Answer the OffsetCommit ``ex`` with COORDINATOR_NOT_AVAILABLE for every partition (retriable: the client
    finds its coordinator and commits again); nothing is written."""
    h, body = ex.header, ex.body
    answer = response_codec(ApiKey.OFFSET_COMMIT, h.api_version).default().replace(topics=[
        Message(**{k: t.fields()[k] for k in ("name", "topic_id") if k in t.fields()},
                partitions=[Message(partition_index=part.partition_index, error_code=COORDINATOR_NOT_AVAILABLE)
                            for part in t.partitions]) for t in body.topics])
    ex.answer = local_response(ApiKey.OFFSET_COMMIT, h.api_version, h.correlation_id, answer)


def _refuse_unreadable(ex: Exchange, m: Member) -> None:
    """The commit of a member this Sluice could not learn (:attr:`Member.unreadable`) is refused retriably: relayed as
    its client sent it, it would be the group's commit at the member's own position, and every other slice's records
    below it would count as done (lost to the next holder of those keys after a rebalance). A member Sluice found
    holding no slice (not in the group, the group rebalancing) has its commit relayed: the coordinator answers it."""
    if m.unreadable is None:
        return
    log.info("sharing_commit_refused", group=m.group, client_id=m.key[1], error=m.unreadable)
    _refuse_commit(ex)


def offset_commit_resume(p: SharingState, ex: Exchange, info: ConnectionInfo, ticket: OffsetTicket) -> Any:
    body = ex.body
    if ticket.read is None:  # waited for the member's recovery or for topic names
        if not ticket.member.known:
            _refuse_unreadable(ex, ticket.member)
            return None
        if _wait_for_names(p, ex, body.topics) is not None:
            return ticket
        return _plan_commit(p, ex, ticket.member, body)
    read = ticket.read
    if read.error is not None:
        log.warning("sharing_commit_failed", group=ticket.group, client_id=ex.client_id, error=read.error)
        _refuse_commit(ex)
        return None
    lag = p.stable_lag.setdefault(ticket.group, {})
    topics = []
    for t in body.topics:
        parts = []
        name = _name(p, t)
        for part in t.partitions:
            tp = (name or "", part.partition_index)
            s = ticket.wanted.get(tp)
            if s is not None:
                offset, client_md = ticket.commits[tp]
                f: Frontier = read.frontiers[tp]
                if offset >= 0:
                    f = f.with_position(s, offset)
                stable = f.stable()
                if not s.whole and (stable < offset or any(tp in c for c in ticket.slices.values())):
                    # read again once the slice's commit is in: another slice held the stable offset back, or this
                    # slice's commit lands after the group's and another member's read may have missed it
                    ticket.recheck[tp] = s
                lag[tp] = max(0, f.furthest() - stable)
                metadata = encode_metadata(f.worth_keeping(s.count), client_md if s.whole else None,
                                           p.settings.metadata_max_bytes)
                fields = {"committed_offset": stable, "committed_metadata": metadata}
                if "committed_leader_epoch" in part.fields():
                    fields["committed_leader_epoch"] = -1
                part = part.replace(**fields)
            parts.append(part)
        topics.append(t.replace(partitions=parts))
    ex.body = body.replace(topics=topics)
    p.metrics.sharing_stable_lag.labels(ticket.group).set(sum(lag.values()))
    if ticket.slices or ticket.recheck:
        ex.collect = True  # the answer says whether the group's commit is in: then the slices' are made
        return ticket
    return None


def offset_commit_response(p: SharingState, ex: Exchange, response: ResponseView, info: ConnectionInfo,
                           ticket: OffsetTicket) -> None:
    """The member's commit is answered. The partitions the coordinator took get their slices' positions committed
    (:func:`_commit_slices`); those it refused (the member fenced: its error goes to the client as the coordinator
    gave it) keep every position as it was. Then the partitions whose stable offset another slice held back are
    read again (:func:`_raise_stable`)."""
    assert isinstance(response, MessageResponse)
    done: set[TopicPartition] = set()
    refused: dict[str, int] = {}
    for t in response.body.topics:
        name = _name(p, t) or ""
        for part in t.partitions:
            if part.error_code == 0:
                done.add((name, part.partition_index))
            elif (name, part.partition_index) in ticket.wanted:
                refused[f"{name}-{part.partition_index}"] = part.error_code
    body = ex.body
    member = (body.get("generation_id_or_member_epoch", -1), body.member_id, body.get("group_instance_id"))
    m = ticket.member
    if refused:
        log.debug("sharing_commit_refused", group=ticket.group, client_id=ex.client_id, errors=refused)
        for error in set(refused.values()):
            m.fence(error, member[0])
    slices = {tp: s for tp, s in ticket.recheck.items() if tp in done}

    def recheck() -> None:
        if slices:
            _raise_stable(p, ticket.group, member, slices, _layouts(m, slices), STABLE_RECHECKS, m.kip848 is not None,
                          _owing(m, slices))

    commits = {g: c for g, parts in ticket.slices.items() if (c := {tp: v for tp, v in parts.items() if tp in done})}
    if commits:
        _commit_slices(p, m, commits, recheck)
    else:
        recheck()


def _commit_slices(p: SharingState, m: Member, commits: dict[str, dict[TopicPartition, tuple[int, str | None]]],
                   then: Callable[[], None]) -> None:
    """Commit slices' positions (simple commits in their slice groups), each after the commit of the same slice in
    flight from this Sluice (a lower position landing last would deliver committed records again); ``then`` once they
    are in. A failure leaves the slice's position behind the group's commit: its records since come again (at
    least once) to a next holder of the slice, and the member's next commit carries it on, or, a member with nothing
    more to commit (its client was answered as committed), its next idle fetch (:attr:`PartitionState.position_owed`,
    :func:`advance`): else the slice's position, and with it the stable offset, stayed short for good."""
    states = [(state, offset) for group, parts in commits.items() for tp, (offset, _) in parts.items()
              if (state := (m.partitions or {}).get(tp)) is not None and slice_group(m.group, state.slice) == group]
    waits = list({id(w): w for st, _ in states if (w := st.in_flight) is not None}.values())
    done = Signal()
    for state, _ in states:
        _writing(state, done)

    def submit() -> None:
        if done.settled or any(not w.settled for w in waits):
            return
        call = p.submit(GroupCall(commits=commits))

        def committed() -> None:
            if call.ok:
                for state, offset in states:
                    state.committed = max(state.committed, offset)
            else:
                log.warning("sharing_commit_failed", group=m.group, client_id=m.key[1],
                            error=call.error or str(call.committed))
                for state, offset in states:
                    state.position_owed = max(state.position_owed, offset)
            done.settle()
            if call.ok:
                then()

        call.on_settled(committed)

    for w in waits:
        w.on_settled(submit)
    if not waits:
        submit()


#: how many times one commit's partitions are read again and raised (each round raises them, or ends it)
STABLE_RECHECKS = 3


def _owing(m: Member, tps: Any) -> Callable[[bool], None]:
    """For :func:`_raise_stable`'s ``settled``: the partitions ``tps`` of ``m`` are owed a raise when it failed
    (:attr:`PartitionState.raise_owed`), and no longer once one is in."""
    states = [state for tp in tps if (state := (m.partitions or {}).get(tp)) is not None]

    def settled(ok: bool) -> None:
        for state in states:
            state.raise_owed = not ok

    return settled


def _raise_stable(p: SharingState, group: str, member: tuple[int, str, str | None], slices: dict[TopicPartition, Slice],
                  layouts: dict[TopicPartition, set[int]], rounds: int, kip848: bool,
                  settled: Callable[[bool], None]) -> None:
    """Two members of a partition committing at once each commit their slice, then read the other's: one of them
    may read the other's position from before its commit, and the group's commits of the two can land in either
    order, so the lower stable offset, from the stale read, may be the one left in the group: nothing corrects it
    until a member of the partition commits again, never at a partition's end (the group's lag stays above 0). So
    after its commit is in, a member whose stable offset another slice held back reads the group's commit and the
    slices' positions again, and when the stable offset is above what the group holds, Sluice commits it, as that
    member (its generation fences it like the member's own commit); then reads again, up to ``rounds`` times.
    Whichever group commit lands last, its member reads after it: the group is left at the stable offset of every
    slice commit made before that read, and a slice commit made after it is followed by its own member's commit and
    read. A failure ends it, and ``settled`` is told whether it ended so (False) or with the group at the stable
    offset (True): a member with nothing more to commit has its raise made again by :func:`advance`; after a
    rebalance the next generation commits anew."""
    read = FrontierRead(p, group, slices, layouts)

    def reread() -> None:
        if read.error is not None:
            log.debug("sharing_stable_recheck_failed", group=group, error=read.error)
            settled(False)
            return
        commits: dict[TopicPartition, tuple[int, str | None]] = {}
        for tp, s in slices.items():
            f = read.frontiers[tp]
            stable = f.stable()
            if stable > f.base:
                commits[tp] = (stable, encode_metadata(f.worth_keeping(s.count), None, p.settings.metadata_max_bytes))
        if not commits:
            settled(True)
            return
        call = p.submit(GroupCall(commits={group: commits}, as_member={group: member},
                                  consumer_protocol={group} if kip848 else set()))
        p.metrics.sharing_stable_raised.inc(len(commits))
        log.debug("sharing_stable_offset_raised", group=group,
                 partitions={f"{t}-{part}": [read.frontiers[(t, part)].base, o]
                             for (t, part), (o, _) in sorted(commits.items())})

        def committed() -> None:
            if call.ok and rounds > 1:
                _raise_stable(p, group, member, slices, layouts, rounds - 1, kip848, settled)
            elif not call.ok:
                log.debug("sharing_stable_recheck_failed", group=group, error=call.error or str(call.committed))
                settled(False)
            else:
                settled(True)

        call.on_settled(committed)

    read.on_settled(reread)


#: a slice's position is committed on past a gap by Sluice itself (:func:`advance`) at most this often
ADVANCE_INTERVAL_S = 1.0


def advance(p: SharingState, m: Member, tp: TopicPartition, state: PartitionState) -> None:
    """The member's fetch of ``tp`` got nothing of its slice, and Sluice read on past the slice's committed position
    with nothing for it there (a gap, :mod:`.cursor`): Sluice commits the slice's position on to the gap's end and
    raises the group's stable offset as the member (:func:`_raise_stable`). A member whose slice has no record in a
    partition's tail has nothing new to commit ("last record + 1" clients never commit again), and its slice's
    position would hold the stable offset, which lag tools and a consumer without Sluice read, short of the end for
    good. The gap holds nothing the member has yet to be handed: nothing is committed that it had to consume. At
    most every :data:`ADVANCE_INTERVAL_S`, one at a time per partition. A fetch that finds the slice's position in
    but a raise of the stable offset over the partition owed (:attr:`PartitionState.raise_owed`: the last one
    failed) raises it again: the member has nothing more to commit, so nothing else would. Likewise a position of
    the member's own commit whose commit in the slice's group failed (:attr:`PartitionState.position_owed`: the
    coordinator took the member's commit, so its records below it were consumed) is committed, on past the gap
    after it if there is one."""
    s = state.slice
    now = p.clock()
    if s.whole or not m.group or state.committed < 0 or now < state.advance_after \
            or state.in_flight is not None or (m.partitions or {}).get(tp) is not state or m.fenced:
        # (a state replaced since the fetch: its slice's commits go through the new one; a member fenced:
        # Member.fenced)
        return
    target = state.gaps.after(max(state.committed, state.position_owed))[0]
    if target <= state.committed and not state.raise_owed:
        return
    state.advance_after = now + ADVANCE_INTERVAL_S
    member = (m.held, m.member_id, None) if not m.standalone else (-1, "", None)

    def raise_stable() -> None:
        state.raise_owed = False  # one raise at a time: a failure owes it again
        _raise_stable(p, m.group, member, {tp: s}, _layouts(m, [tp]), STABLE_RECHECKS, m.kip848 is not None,
                      _owing(m, [tp]))

    if target <= state.committed:
        raise_stable()  # the slice's position is in, the group's stable offset not yet: a raise failed
        return
    call = p.submit(GroupCall(commits={slice_group(m.group, s): {tp: (target, None)}}))
    _writing(state, call)
    p.metrics.sharing_read_ahead.labels("advanced").inc()

    def committed() -> None:
        if not call.ok:
            # the slice's position is still the group's last: a later idle fetch commits it on again (taken as
            # committed when sent, a failure left the slice short of the partition's end for good)
            log.debug("sharing_advance_failed", group=m.group, error=call.error or str(call.committed))
            return
        state.committed = max(state.committed, target)
        raise_stable()

    call.on_settled(committed)


# ------------------------------------------------------------------------------------------------ recovery


def recover(p: SharingState, m: Member) -> Signal:
    """Learn ``m``'s slices and frontiers back from the group (after a Sluice restart): DescribeGroups for its
    assignment as the leader sent it (slices included), then the frontiers of its shared partitions. A KIP-848
    member (its group described by ConsumerGroupDescribe; a classic group is not found there) is learnt from its
    description instead (:func:`.heartbeats.recovered`)."""
    done = m.recovering = Signal()
    m.unreadable = None
    call = p.submit(GroupCall(describe={m.group}, describe_consumer={m.group}))

    def described() -> None:
        if m.recovering is not done:
            done.settle()
            return
        if call.error is not None:
            learnt(m, call.error)
        consumer = call.described_consumer.get(m.group) if call.error is None else None
        if consumer is not None and not consumer.error_code \
                and any(x.member_id == m.member_id for x in consumer.members):
            read_frontiers(heartbeats.recovered(p, m, consumer))
            return
        entry = call.described.get(m.group) if call.error is None else None
        found = None
        if entry is not None:
            found = next((x for x in entry.members if x.member_id == m.member_id), None)
        if found is None or not found.member_assignment:
            # not in the group (any more), or the group is rebalancing: its SyncGroup will say
            m.recovering = None
            done.settle()
            return
        try:
            _, marked = marker.strip_subscription(bytes(found.member_metadata))
            core, slices = marker.strip_assignment(bytes(found.member_assignment))
            _, _, parts = marker.assigned(core)
        except CodecError as e:
            p.not_shared("bad_assignment", m.key[1], m.group, detail=f"recovery: {e}")
            m.recovering = None
            done.settle()
            return
        assert entry is not None
        m.protocol = entry.protocol_data or ""
        m.marked = marked or frozenset()
        handed = {(t, part): (slices or {}).get((t, part), WHOLE)
                  for t, ps in parts.items() if t in m.marked and p.shareable(t) for part in ps}
        read_frontiers(handed)

    def read_frontiers(handed: dict[TopicPartition, Slice]) -> None:
        if not handed:
            m.partitions = {}
            m.recovering = None
            done.settle()
            return
        read = FrontierRead(p, m.group, handed)

        def frontiers() -> None:
            if m.recovering is done:
                learnt(m, read.error)
            if m.recovering is done and read.error is None:
                # each slice's position known as read (read_state), as after an OffsetFetch: left unknown, an idle
                # slice was never committed on (advance) after a restart, and a member with nothing more to commit
                # left the stable offset short of the partition's end for good
                m.partitions = {tp: read_state(s, read.frontiers[tp]) for tp, s in handed.items()}
                # a KIP-848 member comes back this way too when the broker handed it partitions while its Sluice
                # was down (fenced past its session, it joined again): its OffsetFetch, not its heartbeat, says so
                log.info("sharing_member_recovered", group=m.group, member_id=m.member_id, client_id=m.key[1],
                         protocol="consumer" if m.kip848 is not None else "classic",
                         partitions={f"{t}-{part}": str(s) for (t, part), s in sorted(handed.items())})
                p.update_gauges(m.group)
            if m.recovering is done:
                m.recovering = None
            done.settle()

        read.on_settled(frontiers)

    call.on_settled(described)
    return done
