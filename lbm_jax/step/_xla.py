"""The XLA step: fused, slab-tiled streaming + collision, the reference backend.

Populations live in the layout of :mod:`lbm_jax.step._layout` (``(X, Q, *rest)``):
one x-plane holds every direction, so the moments of a plane stay in cache while a
step walks over its directions. A step walks over the grid in slabs of ``B``
x-planes with an inner ``lax.fori_loop``; for each slab it

1. pull-streams into a slab-sized scratch buffer, one ``dynamic_update_slice`` per
   direction (the x shift selects planes of the slab extended by its two periodic
   halo planes, the y and z shifts are a ``jnp.roll`` that fuses into the copy, or,
   along an axis split over devices, the same shift with the neighbour's ghost
   layer moved in where the roll would wrap around; XLA never fuses a
   ``Q``-operand ``stack``, which would cost an extra full pass);
2. applies the boundary selections (bounce-back, moving walls, fixed cells);
3. decodes, collides (moments by one multi-output reduce, one elementwise fusion),
   encodes, and writes the slab into the output buffer in place.

Every pass over a slab hits cache, and the step reads the source buffer once and
writes the destination buffer once. Source and destination must be different
buffers (the pull reads neighbours); loops therefore run two steps per iteration,
``f -> g -> f``, so no buffer swap (a full-state copy in XLA) is needed.

Derivatives take :mod:`lbm_jax.step._reference`'s step instead, which computes
the same values from this module's :func:`make_relax`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from lbm_jax.core._collision import CollisionModel, collide, reverse
from lbm_jax.core._lattice import Lattice
from lbm_jax.core._storage import StoragePolicy
from lbm_jax.step._layout import Halos

__all__ = [
    "check_populations",
    "make_pull",
    "make_relax",
    "make_step_into",
    "slab_tiling",
]


def make_step_into(
    lattice: Lattice,
    storage: StoragePolicy,
    model: CollisionModel,
    shape: tuple[int, ...],
    slab: int,
    constant_force: list[np.ndarray] | None,
) -> Callable[..., jax.Array]:
    """Build ``step_into(aux, f, g) -> g'``: one step from ``f`` written into ``g``.

    Args:
        lattice: Velocity set.
        storage: Storage policy (codec and shift).
        model: Collision operator.
        shape: Grid size ``(X, *rest)``.
        slab: x-planes per slab (1 <= slab <= X).
        constant_force: Force components as scalars, or ``None``; used when
            ``aux.force`` is ``None``.

    ``aux`` carries the boundary arrays in population layout, the force: ``None``, a
    ``(D,)`` vector or a ``(D, X, ...)`` field (it replaces ``constant_force``), and
    the gray cells' solid fraction, ``(X, 1, ...)`` or ``None`` (:func:`make_relax`).
    ``f`` and ``g`` are stored populations ``(X, Q, *rest)``; ``g``'s content is
    overwritten.
    ``halos``, when given, holds one entry per grid axis: ``None`` where ``f``
    wraps around periodically, else the ``(low, high)`` ghost layers from the
    neighbouring sub-domains, in the storage format. For x these are the planes
    just left and right of ``f``, ``(1, Q, *rest)``; for y, the layers just below
    and above, ``(X + 2, Q, 1, Z)``, extended in x by one cell at each end (the
    x ghosts' edges, or the periodic wrap); for z, ``(X + 2, Q, Y', 1)`` with
    ``Y' = Y + 2`` when y has ghosts (edges and corners included), else ``Y``.
    """
    nx = shape[0]
    rest = shape[1:]
    q = lattice.q
    b, num_slabs = slab_tiling(slab, nx)

    pull = make_pull(lattice, b)
    relax = make_relax(lattice, storage, model, b, constant_force)

    def stream(
        f: jax.Array, x0: jax.Array, halos: Halos | None
    ) -> tuple[jax.Array, jax.Array]:
        hx = None if halos is None else halos[0]
        left = lax.dynamic_slice_in_dim(f, (x0 + (nx - 1)) % nx, 1, 0)
        main = lax.dynamic_slice_in_dim(f, x0, b, 0)
        right = lax.dynamic_slice_in_dim(f, (x0 + b) % nx, 1, 0)
        if hx is not None:  # neighbouring sub-domains' edge planes
            left = jnp.where(x0 == 0, hx[0], left)
            right = jnp.where(x0 + b == nx, hx[1], right)
        haloed = jnp.concatenate([left, main, right], axis=0)
        ghosts = [
            None
            if halos is None or halos[k + 1] is None
            else [lax.dynamic_slice_in_dim(h, x0, b + 2, 0) for h in halos[k + 1]]
            for k in range(len(rest))
        ]
        return pull(haloed, main, ghosts), main

    def slab_update(
        aux: Any,
        f: jax.Array,
        g: jax.Array,
        x0: jax.Array,
        halos: Halos | None,
    ) -> jax.Array:
        stored_in, main = stream(f, x0, halos)
        stored = relax(aux, x0, stored_in, main)
        return lax.dynamic_update_slice_in_dim(g, stored, x0, 0)

    def step_into(
        aux: Any,
        f: jax.Array,
        g: jax.Array,
        halos: Halos | None = None,
    ) -> jax.Array:
        check_populations(f, (nx, q, *rest))
        if num_slabs == 1:
            return slab_update(aux, f, g, jnp.asarray(0, jnp.int32), halos)

        def body(k: jax.Array, g: jax.Array) -> jax.Array:
            # the last slab may overlap the previous one; recomputing planes from
            # the unchanged source writes identical values
            x0 = jnp.minimum(k * b, nx - b)
            return slab_update(aux, f, g, x0, halos)

        return lax.fori_loop(0, num_slabs, body, g)

    return step_into


def slab_tiling(slab: int, nx: int) -> tuple[int, int]:
    """``(slab, number of slabs)`` covering ``nx`` x-planes (the last may overlap).

    Raises:
        ValueError: ``slab`` outside ``[1, nx]``.
    """
    b = int(slab)
    if not 1 <= b <= nx:
        raise ValueError(f"slab must be in [1, {nx}], got {slab}.")
    return b, -(-nx // b)


def check_populations(f: jax.Array, shape: tuple[int, ...]) -> None:
    """Raise ``ValueError`` unless stored populations ``f`` have the kernel shape."""
    if f.shape != shape:
        raise ValueError(f"populations have shape {f.shape}, expected {shape}.")


def make_pull(lattice: Lattice, slab: int) -> Callable[..., jax.Array]:
    """Build ``pull(haloed, base, ghosts=None) -> scratch``: pull streaming of a slab.

    ``haloed`` holds the slab's ``slab`` x-planes with one neighbour plane on each
    side, ``(slab + 2, Q, *rest)``, in the storage format; ``base`` supplies the
    resting populations (the slab's own planes). Along each rest axis the pull
    wraps around periodically (``ghosts`` ``None`` or its entry ``None``) or takes
    the entering layer from that axis's ``(low, high)`` ghost layers, ``(slab + 2,
    Q, ...)`` slabs of them (a split axis, see :func:`make_step_into`).
    """
    b = int(slab)
    dirs = [tuple(int(v) for v in ci) for ci in lattice.c]

    def pull(
        haloed: jax.Array,
        base: jax.Array,
        ghosts: list[list[jax.Array] | None] | None = None,
    ) -> jax.Array:
        nrest = haloed.ndim - 2
        ghosts = [None] * nrest if ghosts is None else ghosts
        # along a split y/z axis the shift moves in the neighbour's ghost layer
        # where a roll would wrap around (same cost as the roll)
        roll_axes = tuple(k + 1 for k, g in enumerate(ghosts) if g is None)
        scratch = base  # resting populations are already in place
        for i, ci in enumerate(dirs):
            if not any(ci):
                continue
            piece = haloed[1 - ci[0] : 1 - ci[0] + b, i]
            if not any(g is not None for g in ghosts):
                shifts = tuple(ci[k] for k in roll_axes)
                if any(shifts):
                    piece = jnp.roll(piece, shifts, axis=roll_axes)
            else:
                for k in range(nrest):
                    piece = _shift(piece, i, ci, k, ghosts, b)
            scratch = lax.dynamic_update_slice_in_dim(scratch, piece[:, None], i, 1)
        return scratch

    return pull


def make_relax(
    lattice: Lattice,
    storage: StoragePolicy,
    model: CollisionModel,
    slab: int,
    constant_force: list[np.ndarray] | None,
) -> Callable[..., jax.Array]:
    """Build ``relax(aux, x0, pulled, main) -> stored``: the rest of a slab's step.

    Decodes the pulled populations, applies bounce-back (reflecting ``main``, the
    slab's post-collision populations, plus the moving-wall term), collides with
    the slab's force, blends in the gray cells' partial bounce-back, encodes, and
    restores fixed cells; ``x0`` is the slab's first x-plane in the arrays of
    ``aux`` (see :func:`make_step_into`).

    Gray cells (``aux.solid_fraction``, ``n_s`` in ``(X, 1, *rest)``, or ``None``
    for none) follow the partial bounce-back of Walsh, Burwinkle & Saar (2009):
    a cell sends out ``(1 - n_s) f_i* + n_s f_opp(i)``, its collided populations
    ``f*`` blended with its own pre-collision populations ``f`` reversed. Both
    parts carry the cell's mass, so the blend conserves it; it is linear, hence
    smooth, in ``n_s``; ``n_s = 0`` is plain fluid, ``n_s = 1`` reflects every
    population (full-way bounce-back: a solid cell, the wall half-way to its
    fluid neighbours in a steady flow). The DDF shift passes through the blend
    (opposite directions share a weight).
    """
    b = int(slab)

    def relax(aux: Any, x0: jax.Array, pulled: jax.Array, main: jax.Array):
        bnd = aux.boundary
        fs = storage.decode(pulled)
        if bnd.bounce is not None:
            reflected = reverse(lattice, storage.decode(main), axis=1)
            if bnd.wall_term is not None:
                reflected = reflected + _slab(bnd.wall_term, x0, b)
            fs = jnp.where(_slab(bnd.bounce, x0, b), reflected, fs)
        if aux.force is None:
            force = constant_force
        elif aux.force.ndim == 1:  # a traced (D,) vector
            force = [aux.force[a] for a in range(lattice.d)]
        else:  # a (D, X, ...) field
            fslab = lax.dynamic_slice_in_dim(aux.force, x0, b, 1)
            force = [fslab[a] for a in range(lattice.d)]
        out, _, _ = collide(
            lattice, model, fs, shift=storage.shift, force=force, axis=1
        )
        if aux.solid_fraction is not None:
            ns = _slab(aux.solid_fraction, x0, b)
            out = out + ns * (reverse(lattice, fs, axis=1) - out)
        stored = storage.encode(out)
        if bnd.fixed is not None:
            stored = jnp.where(
                _slab(bnd.fixed_mask, x0, b), _slab(bnd.fixed, x0, b), stored
            )
        return stored

    return relax


def _shift(
    piece: jax.Array,
    i: int,
    ci: tuple[int, ...],
    k: int,
    ghosts: list[list[jax.Array] | None],
    b: int,
) -> jax.Array:
    """Shift a pulled ``(b, *rest)`` piece by ``ci`` along rest axis ``k``.

    Periodic axes roll; along a split axis the layer that enters comes from the
    ghost layers (``(b + 2, Q, ...)`` slabs of them), taken at the piece's
    direction and x shift and shifted like the piece along the earlier rest axes.
    """
    c, axis, n = ci[k + 1], k + 1, piece.shape[k + 1]
    if c == 0:
        return piece
    if ghosts[k] is None:
        return jnp.roll(piece, c, axis=axis)
    layer = ghosts[k][0 if c > 0 else 1][1 - ci[0] : 1 - ci[0] + b, i]
    for j in range(k):  # earlier axes: already shifted in the piece
        cj = ci[j + 1]
        if ghosts[j] is not None:
            size = layer.shape[j + 1] - 2
            layer = lax.slice_in_dim(layer, 1 - cj, 1 - cj + size, axis=j + 1)
        elif cj:
            layer = jnp.roll(layer, cj, axis=j + 1)
    if c > 0:
        return jnp.concatenate(
            [layer, lax.slice_in_dim(piece, 0, n - 1, axis=axis)], axis
        )
    return jnp.concatenate([lax.slice_in_dim(piece, 1, n, axis=axis), layer], axis)


def _slab(a: jax.Array, x0: jax.Array, b: int) -> jax.Array:
    return lax.dynamic_slice_in_dim(a, x0, b, 0)
