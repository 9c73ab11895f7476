"""Boundary conditions from an integer cell-type mask.

Every cell of the grid has a :class:`CellType`. The simulation derives, once and in
NumPy, per-direction masks from it (which links of a fluid cell point at a wall) so
the compiled step only applies ``where`` selections:

* ``FLUID`` cells stream (pull) and collide. Periodic wrap-around applies wherever
  no other cell type intervenes.
* ``SOLID`` cells are resting walls: half-way bounce-back,
  ``f_i(x, t+1) = f*_opp(i)(x, t)`` for every link of a fluid cell ``x`` whose
  upstream neighbour ``x - c_i`` is solid.
* ``WALL`` cells are moving walls (Ladd): half-way bounce-back plus
  ``6 w_i rho_0 (c_i . u_w)`` with ``rho_0 = 1``, where ``u_w`` is the wall velocity.
* ``EQUILIBRIUM`` cells hold the equilibrium of a prescribed density and velocity
  (inlets, outlets, far field); fluid cells stream from them as from any cell.

Non-fluid cells are overwritten with fixed populations every step: resting
equilibrium for ``SOLID``, the equilibrium at the wall velocity for ``WALL``, and the
prescribed equilibrium for ``EQUILIBRIUM`` cells.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from lbm_jax.core._collision import equilibrium
from lbm_jax.core._lattice import Lattice
from lbm_jax.core._storage import StoragePolicy

__all__ = ["BoundaryData", "CellType", "build_boundary", "link_mask"]


class CellType(enum.IntEnum):
    """Cell types of the integer cell-type mask."""

    FLUID = 0
    SOLID = 1
    WALL = 2
    EQUILIBRIUM = 3


class BoundaryData(NamedTuple):
    """Arrays the compiled step needs for boundaries (``None`` when unused).

    Attributes:
        bounce: ``(Q, *grid)`` bool; link ``i`` of fluid cell ``x`` bounces back
            (``x - c_i`` is ``SOLID`` or ``WALL``).
        wall_term: ``(Q, *grid)`` compute dtype; moving-wall correction added to the
            bounced population, or ``None`` without moving walls.
        fixed_mask: ``(1, *grid)`` bool; the cell is not fluid.
        fixed: ``(Q, *grid)`` storage dtype; encoded populations of non-fluid cells.
    """

    bounce: jax.Array | None
    wall_term: jax.Array | None
    fixed_mask: jax.Array | None
    fixed: jax.Array | None


def link_mask(lattice: Lattice, target: np.ndarray, source: np.ndarray) -> np.ndarray:
    """Per-direction mask: cell ``x`` is in ``target`` and ``x - c_i`` in ``source``.

    Args:
        lattice: Velocity set.
        target: Boolean grid mask of the cells receiving populations.
        source: Boolean grid mask of the upstream cells.

    Returns:
        Boolean array ``(Q, *grid)``, periodic in every axis.
    """
    axes = tuple(range(target.ndim))
    return np.stack(
        [
            target & np.roll(source, tuple(int(v) for v in ci), axis=axes)
            for ci in lattice.c
        ]
    )


def build_boundary(
    lattice: Lattice,
    storage: StoragePolicy,
    cell_type: np.ndarray,
    wall_velocity: np.ndarray | jax.Array,
    boundary_density: np.ndarray | jax.Array,
    boundary_velocity: np.ndarray | jax.Array,
    *,
    moving_walls: bool | None = None,
) -> BoundaryData:
    """Derive the boundary arrays from validated inputs.

    Host (NumPy) values are combined in float64 and rounded once to the compute
    dtype; JAX values (traced ones among them: a wall velocity to differentiate
    by) in their own dtype, so derivatives flow from them into the arrays.

    Args:
        lattice: Velocity set.
        storage: Storage policy (for encoding and the shift).
        cell_type: Integer grid of :class:`CellType` codes.
        wall_velocity: ``(D, *grid)`` wall velocity (used on ``WALL`` cells).
        boundary_density: Grid-shaped density (used on ``EQUILIBRIUM`` cells).
        boundary_velocity: ``(D, *grid)`` velocity (used on ``EQUILIBRIUM`` cells).
        moving_walls: Whether to build the moving-wall term; ``None`` builds it
            where a ``WALL`` cell has a nonzero host wall velocity.
    """
    dtype = storage.compute_dtype
    arrays = (wall_velocity, boundary_density, boundary_velocity)
    xp = np if all(isinstance(a, np.ndarray) for a in arrays) else jnp
    fluid = cell_type == CellType.FLUID
    solid_like = (cell_type == CellType.SOLID) | (cell_type == CellType.WALL)
    moving = cell_type == CellType.WALL
    if fluid.all():
        return BoundaryData(None, None, None, None)
    bounce = link_mask(lattice, fluid, solid_like)
    if moving_walls is None:
        moving_walls = bool(moving.any()) and bool(np.any(wall_velocity[:, moving]))
    wall_term = None
    if moving_walls:
        axes = tuple(range(1, cell_type.ndim + 1))
        real = wall_velocity.dtype  # masks and constants in it: no promotion
        terms = []
        for i, ci in enumerate(lattice.c):
            shift = tuple(int(v) for v in ci)
            uw = xp.roll(wall_velocity * moving[None].astype(real), shift, axis=axes)
            cu = xp.tensordot(ci.astype(real), uw, axes=1)
            terms.append(float(6.0 * lattice.w[i]) * cu * fluid.astype(real))
        wall_term = jnp.asarray(xp.stack(terms).astype(dtype))
    rho = xp.where(cell_type == CellType.EQUILIBRIUM, boundary_density, 1.0)
    u = xp.where(
        (cell_type == CellType.EQUILIBRIUM)[None],
        boundary_velocity,
        xp.where(moving[None], wall_velocity, 0.0),
    )
    feq = equilibrium(
        lattice,
        jnp.asarray(rho.astype(dtype)),
        [jnp.asarray(ua.astype(dtype)) for ua in u],
        shift=storage.shift,
    )
    return BoundaryData(
        bounce=jnp.asarray(bounce),
        wall_term=wall_term,
        fixed_mask=jnp.asarray(~fluid[None]),
        fixed=storage.encode(feq),
    )
