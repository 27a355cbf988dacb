"""Fetch sessions terminated in Sluice (KIP-227): the ``[sessions]`` section."""

from ...core.registration import Registration
from .metrics import SessionMetrics
from .policy import Terminate
from .settings import SessionsSettings

REGISTRATION = Registration(Terminate, "sessions", SessionsSettings, metrics=SessionMetrics)

__all__ = ["REGISTRATION", "SessionsSettings", "Terminate"]
