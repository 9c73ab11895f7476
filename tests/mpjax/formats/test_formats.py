"""Registry, facts, contract battery, exhaustive properties and errors."""

from __future__ import annotations

import doctest
import math
import runpy

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from mpjax import formats

NAMES = (
    "float64",
    "float32",
    "bfloat16",
    "float16",
    "float8_e4m3fn",
    "float8_e5m2",
    "fp16s",
    "fp16c",
    "posit16",
    "posit16_es2",
    "posit16s",
)
SMALL = tuple(n for n in NAMES if formats.get_format(n).bits <= 16)
POSITS = ("posit16", "posit16_es2", "posit16s")
# Where every posit carries all its exponent bits, rounding the bit string is
# rounding the value (outside, ties are geometric means): |x| in [1/hi * s, hi * s]
# with s the scaling of posit16s.
EXACT_POSIT_RANGE = {
    "posit16": (2.0**-24, 2.0**24),
    "posit16_es2": (2.0**-40, 2.0**40),
    "posit16s": (2.0**-34, 2.0**14),
}


def _codes(fmt: formats.NumberFormat) -> np.ndarray:
    """Every stored code of a <= 16-bit format, in code order."""
    raw = np.arange(2**fmt.bits, dtype=np.uint32)
    uint = np.uint16 if fmt.bits == 16 else np.uint8
    return raw.astype(uint).view(fmt.storage_dtype)


@pytest.fixture(scope="module")
def tables():
    """name -> (codes, decoded float32 values), one jitted decode per format."""
    out = {}
    for name in SMALL:
        fmt = formats.get_format(name)
        codes = _codes(fmt)
        out[name] = codes, np.asarray(jax.jit(fmt.decode)(codes))
    return out


# ------------------------------------------------------------------- registry
def test_list_formats_names_every_required_format():
    assert formats.list_formats() == NAMES


def test_get_format_is_case_insensitive_and_passes_formats_through():
    fmt = formats.get_format("FP16C")
    assert fmt is formats.get_format("fp16c")
    assert formats.get_format(fmt) is fmt
    assert {formats.get_format(n).name for n in NAMES} == set(NAMES)


def test_get_format_unknown_name_lists_registered_names():
    with pytest.raises(ValueError, match="unknown number format 'fp17'") as err:
        formats.get_format("fp17")
    for name in NAMES:
        assert name in str(err.value)
    with pytest.raises(TypeError, match="str or NumberFormat"):
        formats.get_format(16)


def test_formats_are_hashable_values():
    a = formats.minifloat(
        "m", exponent_bits=4, mantissa_bits=11, bias=15, has_inf=False, has_nan=False
    )
    b = formats.minifloat(
        "m", exponent_bits=4, mantissa_bits=11, bias=15, has_inf=False, has_nan=False
    )
    assert a == b and hash(a) == hash(b)
    assert formats.posit(16, 1) == formats.posit(16, 1)
    with pytest.raises(AttributeError):
        a.bias = 3  # frozen


# ---------------------------------------------------------------------- facts
FACTS = {
    # name: (bits, storage, max, min_normal, min_subnormal, epsilon)
    "fp16s": (16, "float16", 65504 * 2.0**-15, 2.0**-29, 2.0**-39, 2.0**-10),
    "fp16c": (16, "uint16", 2 - 2.0**-11, 2.0**-14, 2.0**-25, 2.0**-11),
    "posit16": (16, "uint16", 2.0**28, None, 2.0**-28, 2.0**-12),
    "posit16_es2": (16, "uint16", 2.0**56, None, 2.0**-56, 2.0**-11),
    # 1.0 is stored as posit16's 2**10, which keeps 7 fraction bits
    "posit16s": (16, "uint16", 2.0**18, None, 2.0**-38, 2.0**-7),
    "float8_e4m3fn": (8, "float8_e4m3fn", 448.0, 2.0**-6, 2.0**-9, 2.0**-3),
    "float8_e5m2": (8, "float8_e5m2", 57344.0, 2.0**-14, 2.0**-16, 2.0**-2),
}


@pytest.mark.parametrize("name", sorted(FACTS))
def test_facts_match_design_table(name):
    fmt = formats.get_format(name)
    bits, storage, fmax, normal, sub, eps = FACTS[name]
    assert (fmt.bits, str(fmt.storage_dtype)) == (bits, storage)
    assert (fmt.max, fmt.min_normal, fmt.min_subnormal, fmt.epsilon) == (
        fmax,
        normal,
        sub,
        eps,
    )
    assert fmt.decimal_digits == pytest.approx(math.log10(2 / eps))
    assert fmt.has_inf == (name in ("fp16s", "float8_e5m2"))
    assert fmt.has_nan == (name != "fp16c")
    assert f"{fmt.max:.9g}" == {"fp16s": "1.99902344"}.get(name, f"{fmax:.9g}")


@pytest.mark.parametrize(
    "name",
    ["float64", "float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2"],
)
def test_ieee_facts_match_ml_dtypes_finfo(name):
    fmt = formats.get_format(name)
    info = ml_dtypes.finfo(fmt.storage_dtype)
    assert fmt.bits == info.bits
    assert fmt.max == float(info.max)
    assert fmt.min_normal == float(info.smallest_normal)
    assert fmt.min_subnormal == float(info.smallest_subnormal)
    assert fmt.epsilon == float(info.eps)
    assert fmt.has_nan


@pytest.mark.parametrize("name", SMALL)
def test_facts_agree_with_exhaustive_decode(name, tables):
    fmt = formats.get_format(name)
    _, vals = tables[name]
    finite = vals[np.isfinite(vals)].astype(np.float64)
    assert finite.max() == fmt.max and finite.min() == -fmt.max
    assert finite[finite > 0].min() == fmt.min_subnormal
    above_one = finite[finite > 1]
    assert above_one.min() - 1 == fmt.epsilon
    assert np.isinf(vals).any() == fmt.has_inf
    assert np.isnan(vals).any() == fmt.has_nan


def test_facts_table_and_main_print_every_format(capsys):
    table = formats.facts_table()
    rows = table.splitlines()
    assert len(rows) == 2 + len(NAMES)
    assert rows[NAMES.index("fp16c") + 2].startswith(
        "| fp16c | 16 | uint16 | 1.99951172"
    )
    runpy.run_module("mpjax.formats", run_name="__main__")
    assert capsys.readouterr().out.strip() == table


# ------------------------------------------------------- exhaustive 16 bits
@pytest.mark.parametrize("name", SMALL)
def test_decode_then_encode_returns_every_non_nan_code(name, tables):
    fmt = formats.get_format(name)
    codes, vals = tables[name]
    back = np.asarray(jax.jit(fmt.encode)(vals))
    assert back.dtype == fmt.storage_dtype
    uint = np.uint16 if fmt.bits == 16 else np.uint8
    real = ~np.isnan(vals)
    np.testing.assert_array_equal(back.view(uint)[real], codes.view(uint)[real])
    # NaN codes decode to NaN and re-encode to NaN: the canonical NaN/NaR code for
    # bit-pattern codecs; native casts keep the payload.
    if (~real).any():
        again = np.asarray(fmt.encode(vals[~real]))
        assert np.isnan(np.asarray(fmt.decode(again))).all()
        if fmt.storage_dtype.kind == "u":
            assert np.unique(again.view(uint) & 0x7FFF).size == 1


@pytest.mark.parametrize("name", SMALL)
def test_decode_is_monotonic_in_code_order(name, tables):
    fmt = formats.get_format(name)
    _, vals = tables[name]
    half = 2 ** (fmt.bits - 1)
    pos = vals[:half]
    pos = pos[~np.isnan(pos)]
    assert np.all(np.diff(pos) > 0)
    neg = vals[half:]
    neg = neg[~np.isnan(neg)]
    if name in POSITS:  # two's complement: codes 0x8001.. increase from -maxpos
        assert np.all(np.diff(neg) > 0) and neg[0] == -fmt.max
    else:  # sign-magnitude: 0x8000 is -0.0, then decreasing
        assert np.signbit(neg[0]) and neg[0] == 0 and np.all(np.diff(neg) < 0)


@pytest.mark.parametrize("name", SMALL)
def test_round_is_nearest_representable_ties_to_even(name, tables):
    fmt = formats.get_format(name)
    codes, vals = tables[name]
    uint = np.uint16 if fmt.bits == 16 else np.uint8
    ok = np.isfinite(vals) & ~((vals == 0) & np.signbit(vals))
    order = np.argsort(vals[ok], kind="stable")
    grid = vals[ok][order].astype(np.float64)
    grid_codes = codes.view(uint)[ok][order]
    lo, hi = -fmt.max, fmt.max
    if name in POSITS:  # where all exponent bits exist, bit rounding = value rounding
        tiny, hi = EXACT_POSIT_RANGE[name]
        lo = -hi
    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, 20_000) * np.exp2(rng.uniform(-45, 30, 20_000))
    x = np.clip(x, lo, hi).astype(np.float32)
    if name in POSITS:  # posits never round to zero: stay above minpos there
        x = x[np.abs(x) >= tiny]
    inner = (grid > lo) & (grid < hi)
    mids = ((grid[1:] + grid[:-1]) / 2)[inner[1:] & inner[:-1]]
    mids = mids[np.abs(mids) >= (np.abs(x).min() if name in POSITS else 0)]
    x = np.concatenate([x, mids.astype(np.float32)])
    assert np.all(mids.astype(np.float32) == mids)
    got = np.asarray(jax.jit(fmt.round)(x)).astype(np.float64)
    xd = x.astype(np.float64)
    idx = np.clip(np.searchsorted(grid, xd), 1, grid.size - 1)
    below, above = grid[idx - 1], grid[idx]
    d_below, d_above = xd - below, above - xd
    best = np.minimum(d_below, d_above)
    np.testing.assert_array_equal(np.abs(got - xd) <= best, True)
    tie = d_below == d_above
    even = np.where(grid_codes[idx - 1] % 2 == 0, below, above)
    np.testing.assert_array_equal(got[tie], even[tie])
    assert tie.sum() >= 100


# ------------------------------------------------------------ contract battery
@pytest.fixture(params=NAMES)
def fmt(request):
    if request.param == "float64":
        request.getfixturevalue("x64")
    return formats.get_format(request.param)


# One input shape for the whole battery, so compiled codecs are shared across tests.
X = np.linspace(-1.5, 1.5, 24, dtype=np.float32).reshape(2, 3, 4)
WEIGHTS = np.arange(1, 25, dtype=np.float32).reshape(2, 3, 4)


def test_contract_shapes_dtypes_and_jit(fmt):
    stored = fmt.encode(X)
    assert stored.shape == X.shape and stored.dtype == fmt.storage_dtype
    vals = fmt.decode(stored)
    assert vals.shape == X.shape and vals.dtype == jnp.float32
    np.testing.assert_array_equal(fmt.round(X), vals)
    # The codecs compose inside an outer jit (one fused program).
    np.testing.assert_array_equal(jax.jit(lambda v: fmt.decode(fmt.encode(v)))(X), vals)
    assert np.max(np.abs(np.asarray(vals) - X)) <= 2 * fmt.epsilon
    scalar = fmt.encode(0.5)
    assert scalar.shape == () and scalar.dtype == fmt.storage_dtype
    assert fmt.decode(stored, dtype=jnp.bfloat16).dtype == jnp.bfloat16
    assert fmt.round(X.astype(jnp.float16)).dtype == jnp.float16


def test_contract_round_is_monotonic_idempotent_and_odd(fmt):
    rng = np.random.default_rng(2)
    x = np.sort(
        (rng.standard_normal(4096) * np.exp2(rng.uniform(-40, 40, 4096))).astype(
            np.float32
        )
    )
    with np.errstate(over="ignore"):
        x = np.clip(x, -fmt.max, fmt.max).astype(np.float32)  # no overflow to NaN
    r = np.asarray(fmt.round(x))
    assert np.all(r[1:] >= r[:-1])  # rounding never reorders values
    np.testing.assert_array_equal(np.asarray(fmt.round(r)), r)
    np.testing.assert_array_equal(np.asarray(fmt.round(-x)), -r)


def test_contract_vmap_and_scan(fmt):
    np.testing.assert_array_equal(jax.vmap(fmt.encode)(X), fmt.encode(X))

    def body(carry, plane):
        stored = fmt.encode(carry + plane)
        return fmt.decode(stored), stored

    final, stacked = jax.lax.scan(body, jnp.zeros((3, 4), jnp.float32), X)
    assert final.dtype == jnp.float32 and stacked.dtype == fmt.storage_dtype
    assert stacked.shape == X.shape
    np.testing.assert_array_equal(stacked[0], fmt.encode(X[0]))


def test_contract_round_gradients(fmt):
    def loss(v, st):
        return jnp.sum(fmt.round(v, straight_through=st) * WEIGHTS)

    g_zero = jax.jit(jax.grad(lambda v: loss(v, False)))(X)
    g_ste = jax.jit(jax.grad(lambda v: loss(v, True)))(X)
    np.testing.assert_array_equal(g_zero, np.zeros_like(X))
    np.testing.assert_array_equal(g_ste, WEIGHTS)
    np.testing.assert_array_equal(
        formats.round(fmt.name, X, straight_through=True), fmt.round(X)
    )


def test_float64_format_round_trips_with_x64(x64):
    fmt = formats.get_format("float64")
    x = jnp.asarray(np.array([np.pi, -1e-310, 1e300], np.float64))
    stored = fmt.encode(x)
    assert stored.dtype == jnp.float64
    np.testing.assert_array_equal(fmt.decode(stored, jnp.float64), x)
    assert fmt.decode(stored).dtype == jnp.float32
    # Other formats decode exactly into float64 too.
    p = formats.get_format("posit16_es2")
    codes = jnp.arange(1, 65536, 97, dtype=jnp.uint16)
    np.testing.assert_array_equal(
        p.decode(codes, jnp.float64), p.decode(codes).astype(jnp.float64)
    )


def test_float64_without_x64_is_a_clear_error():
    fmt = formats.get_format("float64")
    with pytest.raises(ValueError, match="enable_x64"):
        fmt.encode(np.ones(3, np.float32))
    with pytest.raises(ValueError, match="enable_x64"):
        formats.get_format("fp16c").decode(jnp.zeros(3, jnp.uint16), jnp.float64)


# ---------------------------------------------------------------------- errors
@pytest.mark.parametrize("name", ["fp16c", "float16", "posit16", "fp16s"])
@pytest.mark.parametrize(
    "bad",
    [
        np.arange(3),
        np.ones(2, np.int8),
        np.array([True]),
        np.ones(2, np.complex64),
        3,
        True,
        1 + 2j,
        "1.0",
    ],
)
def test_encode_rejects_non_float_input(name, bad):
    with pytest.raises(TypeError, match=f"{name}.encode expects"):
        formats.get_format(name).encode(bad)


def test_decode_rejects_wrong_storage_and_output_dtypes():
    fmt = formats.get_format("fp16c")
    with pytest.raises(TypeError, match="dtype uint16.*got dtype int32"):
        fmt.decode(jnp.arange(4))
    with pytest.raises(TypeError, match="got list"):
        fmt.decode([1, 2])
    with pytest.raises(TypeError, match="floating-point dtype"):
        fmt.decode(jnp.zeros(2, jnp.uint16), dtype=jnp.int32)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(exponent_bits=5, mantissa_bits=0), "at least one mantissa bit"),
        (dict(exponent_bits=5, mantissa_bits=11), "at most 16 bits"),
        (dict(exponent_bits=0, mantissa_bits=3), r"exponent_bits must be in \[1, 11\]"),
        (dict(exponent_bits=5, mantissa_bits=2, has_nan=False), "requires has_nan"),
        (
            dict(
                exponent_bits=4,
                mantissa_bits=3,
                has_inf=False,
                has_nan=False,
                saturating=False,
            ),
            "must saturate",
        ),
        (dict(exponent_bits=8, mantissa_bits=7, bias=100), "float32's normal range"),
        (dict(exponent_bits=3, mantissa_bits=12, bias=-130), "normal range"),
        (
            dict(exponent_bits=5, mantissa_bits=10, native_dtype="float32"),
            "native_dtype=float32 has exponent_bits=8",
        ),
        (dict(exponent_bits=5, mantissa_bits=10, native_dtype="int8"), "must be one"),
        (
            dict(
                exponent_bits=5,
                mantissa_bits=10,
                native_dtype="float16",
                saturating=True,
            ),
            "do not saturate",
        ),
    ],
)
def test_minifloat_invalid_parameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        formats.minifloat("bad", **kwargs)


def test_minifloat_parameter_types():
    with pytest.raises(TypeError, match="mantissa_bits must be an int, got float"):
        formats.minifloat("bad", exponent_bits=5, mantissa_bits=2.0)
    with pytest.raises(TypeError, match="has_inf must be a bool"):
        formats.minifloat("bad", exponent_bits=5, mantissa_bits=2, has_inf=1)


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        ((16, -1), ValueError, "es must be >= 0, got -1"),
        ((17, 1), ValueError, r"nbits must be in \[3, 16\].*got 17"),
        ((2, 0), ValueError, "nbits must be in"),
        ((16, 4), ValueError, "use es <= 3"),
        ((16.0, 1), TypeError, "nbits must be an int"),
    ],
)
def test_posit_invalid_parameters(args, error, message):
    with pytest.raises(error, match=message):
        formats.posit(*args)


def test_scaled_invalid_parameters():
    f16 = formats.get_format("float16")
    with pytest.raises(TypeError, match="NumberFormat"):
        formats.scaled("float16", 15)
    with pytest.raises(TypeError, match="exponent must be an int"):
        formats.scaled(f16, 1.5)
    with pytest.raises(ValueError, match="choose an exponent between"):
        formats.scaled(f16, 110)
    with pytest.raises(ValueError, match="at least 2\\*\\*-125"):
        formats.scaled(formats.get_format("bfloat16"), -10)


def test_scaled_posit_keeps_tiny_values_nonzero():
    # x * 2**-90 underflows float32 for tiny x; a posit must still give minpos.
    fmt = formats.scaled(formats.get_format("posit16"), -90, name="p16big")
    assert (fmt.max, fmt.min_subnormal) == (2.0**118, 2.0**62)
    x = np.array([1e-30, -1e-40, 0.0, 2.0**70], np.float32)
    got = np.asarray(fmt.round(x))
    np.testing.assert_array_equal(got, np.array([2.0**62, -(2.0**62), 0.0, 2.0**70]))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_scaled_posit_saturates_products_that_overflow(dtype, request):
    # x * 2**10 overflows for finite x >= 2**118 (float32); a posit must give
    # +-maxpos there, never NaR, while Inf and NaN still give NaR.
    if dtype == "float64":
        request.getfixturevalue("x64")
    fmt = formats.get_format("posit16s")
    big = np.finfo(dtype).max
    x = np.array([big, -big, 2.0**118, np.inf, np.nan, 1.0], dtype)
    got = np.asarray(fmt.encode(x))
    np.testing.assert_array_equal(got, [0x7FFF, 0x8001, 0x7FFF, 0x8000, 0x8000, 0x7E00])
    back = np.asarray(fmt.decode(got))
    np.testing.assert_array_equal(back[:3], [fmt.max, -fmt.max, fmt.max])


def test_scaled_epsilon_is_the_gap_above_one_of_the_scaled_values():
    p16 = formats.get_format("posit16")
    # posit16 keeps 12 fraction bits at 1.0 and fewer further out, 7 at 2**10
    for exponent, eps in ((0, 2.0**-12), (3, 2.0**-11), (10, 2.0**-7), (-5, 2.0**-10)):
        assert formats.scaled(p16, exponent).epsilon == eps
    # 1.0 * 2**-90 is below posit16's minpos: no value at 1.0, the inner epsilon
    assert formats.scaled(p16, -90).epsilon == p16.epsilon
    f16 = formats.get_format("float16")
    assert formats.scaled(f16, 15).epsilon == f16.epsilon
    assert jax.jit(lambda x: x * formats.scaled(p16, 10).epsilon)(1.0) == 2.0**-7


# -------------------------------------------------------------------- doctests
@pytest.mark.parametrize(
    "module",
    ["__init__", "_minifloat", "_posit", "_scaled", "_registry"],
)
def test_docstring_examples_run(module):
    mod = formats if module == "__init__" else getattr(formats, module)
    result = doctest.testmod(mod, verbose=False)
    assert result.failed == 0 and (result.attempted > 0 or module == "_base")
