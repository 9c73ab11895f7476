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
from lbm_jax.free_surface import FreeSurface, _gpu_step
from lbm_jax.free_surface._xla_step import xla_step
from lbm_jax.step import _gpu

from ._gpu_pairs import compare_free_surface_steps, splash

# every lattice family, both collisions, the subgrid model, shifted 16-bit
# formats, an unshifted one and the software-rounded posit
CASES = [
    ("D2Q9", (24, 32), "fp32", dict()),
    pytest.param(
        "D2Q9",
        (24, 32),
        "fp16s",
        dict(collision="trt", smagorinsky=0.15),
        marks=pytest.mark.slow,
    ),
    pytest.param(
        "D3Q19", (10, 12, 16), "fp16c", dict(smagorinsky=0.1), marks=pytest.mark.slow
    ),
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
    fs, state = splash(lattice, shape, storage, **extra)
    fused = functools.partial(_gpu_step.gpu_step, fs, interpret=True)
    compare_free_surface_steps(fs, state, fused, 15)


@pytest.mark.slow
def test_gpu_free_surface_mass_is_conserved_over_a_long_run():
    """A fluid cell's mass follows its density change here, not a sum of link
    terms that cancel pairwise; the total still keeps to round-off."""
    fs, state = splash("D2Q9", (24, 32), "fp16s")
    fused = jax.jit(functools.partial(_gpu_step.gpu_step, fs, interpret=True))
    total = float(fs.total_mass(state))
    s = state
    for _ in range(300):
        s = fused(s)
    assert bool(fs.healthy(s))
    assert abs(float(fs.total_mass(s)) / total - 1) < 1e-6


@pytest.mark.slow
def test_gpu_kernel_for_a_free_surface(monkeypatch):
    """``backend="auto"`` picks the GPU step where the fused GPU step runs (here
    made to, interpreted) and ``"gpu"`` requires it; on the CPU it is refused
    with the reason, as on two devices."""
    fs, state = splash("D2Q9", (16, 24), "fp16s")
    if not _gpu.available():
        with pytest.raises(ValueError, match="backend='gpu' is not available.*GPU"):
            FreeSurface(fs.sim, backend="gpu")
        assert FreeSurface(fs.sim).backend in ("native", "xla")
    monkeypatch.setattr(_gpu, "unavailable_reason", lambda: None)
    two = lbm_jax.Simulation("D2Q9", (16, 24), tau=0.6, devices=2)
    with pytest.raises(ValueError, match="one device"):
        FreeSurface(two, backend="gpu")
    monkeypatch.setattr(
        _gpu_step, "gpu_step", functools.partial(_gpu_step.gpu_step, interpret=True)
    )
    jax.clear_caches()
    try:
        # the splash's simulation asks for the XLA step; the free surface asks anew
        auto = FreeSurface(fs.sim, sigma=fs.sigma, gravity=fs.gravity, backend="auto")
        assert auto.backend == "gpu"
        assert "backend='gpu'" in repr(auto)
        got = auto.step(state)
    finally:
        jax.clear_caches()
    want = jax.jit(functools.partial(xla_step, fs))(state)
    np.testing.assert_array_equal(np.asarray(got.flags), np.asarray(want.flags))
    assert within_rounding(fs.sim, want.fluid.f, got.fluid.f, 1)[0]
