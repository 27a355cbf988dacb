"""size_limit"""

from .policy import SizeLimit

__all__ = ["SizeLimit"]
