"""Interface curvature from a fill field; exact fill fields of circles and spheres.

The curvature is the divergence of the interface normal of a smoothed fill field
(DESIGN's finite-difference alternative to a PLIC paraboloid fit):

1. smooth the fill level ``phi`` with the separable binomial filter
   ``[1/4, 1/2, 1/4]`` along every axis, ``passes`` times (default 2);
2. the normal ``n = grad(phi_s) / |grad(phi_s)|`` from central differences
   smoothed across the other axes (a Parker-Youngs-like isotropic stencil);
3. the mean curvature ``kappa = div(n) / (D - 1)`` by central differences.

``n`` points into the liquid, so ``kappa`` is negative for a drop: ``-1/R`` for a
circle or sphere of radius ``R``, zero for a flat surface. Measured on exact fill
fields (:func:`sphere_fill`) the mean of ``kappa R`` over the interface cells is
within 4 % of ``-1`` at ``R = 4`` (2 % in 2-D) and within 1 % at ``R >= 10``, in
2-D and 3-D, with a cell-to-cell scatter of 4-10 %. On a small-amplitude wave the
smoothing shortens the curvature by about 5 %. All operations are whole-array and
periodic; cells the caller marks as solid take the mean fill of their non-solid
axis neighbours first (a zero-gradient wall).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

__all__ = ["curvature", "sphere_fill"]

#: Largest |kappa| (per cell) the model uses; a curvature radius below one cell is
#: not resolved.
MAX_CURVATURE = 1.0


def _smooth(a: jax.Array, axes: Sequence[int]) -> jax.Array:
    for ax in axes:
        a = 0.25 * (jnp.roll(a, 1, ax) + jnp.roll(a, -1, ax)) + 0.5 * a
    return a


def _ddx(a: jax.Array, axis: int) -> jax.Array:
    return 0.5 * (jnp.roll(a, -1, axis) - jnp.roll(a, 1, axis))


def curvature(
    phi: ArrayLike, solid: ArrayLike | None = None, *, passes: int = 2
) -> jax.Array:
    """Mean curvature of the fill field's iso-surfaces, per cell (jit-able).

    Args:
        phi: Fill level in ``[0, 1]``, shape ``(X, Y)`` or ``(X, Y, Z)``.
        solid: Optional boolean mask of solid cells; they take the mean fill of
            their non-solid axis neighbours before smoothing.
        passes: Number of smoothing passes (2 balances the mean error on
            small drops against the scatter on coarse interfaces).

    Returns:
        ``kappa`` with ``phi``'s shape, clamped to ``|kappa| <= 1``: ``-1/R`` on a
        drop of radius ``R`` (only meaningful on interface cells).
    """
    phi = jnp.asarray(phi)
    if phi.ndim not in (2, 3):
        raise ValueError(f"phi must be 2-D or 3-D, got shape {phi.shape}.")
    axes = tuple(range(phi.ndim))
    if solid is not None:
        solid = jnp.asarray(solid, bool)
        open_ = (~solid).astype(phi.dtype)
        total = sum(jnp.roll(phi * open_, s, ax) for ax in axes for s in (1, -1))
        count = sum(jnp.roll(open_, s, ax) for ax in axes for s in (1, -1))
        phi = jnp.where(solid, total / jnp.maximum(count, 1), phi)
    for _ in range(passes):
        phi = _smooth(phi, axes)
    grad = [_smooth(_ddx(phi, a), [b for b in axes if b != a]) for a in axes]
    norm = jnp.sqrt(sum(g * g for g in grad))
    tiny = jnp.asarray(1e-12, phi.dtype)
    normal = [g / jnp.maximum(norm, tiny) for g in grad]
    div = sum(_ddx(n, a) for n, a in zip(normal, axes, strict=True))
    return jnp.clip(div / (phi.ndim - 1), -MAX_CURVATURE, MAX_CURVATURE)


def sphere_fill(
    shape: Sequence[int],
    centre: Sequence[float],
    radius: float,
    *,
    inside: bool = True,
    samples: int = 8,
) -> np.ndarray:
    """Fill level of a circle (2-D) or sphere (3-D) on a grid, by supersampling.

    Cell ``i`` spans ``[i - 1/2, i + 1/2]`` along every axis. Each cell is sampled
    on a regular ``samples^D`` sub-grid, so the fill level is exact to about
    ``1 / samples^D`` (cells wholly inside or outside are exactly 1 or 0).

    Args:
        shape: Grid size.
        centre: Centre in cell coordinates.
        radius: Radius in cells (> 0).
        inside: Fill the inside (a drop); ``False`` fills the outside (a bubble).
        samples: Sub-samples per axis.

    Returns:
        float64 array of ``shape`` with values in ``[0, 1]``.
    """
    shape = tuple(int(s) for s in shape)
    if len(centre) != len(shape):
        raise ValueError(
            f"centre has {len(centre)} coordinates for a {len(shape)}-D grid."
        )
    if not radius > 0:
        raise ValueError(f"radius must be positive, got {radius}.")
    grids = np.meshgrid(*[np.arange(s, dtype=np.float64) for s in shape], indexing="ij")
    offsets = (np.arange(samples) + 0.5) / samples - 0.5
    count = np.zeros(shape)
    for off in itertools.product(offsets, repeat=len(shape)):
        r2 = sum((g + o - c) ** 2 for g, o, c in zip(grids, off, centre, strict=True))
        count += r2 <= radius * radius
    phi = count / samples ** len(shape)
    return phi if inside else 1.0 - phi
