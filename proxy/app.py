"""The composition root: Sluice's settings model, composed from the core sections and the sections of the
registered policies (``proxy/policies/__init__.py``), and the loader that reads it.

It stands above the configuration and the policies, so neither knows the other: ``proxy.config`` composes
whatever sections it is handed, and a policy sees only its own section. Whatever needs Sluice's whole settings
model (the CLI, the rig, the tests) takes it from here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from .config import loader
from .config.loader import CoreSettings, compose
from .policies import POLICIES

__all__ = ["DYNAMIC_SECTIONS", "Settings", "load_settings"]

if TYPE_CHECKING:
    Settings = CoreSettings
else:
    #: All of Sluice's settings: the core sections and those of the registered policies.
    Settings = compose(POLICIES)
#: The sections changeable while running (admin API, SIGHUP), and so the ones a state file holds.
DYNAMIC_SECTIONS = Settings.dynamic_sections


def load_settings(path: str | os.PathLike[str] | None, env: Mapping[str, str] | None = None,
                  model: type[Settings] = Settings) -> Settings:
    """Defaults <- TOML file at ``path`` (None = no file) <- ``env`` overrides (None = ``os.environ``), as Sluice's
    settings model (or ``model``, another one :func:`~proxy.config.loader.compose` made). Raises
    :class:`~proxy.config.base.ConfigError` for anything invalid."""
    return loader.load_settings(path, env, model=model)
