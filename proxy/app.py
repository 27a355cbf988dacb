"""The composition root: the registry of policies (the built-in ones and those installed from other packages) and
Sluice's settings model composed from it, with the loader that reads it.

It stands above the configuration and the policies, so neither knows the other: ``proxy.config`` composes
whatever sections it is handed, and a policy sees only its own section. Whatever needs Sluice's whole settings
model (the CLI, the rig, the tests) takes it from here.

Policies from other packages: a Python package declares its policy's :class:`~proxy.core.registration.Registration`
under the entry-point group ``sluice.policies`` (as Kroxylicious loads filters from its classpath), e.g. in its
``pyproject.toml``::

    [project.entry-points."sluice.policies"]
    schema_id = "sluice_schema_id:REGISTRATION"

Installed beside Sluice, it is composed like a built-in one: its section (TOML, ``SLUICE_<SECTION>__<KEY>``,
errors naming its keys), metrics, access-log fields, admin endpoint. Installed policies sit in the chain between
the built-in client-side policies and those next to the broker (``proxy.policies``), in the order of their
entry-point names; a policy does nothing until its section asks it to (the contract: ``Policy.unread`` true for
every request under its defaults), so installing a package changes nothing by itself.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points
from typing import TYPE_CHECKING

from .config import loader
from .config.base import ConfigError
from .config.loader import CoreSettings, compose
from .core.registration import Registration
from .policies import BROKER_SIDE, CLIENT_SIDE

__all__ = ["DYNAMIC_SECTIONS", "ENTRY_POINTS", "REGISTRY", "Settings", "chain_of", "installed_policies",
           "load_settings"]

#: the entry-point group policies from other packages are declared under
ENTRY_POINTS = "sluice.policies"


def installed_policies() -> tuple[tuple[Registration, ...], tuple[ConfigError, ...]]:
    """The registrations other packages declare under :data:`ENTRY_POINTS`, by entry-point name, and what is wrong
    with those that do not load or are no Registration (each a configuration error naming it: loading the settings
    raises the first, so ``sluice`` exits 2 with its message, never a traceback)."""
    found: list[Registration] = []
    broken: list[ConfigError] = []
    for ep in sorted(entry_points(group=ENTRY_POINTS), key=lambda e: e.name):
        key = f"{ENTRY_POINTS}.{ep.name}"
        try:
            registration = ep.load()
        except Exception as e:  # anything a broken package raises on import
            broken.append(ConfigError(key, f"{ep.value} does not load: {type(e).__name__}: {e}"))
            continue
        if isinstance(registration, Registration):
            found.append(registration)
        else:
            broken.append(ConfigError(key, f"{ep.value} is not a proxy.core.registration.Registration (got "
                                           f"{type(registration).__name__})"))
    return tuple(found), tuple(broken)


def chain_of(installed: Sequence[Registration]) -> tuple[Registration, ...]:
    """The registry with ``installed`` policies, in chain order: the built-in client side, the installed ones, the
    broker side."""
    return (*CLIENT_SIDE, *installed, *BROKER_SIDE)


_INSTALLED, _BROKEN = installed_policies()
#: every policy of this Sluice, in chain order (:func:`chain_of` the installed ones)
REGISTRY: tuple[Registration, ...] = chain_of(_INSTALLED)

if TYPE_CHECKING:
    Settings = CoreSettings
else:
    #: All of Sluice's settings: the core sections and those of the registered policies.
    Settings = compose(REGISTRY)
#: The sections changeable while running (admin API, SIGHUP), and so the ones a state file holds.
DYNAMIC_SECTIONS = Settings.dynamic_sections


def load_settings(path: str | os.PathLike[str] | None, env: Mapping[str, str] | None = None,
                  model: type[Settings] = Settings) -> Settings:
    """Defaults <- TOML file at ``path`` (None = no file) <- ``env`` overrides (None = ``os.environ``), as Sluice's
    settings model (or ``model``, another one :func:`~proxy.config.loader.compose` made). Raises
    :class:`~proxy.config.base.ConfigError` for anything invalid, an installed policy that does not load included."""
    if _BROKEN:
        raise _BROKEN[0]
    return loader.load_settings(path, env, model=model)
