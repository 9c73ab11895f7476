"""Derivatives through the solver (DESIGN §7).

The storage rounding has the straight-through derivative, so a gradient through
16-bit storage is the compute-dtype adjoint along the stored trajectory; a storage
or a backend that cannot carry a derivative raises while tracing.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import lbm_jax
from tests.lbm_jax._native_env import native_skip_reason

STEPS = 20
FORCE = 1e-5
# relative error of d<u>/dF against steps / rho: float32 arithmetic in float32
# storage; the tangent rides in the 16-bit container (float16: 11 significant
# bits, 2^-11 per rounding, a few roundings per step)
RTOL = {"float64": 1e-10, "float32": 1e-4, "float16": 1e-2}
SHIFTS = (True, False)


@functools.cache
def _mean_velocity(storage: str, shift: bool):
    """``F -> <u_x>`` after ``STEPS`` steps of a 16^2 D2Q9 box at rest, the
    force passed to every step (the momentum read out as stored, no half-force
    taken off: ``<u> = steps F / rho`` exactly); jitted once per storage."""
    sim = lbm_jax.Simulation(
        "D2Q9", (16, 16), tau=0.8, storage=storage, shift=shift, backend="xla"
    )

    def mean_u(fx: jax.Array) -> jax.Array:
        force = jnp.stack([fx, jnp.zeros_like(fx)])
        state = lax.fori_loop(
            0, STEPS, lambda _, s: sim.step(s, force), sim.init(), unroll=False
        )
        return jnp.mean(sim.fields(state, which="velocity")[1][0])

    return jax.jit(mean_u), jax.jit(jax.grad(mean_u))


def _float_storages() -> list[str]:
    return [s for s in lbm_jax.differentiable_storages() if s != "FP64/FP64"]


def _storages_and_shifts() -> list:
    """Every float-container storage, shifted and not; in the default run only
    FP16S shifted (the combination that returned a silent zero before)."""
    return [
        pytest.param(
            storage,
            shift,
            marks=() if (storage, shift) == ("FP32/FP16S", True) else pytest.mark.slow,
        )
        for storage in _float_storages()
        for shift in SHIFTS
    ]


@pytest.mark.parametrize(("storage", "shift"), _storages_and_shifts())
def test_uniform_force_gradient_is_steps_over_density(storage, shift):
    _, grad = _mean_velocity(storage, shift)
    dtype = lbm_jax.get_storage(storage).storage_dtype.name
    got = float(grad(jnp.float32(FORCE)))
    np.testing.assert_allclose(got, STEPS / 1.0, rtol=RTOL[dtype])


@pytest.mark.slow
def test_uniform_force_gradient_in_float64(x64):
    sim = lbm_jax.Simulation("D2Q9", (16, 16), tau=0.8, storage="fp64", backend="xla")

    def mean_u(fx):
        force = jnp.stack([fx, jnp.zeros_like(fx)])
        state = lax.fori_loop(0, STEPS, lambda _, s: sim.step(s, force), sim.init())
        return jnp.mean(sim.fields(state, which="velocity")[1][0])

    got = float(jax.jit(jax.grad(mean_u))(jnp.float64(FORCE)))
    np.testing.assert_allclose(got, STEPS / 1.0, rtol=RTOL["float64"])


@pytest.mark.parametrize("shift", SHIFTS)
@pytest.mark.parametrize(
    "storage",
    [s for s in lbm_jax.list_storages() if s not in lbm_jax.differentiable_storages()],
)
def test_bit_pattern_storage_refuses_to_differentiate(storage, shift):
    sim = lbm_jax.Simulation(
        "D2Q9", (16, 16), tau=0.8, storage=storage, shift=shift, backend="xla"
    )

    def mean_u(fx):
        state = sim.step(sim.init(), jnp.stack([fx, jnp.zeros_like(fx)]))
        return jnp.mean(sim.fields(state, which="velocity")[1][0])

    # never a silent zero: the error is raised while tracing, naming the remedy
    with pytest.raises(TypeError, match="bit patterns.*FP32/FP16S.*emulate=True"):
        jax.make_jaxpr(jax.grad(mean_u))(jnp.float32(FORCE))


@pytest.mark.parametrize("storage", lbm_jax.list_storages()[1:])
def test_codecs_keep_their_bits(storage):
    """encode and decode compute exactly the mpjax codec, with and without a
    derivative taken through them."""
    pol = lbm_jax.get_storage(storage)
    x = jnp.linspace(-0.3, 0.3, 257, dtype=jnp.float32)
    codes = pol.format.encode(x)
    want = np.asarray(codes).view(pol.storage_dtype)
    np.testing.assert_array_equal(np.asarray(pol.encode(x)), want)
    if storage in lbm_jax.differentiable_storages():
        got, _ = jax.jvp(pol.encode, (x,), (jnp.ones_like(x),))
        np.testing.assert_array_equal(np.asarray(got), want)
    np.testing.assert_array_equal(
        np.asarray(pol.decode(pol.encode(x))),
        np.asarray(pol.format.decode(codes, dtype=jnp.float32)),
    )


# In float32 storage nothing rounds the float32 arithmetic, which XLA may fuse
# differently once the tangent program sits beside it; there the codecs' bits are
# checked directly (test_codecs_keep_their_bits).
def test_step_under_a_derivative_keeps_its_bits():
    mean_u, _ = _mean_velocity("FP32/FP16S", True)
    fx = jnp.float32(FORCE)
    primal, tangent = jax.jvp(mean_u, (fx,), (jnp.float32(1.0),))
    assert np.asarray(primal).tobytes() == np.asarray(mean_u(fx)).tobytes()
    np.testing.assert_allclose(tangent, STEPS, rtol=1e-2)


def test_forward_mode_matches_central_differences_d3q19(x64):
    sim = lbm_jax.Simulation("D3Q19", (8, 8, 8), tau=0.7, storage="fp64", backend="xla")
    z = np.linspace(0, 2 * np.pi, 8, endpoint=False)
    shape = np.sin(z)[None, :, None, None] * np.ones((3, 8, 8, 8))
    u0 = jnp.asarray(0.02 * np.roll(shape, 1, axis=0))

    @jax.jit
    def energy(amp):
        force = amp * jnp.asarray(shape)
        state = sim.init(u=u0)
        state = lax.fori_loop(0, 8, lambda _, s: sim.step(s, force), state)
        return jnp.sum(sim.fields(state, force, which="velocity")[1] ** 2)

    amp, h = 1e-4, 1e-8
    _, tangent = jax.jvp(energy, (jnp.float64(amp),), (jnp.float64(1.0),))
    central = (energy(amp + h) - energy(amp - h)) / (2 * h)
    np.testing.assert_allclose(float(tangent), float(central), rtol=1e-6)


def test_native_step_differentiates_as_the_xla_step():
    why = native_skip_reason()
    if why is not None:
        pytest.skip(why)
    # the native step needs at least 128 cells per x-plane
    sims = [
        lbm_jax.Simulation("D3Q19", (8, 16, 8), tau=0.8, backend=b)
        for b in ("native", "xla")
    ]
    assert sims[0].backend == "native"
    assert sims[0].backends["derivative"] == "native"  # its own adjoint
    u = 0.01 * jnp.sin(jnp.arange(8.0))[None, :, None, None] * jnp.ones((3, 8, 16, 8))

    def energy(sim, amp):
        state = sim.step(sim.init(u=amp * u))
        return jnp.sum(sim.fields(state, which="velocity")[1] ** 2)

    native, xla = (jax.grad(functools.partial(energy, s))(1.0) for s in sims)
    assert float(xla) != 0.0
    np.testing.assert_allclose(float(native), float(xla), rtol=1e-5)


# -- reverse mode through advance: checkpointed, every storage -----------------------
ADVANCE_STEPS = 12


def _cavity(storage: str, collision: str = "bgk", **kw) -> lbm_jax.Simulation:
    """A 16^2 D2Q9 box with solid walls on the y sides, driven by a force."""
    walls = np.zeros((16, 16), np.int8)
    walls[:, [0, -1]] = lbm_jax.CellType.SOLID
    return lbm_jax.Simulation(
        "D2Q9",
        (16, 16),
        tau=0.7,
        storage=storage,
        collision=collision,
        cell_type=walls,
        backend="xla",
        **kw,
    )


def _energy(sim, amp, *, steps=ADVANCE_STEPS, checkpoint_every=None):
    """Kinetic energy after ``steps`` steps from a sheared start of amplitude
    ``amp``, with a force ``amp`` times a fixed field."""
    y = jnp.arange(16.0)
    shear = jnp.stack(
        [jnp.sin(2 * jnp.pi * y / 16)[None, :] * jnp.ones((16, 1)), jnp.zeros((16, 16))]
    )
    dtype = sim.storage.compute_dtype
    state = sim.init(u=(amp * 0.05 * shear).astype(dtype))
    force = (amp * 1e-5 * shear).astype(dtype)
    state = sim.advance(state, steps, force, checkpoint_every=checkpoint_every)
    return jnp.sum(sim.fields(state, force, which="velocity")[1] ** 2)


@pytest.mark.parametrize(
    "collision", ["bgk", pytest.param("trt", marks=pytest.mark.slow)]
)
def test_advance_gradient_matches_float64_central_differences(x64, collision):
    sim = _cavity("fp64", collision)
    energy = jax.jit(functools.partial(_energy, sim))
    grad = float(jax.jit(jax.grad(functools.partial(_energy, sim)))(1.0))
    h = 1e-6
    central = (float(energy(1.0 + h)) - float(energy(1.0 - h))) / (2 * h)
    np.testing.assert_allclose(grad, central, rtol=1e-7)


@pytest.mark.slow
@pytest.mark.parametrize("every", [(6, 2), 1, 5, None])
def test_checkpointing_does_not_change_the_gradient(x64, every):
    sim = _cavity("fp64")
    tape = jax.grad(functools.partial(_energy, sim, checkpoint_every=1))(1.0)
    got = jax.grad(functools.partial(_energy, sim, checkpoint_every=every))(1.0)
    np.testing.assert_allclose(float(got), float(tape), rtol=1e-12)


@pytest.mark.slow
def test_forward_and_reverse_mode_agree_through_advance():
    sim = _cavity("FP32/FP16S")
    fn = functools.partial(_energy, sim)
    _, tangent = jax.jvp(fn, (jnp.float32(1.0),), (jnp.float32(1.0),))
    np.testing.assert_allclose(float(tangent), float(jax.grad(fn)(1.0)), rtol=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("storage", ["FP32/FP16S", "FP32/FP16"])
def test_16bit_advance_gradient_within_one_percent_of_float64(x64, storage):
    want = float(jax.grad(functools.partial(_energy, _cavity("fp64")))(1.0))
    got = float(jax.grad(functools.partial(_energy, _cavity(storage)))(1.0))
    np.testing.assert_allclose(got, want, rtol=1e-2)


@pytest.mark.slow
def test_vmap_over_initial_amplitudes_matches_single_runs():
    sim = _cavity("fp32")
    amps = jnp.array([0.5, 1.0, 2.0], jnp.float32)
    batched = jax.vmap(functools.partial(_energy, sim))(amps)
    single = [float(_energy(sim, a)) for a in amps]
    np.testing.assert_allclose(np.asarray(batched), single, rtol=1e-6)


def test_advance_outside_a_trace_is_unchanged_by_the_derivative_path():
    sim = _cavity("FP32/FP16S")
    start = sim.init(u=(0.02, 0.0))
    eager = sim.advance(sim.init(u=(0.02, 0.0)), ADVANCE_STEPS)
    traced = jax.jit(lambda s: sim.advance(s, ADVANCE_STEPS))(start)
    assert np.asarray(eager.f).tobytes() == np.asarray(traced.f).tobytes()


@pytest.mark.parametrize(
    "every, error, match",
    [
        (0, ValueError, ">= 1"),
        ((4, 8), ValueError, "must decrease"),
        (2.5, TypeError, "int or a sequence"),
        (("a",), TypeError, "must hold ints"),
    ],
)
def test_bad_checkpoint_every_is_refused(every, error, match):
    sim = _cavity("fp32")
    with pytest.raises(error, match=match):
        sim.advance(sim.init(), 4, checkpoint_every=every)


def test_checkpoint_every_needs_a_python_int_step_count():
    sim = _cavity("fp32")
    with pytest.raises(TypeError, match="Python int step count"):
        sim.advance(sim.init(), jnp.int32(4), checkpoint_every=2)


def test_traced_init_checks_shapes():
    sim = _cavity("fp32")
    with pytest.raises(ValueError, match=r"u must be a vector of shape \(2,\)"):
        jax.grad(lambda a: sim.init(u=a * jnp.ones(3)).f.sum())(1.0)
    with pytest.raises(ValueError, match="rho must be a scalar or of shape"):
        jax.grad(lambda a: sim.init(rho=a * jnp.ones(4)).f.sum())(1.0)


# -- new arrays for a simulation: traced, batched, checked --------------------------
def _lid_cavity(storage: str = "fp64", lid: float = 0.05) -> lbm_jax.Simulation:
    ct = np.zeros((12, 12), np.int8)
    ct[[0, -1], :] = ct[:, 0] = lbm_jax.CellType.SOLID
    ct[:, -1] = lbm_jax.CellType.WALL
    return lbm_jax.Simulation(
        "D2Q9",
        (12, 12),
        tau=0.6,
        storage=storage,
        cell_type=ct,
        wall_velocity=(lid, 0.0),
        backend="xla",
    )


def _vortex_strength(sim, lid):
    moved = sim.with_arrays(wall_velocity=jnp.stack([lid, jnp.zeros_like(lid)]))
    state = moved.advance(moved.init(), ADVANCE_STEPS)
    u = lbm_jax.velocity(moved, state)
    return jnp.sum(u[0, 6, :] * jnp.sign(jnp.arange(12.0) - 5.5))


@pytest.mark.slow
def test_lid_speed_gradient_matches_float64_central_differences(x64):
    sim = _lid_cavity()
    fn = functools.partial(_vortex_strength, sim)
    grad = float(jax.grad(fn)(0.05))
    h = 1e-6
    central = (float(fn(0.05 + h)) - float(fn(0.05 - h))) / (2 * h)
    np.testing.assert_allclose(grad, central, rtol=1e-7)


def test_host_arrays_equal_a_new_simulation():
    moved = _lid_cavity("FP32/FP16S").with_arrays(wall_velocity=(0.08, 0.0))
    built = _lid_cavity("FP32/FP16S", lid=0.08)
    np.testing.assert_array_equal(moved.wall_velocity, built.wall_velocity)
    a, b = (s.advance(s.init(), 6).f for s in (moved, built))
    assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


def test_new_arrays_are_checked_like_the_constructor():
    sim = _lid_cavity("fp32")
    with pytest.raises(ValueError, match="wall_velocity"):
        sim.with_arrays(wall_velocity=(0.9, 0.0))
    with pytest.raises(ValueError, match="finite and positive"):
        sim.with_arrays(boundary_density=-1.0)
    with pytest.raises(ValueError, match=r"vector of shape \(2,\)"):
        jax.jit(lambda u: sim.with_arrays(wall_velocity=u).init().f)(jnp.ones(3))
    with pytest.raises(ValueError, match="boundary_density must be a scalar or"):
        jax.jit(lambda r: sim.with_arrays(boundary_density=r).init().f)(jnp.ones(5))


# -- bit-pattern formats, emulated: the same trajectory, a derivative --------------
@pytest.mark.parametrize(
    "storage",
    [
        "FP32/FP16C",
        *(
            pytest.param(s, marks=pytest.mark.slow)
            for s in ("FP32/bfloat16", "FP32/posit16")
        ),
    ],
)
def test_emulated_storage_runs_the_same_trajectory(storage):
    real = _cavity(storage)
    emulated = _cavity(lbm_jax.get_storage(storage, emulate=True))
    assert emulated.backend == "xla" and emulated.storage.storage_dtype == np.float32
    a, b = (
        s.populations(s.advance(s.init(u=(0.03, 0.01)), ADVANCE_STEPS))
        for s in (real, emulated)
    )
    assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


@pytest.mark.slow
def test_emulated_fp16c_gradient_within_one_percent_of_float64(x64):
    want = float(jax.grad(functools.partial(_energy, _cavity("fp64")))(1.0))
    fp16c = _cavity(lbm_jax.get_storage("FP32/FP16C", emulate=True))
    got = float(jax.grad(functools.partial(_energy, fp16c))(1.0))
    np.testing.assert_allclose(got, want, rtol=1e-2)


@pytest.mark.parametrize(
    "storage",
    [
        "FP32/FP16S",
        *(pytest.param(s, marks=pytest.mark.slow) for s in ("FP32/FP32", "FP32/FP16C")),
    ],
)
def test_the_differentiated_step_computes_the_tiled_steps_values(storage):
    """The step that derivatives take (two slabs of 6 planes here) equals the
    slab-tiled step to within one rounding of the stored format (XLA fuses the
    two programs differently; moving lid, solid walls, a force field)."""
    sim = lbm_jax.Simulation(
        "D2Q9",
        (12, 12),
        tau=0.6,
        storage=storage,
        slab=4,
        backend="xla",
        cell_type=_lid_cavity("fp32").cell_type,
        wall_velocity=(0.05, 0.0),
        force=1e-5 * np.ones((2, 12, 12)),
    )
    plan = sim._static.plan  # noqa: SLF001 - the two steps of one plan
    state = sim.advance(sim.init(u=(0.02, 0.01)), 5)
    aux = sim._aux  # noqa: SLF001
    tiled, whole = (
        np.asarray(sim.storage.decode(step(aux, state.f, jnp.zeros_like(state.f))))
        for step in (plan.step_into, plan.reference_step_into)
    )
    # float32 sums of populations near 1 in another order: within a rounding
    # of 1.0 (2^-23); a 16-bit population rounds to a neighbour (2^-10
    # relative) where that lands on a tie
    tol = 2.0**-23 if storage == "FP32/FP32" else 2.0**-10 * np.abs(tiled).max()
    np.testing.assert_allclose(whole, tiled, rtol=0, atol=tol)


def test_the_host_driver_refuses_a_traced_state():
    sim = _cavity("fp32")
    with pytest.raises(TypeError, match="call Simulation.advance"):
        jax.grad(lambda a: lbm_jax.run(sim, sim.init(u=(a, 0.0)), 4).state.f.sum())(
            0.01
        )
