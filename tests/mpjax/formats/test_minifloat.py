"""The general minifloat codec against ml_dtypes, plus fp16c specifics."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from mpjax import formats
from tests.mpjax.formats._oracles import round_to_odd_float32

# name -> (exponent_bits, mantissa_bits, has_inf, ml_dtypes oracle dtype)
IEEE_LIKE = {
    "float16": (5, 10, True, np.dtype(np.float16)),
    "bfloat16": (8, 7, True, np.dtype(ml_dtypes.bfloat16)),
    "float8_e4m3fn": (4, 3, False, np.dtype(ml_dtypes.float8_e4m3fn)),
    "float8_e5m2": (5, 2, True, np.dtype(ml_dtypes.float8_e5m2)),
}


def _general(name: str) -> formats.MinifloatFormat:
    e, m, has_inf, _ = IEEE_LIKE[name]
    return formats.minifloat(
        f"general_{name}", exponent_bits=e, mantissa_bits=m, has_inf=has_inf
    )


def _uint(dtype: np.dtype) -> type:
    return np.uint16 if dtype.itemsize == 2 else np.uint8


def _finite_values(dtype: np.dtype) -> np.ndarray:
    """Every finite value of `dtype` as float64, sorted, without -0."""
    codes = np.arange(2 ** (8 * dtype.itemsize), dtype=np.uint32).astype(_uint(dtype))
    vals = _oracle(codes.view(dtype), np.dtype(np.float64))
    vals = vals[np.isfinite(vals)]
    return np.unique(vals)


def _inputs(dtype: np.dtype, seed: int, n: int = 120_000) -> np.ndarray:
    """>= 1e5 random float32 values over all magnitudes plus the format's edges."""
    rng = np.random.default_rng(seed)
    finfo = ml_dtypes.finfo(dtype)
    # Random bit patterns: every float32 magnitude, subnormals, Inf and NaN.
    raw = rng.integers(0, 2**32, n // 2, dtype=np.uint64).astype(np.uint32)
    # Log-uniform values around the format's own range.
    lo = np.log2(float(finfo.smallest_subnormal)) - 3
    hi = np.log2(float(finfo.max)) + 2
    mags = np.exp2(rng.uniform(lo, hi, n // 2))
    signs = rng.choice(np.array([-1.0, 1.0]), n // 2)
    vals = _finite_values(dtype)
    mids = (vals[1:] + vals[:-1]) / 2  # exact ties (exact in float32)
    top = float(finfo.max)
    ulp_top = top - float(vals[-2])
    edges = np.array(
        [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, top, -top, top + ulp_top / 2]
        + [top + ulp_top / 4, top + ulp_top, 2 * top, 1e-45, -1e-45, 1e-40, 3e38]
        + [float(finfo.smallest_subnormal) / 2, float(finfo.smallest_normal)]
    )
    parts = [
        raw.view(np.float32),
        signs * mags,
        vals,
        mids,
        -mids,
        np.nextafter(mids.astype(np.float32), np.float32(np.inf)),
        np.nextafter(mids.astype(np.float32), np.float32(-np.inf)),
        edges,
    ]
    out = np.concatenate([_oracle(p, np.dtype(np.float32)) for p in parts])
    assert np.all(mids.astype(np.float32).astype(np.float64) == mids)
    return out


def _oracle(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    with np.errstate(all="ignore"):
        return x.astype(dtype)


@pytest.mark.parametrize("name", sorted(IEEE_LIKE))
@pytest.mark.parametrize("variant", ["general", "registered"])
def test_minifloat_encode_matches_ml_dtypes_bit_for_bit(name, variant):
    dtype = IEEE_LIKE[name][3]
    fmt = _general(name) if variant == "general" else formats.get_format(name)
    x = _inputs(dtype, seed=len(name))
    assert x.size >= 100_000
    ref = _oracle(x, dtype)
    got = np.asarray(jax.jit(fmt.encode)(x))
    if variant == "general":
        assert got.dtype == _uint(dtype)
        got_bits = got
    else:
        assert got.dtype == dtype
        got_bits = got.view(_uint(dtype))
    ref_nan = np.isnan(_oracle(ref, np.dtype(np.float32)))
    mismatch = (ref.view(_uint(dtype)) != got_bits) & ~ref_nan
    assert not mismatch.any(), (x[mismatch][:5], got_bits[mismatch][:5])
    got_vals = np.asarray(fmt.decode(got))
    np.testing.assert_array_equal(np.isnan(got_vals), ref_nan)


@pytest.mark.parametrize("name", sorted(IEEE_LIKE))
def test_minifloat_decode_every_code_matches_ml_dtypes(name):
    dtype = IEEE_LIKE[name][3]
    fmt = _general(name)
    codes = np.arange(2**fmt.bits, dtype=np.uint32).astype(fmt.storage_dtype)
    got = np.asarray(jax.jit(fmt.decode)(codes))
    ref = _oracle(codes.view(dtype), np.dtype(np.float32))
    assert got.dtype == np.float32
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    finite = ~np.isnan(ref)
    # Bitwise, so that -0.0 and float32 subnormals (bfloat16) are checked exactly.
    np.testing.assert_array_equal(
        got[finite].view(np.uint32), ref[finite].view(np.uint32)
    )


def test_minifloat_float64_input_is_rounded_once(x64):
    fmt = _general("float16")
    # 1 + 2**-11 + 2**-40 lies just above a float16 tie. Rounding through float32
    # first would land exactly on the tie and round down to 1.0.
    x = np.array([1 + 2**-11 + 2**-40, -(1 + 2**-11 + 2**-40), 1 + 2**-11], np.float64)
    x_jax = jnp.asarray(x)
    assert x_jax.dtype == jnp.float64
    got = np.asarray(fmt.encode(x_jax))
    np.testing.assert_array_equal(got, x.astype(np.float16).view(np.uint16))
    assert got[0] == 0x3C01 and got[2] == 0x3C00


@pytest.mark.parametrize("variant", ["general", "registered"])
def test_minifloat_float64_input_matches_ml_dtypes(x64, variant):
    rng = np.random.default_rng(7)
    x = rng.standard_normal(50_000) * np.exp2(rng.uniform(-30, 20, 50_000))
    # Just above float16 / bfloat16 ties: double rounding would hit the tie.
    x = np.concatenate([x, 1 + 2.0**-11 + 2.0**-40 * np.arange(1, 50)])
    x = np.concatenate([x, 1 + 2.0**-8 + 2.0**-40 * np.arange(1, 50)])
    for name in sorted(IEEE_LIKE):
        dtype = IEEE_LIKE[name][3]
        fmt = _general(name) if variant == "general" else formats.get_format(name)
        got = np.asarray(fmt.encode(jnp.asarray(x))).view(_uint(dtype))
        # rounded once; ml_dtypes' own float64 conversion differs by version
        ref = _oracle(round_to_odd_float32(x), dtype)
        nan = np.isnan(_oracle(ref, np.dtype(np.float32)))
        np.testing.assert_array_equal(got[~nan], ref.view(_uint(dtype))[~nan])
    fp16s = formats.get_format("fp16s").encode(jnp.asarray(x * 2.0**-15))
    ref16 = _oracle(x, np.dtype(np.float16))
    np.testing.assert_array_equal(np.asarray(fp16s), ref16)


# ---------------------------------------------------------------------- fp16c
@pytest.fixture(scope="module")
def fp16c():
    return formats.get_format("fp16c")


def test_fp16c_known_codes(fp16c):
    x = np.array(
        [1.0, -1.0, 0.0, -0.0, 2**-14, 2**-25, 1.5, 2 - 2**-11, 2**-26 * 3],
        np.float32,
    )
    got = np.asarray(fp16c.encode(x))
    expected = [0x7800, 0xF800, 0x0000, 0x8000, 0x0800, 0x0001, 0x7C00, 0x7FFF, 0x0002]
    np.testing.assert_array_equal(got, np.array(expected, np.uint16))


def test_fp16c_rounds_ties_to_even_and_saturates(fp16c):
    ulp1 = 2.0**-11  # spacing in [1, 2)
    x = np.array(
        [
            1 + ulp1 / 2,  # tie between 1 (even) and 1 + ulp -> 1
            1 + 3 * ulp1 / 2,  # tie between 1 + ulp (odd) and 1 + 2 ulp -> up
            2 - ulp1 / 2,  # FluidX3D wraps values >= 2; here it rounds up to ...
            2.0,  # ... and saturates at max
            1e30,
            np.inf,
            -np.inf,
            -3.0,
            2**-26,  # tie between 0 and the smallest subnormal -> 0
            3 * 2**-26,  # tie between 1 and 2 subnormal quanta -> 2
        ],
        np.float32,
    )
    got = np.asarray(fp16c.round(x))
    top = 2 - ulp1
    expected = [1.0, 1 + 2 * ulp1, top, top, top, top, -top, -top, 0.0, 2**-24]
    np.testing.assert_array_equal(got, np.array(expected, np.float32))


def test_fp16c_nan_encodes_to_positive_max_code(fp16c):
    x = np.array([np.nan, -np.nan], np.float32)
    neg_nan = np.array([0xFFC00001], np.uint32).view(np.float32)
    got = np.asarray(fp16c.encode(np.concatenate([x, neg_nan])))
    np.testing.assert_array_equal(got, np.full(3, 0x7FFF, np.uint16))
    assert float(fp16c.decode(got)[0]) == fp16c.max


def test_fp16c_has_no_special_codes(fp16c):
    codes = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    vals = np.asarray(fp16c.decode(codes))
    assert np.isfinite(vals).all()
    assert vals.max() == fp16c.max and vals.min() == -fp16c.max


# --------------------------------------------------- other minifloat options
def test_minifloat_saturating_ieee_keeps_inf_and_clamps_overflow():
    fmt = formats.minifloat(
        "e5m10_sat", exponent_bits=5, mantissa_bits=10, saturating=True
    )
    got = np.asarray(fmt.round(np.array([1e6, -1e6, np.inf, -np.inf], np.float32)))
    np.testing.assert_array_equal(got, np.array([65504, -65504, np.inf, -np.inf]))


def test_minifloat_saturating_fn_maps_overflow_and_inf_to_max():
    fmt = formats.minifloat(
        "e4m3_sat", exponent_bits=4, mantissa_bits=3, has_inf=False, saturating=True
    )
    x = np.array([1e4, -1e4, np.inf, np.nan], np.float32)
    got = np.asarray(fmt.round(x))
    np.testing.assert_array_equal(got[:3], np.array([448.0, -448.0, 448.0]))
    assert np.isnan(got[3])


def test_minifloat_custom_bias_shifts_the_range():
    fmt = formats.minifloat("e5m10_b10", exponent_bits=5, mantissa_bits=10, bias=10)
    assert fmt.max == 65504 * 2.0**5 and fmt.min_subnormal == 2.0**-19
    assert fmt.storage_dtype == np.uint16
    x = np.array([3.0 * 2**-19, 2.0**-20, 1e6], np.float32)
    np.testing.assert_array_equal(
        np.asarray(fmt.round(x)),
        np.array([3.0 * 2**-19, 0.0, 1953 * 512.0]),  # ulp 512 in [2**19, 2**20)
    )


def test_fp16s_is_float16_of_the_exactly_scaled_value():
    fmt = formats.get_format("fp16s")
    with np.errstate(invalid="ignore"):  # NaN inputs
        x = _inputs(np.dtype(np.float16), seed=1) * np.float32(2.0**-15)
    sub = np.array([1e-40, -1e-45, 2.0**-126, 2.0**-40 * 1.5], np.float32)
    x = np.concatenate([x, sub])
    ref = _oracle(x.astype(np.float64) * 2.0**15, np.dtype(np.float16))
    got = np.asarray(jax.jit(fmt.encode)(x))
    assert got.dtype == np.float16
    nan = np.isnan(ref)
    np.testing.assert_array_equal(got.view(np.uint16)[~nan], ref.view(np.uint16)[~nan])
    assert np.isnan(got[nan]).all()
    np.testing.assert_array_equal(
        np.asarray(fmt.decode(got))[~nan], ref[~nan].astype(np.float32) * 2.0**-15
    )
