"""Share groups (KIP-932): what the access log and the metrics see of ShareFetch and ShareAcknowledge.

Read only: nothing here edits a share request or response (what may be bounded, and how, is size_limit's and
throttle's: on the request side only). Per exchange:

- a ShareFetch response's ``AcquiredRecords`` ranges are the records the broker acquired for the member
  (``share_acquired`` in the access log, ``sluice_share_records_acquired_total``);
- a ShareFetch or ShareAcknowledge request's ``AcknowledgementBatches`` are what the member acknowledged, by type
  (``share_acknowledged``, ``sluice_share_records_acknowledged_total{api,type}``). A batch carries one type for
  every offset from FirstOffset to LastOffset, or one type per offset (ShareFetchRequest.json's
  AcknowledgeTypes); the types are KIP-932's 0 Gap, 1 Accept, 2 Release, 3 Reject and KIP-1222's 4 Renew.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...core.exchange import Exchange
from ...core.policy import Policy, reads
from ...wire.api_keys import ApiKey
from ...wire.views import MessageRequest, MessageResponse, ResponseView

if TYPE_CHECKING:
    from .metrics import ShareMetrics

#: AcknowledgeTypes values (KIP-932; 4 from KIP-1222, ShareFetch/ShareAcknowledge v2)
ACK_TYPES: dict[int, str] = {0: "gap", 1: "accept", 2: "release", 3: "reject", 4: "renew"}


def acknowledged(body: Any) -> dict[str, int]:
    """Offsets acknowledged per type name in a ShareFetch/ShareAcknowledge request (types Sluice does not know are
    counted as ``unknown``)."""
    counts: dict[str, int] = {}
    for topic in body.topics or ():
        for p in topic.partitions or ():
            for batch in p.acknowledgement_batches or ():
                types = batch.acknowledge_types or ()
                span = batch.last_offset - batch.first_offset + 1
                if span <= 0 or not types:
                    continue
                if len(types) == 1:  # one type for the whole range
                    name = ACK_TYPES.get(types[0], "unknown")
                    counts[name] = counts.get(name, 0) + span
                    continue
                for t in types[:span]:  # one type per offset
                    name = ACK_TYPES.get(t, "unknown")
                    counts[name] = counts.get(name, 0) + 1
    return counts


def acquired(body: Any) -> int:
    """Records a ShareFetch response acquired for the member (its AcquiredRecords ranges, inclusive)."""
    return sum(max(0, r.last_offset - r.first_offset + 1)
               for topic in body.responses or () for p in topic.partitions or () for r in p.acquired_records or ())


class ShareGroups(Policy):
    name = "share_groups"

    def __init__(self, metrics: ShareMetrics) -> None:
        self.apis = reads(ApiKey.SHARE_FETCH, ApiKey.SHARE_ACKNOWLEDGE)
        self.metrics = metrics

    def on_request(self, ex: Exchange, conn: Any) -> Any:
        request = ex.request
        assert isinstance(request, MessageRequest)
        counts = acknowledged(request.body)
        if counts:
            ex.log["share_acknowledged"] = counts
            for name, n in counts.items():
                self.metrics.acknowledged.labels(ex.api, name).inc(n)
        if ex.header.api_key != ApiKey.SHARE_FETCH:
            return None
        ex.collect = True  # the address rewriting collects it anyway (its NodeEndpoints)
        return True

    def on_response(self, ex: Exchange, response: ResponseView, conn: Any, state: Any) -> None:
        assert isinstance(response, MessageResponse)
        n = acquired(response.body)
        ex.log["share_acquired"] = n
        if n:
            self.metrics.acquired.inc(n)
