"""The compiled step: contract battery and analytic flows (shear wave, Poiseuille)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lbm_jax
from lbm_jax import CellType, Collision, Simulation, run

STORAGES = [lbm_jax.get_storage(name).short_name for name in lbm_jax.list_storages()]
# Every member of each family at least once: all storage policies (D2Q9, BGK), both
# collision operators, all lattices; kept small because each member compiles.
BATTERY = [("D2Q9", (8, 6), s, "bgk") for s in STORAGES] + [
    ("D2Q9", (8, 6), "fp32", "trt"),
    ("D2Q9", (8, 6), "fp16c", "trt"),
    ("D3Q19", (4, 5, 3), "fp16s", "trt"),
    ("D3Q27", (4, 5, 3), "fp32", "bgk"),
]


def _initial(sim, seed=0):
    rng = np.random.default_rng(seed)
    rho = 1 + 0.01 * rng.standard_normal(sim.shape)
    u = 0.02 * rng.standard_normal((sim.lattice.d, *sim.shape))
    return sim.init(rho, u)


@pytest.mark.parametrize(("lattice", "shape", "storage", "collision"), BATTERY)
def test_step_contract(lattice, shape, storage, collision, request):
    if storage == "fp64":
        request.getfixturevalue("x64")
    sim = Simulation(lattice, shape, tau=0.7, storage=storage, collision=collision)
    state = _initial(sim)
    q = sim.lattice.q
    assert state.f.dtype == sim.storage.storage_dtype
    assert state.f.size == q * sim.num_cells
    assert state.t.dtype == jnp.int32 and int(state.t) == 0

    # a jitted step; three steps in lax.scan and a lax.cond in one program
    step = jax.jit(sim.step)
    one = step(state)
    looped = step(step(one))

    def program(s, pred):
        scanned, _ = jax.lax.scan(lambda c, _: (sim.step(c), None), s, length=3)
        return scanned, jax.lax.cond(pred, sim.step, lambda x: x, s)

    scanned, kept = jax.jit(program)(state, False)
    for out in (one, scanned, looped, kept):
        chex.assert_trees_all_equal_shapes_and_dtypes(out, state)
    assert int(one.t) == 1 and int(scanned.t) == 3
    chex.assert_trees_all_equal(kept, state)
    chex.assert_trees_all_close(
        sim.populations(scanned), sim.populations(looped), rtol=0, atol=1e-6
    )

    # pytree round trip, through host memory, keeps every field bit for bit
    leaves, treedef = jax.tree_util.tree_flatten(jax.device_get(scanned))
    restored = jax.tree_util.tree_unflatten(treedef, [jnp.asarray(x) for x in leaves])
    assert isinstance(restored, lbm_jax.LBMState)
    chex.assert_trees_all_equal(restored, scanned)
    rho = lbm_jax.density(sim, restored)
    assert rho.shape == sim.shape
    assert rho.dtype == sim.storage.compute_dtype
    assert bool(jnp.all(jnp.isfinite(rho)))


def test_step_advance_and_jit_are_bit_identical():
    sim = Simulation("D2Q9", (12, 10), tau=0.65, storage="fp16s", collision="trt")
    stepped = _initial(sim, 3)
    step = jax.jit(sim.step)
    for _ in range(5):
        stepped = step(stepped)
    advanced = sim.advance(_initial(sim, 3), 5)
    chex.assert_trees_all_equal(advanced, stepped)
    # advancing in pieces equals one piece (the step count is traced)
    pieces = sim.advance(sim.advance(_initial(sim, 3), 2), 3)
    chex.assert_trees_all_equal(pieces, advanced)


def test_advance_validates_steps():
    sim = Simulation("D2Q9", (4, 4), tau=0.7)
    with pytest.raises(TypeError, match="steps must be an int"):
        sim.advance(sim.init(), 2.0)
    with pytest.raises(ValueError, match="steps must be in"):
        sim.advance(sim.init(), -1)


@pytest.mark.parametrize("collision", [c.value for c in Collision])
def test_shear_wave_decays_at_the_viscous_rate(collision):
    n, amplitude, steps = 64, 0.01, 300
    sim = Simulation("D2Q9", (4, n), tau=0.8, collision=collision)
    y = np.arange(n)
    k = 2 * np.pi / n
    u = np.zeros((2, 4, n))
    u[0] = amplitude * np.sin(k * y)[None, :]
    state = sim.advance(sim.init(1.0, u), 50)  # let the initial transient pass
    amplitudes = []
    for _ in range(2):
        ux = np.asarray(lbm_jax.velocity(sim, state)[0, 0], np.float64)
        amplitudes.append(2 / n * np.sum(ux * np.sin(k * y)))
        state = sim.advance(state, steps)
    rate = np.log(amplitudes[0] / amplitudes[1]) / steps
    assert rate == pytest.approx(sim.viscosity * k**2, rel=2e-3)


def _channel(lattice, n_fluid, *, tau, collision, magic=3 / 16, g=1e-5):
    d = 2 if lattice == "D2Q9" else 3
    shape = (2, n_fluid + 2) + (2,) * (d - 2)
    ct = np.zeros(shape, np.int8)
    ct[:, 0] = CellType.SOLID
    ct[:, -1] = CellType.SOLID
    force = (g,) + (0.0,) * (d - 1)
    return Simulation(
        lattice,
        shape,
        tau=tau,
        collision=collision,
        magic=magic,
        force=force,
        cell_type=ct,
        storage="fp64",
    )


@pytest.mark.parametrize(
    ("lattice", "collision", "tau", "magic"),
    [
        ("D2Q9", "bgk", 0.5 + np.sqrt(3 / 16), 3 / 16),
        ("D2Q9", "trt", 1.4, 3 / 16),
        pytest.param("D3Q19", "trt", 0.7, 3 / 16, marks=pytest.mark.slow),
    ],
)
def test_poiseuille_is_exact_with_mid_link_walls(lattice, collision, tau, magic, x64):
    n, g = 8, 1e-5
    sim = _channel(lattice, n, tau=tau, collision=collision, magic=magic, g=g)
    state = sim.advance(sim.init(), 6000)
    ux = np.asarray(lbm_jax.velocity(sim, state)[0, 0, 1:-1]).reshape(n, -1)[:, 0]
    y = np.arange(n) + 0.5
    analytic = g / (2 * sim.viscosity) * y * (n - y)
    np.testing.assert_allclose(ux, analytic, rtol=1e-6)


def test_poiseuille_bgk_slip_off_magic_tau(x64):
    # BGK half-way bounce-back: uniform slip (2g/3nu)[(tau-1/2)^2 - 3/16]
    n, g, tau = 8, 1e-5, 1.1
    sim = _channel("D2Q9", n, tau=tau, collision="bgk", g=g)
    state = sim.advance(sim.init(), 8000)
    ux = np.asarray(lbm_jax.velocity(sim, state)[0, 0, 1:-1])
    y = np.arange(n) + 0.5
    nu = sim.viscosity
    slip = 2 * g / (3 * nu) * ((tau - 0.5) ** 2 - 3 / 16)
    no_slip = g / (2 * nu) * y * (n - y)
    assert slip > 0.01 * no_slip.max()  # the effect is visible at this tau
    np.testing.assert_allclose(ux, no_slip + slip, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("lattice", "shape", "kwargs"),
    [
        ("D3Q19", (8, 5, 4), {"collision": "trt"}),
        (
            "D2Q9",
            (12, 8),
            {
                "force": (1e-5, 0.0),
                "cell_type": np.pad(
                    np.zeros((12, 6), np.int8), ((0, 0), (1, 1)), constant_values=1
                ),
            },
        ),
    ],
)
def test_domain_split_over_two_devices_is_bit_identical(lattice, shape, kwargs):
    if len(jax.devices()) < 2:
        pytest.skip("needs two devices (tests/conftest.py sets two host devices)")
    results = []
    for devices, slab in ((None, 3), (2, 2)):
        sim = Simulation(
            lattice,
            shape,
            tau=0.7,
            storage="fp16s",
            devices=devices,
            slab=slab,
            **kwargs,
        )
        state = sim.advance(_initial(sim, 4), 5)
        state = run(sim, state, 4, check_every=3).state
        # a per-call force field (traced) crossing the sub-domain borders
        x = np.arange(shape[0]).reshape(-1, *([1] * (len(shape) - 1)))
        force = np.zeros((len(shape), *shape), np.float32)
        force[0] = 1e-4 * np.cos(2 * np.pi * x / shape[0])
        state = sim.advance(state, 3, force=force)
        state = jax.jit(lambda s, f, sim=sim: sim.step(s, force=f))(state, force)
        results.append(jax.device_get(state))
        assert sim.devices == (devices or 1)
    chex.assert_trees_all_equal(results[0], results[1])


def test_devices_and_slab_validation():
    with pytest.raises(ValueError, match="device\\(s\\) are available.*XLA_FLAGS"):
        Simulation("D2Q9", (8, 8), tau=0.7, devices=len(jax.devices()) + 1)
    if len(jax.devices()) >= 2:
        with pytest.raises(ValueError, match="not divisible by devices=2"):
            Simulation("D2Q9", (9, 8), tau=0.7, devices=2)
    with pytest.raises(TypeError, match="devices must be an int"):
        Simulation("D2Q9", (8, 8), tau=0.7, devices="2")
    with pytest.raises(ValueError, match=r"slab must be in \[1, 8\]"):
        Simulation("D2Q9", (8, 8), tau=0.7, slab=9)
