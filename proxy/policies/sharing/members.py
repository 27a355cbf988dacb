"""Which client connection is which group member, for one Sluice: the registry cooperative consumption keeps.

A consumer's fetches go to partition leaders, on other connections than its group coordinator's, and an
unmodified client says who it is only by its ``client.id`` and its address. So a member is keyed by
(client host, client.id): its coordinator connection's group requests (JoinGroup, SyncGroup, Heartbeat,
OffsetCommit, OffsetFetch) tell the registry its group, member id and slices; its fetch connections look it up by
the same key. Consumers that share one Sluice need distinct client ids (the Java client's default,
"consumer-<group>-<n>", is distinct within one process only; librdkafka's "rdkafka" never is): two live
coordinator connections with one key and different members are a *collision* (:meth:`Members.attach`), and such a
key gets no slices (its fetches cannot be told apart), instead of wrong filtering.

A member whose coordinator connection closed stays known (its fetch connections may live on, and a reconnecting
client names the same member id) until :data:`FORGET_AFTER_S` without one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...accesslog import get_logger
from ...core.exchange import Exchange, Signal
from ...wire.model import TopicPartition
from .cursor import Gaps
from .frontier import DoneTable, Frontier
from .keys import Slice

MemberKey = tuple[str, str]  # (client host, client.id)
#: a partition named by its topic's id, as ConsumerGroupHeartbeat names it
IdPartition = tuple[bytes, int]


def member_key(ex: Exchange) -> MemberKey:
    """Which consumer a request comes from: its connection's client host and its client.id (unmodified clients
    say nothing else about themselves, and a consumer fetches on other connections than its coordinator's)."""
    return ex.client_host, ex.client_id or ""
#: a member with no coordinator connection for this long is forgotten (its slices are learnt again if it returns)
FORGET_AFTER_S = 600.0
#: the errors a coordinator answers a member's group request with when it no longer takes it as a member of the
#: generation or epoch the request named: ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS,
#: FENCED_INSTANCE_ID, FENCED_MEMBER_EPOCH, STALE_MEMBER_EPOCH (a classic group's Heartbeat, JoinGroup, SyncGroup,
#: OffsetCommit: ClassicGroup.validateOffsetCommit and GroupMetadataManager's classic paths; a KIP-848 group's
#: ConsumerGroupHeartbeat and OffsetCommit: GroupMetadataManager.consumerGroupHeartbeat,
#: ConsumerGroup.validateOffsetCommit)
FENCED = frozenset({22, 25, 27, 82, 110, 113})
#: the error Sluice answers a group request with when its own group call failed (a client retries it, finding its
#: coordinator again): a commit it could not merge (offsets), a KIP-848 heartbeat it could not place (heartbeats)
COORDINATOR_NOT_AVAILABLE = 15


@dataclass(slots=True)
class PartitionState:
    """What a member's Sluice knows of one partition it holds."""

    slice: Slice
    #: what was known consumed when the slice started (None: not read yet), and its committed-work filter
    frontier: Frontier | None = None
    table: DoneTable | None = None
    #: where the slice started (the position Sluice answered the client's OffsetFetch with)
    start: int = -1
    #: offsets read that hold nothing it has yet to be handed: where its fetches start and its commits land
    #: (:mod:`.cursor`)
    gaps: Gaps = field(default_factory=Gaps)
    #: the slice's position as this Sluice last committed or read it (-1: not known), the
    #: commit of it in flight from this Sluice (one at a time: the next waits, so a lower one never lands last), and
    #: when Sluice may commit it on past a gap itself next (:func:`.offsets.advance`)
    committed: int = -1
    writing: Signal | None = None
    advance_after: float = 0.0
    #: a raise of the group's stable offset over this partition failed (:func:`.offsets._raise_stable`): its next
    #: idle fetch raises it again (:func:`.offsets.advance`)
    raise_owed: bool = False
    #: the highest position the coordinator took in the member's own commit (the group's, at the stable offset)
    #: whose commit in the slice's group failed (:func:`.offsets._commit_slices`; -1: none): its next idle fetch
    #: commits it (:func:`.offsets.advance`), as its client, answered as committed, may commit nothing more
    position_owed: int = -1
    #: the id of the topic its offsets belong to (KIP-516; b"": not known yet): what Sluice read of the partition's
    #: content (its gaps, the committed-work filter, the positions) holds for that topic only (:meth:`belongs_to`)
    topic_id: bytes = b""
    #: ids it belonged to before: a broker still answering for one (the deletion not applied there yet) does not
    #: take the state back to it
    retired: list[bytes] = field(default_factory=list)

    def belongs_to(self, topic_id: bytes) -> None:
        """The partition is one of topic ``topic_id``: a broker answered a Fetch of it so. A topic deleted and
        created again under its name is a new topic with a new id (KIP-516), its offsets counted from 0 again, and
        Kafka deletes every group's committed offsets of the old one (OffsetMetadataManager.onPartitionsDeleted).
        So under a new id the slice stays and all Sluice read of the old topic goes: its gaps would move a fetch of
        the new topic past the new topic's records, and its committed-work filter would drop them. The slice's
        position is then not known, so Sluice commits none on itself (:func:`.offsets.advance`) until the member
        commits. A fetch naming an id other than the state's is not moved meanwhile (:meth:`.policy.Sharing._held`).
        """
        if topic_id == self.topic_id or topic_id in self.retired:
            return
        if self.topic_id:
            self.gaps.clear()
            self.frontier = self.table = None
            self.start = self.committed = self.position_owed = -1
            self.raise_owed = False
            self.retired.append(self.topic_id)
        self.topic_id = topic_id

    @property
    def in_flight(self) -> Signal | None:
        """The commit of this slice's position in flight from this Sluice, if one is (:attr:`writing`, unsettled)."""
        writing = self.writing
        return writing if writing is not None and not writing.settled else None


def read_state(s: Slice, f: Frontier) -> PartitionState:
    """What a member's Sluice knows of slice ``s`` from its partition's frontier as read: where it starts, its
    committed-work filter, and its position (:attr:`PartitionState.committed`: its own commit, or its start above
    it). One making for every path that reads a slice back (an OffsetFetch, a recovery after a restart, classic or
    KIP-848): a state made otherwise has no filter and an unknown position, which :func:`.offsets.advance` never
    commits on."""
    start = f.start(s)
    return PartitionState(s, f, f.done_table(s), start, committed=max(start, f.positions.get(s, -1)))


def read_back(s: Slice, f: Frontier, before: PartitionState | None) -> PartitionState:
    """:func:`read_state` of slice ``s`` from an OffsetFetch's read of the partition, with what this Sluice still
    owes over it from ``before``, its state until then: Kafka has none of that yet, and only the member's next idle
    fetch makes it (:func:`.offsets.advance`). A raise of the group's stable offset over the partition, whatever the
    slice; for the same slice, the commit of its position that the member's own commit left owed and the commit in
    flight (the next waits for it, so a lower one never lands last). The client was answered as committed at that
    owed position, so it resumes there (the answer's offset, :attr:`PartitionState.start`), as after any commit
    Kafka took; the slice's known position stays Kafka's, so the owed one is still committed."""
    state = read_state(s, f)
    if before is None:
        return state
    if before.slice == s:
        if before.position_owed > state.committed:
            known = state.committed
            state = read_state(s, f.with_position(s, before.position_owed))
            state.committed, state.position_owed = known, before.position_owed
        state.writing = before.writing
    state.raise_owed = before.raise_owed
    return state


@dataclass(slots=True)
class HeartbeatState:
    """What a KIP-848 member's Sluice knows of it: the broker's assignment, what the client owns and was given (see
    :mod:`.heartbeats`). None where not known (a Sluice that started after the member joined)."""

    #: topics its Sluice lets it share (its subscription's shareable topics), marked in its heartbeats' client id
    marked: frozenset[str] = frozenset()
    #: its subscription's shareable topics: what it is marked for while Sluice may use the group's slice groups
    #: (:mod:`.access`), kept while it is not, since a client sends its subscription only when it changes
    shareable: frozenset[str] = frozenset()
    #: the member epoch of the broker's last answer
    epoch: int = -1
    #: the broker's assignment of the member (the last one it sent)
    broker: set[IdPartition] | None = None
    #: partitions the broker took away from the member that its client may still hold: reported as owned until
    #: the client says it no longer owns them
    revoking: set[IdPartition] = field(default_factory=set)
    #: the owned partitions last reported to the broker
    reported: set[IdPartition] | None = None
    #: the client's own owned partitions (the layout's terms), as it last reported them
    owned: set[IdPartition] | None = None
    #: the assignment last handed to the client
    given: set[IdPartition] | None = None
    #: partitions whose slice changed (wider or narrower): left out of what the client is handed until it no longer
    #: owns them
    widening: set[IdPartition] = field(default_factory=set)
    #: new slices its last request claimed (no other member claimed an overlapping one): its answer may hand them
    cleared: set[IdPartition] = field(default_factory=set)
    #: a slice waits for another member to let an overlapping one go: the group is described at every heartbeat
    waiting: bool = False
    #: marked again (its group's slice groups granted since, :mod:`.access`) and not yet seen so in a description:
    #: the group is described at every heartbeat until it is, since nothing else makes it described (the group's
    #: epoch does not move) and a layout made from unmarked client ids lays out nothing
    unseen: bool = False


@dataclass(eq=False)
class Member:
    key: MemberKey
    group: str
    member_id: str = ""
    generation: int = -1
    #: the assignor the group chose (JoinGroup's protocol name)
    protocol: str = ""
    #: topics its JoinGroup marker listed (this Sluice let it share them)
    marked: frozenset[str] = frozenset()
    #: the shared-topic partitions its client holds, as handed to it (None: not known, e.g. after a restart)
    partitions: dict[TopicPartition, PartitionState] | None = None
    #: slices of partitions it held and no longer holds (from its SyncGroups, or its heartbeats as a KIP-848
    #: member): a commit of such a partition is its old slice's position (kafka-go's Reader.CommitMessages commits
    #: messages read in an earlier generation under the current one; a KIP-848 member's commit is checked for its
    #: epoch, not its partitions), never the group's stable offset
    released: dict[TopicPartition, PartitionState] = field(default_factory=dict)
    #: a classic member: per partition, every slice its client may still hold a position under (a client goes on
    #: from its position in a partition handed to it again, :mod:`.groups`): the slices of the last assignment its
    #: client was seen to take up (a Heartbeat naming that generation, :attr:`handed_at`) and of every assignment
    #: handed since, which its client may have taken up or thrown away unseen (kafka-python 3.0.12 can leave a
    #: finished JoinGroup and SyncGroup unread and join again, BaseCoordinator.join_group_async)
    may_keep: dict[TopicPartition, set[Slice]] = field(default_factory=dict)
    #: the generation of the assignment last handed to it (its SyncGroup answer)
    handed_at: int = -1
    #: coordinator connections that carried its group requests and are open
    conns: set[int] = field(default_factory=set)
    detached_since: float | None = None
    #: member ids (under this key) whose heartbeats are answered REBALANCE_IN_PROGRESS until their JoinGroup (slices
    #: changed under a partition its client keeps, or slices it was given cannot be enforced)
    rejoin: set[str] = field(default_factory=set)
    #: its fetches of shared topics get no records until it rejoins (slices it was given cannot be enforced)
    blocked: bool = False
    #: a configured standalone consumer (sharing.standalone), not a group member
    standalone: bool = False
    #: a consumer on the KIP-848 protocol (``group.protocol=consumer``): its heartbeats' state (:mod:`.heartbeats`)
    kip848: HeartbeatState | None = None
    #: the recovery of its slices from the group (after a Sluice restart), while it runs
    recovering: Signal | None = None
    #: why this Sluice's last try to learn its slices failed (a group call's error: a timeout, no DESCRIBE or READ
    #: on the group for Sluice's principal), None if it did not: while it stays unknown, its commits are refused
    #: retriably (:func:`.offsets.offset_commit_request`)
    unreadable: str | None = None
    #: the failure last logged for it (:func:`learnt`): a failure its heartbeats retry is logged once
    unreadable_said: str | None = None
    #: the generation (a KIP-848 member: epoch) at which the coordinator answered one of its group requests as
    #: fenced (:meth:`fence`): Sluice commits none of its slices on itself (:func:`.offsets.advance`) while it holds
    #: that one
    fenced_at: int | None = None

    @property
    def known(self) -> bool:
        return self.partitions is not None

    @property
    def held(self) -> int:
        """The generation its slices are of (a KIP-848 member: its member epoch, as the broker last answered it)."""
        return self.kip848.epoch if self.kip848 is not None else self.generation

    @property
    def fenced(self) -> bool:
        """Whether the coordinator fenced it in the generation (epoch) it holds: a simple commit of its slices,
        which no coordinator checks, may move a position that is another member's by now."""
        return self.fenced_at is not None and self.fenced_at == self.held

    def fence(self, error: int, at: int) -> None:
        """The coordinator answered its group request made at generation (epoch) ``at`` with ``error``: one of
        :data:`FENCED` marks it fenced there. An answer about another generation than the one it holds says
        nothing of that one (a commit made before the member's rebalance, answered after it)."""
        if error in FENCED and at == self.held:
            self.fenced_at = at

    def hold(self, partitions: dict[TopicPartition, PartitionState]) -> None:
        """The member's client now holds ``partitions``: the slices it held before and no longer does are kept as
        :attr:`released`, so a late commit of such a partition is that slice's position, never the group's."""
        before = self.partitions or {}
        self.partitions = partitions
        self.released = {tp: st for tp, st in {**self.released, **before}.items()
                         if tp not in partitions and not st.slice.whole}


class Members:
    def __init__(self) -> None:
        self.by_key: dict[MemberKey, Member] = {}
        #: opted-in keys whose fetches were withheld while no member was known: since when
        self.unknown_since: dict[MemberKey, float] = {}
        #: per key, the open coordinator connections that made group requests for it, and who each spoke for
        #: (group, member id; "" until the coordinator gave one)
        self._claims: dict[MemberKey, dict[int, tuple[str, str]]] = {}
        self._conn_keys: dict[int, set[MemberKey]] = {}

    def get(self, key: MemberKey) -> Member | None:
        return self.by_key.get(key)

    def collides(self, key: MemberKey) -> bool:
        """Whether two live consumers (or groups) speak under ``key``: a consumer has one coordinator connection
        per group, so two open ones with different members (or one still without a member id) are two."""
        claims = self._claims.get(key)
        if not claims or len(claims) < 2:
            return False
        identities = {(group, member or f"conn-{conn}") for conn, (group, member) in claims.items()}
        return len(identities) > 1

    def attach(self, key: MemberKey, conn: int, group: str, member_id: str, now: float) -> tuple[Member, bool]:
        """The member a group request on coordinator connection ``conn`` speaks for (made, or made anew when the
        group or member id changed), and whether ``key`` is in a collision (see :meth:`collides`)."""
        self._forget_stale(now)
        claims = self._claims.setdefault(key, {})
        _, known_id = claims.get(conn, ("", ""))
        claims[conn] = (group, member_id or known_id)
        self._conn_keys.setdefault(conn, set()).add(key)
        collision = self.collides(key)
        m = self.by_key.get(key)
        if m is None or (not collision and (m.group != group or (member_id and m.member_id
                                                                 and member_id != m.member_id))):
            m = self.by_key[key] = Member(key, group, member_id)
        elif member_id and not collision:
            m.member_id = member_id
        if m.group == group:
            m.conns.add(conn)
            m.detached_since = None
        self.unknown_since.pop(key, None)
        return m, collision

    def learn_member_id(self, key: MemberKey, conn: int, group: str, member_id: str) -> None:
        """The coordinator named the member id of the consumer on ``conn`` (JoinGroup's answer)."""
        claims = self._claims.get(key)
        if claims is not None and conn in claims:
            claims[conn] = (group, member_id)

    def standalone(self, key: MemberKey) -> Member:
        m = self.by_key.get(key)
        if m is None or not m.standalone:
            m = self.by_key[key] = Member(key, "", standalone=True, partitions={})
        return m

    def detach(self, conn: int, now: float) -> list[Member]:
        """Connection ``conn`` closed: the members it carried (still known, no longer live through it)."""
        out = []
        for key in self._conn_keys.pop(conn, ()):
            claims = self._claims.get(key)
            if claims is not None:
                claims.pop(conn, None)
                if not claims:
                    del self._claims[key]
            m = self.by_key.get(key)
            if m is not None and conn in m.conns:
                m.conns.discard(conn)
                if not m.conns:
                    m.detached_since = now
                out.append(m)
        return out

    def _forget_stale(self, now: float) -> None:
        stale = [k for k, m in self.by_key.items()
                 if m.detached_since is not None and now - m.detached_since > FORGET_AFTER_S]
        for k in stale:
            del self.by_key[k]

    def of_group(self, group: str) -> list[Member]:
        return [m for m in self.by_key.values() if m.group == group and not m.standalone]


log = get_logger("sluice.sharing")


def learnt(m: Member, error: str | None) -> None:
    """The outcome of a try to learn ``m``'s slices back from its group (after a Sluice restart): ``error``, why it
    failed (:attr:`Member.unreadable`), or None. Until it is learnt its fetches of shared topics get no records and
    its commits are refused retriably, and the ``kafka_not_authorized`` behind a refusal is said once per process,
    not per member: so each member's failure is logged (``sharing_member_unreadable``), once per member and error,
    not at each heartbeat's try."""
    m.unreadable = error
    if error is not None and error != m.unreadable_said:
        log.warning("sharing_member_unreadable", group=m.group, member_id=m.member_id, client_id=m.key[1],
                    error=error)
    m.unreadable_said = error
