"""Sans-IO policies over decoded messages, one module or package each, and the one list that registers them.

:data:`POLICIES` lists the chain's policies in order, client side first: requests go through them top to bottom
(towards the broker), responses bottom to top (see :mod:`proxy.core.chain`). Each entry is a
:class:`~proxy.core.registration.Registration`: the policy, its config section and settings model, whether the
section changes at run time, its metrics, its access-log fields. The settings model (``proxy.app``), the proxy,
the admin API and the state file are composed from this list and the policies installed from other packages
(``proxy.app``: the ``sluice.policies`` entry points). Adding a built-in policy is a package here and one line
below; adding one from outside Sluice is a package of its own and one entry point.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..core.policy import Policy, Services
from ..core.registration import Registration
from . import quota, share_groups, sharing, size_limit, terminate, throttle
from .addresses import Addresses
from .api_versions import ApiVersions
from .sasl import Sasl

if TYPE_CHECKING:
    from ..config import CoreSettings

#: the built-in policies from the client's side up to the ones next to the broker; policies installed from other
#: packages (``proxy.app``, the ``sluice.policies`` entry points) come between the two
CLIENT_SIDE: tuple[Registration, ...] = (
    # SASL relayed untouched; the accepted principal's name becomes the connection's
    Registration(lambda _settings, services, _metrics: Sasl(services)),
    Registration(lambda _settings, services, _metrics: ApiVersions(services)),  # only versions Sluice reads
    Registration(lambda _settings, services, _metrics: Addresses(services)),  # no broker's real address leaks
    quota.REGISTRATION,  # KIP-13/KIP-124 client quotas, enforced as KIP-219 (throttle_time_ms, muting)
    size_limit.REGISTRATION,  # KIP-74 byte budgets
    throttle.REGISTRATION,  # KIP-73 replication throttles
    share_groups.REGISTRATION,  # KIP-932 share groups: records acquired and acknowledged (access log, metrics)
    sharing.REGISTRATION,  # cooperative consumption: consumers share partitions by key-hash slice
)
#: the built-in policies next to the broker: they see a request last and its response first
BROKER_SIDE: tuple[Registration, ...] = (
    terminate.REGISTRATION,  # KIP-227: Sluice owns the fetch sessions (next to the broker)
)
#: every built-in policy, in chain order
POLICIES: tuple[Registration, ...] = CLIENT_SIDE + BROKER_SIDE


def build(settings: CoreSettings, services: Services) -> list[Policy]:
    """The policies of one proxy, in chain order: those its settings model was composed from
    (``settings.policies``), each given its section and its metrics, made on the proxy's registry."""
    registry = services.metrics.registry
    policies = [r.make(getattr(settings, r.section) if r.section else None, services,
                       r.metrics(registry) if r.metrics is not None else None)
                for r in settings.policies]
    for policy in policies:
        policy.composed(policies)
    return policies


def dynamic_sections(settings: CoreSettings, policies: Sequence[Policy]) -> dict[Policy, Any]:
    """Each of ``policies`` (built from ``settings.policies`` by :func:`build`, in that order) whose section
    changes at run time, with that section of ``settings``: what ``Chain.reconfigure`` hands each policy."""
    return {policy: getattr(settings, r.section) for policy, r in zip(policies, settings.policies, strict=True)
            if r.dynamic}


def memory_bound(settings: CoreSettings) -> int:
    """The proxy-wide bound on response bytes held (proxy/core/memory.py) that the sections set; 0 = none."""
    bounds = [r.memory_bound(getattr(settings, r.section)) for r in settings.policies if r.memory_bound is not None]
    return min((b for b in bounds if b), default=0)
