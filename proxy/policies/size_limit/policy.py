"""Response-size limiting (KIP-74): byte budgets on fetch responses, progress guaranteed, fair partitions.

Sans-IO: :class:`SizeLimit` is the policy on the chain; it hands decoded Fetch requests (a
:class:`~proxy.wire.fetch_request_fast.FetchEdit`), responses and a per-connection :class:`Fairness` to
:func:`clamp_request`, :func:`reorder_request` and :func:`enforce`, which return decisions and edit in place,
and never touch sockets or clocks.

Rules (KIP-74 and shipped Kafka: KafkaApis, ReplicaManager, LogSegment):

- Request side: the request's top-level ``max_bytes`` (v3+) and every ``partition_max_bytes`` are clamped
  to the client's budget, so the broker itself does the work (KafkaApis: fetchMaxBytes = min(request,
  broker limit)).
- Response side, on every response the client receives (including ones Sluice builds itself later):
  partitions are filled in order; the first partition with data always keeps at least one whole record batch,
  even one larger than the budget (KIP-74's progress guarantee, LogSegment.read's minOneMessage); a partition
  that does not fit stays in the response with error 0, its real high watermark / LSO / log start offset and
  empty records (ReplicaManager's "partitions that did not fit"); a cut is made only at a record-batch
  boundary, and a truncated trailing batch the broker sent is dropped (clients discard it anyway). A response
  within the budgets whole has nothing to cut: it streams through (:meth:`SizeLimit.stream_fetch`), its
  truncated trailing batch with it.
- Fairness: Kafka fills partitions in request order, so a client that never rotates its partition list starves
  the partitions at its end behind a hot one. For such clients Sluice rotates per connection: a partition that
  returned data moves to the back (what the Java consumer's SubscriptionState.movePartitionToEnd and the
  broker's FetchSession do). Full (and session-less) requests are reordered accordingly, and the response
  budget is filled in the same order.
- Share fetches (KIP-932 ShareFetch): bounded on the request side only. The broker acquires every record it puts
  in a ShareFetch response for that member; a record cut from it would stay acquired until its lock lapses and
  count a delivery each time, until the broker archives it (lost to the group, KIP-932's delivery count limit).
  So the request's ``MaxBytes`` is clamped to the budget (a partition budget bounds it too: ShareFetch has no
  per-partition limit, and a response within the partition budget holds every partition within it) and the
  response is never trimmed. The broker fills MaxBytes as for Fetch (partitions share it, KafkaApis'
  handleShareFetchRequest and PartitionMaxBytesStrategy), with the same progress rule: a first batch larger than
  the budget still comes whole.
- Memory: a budgeted fetch asks the connection core to reserve its clamped ``max_bytes`` from the proxy-wide
  bound (:mod:`proxy.core.memory`, ``global_max_bytes``) before it goes upstream; when the bound is reached it
  waits, in arrival order, instead of allocating.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ...core.exchange import Exchange
from ...core.policy import Policy, Services, Streamed, reads
from ...core.selectors import ClientSelector
from ...wire.api_keys import ApiKey
from ...wire.fetch_fast import FetchPartition, FetchResponseView
from ...wire.fetch_layout import PartitionKey, topic_key
from ...wire.fetch_request_fast import FetchEdit, FetchParams
from ...wire.fetch_stream import FetchStreamer
from ...wire.records import prefix_within
from ...wire.views import FetchResponse, MessageRequest, ResponseView
from .metrics import SizeLimitMetrics
from .settings import SizeLimitSettings

#: replica.fetch.response.max.bytes' default: the budget of a replica-fetcher rule that names none
REPLICA_DEFAULT_MAX_BYTES = 10 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Budget:
    """Byte budgets; 0 = no limit."""

    fetch_max_bytes: int = 0
    partition_max_bytes: int = 0

    @property
    def unlimited(self) -> bool:
        return not self.fetch_max_bytes and not self.partition_max_bytes


@dataclass(frozen=True, slots=True)
class BudgetRule:
    """Who a budget applies to: consumers a client selector matches (client.id glob, SASL principal glob, client
    network: :mod:`proxy.core.selectors`), or replica fetchers (FetchRequestView.from_follower)."""

    budget: Budget
    client_id: str | None = None
    replicas: bool = False
    principal: str | None = None
    network: str | None = None
    selector: ClientSelector = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "selector", ClientSelector(self.client_id, self.principal, self.network))

    def matches(self, client_id: str | None, follower: bool, principal: str | None = None, host: str = "") -> bool:
        if self.replicas:
            return follower
        return not follower and self.selector.matches(client_id, principal, host)


@dataclass(frozen=True, slots=True)
class SizeLimits:
    """One immutable snapshot of the configuration; swapped whole on reload so a request sees one version."""

    rules: tuple[BudgetRule, ...] = ()
    fairness: bool = True
    global_max_bytes: int = 0

    @classmethod
    def from_settings(cls, settings: SizeLimitSettings) -> SizeLimits:
        rules = []
        for b in settings.budgets:
            default = REPLICA_DEFAULT_MAX_BYTES if b.replicas else 0
            budget = Budget(b.fetch_max_bytes if b.fetch_max_bytes is not None else default, b.partition_max_bytes)
            rules.append(BudgetRule(budget, client_id=b.client_id, replicas=b.replicas, principal=b.principal,
                                    network=b.client_address))
        return cls(tuple(rules), settings.fairness == "round-robin", settings.global_max_bytes)

    @property
    def active(self) -> bool:
        return any(not r.budget.unlimited for r in self.rules)

    def budget_for(self, client_id: str | None, follower: bool, principal: str | None = None,
                   host: str = "") -> Budget | None:
        """The first matching rule's budget (rules are ordered, like firewall rules), or None."""
        for rule in self.rules:
            if rule.matches(client_id, follower, principal, host):
                return None if rule.budget.unlimited else rule.budget
        return None

    def may_apply(self, client_id: str | None, principal: str | None = None, host: str = "") -> bool:
        """Whether any rule could apply to this client before its request body is decoded."""
        return any(r.replicas or r.matches(client_id, False, principal, host) for r in self.rules
                   if not r.budget.unlimited)


def clamp_request(edit: FetchEdit, budget: Budget) -> bool:
    """Clamp MaxBytes (v3+) and every PartitionMaxBytes to the budget (a partition cap defaults to the whole
    budget); True if anything changed (``edit.changed`` is set then)."""
    changed = False
    if budget.fetch_max_bytes and edit.max_bytes > budget.fetch_max_bytes:
        edit.max_bytes = budget.fetch_max_bytes
        changed = True
    cap = budget.partition_max_bytes or budget.fetch_max_bytes
    if cap:
        parts = edit.partitions
        new = tuple.__new__  # FetchParams is built once per clamped partition: skip NamedTuple.__new__'s call
        for key, (fo, lso, pmb, cle, lfe, tags) in parts.items():
            if pmb > cap:
                parts[key] = new(FetchParams, (fo, lso, cap, cle, lfe, tags))  # a value, not a key: safe in the loop
                changed = True
    if changed:
        edit.changed = True
    return changed


def clamp_share_request(body: Any, budget: Budget) -> bool:
    """Clamp a ShareFetch request's MaxBytes to the budget: the whole budget, else the partition budget (the
    only limit ShareFetch has is the whole response's); True if it changed."""
    cap = min(b for b in (budget.fetch_max_bytes, budget.partition_max_bytes) if b)
    if body.max_bytes > cap:
        body.max_bytes = cap
        return True
    return False


class Fairness:
    """Per-connection rotation: partitions that returned data go to the back of the fill order."""

    __slots__ = ("_order",)

    def __init__(self) -> None:
        self._order: OrderedDict[PartitionKey, None] = OrderedDict()

    def rank(self, keys: Iterable[PartitionKey]) -> list[PartitionKey]:
        """``keys`` in fill order: known ones by rotation position, new ones first-come at the back."""
        keys = list(keys)
        for k in keys:
            if k not in self._order:
                self._order[k] = None
        position = {k: i for i, k in enumerate(self._order)}
        return sorted(keys, key=position.__getitem__)

    def served(self, keys: Iterable[PartitionKey]) -> None:
        for k in keys:
            self._order.move_to_end(k)

    def forget(self, keys: Iterable[PartitionKey]) -> None:
        for k in keys:
            self._order.pop(k, None)


def reorder_request(edit: FetchEdit, fairness: Fairness) -> bool:
    """Reorder a full (or session-less) Fetch request's partitions into the rotation order, so the broker fills
    the partitions starved longest first (it reads them in request order under MaxBytes; the encoder groups
    consecutive partitions of a topic under one topic entry). Incremental session requests keep their order:
    the broker fills by its session order and rotates that itself (FetchSession). True if the order changed
    (``edit.changed`` is set then)."""
    if edit.view.session_epoch not in (-1, 0):
        return False
    parts = edit.partitions
    before = list(parts)
    ranked = fairness.rank(before)
    if ranked == before:
        return False
    edit.partitions = {key: parts[key] for key in ranked}
    edit.changed = True
    return True


@dataclass(slots=True)
class Outcome:
    """What enforcing a budget did to one response (for metrics and the access log)."""

    trimmed_bytes: int = 0
    deferred_partitions: int = 0
    served: list[PartitionKey] = field(default_factory=list)

    @property
    def limited(self) -> bool:
        return bool(self.trimmed_bytes)


def enforce(view: FetchResponseView, budget: Budget, fairness: Fairness | None) -> Outcome:
    """Apply the budget to a decoded Fetch response in place (records trimmed, partitions kept)."""
    out = Outcome()
    parts: dict[PartitionKey, FetchPartition] = {}
    for topic, p in view.partitions():
        parts[(topic_key(topic), p.partition_index)] = p
    order: Sequence[PartitionKey] = fairness.rank(parts) if fairness is not None else list(parts)
    remaining = budget.fetch_max_bytes or 1 << 62
    cap = budget.partition_max_bytes or 1 << 62
    progress = True  # the first partition with data keeps at least one whole batch
    whole = view.whole
    for key in order:
        p = parts[key]
        if not p.records:  # null (None) or empty
            continue
        size = len(p.records)
        allowed = min(remaining, cap)
        if size <= allowed and id(p) in whole:  # whole batches already (the throttle walked them), all in budget
            kept = size
        else:
            records = memoryview(p.records)
            kept = prefix_within(records, allowed, progress)
            whole.add(id(p))
            if kept < size:
                out.trimmed_bytes += size - kept
                p.records = records[:kept]
                if not kept:
                    out.deferred_partitions += 1
        if kept:
            progress = False
            remaining = max(0, remaining - kept)
            out.served.append(key)
    if fairness is not None:
        fairness.served(out.served)
    return out


class SizeLimit(Policy):
    """The KIP-74 policy on the chain: clamp and reorder the request, enforce the budget on the response."""

    name = "size_limit"
    decodes_fetch: ClassVar[bool] = True

    def __init__(self, settings: SizeLimitSettings, services: Services, metrics: SizeLimitMetrics) -> None:
        self.apis = reads(ApiKey.FETCH, ApiKey.SHARE_FETCH)
        self.metrics = metrics
        self._set(SizeLimits.from_settings(settings))

    def _set(self, limits: SizeLimits) -> None:
        #: replaced whole on reconfiguration: a request sees one consistent snapshot
        self.limits = limits
        self._active = limits.active  # asked on every Fetch: computed once per snapshot

    def reconfigure(self, section: SizeLimitSettings) -> Callable[[], None]:
        limits = SizeLimits.from_settings(section)
        return lambda: self._set(limits)

    def unread(self, api_key: int, version: int) -> bool:
        return not self._active  # switched off: no client's request is its business

    def applies(self, ex: Exchange) -> bool:
        return self._active and self.limits.may_apply(ex.client_id, ex.principal, ex.client_host)

    def open(self, info: Any) -> Fairness:
        return Fairness()

    def on_request(self, ex: Exchange, conn: Fairness) -> Any:
        """Clamp what the broker may return and, for clients that do not rotate, ask for the longest-starved
        partitions first. The response is then collected and trimmed."""
        limits = self.limits
        if ex.header.api_key == ApiKey.SHARE_FETCH:
            return self._share_request(ex, limits)
        edit = ex.request
        assert isinstance(edit, FetchEdit)
        budget = limits.budget_for(ex.client_id, edit.view.from_follower, ex.principal, ex.client_host)
        if budget is None:
            return None
        clamp_request(edit, budget)
        fairness = conn if limits.fairness else None
        if fairness is not None:
            reorder_request(edit, fairness)
        ex.collect = True
        # What the broker may send: the clamped max_bytes (the first-batch rule can exceed it: the core adjusts
        # the reservation when the real size is known). A MaxBytes of 0 or less (the broker still sends a first
        # batch) reserves 1 byte: a negative reservation would lower the bytes held below what is held, for
        # every connection (found by bench.fuzz), and none would leave the response uncounted.
        if limits.global_max_bytes:
            ex.reserve = max(edit.max_bytes, 1)
        return budget, fairness

    def _share_request(self, ex: Exchange, limits: SizeLimits) -> None:
        """A ShareFetch: MaxBytes clamped to the budget; its response is never collected for trimming (see the
        module docstring: what is cut from a share fetch response is lost to the group, in the end)."""
        budget = limits.budget_for(ex.client_id, False, ex.principal, ex.client_host)
        if budget is None:
            return None
        request = ex.request
        assert isinstance(request, MessageRequest)
        if clamp_share_request(request.body, budget):
            request.changed = True
            self.metrics.share_clamped.inc()
        if limits.global_max_bytes:
            ex.reserve = max(request.body.max_bytes, 1)
        return None

    def on_response(self, ex: Exchange, response: ResponseView, conn: Fairness, state: Any) -> None:
        assert isinstance(response, FetchResponse)
        budget, fairness = state
        outcome = enforce(response.view, budget, fairness)
        self.metrics.observe(outcome.trimmed_bytes, outcome.deferred_partitions)
        if outcome.limited:
            response.changed = True

    def stream_fetch(self, ex: Exchange, size: int, conn: Fairness, state: Any) -> Streamed | None:
        """A Fetch response within the budget whole (``size``, its prefix's: more than its record bytes) has
        nothing to cut: it streams through, and only the rotation learns which partitions got data. A truncated
        trailing batch then goes to the client as the broker sent it (every client discards it); only a collected
        response has it dropped (:func:`enforce`)."""
        budget, fairness = state
        if 0 < budget.fetch_max_bytes < size or 0 < budget.partition_max_bytes < size:
            return None
        return Streamed(finish=functools.partial(self._stream_finish, fairness))

    def _stream_finish(self, fairness: Fairness | None, walk: FetchStreamer) -> None:
        if fairness is not None:
            seen = walk.seen or ()
            fed = {(s.topic, s.partition) for s in seen if s.complete_size}
            fairness.served([k for k in fairness.rank(dict.fromkeys((s.topic, s.partition) for s in seen))
                             if k in fed])
        self.metrics.observe(0, 0)
