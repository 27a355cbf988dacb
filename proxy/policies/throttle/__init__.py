"""Replication throttles (KIP-73): quotas on throttled partitions, changeable at run time."""

from ...core.registration import Registration
from .metrics import ThrottleMetrics
from .policy import Throttle
from .settings import ThrottleSettings

REGISTRATION = Registration(
    Throttle, "throttle", ThrottleSettings, dynamic=True, admin_path="/throttles", metrics=ThrottleMetrics,
    status=Throttle.status)

__all__ = ["REGISTRATION", "Throttle", "ThrottleSettings"]
