"""Observables: density, velocity (Guo-corrected), vorticity, momentum exchange."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lbm_jax
from lbm_jax import CellType, Simulation
from lbm_jax.core._collision import direction_constants, equilibrium, moments
from lbm_jax.step import _layout


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


# -- slab-wise read-out against the full-array formulation ----------------------
# The full-array formulations below are the ones the slab-wise functions replaced
# (a decoded or transposed copy of the whole state); every slab-wise result must
# equal them: bit for bit per cell, within rounding for sums over the grid.


@functools.partial(jax.jit, static_argnums=(0, 2))
def _full_populations(sim, state, shifted=False):
    pol = sim.storage
    f = pol.decode(jnp.moveaxis(state.f, 1, 0))
    if pol.shift and not shifted:
        w, _ = direction_constants(sim.lattice, pol.compute_dtype, len(sim.shape))
        f = f + w
    return f


@functools.partial(jax.jit, static_argnums=0)
def _full_fields(sim, state, force):
    pol = sim.storage
    f = pol.decode(state.f)
    rho, j = moments(sim.lattice, f, shift=pol.shift, axis=1)
    j = [ji - 0.5 * force[a] for a, ji in enumerate(j)]
    return rho, jnp.stack([ji / rho for ji in j])


@functools.partial(jax.jit, static_argnums=0)
def _full_init(sim, rho, u, force):
    """``rho`` grid-shaped, ``u`` and ``force`` ``(D, *shape)``, compute dtype."""
    lat, pol, shape = sim.lattice, sim.storage, sim.shape
    feq = equilibrium(lat, rho, [u[a] for a in range(lat.d)], shift=pol.shift)
    w, cs = direction_constants(lat, pol.compute_dtype, len(shape))
    fc = [force[a][None] for a in range(lat.d)]
    feq = feq + 1.5 * w * sum(c * f for c, f in zip(cs, fc, strict=True))
    f = jnp.moveaxis(pol.encode(feq), 0, 1)
    bnd = sim._aux.boundary  # noqa: SLF001  (the fixed cells, as the old init)
    return jnp.where(bnd.fixed_mask, bnd.fixed, f)


def _grid(sim, value, lead):
    """A host value broadcast to ``(*lead, *shape)`` in the compute dtype."""
    a = np.asarray(value, np.float64)
    a = a.reshape(a.shape + (1,) * (len(lead) + len(sim.shape) - a.ndim))
    return jnp.asarray(np.broadcast_to(a, (*lead, *sim.shape)).astype(np.float32))


def _full_vorticity(u):
    def ddx(a, axis):
        return 0.5 * (jnp.roll(a, -1, axis) - jnp.roll(a, 1, axis))

    if u.ndim == 3:
        return ddx(u[1], 0) - ddx(u[0], 1)
    return jnp.stack(
        [
            ddx(u[2], 1) - ddx(u[1], 2),
            ddx(u[0], 2) - ddx(u[2], 0),
            ddx(u[1], 0) - ddx(u[0], 1),
        ]
    )


def _full_momentum_exchange(sim, state, body):
    lat, ct = sim.lattice, sim.cell_type
    fluid = ct == CellType.FLUID
    axes = tuple(range(len(sim.shape)))
    grid = tuple(range(1, len(axes) + 1))
    moving_uw = sim.wall_velocity * (ct == CellType.WALL)
    links, wall = [], []
    for ci, wi in zip(lat.c, lat.w, strict=True):
        back = tuple(-int(v) for v in ci)
        links.append(fluid & np.roll(body, back, axis=axes))
        uw_next = np.roll(moving_uw, back, axis=tuple(a + 1 for a in axes))
        wall.append(6.0 * wi * np.tensordot(ci.astype(np.float64), uw_next, axes=1))
    link = np.stack(links)
    c = lat.c.astype(np.float64)
    constant = -np.where(link, np.stack(wall), 0.0).sum(axis=grid) @ c
    f = _full_populations(sim, state, shifted=True)
    if sim.storage.shift:
        constant = constant + 2 * (lat.w * link.sum(axis=grid)) @ c
    per_dir = np.asarray(jnp.sum(jnp.where(link, 2 * f, 0), axis=grid), np.float64)
    return per_dir @ c + constant


def _geometry(shape):
    """Walls (one moving), an obstacle and an inlet column of equilibrium cells."""
    d = len(shape)
    ct = np.zeros(shape, np.int8)
    ct[(slice(None), 0)] = CellType.SOLID
    ct[(slice(None), -1)] = CellType.WALL
    ct[(slice(2, 4), slice(2, 4))] = CellType.SOLID
    ct[(0, slice(1, -1))] = CellType.EQUILIBRIUM
    uw = np.zeros((d, *shape))
    uw[0] = 0.04
    return ct, uw


def _assert_same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype
    np.testing.assert_array_equal(a.view(f"u{a.itemsize}"), b.view(f"u{b.itemsize}"))


def _assert_stored_close(sim, a, b):
    pol = sim.storage
    rtol = 2**-21 if pol.storage_dtype == np.float32 else 2**-8
    np.testing.assert_allclose(pol.decode(a), pol.decode(b), rtol=rtol, atol=1e-7)


@pytest.fixture
def small_slabs(monkeypatch):
    """Slabs of a few planes, so that tiny grids loop over several slabs."""
    monkeypatch.setattr(_layout, "SLAB_BYTES", 1000)


SLAB_CASES = [
    ("D2Q9", (12, 8), "fp32", None),
    pytest.param("D3Q19", (8, 6, 4), "fp16s", 2, marks=pytest.mark.slow),
    pytest.param("D3Q19", (8, 6, 4), "fp16s", None, marks=pytest.mark.slow),
    pytest.param("D3Q27", (6, 4, 4), "FP32/bfloat16", None, marks=pytest.mark.slow),
    pytest.param("D2Q9", (12, 8), "fp16c", 2, marks=pytest.mark.slow),
    pytest.param("D2Q9", (12, 8), "fp16s", (1, 2), marks=pytest.mark.slow),
    pytest.param("D3Q27", (6, 4, 4), "fp32", (2, 1, 1), marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("lattice", "shape", "storage", "devices"), SLAB_CASES)
def test_slabwise_read_out_equals_the_full_array_formulation(
    small_slabs, lattice, shape, storage, devices
):
    ct, uw = _geometry(shape)
    rng = np.random.default_rng(1)
    d = len(shape)
    field = 1e-4 * rng.standard_normal((d, *shape))
    sim = Simulation(
        lattice,
        shape,
        tau=0.8,
        storage=storage,
        cell_type=ct,
        wall_velocity=uw,
        boundary_velocity=(0.02,) + (0.0,) * (d - 1),
        force=field,
        devices=devices,
    )
    rho = 1 + 0.01 * rng.standard_normal(shape)
    u = 0.02 * rng.standard_normal((d, *shape))
    state = sim.init(rho, u)
    # the initial state: equal up to the last bit (XLA may contract a multiply
    # and an add differently in a slab-shaped fusion), then the stored rounding
    lead = (d,)
    full = _full_init(
        sim, _grid(sim, rho, ()), _grid(sim, u, lead), _grid(sim, field, lead)
    )
    _assert_stored_close(sim, state.f, full)
    vector = np.array((1e-4,) + (0.0,) * (d - 1))
    v = _grid(sim, vector, lead)
    full = _full_init(sim, _grid(sim, 1.0, ()), v, v)
    _assert_stored_close(sim, sim.init(1.0, vector, force=vector).f, full)
    state = sim.advance(state, 3)
    rho_new, u_new = sim.fields(state)
    rho_old, u_old = _full_fields(sim, state, _grid(sim, field, lead))
    _assert_same(rho_new, rho_old)
    _assert_same(u_new, u_old)
    _assert_same(lbm_jax.density(sim, state), rho_old)
    _assert_same(
        lbm_jax.velocity(sim, state, force=vector), _full_fields(sim, state, v)[1]
    )
    for shifted in (False, True):
        _assert_same(
            sim.populations(state, shifted=shifted),
            _full_populations(sim, state, shifted),
        )
    assert bool(sim.healthy(state))
    negative = sim.storage.encode(jnp.full((), -0.2, sim.storage.compute_dtype))
    bad = state._replace(f=state.f.at[3, :, 0].set(negative))  # one cell, rho < 0
    assert not bool(sim.healthy(bad))
    for body in (None, ct == CellType.WALL):
        new = np.asarray(lbm_jax.momentum_exchange_force(sim, state, body), np.float64)
        wall_like = (ct == CellType.SOLID) | (ct == CellType.WALL)
        full = _full_momentum_exchange(sim, state, wall_like if body is None else body)
        np.testing.assert_allclose(new, full, rtol=1e-5, atol=1e-6 * np.abs(full).max())
    # inside a compiled function too (a run's observe): the same value
    traced = jax.jit(lambda s: lbm_jax.momentum_exchange_force(sim, s, body))(state)
    _assert_same(traced, lbm_jax.momentum_exchange_force(sim, state, body))
    _assert_same(lbm_jax.vorticity(u_new), _full_vorticity(u_old))
    if devices:  # split results stay split, not gathered to one device
        for a in (rho_new, u_new, lbm_jax.vorticity(u_new)):
            assert len(a.sharding.device_set) == np.prod(devices)
