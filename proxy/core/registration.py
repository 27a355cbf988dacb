"""What the generic code knows of a policy: its :class:`Registration`, one per policy, listed in chain order in
``proxy/policies/__init__.py``.

A policy package brings everything of its own: the chain hooks (a :class:`~proxy.core.policy.Policy`), its
settings model and config section, whether that section changes at run time, its metrics. The loader
(``proxy.config``), the proxy, the admin API (``proxy.reconfigure``) and the state file compose what the list
gives them and name no policy: adding a policy is its package and one line in the list.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from ..config.base import Section
    from ..dashboard import Row
    from .policy import Policy, Services


@dataclass(frozen=True, slots=True)
class Registration:
    """One policy as the generic code sees it."""

    #: makes the policy of one proxy: (its section's settings, or None without a section; the proxy's services;
    #: its metrics, or None without a metrics factory) -> the policy
    make: Callable[[Any, Services, Any], Policy]
    #: its config section: the TOML table ``[section]``, env overrides ``SLUICE_<SECTION>__<KEY>``; "" = none
    section: str = ""
    #: the section's settings model
    settings: type[Section] | None = None
    #: whether the section is changeable at run time (admin API, SIGHUP, saved in ``admin.state_file``)
    dynamic: bool = False
    #: where the admin API serves a dynamic section (GET shows it, PUT replaces it whole)
    admin_path: str = ""
    #: makes the policy's metrics on the proxy's registry (their names, labels and help are the policy's)
    metrics: Callable[[CollectorRegistry], Any] | None = None
    #: what GET ``admin_path`` adds to the section as ``"status"``: what the policy measures now
    status: Callable[[Any], dict[str, Any]] | None = None
    #: the proxy-wide bound on response bytes held (:class:`~proxy.core.memory.HeldBytes`), if the section sets it
    memory_bound: Callable[[Any], int] | None = None
    #: the optional access-log fields the policy sets (``Exchange.log``): name -> its JSON type and meaning, as
    #: the access-log reference lists it (schema 1: a field is added, never renamed or retyped)
    log_fields: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: the key of a setting of the section that needs ``[fleet]`` on, if one is set ("": none); checked at load
    needs_fleet: Callable[[Any], str] | None = None
    #: the policy's row of the Grafana dashboard (config/grafana/dashboard.py), if it has metrics to show
    dashboard: Row | None = None

    def __post_init__(self) -> None:
        if bool(self.section) != (self.settings is not None):
            raise ValueError("a section needs its settings model, and a settings model its section")
        if self.dynamic and not (self.section and self.admin_path):
            raise ValueError(f"dynamic section {self.section!r} needs an admin_path")
