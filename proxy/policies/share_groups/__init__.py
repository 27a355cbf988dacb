"""Share groups (KIP-932) seen: records acquired and acknowledged, for the access log and the metrics."""

from ...core.registration import Registration
from .metrics import ShareMetrics
from .policy import ShareGroups

REGISTRATION = Registration(lambda _settings, _services, metrics: ShareGroups(metrics), metrics=ShareMetrics)

__all__ = ["REGISTRATION", "ShareGroups"]
