"""The reference step (the XLA step derivatives take): slabs of the step's arrays,
the slab-stacked step against the slab-tiled one, and its derivatives."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lbm_jax
from lbm_jax.core._boundaries import BoundaryData
from lbm_jax.sim._config import StepArrays
from lbm_jax.step._reference import (
    combine_slab,
    make_reference_step,
    reference_slab,
    split_slabs,
)


def _arrays(nx: int, force_field: bool) -> StepArrays:
    rng = np.random.default_rng(0)
    grid = (nx, 3, 4)
    force = rng.normal(size=(2, *grid)) if force_field else rng.normal(size=2)
    return StepArrays(
        boundary=BoundaryData(
            bounce=jnp.asarray(rng.random((nx, 9, 3, 4)) < 0.5),
            wall_term=None,
            fixed_mask=jnp.asarray(rng.random((nx, 1, 3, 4)) < 0.5),
            fixed=jnp.asarray(rng.normal(size=(nx, 9, 3, 4))),
        ),
        force=jnp.asarray(force),
    )


@pytest.mark.parametrize("force_field", [True, False])
def test_split_slabs_cuts_every_grid_array_along_x(force_field):
    aux = _arrays(6, force_field)
    slabs, whole = split_slabs(aux, 6, 2)
    for k in range(3):
        got = combine_slab(jax.tree.map(lambda a, k=k: a[k], slabs), whole)
        for name in ("bounce", "fixed_mask", "fixed"):
            want = getattr(aux.boundary, name)[2 * k : 2 * k + 2]
            np.testing.assert_array_equal(getattr(got.boundary, name), want)
        assert got.boundary.wall_term is None
        want = aux.force[:, 2 * k : 2 * k + 2] if force_field else aux.force
        np.testing.assert_array_equal(got.force, want)


def test_split_slabs_refuses_what_does_not_tile():
    aux = _arrays(6, True)
    with pytest.raises(ValueError, match="slab must divide 6, got 4"):
        split_slabs(aux, 6, 4)
    short = aux._replace(force=aux.force[:, :5])
    with pytest.raises(ValueError, match=r"\.force has 5 x-planes on axis 1"):
        split_slabs(short, 6, 2)


def test_reference_slab_is_the_largest_divisor_within_the_target():
    assert [reference_slab(n, 8) for n in (128, 12, 7, 13, 1)] == [8, 6, 7, 1, 1]
    with pytest.raises(ValueError, match="slab must be >= 1, got 0"):
        reference_slab(8, 0)


def _obstacle_box(storage: str = "fp32") -> lbm_jax.Simulation:
    """A D3Q19 6x5x4 box with a solid block and a moving wall, tiled in slabs of 2
    planes (the last slab of the tiled step overlaps the one before)."""
    ct = np.zeros((6, 5, 4), np.int8)
    ct[2:4, 1:3, 1:3] = lbm_jax.CellType.SOLID
    ct[:, -1, :] = lbm_jax.CellType.WALL
    return lbm_jax.Simulation(
        "D3Q19",
        ct.shape,
        tau=0.6,
        storage=storage,
        slab=4,
        backend="xla",
        cell_type=ct,
        wall_velocity=(0.05, 0.0, 0.02),
    )


def _reference(sim: lbm_jax.Simulation, slab: int):
    plan = sim._static.plan  # noqa: SLF001 - the tiled step of one plan
    return make_reference_step(
        sim.lattice, sim.storage, sim.collision, sim.shape, slab, None, plan.step_into
    )


@pytest.mark.parametrize(
    ("slab", "force"),
    [
        (2, "field"),
        (6, "vector"),
        *(
            pytest.param(s, f, marks=pytest.mark.slow)
            for s, f in ((1, "vector"), (3, "vector"), (1, "field"), (6, "field"))
        ),
    ],
)
def test_every_slab_computes_the_tiled_steps_values(slab, force):
    sim = _obstacle_box()
    plan = sim._static.plan  # noqa: SLF001
    rng = np.random.default_rng(1)
    shape = (3,) if force == "vector" else (3, *sim.shape)
    force = 1e-4 * rng.normal(size=shape)
    aux = sim._aux.with_force(force, sim.shape, np.float32)  # noqa: SLF001
    f = sim.advance(sim.init(u=(0.03, 0.01, -0.02)), 3).f
    tiled, got = (
        jax.jit(step)(aux, f, jnp.zeros_like(f))
        for step in (plan.step_into, _reference(sim, slab))
    )
    # float32 sums of populations near 1 in another order: a rounding of 1.0
    np.testing.assert_allclose(got, tiled, rtol=0, atol=2.0**-22)


def test_reference_step_transposes_its_own_linearization(x64):
    """``<v, J u> = <J^T v, u>``: forward and reverse mode are one linear map."""
    sim = _obstacle_box("fp64")
    aux = sim._aux  # noqa: SLF001
    f = sim.advance(sim.init(u=(0.03, 0.01, -0.02)), 3).f
    rng = np.random.default_rng(2)
    u, v = (jnp.asarray(rng.normal(size=f.shape)) for _ in range(2))
    step = _reference(sim, 3)

    def fn(f):
        return step(aux, f, f)

    ju = jax.jit(lambda u: jax.jvp(fn, (f,), (u,))[1])(u)
    jtv = jax.jit(lambda v: jax.vjp(fn, f)[1](v)[0])(v)
    np.testing.assert_allclose(jnp.vdot(v, ju), jnp.vdot(jtv, u), rtol=1e-12)


def test_reference_step_maps_over_a_batch():
    sim = _obstacle_box()
    aux = sim._aux  # noqa: SLF001
    step = _reference(sim, 2)
    fs = jnp.stack([sim.init(u=(a, 0.01, 0.0)).f for a in (0.0, 0.02, -0.03)], axis=0)
    one = jax.jit(lambda f: step(aux, f, f))
    batched = jax.jit(jax.vmap(one))(fs)
    for f, got in zip(fs, batched, strict=True):
        np.testing.assert_allclose(got, one(f), rtol=0, atol=2.0**-22)
