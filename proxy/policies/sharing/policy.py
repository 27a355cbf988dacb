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
- :mod:`.fetch`: the records each member gets, and the decoded-batch cache.

The three switches (several restrictions, all must allow): ``sharing.enabled`` (this Sluice), ``sharing.topics``
(per topic, resolved like ``[[throttle.topics]]``), ``sharing.clients`` (per consumer, client.id globs). A member
is marked only when all three allow it, and the leader's Sluice shares a topic only if its own switches allow it
too. Consumers that use ``assign()`` get their slices from ``[[sharing.standalone]]``.

Chain position: after the throttle and before terminate (proxy/policies/__init__.py), so responses are filtered
right after terminate builds the client's response, and the throttle and the KIP-74 budgets then apply to what
the member actually receives.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any, ClassVar

from ...accesslog import LogLimiter, get_logger
from ...core.broker_calls import BrokerRequests
from ...core.exchange import ConnectionInfo, Exchange, Signal
from ...core.policy import Policy, Services, reads
from ...core.selectors import ClientSelector
from ...wire.api_keys import ApiKey
from ...wire.fetch_request_fast import FetchEdit
from ...wire.messages import decoded_versions
from ...wire.model import TopicPartition
from ...wire.views import FetchResponse, ResponseView
from ..topic_rules import TopicRules
from . import groups, heartbeats, offsets
from .fetch import BatchCache, filter_records, note_gaps
from .group_calls import GroupCall
from .keys import Slice
from .layout import Layout
from .members import Member, Members, member_key
from .metrics import SharingMetrics
from .settings import SharingSettings

log = get_logger("sluice.sharing")

_GROUP_APIS = frozenset({ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP})
#: how often one kind of event is logged per group at most (a misconfigured consumer repeats it every rebalance)
_LOG_INTERVAL_S = 60.0
#: a withheld fetch's client is not read from again for up to this long (its max_wait_ms if shorter), instead of
#: fetching again at once in a loop (as throttle.py paces fetchers that got only throttled partitions)
_WITHHELD_PAUSE_S = 0.5



@dataclass(slots=True)
class FetchTicket:
    member: Member | None
    withhold: bool


@dataclass(frozen=True, slots=True)
class StandaloneRule:
    client_id: str
    topic: str
    partitions: frozenset[int]
    slice: Slice


class Sharing(Policy):
    name = "sharing"
    decodes_fetch: ClassVar[bool] = True

    def __init__(self, settings: SharingSettings, services: Services, metrics: SharingMetrics) -> None:
        self.settings = settings
        self.enabled = settings.enabled
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
        self.metrics = metrics
        self.clock = services.clock
        self.names = services.names
        #: Sluice's own group requests (submitted through :meth:`submit`, which counts what came of each)
        self.calls: BrokerRequests = services.broker
        self.rules: TopicRules[bool] = TopicRules({t.topic: t.shared for t in settings.topics})
        self.clients = tuple(ClientSelector(c) if isinstance(c, str) else ClientSelector.of(c)
                             for c in settings.clients)
        self.standalone = tuple(StandaloneRule(e.client_id, e.topic, frozenset(e.partitions), Slice.parse(e.slice))
                                for e in settings.standalone)
        self.members = Members()
        self.cache = BatchCache(settings.cache_max_bytes, self.metrics.sharing_cache_bytes.set,
                                lambda hit: self.metrics.sharing_cache_lookups.labels("hit" if hit else "miss").inc())
        #: the leader's JoinGroup answer per group, for its SyncGroup (the latest round only)
        self.rounds: dict[str, groups.LeaderRound] = {}
        #: KIP-848 groups: the layout of each, from its latest description (heartbeats.py)
        self.layouts: dict[str, Layout] = {}
        #: per group, per partition: furthest slice position - stable offset, at the last commit through here
        self.stable_lag: dict[str, dict[TopicPartition, int]] = {}
        self._log = LogLimiter(_LOG_INTERVAL_S, self.clock)
        self._gauged: set[str] = set()

    # ----------------------------------------------------------------------------------------- switches

    def opted_in(self, ex: Exchange) -> bool:
        """The first switch: a consumer opts in by what ``sharing.clients`` selects of it (client.id, and the
        connection's SASL principal and address)."""
        info = ex.info
        principal, host = (info.principal, info.client_host) if info is not None else (None, "")
        return any(c.matches(ex.client_id, principal, host) for c in self.clients)

    def submit(self, call: GroupCall) -> GroupCall:
        """Hand ``call`` to Sluice's own group requests; once it settles, counted as ``ok`` or ``failed`` (the
        I/O failed as a whole) in ``sluice_sharing_group_calls_total``."""
        call.on_settled(lambda: self.metrics.sharing_group_calls.labels("ok" if call.error is None else "failed")
                        .inc())
        return self.calls.submit(call)

    def shareable(self, topic: str) -> bool:
        return bool(self.rules.get(topic))

    def standalone_for(self, client_id: str | None) -> bool:
        return any(fnmatch.fnmatchcase(client_id or "", r.client_id) for r in self.standalone)

    def standalone_slice(self, client_id: str, tp: TopicPartition) -> Slice | None:
        for r in self.standalone:
            if r.topic == tp[0] and (not r.partitions or tp[1] in r.partitions) \
                    and fnmatch.fnmatchcase(client_id, r.client_id):
                return r.slice
        return None

    def recover(self, m: Member) -> Signal:
        return offsets.recover(self, m)

    def not_shared(self, reason: str, client_id: str | None, group: str, detail: str = "") -> None:
        self.metrics.sharing_not_shared.labels(reason).inc()
        if self._log.allow((reason, group, client_id)) is not None:
            log.warning(f"sharing_{reason}", group=group, client_id=client_id, detail=detail or None)

    def update_gauges(self, group: str) -> None:
        members = self.members.of_group(group)
        shared = {tp: st.slice.count for m in members for tp, st in (m.partitions or {}).items()
                  if st.slice.count > 1}
        if not members and group in self._gauged:
            for gauge in (self.metrics.sharing_partitions, self.metrics.sharing_partition_members,
                          self.metrics.sharing_stable_lag):
                gauge.remove(group)
            self._gauged.discard(group)
            self.stable_lag.pop(group, None)
            self.layouts.pop(group, None)
            return
        self._gauged.add(group)
        self.metrics.sharing_partitions.labels(group).set(len(shared))
        self.metrics.sharing_partition_members.labels(group).set(max(shared.values(), default=0))

    # ------------------------------------------------------------------------------------------- policy

    def unread(self, api_key: int, version: int) -> bool:
        return not self.enabled  # switched off: no client's request is its business

    def applies(self, ex: Exchange) -> bool:
        if not self.enabled:
            return False
        key = ex.header.api_key
        return key in _GROUP_APIS or self.opted_in(ex) or self.standalone_for(ex.client_id)

    def needs_topic_names(self, ex: Exchange) -> bool:
        return ex.header.api_key == ApiKey.FETCH

    def open(self, info: ConnectionInfo) -> ConnectionInfo:
        return info

    def close(self, info: ConnectionInfo) -> None:
        if not self.enabled:
            return
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
            self._fetch_response(ex, response, state)
        elif key == ApiKey.JOIN_GROUP:
            groups.join_response(self, ex, response, info, state)
        elif key == ApiKey.SYNC_GROUP:
            groups.sync_response(self, ex, response, info, state)
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
        if not any(st.slice.count > 1 or st.table is not None for st in (m.partitions or {}).values()):
            return None
        ex.collect = True
        return FetchTicket(m, False)

    def _withhold(self, ex: Exchange) -> FetchTicket:
        ex.collect = True
        return FetchTicket(None, True)

    def _fetch_response(self, ex: Exchange, response: ResponseView, ticket: FetchTicket) -> None:
        assert isinstance(response, FetchResponse)
        m = ticket.member
        withheld = other_slice = committed = undecodable = 0
        changed = False
        names = self.names
        for topic in response.view.topics:
            name = topic.topic or names.get(bytes(topic.topic_id))
            if not name or not self.shareable(name):
                continue
            tkey = topic.topic or bytes(topic.topic_id)
            for part in topic.partitions:
                if not part.records:
                    continue
                if ticket.withhold:
                    part.records = b""
                    withheld += 1
                    continue
                assert m is not None
                tp = (name, part.partition_index)
                state = (m.partitions or {}).get(tp)
                s = state.slice if state is not None else (self.standalone_slice(m.key[1], tp) if m.standalone
                                                           else None)
                if s is None:
                    continue  # a partition it holds no slice of: whole, as the broker sent it
                records = memoryview(part.records)
                self.metrics.sharing_filtered_bytes.inc(len(records))
                out = filter_records(records, s, state.table if state is not None else None, self.cache, tkey,
                                     part.partition_index)
                undecodable += out.undecodable
                if out.gaps and state is not None:
                    note_gaps(state.skips, out.gaps)
                if out.changed:
                    part.records = out.records
                    other_slice += out.other_slice
                    committed += out.committed
                    changed = True
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
        if changed:
            response.changed = True
