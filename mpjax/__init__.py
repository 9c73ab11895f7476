"""mpjax: functional mixed precision for JAX."""

from mpjax import formats
from mpjax._policy import Policy, get_policy

__all__ = [
    "Policy",
    "formats",
    "get_policy",
]
