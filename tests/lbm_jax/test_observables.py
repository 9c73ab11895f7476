"""Observables: density, velocity (Guo-corrected), vorticity, momentum exchange."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lbm_jax
from lbm_jax import CellType, Simulation


@pytest.mark.parametrize("storage", ["fp32", "fp16s"])
def test_density_and_velocity_return_the_initial_fields(storage):
    sim = Simulation("D3Q19", (6, 5, 4), tau=0.7, storage=storage, force=(1e-4, 0, 0))
    rng = np.random.default_rng(0)
    rho = 1 + 0.01 * rng.standard_normal(sim.shape)
    u = 0.03 * rng.standard_normal((3, *sim.shape))
    state = sim.init(rho, u)
    tol = 1e-6 if storage == "fp32" else 2e-4
    np.testing.assert_allclose(lbm_jax.density(sim, state), rho, rtol=tol)
    np.testing.assert_allclose(lbm_jax.velocity(sim, state), u, atol=tol)
    assert lbm_jax.velocity(sim, state).dtype == jnp.float32
    populations = sim.populations(state)
    assert populations.shape == (19, *sim.shape)
    np.testing.assert_allclose(jnp.sum(populations, axis=0), rho, rtol=tol)
    shifted = sim.populations(state, shifted=True)
    w = sim.lattice.w.reshape(-1, 1, 1, 1).astype(np.float32)
    np.testing.assert_allclose(shifted + w, populations, atol=1e-7)
    # a per-call force field replaces the construction force in init and read-out
    field = 1e-3 * rng.standard_normal((3, *sim.shape)).astype(np.float32)
    state = sim.init(rho, u, force=field)
    np.testing.assert_allclose(lbm_jax.velocity(sim, state, force=field), u, atol=tol)
    # read with the construction force, the other half-force shows
    f0 = np.array([1e-4, 0, 0]).reshape(3, 1, 1, 1)
    np.testing.assert_allclose(
        lbm_jax.velocity(sim, state), u + (field - f0) / (2 * rho), atol=tol
    )


def test_observables_jit():
    sim = Simulation("D2Q9", (8, 6), tau=0.7)
    state = sim.init(u=(0.01, 0.02))
    rho, u = jax.jit(lambda s: (lbm_jax.density(sim, s), lbm_jax.velocity(sim, s)))(
        state
    )
    np.testing.assert_allclose(rho, 1.0, rtol=1e-6)
    np.testing.assert_allclose(u[1], 0.02, rtol=1e-5)


def test_vorticity_2d_of_a_shear_wave():
    n = 16
    k = 2 * np.pi / n
    y = np.arange(n)
    u = np.zeros((2, 8, n), np.float32)
    u[0] = np.sin(k * y)[None, :]
    w = lbm_jax.vorticity(u)
    assert w.shape == (8, n)
    # central differences of sin(ky): sin(k) cos(ky); continuum limit -k cos(ky)
    np.testing.assert_allclose(
        w, -np.sin(k) * np.cos(k * y)[None, :] * np.ones((8, 1)), atol=1e-6
    )


def test_vorticity_3d_of_a_rigid_rotation_core():
    # u = Omega x r is a rigid rotation: curl = 2 Omega (away from the periodic seam)
    n = 9
    x, y, z = np.meshgrid(*(np.arange(n) - n // 2,) * 3, indexing="ij")
    omega = np.array([0.0, 0.0, 0.01])
    r = np.stack([x, y, z]).astype(np.float32)
    u = np.cross(omega, r, axisb=0, axisc=0).astype(np.float32)
    curl = np.asarray(lbm_jax.vorticity(u))
    inner = (slice(None),) + (slice(2, -2),) * 3
    np.testing.assert_allclose(curl[inner][2], 0.02, rtol=1e-5)
    np.testing.assert_allclose(curl[inner][:2], 0.0, atol=1e-7)


def test_vorticity_rejects_bad_shapes():
    with pytest.raises(ValueError, match=r"\(2, X, Y\) or \(3, X, Y, Z\)"):
        lbm_jax.vorticity(np.zeros((3, 4, 4)))


@pytest.fixture(scope="module")
def channel():
    """Steady force-driven channel flow past a square obstacle."""
    ct = np.zeros((24, 14), np.int8)
    ct[:, 0] = ct[:, -1] = CellType.SOLID
    ct[8:12, 5:9] = CellType.SOLID
    g = 1e-5
    sim = Simulation(
        "D2Q9", ct.shape, tau=0.9, collision="trt", force=(g, 0.0), cell_type=ct
    )
    state = sim.advance(sim.init(), 6000)
    return sim, state, g


def test_momentum_exchange_balances_the_body_force(channel):
    sim, state, g = channel
    fluid = sim.cell_type == CellType.FLUID
    total = np.asarray(lbm_jax.momentum_exchange_force(sim, state))
    # at steady state every wall together holds back the force on the fluid
    np.testing.assert_allclose(total[0], g * fluid.sum(), rtol=2e-3)
    assert abs(total[1]) < 1e-3 * total[0]


def test_momentum_exchange_on_a_sub_mask(channel):
    sim, state, g = channel
    obstacle = np.zeros(sim.shape, bool)
    obstacle[8:12, 5:9] = True
    drag = np.asarray(lbm_jax.momentum_exchange_force(sim, state, obstacle))
    walls = (sim.cell_type == CellType.SOLID) & ~obstacle
    rest = np.asarray(lbm_jax.momentum_exchange_force(sim, state, walls))
    total = np.asarray(lbm_jax.momentum_exchange_force(sim, state))
    np.testing.assert_allclose(drag + rest, total, rtol=1e-5, atol=1e-8)
    assert 0 < drag[0] < total[0]
    # the obstacle sits in the middle of the channel: no lift by symmetry
    assert abs(drag[1]) < 1e-3 * drag[0]


def test_momentum_exchange_on_a_moving_lid():
    # Couette: the fluid pulls the lid back with the wall shear stress
    n, uw = 8, 0.05
    ct = np.zeros((4, n + 2), np.int8)
    ct[:, 0] = CellType.SOLID
    ct[:, -1] = CellType.WALL
    sim = Simulation("D2Q9", ct.shape, tau=0.8, cell_type=ct, wall_velocity=(uw, 0.0))
    state = sim.advance(sim.init(), 3000)
    lid = sim.cell_type == CellType.WALL
    bottom = sim.cell_type == CellType.SOLID
    f_lid = np.asarray(lbm_jax.momentum_exchange_force(sim, state, lid))
    f_bottom = np.asarray(lbm_jax.momentum_exchange_force(sim, state, bottom))
    shear = sim.viscosity * uw / n * ct.shape[0]  # stress times wall length
    np.testing.assert_allclose(f_lid[0], -shear, rtol=1e-3)
    np.testing.assert_allclose(f_bottom[0], shear, rtol=1e-3)


def test_momentum_exchange_validates_the_mask(channel):
    sim, state, _ = channel
    with pytest.raises(ValueError, match="boolean array of the grid shape"):
        lbm_jax.momentum_exchange_force(sim, state, np.zeros((3, 3), bool))
    with pytest.raises(ValueError, match="not SOLID or WALL"):
        lbm_jax.momentum_exchange_force(sim, state, np.ones(sim.shape, bool))
