"""Share groups (KIP-932) seen: records acquired and acknowledged, for the access log and the metrics."""

from ...core.registration import Registration
from .dashboard import ROW
from .metrics import ShareMetrics
from .policy import ShareGroups

REGISTRATION = Registration(
    lambda _settings, _services, metrics: ShareGroups(metrics), metrics=ShareMetrics, log_fields={
        "share_acquired": "int: on ShareFetch lines (KIP-932), the records the broker acquired for the member",
        "share_acknowledged": "object: on ShareFetch/ShareAcknowledge lines, records acknowledged per type "
                              '({"ACCEPT": n, "RELEASE": n, "REJECT": n, "GAP": n})'}, dashboard=ROW)

__all__ = ["REGISTRATION", "ShareGroups"]
