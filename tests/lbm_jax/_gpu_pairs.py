"""Simulations that run the fused GPU step in Pallas' interpret mode (any backend).

``gpu_twin(**config)`` builds the same simulation twice: with the XLA step (the
reference) and with the fused GPU step, whose kernels run interpreted so the CPU
can check their logic.
"""

import functools

import lbm_jax
from lbm_jax import _gpu


def gpu_twin(monkeypatch, lattice, shape, **config):
    """``(reference, fused)``: one configuration with the XLA and the GPU step."""
    ref = lbm_jax.Simulation(lattice, shape, kernel="xla", **config)
    with monkeypatch.context() as m:
        m.setattr(_gpu, "unavailable_reason", lambda: None)
        m.setattr(
            _gpu,
            "make_gpu_step_into",
            functools.partial(_gpu.make_gpu_step_into, interpret=True),
        )
        m.setattr(
            _gpu,
            "make_gpu_advance_inplace",
            functools.partial(_gpu.make_gpu_advance_inplace, interpret=True),
        )
        fused = lbm_jax.Simulation(lattice, shape, kernel="gpu", **config)
    assert fused.kernel == "gpu"
    return ref, fused
