"""In-place streaming: many steps over a single population buffer.

The two-buffer kernel (:mod:`lbm_jax.step._xla`) pulls from one buffer into another,
so a run holds two copies of the populations. A pull step only reads the planes
``x - 1``, ``x`` and ``x + 1`` to produce plane ``x``, so it can also run in place:
walking the x-slabs in order, each slab copies its planes and its right neighbour
plane into a small haloed slab buffer before overwriting them, and that buffer
travels to the next slab with the old left neighbour plane the next slab needs
(already overwritten in the population buffer). The wrap-around plane for the last
slab is kept from the start. A run then holds one population buffer plus one slab
buffer, and every slab computes exactly what the two-buffer step computes, with the
same fused stream-decode-collide-encode-write structure: the results are
bit-identical. On accelerators, where one slab covers the grid, the slab buffer is
grid-sized and nothing is saved.

The two-buffer kernel lets its last slab overlap the previous one and recomputes
those planes from the unchanged source; in place, the overlapped planes are already
new. The last slab here overlaps too (every slab then compiles to the same program,
which keeps the results bit-identical), takes the carried old plane as the left
neighbour of its first new plane, and writes back only the planes no earlier slab
wrote.

Every read of the population buffer must feed the slab's write, or XLA copies the
whole buffer to keep the old values readable: the old left plane therefore travels
inside the slab buffer, not as a slice of the population buffer.

(A single-buffer scheme that alternates in-cell and neighbour steps, the AA
pattern, moves no halo planes but scatters each cell's results over its
neighbours. XLA:CPU fuses the collision into each of those scattered writes, one
direction each, where the direction becomes a compile-time constant and LLVM
contracts multiply-adds into FMAs differently: the results differ from the
two-buffer step in the last bit.)
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from lbm_jax.core._collision import CollisionModel
from lbm_jax.core._lattice import Lattice
from lbm_jax.core._storage import StoragePolicy
from lbm_jax.step._xla import check_populations, make_pull, make_relax, slab_tiling

__all__ = ["Streaming", "make_advance_inplace", "parse_streaming"]


class Streaming(enum.Enum):
    """How :meth:`Simulation.advance` keeps populations between steps.

    ``INPLACE`` updates one population buffer in place (one device only),
    ``TWO_BUFFER`` pulls from one buffer into a second (two steps per loop
    iteration). ``AUTO`` is the faster of the two where both apply: measured on
    CPUs, in-place steps ran 3-13 % slower (each slab copies its halo planes once
    more), so ``AUTO`` is two-buffer for now; choose ``INPLACE`` to halve the
    memory of a run.
    """

    AUTO = "auto"
    INPLACE = "inplace"
    TWO_BUFFER = "two-buffer"


def parse_streaming(streaming: str | Streaming, devices: int) -> Streaming:
    """Validate a streaming option and resolve ``"auto"`` (host-side).

    Args:
        streaming: ``"auto"``, ``"inplace"``, ``"two-buffer"`` or a
            :class:`Streaming`.
        devices: Number of devices the grid is split over.

    Returns:
        ``Streaming.INPLACE`` or ``Streaming.TWO_BUFFER``.

    Raises:
        ValueError: An unknown name, or in-place streaming on a split grid.
        TypeError: Neither a str nor a :class:`Streaming`.
    """
    names = [s.value for s in Streaming]
    if isinstance(streaming, str):
        try:
            choice = Streaming(streaming.strip().lower())
        except ValueError:
            raise ValueError(
                f"Unknown streaming {streaming!r}; expected one of {names}."
            ) from None
    elif isinstance(streaming, Streaming):
        choice = streaming
    else:
        raise TypeError(
            f"streaming must be a str or Streaming, got {type(streaming).__name__}; "
            f"pass one of {names}."
        )
    if choice is Streaming.AUTO:
        return Streaming.TWO_BUFFER
    if choice is Streaming.INPLACE and devices != 1:
        raise ValueError(
            f"streaming='inplace' runs on one device, but the grid is split over "
            f"{devices} devices; pass streaming='two-buffer' (or 'auto'), or "
            "devices=None."
        )
    return choice


def make_advance_inplace(
    lattice: Lattice,
    storage: StoragePolicy,
    model: CollisionModel,
    shape: tuple[int, ...],
    slab: int,
    constant_force: list[np.ndarray] | None,
) -> Callable[[Any, jax.Array, jax.Array], jax.Array]:
    """Build ``advance(aux, f, steps) -> f'``: ``steps`` steps in one buffer.

    Args:
        lattice: Velocity set.
        storage: Storage policy (codec and shift).
        model: Collision operator.
        shape: Grid size ``(X, *rest)`` (the whole grid: one device).
        slab: x-planes per slab (1 <= slab <= X).
        constant_force: Force components as scalars, or ``None``; used when
            ``aux.force`` is ``None``.

    ``aux`` is the two-buffer kernel's (boundary arrays in population layout, force:
    ``None``, a ``(D,)`` vector or a ``(D, X, ...)`` field). ``f`` holds stored
    post-collision populations ``(X, Q, *rest)`` and is updated in place (donate
    it); ``steps`` is a traced int32 scalar. The result equals ``steps``
    two-buffer steps bit for bit.
    """
    nx, rest = shape[0], shape[1:]
    q = lattice.q
    b, num_slabs = slab_tiling(slab, nx)
    overlap = nx % b != 0
    pull = make_pull(lattice, b)
    relax = make_relax(lattice, storage, model, b, constant_force)

    def planes(a: jax.Array, x0: jax.Array) -> jax.Array:
        return lax.dynamic_slice_in_dim(a, x0, b, 0)

    def step(aux: Any, f: jax.Array) -> jax.Array:
        """One pull step from ``f`` into ``f`` itself, slab after slab."""

        def body(k: jax.Array, carry: tuple) -> tuple:
            f, ext, first = carry
            start = k * b  # first plane no earlier slab wrote
            x0 = jnp.minimum(start, nx - b)
            skip = start - x0  # planes of an overlapping last slab already new
            # ``ext`` holds planes x0-1 .. x0+b of the slab: its left neighbour,
            # overwritten by the previous slab, is the old plane that slab left
            # at ``ext[b]``; the rest is read from ``f`` (the wrap from ``first``)
            ext = lax.dynamic_update_slice_in_dim(ext, ext[b : b + 1], 0, 0)
            main = planes(f, x0)
            right = jnp.where(
                x0 + b == nx, first, lax.dynamic_slice_in_dim(f, (x0 + b) % nx, 1)
            )
            ext = lax.dynamic_update_slice_in_dim(ext, main, 1, 0)
            ext = lax.dynamic_update_slice_in_dim(ext, right, b + 1, 0)
            if overlap:  # the last slab's old left plane goes at the overlap's end
                ext = lax.dynamic_update_slice_in_dim(ext, ext[:1], skip, 0)
            stored = relax(aux, x0, pull(ext, ext[1 : b + 1]), main)
            if overlap:
                index = lax.broadcasted_iota(
                    jnp.int32, (b,) + (1,) * (1 + len(rest)), 0
                )
                stored = jnp.where(index >= skip, stored, main)
            return lax.dynamic_update_slice_in_dim(f, stored, x0, 0), ext, first

        # old planes X-1 (the first slab's left neighbour) and 0 (the wrap)
        ext = jnp.zeros((b + 2, q, *rest), f.dtype)
        ext = lax.dynamic_update_slice_in_dim(ext, f[nx - 1 :], b, 0)
        return lax.fori_loop(0, num_slabs, body, (f, ext, f[:1]))[0]

    def advance(aux: Any, f: jax.Array, steps: jax.Array) -> jax.Array:
        check_populations(f, (nx, q, *rest))
        return lax.fori_loop(0, steps, lambda _, f: step(aux, f), f)

    return advance
