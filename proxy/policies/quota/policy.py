"""Client quotas on the chain, enforced as Kafka enforces its own (KIP-13, KIP-124, KIP-219).

Kafka's broker measures a client's produce bytes, fetch bytes and requests over its windowed rate
(ClientQuotaManager); when a client is over its quota it computes the time that brings it back within it,
answers at once with that time in ``throttle_time_ms`` and mutes the client's channel for as long, so a client
that ignores the hint is held anyway (KIP-219). Sluice does the same in front of the broker, where it can select
clients by principal, client.id and real address and count them across the brokers they talk to:

- **Produce**: its request bytes are recorded when it arrives (with its request, for ``request_rate``); the
  throttle time earned goes into the response's ``throttle_time_ms`` (the larger of the broker's and
  Sluice's) and the client is not read for that long after the response. A Produce with acks=0 has no
  response: the client is not read for that long from the moment the request goes upstream.
- **Fetch**: its request is recorded when it arrives (``request_rate``), its response's bytes when it comes
  back (Kafka records the response's size); the response carries the throttle time and the client is muted.
  The response's size is its frame's, or, when a policy changed it, its record bytes.
- A response is the quota's unit, so a client's rate over a window is off by up to one response: a consumer's
  default fetch (1 MB per partition, Kafka's ``max.partition.fetch.bytes``) of 4 partitions is 4 MB, most of a
  second at 5 MB/s and ~7% of Kafka's 11 s window. Sluice therefore lowers the request's MaxBytes (KIP-74) to
  :data:`RESPONSE_SHARE_S` of the client's fetch quota: the broker fills the response up to it, never less than
  one record batch (KIP-74's progress rule), so a window's error stays near 1% and the client's rate is the
  same (it fetches more often, in smaller responses). A MaxBytes already lower is kept.
- Nothing is refused, dropped or reordered: the records go on as they came, the client only waits.

The chain position: first after the client-facing rewrites, so on the way back it runs last and meters what the
client gets (after throttles and size limits took their part out).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...core.policy import Policy, Services, reads
from ...wire.api_keys import ApiKey
from ...wire.fetch_request_fast import FetchEdit
from ...wire.throttle_time import carries_throttle_time, set_throttle_time_ms, throttle_time_ms
from ...wire.views import FetchResponse
from .book import Entry, QuotaBook, Quotas
from .metrics import QuotaMetrics
from .settings import QuotaSettings

if TYPE_CHECKING:
    from ...core.exchange import Exchange
    from ...wire.views import ResponseView

#: the share of a second's fetch quota one response may carry (see the module docstring)
RESPONSE_SHARE_S = 0.1


@dataclass(slots=True)
class Ticket:
    """A request's quota state until its response: the entry, the throttle time earned so far."""

    entry: Entry
    delay_s: float


class Quota(Policy):
    name = "quota"

    def __init__(self, settings: QuotaSettings, services: Services, metrics: QuotaMetrics) -> None:
        # Produce requests and Fetch responses are read only for their sizes and throttle_time_ms, found by
        # position in every version (proxy/wire/throttle_time.py)
        self.apis = reads(ApiKey.PRODUCE, ApiKey.FETCH)
        self.clock = services.clock
        self.metrics = metrics
        self.book = QuotaBook(Quotas.from_settings(settings))
        self.metrics.show(self.book.quotas.entries)

    def reconfigure(self, section: QuotaSettings) -> Callable[[], None]:
        quotas = Quotas.from_settings(section)

        def apply() -> None:
            self.book.reconfigure(quotas, self.clock())
            self.metrics.show(self.book.quotas.entries)
        return apply

    def status(self) -> dict[str, Any]:
        """Per entry and kind, the highest rate measured now: what GET /quotas adds as ``status``."""
        return {"rates": self.book.rates_now(self.clock())}

    def unread(self, api_key: int, version: int) -> bool:
        return not self.book.quotas.entries  # switched off: no client's request is its business

    def applies(self, ex: Exchange) -> bool:
        return bool(self.book.quotas.entries)

    def on_request(self, ex: Exchange, conn: Any) -> Any:
        entry = self.book.quotas.entry(ex.client_id, ex.principal, ex.client_host)
        if entry is None:
            return None
        now, api = self.clock(), ex.api
        self.metrics.count(entry.name, api)
        delay = self.book.record(entry, "request", 1, ex.client_id, ex.principal, now)
        if ex.header.api_key == ApiKey.PRODUCE:
            self.metrics.count_bytes(entry.name, "produce", ex.size)
            delay = max(delay, self.book.record(entry, "produce", ex.size, ex.client_id, ex.principal, now))
            if not ex.expects_response or delay <= 0:
                # acks=0: no response to carry the time; the client is held all the same (KIP-219). Not
                # throttled: nothing to tell the client, so the response is not read for the quota (it is
                # relayed unread unless another policy reads it)
                self._apply(ex, entry, delay)
                return None
        elif not entry.fetch and not delay:
            return None  # nothing to meter in the response, nothing to tell the client
        elif entry.fetch:
            _cap_response(ex.request, entry.fetch)
        ex.collect = True
        return Ticket(entry, delay)

    def on_response(self, ex: Exchange, response: ResponseView, conn: Any, state: Any) -> None:
        ticket: Ticket = state
        delay = ticket.delay_s
        if isinstance(response, FetchResponse) and ticket.entry.fetch:
            size = _fetch_bytes(response)
            self.metrics.count_bytes(ticket.entry.name, "fetch", size)
            delay = max(delay, self.book.record(ticket.entry, "fetch", size, ex.client_id, ex.principal,
                                                self.clock()))
        h = ex.header
        ms = _ms(delay)
        if ms and carries_throttle_time(h.api_key, h.api_version) \
                and ms > throttle_time_ms(h.api_key, h.api_version, response):
            set_throttle_time_ms(h.api_key, h.api_version, response, ms)
        self._apply(ex, ticket.entry, delay)

    def _apply(self, ex: Exchange, entry: Entry, delay: float) -> None:
        ex.log["quota_throttle_time_ms"] = _ms(delay)
        if delay <= 0:
            return
        ex.mute_s = max(ex.mute_s, delay)
        self.metrics.throttle(entry.name, ex.api, delay)


def _ms(seconds: float) -> int:
    """Whole milliseconds, rounded up: a client that waits the time it is told is back within its quota."""
    return math.ceil(seconds * 1000) if seconds > 0 else 0


def _cap_response(request: object, fetch_rate: int) -> None:
    """Lower a Fetch request's MaxBytes to :data:`RESPONSE_SHARE_S` of the fetch quota (never raise it)."""
    if not isinstance(request, FetchEdit):
        return
    cap = max(1, int(fetch_rate * RESPONSE_SHARE_S))
    if request.max_bytes > cap:
        request.max_bytes = cap
        request.changed = True


def _fetch_bytes(response: FetchResponse) -> int:
    """The Fetch response's bytes as the client gets them: its frame (size prefix included) when no policy
    changed it, else its record bytes (the rest is a few bytes per partition)."""
    if not response.changed:
        return len(response.frame) + 4
    return sum(p.records_size for t in response.view.topics for p in t.partitions)
