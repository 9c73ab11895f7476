"""The native free-surface step against the XLA step (the reference), and the
choice between them.

The two steps agree to round-off, not bit for bit: the native step sums the
neighbour terms (new interface cells' mean density and velocity, the excess
mass each cell receives, the mass exchange) direction by direction where XLA
sums separable box sums, it evaluates the curvature's stencils on a band
around the interface, and XLA contracts some multiply-adds that the native
build leaves separate. Measured after the steps below (FP32): populations
within 2e-8, masses within 4e-7 of each other; in FP16S a population that
rounds to the neighbouring 16-bit value moves a mass by up to 7e-5.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import lbm_jax
from lbm_jax.cases import prepare_case
from lbm_jax.cases.free_surface import build, floor_and_ceiling
from lbm_jax.free_surface import FreeSurface, sphere_fill
from lbm_jax.free_surface._state import FILL_MARGIN, Flag
from lbm_jax.step import _native

from ._native_env import native_skip_reason

_WHY = native_skip_reason()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=str(_WHY))

STEPS = 40
# (lattice, grid, storage, gravity, flow)
CASES = {
    "falling-drop-2d": ("D2Q9", (64, 48), "fp32", (0.0, -2e-4), "drop"),
    "wave-2d": ("D2Q9", (64, 40), "fp32", (0.0, 0.0), "wave"),
    "static-drop-3d": ("D3Q19", (24, 24, 24), "fp32", (0.0, 0.0, 0.0), "static"),
    "falling-drop-3d-fp16s": ("D3Q19", (20, 18, 22), "fp16s", (0, 0, -1e-4), "drop"),
    # a floor and a ceiling (solid cells), as the impact cases have
    "drop-on-a-floor-3d": ("D3Q19", (16, 14, 20), "fp32", (0, 0, -1e-4), "walls"),
    # the impact cases' collision: TRT, with and without the Smagorinsky model
    "falling-drop-2d-trt": ("D2Q9", (48, 40), "fp32", (0.0, -2e-4), "drop"),
    "drop-on-a-floor-3d-trt-smagorinsky": (
        "D3Q19",
        (16, 14, 20),
        "fp16s",
        (0, 0, -1e-4),
        "walls",
    ),
}
# (collision, Smagorinsky constant) where not BGK without one
MODELS = {
    "falling-drop-2d-trt": ("trt", 0.0),
    "drop-on-a-floor-3d-trt-smagorinsky": ("trt", 0.15),
}
# absolute tolerances of (populations, mass) per storage (see the docstring)
TOLERANCE = {"fp32": (1e-6, 1e-5), "fp16s": (1e-4, 5e-4)}


def _fill(shape: tuple[int, ...], flow: str) -> tuple[np.ndarray, list[float]]:
    """The fill field and initial velocity of a flow with interface dynamics."""
    d, n = len(shape), shape[-1]
    if flow == "static":
        return sphere_fill(shape, [s / 2 + 0.3 for s in shape], 7.0), [0.0] * d
    if flow == "wave":
        x = np.arange(shape[0])[:, None]
        top = n / 2 + 2.0 * np.cos(2 * np.pi * x / shape[0])
        z = np.arange(n)[None, :] + 0.5
        return np.clip(top - z + 0.5, 0.0, 1.0), [0.0] * d
    pool = np.zeros(shape)
    pool[..., : n // 4] = 1.0
    if flow == "walls":
        pool[..., : n // 2] = 1.0
    drop = sphere_fill(shape, [s / 2 for s in shape[:-1]] + [0.6 * n], 6.0)
    return np.maximum(pool, drop), [0.0] * (d - 1) + [-0.03]


def _exact_mass(state) -> float:
    return float(
        np.asarray(state.mass, np.float64).sum()
        + np.asarray(state.carry, np.float64).sum()
    )


@pytest.fixture(scope="module")
def pairs():
    """Per case: the states of the XLA and native steps after STEPS steps."""
    out = {}
    for name, (lattice, shape, storage, gravity, flow) in CASES.items():
        walls = floor_and_ceiling(shape) if flow == "walls" else None
        collision, smagorinsky = MODELS.get(name, ("bgk", 0.0))
        sim = lbm_jax.Simulation(
            lattice,
            shape,
            tau=0.8,
            storage=storage,
            cell_type=walls,
            collision=collision,
        )
        phi, u = _fill(shape, flow)
        states = {}
        for backend in ("xla", "native"):
            fs = FreeSurface(
                sim,
                sigma=0.01,
                gravity=gravity,
                smagorinsky=smagorinsky,
                backend=backend,
            )
            assert fs.backend == backend
            state0 = fs.init(phi, u=u)
            run = jax.jit(
                lambda s, fs=fs: jax.lax.fori_loop(0, STEPS, lambda _, x: fs.step(x), s)
            )
            states[backend] = run(state0)
        out[name] = (storage, state0, states["xla"], states["native"])
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_native_step_matches_the_xla_step(pairs, name):
    storage, state0, xla, native = pairs[name]
    # the interface moved: the test sees conversions
    assert np.any(np.asarray(xla.flags) != np.asarray(state0.flags)), name
    np.testing.assert_array_equal(np.asarray(native.flags), np.asarray(xla.flags))
    f_tol, m_tol = TOLERANCE[storage]
    a = np.asarray(lbm_jax.get_storage(storage).decode(native.fluid.f), np.float64)
    b = np.asarray(lbm_jax.get_storage(storage).decode(xla.fluid.f), np.float64)
    np.testing.assert_allclose(a, b, rtol=0, atol=f_tol)
    np.testing.assert_allclose(
        np.asarray(native.mass) + np.asarray(native.carry),
        np.asarray(xla.mass) + np.asarray(xla.carry),
        rtol=0,
        atol=m_tol,
    )
    assert int(native.fluid.t) == int(xla.fluid.t) == STEPS
    # both conserve the initial total to round-off (float32 masses)
    total = _exact_mass(state0)
    for state in (native, xla):
        assert abs(_exact_mass(state) / total - 1) < 1e-7, _exact_mass(state) - total


@pytest.mark.slow
def test_gas_and_solid_cells_hold_the_rest_populations(pairs):
    # the native step writes only the liquid's cells: the others must hold the
    # rest populations from the start (FreeSurface.init) and keep them
    _, state0, _, native = pairs["drop-on-a-floor-3d"]
    policy = lbm_jax.get_storage("fp32")
    for state in (state0, native):
        flags = np.asarray(state.flags)
        f = np.moveaxis(np.asarray(state.fluid.f), 1, 0)  # (Q, *grid)
        dry = (flags == Flag.GAS) | (flags == Flag.SOLID)
        assert np.any(flags == Flag.SOLID) and np.any(flags == Flag.GAS)
        assert policy.shift and np.all(f[:, dry] == 0), "rest: shifted zeros"


def _native_step(shape: tuple[int, ...], threads: int):
    sim = lbm_jax.Simulation(
        "D3Q19", shape, tau=0.8, cell_type=floor_and_ceiling(shape)
    )
    return sim, _native.make_native_free_surface_step(
        sim.lattice,
        sim.storage,
        sim.collision,
        shape,
        sigma=0.01,
        gravity=(0.0, 0.0, -1e-4),
        smoothing=2,
        fill_limit=1 + FILL_MARGIN,
        threads=threads,
        poison=True,
    )


# one row of tiles per x-plane; several rows; rows of several tiles along z
@pytest.mark.parametrize(
    "shape",
    [(5, 9, 12)]
    + [
        pytest.param(s, marks=pytest.mark.slow)
        for s in ((13, 8, 12), (4, 48, 24), (3, 5, 1100))
    ],
)
def test_the_in_place_step_does_not_depend_on_the_runs_of_planes(shape):
    # the step runs in place, in runs of x-planes (one per thread, at most one
    # per plane), each plane in rows of tiles stored one row late, with copies
    # of what the neighbouring planes and runs still pull: any split gives the
    # same bits and the XLA step's populations, and an input still in use is
    # not overwritten. The scratch arrays start as NaN: the curvature's passes
    # and the surface passes read only what they computed
    sim = _native_step(shape, 1)[0]
    phi, u = _fill(shape, "walls")
    xla = FreeSurface(sim, sigma=0.01, gravity=(0.0, 0.0, -1e-4), backend="xla")
    s = xla.init(phi, u=u)
    args = (s.fluid.f, s.flags, s.mass, s.carry)
    reference = jax.jit(lambda s: xla.step(xla.step(s)))(s)
    results = []
    for threads in (1, 2, 5):
        step = _native_step(shape, threads)[1]
        before = [np.asarray(a).copy() for a in args]
        out = jax.jit(lambda *a, step=step: step(*step(*a)))(*args)
        for a, b in zip(args, before, strict=True):
            np.testing.assert_array_equal(np.asarray(a), b)
        results.append([np.asarray(a) for a in out])
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(results[0][1], np.asarray(reference.flags))
    np.testing.assert_allclose(
        results[0][0], np.asarray(reference.fluid.f), rtol=0, atol=TOLERANCE["fp32"][0]
    )


def test_native_step_conserves_mass_over_a_run():
    sim = lbm_jax.Simulation("D2Q9", (48, 48), tau=0.7)
    fs = FreeSurface(sim, sigma=0.005, gravity=(0.0, -1e-4))
    assert fs.backend == "native"
    phi, u = _fill((48, 48), "drop")
    state0 = fs.init(phi, u=u)
    total = _exact_mass(state0)  # the run donates the state
    state = lbm_jax.run(fs.step, state0, 600, healthy=fs.healthy).state
    drift = abs(_exact_mass(state) / total - 1)
    assert drift < 1e-7, drift


def test_validation_cases_run_the_native_step():
    fs, _ = build(prepare_case("static_drop", n=32, radius=8.0))
    assert fs.backend == "native"
    # the impacts: TRT with the Smagorinsky model
    fs, _ = build(prepare_case("drop_impact", dims=2))
    assert fs.backend == "native"
    assert fs.collision.kind.value == "trt" and fs.collision.smagorinsky > 0


def _sim(**kwargs) -> lbm_jax.Simulation:
    return lbm_jax.Simulation("D2Q9", (16, 16), tau=0.8, **kwargs)


def test_uncovered_configurations_run_the_xla_step():
    assert FreeSurface(_sim(collision="trt"), smagorinsky=0.1).backend == "native"
    assert FreeSurface(_sim(storage="posit16")).backend == "xla"
    assert FreeSurface(_sim(storage="fp16s", shift=False)).backend == "xla"
    assert FreeSurface(_sim(), backend="XLA").backend == "xla"
    assert "backend='xla'" in repr(FreeSurface(_sim(), backend="xla"))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: FreeSurface(_sim(storage="posit16"), backend="native"), "storage"),
        (lambda: FreeSurface(_sim(), backend="gpu"), "backend='gpu' is not available"),
        (lambda: FreeSurface(_sim(), backend="fast"), "backend must be one of"),
    ],
)
def test_native_kernel_refuses_what_it_does_not_cover(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_an_unavailable_library_falls_back_with_a_warning(monkeypatch):
    monkeypatch.setattr(_native, "unavailable_reason", lambda: "no compiler here")
    with pytest.warns(lbm_jax.NativeStepWarning, match="no compiler here"):
        fs = FreeSurface(_sim())
    assert fs.backend == "xla"
    with pytest.raises(ValueError, match="backend='native' is not available.*no comp"):
        FreeSurface(_sim(), backend="native")
