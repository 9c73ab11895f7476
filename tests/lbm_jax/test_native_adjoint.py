"""The native step's adjoint (``lbm_jax/step/_native/lbm_adjoint.cc``): reverse
mode through a native simulation equals the XLA step's derivative."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lbm_jax
from tests.lbm_jax._native_env import native_skip_reason

pytestmark = pytest.mark.skipif(
    native_skip_reason() is not None, reason=str(native_skip_reason())
)

# the native step needs at least 128 cells per x-plane
SHAPES = {"D2Q9": (8, 128), "D3Q19": (6, 8, 16), "D3Q27": (5, 8, 16)}


def _boxed(lattice: str, storage: str, *, backend: str, **kw) -> lbm_jax.Simulation:
    """Solid walls, a moving wall, equilibrium (fixed) cells and a constant
    force: every part of the step the adjoint transposes."""
    shape = SHAPES[lattice]
    cells = np.zeros(shape, np.int8)
    cells[:, 0] = lbm_jax.CellType.SOLID
    cells[:, -1] = lbm_jax.CellType.WALL
    cells[0, 3] = lbm_jax.CellType.EQUILIBRIUM
    d = len(shape)
    return lbm_jax.Simulation(
        lattice,
        shape,
        tau=0.7,
        storage=storage,
        cell_type=cells,
        wall_velocity=(0.04,) + (0.0,) * (d - 1),
        force=(2e-5,) + (-1e-5,) * (d - 1),
        backend=backend,
        **kw,
    )


def _start(sim: lbm_jax.Simulation) -> jax.Array:
    d, dtype = len(sim.shape), sim.storage.compute_dtype
    x = jnp.arange(sim.shape[0], dtype=dtype)
    wave = 0.03 * jnp.sin(2 * jnp.pi * x / sim.shape[0])
    u = jnp.zeros((d, *sim.shape), dtype)
    u = u.at[0].set(wave.reshape((-1,) + (1,) * (d - 1)))
    return sim.init(u=u.at[-1].add(0.01)).f


def _step_vjp(sim: lbm_jax.Simulation, f: jax.Array, ct: jax.Array) -> np.ndarray:
    def one(f):
        return sim.step(lbm_jax.LBMState(f=f, t=jnp.int32(0))).f

    return np.asarray(jax.vjp(one, f)[1](ct)[0], np.float64)


@pytest.mark.parametrize("storage", ["FP32/FP32", "FP32/FP16S"])
@pytest.mark.parametrize("lattice", list(SHAPES))
def test_native_vjp_equals_the_xla_steps(lattice, storage):
    native, xla = (_boxed(lattice, storage, backend=b) for b in ("native", "xla"))
    assert native.backends["derivative"] == "native"
    assert xla.backends["derivative"] == "xla"
    f = _start(native)
    rng = np.random.default_rng(1)
    ct = jnp.asarray(rng.standard_normal(f.shape), f.dtype)
    got, want = _step_vjp(native, f, ct), _step_vjp(xla, f, ct)
    assert np.abs(want).max() > 0.5
    # float32 sums in another order; float16 cotangents round to a neighbour
    # (2^-10 relative) where that lands near a tie
    rtol = 1e-5 if storage == "FP32/FP32" else 2.0**-10
    np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-6)


def test_rows_longer_than_a_tile_equal_the_xla_steps():
    """Rows of more than 512 cells are pulled in pieces (a 2D grid's rows)."""
    shape = (3, 1032)
    cells = np.zeros(shape, np.int8)
    cells[1, 5] = lbm_jax.CellType.SOLID
    native, xla = (
        lbm_jax.Simulation(
            "D2Q9", shape, tau=0.9, cell_type=cells, force=(1e-5, 0.0), backend=b
        )
        for b in ("native", "xla")
    )
    f = native.init(u=(0.02, 0.01)).f
    ct = jnp.asarray(np.random.default_rng(2).standard_normal(f.shape), f.dtype)
    want = _step_vjp(xla, f, ct)
    np.testing.assert_allclose(_step_vjp(native, f, ct), want, rtol=1e-5, atol=1e-6)


def test_fixed_cells_pass_no_cotangent():
    sim = _boxed("D2Q9", "FP32/FP32", backend="native")
    f = _start(sim)
    ct = jnp.zeros_like(f).at[0, :, 3].set(1.0)  # only the equilibrium cell's
    np.testing.assert_array_equal(_step_vjp(sim, f, ct), 0.0)


def _energy(sim: lbm_jax.Simulation, amp: jax.Array, steps: int = 4) -> jax.Array:
    state = lbm_jax.LBMState(f=_start(sim), t=jnp.int32(0))
    dtype = sim.storage.compute_dtype
    f = state.f.astype(dtype)
    kicked = state._replace(f=(f * (1 + jnp.asarray(amp, dtype))).astype(state.f.dtype))
    out = sim.advance(kicked, steps)
    return jnp.sum(lbm_jax.velocity(sim, out) ** 2)


@pytest.mark.parametrize(
    "storage", ["FP32/FP32", pytest.param("FP32/FP16S", marks=pytest.mark.slow)]
)
def test_advance_gradient_equals_the_xla_backends(storage):
    native, xla = (_boxed("D2Q9", storage, backend=b) for b in ("native", "xla"))
    got, want = (
        float(jax.grad(functools.partial(_energy, s))(jnp.float32(0.01)))
        for s in (native, xla)
    )
    assert want != 0.0
    np.testing.assert_allclose(got, want, rtol=1e-4 if storage == "FP32/FP32" else 1e-2)


def test_advance_gradient_matches_float64_central_differences(x64):
    native = _boxed("D2Q9", "FP32/FP32", backend="native")
    exact = _boxed("D2Q9", "fp64", backend="xla")
    got = float(jax.grad(functools.partial(_energy, native))(jnp.float32(0.01)))
    energy = jax.jit(functools.partial(_energy, exact))
    h = 1e-4
    central = (energy(0.01 + h) - energy(0.01 - h)) / (2 * h)
    np.testing.assert_allclose(got, float(central), rtol=1e-4)


def test_forward_mode_keeps_the_xla_steps_derivative():
    native, xla = (_boxed("D3Q19", "FP32/FP32", backend=b) for b in ("native", "xla"))
    got, want = (
        jax.jvp(functools.partial(_energy, s), (jnp.float32(0.01),), (1.0,))[1]
        for s in (native, xla)
    )
    np.testing.assert_allclose(float(got), float(want), rtol=1e-5)


def _lid_speed_gradient(sim: lbm_jax.Simulation, lid: jax.Array) -> jax.Array:
    d = len(sim.shape)
    moved = sim.with_arrays(wall_velocity=jnp.zeros(d).at[0].set(lid))
    state = moved.advance(moved.init(u=(0.01,) + (0.0,) * (d - 1)), 3)
    return jnp.sum(lbm_jax.velocity(moved, state)[0] ** 2)


def test_step_arrays_under_differentiation_take_the_xla_derivative():
    """A wall velocity being differentiated: the native adjoint has no
    cotangent for it, so the XLA step's derivative runs (never a zero)."""
    native, xla = (_boxed("D2Q9", "FP32/FP32", backend=b) for b in ("native", "xla"))
    got, want = (
        float(jax.grad(functools.partial(_lid_speed_gradient, s))(0.04))
        for s in (native, xla)
    )
    assert want != 0.0
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_force_field_gradient_takes_the_xla_derivative():
    native, xla = (_boxed("D2Q9", "FP32/FP32", backend=b) for b in ("native", "xla"))
    field = jnp.ones((2, *SHAPES["D2Q9"]), jnp.float32)

    def energy(sim, amp):
        state = sim.advance(sim.init(), 3, amp * 1e-5 * field)
        return jnp.sum(lbm_jax.velocity(sim, state, amp * 1e-5 * field) ** 2)

    got, want = (
        float(jax.grad(functools.partial(energy, s))(1.0)) for s in (native, xla)
    )
    assert want != 0.0
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_uncovered_configurations_say_why():
    sim = _boxed("D2Q9", "FP32/FP16C", backend="native")
    assert sim.backends["derivative"] == "xla"
    assert "FP32/FP32 or FP32/FP16S" in sim.derivative_reason
    assert _boxed("D2Q9", "FP32/FP32", backend="native").derivative_reason is None


def test_vmap_of_the_native_derivative_raises():
    """vmap of a native step raises (its foreign call has no batching rule), so
    does vmap of its adjoint: never a wrong value."""
    sim = _boxed("D2Q9", "FP32/FP32", backend="native")
    with pytest.raises(NotImplementedError):
        jax.vmap(jax.grad(functools.partial(_energy, sim)))(jnp.array([0.0, 0.01]))


def test_second_derivatives_raise():
    sim = _boxed("D2Q9", "FP32/FP32", backend="native")
    energy = functools.partial(_energy, sim, steps=1)
    with pytest.raises(ValueError, match="cannot be differentiated"):
        jax.grad(jax.grad(energy))(jnp.float32(0.01))


def test_jit_of_the_native_gradient_equals_eager():
    sim = _boxed("D3Q27", "FP32/FP16S", backend="native")
    fn = jax.grad(functools.partial(_energy, sim, steps=3))
    np.testing.assert_array_equal(float(jax.jit(fn)(0.01)), float(fn(0.01)))
