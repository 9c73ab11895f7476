"""Simulations that run the fused GPU steps in Pallas' interpret mode (any backend).

``gpu_twin(**config)`` builds the same simulation twice: with the XLA step (the
reference) and with the fused GPU step, whose kernels run interpreted so the CPU
can check their logic. ``splash`` is a free-surface flow that converts cells both
ways; ``compare_free_surface_steps`` checks a free-surface step against the XLA
step on it.
"""

import functools

import jax
import numpy as np

import lbm_jax
from experiments.gpu_lbm_check import within_rounding
from lbm_jax.free_surface import FreeSurface, sphere_fill
from lbm_jax.free_surface._xla_step import xla_step
from lbm_jax.step import _gpu, _gpu_inplace


def gpu_twin(monkeypatch, lattice, shape, **config):
    """``(reference, fused)``: one configuration with the XLA and the GPU step."""
    ref = lbm_jax.Simulation(lattice, shape, backend="xla", **config)
    with monkeypatch.context() as m:
        m.setattr(_gpu, "unavailable_reason", lambda: None)
        m.setattr(
            _gpu,
            "make_gpu_step_into",
            functools.partial(_gpu.make_gpu_step_into, interpret=True),
        )
        m.setattr(
            _gpu_inplace,
            "make_gpu_advance_inplace",
            functools.partial(_gpu_inplace.make_gpu_advance_inplace, interpret=True),
        )
        fused = lbm_jax.Simulation(lattice, shape, backend="gpu", **config)
    assert fused.backend == "gpu"
    return ref, fused


def splash(lattice, shape, storage, collision="bgk", smagorinsky=0.0, shift=True):
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
        backend="xla",
    )
    gravity = [0.0] * (d - 1) + [-2e-4]
    fs = FreeSurface(
        sim, sigma=0.005, gravity=gravity, smagorinsky=smagorinsky, backend="xla"
    )
    n = shape[-1]
    centre = [s / 2 for s in shape[:-1]] + [0.62 * n]
    height = np.meshgrid(*[np.arange(s) for s in shape], indexing="ij")[-1]
    pool = np.clip(0.35 * n - height + 0.3, 0, 1)
    phi = np.clip(sphere_fill(shape, centre, n / 6) + pool, 0, 1)
    u = np.zeros((d, *shape))
    u[-1] = -0.05 * (phi > 0) * (height > 0.45 * n)
    return fs, fs.init(phi, u=u)


def compare_free_surface_steps(fs, state, step, steps):
    """Every step of ``step`` taken from the XLA step's state agrees with it to
    within rounding, with the same flags; run on its own, ``step`` keeps the
    XLA step's flags, its populations within the storage precision and the
    total mass within 1e-6."""
    reference = jax.jit(functools.partial(xla_step, fs))
    step = jax.jit(step)
    a = b = state
    for k in range(steps):
        a1, b1 = reference(a), step(a)
        np.testing.assert_array_equal(np.asarray(b1.flags), np.asarray(a1.flags))
        close, worst = within_rounding(fs.sim, a1.fluid.f, b1.fluid.f, 1)
        assert close, f"step {k} differs beyond rounding (up to {worst} codes)"
        ma, mb = (np.asarray(s.mass, np.float64) + s.carry for s in (a1, b1))
        np.testing.assert_allclose(mb, ma, rtol=0, atol=4e-7)
        a, b = a1, step(b)
    assert int(np.sum(np.asarray(a.flags) != np.asarray(state.flags))) > 10
    np.testing.assert_array_equal(np.asarray(b.flags), np.asarray(a.flags))
    eps = 10 * steps * float(fs.sim.storage.format.epsilon)
    pa, pb = fs.sim.populations(a.fluid), fs.sim.populations(b.fluid)
    assert float(np.linalg.norm(pa - pb)) <= eps * float(np.linalg.norm(pa))
    total = float(fs.total_mass(state))
    assert abs(float(fs.total_mass(b)) - total) <= 1e-6 * total
