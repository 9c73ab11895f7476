"""Gray cells: a per-cell solid fraction (partial bounce-back, Walsh et al. 2009).

A gray cell with solid fraction ``n`` sends out ``(1 - n) f* + n f_opp``: its
collided populations blended with its own pre-collision populations reversed.

Uniform box under a body force ``F`` (Guo forcing, as ``lbm_jax.core._collision``
defines it): collision and Guo source together add ``F`` to the pre-collision
momentum ``j``, and the reversed populations carry ``-j``, so the stored
(post-step) momentum obeys ``j' = (1 - n)(j + F) - n j = (1 - 2n) j + (1 - n) F``.
Streaming moves nothing in a uniform box, so the next pre-collision momentum is
``j'``: the fixed point is ``j_s = (1 - n) F / (2 n)`` (Darcy's law with
permeability ``nu (1 - n) / (2 n)``, Walsh et al.'s), reached as
``j_t - j_s = (1 - 2n)^t (j_0 - j_s)``. ``sim.init()`` stores ``j_0 = F/2`` (the
Guo half-force, so that the read-out velocity starts at 0); the read-out
``lbm_jax.velocity`` takes ``F/2`` off the stored momentum, so in the steady state
it reads ``(j_s - F/2) / rho = (1 - 2n) F / (2 n rho)``, while the collision's
velocity is ``(j_s + F/2) / rho = F / (2 n rho)``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lbm_jax
from lbm_jax.cases import prepare_case
from lbm_jax.cases.poiseuille import analytic_profile, build, predicted_slip
from tests.lbm_jax._native_env import native_skip_reason
from tests.lbm_jax.test_gradients import ADVANCE_STEPS, _cavity

FORCE = 1e-5


def _obstacle(shape: tuple[int, ...] = (16, 16), value: float = 0.6) -> np.ndarray:
    """A gray block in the middle of a channel of ``shape``."""
    ns = np.zeros(shape)
    ns[6:10, 5:11] = value
    return ns


# -- n = 0 is plain fluid -------------------------------------------------------------
@pytest.mark.parametrize("streaming", ["two-buffer", "inplace"])
def test_zero_solid_fraction_is_bitwise_plain_fluid(streaming):
    cells = np.zeros((32, 32), np.int8)
    cells[:, 0] = lbm_jax.CellType.SOLID
    cells[:, -1] = lbm_jax.CellType.WALL
    kw = dict(
        tau=0.7,
        storage="FP32/FP16S",
        cell_type=cells,
        wall_velocity=(0.05, 0.0),
        force=(FORCE, 0.0),
        streaming=streaming,
        backend="xla",
    )
    plain = lbm_jax.Simulation("D2Q9", (32, 32), **kw)
    gray = lbm_jax.Simulation("D2Q9", (32, 32), solid_fraction=np.zeros((32, 32)), **kw)
    a, b = (s.advance(s.init(u=(0.02, 0.01)), 20).f for s in (plain, gray))
    assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


# -- conservation and the analytic steady state ---------------------------------------
def test_random_solid_fraction_conserves_mass(x64):
    rng = np.random.default_rng(0)
    ns = rng.uniform(0.0, 1.0, (32, 32))
    sim = lbm_jax.Simulation(
        "D2Q9", (32, 32), tau=0.7, storage="fp64", force=(FORCE, 0.0), solid_fraction=ns
    )
    x = np.arange(32.0)
    u = 0.05 * np.stack([np.sin(2 * np.pi * x / 32)[None, :] * np.ones((32, 1))] * 2)
    start = sim.init(rho=1.0 + 0.01 * rng.standard_normal((32, 32)), u=u)
    mass0 = float(jnp.sum(lbm_jax.density(sim, start)))
    state = sim.advance(start, 50)
    mass = float(jnp.sum(lbm_jax.density(sim, state)))
    # 1024 cells of density ~1 summed in float64: a few ulps of 1024
    np.testing.assert_allclose(mass, mass0, rtol=1e-13)
    assert bool(sim.healthy(state))


@pytest.mark.parametrize("steps", [7, 400])
def test_uniform_gray_box_follows_the_exact_momentum_recursion(x64, steps):
    """After ``steps`` steps: stored momentum ``j_s + (1 - 2n)^t (F/2 - j_s)``
    (see the module docstring); at 400 steps the steady state to round-off."""
    shape = (8, 8)
    fractions = jnp.array([0.1, 0.3, 0.5, 0.9])
    sim = lbm_jax.Simulation(
        "D2Q9",
        shape,
        tau=0.8,
        storage="fp64",
        force=(FORCE, 0.0),
        solid_fraction=np.full(shape, 0.5),
    )

    @jax.jit
    @jax.vmap
    def moments(n):
        gray = sim.with_arrays(solid_fraction=jnp.full(shape, n))
        state = gray.advance(gray.init(), steps)
        rho, u = gray.fields(state)
        stored = gray.fields(state, force=jnp.zeros(2), which="velocity")[1]
        return rho, u[0], rho * stored[0], u[1]

    rho, u, j, v = (np.asarray(a) for a in moments(fractions))
    n = np.asarray(fractions)[:, None, None]
    j_s = (1 - n) * FORCE / (2 * n)
    want_j = j_s + (1 - 2 * n) ** steps * (FORCE / 2 - j_s)
    # float64 round-off, relative to the force (n = 1/2 reads u = 0)
    tol = {"rtol": 1e-12, "atol": 1e-12 * FORCE}
    np.testing.assert_allclose(rho, 1.0, rtol=0, atol=1e-15)
    np.testing.assert_allclose(j, np.broadcast_to(want_j, j.shape), **tol)
    np.testing.assert_allclose(u, np.broadcast_to(want_j - FORCE / 2, u.shape), **tol)
    np.testing.assert_allclose(v, 0.0, rtol=0, atol=tol["atol"])
    if steps == 400:  # (1 - 2n)^400 < 1e-38: the steady read-out (1 - 2n) F / 2n
        steady = (1 - 2 * n[:, 0, 0]) * FORCE / (2 * n[:, 0, 0])
        np.testing.assert_allclose(u[:, 0, 0], steady, **tol)


# -- n = 1 is a solid wall ------------------------------------------------------------
def test_solid_gray_walls_give_the_bounce_back_poiseuille_flow(x64):
    """A channel whose wall rows are gray cells with n = 1 against the
    Poiseuille case's bounce-back walls (BGK, so with its wall slip).

    A fully solid gray cell reflects what enters it one step later than a
    half-way bounce-back wall does; the steady state of both is the same fixed
    point, so after the case's 35 e-foldings of the slowest mode (e^-35 ~ 6e-16)
    the profiles agree to round-off, and both show the predicted slip.
    """
    setup = prepare_case("poiseuille", n=16, storage="fp64", collision="bgk")
    walled, _ = build(setup)
    ns = np.zeros(walled.shape)
    ns[:, [0, -1]] = 1.0
    gray = lbm_jax.Simulation(
        "D2Q9",
        walled.shape,
        tau=walled.tau,
        storage="fp64",
        force=walled.force,
        solid_fraction=ns,
    )
    profiles = [
        np.asarray(lbm_jax.velocity(s, s.advance(s.init(), setup.steps)))[0, :, 1:-1]
        for s in (walled, gray)
    ]
    np.testing.assert_allclose(profiles[1], profiles[0], rtol=1e-10)
    g, nu = float(walled.force[0]), walled.viscosity
    slip = predicted_slip(g, nu, (walled.tau - 0.5) ** 2)
    want = analytic_profile(16, g, nu) + slip
    np.testing.assert_allclose(profiles[1], np.broadcast_to(want, (4, 16)), rtol=1e-8)


# -- derivatives by the solid fraction ------------------------------------------------
def _flow(sim: lbm_jax.Simulation, ns: jax.Array) -> jax.Array:
    """Mean x-velocity of the channel with solid fraction ``ns`` after
    ``ADVANCE_STEPS`` steps from rest."""
    gray = sim.with_arrays(solid_fraction=ns)
    state = gray.advance(gray.init(), ADVANCE_STEPS)
    return jnp.mean(lbm_jax.velocity(gray, state)[0])


def _channel(storage: str) -> lbm_jax.Simulation:
    return _cavity(storage, force=(1e-4, 0.0), solid_fraction=_obstacle())


@functools.cache
def _float64_gradient() -> np.ndarray:
    """d<u_x>/dn_s of the float64 channel at :func:`_obstacle` (x64 enabled by
    the caller; computed once for the tests that compare with it)."""
    sim = _channel("fp64")
    return np.asarray(jax.grad(functools.partial(_flow, sim))(jnp.asarray(_obstacle())))


def test_solid_fraction_gradient_matches_float64_central_differences(x64):
    flow = jax.jit(functools.partial(_flow, _channel("fp64")))
    ns = jnp.asarray(_obstacle())
    grad = _float64_gradient()
    assert np.all(grad[:, 1:-1] < 0)  # more solid anywhere slows the flow
    h = 1e-6
    direction = np.random.default_rng(1).standard_normal(ns.shape)
    for v in (direction, np.eye(256)[7 * 16 + 8].reshape(16, 16)):
        central = (float(flow(ns + h * v)) - float(flow(ns - h * v))) / (2 * h)
        np.testing.assert_allclose(np.sum(grad * v), central, rtol=1e-7)


def test_fp16s_solid_fraction_gradient_within_one_percent_of_float64(x64):
    want = _float64_gradient()
    fp16s = functools.partial(_flow, _channel("FP32/FP16S"))
    got = np.asarray(jax.grad(fp16s)(jnp.asarray(_obstacle(), jnp.float32)))
    assert np.linalg.norm(got - want) <= 1e-2 * np.linalg.norm(want)


def test_vmap_over_solid_fractions_matches_single_runs():
    sim = _channel("fp32")
    batch = jnp.asarray(np.stack([_obstacle(value=v) for v in (0.2, 0.6, 1.0)]))
    flow = functools.partial(_flow, sim)
    batched = np.asarray(jax.jit(jax.vmap(flow))(batch))
    single = [float(jax.jit(flow)(ns)) for ns in batch]
    np.testing.assert_allclose(batched, single, rtol=1e-6)
    assert batched[0] > batched[1] > batched[2]  # a denser block lets less through


# -- validation and backends ----------------------------------------------------------
def test_traced_solid_fraction_of_the_wrong_shape_is_refused():
    sim = _channel("fp32")
    with pytest.raises(ValueError, match=r"solid_fraction must be of the grid's shape"):
        jax.jit(lambda ns: sim.with_arrays(solid_fraction=ns).init().f)(jnp.ones(16))


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        (np.zeros((16, 8)), ValueError, r"shape \(16, 8\) but the grid is \(16, 16\)"),
        (np.full((16, 16), np.nan), ValueError, "non-finite"),
        (_obstacle(value=1.5), ValueError, r"in \[0, 1\].*from 0 to 1.5"),
        (-_obstacle(), ValueError, r"in \[0, 1\]"),
        (np.full((16, 16), "a"), TypeError, "real numbers"),
    ],
)
def test_bad_solid_fractions_fail_before_compiling(value, error, match):
    with pytest.raises(error, match=match):
        lbm_jax.Simulation("D2Q9", (16, 16), tau=0.7, solid_fraction=value)
    with pytest.raises(error, match=match):
        _channel("fp32").with_arrays(solid_fraction=value)


@pytest.mark.parametrize("backend", ["native", "gpu"])
def test_fast_backends_refuse_gray_cells(backend):
    with pytest.raises(ValueError, match=f"backend='{backend}'.*gray cells"):
        lbm_jax.Simulation(
            "D2Q9",
            (4, 128),
            tau=0.7,
            solid_fraction=np.zeros((4, 128)),
            backend=backend,
        )


def test_auto_runs_gray_cells_on_the_xla_step_and_says_why():
    # 128 cells per x-plane: without gray cells the native step would cover it
    sim = lbm_jax.Simulation(
        "D2Q9", (4, 128), tau=0.7, solid_fraction=np.zeros((4, 128))
    )
    assert sim.backend == "xla"
    assert "gray cells" in sim.backend_reason
    assert set(sim.backends.values()) == {"xla"}


def test_a_simulation_without_gray_cells_takes_them_through_with_arrays():
    ns = _obstacle((4, 128))
    plain = lbm_jax.Simulation("D2Q9", (4, 128), tau=0.7, force=(FORCE, 0.0))
    assert plain.solid_fraction is None
    moved = plain.with_arrays(solid_fraction=ns)
    built = lbm_jax.Simulation(
        "D2Q9", (4, 128), tau=0.7, force=(FORCE, 0.0), solid_fraction=ns
    )
    assert moved.backend == "xla" and "gray cells" in moved.backend_reason
    np.testing.assert_array_equal(np.asarray(moved.solid_fraction), ns)
    a, b = (s.advance(s.init(), 6).f for s in (moved, built))
    assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


def test_a_native_simulation_refuses_gray_cells_through_with_arrays():
    why = native_skip_reason()
    if why is not None:
        pytest.skip(why)
    sim = lbm_jax.Simulation("D2Q9", (4, 128), tau=0.7, backend="native")
    with pytest.raises(ValueError, match="backend='native'.*gray cells"):
        sim.with_arrays(solid_fraction=np.zeros((4, 128)))


@pytest.mark.skipif(
    len(jax.devices()) < 2, reason="needs two devices (tests/conftest.py sets two)"
)
def test_a_split_grid_splits_the_solid_fraction_and_agrees_bitwise():
    ns = np.random.default_rng(2).uniform(0.0, 1.0, (16, 16))
    # one slab size for both: on planes below 128 cells XLA:CPU unrolls the
    # plane's loop and contracts multiply-adds (the blend's among them) by how
    # many slabs there are, which moves the last bit of float32 values (so for
    # moving walls too)
    sims = [
        lbm_jax.Simulation(
            "D2Q9",
            (16, 16),
            tau=0.7,
            force=(FORCE, 0.0),
            solid_fraction=ns,
            devices=d,
            slab=8,
        )
        for d in (None, 2)
    ]
    aux = sims[1]._aux.solid_fraction  # noqa: SLF001 - the step's own array
    assert aux.sharding.shard_shape(aux.shape) == (8, 1, 16)
    a, b = (s.advance(s.init(u=(0.02, 0.01)), 6).f for s in sims)
    assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


def test_a_free_surface_refuses_gray_cells():
    sim = lbm_jax.Simulation("D2Q9", (16, 16), tau=0.7, solid_fraction=_obstacle())
    with pytest.raises(ValueError, match="does not support gray cells"):
        lbm_jax.free_surface.FreeSurface(sim)
