"""Sluice's codec runtime: Kafka's JSON message specs and Sluice's own specs compiled to construct structs."""

from .errors import CodecError
from .model import Message

__all__ = ["CodecError", "Message"]
