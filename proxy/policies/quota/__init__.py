"""Client quotas (KIP-13 byte rates, KIP-124 request rates) enforced as KIP-219 does, changeable at run time."""

from ...core.registration import Registration
from .dashboard import ROW
from .metrics import QuotaMetrics
from .policy import Quota
from .settings import QuotaSettings

REGISTRATION = Registration(
    Quota, "quota", QuotaSettings, dynamic=True, admin_path="/quotas", metrics=QuotaMetrics, status=Quota.status,
    needs_fleet=QuotaSettings.fleet_key,
    log_fields={"quota_throttle_time_ms": "int: on requests a quota selects, the throttle time Sluice applied (0: "
                                          "within quota), ms; the response's throttle_time_ms is the larger of it "
                                          "and the broker's (KIP-219)"}, dashboard=ROW)

__all__ = ["REGISTRATION", "Quota", "QuotaSettings"]
