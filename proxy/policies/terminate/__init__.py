"""Fetch sessions terminated in Sluice (KIP-227): the ``[sessions]`` section."""

from ...core.registration import Registration
from .dashboard import ROW
from .metrics import SessionMetrics
from .policy import Terminate
from .settings import SessionsSettings

REGISTRATION = Registration(Terminate, "sessions", SessionsSettings, metrics=SessionMetrics, log_fields={
    "session_upstream_bytes": "int: on fetches Sluice sent upstream in its own session ([sessions] terminate), the "
                              "upstream response bytes (every attempt), to compare with bytes_proxy_to_client"},
    dashboard=ROW)

__all__ = ["REGISTRATION", "SessionsSettings", "Terminate"]
