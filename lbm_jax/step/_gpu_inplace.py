"""The fused GPU step streaming in place: the esoteric-pull scheme (Lehmann 2022).

One population buffer instead of two (:mod:`lbm_jax.step._gpu` streams with two):
on even steps a cell reads ``f_i`` from slot ``(x - c_i, i)`` and writes its
post-collision ``f_j`` to slot ``(x + c_j, opp(j))``; on odd steps it reads
``f_i`` from its own slot ``opp(i)`` and writes ``f_j`` to its own slot ``j``.
Each cell writes exactly the slots it read, so one buffer suffices, and after an
even number of steps the layout is the standard one. An odd number of steps
starts with a permutation pass (slot ``(x, i)`` swapped with ``(x + c_i,
opp(i))``), which is exact. Non-fluid cells are left alone during the steps
(fluid cells take bounce-back sources from the slots those cells own and
equilibrium-cell populations from the fixed array) and restored at the end. The
per-cell arithmetic is the two-buffer kernel's, so both agree bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from lbm_jax.core._collision import CollisionModel
from lbm_jax.core._lattice import Lattice
from lbm_jax.core._storage import StoragePolicy
from lbm_jax.step._gpu import (
    Plan,
    call_kernel,
    kernel_operands,
    pallas_modules,
    program_cells,
    supported,
)
from lbm_jax.step._gpu_cells import Cells, index, wrap

__all__ = ["make_gpu_advance_inplace"]


def make_gpu_advance_inplace(
    lattice: Lattice,
    storage: StoragePolicy,
    model: CollisionModel,
    shape: tuple[int, ...],
    slab: int | None = None,
    constant_force: list[np.ndarray] | None = None,
    *,
    interpret: bool = False,
) -> Callable[[Any, jax.Array, jax.Array], jax.Array]:
    """Build ``advance(aux, f, steps) -> f'``: ``steps`` steps in one buffer by
    esoteric pull (see the module docstring); one device.

    The arguments are those of :func:`make_gpu_step_into`. The result equals
    ``steps`` steps of the two-buffer fused step bit for bit.
    """
    del slab
    shape = tuple(int(s) for s in shape)
    if not supported(lattice, storage, model, shape, interpret=True):
        raise ValueError(
            f"the fused GPU step does not cover {lattice.name} on {shape} with "
            f"{storage}, {model.kind.value}; use make_advance_inplace."
        )
    plan = Plan(lattice, storage, model, shape, constant_force, interpret)

    def advance(aux: Any, f: jax.Array, steps: jax.Array) -> jax.Array:
        if f.shape != plan.full or f.dtype != storage.storage_dtype:
            raise ValueError(
                f"populations have shape {f.shape} and dtype {f.dtype}, expected "
                f"{plan.full} and {storage.storage_dtype}."
            )
        ops = kernel_operands(aux, None)
        names = tuple(ops)
        even = _esoteric_kernel(plan, names, odd=False)
        odd = _esoteric_kernel(plan, names, odd=True)
        swap = _swap_kernel(plan)

        inputs = list(ops.values())

        def pair(_: jax.Array, f: jax.Array) -> jax.Array:
            f = call_kernel(plan, even, inputs, f)
            return call_kernel(plan, odd, inputs, f)

        # an odd count: permute to the odd-step layout, then one odd step
        f = lax.cond(
            steps % 2 == 1,
            lambda f: call_kernel(plan, odd, inputs, call_kernel(plan, swap, [], f)),
            lambda f: f,
            f,
        )
        f = lax.fori_loop(0, steps // 2, pair, f)
        bnd = aux.boundary
        if bnd.fixed_mask is not None:  # non-fluid cells hold their values again
            f = jnp.where(bnd.fixed_mask, bnd.fixed, f)
        return f

    return advance


def _esoteric_kernel(
    plan: Plan, names: tuple[str, ...], *, odd: bool
) -> Callable[..., None]:
    """One in-place esoteric-pull step (``odd``: from the swapped layout)."""
    _, plgpu = pallas_modules()
    st = plan.storage
    opp = plan.lattice.opposite
    nx = plan.shape[0]

    def slot_in(cells: Cells, i: int) -> tuple:
        """Where the cell finds pre-collision ``f_i``."""
        if odd:
            return index(cells.coords, int(opp[i]))
        src = cells.shifted(plan.dirs[i], -1)
        src[0] = wrap(src[0], nx)
        return index(src, i)

    def slot_out(cells: Cells, i: int) -> tuple:
        """Where the cell leaves post-collision ``f_i``."""
        if odd:
            return index(cells.coords, i)
        dst = cells.shifted(plan.dirs[i], 1)
        dst[0] = wrap(dst[0], nx)
        return index(dst, int(opp[i]))

    def kernel(*refs):
        *op_refs, f_ref, g_ref = refs  # f_ref and g_ref: the same buffer on a GPU
        refs = dict(zip(names, op_refs, strict=True))
        cells = program_cells(plan)
        fixed = plan.fixed_at(refs, cells)
        mask = cells.mask if fixed is None else cells.mask & ~fixed
        fs = []
        for i in range(plan.lattice.q):
            v = plgpu.load(f_ref.at[slot_in(cells, i)], mask=mask, other=0)
            if fixed is not None and any(plan.dirs[i]):
                # a non-fluid upstream cell: its fixed populations
                src = cells.shifted(plan.dirs[i], -1)
                src[0] = wrap(src[0], nx)
                held = plgpu.load(
                    refs["fixed_mask"].at[index(src, 0)], mask=mask, other=False
                )
                v = jnp.where(
                    held,
                    plgpu.load(refs["fixed"].at[index(src, i)], mask=mask, other=0),
                    v,
                )
            fs.append(st.decode(v))

        def own(j: int) -> jax.Array:
            # the cell's post-collision f_j of the previous step: in the slot it
            # wrote last (a slot of the non-fluid neighbour, which never writes)
            i = int(opp[j])
            if odd:
                src = cells.shifted(plan.dirs[i], -1)
                src[0] = wrap(src[0], nx)
                at = index(src, i)
            else:
                at = index(cells.coords, j)
            return plgpu.load(f_ref.at[at], mask=mask, other=0)

        cells.mask = mask
        out = plan.finish(refs, cells, fs, own)
        for i, v in enumerate(out):
            plgpu.store(g_ref.at[slot_out(cells, i)], v, mask=mask)

    return kernel


def _swap_kernel(plan: Plan) -> Callable[..., None]:
    """Swap slot ``(x, i)`` with ``(x + c_i, opp(i))`` for one direction of each
    opposite pair: standard layout <-> the layout after an even esoteric step."""
    _, plgpu = pallas_modules()
    opp = plan.lattice.opposite
    nx = plan.shape[0]
    half = [i for i in range(plan.lattice.q) if i < int(opp[i])]

    def kernel(f_ref, g_ref):  # the same buffer on a GPU
        cells = program_cells(plan)
        mask = cells.mask
        for i in half:
            dst = cells.shifted(plan.dirs[i], 1)
            dst[0] = wrap(dst[0], nx)
            here = index(cells.coords, i)
            there = index(dst, int(opp[i]))
            a = plgpu.load(f_ref.at[here], mask=mask, other=0)
            b = plgpu.load(f_ref.at[there], mask=mask, other=0)
            plgpu.store(g_ref.at[here], b, mask=mask)
            plgpu.store(g_ref.at[there], a, mask=mask)

    return kernel
