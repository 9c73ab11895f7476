"""Property tests with Hypothesis: adversarial float32 inputs for the integer codecs."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpjax import formats

# the reference; a machine without it (e.g. a bare GPU node) skips these tests
sp = pytest.importorskip("softposit")

FLOATS = st.floats(width=32, allow_nan=True, allow_infinity=True)
SETTINGS = settings(max_examples=300, deadline=None, database=None)


@pytest.fixture(scope="module")
def grids():
    """name -> (sorted finite values as float64, their codes) for brute force."""
    out = {}
    for name in ("fp16c", "fp16s"):
        fmt = formats.get_format(name)
        codes = np.arange(65536, dtype=np.uint32).astype(np.uint16)
        codes = codes.view(fmt.storage_dtype)
        vals = np.asarray(jax.jit(fmt.decode)(codes)).astype(np.float64)
        keep = np.isfinite(vals) & ~((vals == 0) & np.signbit(vals))
        order = np.argsort(vals[keep], kind="stable")
        out[name] = vals[keep][order], codes.view(np.uint16)[keep][order]
    return out


def _nearest_even(x: float, grid: np.ndarray, codes: np.ndarray) -> float:
    i = int(np.clip(np.searchsorted(grid, x), 1, grid.size - 1))
    lo, hi = grid[i - 1], grid[i]
    if x - lo < hi - x:
        return lo
    if hi - x < x - lo:
        return hi
    return lo if codes[i - 1] % 2 == 0 else hi


@pytest.mark.parametrize("name", ["fp16c", "fp16s"])
def test_round_is_nearest_even_for_any_float32(name, grids):
    fmt = formats.get_format(name)
    grid, codes = grids[name]
    encode = jax.jit(fmt.round)

    @SETTINGS
    @given(FLOATS)
    def check(v):
        x = np.float32(v)
        got = float(encode(x))
        if np.isnan(x):
            assert (np.isnan(got) and fmt.has_nan) or got == fmt.max
        elif abs(float(x)) > fmt.max:
            # Saturation (fp16c) or rounding to +-max / Inf at the overflow tie.
            assert abs(got) == fmt.max or (fmt.has_inf and np.isinf(got))
            assert np.sign(got) == np.sign(x)
        else:
            assert got == _nearest_even(float(x), grid, codes)

    check()


@pytest.mark.parametrize("name", ["posit16", "posit16_es2", "posit16s"])
def test_posit_encode_matches_softposit_for_any_float32(name):
    fmt = formats.get_format(name)
    encode = jax.jit(fmt.encode)
    scale = 2.0**10 if name == "posit16s" else 1.0  # posit16s: posit16 of x * 2**10

    @SETTINGS
    @given(FLOATS)
    def check(v):
        x = np.float32(v)
        got = int(encode(x))
        if not np.isfinite(x):
            assert got == 0x8000
        elif name == "posit16_es2":
            assert got == sp.posit_2(float(x), 16).v.v >> 16
        else:
            assert got == sp.posit16(float(x) * scale).v.v

    check()
