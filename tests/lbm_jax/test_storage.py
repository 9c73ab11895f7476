"""Storage policies: names, dtypes, x64 guard, encode/decode through mpjax.formats."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lbm_jax
from lbm_jax import StoragePolicy, get_storage, list_storages
from lbm_jax.cases import run_case

TABLE = {
    "FP64/FP64": ("fp64", "float64", 8),
    "FP32/FP32": ("fp32", "float32", 4),
    "FP32/FP16": ("fp16", "float32", 2),
    "FP32/FP16S": ("fp16s", "float32", 2),
    "FP32/FP16C": ("fp16c", "float32", 2),
    "FP32/posit16": ("posit16", "float32", 2),
    "FP32/posit16_es2": ("posit16_es2", "float32", 2),
    "FP32/posit16s": ("posit16s", "float32", 2),
    "FP32/bfloat16": ("bf16", "float32", 2),
}
SIXTEEN_BIT = [name for name, (_, _, nbytes) in TABLE.items() if nbytes == 2]


def test_list_storages_is_the_paper_table():
    assert list_storages() == tuple(TABLE)


@pytest.mark.parametrize("name", list(TABLE))
def test_get_storage_canonical_and_short_names(name):
    short, compute, nbytes = TABLE[name]
    pol = get_storage(name)
    assert isinstance(pol, StoragePolicy)
    assert pol.name == name and pol.short_name == short
    assert pol.compute_dtype == np.dtype(compute)
    assert pol.bytes_per_value == nbytes
    assert pol.shift is True
    assert get_storage(short) == pol
    assert get_storage(name.upper()) == pol


def test_get_storage_shift_switch():
    pol = get_storage("fp16s", shift=False)
    assert pol.shift is False and "unshifted" in str(pol)
    assert get_storage(pol, shift=True).shift is True
    with pytest.raises(TypeError, match="shift must be a bool"):
        get_storage("fp16s", shift=1)


def test_get_storage_rejects_unknown_names():
    with pytest.raises(ValueError, match=r"'fp8'.*FP32/FP16S.*fp16c"):
        get_storage("fp8")
    with pytest.raises(TypeError, match="str or StoragePolicy"):
        get_storage(16)


def test_fp64_needs_x64():
    with pytest.raises(ValueError, match="64-bit types are disabled"):
        get_storage("fp64").check_enabled()


def test_fp64_enabled_with_x64(x64):
    pol = get_storage("fp64")
    pol.check_enabled()
    x = jnp.asarray([0.1, -0.2], jnp.float64)
    assert pol.decode(pol.encode(x)).dtype == jnp.float64
    np.testing.assert_array_equal(pol.decode(pol.encode(x)), x)


@pytest.mark.parametrize("name", SIXTEEN_BIT)
def test_sixteen_bit_round_trip_within_format_precision(name):
    pol = get_storage(name)
    # DDF-shifted populations of a flow live in about [-0.05, 0.05]
    rng = np.random.default_rng(0)
    mag = rng.uniform(1e-3, 0.05, 4096) * rng.choice([-1.0, 1.0], 4096)
    x = jnp.asarray(mag, jnp.float32)
    stored = jax.jit(pol.encode)(x)
    assert stored.dtype == pol.storage_dtype and stored.shape == x.shape
    back = jax.jit(pol.decode)(stored)
    assert back.dtype == jnp.float32
    rel = np.abs(np.asarray(back) - np.asarray(x)) / np.abs(np.asarray(x))
    # bfloat16 keeps 8 significant bits, posits at least 9 here, 16-bit IEEE-like
    # formats and posit16s (posit16 of x * 2**10) 11: round-to-nearest errs by
    # half a unit in the last place at most
    eleven = ("FP32/FP16", "FP32/FP16S", "FP32/FP16C", "FP32/posit16s")
    bound = 2.0**-11 if name in eleven else 2.0**-8
    assert rel.max() <= bound
    assert rel.max() > 0


def test_bfloat16_storage_holds_the_bfloat16_bit_patterns():
    pol = get_storage("bf16")
    assert pol.storage_dtype == np.dtype(np.uint16)  # moved as 16-bit integers
    specials = [np.inf, -np.inf, np.nan, 0.0, -0.0, 3.0e38, 1e-39]
    x = np.concatenate([np.random.default_rng(2).normal(0, 1e-3, 4096), specials])
    # the oracle is ml_dtypes' conversion on the host (a GPU's own cast returns
    # its canonical NaN; the codec keeps the NaN's sign and top payload bits)
    host = x.astype(np.float32).astype(jnp.bfloat16)
    x = jnp.asarray(x, jnp.float32)
    stored = jax.jit(pol.encode)(x)
    np.testing.assert_array_equal(np.asarray(stored), host.view(np.uint16))
    np.testing.assert_array_equal(
        np.asarray(jax.jit(pol.decode)(stored)), host.astype(np.float32)
    )


def test_fp32_storage_is_exact():
    pol = get_storage("fp32")
    x = jnp.asarray(np.random.default_rng(1).normal(size=64), jnp.float32)
    np.testing.assert_array_equal(pol.decode(pol.encode(x)), x)


@pytest.mark.slow
def test_posit16s_taylor_green_stays_close_to_fp32():
    # posit16s moves posit16's most precise region onto the shifted populations
    # (tests/lbm_jax/test_population_range.py); measured at n=32 relative to the
    # FP32 velocity field: posit16s 2.0e-4, fp16s 8.0e-4, posit16 1.7e-3.
    u = {
        s: run_case("taylor_green", n=32, storage=s).fields["u"]
        for s in ("fp32", "posit16s", "posit16", "fp16s")
    }

    def error(s):
        return np.linalg.norm(u[s] - u["fp32"]) / np.linalg.norm(u["fp32"])

    assert error("posit16s") < 5e-4
    assert error("posit16s") < error("posit16") / 4
    assert error("posit16s") < error("fp16s")


def _sheared_state(sim):
    """A state away from equilibrium: a shear wave run a few steps."""
    x = np.arange(sim.shape[0])
    u = np.zeros((2, *sim.shape))
    u[1] = 0.05 * np.sin(2 * np.pi * x / sim.shape[0])[:, None]
    return sim.advance(sim.init(1.0 + 0.01 * u[1], u), 5)


def test_convert_rounds_once_into_the_target_format():
    sim32 = lbm_jax.Simulation("D2Q9", (16, 8), tau=0.6, storage="fp32")
    sim16 = lbm_jax.Simulation("D2Q9", (16, 8), tau=0.6, storage="fp16s")
    s32 = _sheared_state(sim32)
    s16 = sim16.convert(s32, sim32)
    assert int(s16.t) == int(s32.t) == 5
    fp16s = get_storage("fp16s").format
    want = fp16s.round(sim32.populations(s32, shifted=True))
    np.testing.assert_array_equal(sim16.populations(s16, shifted=True), want)
    # back to FP32 is exact, and the run goes on from there
    back = sim32.convert(s16, sim16)
    np.testing.assert_array_equal(
        sim32.populations(back, shifted=True), sim16.populations(s16, shifted=True)
    )
    assert bool(sim32.healthy(sim32.advance(back, 3)))


def test_convert_between_shifted_and_unshifted_storage():
    shifted = lbm_jax.Simulation("D2Q9", (16, 8), tau=0.6, storage="fp32")
    plain = lbm_jax.Simulation("D2Q9", (16, 8), tau=0.6, storage="fp32", shift=False)
    s = _sheared_state(shifted)
    f = shifted.populations(s)
    np.testing.assert_array_equal(plain.populations(plain.convert(s, shifted)), f)
    w = np.asarray(shifted.lattice.w, np.float32).reshape(-1, 1, 1)
    again = shifted.convert(plain.convert(s, shifted), plain)
    np.testing.assert_array_equal(shifted.populations(again, shifted=True), f - w)


def test_convert_onto_a_split_grid():
    one = lbm_jax.Simulation("D2Q9", (16, 8), tau=0.6, storage="fp16c")
    two = lbm_jax.Simulation("D2Q9", (16, 8), tau=0.6, storage="fp16c", devices=2)
    s = _sheared_state(one)
    split = two.convert(s, one)
    np.testing.assert_array_equal(two.populations(split), one.populations(s))
    np.testing.assert_array_equal(
        two.populations(two.advance(split, 3)), one.populations(one.advance(s, 3))
    )


def test_convert_refuses_another_grid_or_a_foreign_state():
    sim = lbm_jax.Simulation("D2Q9", (16, 8), tau=0.6)
    other = lbm_jax.Simulation("D2Q9", (8, 8), tau=0.6)
    with pytest.raises(ValueError, match="one lattice and grid"):
        sim.convert(other.init(), other)
    with pytest.raises(ValueError, match="does not belong"):
        sim.convert(other.init(), sim)
    with pytest.raises(TypeError, match="lbm_jax.Simulation"):
        sim.convert(sim.init(), "fp32")
