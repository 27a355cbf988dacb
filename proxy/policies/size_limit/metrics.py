"""The size-limit policy's metrics (KIP-74), on the proxy's registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter


class SizeLimitMetrics:
    """What budgets did to fetch responses."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.trimmed = Counter(
            "sluice_size_limit_trimmed_bytes_total",
            "Record bytes left out of fetch responses to keep them within their budget (cut at batch boundaries).",
            registry=r)
        self.deferred = Counter(
            "sluice_size_limit_deferred_partitions_total",
            "Partitions whose records were all left out of a response (kept, error 0, real offsets, empty "
            "records).", registry=r)
        self.limited = Counter("sluice_size_limit_limited_responses_total",
                                          "Fetch responses the budget changed.", registry=r)
        self.share_clamped = Counter(
            "sluice_size_limit_share_clamped_requests_total",
            "ShareFetch requests (KIP-932) whose MaxBytes was lowered to the budget (their responses are never "
            "trimmed: a record cut from one would stay acquired).", registry=r)

    def observe(self, trimmed_bytes: int, deferred_partitions: int) -> None:
        """Count what a budget did to one response."""
        if trimmed_bytes:
            self.limited.inc()
            self.trimmed.inc(trimmed_bytes)
        if deferred_partitions:
            self.deferred.inc(deferred_partitions)
