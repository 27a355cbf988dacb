"""Response-size limiting (KIP-74): byte budgets per fetch, progress, fairness; the section also sets the
proxy-wide bound on response bytes held."""

from ...core.registration import Registration
from .dashboard import ROW
from .metrics import SizeLimitMetrics
from .policy import SizeLimit
from .settings import SizeLimitSettings

REGISTRATION = Registration(
    SizeLimit, "size_limit", SizeLimitSettings, dynamic=True, admin_path="/size-limits", metrics=SizeLimitMetrics,
    memory_bound=lambda settings: settings.global_max_bytes, dashboard=ROW)

__all__ = ["REGISTRATION", "SizeLimit", "SizeLimitSettings"]
