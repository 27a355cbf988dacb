"""Cooperative consumption as a policy on the chain: consumers share a partition by key-hash slice,
for unmodified clients, with commits that stay safe. The pieces, one concept each:

- :mod:`.keys`: Kafka's key hash (murmur2) and the even slices of the hash space;
- :mod:`.assignor`: the key-range assignor over the leader client's assignment;
- :mod:`.marker`: what travels inside the group protocol (the JoinGroup marker, the SyncGroup slices);
- :mod:`.groups`: JoinGroup / SyncGroup / Heartbeat through Sluice (the classic protocol);
- :mod:`.layout`, :mod:`.heartbeats`: KIP-848 groups: the slices from the group's description, and
  ConsumerGroupHeartbeat rewritten both ways;
- :mod:`.frontier`, :mod:`.reads`, :mod:`.offsets`: where positions are stored (one group per slice), the stable
  offset, the committed-work filter, OffsetFetch / OffsetCommit, recovery after a restart;
- :mod:`.members`: which connection is which member (client host + client.id);
- :mod:`.fetch`: the records each member gets, and the decoded-batch cache;
- :mod:`.cursor`: where each member's fetches start (past what Sluice read with nothing for it), in and out of
  fetch sessions, and a fetch sent again within the client's wait.

The three switches (several restrictions, all must allow): ``sharing.enabled`` (this Sluice), ``sharing.topics``
(per topic, resolved like ``[[throttle.topics]]``), ``sharing.clients`` (per consumer, client.id globs). A member
is marked only when all three allow it, and the leader's Sluice shares a topic only if its own switches allow it
too. Consumers that use ``assign()`` get their slices from ``[[sharing.standalone]]``.

Chain position: after the throttle and before terminate (proxy/policies/__init__.py), so responses are filtered
right after terminate builds the client's response, and the throttle and the KIP-74 budgets then apply to what
the member actually receives.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ...core.exchange import ConnectionInfo, Exchange, Signal
from ...core.policy import Policy, Services, reads
from ...wire.api_keys import ApiKey
from ...wire.fetch_fast import (
    FetchPartition,
    FetchResponseView,
    FetchTopic,
    build_tags,
    has_diverging_epoch,
    parse_tags,
)
from ...wire.fetch_layout import DIVERGING_EPOCH_TAG, FIRST_TOPIC_ID, PartitionKey
from ...wire.fetch_request_fast import FetchEdit, sessionless
from ...wire.messages import decoded_versions
from ...wire.model import TopicPartition
from ...wire.views import FetchResponse, ResponseView
from . import groups, heartbeats, offsets
from .access import Checking
from .cursor import ClientFetches, Gaps, Sent, slice_end
from .fetch import filter_records
from .members import Member, PartitionState, member_key
from .metrics import SharingMetrics
from .settings import SharingSettings
from .state import SharingState

_GROUP_APIS = frozenset({ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP})
#: a withheld fetch's client is not read from again for up to this long (its max_wait_ms if shorter), instead of
#: fetching again at once in a loop (as throttle.py paces fetchers that got only throttled partitions)
_WITHHELD_PAUSE_S = 0.5
#: a fetch that got nothing for the member is sent again only with at least this much of the client's wait left,
#: and only if the broker held it at least this share of the client's wait: one answered at once (records keep
#: coming) is the client's to fetch again, as soon as Sluice would, without Sluice's loop doing each round
_AGAIN_MIN_WAIT_MS = 5
_AGAIN_IF_HELD = 0.1
#: OFFSET_OUT_OF_RANGE (Kafka's Errors): the broker's answer to a fetch offset it has no records at
_OFFSET_OUT_OF_RANGE = 1
#: a fetched partition's topic is not known to the broker: UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_TOPIC_ID (Errors.java)
_TOPIC_GONE = frozenset({3, 100})


@dataclass(slots=True)
class FetchTicket:
    member: Member | None
    withhold: bool
    #: the read-ahead cursor (:mod:`.cursor`): the member's filtered partitions by the request's keys (their
    #: gaps), what the request (as last sent) asked of them, the request as this policy left it, its connection's
    #: fetches
    states: dict[PartitionKey, tuple[TopicPartition, PartitionState]] = field(default_factory=dict)
    held: dict[PartitionKey, Gaps] = field(default_factory=dict)
    sent: Sent | None = None
    edit: FetchEdit | None = None
    fetches: ClientFetches | None = None
    #: the partitions of the answers to earlier attempts (the request was sent again), as the member would have had
    #: them: an answer in the client's fetch session leaves out what did not change since, which is added back
    carried: dict[PartitionKey, tuple[FetchTopic, FetchPartition]] = field(default_factory=dict)
    #: when the attempt being answered went upstream (the first: when the request came; -1: not known yet)
    sent_at: float = -1.0


class Sharing(SharingState, Policy):
    name = "sharing"
    decodes_fetch: ClassVar[bool] = True

    def __init__(self, settings: SharingSettings, services: Services, metrics: SharingMetrics) -> None:
        super().__init__(settings, services, metrics)
        if self.enabled:
            # OffsetFetch/OffsetCommit v10+ name topics by id only (OffsetFetchRequest.json,
            # OffsetCommitRequest.json): offsets.py reads both forms (ids through the topic names)
            declared = reads(ApiKey.FETCH, ApiKey.OFFSET_COMMIT, ApiKey.OFFSET_FETCH, ApiKey.JOIN_GROUP,
                             ApiKey.HEARTBEAT, ApiKey.SYNC_GROUP)
            # ConsumerGroupHeartbeat (KIP-848) is relayed for everyone else; sharing decodes and rewrites it
            # (heartbeats.py): the versions Sluice's codec decodes
            heartbeat = decoded_versions(ApiKey.CONSUMER_GROUP_HEARTBEAT)
            assert heartbeat is not None
            self.apis = {**declared, ApiKey.CONSUMER_GROUP_HEARTBEAT: heartbeat}

    def recover(self, m: Member) -> Signal:
        return offsets.recover(self, m)

    # ------------------------------------------------------------------------------------------- policy

    def unread(self, api_key: int, version: int) -> bool:
        return not self.enabled  # switched off: no client's request is its business

    def applies(self, ex: Exchange) -> bool:
        if not self.enabled:
            return False
        key = ex.header.api_key
        if key == ApiKey.FETCH and self._passes(ex):
            return False
        return key in _GROUP_APIS or self.opted_in(ex) or self.standalone_for(ex.client_id)

    def needs_topic_names(self, ex: Exchange) -> bool:
        return ex.header.api_key == ApiKey.FETCH

    def open(self, info: ConnectionInfo) -> ConnectionInfo:
        return info

    def close(self, info: ConnectionInfo) -> None:
        if not self.enabled:
            return
        self.fetches.pop(info.conn_id, None)
        for m in self.members.detach(info.conn_id, self.clock()):
            if not m.conns and not m.standalone:
                self.update_gauges(m.group)

    def on_request(self, ex: Exchange, info: ConnectionInfo) -> Any:
        key = ex.header.api_key
        if key == ApiKey.FETCH:
            return self._fetch_request(ex, info)
        if key == ApiKey.JOIN_GROUP:
            return groups.join_request(self, ex, info)
        if key == ApiKey.SYNC_GROUP:
            return groups.sync_request(self, ex, info)
        if key == ApiKey.HEARTBEAT:
            return groups.heartbeat_request(self, ex, info)
        if key == ApiKey.OFFSET_FETCH:
            return offsets.offset_fetch_request(self, ex, info)
        if key == ApiKey.OFFSET_COMMIT:
            return offsets.offset_commit_request(self, ex, info)
        if key == ApiKey.CONSUMER_GROUP_HEARTBEAT and self.opted_in(ex):
            return heartbeats.request(self, ex, info)
        return None

    def on_resume(self, ex: Exchange, info: ConnectionInfo, state: Any) -> Any:
        if isinstance(state, Checking):  # the group's slice groups checked (.access): decided now, read as any
            return self.on_request(ex, info)
        key = ex.header.api_key
        if key == ApiKey.OFFSET_FETCH:
            return offsets.offset_fetch_resume(self, ex, info, state)
        if key == ApiKey.OFFSET_COMMIT:
            return offsets.offset_commit_resume(self, ex, info, state)
        if key == ApiKey.CONSUMER_GROUP_HEARTBEAT:
            return heartbeats.resume(self, ex, info, state)
        return state

    def on_response(self, ex: Exchange, response: ResponseView, info: ConnectionInfo, state: Any) -> None:
        key = ex.header.api_key
        if key == ApiKey.FETCH:
            self._fetch_response(ex, response, state, info)
        elif key == ApiKey.JOIN_GROUP:
            groups.join_response(self, ex, response, info, state)
        elif key == ApiKey.SYNC_GROUP:
            groups.sync_response(self, ex, response, info, state)
        elif key == ApiKey.HEARTBEAT:
            groups.heartbeat_response(self, ex, response, info, state)
        elif key == ApiKey.OFFSET_FETCH:
            offsets.offset_fetch_response(self, ex, response, info, state)
        elif key == ApiKey.OFFSET_COMMIT:
            offsets.offset_commit_response(self, ex, response, info, state)
        elif key == ApiKey.CONSUMER_GROUP_HEARTBEAT and state is not None:
            heartbeats.response(self, ex, response, info, state)

    # -------------------------------------------------------------------------------------------- Fetch

    def _fetch_request(self, ex: Exchange, info: ConnectionInfo) -> FetchTicket | None:
        edit = ex.request
        assert isinstance(edit, FetchEdit)
        if edit.view.replica_id >= 0:
            return None
        ticket = self._fetch_ticket(ex)
        # Every consumer fetch of the connection goes through the cursor's bookkeeping, filtered or not: its
        # session is the client's whatever this fetch is, and offsets moved earlier go back to the client's own
        # once the member's gaps are gone.
        fetches = self.fetches.get(info.conn_id)
        if fetches is None:
            fetches = self.fetches[info.conn_id] = ClientFetches()
        if edit.view.version >= FIRST_TOPIC_ID:
            # The ids this connection's requests name, learnt from every one of them, its member known yet or not:
            # a client in its fetch session (KIP-227) names a topic in its full request and then, while nothing
            # changes, in none. Learnt only once the member was known, a full request withheld while it was not
            # left the session's partitions unknown by name for good: its fetch offsets never moved past the
            # other slices' records, and the client fetched the same run again and again, answered at once.
            ids, names = fetches.ids, self.names
            for tid in edit.view.topic_keys:
                if isinstance(tid, bytes) and (known := names.get(tid)):
                    ids[known] = tid
        m = ticket.member if ticket is not None and not ticket.withhold else None
        states = self._held(m, edit, fetches) if m is not None else {}
        held = {key: st.gaps for key, (_, st) in states.items()}
        sent = fetches.plan(edit, held)
        if sent.moved:
            self.metrics.sharing_read_ahead.labels("moved").inc(len(sent.moved))
        if ticket is not None and held:
            ticket.states, ticket.held, ticket.sent, ticket.edit, ticket.fetches = states, held, sent, edit, fetches
        return ticket

    def _held(self, m: Member, edit: FetchEdit,
              fetches: ClientFetches) -> dict[PartitionKey, tuple[TopicPartition, PartitionState]]:
        """The member's filtered partitions, by the keys of the request's version (topic ids from v13: learnt from
        what the connection's requests named)."""
        by_id = edit.view.version >= FIRST_TOPIC_ID
        ids = fetches.ids
        held: dict[PartitionKey, tuple[TopicPartition, PartitionState]] = {}
        for tp, st in (m.partitions or {}).items():
            if st.slice.count == 1 and st.table is None:
                continue  # whole, nothing filtered out of it
            topic: str | bytes | None = ids.get(tp[0]) if by_id else tp[0]
            if topic is None:
                continue
            if isinstance(topic, bytes) and st.topic_id and topic != st.topic_id:
                # another topic than the one Sluice read for the member (created again under its name, KIP-516):
                # fetched from the member's own offset; the answer tells the state which topic it now reads
                continue
            held[(topic, tp[1])] = (tp, st)
        return held

    def _passes(self, ex: Exchange) -> bool:
        """Whether this Fetch passes untouched, known without decoding it: a session-less consumer fetch
        (librdkafka, aiokafka) of a member holding no slice (:meth:`_fetch_ticket` lets it through unfiltered)
        on a connection with nothing of the cursor's to keep (no client session, no offset moved). Every fetch of
        a low-rate topic's caught-up consumer otherwise pays a request decode and the chain's walk for nothing."""
        info = ex.info
        if info is None:
            return False
        fetches = self.fetches.get(info.conn_id)
        if fetches is not None and not fetches.idle:
            return False
        if not sessionless(ex.frame, ex.header) or self.standalone_for(ex.client_id):
            return False
        key = member_key(ex)
        m = self.members.get(key)
        if m is None or not m.known:  # let through once member_wait_s passed (and said so), unless recovering
            return (m is None or m.recovering is None) and self.members.unknown_since.get(key, 0.0) < 0
        return not m.blocked and (self.members.collides(key) or not _shares(m))

    def _fetch_ticket(self, ex: Exchange) -> FetchTicket | None:
        key = member_key(ex)
        m = self.members.get(key)
        if self.standalone_for(ex.client_id):
            ex.collect = True
            return FetchTicket(self.members.standalone(key), False)
        if m is None or not m.known:
            if m is not None and m.recovering is not None:
                return self._withhold(ex)
            now = self.clock()
            since = self.members.unknown_since.setdefault(key, now)
            if now - since < self.settings.member_wait_s:
                return self._withhold(ex)
            if since >= 0:
                self.members.unknown_since[key] = -1.0  # said once
                self.not_shared("member_unknown", ex.client_id, "",
                                detail="no group member seen for this client: its fetches pass unfiltered")
            return None
        if m.blocked or self.members.collides(key):
            return self._withhold(ex) if m.blocked else None
        if not _shares(m):
            return None
        ex.collect = True
        return FetchTicket(m, False)

    def _withhold(self, ex: Exchange) -> FetchTicket:
        ex.collect = True
        return FetchTicket(None, True)

    def _fetch_response(self, ex: Exchange, response: ResponseView, ticket: FetchTicket,
                        info: ConnectionInfo) -> None:
        assert isinstance(response, FetchResponse)
        m = ticket.member
        withheld = other_slice = committed = undecodable = forgotten = 0
        changed = False
        names = self.names
        view = response.view
        sent = ticket.sent
        fetches = self.fetches.get(info.conn_id)
        for topic in view.topics:
            tid = b"" if topic.topic else bytes(topic.topic_id)  # a topic named by id (v13+), read once
            name = topic.topic or names.get(tid)
            if name:
                if not self.shareable(name):
                    continue
                if fetches is not None and tid and name not in fetches.ids:
                    # an id the requests named before its name was known (a lookup that failed, retried since):
                    # the answer names it too, and the session's later requests may never name it again
                    fetches.ids[name] = tid
            elif not (ticket.withhold or (m is not None and _shares(m))):
                continue
            if ticket.withhold or not name:
                # Withheld: a member whose slices are not known yet, or a topic id whose name Sluice could not
                # look up (the lookup failed; the answer naming it asks again, TopicNames.note), which may be one
                # the member shares, whose other slices' records must not reach it. The client fetches them
                # again, and once its slices and the name are known they are filtered.
                for part in topic.partitions:
                    if part.records:
                        part.records = b""
                        withheld += 1
                continue
            assert m is not None
            tkey = topic.topic or tid
            for part in topic.partitions:
                tp = (name, part.partition_index)
                state = (m.partitions or {}).get(tp)
                if state is None and m.standalone:
                    s = self.standalone_slice(m.key[1], tp)
                    if s is not None:  # a standalone member's partitions are known by its fetches
                        state = (m.partitions or {}).setdefault(tp, PartitionState(s))
                if state is None:
                    continue  # a partition it holds no slice of: whole, as the broker sent it
                if tid and not part.error_code:
                    state.belongs_to(tid)  # a broker read the partition of this topic: what is known holds for it
                elif not tid and part.error_code in _TOPIC_GONE:
                    # named by name (Fetch v12 and older): a topic deleted shows as unknown while it is gone; its
                    # offsets' gaps go with it (forgetting them costs a read of batches read before, at worst)
                    state.gaps.clear()
                key = (tkey, part.partition_index)
                if part.records:
                    records = memoryview(part.records)
                    self.metrics.sharing_filtered_bytes.inc(len(records))
                    out = filter_records(records, state.slice, state.table, self.cache, tkey, part.partition_index)
                    undecodable += out.undecodable
                    if not tid or tid == state.topic_id:  # (a topic it left: its offsets are not the state's)
                        state.gaps.note(out.gaps)
                    if out.changed:
                        part.records = out.records
                        other_slice += out.other_slice
                        committed += out.committed
                        changed = True
                if sent is None or key not in sent.client:
                    continue
                if key in sent.moved and (part.error_code == _OFFSET_OUT_OF_RANGE or has_diverging_epoch(part)):
                    # The broker answered the offset Sluice moved to, not the member's: its read-ahead is forgotten
                    # and the member, answered with nothing, fetches from its own offset again (in its session:
                    # the offsets differ, so its next request lists the partition, ClientFetches.plan).
                    part.records, part.error_code = b"", 0
                    part.tags = build_tags({t: v for t, v in parse_tags(part.tags).items()
                                            if t != DIVERGING_EPOCH_TAG})
                    state.gaps.clear()
                    forgotten += 1
                    changed = True
                elif not part.records:
                    hw = part.high_watermark
                    slice_end(part, sent.client[key].fetch_offset, state.gaps)
                    changed = changed or part.high_watermark != hw
        if withheld:
            self.metrics.sharing_withheld.inc(withheld)
            edit = ex.request
            wait_s = edit.view.max_wait_ms / 1000 if isinstance(edit, FetchEdit) else _WITHHELD_PAUSE_S
            ex.mute_s = max(ex.mute_s, min(wait_s, _WITHHELD_PAUSE_S))
            changed = True
        if other_slice:
            self.metrics.sharing_records_filtered.labels("other_slice").inc(other_slice)
        if committed:
            self.metrics.sharing_records_filtered.labels("committed").inc(committed)
        if undecodable:
            self.metrics.sharing_not_shared.labels("undecodable_batch").inc(undecodable)
        if forgotten:
            self.metrics.sharing_read_ahead.labels("forgotten").inc(forgotten)
        if changed:
            response.changed = True
        if sent is not None and self._fetch_again(ex, response, ticket):
            return
        if ticket.carried:
            _carry(view, ticket.carried)
            response.changed = True
        if ticket.states:
            # the member's partitions answered with nothing for it (left out of an answer in its fetch session
            # when nothing changed): their slices' positions may move on past what was read (offsets.advance)
            assert m is not None
            busy = {(t.topic or bytes(t.topic_id), p.partition_index) for t, p in view.partitions()
                    if p.records or p.error_code}
            for key, (tp, state) in ticket.states.items():
                if key not in busy:
                    offsets.advance(self, m, tp, state)

    def _fetch_again(self, ex: Exchange, response: FetchResponse, ticket: FetchTicket) -> bool:
        """Send the member's fetch upstream again, from its cursor, when the answer holds nothing for it, the
        broker answered early (records of other slices came) and the client's wait is not over: its long poll
        waits for its own records. Not when anything else is in the answer (an error, a throttle, a new leader's
        address): the client must see it."""
        view = response.view
        assert ticket.edit is not None and ticket.sent is not None and ticket.fetches is not None
        if not ex.may_resend or view.error_code or view.throttle_time_ms or view.node_endpoints:
            return False
        now = self.clock()
        max_wait_ms = ticket.edit.view.max_wait_ms
        left_ms = int(max_wait_ms - (now - ex.started) * 1000)
        held_ms = (now - (ticket.sent_at if ticket.sent_at >= 0 else ex.started)) * 1000
        if left_ms < _AGAIN_MIN_WAIT_MS or held_ms < max_wait_ms * _AGAIN_IF_HELD:
            return False
        if any(p.records or p.error_code for _, p in view.partitions()):
            return False
        frame = ticket.fetches.again(ticket.edit, ticket.sent, ticket.held, view.session_id, left_ms)
        if frame is None:
            return False
        for t, p in view.partitions():
            ticket.carried[(t.topic or bytes(t.topic_id), p.partition_index)] = (t, p)
        self.metrics.sharing_read_ahead.labels("fetched_again").inc()
        ticket.sent_at = now
        ex.send_again(frame)
        return True


def _shares(m: Member) -> bool:
    """Whether ``m`` holds a partition its fetches are filtered in: a slice of it, or committed work to skip."""
    return any(st.slice.count > 1 or st.table is not None for st in (m.partitions or {}).values())


def _carry(view: FetchResponseView, carried: dict[PartitionKey, tuple[FetchTopic, FetchPartition]]) -> None:
    """Add to ``view`` (the answer to a request sent again in the client's fetch session) the partitions of the
    earlier answers it leaves out: the next hop answered those, and left out of this answer what did not change
    since (KIP-227), which the client has not seen."""
    present = {(t.topic or bytes(t.topic_id), p.partition_index) for t, p in view.partitions()}
    by_topic = {t.topic or bytes(t.topic_id): t for t in view.topics}
    topics = view.topics
    for key, (t, p) in carried.items():
        if key in present:
            continue
        entry = by_topic.get(key[0])
        if entry is None:
            entry = by_topic[key[0]] = FetchTopic(t.topic, t.topic_id, [], t.tags)
            topics.append(entry)
        entry.partitions.append(p)
