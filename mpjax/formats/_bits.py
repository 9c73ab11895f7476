"""Bit-level helpers shared by the integer codecs."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "SourceLayout",
    "clz32",
    "source_layout",
    "rne_shift_right",
    "storage_uint",
]


class SourceLayout(NamedTuple):
    """Bit layout of the IEEE binary float being encoded (float32 or float64)."""

    uint: np.dtype  # unsigned integer of the same width
    sint: np.dtype  # signed integer of the same width
    width: int  # total bits
    exponent_bits: int
    mantissa_bits: int
    bias: int

    @property
    def abs_mask(self) -> int:
        return (1 << (self.width - 1)) - 1

    @property
    def uint_max(self) -> int:
        return (1 << self.width) - 1

    @property
    def mantissa_mask(self) -> int:
        return (1 << self.mantissa_bits) - 1

    @property
    def inf_bits(self) -> int:
        return ((1 << self.exponent_bits) - 1) << self.mantissa_bits


_F32 = SourceLayout(np.dtype(np.uint32), np.dtype(np.int32), 32, 8, 23, 127)
_F64 = SourceLayout(np.dtype(np.uint64), np.dtype(np.int64), 64, 11, 52, 1023)


def source_layout(dtype: np.dtype) -> SourceLayout:
    """The layout for a float32 or float64 working dtype."""
    return _F64 if np.dtype(dtype) == np.dtype(np.float64) else _F32


def storage_uint(bits: int) -> np.dtype:
    """The smallest unsigned dtype (uint8, uint16 or uint32) that holds `bits`
    bits."""
    for dtype in (np.uint8, np.uint16):
        if bits <= 8 * np.dtype(dtype).itemsize:
            return np.dtype(dtype)
    return np.dtype(np.uint32)


def rne_shift_right(value: jax.Array, shift: jax.Array) -> jax.Array:
    """`value / 2**shift` rounded to nearest, ties to even (unsigned ints).

    `shift` is an array of the same unsigned dtype with values >= 1; it may be as
    large as the bit width (then the result is 0 or 1 by the usual rule, so callers
    clamp it to `mantissa_bits + 2`).
    """
    one = jnp.ones((), value.dtype)
    quotient = value >> shift
    remainder = value & ((one << shift) - one)
    half = one << (shift - one)
    odd = (quotient & one) == one
    round_up = (remainder > half) | ((remainder == half) & odd)
    return quotient + round_up.astype(value.dtype)


def clz32(x: jax.Array) -> jax.Array:
    """Leading zeros of ``uint32`` values (32 for zero), as ``uint32``.

    A branch-free binary search of compares and shifts: the same bits as
    ``lax.clz``, in operations every backend lowers (GPU kernel compilers
    such as Pallas' Triton have no count-leading-zeros operation).

    >>> import jax.numpy as jnp
    >>> clz32(jnp.array([0, 1, 0x80000000], jnp.uint32)).tolist()
    [32, 31, 0]
    """
    x = x.astype(jnp.uint32)
    n = jnp.zeros(x.shape, jnp.uint32)
    v = x
    for shift in (16, 8, 4, 2, 1):
        small = v < jnp.uint32(1 << (32 - shift))  # the top `shift` bits are 0
        n = n + jnp.where(small, jnp.uint32(shift), jnp.uint32(0))
        v = jnp.where(small, v << jnp.uint32(shift), v)
    return jnp.where(x == jnp.uint32(0), jnp.uint32(32), n)
