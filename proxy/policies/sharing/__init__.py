"""Cooperative consumption: consumers share partitions by key-hash slice. See :mod:`.policy`."""

from ...core.registration import Registration
from .dashboard import ROW
from .metrics import SharingMetrics
from .policy import Sharing
from .settings import SharingSettings

REGISTRATION = Registration(Sharing, "sharing", SharingSettings, metrics=SharingMetrics, dashboard=ROW)

__all__ = ["REGISTRATION", "Sharing", "SharingSettings"]
