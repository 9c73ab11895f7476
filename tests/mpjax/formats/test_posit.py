"""The posit codec against SoftPosit, over every code and random inputs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mpjax import formats

# the reference; a machine without it (e.g. a bare GPU node) skips these tests
sp = pytest.importorskip("softposit")

NAR = 0x8000


# posit16s is posit16 of x * 2**10: SoftPosit sees the exactly scaled value.
SCALE = {"posit16": 0, "posit16_es2": 0, "posit16s": 10}


def _sp_encode(name: str, x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64) * 2.0 ** SCALE[name]
    if name != "posit16_es2":
        return np.array([sp.posit16(float(v)).v.v for v in x], np.uint16)
    return np.array([sp.posit_2(float(v), 16).v.v >> 16 for v in x], np.uint16)


def _sp_decode(name: str, codes: np.ndarray) -> np.ndarray:
    if name != "posit16_es2":
        vals = np.array([float(sp.posit16(bits=int(c))) for c in codes])
    else:
        vals = np.array([float(sp.posit_2(x=16, bits=int(c))) for c in codes])
    return vals * 2.0 ** -SCALE[name]


@pytest.fixture(scope="module", params=list(SCALE))
def case(request):
    """(name, format, all codes, softposit's value of every code)."""
    name = request.param
    codes = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    return name, formats.get_format(name), codes, _sp_decode(name, codes)


def test_posit_decode_matches_softposit_on_every_code(case):
    name, fmt, codes, ref = case
    got = np.asarray(jax.jit(fmt.decode)(codes))
    real = codes != NAR
    np.testing.assert_array_equal(got[real].astype(np.float64), ref[real])
    assert np.isnan(got[NAR])  # softposit reports NaR as inf; we decode it to NaN
    assert not np.isnan(got[real]).any()


def test_posit_encode_matches_softposit_on_every_value_and_tie(case):
    name, fmt, codes, ref = case
    vals = np.unique(ref[np.isfinite(ref)])
    mids = (vals[1:] + vals[:-1]) / 2  # ties in value
    geo = np.sqrt(vals[1:] * vals[:-1])  # ties where exponent bits are cut off
    geo = geo[np.isfinite(geo) & (geo > 0)]
    ties = np.concatenate([mids, geo]).astype(np.float32)
    up = np.nextafter(ties, np.float32(np.inf))
    down = np.nextafter(ties, np.float32(-np.inf))
    x = np.unique(np.concatenate([vals.astype(np.float32), ties, up, down]))
    got = np.asarray(jax.jit(fmt.encode)(x))
    np.testing.assert_array_equal(got, _sp_encode(name, x))


def test_posit_encode_matches_softposit_on_random_inputs(case):
    name, fmt, _, _ = case
    rng = np.random.default_rng(3)
    n = 50_000
    raw = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    span = np.log2(fmt.max)
    logu = np.exp2(rng.uniform(-span - 8, span + 8, n)) * rng.choice([-1.0, 1.0], n)
    x = np.concatenate([raw, logu.astype(np.float32)])
    assert x.size >= 100_000
    finite = np.isfinite(x)
    got = np.asarray(jax.jit(fmt.encode)(x))
    np.testing.assert_array_equal(got[finite], _sp_encode(name, x[finite]))
    assert (got[~finite] == NAR).all()
    # Beyond maxpos and below minpos the result clamps, never 0 or NaR.
    tiny = np.abs(x[finite]) < fmt.min_subnormal
    assert (got[finite][tiny & (x[finite] != 0)] != 0).all()


def test_posit_special_inputs(case):
    _, fmt, _, _ = case
    x = np.array(
        [0.0, -0.0, np.nan, np.inf, -np.inf, 1e-44, -1e-44, 3e38, -3e38], np.float32
    )
    got = np.asarray(fmt.encode(x))
    maxpos, minpos = 0x7FFF, 0x0001
    neg = lambda c: (65536 - c) & 0xFFFF  # noqa: E731
    expected = [0, 0, NAR, NAR, NAR, minpos, neg(minpos), maxpos, neg(maxpos)]
    np.testing.assert_array_equal(got, np.array(expected, np.uint16))
    back = np.asarray(fmt.decode(got))
    assert back[0] == 0 and not np.signbit(back[1])  # a single, unsigned zero
    np.testing.assert_array_equal(
        back[-4:], [fmt.min_subnormal, -fmt.min_subnormal, fmt.max, -fmt.max]
    )


def test_posit_encode_of_float64_matches_softposit(case, x64):
    name, fmt, _, _ = case
    rng = np.random.default_rng(11)
    x = rng.standard_normal(20_000) * np.exp2(rng.uniform(-70, 70, 20_000))
    got = np.asarray(fmt.encode(jnp.asarray(x)))
    np.testing.assert_array_equal(got, _sp_encode(name, x))


def test_posit_generic_sizes_round_trip():
    for nbits, es in ((8, 0), (8, 2), (12, 3), (5, 1), (5, 3)):
        fmt = formats.posit(nbits, es)
        assert fmt.storage_dtype == (np.uint8 if nbits <= 8 else np.uint16)
        codes = np.arange(2**nbits, dtype=np.uint32).astype(fmt.storage_dtype)
        vals = np.asarray(fmt.decode(codes))
        real = codes != 1 << (nbits - 1)
        np.testing.assert_array_equal(np.asarray(fmt.encode(vals))[real], codes[real])
        assert vals[1] == fmt.min_subnormal and vals[(1 << (nbits - 1)) - 1] == fmt.max
        one = 1 << (nbits - 2)  # the code of 1.0
        assert vals[one] == 1.0 and vals[one + 1] - 1.0 == fmt.epsilon
