"""What share consumers (KIP-932) were handed and what they acknowledged, on the proxy's registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter


class ShareMetrics:
    """Records acquired (ShareFetch responses) and acknowledged (ShareFetch and ShareAcknowledge requests)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.acquired = Counter(
            "sluice_share_records_acquired_total",
            "Records share consumers acquired: the AcquiredRecords ranges of the ShareFetch responses handed to "
            "them (each is locked for that member until acknowledged or its lock lapses).", registry=registry)
        self.acknowledged = Counter(
            "sluice_share_records_acknowledged_total",
            "Record offsets share consumers acknowledged, by API (ShareFetch piggy-backs them, ShareAcknowledge "
            "sends them alone) and type (accept, release, reject, gap, renew: KIP-932, KIP-1222).",
            ["api", "type"], registry=registry)
