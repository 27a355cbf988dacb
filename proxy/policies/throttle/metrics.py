"""The throttle policy's metrics (KIP-73), on the proxy's registry."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge

SIDES: Final[tuple[str, ...]] = ("leader", "follower")


class ThrottleMetrics:
    """Quotas measured and configured, partitions held back."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.throttle_byte_rate = Gauge(
            "sluice_throttle_byte_rate",
            "Bytes/s of throttled partitions over the quota window (Kafka's LeaderReplication/FollowerReplication "
            "byte-rate): leader = sent to fetchers, follower = fetched upstream.", ["side"], registry=r)
        self.throttle_bytes = Counter(
            "sluice_throttle_bytes_total",
            "Record bytes of throttled partitions counted against the quota: leader = sent to fetchers, "
            "follower = fetched upstream (every partition a response carries, listed in the request or not).",
            ["side"], registry=r)
        self.throttle_rate_limit = Gauge(
            "sluice_throttle_rate_limit_bytes",
            "Configured throttle in bytes/s (throttle.leader_rate_bytes / follower_rate_bytes); 0 = none.",
            ["side"], registry=r)
        self.throttle_window = Gauge("sluice_throttle_window_seconds",
                                     "Quota window: samples x window_s (Kafka: 11 x 1 s).", registry=r)
        self.throttle_topics = Gauge(
            "sluice_throttle_topics", "Throttled-replicas entries ([[throttle.topics]]: topic names and globs).",
            registry=r)
        self.throttle_left_out = Counter(
            "sluice_throttle_left_out_partitions_total",
            "Throttled partitions held back: leader = records left out of a response (partition kept, empty "
            "records), follower = left out of a request sent upstream, or their records out of the response "
            "when the request could not leave them out (a fetch session's partitions).", ["side"], registry=r)
        self.throttle_sum_lag = Gauge(
            "sluice_throttle_sum_lag_offsets",
            "Sum over throttled partitions and fetchers of high watermark - fetch offset (KIP-73's SumReplicaLag): "
            "if it stops falling, the throttle is too low for the move to finish.", registry=r)
        for side in SIDES:
            self.throttle_left_out.labels(side)
            self.throttle_bytes.labels(side)
            self.throttle_byte_rate.labels(side)
            self.throttle_rate_limit.labels(side)
        self.throttle_left_out_leader = self.throttle_left_out.labels("leader")
        self.throttle_left_out_follower = self.throttle_left_out.labels("follower")
        self.throttle_bytes_leader = self.throttle_bytes.labels("leader")
        self.throttle_bytes_follower = self.throttle_bytes.labels("follower")

    def bind(self, state: Any, throttles: Any, clock: Callable[[], float]) -> None:
        """Point the throttle gauges at the proxy's quotas (proxy.policies.throttle.ThrottleState) and the
        configuration in force; called again on every reconfiguration."""
        self.throttle_byte_rate.labels("leader").set_function(lambda: state.leader.rate(clock()))
        self.throttle_byte_rate.labels("follower").set_function(lambda: state.follower.rate(clock()))
        self.throttle_sum_lag.set_function(lambda: state.sum_lag(clock()))
        self.throttle_rate_limit.labels("leader").set(throttles.leader_rate)
        self.throttle_rate_limit.labels("follower").set(throttles.follower_rate)
        self.throttle_window.set(throttles.samples * throttles.window_s)
        self.throttle_topics.set(len(throttles.topics))
