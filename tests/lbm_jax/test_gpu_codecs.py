"""On a GPU: the fused GPU step compiled for the device (not interpreted) runs
every storage codec, which round on integer bit patterns, and stays within
rounding of the XLA step, as does the GPU free-surface step. Skipped where no GPU
is the default backend."""

from __future__ import annotations

import pytest

import lbm_jax
from experiments.gpu_lbm_check import within_rounding
from lbm_jax.free_surface import FreeSurface
from lbm_jax.step import _gpu

from ._gpu_pairs import compare_free_surface_steps, splash

pytestmark = pytest.mark.skipif(
    not _gpu.available(), reason=str(_gpu.unavailable_reason())
)


STORAGES = ["fp32", "fp16", "fp16s", "fp16c", "bf16", "posit16s"]


@pytest.mark.parametrize("storage", STORAGES)
def test_compiled_gpu_step_runs_every_codec(storage):
    shape, steps = (32, 32, 32), 4
    config = {"tau": 0.6, "storage": storage}
    ref = lbm_jax.Simulation("D3Q19", shape, backend="xla", **config)
    fused = lbm_jax.Simulation("D3Q19", shape, backend="gpu", **config)
    assert fused.backend == "gpu"
    u = [0.02, -0.01, 0.015]
    a = ref.advance(ref.init(u=u), steps)
    b = fused.advance(fused.init(u=u), steps)
    close, worst = within_rounding(ref, a.f, b.f, steps)
    assert close, f"populations differ beyond rounding (up to {worst} codes)"


@pytest.mark.parametrize(
    ("lattice", "shape", "storage", "extra"),
    [
        ("D2Q9", (64, 64), "fp32", {}),
        ("D3Q19", (24, 24, 32), "fp16s", {"collision": "trt", "smagorinsky": 0.1}),
    ],
)
def test_compiled_gpu_free_surface_step(lattice, shape, storage, extra):
    """The GPU free-surface step compiled for the device, against the XLA step."""
    fs, state = splash(lattice, shape, storage, **extra)
    fused = FreeSurface(fs.sim, sigma=fs.sigma, gravity=fs.gravity, backend="gpu")
    assert fused.backend == "gpu"
    compare_free_surface_steps(fs, state, fused.step, 20)
