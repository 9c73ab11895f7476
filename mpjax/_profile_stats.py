"""On-device summaries of floating-point arrays, for `mpjax.profile`.

Each value costs a fixed-size summary: a histogram of binary exponents, the
zero and non-finite counts, the exact smallest and largest non-zero finite
magnitude and, per candidate format, the median relative rounding error of a
strided sample. The summaries of many values are computed in bulk: one
scatter-add accumulates the (exact) histograms of all values, the extremes come
from float reductions over order-preserving keys, and each format's `round`
runs once on a (values, sample) matrix of NaN-padded samples whose row medians
are found by bisection on bit patterns instead of a sort.

All bit-level statistics are taken from the IEEE bit patterns, so subnormal
float32 values are counted correctly even on backends that flush them in
arithmetic (XLA:CPU treats subnormal operands as zero).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from mpjax.formats import NumberFormat

__all__: list[str] = []

# (unsigned bit dtype, signed dtype, mantissa bits, exponent bias) per float width.
_LAYOUTS = {4: (jnp.uint32, jnp.int32, 23, 127), 8: (jnp.uint64, jnp.int64, 52, 1023)}

# Statistics summed over loop iterations, and combined by fmin / fmax.
SUMMED = ("zeros", "nonfinite", "histogram", "count")


def is_float(aval: Any) -> bool:
    """Whether `aval` (an abstract or concrete value) has a floating dtype."""
    dtype = getattr(aval, "dtype", None)
    return dtype is not None and jnp.issubdtype(dtype, jnp.floating)


def _working(x: jax.Array) -> jax.Array:
    """`x` exactly in float32 (or float64 when it already is float64)."""
    return x if x.dtype == jnp.float64 else x.astype(jnp.float32)


def _magnitude_bits(x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Sign-less bit pattern, biased exponent field and mantissa field of `x`."""
    ubits, sbits, mant_bits, _ = _LAYOUTS[x.dtype.itemsize]
    width = 8 * x.dtype.itemsize
    mag = lax.bitcast_convert_type(x, ubits) & ubits(2 ** (width - 1) - 1)
    mag = mag.astype(sbits)
    return mag, mag >> mant_bits, mag & sbits(2**mant_bits - 1)


def _bin_index(x: jax.Array, lo: int, hi: int) -> jax.Array:
    """Histogram bin of every element: floor(log2|x|) - lo clipped, then zero, Inf/NaN.

    The exponent of a subnormal is read from the float conversion of its
    mantissa field (exact, and vectorised where a count of leading zeros is not).
    """
    _, sbits, mant_bits, bias = _LAYOUTS[x.dtype.itemsize]
    mag, field, mant = _magnitude_bits(x)
    top = 2 ** (8 * x.dtype.itemsize - 1 - mant_bits) - 1
    mant_exp = lax.bitcast_convert_type(mant.astype(x.dtype), sbits) >> mant_bits
    exponent = jnp.where(field > 0, field - bias, mant_exp - 2 * bias - mant_bits + 1)
    idx = jnp.clip(exponent, lo, hi) - lo
    nbins = hi - lo + 1
    idx = jnp.where(field == top, nbins + 1, jnp.where(mag == 0, nbins, idx))
    return idx.astype(jnp.int32)


def _extremes(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Exact smallest and largest non-zero finite |x|, NaN where there is none.

    Integer reductions are slow on XLA:CPU, so both come from float reductions
    of order-preserving keys: a normal value is its own magnitude and a
    subnormal the (exact) negative float `mantissa - 2**(mantissa bits + 1)`,
    below every normal value and never itself subnormal.
    """
    _, sbits, mant_bits, _ = _LAYOUTS[x.dtype.itemsize]
    mag, field, mant = _magnitude_bits(x)
    top = 2 ** (8 * x.dtype.itemsize - 1 - mant_bits) - 1
    shift = float(2 ** (mant_bits + 1))
    absx = lax.bitcast_convert_type(mag, x.dtype)
    key = jnp.where(field > 0, absx, mant.astype(x.dtype) - shift)
    keep = (field != top) & (mag != 0)
    small = jnp.min(jnp.where(keep, key, jnp.inf))
    large = jnp.max(jnp.where(keep, key, -jnp.inf))

    def decode(k: jax.Array) -> jax.Array:
        sub = lax.bitcast_convert_type((k + shift).astype(sbits), x.dtype)
        return jnp.where(jnp.isinf(k), jnp.nan, jnp.where(k < 0, sub, k))

    return decode(small), decode(large)


def _strided_sample(x: jax.Array, sample: int) -> jax.Array:
    """A strided sample of at most `sample` elements of `x`, NaN-padded to `sample`."""
    flat = x.ravel()
    stride = max(1, math.ceil(flat.size / sample))
    s = flat[::stride]
    return jnp.pad(s, (0, sample - s.size), constant_values=jnp.nan)


def _nanmedian_last(x: jax.Array) -> jax.Array:
    """Lower median of the non-NaN elements of `x` (>= 0) along the last axis.

    The result is the ceil(n/2)-th smallest element (n the number of non-NaN
    elements; NaN where n = 0) truncated to its top 16 bits, i.e. to bfloat16
    precision: it lies within a factor (1 - 2**-7, 1] of the exact lower
    median, and equals it when that is a bfloat16 number (zero included).
    It is found by bisection on the 16-bit patterns, which are monotonic in
    the value for non-negative floats: 15 counting passes over int16 data
    instead of a sort (many times slower on XLA:CPU). Values are taken in
    float32 first (float64 relative errors below float32's range count as 0).
    """
    x = x.astype(jnp.float32)
    valid = ~jnp.isnan(x)
    n = jnp.sum(valid, axis=-1, dtype=jnp.int32)
    # int16 counts (twice as many per vector) where they cannot overflow
    cdt = jnp.int16 if x.shape[-1] < 2**15 else jnp.int32
    rank = ((n - 1) // 2).astype(cdt)  # 0-based rank of the lower middle
    inf = 0x7F80  # top 16 bits of +inf; NaN (padding) sorts above every threshold
    bits = lax.bitcast_convert_type(x, jnp.int32) >> 16
    bits = jnp.where(valid, bits, 2**15 - 1).astype(jnp.int16)

    def step(_: int, bounds: tuple[jax.Array, jax.Array]) -> tuple[Any, Any]:
        lo, hi = bounds
        mid = lo + (hi - lo) // 2
        enough = jnp.sum(bits <= mid[..., None], axis=-1, dtype=cdt) > rank
        return jnp.where(enough, lo, mid + 1), jnp.where(enough, mid, hi)

    bounds = (jnp.zeros(n.shape, jnp.int16), jnp.full(n.shape, inf, jnp.int16))
    lower, _ = lax.fori_loop(0, math.ceil(math.log2(inf + 1)), step, bounds)
    median = lax.bitcast_convert_type(lower.astype(jnp.int32) << 16, jnp.float32)
    return jnp.where(n > 0, median, jnp.nan)


def _median_rel_errors(
    samples: jax.Array, formats: Sequence[NumberFormat]
) -> jax.Array:
    """Median |round(s) - s| / |s| per row of `samples` (values, sample) and format.

    Each format's `round` runs once on the whole matrix, and the medians of all
    formats are found together; NaN (padding) and non-normal elements are left
    out of the medians.
    """
    if not formats:
        return jnp.zeros((samples.shape[0], 0), jnp.float32)
    absx = jnp.abs(samples)
    # only normal values: backends flushing subnormals would divide by zero
    keep = (absx >= jnp.finfo(samples.dtype).tiny) & (absx < jnp.inf)
    nan = jnp.asarray(jnp.nan, samples.dtype)
    errors = []
    for fmt in formats:
        r = fmt.round(samples)
        rel = jnp.abs(r - samples) / absx
        rel = jnp.where(jnp.isfinite(r), rel, jnp.inf)
        errors.append(jnp.where(keep, rel, nan))
    return _nanmedian_last(jnp.stack(errors, axis=1))


def summarise(
    values: Sequence[jax.Array],
    bins: tuple[int, int],
    formats: Sequence[NumberFormat],
    sample: int,
) -> dict[str, jax.Array]:
    """On-device summaries of floating-point arrays, stacked along a first axis.

    The histograms (with two extra bins counting zeros and non-finite elements)
    of all values are accumulated by one scatter-add over their concatenated bin
    indexes, offset by value; the rounding errors come from one matrix of
    fixed-size samples per working dtype. ``count`` is each value's size.
    """
    lo, hi = bins
    nbins = hi - lo + 1
    width = nbins + 2  # exponent bins, zeros, non-finite
    n = len(values)
    if n == 0:
        return empty_summaries(bins, len(formats))
    indexes, mins, maxs = [], [], []
    groups: dict[Any, list[tuple[int, jax.Array]]] = {}
    for i, value in enumerate(values):
        x = _working(jnp.asarray(value))
        indexes.append((_bin_index(x, lo, hi) + i * width).ravel())
        small, large = _extremes(x)
        mins.append(small.astype(jnp.float32))
        maxs.append(large.astype(jnp.float32))
        if formats:
            groups.setdefault(x.dtype, []).append((i, _strided_sample(x, sample)))
    counts = jnp.zeros(n * width, jnp.int32)
    counts = counts.at[jnp.concatenate(indexes)].add(1, mode="promise_in_bounds")
    counts = counts.reshape(-1, width)
    errors = jnp.zeros((n, len(formats)), jnp.float32)
    for members in groups.values():
        rows = np.array([i for i, _ in members])
        matrix = jnp.stack([s for _, s in members])
        errors = errors.at[rows].set(_median_rel_errors(matrix, formats))
    sizes = np.array([np.size(v) for v in values], np.int64)
    return {
        "zeros": counts[:, nbins],
        "nonfinite": counts[:, nbins + 1],
        "min_abs": jnp.stack(mins),
        "max_abs": jnp.stack(maxs),
        "histogram": counts[:, :nbins],
        "rounding_error": errors,
        "count": jnp.asarray(np.minimum(sizes, 2**31 - 1), jnp.int32),
    }


def empty_summaries(bins: tuple[int, int], nformats: int, n: int = 0) -> dict:
    """Summaries of `n` values with no element: the identity of `combine`."""
    nbins = bins[1] - bins[0] + 1
    nan = jnp.full((n,), jnp.nan, jnp.float32)
    return {
        "zeros": jnp.zeros((n,), jnp.int32),
        "nonfinite": jnp.zeros((n,), jnp.int32),
        "min_abs": nan,
        "max_abs": nan,
        "histogram": jnp.zeros((n, nbins), jnp.int32),
        "rounding_error": jnp.full((n, nformats), jnp.nan, jnp.float32),
        "count": jnp.zeros((n,), jnp.int32),
    }


def combine(
    total: dict[str, jax.Array], taken: jax.Array, new: dict[str, jax.Array]
) -> tuple[dict[str, jax.Array], jax.Array]:
    """Adds the summaries `new` of one loop iteration to the running `total`.

    Counts and histograms are summed and extremes combined exactly; the rounding
    error is the running mean of the iterations' medians, `taken` counting the
    iterations with a median per (value, format).

    Returns:
        The new total and the new `taken`.
    """
    out = {k: total[k] + new[k] for k in SUMMED}
    out["min_abs"] = jnp.fmin(total["min_abs"], new["min_abs"])
    out["max_abs"] = jnp.fmax(total["max_abs"], new["max_abs"])
    err, mean = new["rounding_error"], total["rounding_error"]
    has = ~jnp.isnan(err)
    taken = taken + has.astype(jnp.int32)
    step = (err - jnp.where(jnp.isnan(mean), 0.0, mean)) / taken.astype(err.dtype)
    out["rounding_error"] = jnp.where(
        has, jnp.where(jnp.isnan(mean), err, mean + step), mean
    )
    return out, taken
