"""One parameterised posit codec, posit<nbits, es>.

A posit code is read as a two's-complement integer: 0 is zero, `1 << (nbits - 1)`
is NaR ("not a real"), and negative values are the negated codes of positive ones.
The body of a positive code is a regime (a run of k equal bits ended by the
opposite bit or the end of the word; value r = k - 1 for ones, -k for zeros), then
up to `es` exponent bits, then fraction bits with a hidden leading one:
`x = 2**(r * 2**es + e) * (1 + f)`.

Encoding follows the posit standard: the exact value's (infinite) bit string is
rounded to `nbits` bits to nearest, ties to even, and then clamped so that no
non-zero value becomes 0 (below minpos -> +-minpos) and no finite value becomes NaR
(above maxpos -> +-maxpos). Rounding the bit string equals rounding the value to
the nearest posit wherever all `es` exponent bits are present; in the extreme
regimes where they are cut off, the midpoint between neighbours is their geometric
mean (as the standard specifies). NaN and +-Inf encode to NaR, and NaR decodes to
NaN. Both +0.0 and -0.0 encode to the single zero code.

Regimes are found with `lax.clz`; everything else is shifts and masks.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from mpjax.formats._base import NumberFormat
from mpjax.formats._bits import clz32, source_layout, storage_uint

__all__ = ["PositFormat", "posit"]


@dataclasses.dataclass(frozen=True)
class PositFormat(NumberFormat):
    """A posit format; build it with `posit`.

    Attributes:
        name: registry name.
        nbits: total bits (3..16).
        es: exponent bits (posit16 uses 1 as in the older SoftPosit convention,
            the 2022 posit standard uses 2).
    """

    name: str
    nbits: int
    es: int

    has_inf = False
    has_nan = True  # NaR

    @property
    def bits(self) -> int:
        return self.nbits

    @property
    def storage_dtype(self) -> np.dtype:
        return storage_uint(self.nbits)

    @property
    def _max_scale(self) -> int:
        return (self.nbits - 2) << self.es

    @property
    def max(self) -> float:
        """maxpos = useed**(nbits - 2) with useed = 2**(2**es)."""
        return 2.0**self._max_scale

    @property
    def min_normal(self) -> None:
        """Posits have no normal/subnormal distinction."""
        return None

    @property
    def min_subnormal(self) -> float:
        """minpos, the smallest positive posit."""
        return 2.0**-self._max_scale

    @property
    def epsilon(self) -> float:
        fraction_bits = self.nbits - 3 - self.es
        if fraction_bits >= 0:
            return 2.0**-fraction_bits
        # Exponent bits are cut off at 1.0: the next posit is a larger power of 2.
        return 2.0 ** (2 ** (-fraction_bits)) - 1.0

    # ----------------------------------------------------------------- codec
    def _encode(self, x: jax.Array) -> jax.Array:
        src = source_layout(x.dtype)
        n, es = self.nbits, self.es
        w, sm = src.width, src.mantissa_bits

        def c(v: int) -> jax.Array:
            return jnp.asarray(v, src.uint)

        u = lax.bitcast_convert_type(x, src.uint)
        sign = u >> c(w - 1)
        a = u & c(src.abs_mask)

        scale = (a >> c(sm)).astype(src.sint) - src.bias
        scale = jnp.clip(scale, -self._max_scale, self._max_scale)
        regime = scale >> es  # floor division (arithmetic shift)
        exponent = (scale & ((1 << es) - 1)).astype(src.uint)

        # Regime bits, left-aligned in the word after the (dropped) sign bit:
        # r >= 0: r + 1 ones and a zero; r < 0: -r zeros and a one.
        positive = regime >= 0
        ones_pattern = ~(c(src.uint_max) >> (regime + 1).astype(src.uint))
        zeros_pattern = c(1 << (w - 1)) >> (-regime).astype(src.uint)
        pattern = jnp.where(positive, ones_pattern, zeros_pattern)
        length = jnp.where(positive, regime + 2, 1 - regime).astype(src.uint)

        tail = ((exponent << c(sm)) | (a & c(src.mantissa_mask))) << c(w - es - sm)
        word = pattern | (tail >> length)
        sticky = (tail << (c(w) - length)) != c(0)

        # Round the (nbits - 1)-bit body to nearest, ties to even.
        keep = word >> c(w + 1 - n)
        guard = (word >> c(w - n)) & c(1)
        sticky = sticky | ((word & c((1 << (w - n)) - 1)) != c(0))
        round_up = (guard == c(1)) & (sticky | ((keep & c(1)) == c(1)))
        code = keep + round_up.astype(src.uint)

        maxpos_code = c((1 << (n - 1)) - 1)
        code = jnp.minimum(code, maxpos_code)
        code = jnp.where(a >= c((src.bias + self._max_scale) << sm), maxpos_code, code)
        code = jnp.where(a <= c((src.bias - self._max_scale) << sm), c(1), code)
        code = jnp.where(a == c(0), c(0), code)
        mask = c((1 << n) - 1)
        code = jnp.where(sign == c(1), (c(0) - code) & mask, code)
        code = jnp.where(a >= c(src.inf_bits), c(1 << (n - 1)), code)
        return code.astype(self.storage_dtype)

    def _decode(self, stored: jax.Array, dtype: np.dtype) -> jax.Array:
        n, es = self.nbits, self.es

        def c(v: int) -> jax.Array:
            return jnp.asarray(v, jnp.uint32)

        code = stored.astype(jnp.uint32)
        negative = (code >> c(n - 1)) == c(1)
        mag = jnp.where(negative, (c(0) - code) & c((1 << n) - 1), code)

        body = mag << c(33 - n)  # the bits after the sign, left-aligned
        first_one = (body >> c(31)) == c(1)
        run = jnp.where(first_one, clz32(~body), clz32(body))
        regime = jnp.where(first_one, run.astype(jnp.int32) - 1, -run.astype(jnp.int32))
        rest = body << (run + c(1))
        if es > 0:
            exponent = (rest >> c(32 - es)).astype(jnp.int32)
        else:
            exponent = jnp.zeros_like(regime)
        fraction = (rest << c(es)) >> c(9)
        scale = regime * (1 << es) + exponent
        bits = ((scale + 127).astype(jnp.uint32) << c(23)) | fraction
        bits = jnp.where(negative, bits | c(1 << 31), bits)
        bits = jnp.where(code == c(0), c(0), bits)
        bits = jnp.where(code == c(1 << (n - 1)), c(0x7FC00000), bits)
        return lax.bitcast_convert_type(bits, jnp.float32).astype(dtype)


def posit(nbits: int, es: int, name: str | None = None) -> PositFormat:
    """Builds the posit format posit<nbits, es>.

    Args:
        nbits: total bits, 3..16 (codes are stored as uint8 or uint16).
        es: exponent bits, >= 0, small enough that maxpos =
            2**((nbits - 2) * 2**es) stays within float32 (<= 2**126).
        name: the format's name; default `f"posit{nbits}_es{es}"`.

    Returns:
        The `PositFormat`.

    Raises:
        ValueError: for nbits or es outside the ranges above.
        TypeError: for non-integer arguments.

    >>> p = posit(16, 1)
    >>> p.max, p.epsilon
    (268435456.0, 0.000244140625)
    """
    for value, what in ((nbits, "nbits"), (es, "es")):
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise TypeError(
                f"{what} must be an int, got {type(value).__name__} {value!r}"
            )
    nbits, es = int(nbits), int(es)
    if not 3 <= nbits <= 16:
        raise ValueError(
            f"nbits must be in [3, 16] (codes are stored as uint8/uint16), got {nbits}"
        )
    if es < 0:
        raise ValueError(f"es must be >= 0, got {es}")
    if (nbits - 2) << es > 126:
        largest = int(math.floor(math.log2(126 / (nbits - 2))))
        raise ValueError(
            f"posit<{nbits},{es}> has maxpos 2**{(nbits - 2) << es}, beyond float32's "
            f"normal range 2**126; for nbits={nbits} use es <= {largest}"
        )
    if name is None:
        name = f"posit{nbits}_es{es}"
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str or None, got {name!r}")
    return PositFormat(name, nbits, es)
