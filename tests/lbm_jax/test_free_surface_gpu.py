"""The GPU free-surface step's kernels, run on the CPU in Pallas' interpret mode.

A drop falls into a pool on a solid floor under gravity and surface tension, so
the steps convert cells both ways, reconstruct gas links, bounce back from the
floor and redistribute excess mass. Each step taken from the XLA step's state
agrees with it to within rounding (a fluid cell's mass sums its link terms in
another order; a GPU may contract multiply-adds differently), with the same
flags; over the run the flags stay equal and the total mass is conserved.
"""

import functools

import jax
import numpy as np
import pytest

import lbm_jax
from experiments.gpu_lbm_check import within_rounding
from lbm_jax import _gpu
from lbm_jax.free_surface import FreeSurface, _gpu_step, sphere_fill
from lbm_jax.free_surface._xla_step import xla_step


def _splash(lattice, shape, storage, collision="bgk", smagorinsky=0.0, shift=True):
    """A free surface and its first state: a drop above a pool, falling."""
    d = len(shape)
    ct = np.zeros(shape, np.int32)
    ct[(slice(None),) * (d - 1) + (0,)] = lbm_jax.CellType.SOLID
    sim = lbm_jax.Simulation(
        lattice,
        shape,
        tau=0.6,
        storage=storage,
        shift=shift,
        collision=collision,
        cell_type=ct,
        kernel="xla",
    )
    gravity = [0.0] * (d - 1) + [-2e-4]
    fs = FreeSurface(
        sim, sigma=0.005, gravity=gravity, smagorinsky=smagorinsky, kernel="xla"
    )
    n = shape[-1]
    centre = [s / 2 for s in shape[:-1]] + [0.62 * n]
    height = np.meshgrid(*[np.arange(s) for s in shape], indexing="ij")[-1]
    pool = np.clip(0.35 * n - height + 0.3, 0, 1)
    phi = np.clip(sphere_fill(shape, centre, n / 6) + pool, 0, 1)
    u = np.zeros((d, *shape))
    u[-1] = -0.05 * (phi > 0) * (height > 0.45 * n)
    return fs, fs.init(phi, u=u)


# every lattice family, both collisions, the subgrid model, shifted 16-bit
# formats, an unshifted one and the software-rounded posit
CASES = [
    ("D2Q9", (24, 32), "fp32", dict()),
    ("D2Q9", (24, 32), "fp16s", dict(collision="trt", smagorinsky=0.15)),
    ("D3Q19", (10, 12, 16), "fp16c", dict(smagorinsky=0.1)),
    pytest.param("D2Q9", (16, 24), "bf16", dict(shift=False), marks=pytest.mark.slow),
    pytest.param(
        "D2Q9", (16, 24), "posit16", dict(collision="trt"), marks=pytest.mark.slow
    ),
    pytest.param(
        "D3Q27", (8, 10, 16), "fp32", dict(collision="trt"), marks=pytest.mark.slow
    ),
]


@pytest.mark.parametrize(("lattice", "shape", "storage", "extra"), CASES)
def test_gpu_free_surface_step_matches_the_xla_step(lattice, shape, storage, extra):
    fs, state = _splash(lattice, shape, storage, **extra)
    reference = jax.jit(functools.partial(xla_step, fs))
    fused = jax.jit(functools.partial(_gpu_step.gpu_step, fs, interpret=True))
    steps = 15
    a = b = state
    for k in range(steps):
        a1, b1 = reference(a), fused(a)  # one step from the same state
        np.testing.assert_array_equal(np.asarray(b1.flags), np.asarray(a1.flags))
        close, worst = within_rounding(fs.sim, a1.fluid.f, b1.fluid.f, 1)
        assert close, f"step {k} differs beyond rounding (up to {worst} codes)"
        ma, mb = (np.asarray(s.mass, np.float64) + s.carry for s in (a1, b1))
        np.testing.assert_allclose(mb, ma, rtol=0, atol=4e-7)
        a, b = a1, fused(b)
    assert int(np.sum(np.asarray(a.flags) != np.asarray(state.flags))) > 10
    np.testing.assert_array_equal(np.asarray(b.flags), np.asarray(a.flags))
    eps = 10 * steps * float(fs.sim.storage.format.epsilon)
    pa, pb = fs.sim.populations(a.fluid), fs.sim.populations(b.fluid)
    assert float(np.linalg.norm(pa - pb)) <= eps * float(np.linalg.norm(pa))
    total = float(fs.total_mass(state))
    assert abs(float(fs.total_mass(b)) - total) <= 1e-6 * total


def test_gpu_free_surface_mass_is_conserved_over_a_long_run():
    """A fluid cell's mass follows its density change here, not a sum of link
    terms that cancel pairwise; the total still keeps to round-off."""
    fs, state = _splash("D2Q9", (24, 32), "fp16s")
    fused = jax.jit(functools.partial(_gpu_step.gpu_step, fs, interpret=True))
    total = float(fs.total_mass(state))
    s = state
    for _ in range(300):
        s = fused(s)
    assert bool(fs.healthy(s))
    assert abs(float(fs.total_mass(s)) / total - 1) < 1e-6


def test_gpu_kernel_for_a_free_surface(monkeypatch):
    """``kernel="auto"`` picks the GPU step where the fused GPU step runs (here
    made to, interpreted) and ``"gpu"`` requires it; on the CPU it is refused
    with the reason, as on two devices."""
    fs, state = _splash("D2Q9", (16, 24), "fp16s")
    if not _gpu.available():
        with pytest.raises(ValueError, match="kernel='gpu' is not available.*GPU"):
            FreeSurface(fs.sim, kernel="gpu")
        assert FreeSurface(fs.sim).kernel in ("native", "xla")
    monkeypatch.setattr(_gpu, "unavailable_reason", lambda: None)
    two = lbm_jax.Simulation("D2Q9", (16, 24), tau=0.6, devices=2)
    with pytest.raises(ValueError, match="one device"):
        FreeSurface(two, kernel="gpu")
    monkeypatch.setattr(
        _gpu_step, "gpu_step", functools.partial(_gpu_step.gpu_step, interpret=True)
    )
    jax.clear_caches()
    try:
        auto = FreeSurface(fs.sim, sigma=fs.sigma, gravity=fs.gravity)
        assert auto.kernel == "gpu"
        assert "kernel='gpu'" in repr(auto)
        got = auto.step(state)
    finally:
        jax.clear_caches()
    want = jax.jit(functools.partial(xla_step, fs))(state)
    np.testing.assert_array_equal(np.asarray(got.flags), np.asarray(want.flags))
    assert within_rounding(fs.sim, want.fluid.f, got.fluid.f, 1)[0]
