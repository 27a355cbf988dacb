"""Cooperative consumption: consumers share partitions by key-hash slice. See :mod:`.policy`.

The policy's own modules (the group calls, slices, offsets and the fetch filter: ~0.9 MiB and ~25 ms of every
start) load only in a Sluice that shares: ``[sharing]`` is read at start only (its registration is not dynamic),
and one with ``sharing.enabled`` off, most of a fleet of sidecars, gets :class:`SharingOff` instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...core.policy import Policy
from ...core.registration import Registration
from .dashboard import ROW
from .metrics import SharingMetrics
from .settings import SharingSettings

if TYPE_CHECKING:
    from ...core.policy import Services


class SharingOff(Policy):
    """Sharing switched off for the process's life: it declares no API, so the chain never calls it."""

    name = "sharing"


def make(settings: SharingSettings, services: Services, metrics: SharingMetrics) -> Policy:
    if not settings.enabled:
        return SharingOff()
    from .policy import Sharing

    return Sharing(settings, services, metrics)


REGISTRATION = Registration(make, "sharing", SharingSettings, metrics=SharingMetrics, dashboard=ROW)

__all__ = ["REGISTRATION", "SharingOff", "SharingSettings", "make"]
