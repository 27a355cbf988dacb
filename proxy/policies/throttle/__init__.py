"""Replication throttles (KIP-73): quotas on throttled partitions, changeable at run time."""

from ...core.registration import Registration
from .dashboard import ROW
from .metrics import ThrottleMetrics
from .policy import Throttle
from .settings import ThrottleSettings

REGISTRATION = Registration(
    Throttle, "throttle", ThrottleSettings, dynamic=True, admin_path="/throttles", metrics=ThrottleMetrics,
    status=Throttle.status, log_fields={
        "throttle_target_bps": "int: on throttled fetches (KIP-73), the leader rate in force, bytes/s",
        "throttled_bytes": "int: with throttle_target_bps, the record bytes of this response that counted against "
                           "it"}, dashboard=ROW)

__all__ = ["REGISTRATION", "Throttle", "ThrottleSettings"]
