"""Interface curvature from a fill field; exact fill fields of circles and spheres.

Two methods, chosen by :func:`curvature`'s ``method``:

* ``"smoothed"`` (the default; DESIGN's finite-difference alternative to a PLIC
  paraboloid fit): the fill level is smoothed ``passes`` times with the separable
  binomial filter ``[1/4, 1/2, 1/4]``; the normal ``n = grad(phi_s) /
  |grad(phi_s)|`` comes from central differences smoothed across the other axes
  (a Parker-Youngs-like isotropic stencil) and ``kappa = div(n) / (D - 1)``.
* ``"height"``: the height function (Cummins, Francois & Kothe 2005; Popinet
  2009) with the smoothed curvature as its fallback. Along the axis ``a`` where
  ``|n_a|`` is largest, the column sums ``h = sum_{k=-3..3} phi(x + k e_a)`` of
  the cell and its neighbours across ``a`` (3 columns in 2-D, 3 x 3 in 3-D)
  locate the interface to second order; the curvature of that height profile is
  ``h'' / (1 + h'^2)^{3/2}`` in 2-D and the mean curvature of the Monge patch,
  ``(h_xx (1 + h_y^2) + h_yy (1 + h_x^2) - 2 h_xy h_x h_y) / (2 (1 + h_x^2 +
  h_y^2)^{3/2})``, in 3-D, by central differences. Where a column is not
  consistent (its end cells are not one full and one empty: the interface leaves
  the 7-cell window, as on small or strongly bent drops) the smoothed curvature
  stands in.

``n`` points into the liquid, so ``kappa`` is negative for a drop: ``-1/R`` for a
circle or sphere of radius ``R``, zero for a flat surface. Measured on exact fill
fields (:func:`sphere_fill` with 64 samples per axis in 2-D, 16 in 3-D; the mean
of ``kappa R`` over the interface cells, centred and off-grid): ``"smoothed"``
within 2 % of ``-1`` at ``R = 4`` (2-D) and 4 % (3-D), within 1 % at ``R >= 10``,
with a cell-to-cell scatter of 4-10 %; ``"height"`` within 3 % at ``R = 4`` and
within 1 % at ``R >= 8``. On a small-amplitude wave (wavelength 50, amplitude
0.5) the smoothing shortens the curvature by 6 %; the heights are within 0.5 %.
All operations are whole-array and periodic; cells the caller marks as solid
take the mean fill of their non-solid axis neighbours first (a zero-gradient
wall).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

__all__ = ["METHODS", "curvature", "sphere_fill"]

#: Largest ``|kappa|`` (per cell) the model uses; a curvature radius below one cell is
#: not resolved.
MAX_CURVATURE = 1.0


def _smooth(a: jax.Array, axes: Sequence[int]) -> jax.Array:
    for ax in axes:
        a = 0.25 * (jnp.roll(a, 1, ax) + jnp.roll(a, -1, ax)) + 0.5 * a
    return a


def _ddx(a: jax.Array, axis: int) -> jax.Array:
    return 0.5 * (jnp.roll(a, -1, axis) - jnp.roll(a, 1, axis))


#: Half the height of a height-function column (7 cells).
HEIGHT_HALF = 3


def _shift(a: jax.Array, offsets: dict[int, int]) -> jax.Array:
    """``a(x + offsets)``: the value ``offsets[axis]`` cells along each axis."""
    for ax, k in offsets.items():
        a = jnp.roll(a, -k, ax)
    return a


def _height_curvature(phi: jax.Array, axis: int) -> tuple[jax.Array, jax.Array]:
    """Curvature from the column heights along ``axis`` and where it is valid.

    Returns:
        ``(kappa, consistent)``: the mean curvature of the height profile
        (negative for a drop) and the cells whose columns, and those of their
        neighbours across ``axis``, each hold the interface (one end cell full,
        the other empty).
    """
    axes = [b for b in range(phi.ndim) if b != axis]
    span = range(-HEIGHT_HALF, HEIGHT_HALF + 1)
    h = sum(_shift(phi, {axis: k}) for k in span)
    low, high = _shift(phi, {axis: -HEIGHT_HALF}), _shift(phi, {axis: HEIGHT_HALF})
    column = ((low >= 1) & (high <= 0)) | ((low <= 0) & (high >= 1))
    consistent = column
    for offsets in itertools.product((-1, 0, 1), repeat=len(axes)):
        if any(offsets):
            consistent &= _shift(column, dict(zip(axes, offsets, strict=True)))
    slope = [0.5 * (_shift(h, {b: 1}) - _shift(h, {b: -1})) for b in axes]
    bend = [_shift(h, {b: 1}) - 2 * h + _shift(h, {b: -1}) for b in axes]
    if len(axes) == 1:
        (hx,), (hxx,) = slope, bend
        return hxx / (1 + hx * hx) ** 1.5, consistent
    (hx, hy), (hxx, hyy) = slope, bend
    b, c = axes
    hxy = 0.25 * (
        _shift(h, {b: 1, c: 1})
        - _shift(h, {b: 1, c: -1})
        - _shift(h, {b: -1, c: 1})
        + _shift(h, {b: -1, c: -1})
    )
    top = hxx * (1 + hy * hy) + hyy * (1 + hx * hx) - 2 * hxy * hx * hy
    return top / (2 * (1 + hx * hx + hy * hy) ** 1.5), consistent


#: Curvature methods of :func:`curvature`.
METHODS = ("smoothed", "height")


def curvature(
    phi: ArrayLike,
    solid: ArrayLike | None = None,
    *,
    passes: int = 2,
    method: str = "smoothed",
) -> jax.Array:
    """Mean curvature of the fill field's interface, per cell (jit-able).

    Args:
        phi: Fill level in ``[0, 1]``, shape ``(X, Y)`` or ``(X, Y, Z)``.
        solid: Optional boolean mask of solid cells; they take the mean fill of
            their non-solid axis neighbours first.
        passes: Smoothing passes of the fill field for the normal and the
            smoothed curvature (2 balances the mean error on small drops
            against the scatter on coarse interfaces).
        method: ``"smoothed"`` (the divergence of the smoothed field's normal)
            or ``"height"`` (height functions, the smoothed curvature where a
            column does not hold the interface); see the module docstring.

    Returns:
        ``kappa`` with ``phi``'s shape, clamped to ``|kappa| <= 1``: ``-1/R`` on a
        drop of radius ``R`` (only meaningful on interface cells).

    Raises:
        ValueError: ``phi`` neither 2-D nor 3-D, or an unknown ``method``.
    """
    phi = jnp.asarray(phi)
    if phi.ndim not in (2, 3):
        raise ValueError(f"phi must be 2-D or 3-D, got shape {phi.shape}.")
    if method not in METHODS:
        raise ValueError(f"Unknown curvature method {method!r}; expected {METHODS}.")
    axes = tuple(range(phi.ndim))
    if solid is not None:
        solid = jnp.asarray(solid, bool)
        open_ = (~solid).astype(phi.dtype)
        total = sum(jnp.roll(phi * open_, s, ax) for ax in axes for s in (1, -1))
        count = sum(jnp.roll(open_, s, ax) for ax in axes for s in (1, -1))
        phi = jnp.where(solid, total / jnp.maximum(count, 1), phi)
    smooth = phi
    for _ in range(passes):
        smooth = _smooth(smooth, axes)
    grad = [_smooth(_ddx(smooth, a), [b for b in axes if b != a]) for a in axes]
    norm = jnp.sqrt(sum(g * g for g in grad))
    tiny = jnp.asarray(1e-12, phi.dtype)
    normal = [g / jnp.maximum(norm, tiny) for g in grad]
    kappa = sum(_ddx(n, a) for n, a in zip(normal, axes, strict=True))
    kappa = kappa / (phi.ndim - 1)
    if method == "height":
        dominant = jnp.argmax(jnp.stack([jnp.abs(g) for g in grad]), axis=0)
        for a in axes:
            height, consistent = _height_curvature(phi, a)
            kappa = jnp.where((dominant == a) & consistent, height, kappa)
    return jnp.clip(kappa, -MAX_CURVATURE, MAX_CURVATURE)


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
