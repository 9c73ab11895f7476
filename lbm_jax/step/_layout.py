"""The population layout of the step backends, and the slab-size rule.

Populations live in the layout ``(X, Q, *rest)`` (``rest`` = ``(Y,)`` or
``(Y, Z)``) between steps: one x-plane holds every direction, so the moments of a
plane stay in cache while a step walks over its directions, and for one
direction a grid row along the last axis is contiguous (coalesced on a GPU).
Every backend of :mod:`lbm_jax.step` keeps this layout; the read-outs, the
decomposition and the free surface convert with :func:`to_layout` and
:func:`from_layout` and tile with :func:`planes_per_slab`, never with a layout
rule of their own.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lbm_jax.core._lattice import Lattice

__all__ = [
    "MAX_SLAB",
    "SLAB_BYTES",
    "Halos",
    "default_slab",
    "from_layout",
    "planes_per_slab",
    "to_layout",
    "x_ghost_planes",
]

#: Ghost layers of a sub-domain, one entry per grid axis: ``None`` (periodic
#: within the block) or ``(low, high)`` (see :func:`make_step_into`).
Halos = tuple[tuple[jax.Array, jax.Array] | None, ...]

#: Slab size target: the decoded slab (B planes x Q x rest, compute dtype) should
#: stay within about this many bytes so every pass over it hits cache (on a CPU;
#: small next to any state on an accelerator).
SLAB_BYTES = 3 * 2**19
#: Most x-planes in one slab.
MAX_SLAB = 64


def planes_per_slab(nx: int, plane_bytes: int, *, divisor: bool = False) -> int:
    """x-planes per slab: the one slab-size rule of the step and the read-outs.

    As many planes of ``plane_bytes`` as fit in :data:`SLAB_BYTES`, at least 1 and
    at most :data:`MAX_SLAB` and ``nx``; with ``divisor``, the largest divisor of
    ``nx`` within that, so that slabs tile the grid exactly (sums count each plane
    once; the step's last slab may overlap instead).

    >>> planes_per_slab(100, 2**16), planes_per_slab(100, 2**16, divisor=True)
    (24, 20)
    """
    limit = max(1, min(MAX_SLAB, nx, SLAB_BYTES // max(plane_bytes, 1)))
    if not divisor:
        return limit
    return max(b for b in range(1, limit + 1) if nx % b == 0)


def to_layout(a: jax.Array) -> jax.Array:
    """``(Q, X, ...)`` -> population layout ``(X, Q, ...)``."""
    return jnp.moveaxis(a, 0, 1)


def from_layout(a: jax.Array) -> jax.Array:
    """Kernel layout ``(X, Q, ...)`` -> ``(Q, X, ...)``."""
    return jnp.moveaxis(a, 1, 0)


def default_slab(lattice: Lattice, shape: tuple[int, ...], itemsize: int) -> int:
    """Number of x-planes per slab for a grid (at least 1, at most X).

    On CPUs the slab is sized for cache; on accelerators, which run one kernel
    over the whole grid in parallel, a single slab covers the grid.
    """
    if jax.default_backend() != "cpu":
        return int(shape[0])
    plane = lattice.q * int(np.prod(shape[1:])) * itemsize
    return planes_per_slab(int(shape[0]), plane)


def x_ghost_planes(halos: Any, d: int, step: str) -> tuple[jax.Array, jax.Array] | None:
    """The x ghost planes of ``halos`` for a step that exchanges x planes only.

    ``halos`` is ``None`` (periodic in x), a ``(low, high)`` pair of x planes, or
    one entry per grid axis (see :func:`make_step_into`) of which only x may carry
    ghosts.

    Raises:
        ValueError: Ghost layers along y or z (``step`` names the step that
            cannot take them).
    """
    if halos is None:
        return None
    if isinstance(halos[0], jax.Array):
        return halos
    if len(halos) != d or any(h is not None for h in halos[1:]):
        raise ValueError(
            f"the {step} supports grids split along x only; got ghost layers "
            "along y or z (use the XLA step for such a decomposition)."
        )
    return halos[0]
