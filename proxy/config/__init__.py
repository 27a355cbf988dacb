"""Sluice's configuration: defaults <- TOML file <- environment (<- the state file), validated.

- :mod:`.base`: the vocabulary every settings model uses (``Section``, ``ConfigError``, shared checks), what
  policies import for their own sections;
- :mod:`.sections`: the core sections (listen, upstream, limits, shutdown, admin, logging);
- :mod:`.loader`: the settings model composed from those and the registered policies' own sections
  (``proxy/policies/__init__.py``), loaded from TOML and the environment, every problem one line naming the key;
- :mod:`.state`: the state file of the run-time changeable sections.

Imports go one way: loader -> the policies (their sections) -> base. So that a policy (or a module a policy uses,
like the access log) importing ``proxy.config.base`` or a core section does not import the loader, and with it the
policies being imported, the loader's and the state file's names are imported here on first use (PEP 562).
"""

import importlib
from typing import TYPE_CHECKING, Any

from .base import (
    ConfigError,
    KeyedValueError,
    Section,
    check_topic_name,
    check_topic_or_glob,
    parse_host_port,
    topic_is_glob,
)
from .sections import (
    AccessLogKafkaSettings,
    AdminSettings,
    ClientTlsSettings,
    FleetSettings,
    LimitsSettings,
    ListenSettings,
    LoggingSettings,
    ServerTlsSettings,
    ShutdownSettings,
    UpstreamSaslSettings,
    UpstreamSettings,
)

if TYPE_CHECKING:
    from .loader import DYNAMIC_SECTIONS, CoreSettings, Settings, compose, load_settings
    from .state import apply_state_file, read_state, save_state_section, write_state

_LAZY = {"DYNAMIC_SECTIONS": "loader", "CoreSettings": "loader", "Settings": "loader", "compose": "loader",
         "load_settings": "loader", "apply_state_file": "state", "read_state": "state",
         "save_state_section": "state", "write_state": "state"}

__all__ = [
    "DYNAMIC_SECTIONS",
    "AccessLogKafkaSettings",
    "AdminSettings",
    "ClientTlsSettings",
    "ConfigError",
    "CoreSettings",
    "FleetSettings",
    "KeyedValueError",
    "LimitsSettings",
    "ListenSettings",
    "LoggingSettings",
    "Section",
    "ServerTlsSettings",
    "Settings",
    "ShutdownSettings",
    "UpstreamSaslSettings",
    "UpstreamSettings",
    "apply_state_file",
    "check_topic_name",
    "check_topic_or_glob",
    "compose",
    "load_settings",
    "parse_host_port",
    "read_state",
    "save_state_section",
    "topic_is_glob",
    "write_state",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
