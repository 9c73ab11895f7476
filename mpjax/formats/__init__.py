"""Bit-exact number formats in pure jax.numpy.

Every format is a `NumberFormat` value with `encode`, `decode` and `round` plus its
facts (`max`, `min_normal`, `min_subnormal`, `epsilon`, ...). Formats come from
three general constructors, `minifloat`, `scaled` and `posit`, and the registry
(`get_format`, `list_formats`) names the common ones:

float64, float32, bfloat16, float16, float8_e4m3fn, float8_e5m2
    native IEEE-style formats stored in their own dtype. A narrowing `encode`
    rounds on the integer bit pattern (to nearest even; overflow gives Inf, or
    NaN for float8_e4m3fn, which has no Inf; NaN keeps its sign and top
    payload bits, with the quiet bit set) and reinterprets the code as the
    dtype; widening is a cast. No convert instruction rounds, so no compiler
    can remove the rounding (XLA's GPU compiler drops convert pairs such as
    f32 -> f16 -> f32) and the bits are the same on every backend, also fused
    into larger programs. float64
    storage needs x64 enabled; without it, encode/decode raise ValueError
    saying how to enable it.
fp16s
    `scaled(float16, 15)`: float16 storage of `x * 2**15`, range [2**-39, 2).
fp16c
    1 sign, 4 exponent, 11 mantissa bits, bias 15, no Inf/NaN codes; saturates
    to +-(2 - 2**-11); NaN encodes to 0x7FFF (+max). FluidX3D's own FP16C
    encoder rounds ties away from zero and wraps values >= 2; this one rounds
    ties to even and saturates.
posit16, posit16_es2
    posit<16,1> (older SoftPosit convention) and posit<16,2> (2022 standard);
    NaR = 0x8000, NaN/Inf encode to NaR, no non-zero value rounds to 0 or NaR.
posit16s
    `scaled(posit16, 10)`: posit16 storage of `x * 2**10`, range [2**-38, 2**18],
    the posit twin of fp16s (Lehmann et al. 2022 build their 16-bit formats on
    a modified IEEE-754 and a modified posit standard). posit16's 12 fraction
    bits, `|y|` in [2**-2, 2**2), land on `|x|` in [2**-12, 2**-8), where
    DDF-shifted LBM populations lie: the scale is minus the median binary
    exponent of the populations of the 2-D validation cases (median -10,
    quartiles -11 and -9). Its `epsilon` (at 1.0) is 2**-7.

Special values per format (encode):

=============  ======================  ==================  ===============
format         finite overflow         NaN input           -0.0
=============  ======================  ==================  ===============
float64/32/16  +-Inf                   NaN                 -0.0
bfloat16       +-Inf                   NaN                 -0.0
float8_e5m2    +-Inf                   NaN                 -0.0
float8_e4m3fn  NaN (no Inf code)       NaN (0x7F/0xFF)     -0.0
fp16s          +-Inf (beyond ~2)       NaN                 -0.0
fp16c          +-max (saturates)       0x7FFF (+max)       -0.0 (0x8000)
posit16(_es2)  +-maxpos (saturates)    NaR (0x8000)        0 (one zero)
posit16s       +-maxpos (saturates)    NaR (0x8000)        0 (one zero)
=============  ======================  ==================  ===============

Inf input gives Inf where the format has it, else the overflow column (posits:
NaR). Posits also never round a non-zero value to 0 (it becomes +-minpos).

All rounding is to nearest, ties to even. Minifloats keep signed zeros; posits
have a single zero. Inputs may be float16, bfloat16, float32 or (with x64)
float64. float64 inputs are rounded once, directly to the format, on every
backend (not through float32, which XLA's casts do on the CPU); without x64,
JAX has already turned float64 data into float32 before `encode` sees it.
`round(x, straight_through=True)` passes gradients through unchanged
(quantisation-aware training); otherwise its gradient is zero.

>>> from mpjax import formats
>>> fmt = formats.get_format("fp16c")
>>> int(fmt.encode(1.0)), float(fmt.round(3.0))
(30720, 1.99951171875)
"""

from mpjax.formats._base import NumberFormat, require_x64
from mpjax.formats._minifloat import MinifloatFormat, minifloat
from mpjax.formats._posit import PositFormat, posit
from mpjax.formats._registry import (
    facts_table,
    format_aliases,
    get_format,
    list_formats,
    round,
)
from mpjax.formats._scaled import ScaledFormat, scaled

__all__ = [
    "MinifloatFormat",
    "NumberFormat",
    "PositFormat",
    "ScaledFormat",
    "facts_table",
    "format_aliases",
    "get_format",
    "list_formats",
    "minifloat",
    "posit",
    "require_x64",
    "round",
    "scaled",
]
