"""The state cooperative consumption keeps for one proxy, and the switches every part of it reads: what the policy
(:mod:`.policy`, the chain's hooks) and its helpers (:mod:`.groups`, :mod:`.heartbeats`, :mod:`.offsets`) share.
The helpers take a :class:`SharingState`, the policy is one: so the helpers never import the policy.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from ...accesslog import LogLimiter, get_logger
from ...core.broker_calls import BrokerRequests
from ...core.exchange import Exchange
from ...core.policy import Services
from ...core.selectors import ClientSelector
from ...wire.model import TopicPartition
from ..topic_rules import TopicRules
from . import assignor
from .access import SliceAccess
from .cursor import ClientFetches
from .fetch import BatchCache
from .group_calls import GroupCall
from .keys import Slice
from .layout import Layout
from .members import Member, Members
from .metrics import SharingMetrics
from .settings import SharingSettings

__all__ = ["LeaderRound", "SharingState", "StandaloneRule"]

log = get_logger("sluice.sharing")

#: how often one kind of event is logged per group at most (a misconfigured consumer repeats it every rebalance)
_LOG_INTERVAL_S = 60.0


@dataclass(slots=True)
class LeaderRound:
    """What the leader's JoinGroup response said, for its SyncGroup: each member's marker and subscription."""

    generation: int
    protocol: str
    members: dict[str, assignor.MemberInfo]
    marked: dict[str, frozenset[str]]
    subscribed: dict[str, frozenset[str]]



@dataclass(frozen=True, slots=True)
class StandaloneRule:
    client_id: str
    topic: str
    partitions: frozenset[int]
    slice: Slice



class SharingState:
    """What cooperative consumption keeps for one proxy (its members, the layouts and rounds of its groups, the
    decoded-batch cache, the read-ahead bookkeeping) and the switches (opted in, shareable, standalone)."""

    def __init__(self, settings: SharingSettings, services: Services, metrics: SharingMetrics) -> None:
        self.settings = settings
        self.enabled = settings.enabled
        self.metrics = metrics
        self.clock = services.clock
        self.names = services.names
        #: Sluice's own group requests (submitted through :meth:`submit`, which counts what came of each)
        self.calls: BrokerRequests = services.broker
        #: whether Sluice's login may use each shared group's slice groups (Kafka ACLs), checked before sharing
        self.access = SliceAccess(self.submit, self.clock, self._granted)
        self.rules: TopicRules[bool] = TopicRules({t.topic: t.shared for t in settings.topics})
        self.clients = tuple(ClientSelector(c) if isinstance(c, str) else ClientSelector.of(c)
                             for c in settings.clients)
        self.standalone = tuple(StandaloneRule(e.client_id, e.topic, frozenset(e.partitions), Slice.parse(e.slice))
                                for e in settings.standalone)
        self.members = Members()
        hits, misses = (self.metrics.sharing_cache_lookups.tallies[o] for o in ("hit", "miss"))

        def lookups(hit: int, miss: int) -> None:
            hits.inc(hit)
            misses.inc(miss)

        self.cache = BatchCache(settings.cache_max_bytes, self.metrics.sharing_cache_bytes.set, lookups)
        #: the leader's JoinGroup answer per group, for its SyncGroup (the latest round only)
        self.rounds: dict[str, LeaderRound] = {}
        #: KIP-848 groups: the layout of each, from its latest description (heartbeats.py)
        self.layouts: dict[str, Layout] = {}
        #: per group, per partition: furthest slice position - stable offset, at the last commit through here
        self.stable_lag: dict[str, dict[TopicPartition, int]] = {}
        self._log = LogLimiter(_LOG_INTERVAL_S, self.clock)
        self._gauged: set[str] = set()
        #: per client connection, its fetches as Sluice sends them on (the read-ahead cursor's session bookkeeping)
        self.fetches: dict[int, ClientFetches] = {}

    # ----------------------------------------------------------------------------------------- switches

    def opted_in(self, ex: Exchange) -> bool:
        """The first switch: a consumer opts in by what ``sharing.clients`` selects of it (client.id, and the
        connection's SASL principal and address)."""
        info = ex.info
        principal, host = (info.principal, info.client_host) if info is not None else (None, "")
        return any(c.matches(ex.client_id, principal, host) for c in self.clients)

    def submit(self, call: GroupCall) -> GroupCall:
        """Hand ``call`` to Sluice's own group requests; once it settles, counted as ``ok`` or ``failed`` (the
        I/O failed as a whole) in ``sluice_sharing_group_calls_total``, and a refusal for want of an ACL filed
        (:meth:`_refused`) before anything waiting on the call runs."""

        def settled() -> None:
            self.metrics.sharing_group_calls.labels("ok" if call.error is None else "failed").inc()
            for group in self.access.learn(call):
                self._refused(group)

        call.on_settled(settled)
        return self.calls.submit(call)

    def _refused(self, group: str) -> None:
        """``group``'s slice groups were refused to Sluice's login: said, and each classic member holding a slice
        made to rejoin (its JoinGroup then goes unmarked, :mod:`.groups`); a KIP-848 member is handed the broker's
        assignment from its next heartbeat on (:mod:`.heartbeats`)."""
        self.said_refused(None, group)
        for m in self.members.of_group(group):
            if m.kip848 is None and m.member_id and any(not st.slice.whole for st in (m.partitions or {}).values()):
                self.rejoin(m, m.member_id)

    def _granted(self, group: str) -> None:
        """``group``'s slice groups, refused before, may be used now: its classic members are made to rejoin, marked
        (:mod:`.groups`), so it is shared from the next generation (a KIP-848 member is marked again at its next
        heartbeat, :mod:`.heartbeats`)."""
        log.info("sharing_slice_groups_granted", group=group)
        for m in self.members.of_group(group):
            if m.kip848 is None and m.member_id:
                self.rejoin(m, m.member_id)

    def rejoin(self, m: Member, member_id: str) -> None:
        """Make the classic member ``member_id`` rejoin: its heartbeats are answered REBALANCE_IN_PROGRESS until its
        JoinGroup (:mod:`.groups`), counted in ``sluice_sharing_rejoins_total``."""
        m.rejoin.add(member_id)
        self.metrics.sharing_rejoins.inc()

    def said_refused(self, client_id: str | None, group: str) -> None:
        """``group`` is left unshared for want of its slice groups' ACL (:mod:`.access`): counted and said."""
        self.not_shared("slice_groups_refused", client_id, group, detail=(
            f"Sluice's login may not use the group's slice groups ({self.access.refused(group)}): consumed unshared "
            f"until it may (Read and Describe on the group id as a prefix, docs/security.md)"))

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
