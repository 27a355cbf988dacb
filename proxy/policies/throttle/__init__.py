"""throttle"""

from .policy import Throttle

__all__ = ["Throttle"]
