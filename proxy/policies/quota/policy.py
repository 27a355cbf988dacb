"""Client quotas on the chain, enforced as Kafka enforces its own (KIP-13, KIP-124, KIP-219).

Kafka's broker measures a client's produce bytes, fetch bytes and requests over its windowed rate
(ClientQuotaManager); when a client is over its quota it computes the time that brings it back within it,
answers at once with that time in ``throttle_time_ms`` and mutes the client's channel for as long, so a client
that ignores the hint is held anyway (KIP-219). Sluice does the same in front of the broker, where it can select
clients by principal, client.id and real address and count them across the brokers they talk to. Which entry
governs each kind for a client, and the rates: book.py.

What is metered, as KafkaApis meters it (handleProduceRequest, handleFetchRequest, handleShareFetchRequest's
processShareFetchResponse, handleShareAcknowledgeRequest's sendMaybeThrottle):

- **Produce**: its request bytes when it arrives (``produce_rate_bytes``); the throttle time earned goes into the
  response's ``throttle_time_ms`` (the larger of the broker's and Sluice's) and the client is not read for that
  long after the response. A Produce with acks=0 has no response: the client is not read for that long from the
  moment the request goes upstream. Counted from its header and size alone (:meth:`Quota._produce_arrived`, the
  chain's arrival terms), a Produce within its quota is relayed unread; only one that earned a throttle time is
  read (an Exchange), to carry or apply it.
- **Fetch**: its response's bytes when it comes back (``fetch_rate_bytes``); the response carries the throttle
  time and the client is muted. The response's size is its frame's, or, when a policy changed it, its record
  bytes. A Fetch response streams through the quota (unless another policy needs it whole): its size is its
  prefix's and its throttle time is set in its first bytes (:meth:`Quota.stream_fetch`). A follower's Fetch
  (FetchRequestView.from_follower) is never counted nor held: Kafka applies no client quota to replication
  (followers have KIP-73's replication quotas: the throttle policy).
- **ShareFetch** (KIP-932): its response's bytes against the same fetch quota (Kafka records them on its fetch
  quota manager too). The response is never cut: a record left out would stay acquired by this member until its
  lock lapses, and count toward the delivery limit (proxy/policies/throttle/share.py). The client is held on the
  request side instead: MaxBytes lowered as a Fetch's (below), and the mute (and the throttle time the client is
  told) capped at half the acquisition lock the broker announced, so what it holds is acknowledged in time
  (share.py ``within_lock``). Not lowered to the quota's headroom, as the throttle policy does: that holds the
  client just below its quota, never muted, in responses of a batch or two, where it spends its time in round
  trips (a Java share consumer at 5 MB/s read 0.96 of it, worst window 7%).
- **Requests** (``request_rate``): each Produce, consumer Fetch, ShareFetch and ShareAcknowledge, on arrival (the
  requests of Kafka's data path; its own request quota is a share of broker thread time, KIP-124, which has no
  meaning in front of the broker).
- A response is the quota's unit, so a client's rate over a window is off by up to one response: a consumer's
  default fetch (1 MB per partition, Kafka's ``max.partition.fetch.bytes``) of 4 partitions is 4 MB, most of a
  second at 5 MB/s and ~7% of Kafka's 11 s window. Sluice therefore lowers a Fetch's (and ShareFetch's) MaxBytes
  (KIP-74) to
  :data:`RESPONSE_SHARE_S` of the client's fetch quota: the broker fills the response up to it, never less than
  one record batch (KIP-74's progress rule), so a window's error stays near 1% and the client's rate is the
  same (it fetches more often, in smaller responses). A MaxBytes already lower is kept.
- Nothing is refused, dropped or reordered: the records go on as they came, the client only waits.

The chain position: first after the client-facing rewrites, so on the way back it runs last and meters what the
client gets (after throttles and size limits took their part out).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ...accesslog import get_logger
from ...core.exchange import Arrival, ConnectionInfo, Relay
from ...core.policy import Policy, Services, Streamed, reads
from ...wire.api_keys import ApiKey, api_names
from ...wire.fetch_request_fast import FetchEdit
from ...wire.throttle_time import carries_throttle_time, set_throttle_time_ms, throttle_time_ms
from ...wire.views import FetchResponse, MessageRequest, MessageResponse
from ..throttle.share import clamp_max_bytes, within_lock
from .book import NOTHING, Entry, Governing, Kind, QuotaBook, Quotas, RateKey
from .metrics import QuotaMetrics
from .settings import QuotaSettings

if TYPE_CHECKING:
    from ...core.exchange import Exchange
    from ...wire.messages import RequestHeader
    from ...wire.views import ResponseView

log = get_logger("sluice.quota")

#: the share of a second's fetch quota one response may carry (see the module docstring)
RESPONSE_SHARE_S = 0.1
_SHARE_APIS = (ApiKey.SHARE_FETCH, ApiKey.SHARE_ACKNOWLEDGE)
#: the byte kind each API is counted on (every one of them on the request kind too)
_BYTES_KIND: dict[int, Kind] = {ApiKey.PRODUCE: "produce", ApiKey.FETCH: "fetch", ApiKey.SHARE_FETCH: "fetch"}
_PRODUCE_NAME = api_names()[ApiKey.PRODUCE]
#: a metered Produce within its client's quotas: the access log's field, the request relayed unread
_WITHIN = Arrival(log=MappingProxyType({"quota_throttle_time_ms": 0}))


@dataclass(slots=True)
class ShareLock:
    """A connection's last acquisition lock announced by the broker (ShareFetch AcquisitionLockTimeoutMs): what a
    ShareAcknowledge's mute is capped by."""

    lock_ms: int = 0


@dataclass(slots=True)
class Ticket:
    """A request's quota state until its response: the fetch entry and rate (None: not metered), the throttle time
    earned so far and the entry it is counted against."""

    fetch: Entry | None
    key: RateKey | None
    delay_s: float
    by: Entry | None


class Quota(Policy):
    name = "quota"

    def __init__(self, settings: QuotaSettings, services: Services, metrics: QuotaMetrics) -> None:
        # Produce requests and Fetch responses are read only for their sizes and throttle_time_ms, found by
        # position in every version (proxy/wire/throttle_time.py); ShareFetch is decoded (MaxBytes, the lock)
        self.apis = reads(ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.SHARE_FETCH, ApiKey.SHARE_ACKNOWLEDGE)
        self.clock = services.clock
        self.metrics = metrics
        self.book = QuotaBook(Quotas.from_settings(settings))
        self.metrics.bind(self.book, self.clock)

    def reconfigure(self, section: QuotaSettings) -> Callable[[], None]:
        quotas = Quotas.from_settings(section)

        def apply() -> None:
            self.book.reconfigure(quotas, self.clock())
            self.metrics.bind(self.book, self.clock)
        return apply

    def status(self) -> dict[str, Any]:
        """The rates measured now (busiest first, bounded) and, for a fleet, its view: what GET /quotas adds."""
        now = self.clock()
        rows, more = self.book.entities(now)
        out: dict[str, Any] = {"entities": rows, "more_entities": more}
        if self.book.quotas.fleet:
            shares = self.book.fleet
            out["fleet"] = {"usage_topic": shares.state, "live_instances": shares.live(now),
                            "instance": shares.me}
        return out

    # ------------------------------------------------------------------------------------------ the fleet

    def fleet_wanted(self) -> bool:
        """Whether an entry is fleet-scoped (proxy/fleet/usage.py publishes and reads usage only then)."""
        return self.book.quotas.fleet

    def fleet_report(self, instance: str, interval_s: float) -> bytes | None:
        """Close this instance's usage interval (every ``interval_s``): its report to publish; the usage topic's
        reachability judged, the shares updated."""
        now = self.clock()
        shares = self.book.fleet
        shares.me, shares.interval_s = instance, interval_s
        value = shares.report(now)
        changed = shares.tick(now)
        if changed == "unreachable":
            self.metrics.fleet_fallbacks.inc()
            log.warning("quota_fleet_usage_unreachable", live_instances=shares.known_live,
                        using="each fleet quota divided by the instances last seen live")
        elif changed == "reachable":
            log.info("quota_fleet_usage_reachable", live_instances=shares.live(now))
        self.book.rebalance(now)
        return value

    def fleet_offer(self, instance: str, value: bytes | None) -> None:
        """An instance's usage report read from the usage topic (this one's too)."""
        now = self.clock()
        if self.book.fleet.offer(instance, value, now):
            self.book.rebalance(now)
        else:
            self.metrics.fleet_reports_skipped.inc()

    # ------------------------------------------------------------------------------------------ the chain

    def unread(self, api_key: int, version: int) -> bool | Relay:
        q = self.book.quotas
        kind = _BYTES_KIND.get(api_key)
        if not (q.sets("request") or (kind is not None and q.sets(kind))):
            return True  # no entry sets a kind this API is counted on: none of its requests is the quota's business
        # A Produce is metered by its size on arrival (KafkaApis.handleProduceRequest): counted from its header and
        # size as it arrives, read as an Exchange only when it earned a throttle time to tell or apply
        return Relay(arrival=self._produce_arrived) if api_key == ApiKey.PRODUCE else False

    def _produce_arrived(self, header: RequestHeader, size: int, info: ConnectionInfo | None,
                         expects_response: bool) -> Arrival | None:
        """A Produce's request and its ``size`` bytes recorded on its client's rates (those an entry governs): None
        if no entry governs the client; within its quota, the access log's 0, the request relayed unread
        (nothing to tell the client: the broker's throttle time stands); else the throttle time earned, for
        :meth:`on_request` to set in the response, or to mute the client from now (acks=0: no response, KIP-219)."""
        client_id = header.client_id
        principal, host = (info.principal, info.client_host) if info is not None else (None, "")
        gov = self.book.quotas.governing(client_id, principal, host)
        if gov is NOTHING:
            return None
        now, metrics, book = self.clock(), self.metrics, self.book
        for each in gov.entries:
            metrics.count(each.name, _PRODUCE_NAME)
        # on every Produce a quota governs: _record's steps, spelt out (no call this path can spare)
        delay, by = 0.0, None
        entry: Entry | None = gov.request
        if entry is not None:
            delay = book.record(entry, "request", 1, entry.key("request", client_id, principal, host), now)
            by = entry
        entry = gov.produce
        if entry is not None:
            metrics.count_bytes(entry.name, "produce", size)
            earned = book.record(entry, "produce", size, entry.key("produce", client_id, principal, host), now)
            if earned > delay:
                delay, by = earned, entry
        if delay <= 0 or by is None:
            return _WITHIN
        return Arrival(state=Ticket(None, None, delay, by))

    def applies(self, ex: Exchange) -> bool:
        return bool(self.book.quotas.entries)

    def open(self, info: Any) -> ShareLock:
        return ShareLock()

    def on_request(self, ex: Exchange, conn: ShareLock) -> Ticket | None:
        api_key = ex.header.api_key
        if api_key == ApiKey.PRODUCE:
            # metered on arrival (:meth:`_produce_arrived`); here only when it earned a throttle time
            arrived = ex.arrived.get(self) if ex.arrived is not None else None
            if arrived is None:
                return None
            if not ex.expects_response:
                # acks=0: no response to carry the time; the client is held all the same (KIP-219)
                self._apply(ex, arrived.by, arrived.delay_s, 0)
                return None
            ex.collect = True
            return arrived
        gov = self.book.quotas.governing(ex.client_id, ex.principal, ex.client_host)
        if gov is NOTHING:
            return None
        if api_key == ApiKey.FETCH:
            edit = ex.request
            if isinstance(edit, FetchEdit) and edit.view.from_follower:
                return None  # replication: never a client quota's (the module docstring)
        now, api = self.clock(), ex.api
        for entry in gov.entries:
            self.metrics.count(entry.name, api)
        delay, by = self._record(gov, "request", 1, ex.client_id, ex.principal, ex.client_host, now, 0.0, None)
        fetch = gov.fetch if api_key != ApiKey.SHARE_ACKNOWLEDGE else None
        if fetch is None:
            if delay <= 0:
                return None  # nothing to meter in the response, nothing to tell the client
            ex.collect = True
            return Ticket(None, None, delay, by)
        key = fetch.key("fetch", ex.client_id, ex.principal, ex.client_host)
        cap = max(1, int(self.book.bound(key, "fetch", fetch) * RESPONSE_SHARE_S))
        if api_key == ApiKey.FETCH:
            _cap_response(ex.request, cap)
        else:
            request = ex.request
            assert isinstance(request, MessageRequest)
            if clamp_max_bytes(request.body, cap):
                request.changed = True
        ex.collect = True
        return Ticket(fetch, key, delay, by)

    def _record(self, gov: Governing, kind: Kind, amount: int, client_id: str | None, principal: str | None,
                host: str, now: float, delay: float, by: Entry | None) -> tuple[float, Entry | None]:
        """Record ``amount`` on the client's rate of ``kind`` (if an entry governs it); the larger throttle time so
        far and the entry it is counted against."""
        entry = gov.entry(kind)
        if entry is None:
            return delay, by
        key = entry.key(kind, client_id, principal, host)
        earned = self.book.record(entry, kind, amount, key, now)
        return (earned, entry) if earned > delay else (delay, by)

    def on_response(self, ex: Exchange, response: ResponseView, conn: ShareLock, state: Any) -> None:
        ticket: Ticket = state
        h = ex.header
        lock_ms = conn.lock_ms if h.api_key in _SHARE_APIS else 0
        size = 0
        if ticket.fetch is not None:
            if isinstance(response, FetchResponse):
                size = _fetch_bytes(response)
            else:
                assert isinstance(response, MessageResponse)
                size = _share_fetch_bytes(response)
                lock_ms = conn.lock_ms = int(response.body.acquisition_lock_timeout_ms)
        delay, by = self._settle(ticket, size, lock_ms)
        ms = _ms(delay)
        if ms and carries_throttle_time(h.api_key, h.api_version) \
                and ms > throttle_time_ms(h.api_key, h.api_version, response):
            set_throttle_time_ms(h.api_key, h.api_version, response, ms)
        self._apply(ex, by, delay, ms)

    def stream_fetch(self, ex: Exchange, size: int, conn: ShareLock, state: Any) -> Streamed:
        """A Fetch response is never changed by the quota: it streams through (when no other policy needs it
        whole) with its bytes known from its size prefix (``_fetch_bytes`` of an unchanged response) and the
        throttle time set in its first bytes."""
        return Streamed(start=functools.partial(self._stream_start, ex, state, size + 4))

    def _stream_start(self, ex: Exchange, ticket: Ticket, size: int) -> int:
        delay, by = self._settle(ticket, size if ticket.fetch is not None else 0, 0)
        ms = _ms(delay)
        self._apply(ex, by, delay, ms)
        return ms

    def _settle(self, ticket: Ticket, size: int, lock_ms: int) -> tuple[float, Entry | None]:
        """The response's ``size`` bytes recorded on the client's fetch rate (if metered): the throttle time the
        request earned (within a share lock of ``lock_ms``, if any) and the entry it is counted against."""
        delay, by = ticket.delay_s, ticket.by
        if ticket.fetch is not None and ticket.key is not None:
            self.metrics.count_bytes(ticket.fetch.name, "fetch", size)
            earned = self.book.record(ticket.fetch, "fetch", size, ticket.key, self.clock())
            if earned > delay:
                delay, by = earned, ticket.fetch
        if lock_ms:
            delay = within_lock(delay, lock_ms)
        return delay, by

    def _apply(self, ex: Exchange, entry: Entry | None, delay: float, ms: int) -> None:
        ex.log["quota_throttle_time_ms"] = ms or _ms(delay)
        if delay <= 0 or entry is None:
            return
        ex.mute_s = max(ex.mute_s, delay)
        self.metrics.throttle(entry.name, ex.api, delay)


def _ms(seconds: float) -> int:
    """Whole milliseconds, rounded up: a client that waits the time it is told is back within its quota."""
    return math.ceil(seconds * 1000) if seconds > 0 else 0


def _cap_response(request: object, cap: int) -> None:
    """Lower a Fetch request's MaxBytes to ``cap`` (never raise it)."""
    if isinstance(request, FetchEdit) and request.max_bytes > cap:
        request.max_bytes = cap
        request.changed = True


def _fetch_bytes(response: FetchResponse) -> int:
    """The Fetch response's bytes as the client gets them: its frame (size prefix included) when no policy
    changed it, else its record bytes (the rest is a few bytes per partition)."""
    if not response.changed:
        return len(response.frame) + 4
    return response.view.records_size


def _share_fetch_bytes(response: MessageResponse) -> int:
    """A ShareFetch response's bytes as the client gets them (Kafka records ShareFetchContext.responseSize): its
    frame when no policy changed it (none cuts records from it), else its record bytes."""
    if not response.changed:
        return len(response.frame) + 4
    return sum(len(p.records or b"") for t in response.body.responses or () for p in t.partitions or ())
