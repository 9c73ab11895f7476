"""The `scaled(fmt, exponent)` combinator: a format shifted by a power of two."""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from mpjax.formats._base import NumberFormat
from mpjax.formats._bits import source_layout, storage_uint
from mpjax.formats._minifloat import MinifloatFormat

__all__ = ["ScaledFormat", "scaled"]

_MIN_VALUE = 2.0**-125  # smallest allowed positive value, inner and scaled
_F32_MAX_EXCLUSIVE = 2.0**128


@dataclasses.dataclass(frozen=True)
class ScaledFormat(NumberFormat):
    """`inner` applied to `x * 2**exponent`; decoding multiplies by `2**-exponent`.

    Multiplying by a power of two is exact while the product is a normal float;
    products that would underflow are resolved on the exponent bits (see
    `_encode`). So the scaled format inherits the inner format's rounding
    (nearest, ties to even), signed zeros, overflow and NaN behaviour, with every
    threshold divided by `2**exponent`. Build it with `scaled`.

    Attributes:
        name: registry name.
        inner: the underlying format.
        exponent: the power of two applied before encoding.
    """

    name: str
    inner: NumberFormat
    exponent: int

    @property
    def has_inf(self) -> bool:  # type: ignore[override]
        return self.inner.has_inf

    @property
    def has_nan(self) -> bool:  # type: ignore[override]
        return self.inner.has_nan

    @property
    def bits(self) -> int:
        return self.inner.bits

    @property
    def storage_dtype(self) -> np.dtype:
        return self.inner.storage_dtype

    @property
    def max(self) -> float:
        return self.inner.max * 2.0**-self.exponent

    @property
    def min_normal(self) -> float | None:
        inner = self.inner.min_normal
        return None if inner is None else inner * 2.0**-self.exponent

    @property
    def min_subnormal(self) -> float:
        return self.inner.min_subnormal * 2.0**-self.exponent

    @functools.cached_property
    def epsilon(self) -> float:  # type: ignore[override]
        """Distance from 1.0 to the next larger value: the inner format's gap above
        `2**exponent`, relative to it.

        That is the inner epsilon for a minifloat whose normal range holds
        `2**exponent`, but not for a posit, whose precision falls off away from
        1.0 (posit16 scaled by 2**10 keeps 7 fraction bits at 1.0, 12 at
        2**-10). Read off the inner codec: the code after that of `2**exponent`.
        Where `2**exponent` is not an inner value, this is the inner epsilon.
        """
        power = 2.0**self.exponent
        with jax.ensure_compile_time_eval():
            code = np.asarray(self.inner.encode(np.float32(power)))
            uint = storage_uint(8 * code.dtype.itemsize)
            after = (code.view(uint) + 1).astype(uint).view(code.dtype)
            here = float(self.inner.decode(code))
            above = float(self.inner.decode(after))
        if here != power or not math.isfinite(above) or above <= power:
            return self.inner.epsilon
        return above / power - 1.0

    @property
    def _tiny_products_vanish(self) -> bool:
        """Whether `_encode` may skip its exponent-bit test for tiny products.

        With `exponent >= 0` only subnormal `x` leave the normal range. Their
        product, exact or flushed to a zero of `x`'s sign, has a magnitude below
        `2**(exponent - 126)`; when that is at most half the smallest subnormal of
        a minifloat inner format, it rounds to a zero of `x`'s sign, exactly like
        the smallest normal the test would substitute (`2**-126`, at most half of
        any smallest value >= 2**-125). fp16s (float16, exponent 15) qualifies.
        Overflowing products become Inf, which a minifloat encodes like the huge
        true product (Inf, or +-max/NaN where the format has no Inf).
        The test costs about a quarter of a fused LBM collision on XLA:CPU.
        """
        return (
            isinstance(self.inner, MinifloatFormat)
            and self.exponent >= 0
            and 2.0 ** (self.exponent - 125) <= self.inner.min_subnormal
        )

    def _encode(self, x: jax.Array) -> jax.Array:
        factor = jnp.asarray(2.0**self.exponent, x.dtype)
        if self._tiny_products_vanish:
            return self.inner.encode(x * factor)
        # Products that leave the normal range (and subnormal x, which the CPU may
        # treat as zero) are decided on the exponent bits, not with float
        # arithmetic: tiny ones become the smallest normal of x's sign, which the
        # inner format rounds exactly like the tiny true product (to zero for
        # minifloats, whose smallest value is >= 2**-125; to minpos for posits);
        # finite ones that would overflow become the largest finite value of x's
        # sign, which the inner format rounds like the huge true product (Inf or
        # +-max for minifloats; +-maxpos for posits, where Inf would give NaR).
        src = source_layout(x.dtype)
        bits = lax.bitcast_convert_type(x, src.uint)
        magnitude = bits & jnp.asarray(src.abs_mask, src.uint)
        biased_exp = (magnitude >> jnp.asarray(src.mantissa_bits, src.uint)).astype(
            src.sint
        )
        tiny_result = (magnitude != 0) & (
            (biased_exp == 0) | (biased_exp + self.exponent < 1)
        )
        inf_exp = 2 * src.bias + 1  # biased exponent of Inf and NaN
        huge_result = (biased_exp != inf_exp) & (biased_exp + self.exponent >= inf_exp)
        negative = (bits >> jnp.asarray(src.width - 1, src.uint)) != 0
        # signed constants as host values (no arithmetic on constants: kernel
        # lowerings such as Pallas' Triton take operands, not literals)
        tiny = np.finfo(x.dtype).tiny
        huge = np.finfo(x.dtype).max
        y = jnp.where(tiny_result, jnp.where(negative, -tiny, tiny), x * factor)
        y = jnp.where(huge_result, jnp.where(negative, -huge, huge), y)
        return self.inner.encode(y)

    def _decode(self, stored: jax.Array, dtype: np.dtype) -> jax.Array:
        factor = jnp.asarray(2.0**-self.exponent, dtype)
        return self.inner.decode(stored, dtype) * factor


def scaled(fmt: NumberFormat, exponent: int, name: str | None = None) -> ScaledFormat:
    """Returns `fmt` applied to `x * 2**exponent` (decode divides it out again).

    `scaled(get_format("float16"), 15)` is fp16s: float16 storage (fast F16C
    conversions) for values in roughly [2**-39, 2).

    Args:
        fmt: the underlying format (any `NumberFormat`, e.g. from `get_format`).
        exponent: the power of two; positive values move the range down.
        name: the format's name; default `f"{fmt.name}*2^{exponent}"`.

    Returns:
        The `ScaledFormat`.

    Raises:
        TypeError: if `fmt` is not a `NumberFormat` or `exponent` not an int.
        ValueError: if the inner format or the scaled range reaches below
            2**-125 or the scaled range above 2**128.

    >>> from mpjax.formats import get_format
    >>> scaled(get_format("float16"), 15).max
    1.9990234375
    """
    if not isinstance(fmt, NumberFormat):
        raise TypeError(
            f"fmt must be a NumberFormat (e.g. get_format('float16')), got "
            f"{type(fmt).__name__} {fmt!r}"
        )
    if isinstance(exponent, bool) or not isinstance(exponent, int | np.integer):
        raise TypeError(
            f"exponent must be an int power of two, got {type(exponent).__name__} "
            f"{exponent!r}"
        )
    exponent = int(exponent)
    if name is None:
        name = f"{fmt.name}*2^{exponent}"
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str or None, got {name!r}")
    if fmt.min_subnormal < _MIN_VALUE:
        raise ValueError(
            f"scaled() needs an inner format whose smallest positive value is at "
            f"least 2**-125 (so x * 2**exponent never relies on float32 "
            f"subnormals, which XLA:CPU flushes to zero); {fmt.name} goes down to "
            f"{fmt.min_subnormal:g}. Use a 16-bit or smaller format such as float16"
        )
    out = ScaledFormat(name, fmt, exponent)
    if out.max >= _F32_MAX_EXCLUSIVE or out.min_subnormal < _MIN_VALUE:
        raise ValueError(
            f"scaled({fmt.name}, {exponent}) spans [{out.min_subnormal:g}, "
            f"{out.max:g}], which must lie within [2**-125, 2**128) (float32's "
            f"normal range, one binade of margin at the bottom); choose an exponent "
            f"between {_exp_bounds(fmt)[0]} and {_exp_bounds(fmt)[1]}"
        )
    return out


def _exp_bounds(fmt: NumberFormat) -> tuple[int, int]:
    lo = math.floor(math.log2(fmt.max)) - 127
    hi = math.floor(math.log2(fmt.min_subnormal)) + 125
    return lo, hi
