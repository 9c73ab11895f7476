"""One parameterised binary floating-point codec ("minifloat").

A minifloat has 1 sign bit, `exponent_bits` exponent bits with a `bias`, and
`mantissa_bits` fraction bits with a hidden leading one; exponent field 0 holds
signed zero and the subnormals `M * 2**(1 - bias - mantissa_bits)`. Three
conventions for the top exponent field are supported:

* IEEE (`has_inf=True, has_nan=True`): the all-ones exponent field is reserved;
  mantissa 0 is +-Inf, anything else NaN (float16, bfloat16, float8_e5m2).
* "fn" (`has_inf=False, has_nan=True`): only the all-ones code `S.1111.111` is NaN;
  every other code is finite (float8_e4m3fn).
* no specials (`has_inf=False, has_nan=False`): every code is a finite number and
  the format must saturate (fp16c).

The encoder works on the integer bit pattern of the float32 (or, with x64, float64)
input: rebias the exponent, round the mantissa to nearest with ties to even using
the add-(half - 1)-plus-lsb trick (a carry into the exponent is the correct result),
and round subnormals either with one float addition of a power of two (the FPU's
own round-to-nearest-even; used when the format's smallest subnormal is at least
2**-125, so that flush-to-zero of float32 subnormals cannot matter) or, for formats
with subnormals in float32's subnormal range (bfloat16), with an integer variable
shift.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from mpjax.formats._base import NumberFormat
from mpjax.formats._bits import clz32, rne_shift_right, source_layout, storage_uint

__all__ = ["MinifloatFormat", "minifloat"]

# (exponent_bits, mantissa_bits, bias, has_inf, has_nan) of the native dtypes that
# `native_dtype` may name. All follow one of the three conventions above.
_NATIVE = {
    "float64": (11, 52, 1023, True, True),
    "float32": (8, 23, 127, True, True),
    "bfloat16": (8, 7, 127, True, True),
    "float16": (5, 10, 15, True, True),
    "float8_e5m2": (5, 2, 15, True, True),
    "float8_e4m3fn": (4, 3, 7, False, True),
}

_F32_MIN_NORMAL = 2.0**-126
# Smallest subnormal quantum for which float addition rounds subnormals exactly:
# every float32 subnormal must lie below half a quantum (see `_encode_bits`).
_FLOAT_TRICK_MIN = 2.0**-125


@dataclasses.dataclass(frozen=True)
class MinifloatFormat(NumberFormat):
    """A binary floating-point format; build it with `minifloat`.

    Rounding is to nearest, ties to even. Signed zero is kept (`-0.0` encodes to
    the code with only the sign bit set). Overflow and special inputs:

    * IEEE formats: finite overflow -> +-Inf (or +-max when `saturating`); Inf ->
      Inf; NaN -> the quiet NaN `S.11..1.10..0` (sign kept, payload dropped; the
      native formats keep the top payload bits with the quiet bit set, as x86's
      F16C conversion and lbm_jax's native step do, on every backend).
    * "fn" formats: overflow and Inf -> NaN (or +-max when `saturating`); NaN ->
      `S.11..1.11..1`.
    * formats without specials: overflow and Inf -> +-max (saturation); NaN -> the
      positive max code `0.11..1.11..1` (for fp16c 0x7FFF, i.e. 2 - 2**-11), so an
      invalid value stays conspicuously large instead of becoming zero.

    Attributes:
        name: registry name.
        exponent_bits: width of the exponent field.
        mantissa_bits: width of the mantissa field.
        bias: the exponent bias.
        has_inf: whether infinities have codes (see module docstring).
        has_nan: whether NaNs have codes (see module docstring).
        saturating: whether finite overflow clamps to +-max.
        native: name of a native dtype (e.g. "float16") whose cast implements this
            format, or None for bit-pattern storage in uint8/uint16.
    """

    name: str
    exponent_bits: int
    mantissa_bits: int
    bias: int
    has_inf: bool
    has_nan: bool
    saturating: bool
    native: str | None = None

    # ----------------------------------------------------------------- facts
    @property
    def bits(self) -> int:
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def storage_dtype(self) -> np.dtype:
        if self.native is not None:
            return np.dtype(jnp.dtype(self.native))
        return storage_uint(self.bits)

    @property
    def _top_exponent(self) -> int:
        """Largest exponent field that holds finite numbers."""
        all_ones = (1 << self.exponent_bits) - 1
        return all_ones - 1 if self.has_inf else all_ones

    @property
    def _top_mantissa(self) -> int:
        """Largest mantissa field at the top exponent that is finite."""
        all_ones = (1 << self.mantissa_bits) - 1
        fn_style = self.has_nan and not self.has_inf
        return all_ones - 1 if fn_style else all_ones

    @property
    def _max_magnitude_code(self) -> int:
        return (self._top_exponent << self.mantissa_bits) | self._top_mantissa

    @property
    def _nan_magnitude_code(self) -> int:
        """Code (without sign) that encode produces for NaN input."""
        e, m = self.exponent_bits, self.mantissa_bits
        if self.has_inf:
            return (((1 << e) - 1) << m) | (1 << (m - 1))
        if self.has_nan:
            return (1 << (e + m)) - 1
        return self._max_magnitude_code

    @property
    def max(self) -> float:
        frac = 1.0 + self._top_mantissa / 2.0**self.mantissa_bits
        return math.ldexp(frac, self._top_exponent - self.bias)

    @property
    def min_normal(self) -> float:
        return 2.0 ** (1 - self.bias)

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (1 - self.bias - self.mantissa_bits)

    @property
    def epsilon(self) -> float:
        return 2.0**-self.mantissa_bits

    # ----------------------------------------------------------------- codec
    def _encode(self, x: jax.Array) -> jax.Array:
        if self.native is None:
            return self._encode_bits(x).astype(self.storage_dtype)
        if self.bits >= 8 * x.dtype.itemsize:  # float32 -> float32/float64: exact
            return x.astype(self.storage_dtype)
        # A narrowing cast rounds on the integer bit pattern, then reinterprets
        # the code as the native dtype. A convert instruction would not do:
        # XLA's GPU compiler removes convert pairs such as f32 -> f16 -> f32
        # (excess precision), so `round` would return its input there; and it
        # converts float64 to 16-bit floats through float32 (double rounding)
        # on the CPU. The integer codec rounds once, the same on every backend.
        codes = self._encode_bits(x).astype(storage_uint(self.bits))
        return lax.bitcast_convert_type(codes, self.storage_dtype)

    def _encode_bits(self, x: jax.Array) -> jax.Array:
        src = source_layout(x.dtype)
        e, m, bias = self.exponent_bits, self.mantissa_bits, self.bias
        sm = src.mantissa_bits

        def c(v: int) -> jax.Array:
            return jnp.asarray(v, src.uint)

        u = lax.bitcast_convert_type(x, src.uint)
        sign = u >> c(src.width - 1)
        a = u & c(src.abs_mask)
        ef = a >> c(sm)

        # Normal results: rebias, then round the low (sm - m) bits to nearest even.
        shift = sm - m
        an = a - c((src.bias - bias) << sm)
        lsb = (an >> c(shift)) & c(1)
        normal = (an + c((1 << (shift - 1)) - 1) + lsb) >> c(shift)

        # Subnormal results: |x| / 2**(1 - bias - m) rounded to nearest even.
        quantum = self.min_subnormal
        if quantum >= _FLOAT_TRICK_MIN:
            # Adding K = quantum * 2**sm makes the FPU round |x| to a multiple of
            # the quantum (the ulp of K), and the low bits of the sum are the
            # code. Exact for |x| < K; source subnormals, which a flush-to-zero
            # CPU reads as 0, lie below half a quantum and round to 0 either way.
            k_host = np.asarray(quantum * 2.0**sm, x.dtype)
            k = jnp.asarray(k_host)
            k_bits = c(int(k_host.view(np.dtype(src.uint))))
            magnitude = lax.bitcast_convert_type(a, x.dtype)
            sub = lax.bitcast_convert_type(magnitude + k, src.uint) - k_bits
        else:
            # Integer path (subnormals of the target are float32 subnormals):
            # the significand, with its hidden bit, shifted to the quantum.
            sig = (a & c(src.mantissa_mask)) | jnp.where(ef > c(0), c(1 << sm), c(0))
            s = c(src.bias + sm + 1 - bias - m) - jnp.maximum(ef, c(1))
            sub = rne_shift_right(sig, jnp.minimum(s, c(sm + 2)))
        is_sub = ef < c(src.bias + 1 - bias)
        mag = jnp.where(is_sub, sub, normal)

        max_mag = c(self._max_magnitude_code)
        nan_mag = c(self._nan_magnitude_code)
        over = mag > max_mag
        is_nan = a > c(src.inf_bits)
        if self.has_inf:
            inf_mag = c(((1 << e) - 1) << m)
            mag = jnp.where(over, max_mag if self.saturating else inf_mag, mag)
            mag = jnp.where(a == c(src.inf_bits), inf_mag, mag)
        elif self.has_nan:
            mag = jnp.where(over, max_mag if self.saturating else nan_mag, mag)
        else:
            mag = jnp.minimum(mag, max_mag)
            sign = jnp.where(is_nan, c(0), sign)
        if self.native is not None and self.has_inf:
            # the top payload bits with the quiet bit set (as F16C converts)
            nan_mag = nan_mag | ((a >> c(shift)) & c((1 << m) - 1))
        mag = jnp.where(is_nan, nan_mag, mag)
        return (sign << c(e + m)) | mag

    def _decode(self, stored: jax.Array, dtype: np.dtype) -> jax.Array:
        if self.native is not None:
            return stored.astype(dtype)
        return self._decode_bits(stored).astype(dtype)

    def _decode_bits(self, stored: jax.Array) -> jax.Array:
        e, m, bias = self.exponent_bits, self.mantissa_bits, self.bias

        def c(v: int) -> jax.Array:
            return jnp.asarray(v, jnp.uint32)

        code = stored.astype(jnp.uint32)
        sign = (code >> c(e + m)) << c(31)
        exp = (code >> c(m)) & c((1 << e) - 1)
        man = code & c((1 << m) - 1)
        normal = sign | ((exp + c(127 - bias)) << c(23)) | (man << c(23 - m))

        if self.min_subnormal >= _F32_MIN_NORMAL:
            # Every subnormal is a normal float32: one exact multiplication.
            scale = jnp.asarray(self.min_subnormal, jnp.float32)
            sub_val = man.astype(jnp.float32) * scale
            sub = lax.bitcast_convert_type(sub_val, jnp.uint32)
        else:
            # Build the float32 bits directly (XLA:CPU flushes float32
            # subnormals produced by arithmetic to zero).
            lead = c(31) - clz32(man)  # position of the leading one
            e32 = lead.astype(jnp.int32) + (128 - bias - m)  # biased f32 exponent
            frac = (man << (c(23) - lead)) & c(0x7FFFFF)
            as_normal = (e32.astype(jnp.uint32) << c(23)) | frac
            as_subnormal = man << c(150 - bias - m)
            fits_normal = e32 >= 1
            sub = jnp.where(fits_normal, as_normal, as_subnormal)
            sub = jnp.where(man == c(0), c(0), sub)
        bits = jnp.where(exp == c(0), sign | sub, normal)

        all_ones = c((1 << e) - 1)
        nan_bits = sign | c(0x7FC00000)
        if self.has_inf:
            special = jnp.where(man == c(0), sign | c(0x7F800000), nan_bits)
            bits = jnp.where(exp == all_ones, special, bits)
        elif self.has_nan:
            is_nan = (exp == all_ones) & (man == c((1 << m) - 1))
            bits = jnp.where(is_nan, nan_bits, bits)
        return lax.bitcast_convert_type(bits, jnp.float32)


def _check_int(value: object, what: str, lo: int, hi: int, hint: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{what} must be an int, got {type(value).__name__} {value!r}")
    if not lo <= int(value) <= hi:
        raise ValueError(f"{what} must be in [{lo}, {hi}], got {value}; {hint}")
    return int(value)


def minifloat(
    name: str,
    *,
    exponent_bits: int,
    mantissa_bits: int,
    bias: int | None = None,
    has_inf: bool = True,
    has_nan: bool = True,
    saturating: bool | None = None,
    native_dtype: str | None = None,
) -> MinifloatFormat:
    """Builds a binary floating-point format.

    Without `native_dtype` the format stores bit patterns in uint8 (<= 8 bits) or
    uint16 (<= 16 bits) and encodes/decodes with integer bit manipulation. With
    `native_dtype` (one of float64, float32, bfloat16, float16, float8_e5m2,
    float8_e4m3fn) storage is that dtype and `encode` is a plain cast; the layout
    arguments must then describe that dtype exactly.

    Args:
        name: the format's name.
        exponent_bits: exponent field width, 1..8 for bit-pattern storage.
        mantissa_bits: fraction field width, >= 1.
        bias: exponent bias; default `2**(exponent_bits - 1) - 1`.
        has_inf: reserve the top exponent field for Inf/NaN (IEEE style).
        has_nan: keep NaN codes (without Inf: only the all-ones code, "fn" style).
        saturating: clamp finite overflow to +-max instead of producing Inf/NaN.
            Default: True exactly when the format has neither Inf nor NaN.
        native_dtype: implement the format as a cast to this dtype.

    Returns:
        The `MinifloatFormat`.

    Raises:
        ValueError: for layouts that cannot be represented (zero mantissa bits,
            more than 16 bits without a native dtype, a range outside float32,
            Inf without NaN, a non-saturating format without specials) or a
            `native_dtype` that does not match the layout.
        TypeError: for arguments of the wrong type.

    >>> fmt = minifloat("e3m4", exponent_bits=3, mantissa_bits=4)
    >>> fmt.max, fmt.bits, str(fmt.storage_dtype)
    (15.5, 8, 'uint8')
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {name!r}")
    e = _check_int(
        exponent_bits, "exponent_bits", 1, 11, "float32 holds at most 8 (float64 11)"
    )
    m = _check_int(
        mantissa_bits,
        "mantissa_bits",
        1,
        52,
        "a minifloat needs at least one mantissa bit (zero mantissa bits are not "
        "supported)",
    )
    for flag, what in ((has_inf, "has_inf"), (has_nan, "has_nan")):
        if not isinstance(flag, bool):
            raise TypeError(f"{what} must be a bool, got {flag!r}")
    if has_inf and not has_nan:
        raise ValueError(
            "has_inf=True requires has_nan=True (Inf - Inf needs a NaN code); use "
            "has_inf=True, has_nan=True (IEEE) or has_inf=False"
        )
    if saturating is None:
        saturating = not (has_inf or has_nan)
    if not isinstance(saturating, bool):
        raise TypeError(f"saturating must be a bool or None, got {saturating!r}")
    if not (has_inf or has_nan or saturating):
        raise ValueError(
            "a format without Inf and NaN codes has nothing to overflow to, so it "
            "must saturate; pass saturating=True (or leave it None)"
        )
    if bias is None:
        bias = (1 << (e - 1)) - 1
    bias = _check_int(bias, "bias", -(1 << 20), 1 << 20, "choose a moderate bias")

    if native_dtype is not None:
        try:
            key = str(np.dtype(jnp.dtype(native_dtype)))
        except TypeError:
            key = repr(native_dtype)
        if key not in _NATIVE:
            raise ValueError(
                f"native_dtype must be one of {sorted(_NATIVE)}, got {native_dtype!r}"
            )
        if _NATIVE[key] != (e, m, bias, has_inf, has_nan):
            ne, nm, nb, ni, nn = _NATIVE[key]
            raise ValueError(
                f"native_dtype={key} has exponent_bits={ne}, mantissa_bits={nm}, "
                f"bias={nb}, has_inf={ni}, has_nan={nn}; got exponent_bits={e}, "
                f"mantissa_bits={m}, bias={bias}, has_inf={has_inf}, "
                f"has_nan={has_nan}"
            )
        if saturating:
            raise ValueError(
                f"native {key} casts do not saturate; drop native_dtype to use the "
                "saturating bit-pattern codec"
            )
        return MinifloatFormat(name, e, m, bias, has_inf, has_nan, False, key)

    if 1 + e + m > 16:
        raise ValueError(
            f"bit-pattern storage holds at most 16 bits (uint16), got 1 + "
            f"{e} + {m} = {1 + e + m}; reduce exponent_bits/mantissa_bits or pass "
            "native_dtype for float32/float64"
        )
    fmt = MinifloatFormat(name, e, m, bias, has_inf, has_nan, saturating, None)
    if fmt.max >= 2.0**128 or fmt.min_normal < _F32_MIN_NORMAL:
        raise ValueError(
            f"format {name!r} spans [{fmt.min_normal:g}, {fmt.max:g}] (min normal, "
            "max), which must lie within float32's normal range [2**-126, 2**128); "
            f"choose a bias between {math.frexp(fmt.max)[1] - 1 + bias - 127} and 127"
        )
    return fmt
