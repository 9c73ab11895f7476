"""Roundings that no compiler can remove: the same bits on every backend.

XLA's GPU compiler removes convert pairs such as f32 -> f16 -> f32 (its default
``xla_allow_excess_precision``), and ``lax.reduce_precision`` flushes subnormals
there. The formats therefore round narrowing casts on integer bit patterns. These
tests run on the CPU too: they check in the optimised program that no narrowing
convert is left to remove, and compare fused programs bit for bit with ml_dtypes
over every value of each format, the ties between them and their neighbours.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from mpjax import formats
from mpjax._fp8_ops import _quantize
from tests.mpjax.formats._oracles import round_to_odd_float32

# format name -> dtype whose values it holds (fp16s: float16 of x * 2**15)
NARROW = {
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
    "fp16s": np.dtype(np.float16),
}
SCALE = {"fp16s": 2.0**15}
# an instruction of the optimised HLO that converts to a narrow float type
_NARROW_CONVERT = re.compile(r"= (?:f16|bf16|f8e\w+)\[[^\]]*\][^=]*? convert\(")


def _uint(dtype: np.dtype) -> type:
    return np.uint16 if dtype.itemsize == 2 else np.uint8


def _dense(dtype: np.dtype) -> np.ndarray:
    """Every value of `dtype`, the midpoints between neighbours (ties), the
    float32 values next to them, overflow, Inf and NaN, both signs, as float32."""
    codes = np.arange(2 ** (8 * dtype.itemsize), dtype=np.uint32).astype(_uint(dtype))
    with np.errstate(invalid="ignore"):
        vals = codes.view(dtype).astype(np.float64)
    vals = np.unique(vals[np.isfinite(vals)])
    mids = ((vals[1:] + vals[:-1]) / 2).astype(np.float32)
    top = float(ml_dtypes.finfo(dtype).max)
    edges = np.array([top * 1.0625, top * 2, 3e38, np.inf, np.nan, 1e-45, 1e-40])
    parts = [
        vals,
        mids,
        np.nextafter(mids, np.float32(np.inf)),
        np.nextafter(mids, np.float32(-np.inf)),
        edges,
    ]
    with np.errstate(over="ignore"):  # beyond float32: Inf
        x = np.concatenate([p.astype(np.float32) for p in parts])
    return np.concatenate([x, -x])


def _same_bits(got: np.ndarray, ref: np.ndarray) -> None:
    """Bitwise equality, NaNs compared as NaNs (payloads may differ)."""
    got, ref = np.asarray(got), np.asarray(ref)
    uint = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[got.itemsize]
    with np.errstate(invalid="ignore"):
        nan = np.isnan(ref.astype(np.float64))
    np.testing.assert_array_equal(np.isnan(got.astype(np.float64)), nan)
    differ = (got.view(uint) != ref.view(uint)) & ~nan
    assert not differ.any(), (got[differ][:5], ref[differ][:5])


def test_the_pattern_finds_a_narrowing_convert():
    """The check below can fail: a plain cast is a convert in the program (one
    whose result leaves the program as float16, which no compiler may drop)."""
    f = jax.jit(lambda v: (v * 2).astype(jnp.float16))
    assert _NARROW_CONVERT.search(f.lower(jnp.ones(4)).compile().as_text())


@pytest.mark.parametrize("name", sorted(NARROW))
def test_round_and_fused_codec_leave_no_convert_to_elide(name):
    fmt = formats.get_format(name)
    x = jnp.ones(8, jnp.float32)
    programs = {
        "round": jax.jit(fmt.round),
        "encode": jax.jit(fmt.encode),
        "fused": jax.jit(lambda v: fmt.decode(fmt.encode(v * 3.0)) * 2.0 + 1.0),
    }
    for what, program in programs.items():
        text = program.lower(x).compile().as_text()
        assert not _NARROW_CONVERT.search(text), f"{name}.{what} converts:\n{text}"


@pytest.mark.parametrize("name", sorted(NARROW))
def test_fused_round_trip_matches_ml_dtypes_on_dense_inputs(name):
    """Every value, tie and tie neighbour, subnormals, overflow, Inf and NaN,
    by `round` and inside one fused program (scaling by powers of two is exact
    away from float32 subnormals, which XLA:CPU flushes in arithmetic)."""
    fmt, dtype = formats.get_format(name), NARROW[name]
    scale = np.float32(SCALE.get(name, 1.0))
    x = _dense(dtype) / scale
    with np.errstate(all="ignore"):
        ref = (x * scale).astype(dtype).astype(np.float32) / scale
    _same_bits(np.asarray(jax.jit(fmt.round)(x)), ref)
    size = np.abs(x)
    normal = ((size >= 2.0**-120) & (size <= 2.0**120)) | (x == 0) | ~np.isfinite(x)
    program = jax.jit(lambda v: fmt.decode(fmt.encode(v * 0.5)) * 4.0)
    _same_bits(np.asarray(program(x[normal] * 2)), ref[normal] * 4)


def _float64_inputs(dtype: np.dtype) -> np.ndarray:
    """Values of float64 a hair off the ties of `dtype` (where rounding through
    float32 lands on the tie), random magnitudes and float32 subnormals."""
    rng = np.random.default_rng(3)
    if dtype == np.dtype(np.float32):  # random values and the ties above them
        y = rng.integers(0, 2**32, 100_000, dtype=np.uint64).astype(np.uint32)
        y = y.view(np.float32)[np.isfinite(y.view(np.float32))]
        after = np.nextafter(y, np.float32(np.inf)).astype(np.float64)
        vals = np.concatenate([y, (y + after) / 2])
    else:
        vals = _dense(dtype).astype(np.float64)
    vals = vals[np.isfinite(vals)]
    hair = np.abs(vals) * 2.0**-40 + 2.0**-1040
    rand = rng.standard_normal(20_000) * np.exp2(rng.uniform(-160, 140, 20_000))
    return np.concatenate([vals + hair, vals - hair, rand])


@pytest.mark.parametrize("name", [*sorted(NARROW), "float32"])
def test_float64_input_is_rounded_once(x64, name):
    """The documented float64 semantics: rounded once, directly, on every
    backend (XLA:CPU converts float64 to 16-bit floats through float32 and
    flushes float32 subnormals in a float64 -> float32 convert)."""
    fmt = formats.get_format(name)
    scale = SCALE.get(name, 1.0)
    x = _float64_inputs(NARROW.get(name, np.dtype(np.float32))) / scale
    got = np.asarray(jax.jit(fmt.encode)(jnp.asarray(x)))
    with np.errstate(all="ignore"):
        if name == "float32":
            ref = x.astype(np.float32)  # NumPy rounds float64 -> float32 once
        else:
            ref = round_to_odd_float32(x * scale).astype(NARROW[name])
    _same_bits(got, ref)
    fused = jax.jit(lambda v: fmt.round(v) * 2.0)(jnp.asarray(x))
    _same_bits(np.asarray(fused), np.asarray(fmt.decode(got, jnp.float64)) * 2)


def test_round_to_odd_oracle_differs_from_rounding_through_float32():
    """1 + 2**-8 + 2**-40 is just above a bfloat16 tie: once -> 0x3F81, through
    float32 (which lands on the tie) -> 0x3F80."""
    x = np.array([1 + 2.0**-8 + 2.0**-40])
    once = round_to_odd_float32(x).astype(ml_dtypes.bfloat16).view(np.uint16)
    twice = x.astype(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)
    assert (int(once[0]), int(twice[0])) == (0x3F81, 0x3F80)


@pytest.mark.parametrize("dtype", [jnp.float8_e4m3fn, jnp.float8_e5m2])
def test_fp8_quantiser_rounds_without_convert(dtype):
    scale = jnp.float32(0.75)
    x = _dense(np.dtype(dtype)) * np.float32(0.75)
    x = x[np.isfinite(x)]
    quantise = jax.jit(lambda v: _quantize(v, dtype, scale).astype(jnp.float32) * 2)
    text = quantise.lower(jnp.asarray(x)).compile().as_text()
    assert not _NARROW_CONVERT.search(text)
    limit = float(ml_dtypes.finfo(np.dtype(dtype)).max)
    with np.errstate(all="ignore"):
        ref = np.clip(x / np.float32(0.75), -limit, limit).astype(np.dtype(dtype))
    _same_bits(np.asarray(quantise(x)), ref.astype(np.float32) * 2)
