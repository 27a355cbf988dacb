"""terminate"""

from .policy import Terminate

__all__ = ["Terminate"]
