"""mpjax: functional mixed precision for JAX."""

from mpjax import formats

__all__ = ["formats"]
