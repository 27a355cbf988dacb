"""Cooperative consumption: consumers share partitions by key-hash slice. See :mod:`.policy`."""

from .policy import Sharing

__all__ = ["Sharing"]
