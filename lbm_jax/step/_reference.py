"""The reference step: the XLA step that derivatives take.

It computes what the slab-tiled XLA step (:func:`lbm_jax.step._xla.make_step_into`)
computes, to within rounding (XLA fuses, and so orders the float32 sums,
differently), with the same decoding, boundaries, collision and encoding
(:func:`~lbm_jax.step._xla.make_relax`), written so that plain JAX autodiff
(``jax.jvp``, ``jax.linearize``, ``jax.grad``, and ``jax.vmap`` of them) stays
cheap in memory and time:

1. the grid is cut into ``S`` slabs of ``b`` x-planes (``b`` divides ``X``, see
   :func:`reference_slab`); slab ``k`` is its planes of the stored populations,
   the periodic neighbour plane on each side, and its planes of every
   grid-shaped array of the step's ``aux`` (:func:`split_slabs`);
2. a ``lax.scan`` over the slabs decodes each one, pulls it (one roll per
   direction, concatenated: the transpose is as cheap), and relaxes it, writing
   the slab's output planes;
3. the scan's body is ``jax.checkpoint``-ed: a linearization keeps only the
   slabs' inputs, in the storage format (the populations themselves and two
   planes per slab), and the adjoint recomputes one slab at a time, so the
   float32 working set of a derivative is one slab's, not the grid's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from lbm_jax.core._collision import CollisionModel
from lbm_jax.core._lattice import Lattice
from lbm_jax.core._storage import StoragePolicy
from lbm_jax.step._layout import Halos
from lbm_jax.step._xla import check_populations, make_relax

__all__ = [
    "REFERENCE_SLAB",
    "combine_slab",
    "make_reference_step",
    "reference_slab",
    "split_slabs",
]


#: The most x-planes per slab of the reference step: a slab's float32 working
#: set stays small next to the state, and its adjoint costs least about there
#: (D3Q19, 64^3 and 128^3 on a CPU: 4 to 16 planes within 15% of each other,
#: 1 plane five times slower).
REFERENCE_SLAB = 8


def reference_slab(nx: int, slab: int = REFERENCE_SLAB) -> int:
    """x-planes per slab of the reference step: the largest divisor of ``nx`` at
    most ``slab`` (the slabs tile the grid exactly; ``slab >= nx``: one slab).

    >>> [reference_slab(n) for n in (128, 12, 7, 13)], reference_slab(12, 5)
    ([8, 6, 7, 1], 4)

    Raises:
        ValueError: ``slab`` below 1.
    """
    if int(slab) < 1:
        raise ValueError(f"slab must be >= 1, got {slab}.")
    return max(b for b in range(1, min(int(slab), nx) + 1) if nx % b == 0)


def _x_axis(path: tuple[Any, ...], leaf: jax.Array) -> int | None:
    """The axis along x of a leaf of a step's ``aux``, or ``None`` (not split).

    A force is a ``(D,)`` vector (the same in every slab) or a ``(D, X, ...)``
    field; every other array (the boundary arrays, in population layout) has x
    first.
    """
    if path and getattr(path[0], "name", None) == "force":
        return 1 if leaf.ndim > 1 else None
    return 0


def split_slabs(aux: Any, nx: int, slab: int) -> tuple[Any, Any]:
    """Split ``aux``'s grid-shaped arrays into ``nx // slab`` slabs along x.

    Returns ``(slabs, whole)``, two trees of ``aux``'s structure: ``slabs`` holds
    each split array with the slab index first (``(S, ..., slab, ...)``, x's axis
    keeping its place after it) and ``None`` elsewhere, ``whole`` the arrays
    that are not split (a force vector) and ``None`` elsewhere; a slab's ``aux``
    is ``combine_slab(slabs[k], whole)``.

    Raises:
        ValueError: ``slab`` does not divide ``nx``, or a split array does not
            have ``nx`` planes along its x axis.

    >>> from lbm_jax.sim._config import StepArrays
    >>> from lbm_jax.core._boundaries import BoundaryData
    >>> aux = StepArrays(BoundaryData(jnp.zeros((6, 9, 4)), None, None, None),
    ...                  jnp.zeros((2, 6, 4)))
    >>> slabs, whole = split_slabs(aux, 6, 2)
    >>> slabs.boundary.bounce.shape, slabs.force.shape, whole.force
    ((3, 2, 9, 4), (3, 2, 2, 4), None)
    """
    if nx % slab:
        raise ValueError(f"slab must divide {nx}, got {slab}.")

    def split(path: tuple[Any, ...], leaf: jax.Array) -> jax.Array | None:
        axis = _x_axis(path, leaf)
        if axis is None:
            return None
        if leaf.shape[axis] != nx:
            raise ValueError(
                f"step array {jax.tree_util.keystr(path)} has {leaf.shape[axis]} "
                f"x-planes on axis {axis} (shape {leaf.shape}), expected {nx}."
            )
        shape = leaf.shape[:axis] + (nx // slab, slab) + leaf.shape[axis + 1 :]
        return jnp.moveaxis(leaf.reshape(shape), axis, 0)

    def keep(path: tuple[Any, ...], leaf: jax.Array) -> jax.Array | None:
        return leaf if _x_axis(path, leaf) is None else None

    return (
        jax.tree_util.tree_map_with_path(split, aux),
        jax.tree_util.tree_map_with_path(keep, aux),
    )


def combine_slab(slab: Any, whole: Any) -> Any:
    """One slab's ``aux`` from a slab of :func:`split_slabs`' ``slabs`` and its
    ``whole``."""
    return jax.tree.map(
        lambda s, w: w if s is None else s, slab, whole, is_leaf=lambda a: a is None
    )


def make_reference_step(
    lattice: Lattice,
    storage: StoragePolicy,
    model: CollisionModel,
    shape: tuple[int, ...],
    slab: int,
    constant_force: list[np.ndarray] | None,
    tiled: Callable[..., jax.Array],
) -> Callable[..., jax.Array]:
    """Build the reference step ``step_into(aux, f, g[, halos]) -> g'``.

    Args:
        lattice, storage, model: The configuration.
        shape: Grid size ``(X, *rest)``.
        slab: The most x-planes per slab; the slab is :func:`reference_slab`'s
            (``slab = X``: one slab, the whole grid at once).
        constant_force: Force components as scalars, or ``None`` (see
            :func:`lbm_jax.step._xla.make_step_into`).
        tiled: The slab-tiled XLA step, which runs on a split grid (``halos``
            given).

    ``g`` is not read (the result is a new array); see the module docstring.
    """
    nx, rest = shape[0], shape[1:]
    q = lattice.q
    b = reference_slab(nx, slab)
    num_slabs = nx // b
    pull = _make_stacked_pull(lattice, b)
    relax = make_relax(lattice, storage, model, b, constant_force)
    x0 = np.int32(0)

    def step_into(
        aux: Any, f: jax.Array, g: jax.Array, halos: Halos | None = None
    ) -> jax.Array:
        if halos is not None:
            return tiled(aux, f, g, halos)
        check_populations(f, (nx, q, *rest))
        main = f.reshape(num_slabs, b, q, *rest)  # no copy
        # slab k's neighbour planes: the last of slab k - 1, the first of k + 1
        planes = (jnp.roll(main[:, -1:], 1, axis=0), jnp.roll(main[:, :1], -1, axis=0))
        slabs, whole = split_slabs(aux, nx, b)

        @functools.partial(jax.checkpoint, prevent_cse=False)
        def body(carry: None, xs: tuple[Any, ...]) -> tuple[None, jax.Array]:
            stored, (left, right), aux_slab = xs
            haloed = jnp.concatenate([left, stored, right], axis=0)
            # decoded before the pull (decoding is elementwise: the same values),
            # so the pull's derivative moves compute-dtype values; relax's
            # decoding of them is the identity
            fs = storage.decode(haloed)
            inner = fs[1 : b + 1]
            return carry, relax(combine_slab(aux_slab, whole), x0, pull(fs), inner)

        _, out = lax.scan(body, None, (main, planes, slabs))
        return out.reshape(nx, q, *rest)

    return step_into


def _make_stacked_pull(lattice: Lattice, slab: int) -> Callable[[jax.Array], jax.Array]:
    """Build ``pull(haloed) -> pulled``: :func:`lbm_jax.step._xla.make_pull`'s
    periodic pull of a slab, written for its derivative.

    The haloed slab is split into its directions, each direction's planes are
    sliced and rolled, and the pieces concatenated: the transpose is a split,
    rolls, pads and one concatenate, where ``make_pull``'s chain of in-place
    updates would transpose into a copy of the slab per direction.
    """
    b = int(slab)
    dirs = [tuple(int(v) for v in ci) for ci in lattice.c]

    def pull(haloed: jax.Array) -> jax.Array:
        axes = tuple(range(2, haloed.ndim))
        pieces = []
        for part, ci in zip(jnp.split(haloed, len(dirs), axis=1), dirs, strict=True):
            piece = part[1 - ci[0] : 1 - ci[0] + b]
            if any(ci[1:]):
                piece = jnp.roll(piece, ci[1:], axis=axes)
            pieces.append(piece)
        return jnp.concatenate(pieces, axis=1)

    return pull
