"""Per-step force input and coupled steps over pytrees through the one driver."""

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lbm_jax
from lbm_jax import CellType, LBMState, Simulation

SHAPE = (32, 16)


@pytest.fixture(scope="module")
def sim():
    return Simulation("D2Q9", SHAPE, tau=0.8)


class Coupled(NamedTuple):
    fluid: LBMState
    marker: jax.Array  # (2,) position in lattice units


def _cell(x: jax.Array) -> jax.Array:
    return jnp.round(x).astype(jnp.int32) % jnp.array(SHAPE)


def _marker_step(sim: Simulation, push: float, s: Coupled) -> Coupled:
    """A point force ``push`` along x on the marker's cell; the marker moves with
    the fluid there."""
    cell = _cell(s.marker)
    force = jnp.zeros((2, *SHAPE)).at[0, cell[0], cell[1]].set(push)
    fluid = sim.step(s.fluid, force=force)
    u = lbm_jax.velocity(sim, fluid, force=force)
    return Coupled(fluid, s.marker + u[:, cell[0], cell[1]])


def _momentum(sim: Simulation, s: Coupled) -> jax.Array:
    """Total post-collision momentum sum_x sum_i c_i f_i (the shift cancels)."""
    f = sim.populations(s.fluid, shifted=True)
    c = jnp.asarray(sim.lattice.c, jnp.float32)
    return jnp.einsum("qa,q...->a", c, f)


def _run(sim, push, u, steps, **kwargs):
    step = jax.tree_util.Partial(_marker_step, sim, push)  # sim's arrays are leaves
    start = Coupled(sim.init(u=u), jnp.array([8.0, 8.0]))
    return lbm_jax.run(
        step, start, steps, healthy=lambda s: sim.healthy(s.fluid), **kwargs
    )


def test_coupled_point_force_adds_its_momentum_every_step(sim):
    push = 1e-4
    result = _run(
        sim,
        push,
        (0.0, 0.0),
        100,
        check_every=25,
        observe=lambda s: {"marker": s.marker, "momentum": _momentum(sim, s)},
        sample_every=10,
    )
    samples = result.samples
    np.testing.assert_array_equal(samples.steps, np.arange(10, 101, 10))
    # Guo forcing adds exactly the applied force to the momentum every step
    expected = np.stack([push * samples.steps, np.zeros(10)], axis=1)
    np.testing.assert_allclose(
        samples.values["momentum"], expected, rtol=1e-5, atol=1e-9
    )
    # the pushed fluid carries the marker downstream, faster and faster
    x = samples.values["marker"][:, 0] - 8.0
    assert np.all(np.diff(x) > 0) and np.all(np.diff(x, 2) > 0)
    np.testing.assert_allclose(samples.values["marker"][:, 1], 8.0, atol=1e-6)
    assert result.stats.mlups > 0 and int(result.state.fluid.t) == 100


def test_coupled_marker_is_carried_by_the_flow(sim):
    result = _run(sim, 1e-7, (0.02, 0.01), 100)
    travelled = np.asarray(result.state.marker) - [8.0, 8.0]
    np.testing.assert_allclose(travelled, [2.0, 1.0], rtol=1e-4)
    # the driver's compiled loop and a host loop of one compiled step agree
    jitted = jax.jit(lambda s: _marker_step(sim, 1e-7, s))
    state = Coupled(sim.init(u=(0.02, 0.01)), jnp.array([8.0, 8.0]))
    for _ in range(100):
        state = jitted(state)
    chex.assert_trees_all_equal(result.state, state)


def test_a_new_force_field_never_recompiles(sim):
    traces = []

    def step(s, force):
        traces.append(1)
        return sim.step(s, force=force)

    jitted = jax.jit(step)
    state = sim.init()
    rng = np.random.default_rng(1)
    for _ in range(3):
        field = jnp.asarray(1e-5 * rng.standard_normal((2, *SHAPE)), jnp.float32)
        state = jitted(state, field)
    assert len(traces) == 1 and int(state.t) == 3


def test_advance_with_a_force_equals_repeated_steps(sim):
    field = np.zeros((2, *SHAPE), np.float32)
    field[1, 5:9, 3] = 2e-5
    advanced = sim.advance(sim.init(), 5, force=field)
    stepped = sim.init()
    for _ in range(5):
        stepped = sim.step(stepped, force=field)
    # equal to round-off (XLA hoists force terms out of the multi-step loop)
    np.testing.assert_allclose(advanced.f, stepped.f, rtol=0, atol=1e-11)
    # a traced (D,) vector acts like the same constant force given at construction
    vector = jnp.array([1e-5, -2e-5], jnp.float32)
    pushed = Simulation("D2Q9", SHAPE, tau=0.8, force=(1e-5, -2e-5))
    np.testing.assert_allclose(
        sim.advance(sim.init(force=vector), 7, force=vector).f,
        pushed.advance(pushed.init(), 7).f,
        rtol=0,
        atol=1e-9,
    )


def test_force_field_on_a_walled_grid_and_through_jit_as_a_pytree():
    cell_type = np.zeros((12, 10), np.int8)
    cell_type[:, [0, -1]] = int(CellType.SOLID)
    walled = Simulation("D2Q9", (12, 10), tau=0.9, cell_type=cell_type)
    field = np.zeros((2, 12, 10), np.float32)
    field[0, :, 1:-1] = 1e-5
    direct = walled.advance(walled.init(), 20, force=field)
    via_jit = jax.jit(lambda w, s, f: w.advance(s, 20, force=f))(
        walled, walled.init(), field
    )
    chex.assert_trees_all_equal(direct, via_jit)
    ux = lbm_jax.velocity(walled, direct, force=field)[0]
    assert float(ux[:, 1:-1].min()) > 0  # pushed along x between the walls


def test_bad_force_input_is_refused(sim):
    state = sim.init()
    with pytest.raises(ValueError, match=r"force must be a vector of shape \(2,\)"):
        sim.step(state, force=np.zeros((3, *SHAPE), np.float32))
    with pytest.raises(ValueError, match=r"field of shape \(2, 32, 16\)"):
        sim.advance(state, 2, force=np.zeros((2, 16, 32), np.float32))
    with pytest.raises(TypeError, match="force must be floating point"):
        sim.step(state, force=np.zeros(2, np.int32))
    with pytest.raises(ValueError, match="non-finite"):
        sim.init(force=(np.nan, 0.0))
    assert int(state.t) == 0
