"""On a GPU: the fused GPU step compiled for the device (not interpreted) runs
every storage codec, which round on integer bit patterns, and stays within
rounding of the XLA step. Skipped where no GPU is the default backend."""

from __future__ import annotations

import pytest

import lbm_jax
from experiments.gpu_lbm_check import within_rounding
from lbm_jax import _gpu

pytestmark = pytest.mark.skipif(
    not _gpu.available(), reason=str(_gpu.unavailable_reason())
)


STORAGES = ["fp32", "fp16", "fp16s", "fp16c", "bf16", "posit16s"]


@pytest.mark.parametrize("storage", STORAGES)
def test_compiled_gpu_step_runs_every_codec(storage):
    shape, steps = (32, 32, 32), 4
    config = {"tau": 0.6, "storage": storage}
    ref = lbm_jax.Simulation("D3Q19", shape, kernel="xla", **config)
    fused = lbm_jax.Simulation("D3Q19", shape, kernel="gpu", **config)
    assert fused.kernel == "gpu"
    u = [0.02, -0.01, 0.015]
    a = ref.advance(ref.init(u=u), steps)
    b = fused.advance(fused.init(u=u), steps)
    close, worst = within_rounding(ref, a.f, b.f, steps)
    assert close, f"populations differ beyond rounding (up to {worst} codes)"
