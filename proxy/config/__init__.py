"""Sluice's configuration: defaults <- TOML file <- environment (<- the state file), validated. It knows no policy:
the settings model of Sluice's registered policies is composed above it, in ``proxy/app.py``.

- :mod:`.base`: the vocabulary every settings model uses (``Section``, ``ConfigError``, shared checks), what
  policies import for their own sections;
- :mod:`.sections`: the core sections (listen, upstream, limits, shutdown, admin, logging, fleet);
- :mod:`.loader`: a settings model composed from those and the sections handed in, loaded from TOML and the
  environment, every problem one line naming the key;
- :mod:`.state`: the state file of the run-time changeable sections.
"""

from .base import (
    ConfigError,
    KeyedValueError,
    Section,
    check_topic_name,
    check_topic_or_glob,
    parse_host_port,
    topic_is_glob,
)
from .loader import CoreSettings, SectionOwner, compose
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
from .state import apply_state_file, read_state, save_state_section, write_state

__all__ = [
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
    "SectionOwner",
    "ServerTlsSettings",
    "ShutdownSettings",
    "UpstreamSaslSettings",
    "UpstreamSettings",
    "apply_state_file",
    "check_topic_name",
    "check_topic_or_glob",
    "compose",
    "parse_host_port",
    "read_state",
    "save_state_section",
    "topic_is_glob",
    "write_state",
]
