"""Observables and theory of free-surface flows (host-side NumPy, plus jit-able maps).

* :func:`surface_maps`: per column of cells along the vertical (last) axis, the
  height of the highest liquid cell and the depth of the liquid layer resting on
  the floor (jit-able; cheap to sample during a run);
* :func:`crown`: crown radius and height and cavity depth of a drop impact from
  those maps;
* :func:`count_droplets`: connected liquid bodies apart from the largest;
* :func:`damped_oscillation`: frequency and damping rate of a sampled signal
  (Prony's method);
* :func:`lamb_mode`: the normal mode of a viscous capillary-gravity wave on a
  free surface (Lamb's dispersion relation).
"""

from __future__ import annotations

import cmath
import math
from typing import Any

import jax.numpy as jnp
import numpy as np

__all__ = [
    "count_droplets",
    "crown",
    "damped_oscillation",
    "lamb_mode",
    "power_law",
    "surface_maps",
]


def surface_maps(phi: Any, floor: int = 1) -> tuple[Any, Any]:
    """Surface height and floor-layer height per vertical column (jit-able).

    Heights are positions on the vertical axis, cell ``z`` spanning
    ``[z - 1/2, z + 1/2]``.

    Args:
        phi: Fill level ``(X, Z)`` or ``(X, Y, Z)``, vertical axis last.
        floor: Index of the first cell above the floor (1 above a wall layer).

    Returns:
        ``(top, layer)``: ``top`` is ``z - 1/2 + phi`` of the highest cell with
        ``phi >= 1/2`` (the free surface at cell resolution; the floor,
        ``floor - 1/2``, where the column is empty); ``layer`` is the top of the
        run of consecutive cells with ``phi >= 1/2`` from ``floor`` upwards (the
        liquid resting on the floor, so a cavity shows as a dip). Both have the
        grid's shape without its last axis, in the dtype of ``phi``.
    """
    phi = jnp.asarray(phi)
    z = jnp.arange(phi.shape[-1], dtype=phi.dtype).reshape(
        (1,) * (phi.ndim - 1) + (-1,)
    )
    wet = phi >= 0.5
    base = floor - 0.5
    top = jnp.max(jnp.where(wet, z - 0.5 + phi, base), axis=-1)
    run = jnp.cumprod(wet[..., floor:].astype(phi.dtype), axis=-1)
    return top, base + jnp.sum(run, axis=-1)


def crown(
    top: np.ndarray,
    layer: np.ndarray,
    centre: tuple[float, ...],
    level: float,
    diameter: float,
    ceiling: float | None = None,
) -> dict[str, float]:
    """Crown radius and height and cavity depth from one pair of surface maps.

    Args:
        top: Top-height map from :func:`surface_maps`, ``(X,)`` or ``(X, Y)``.
        layer: Floor-layer map from :func:`surface_maps`.
        centre: Impact point (the horizontal coordinates of the drop's axis).
        level: Undisturbed pool surface height (in the units of ``top``).
        diameter: Drop diameter in cells.
        ceiling: Height of the box's ceiling (its wall's face), if it has one.

    Returns:
        ``crown_height`` (highest liquid outside the drop's radius above the
        pool level), ``crown_radius`` (horizontal distance from the axis of that
        highest point: the rim; NaN while no crown stands one cell high, and
        once liquid fills half the cell under the ``ceiling``: the highest
        point is then wherever the splash meets the ceiling, not the rim),
        ``cavity_depth`` (pool level minus the lowest floor-layer height within
        a quarter diameter of the axis) and ``at_ceiling`` (1.0 when liquid
        outside the drop's radius reaches the cell under the ceiling, else 0.0).
    """
    top = np.asarray(top, np.float64)
    layer = np.asarray(layer, np.float64)
    grids = np.meshgrid(
        *[np.arange(s, dtype=np.float64) for s in top.shape], indexing="ij"
    )
    r = np.sqrt(sum((g - c) ** 2 for g, c in zip(grids, centre, strict=True)))
    outside = r > 0.5 * diameter
    height = top - level
    if np.any(outside):
        idx = np.argmax(np.where(outside, height, -np.inf))
        crown_height = float(height.flat[idx])
        crown_radius = float(r.flat[idx])
    else:
        crown_height, crown_radius = 0.0, 0.0
    near = r <= max(0.25 * diameter, 1.0)
    cavity = float(level - layer[near].min()) if np.any(near) else 0.0
    # top > ceiling - 1: the cell under the ceiling at least half full
    at_ceiling = ceiling is not None and crown_height + level > ceiling - 1.0
    rim = crown_height >= 1.0 and not at_ceiling  # a crown a cell above the pool
    return {
        "crown_height": max(crown_height, 0.0),
        "crown_radius": crown_radius if rim else math.nan,
        "cavity_depth": max(cavity, 0.0),
        "at_ceiling": float(at_ceiling),
    }


def count_droplets(liquid: np.ndarray) -> int:
    """Number of connected liquid bodies apart from the largest one.

    Cells connect across faces (4- or 6-connectivity), periodically in every
    axis; labels spread by repeated neighbour maxima until nothing changes.
    """
    liquid = np.asarray(liquid, bool)
    labels = np.where(liquid, np.arange(1, liquid.size + 1).reshape(liquid.shape), 0)
    while True:
        new = labels.copy()
        for ax in range(liquid.ndim):
            for s in (1, -1):
                new = np.maximum(new, np.roll(labels, s, ax))
        new = np.where(liquid, new, 0)
        if np.array_equal(new, labels):
            break
        labels = new
    sizes = np.unique(labels[liquid], return_counts=True)[1]
    return max(int(sizes.size) - 1, 0)


def damped_oscillation(t: np.ndarray, a: np.ndarray) -> dict[str, float]:
    """Angular frequency and damping rate of ``c + A exp(-g t) cos(w t + p)``.

    Prony's method on uniformly spaced samples: a linear prediction of order 3
    (modes 1, ``z`` and its conjugate) by least squares; the complex root
    ``z = exp((-g + i w) dt)`` gives ``w`` and ``g``.

    Returns:
        ``{"frequency": w, "damping": g}`` per unit of ``t``.

    Raises:
        ValueError: Fewer than 8 samples, uneven spacing or no oscillation.
    """
    t = np.asarray(t, np.float64)
    a = np.asarray(a, np.float64)
    if t.size < 8:
        raise ValueError(
            f"need at least 8 samples to fit an oscillation, got {t.size}."
        )
    dt = np.diff(t)
    if not np.allclose(dt, dt[0]):
        raise ValueError("samples must be evenly spaced in time.")
    rows = np.stack([a[2:-1], a[1:-2], a[:-3]], axis=1)
    coef, _, rank, _ = np.linalg.lstsq(rows, a[3:], rcond=None)
    if rank < 2:  # a pure decay (or constant): no conjugate pair to find
        raise ValueError("the signal does not oscillate.")
    roots = np.roots([1.0, -coef[0], -coef[1], -coef[2]])
    z = roots[np.argmax(roots.imag)]
    if z.imag <= 0:
        raise ValueError("the signal does not oscillate.")
    s = cmath.log(z) / dt[0]
    return {"frequency": float(s.imag), "damping": float(-s.real)}


def lamb_mode(
    k: float, nu: float, sigma: float, gravity: float = 0.0, depth: float = math.inf
) -> dict[str, float]:
    """Normal mode of a small viscous capillary-gravity wave on a free surface.

    Lamb's dispersion relation for a free surface (no upper fluid, density 1),
    ``(s + 2 nu k^2)^2 + w0^2 = 4 nu^2 k^3 sqrt(k^2 + s / nu)``, with
    ``w0^2 = (sigma k^3 + g k) tanh(k h)`` (finite depth enters only through
    ``w0``), solved by Newton's method from the small-viscosity estimate
    ``s = -2 nu k^2 + i w0``; the amplitude goes as ``exp(s t)``.

    Returns:
        ``frequency`` (``Im s``), ``damping`` (``-Re s``), and ``omega0``.

    >>> mode = lamb_mode(2 * math.pi / 50, 1 / 54, 0.02765, depth=25)
    >>> round(mode["omega0"], 5)
    0.00739
    """
    w0 = math.sqrt((sigma * k**3 + gravity * k) * math.tanh(k * depth))
    e = nu * k * k
    s = complex(-2 * e, w0)
    for _ in range(100):
        m = cmath.sqrt(k * k + s / nu)
        f = (s + 2 * e) ** 2 + w0 * w0 - 4 * nu * nu * k**3 * m
        df = 2 * (s + 2 * e) - 2 * nu * k**3 / m
        step = f / df
        s -= step
        if abs(step) < 1e-15 * max(abs(s), 1e-300):
            break
    return {"frequency": s.imag, "damping": -s.real, "omega0": w0}


def power_law(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least-squares fit of ``y = c x^p`` in log-log: ``(p, c)``."""
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    keep = (x > 0) & (y > 0)
    if keep.sum() < 2:
        return math.nan, math.nan
    p, logc = np.polyfit(np.log(x[keep]), np.log(y[keep]), 1)
    return float(p), float(math.exp(logc))
