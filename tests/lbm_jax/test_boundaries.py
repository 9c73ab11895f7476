"""Boundaries: per-direction masks, bounce-back, moving walls, equilibrium cells."""

import jax.numpy as jnp
import numpy as np
import pytest

import lbm_jax
from lbm_jax import CellType, Collision, Simulation, get_lattice
from lbm_jax.core._boundaries import link_mask


def test_link_mask_marks_links_pointing_at_a_solid_cell():
    lat = get_lattice("D2Q9")
    solid = np.zeros((5, 5), bool)
    solid[2, 2] = True
    links = link_mask(lat, ~solid, solid)
    # fluid cell (3, 2) pulls direction (+1, 0) from (2, 2), the solid cell
    assert links[lat.index((1, 0)), 3, 2]
    assert links[lat.index((1, 1)), 3, 3]
    assert not links[lat.index((-1, 0)), 3, 2]
    # exactly the 8 neighbours have one link each, the solid cell none
    assert links.sum() == 8
    assert not links[:, 2, 2].any()
    # periodic: a solid cell on the edge is seen across the boundary
    edge = np.zeros((5, 5), bool)
    edge[0, 0] = True
    assert link_mask(lat, ~edge, edge)[lat.index((-1, -1)), 4, 4]


def _box(n):
    ct = np.zeros((n, n), np.int8)
    ct[0, :] = ct[-1, :] = ct[:, 0] = ct[:, -1] = CellType.SOLID
    return ct


def test_closed_box_conserves_mass_exactly(x64):
    n = 12
    ct = _box(n)
    sim = Simulation("D2Q9", (n, n), tau=0.6, storage="fp64", cell_type=ct)
    rng = np.random.default_rng(0)
    u = 0.03 * rng.standard_normal((2, n, n)) * (ct == 0)
    state = sim.init(1 + 0.02 * rng.standard_normal((n, n)), u)
    fluid = ct == CellType.FLUID
    m0 = float(jnp.sum(lbm_jax.density(sim, state)[fluid]))
    u0 = float(jnp.abs(lbm_jax.velocity(sim, state)).max())
    state = sim.advance(state, 500)
    rho = lbm_jax.density(sim, state)
    assert float(jnp.sum(rho[fluid])) == pytest.approx(m0, rel=1e-13)
    # the motion decays (no momentum source in a closed box); sound waves remain
    assert float(jnp.abs(lbm_jax.velocity(sim, state)[:, fluid]).max()) < 0.2 * u0
    np.testing.assert_array_equal(rho[~fluid], 1.0)


@pytest.mark.parametrize("collision", [c.value for c in Collision])
def test_couette_flow_is_linear_between_a_moving_and_a_resting_wall(collision, x64):
    n, uw = 10, 0.05
    ct = np.zeros((3, n + 2), np.int8)
    ct[:, 0] = CellType.SOLID
    ct[:, -1] = CellType.WALL
    sim = Simulation(
        "D2Q9",
        ct.shape,
        tau=0.9,
        collision=collision,
        storage="fp64",
        cell_type=ct,
        wall_velocity=(uw, 0.0),
    )
    state = sim.advance(sim.init(), 4000)
    u = np.asarray(lbm_jax.velocity(sim, state))
    y = np.arange(1, n + 1) - 0.5  # distance of the fluid nodes from the resting wall
    np.testing.assert_allclose(u[0, 1, 1:-1], uw * y / n, rtol=1e-6)
    np.testing.assert_allclose(u[1, 1, 1:-1], 0.0, atol=1e-12)
    # the wall cells report the wall velocity
    np.testing.assert_allclose(u[0, :, -1], uw, rtol=1e-12)


def test_equilibrium_cells_hold_their_state_and_drive_the_flow():
    n, u_in = 16, 0.03
    ct = np.zeros((n, 4), np.int8)
    ct[0, :] = CellType.EQUILIBRIUM
    sim = Simulation(
        "D2Q9",
        (n, 4),
        tau=1.5,
        cell_type=ct,
        boundary_density=1.0,
        boundary_velocity=(u_in, 0.0),
    )
    state = sim.advance(sim.init(), 3000)
    u = np.asarray(lbm_jax.velocity(sim, state))
    rho = np.asarray(lbm_jax.density(sim, state))
    np.testing.assert_allclose(u[0, 0], u_in, rtol=1e-6)
    np.testing.assert_allclose(rho[0], 1.0, rtol=1e-6)
    # periodic in x: the whole channel is pulled along to the prescribed velocity
    np.testing.assert_allclose(u[0], u_in, rtol=2e-3)
    np.testing.assert_allclose(u[1], 0.0, atol=1e-6)


def test_pressure_difference_between_equilibrium_cells_drives_flow_downhill():
    ct = np.zeros((20, 8), np.int8)
    ct[:, 0] = ct[:, -1] = CellType.SOLID
    ct[0, 1:-1] = ct[-1, 1:-1] = CellType.EQUILIBRIUM
    rho_b = np.ones((20, 8))
    rho_b[0] = 1.01
    sim = Simulation("D2Q9", (20, 8), tau=0.8, cell_type=ct, boundary_density=rho_b)
    state = sim.advance(sim.init(), 2000)
    u = np.asarray(lbm_jax.velocity(sim, state))
    rho = np.asarray(lbm_jax.density(sim, state))
    assert (u[0, 1:-1, 1:-1] > 0).all()
    # density falls monotonically along the channel centre line
    assert (np.diff(rho[:, 4]) < 0).all()
    # parabolic-ish profile: centre faster than next to the walls
    assert u[0, 10, 4] > 1.5 * u[0, 10, 1]


def test_solid_cells_accept_a_boolean_mask():
    solid = np.zeros((6, 6), bool)
    solid[2:4, 2:4] = True
    sim = Simulation("D2Q9", (6, 6), tau=0.7, cell_type=solid)
    np.testing.assert_array_equal(sim.cell_type, solid.astype(np.int8))
    assert not sim.cell_type.flags.writeable


def test_boundary_input_validation():
    ct = np.zeros((6, 6), np.int8)
    ct[:, -1] = CellType.WALL
    with pytest.raises(
        ValueError, match=r"wall_velocity must be a vector of shape \(2,\)"
    ):
        Simulation("D2Q9", (6, 6), tau=0.7, cell_type=ct, wall_velocity=(0.1,))
    with pytest.raises(
        ValueError, match=r"boundary_density must be a scalar or of shape"
    ):
        Simulation("D2Q9", (6, 6), tau=0.7, boundary_density=np.ones(3))
    with pytest.raises(ValueError, match="non-finite"):
        Simulation("D2Q9", (6, 6), tau=0.7, wall_velocity=(np.nan, 0.0))
