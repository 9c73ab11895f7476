"""Observables: density, velocity, vorticity and momentum-exchange forces.

All functions are pure and jit-able; they read the state through its simulation,
so they decode the storage format and undo the DDF shift and the Guo half-force.
Values are in lattice units at time ``state.t``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from lbm_jax._boundaries import CellType
from lbm_jax._simulation import LBMState, Simulation

__all__ = ["density", "momentum_exchange_force", "velocity", "vorticity"]


def density(sim: Simulation, state: LBMState) -> jax.Array:
    """Density field, shape ``sim.shape``, in the compute dtype.

    >>> import lbm_jax
    >>> sim = lbm_jax.Simulation("D2Q9", (8, 8), tau=0.7)
    >>> float(lbm_jax.density(sim, sim.init(rho=1.5)).mean())
    1.5
    """
    return sim.fields(state)[0]


def velocity(
    sim: Simulation, state: LBMState, force: ArrayLike | None = None
) -> jax.Array:
    """Velocity field ``(D, *sim.shape)``: ``(sum_i c_i f_i - F/2) / rho``.

    The stored populations are post-collision, whose momentum is ``rho u + F/2``
    under Guo forcing; the half force is taken off so the result is the physical
    velocity of time step ``state.t``.

    Args:
        sim: The simulation.
        state: Its state.
        force: The body force of the step that produced ``state`` when it was
            passed to :meth:`Simulation.step` / :meth:`Simulation.advance`
            (``(D,)`` or ``(D, *shape)``); ``None`` means the construction force.
    """
    return sim.fields(state, force)[1]


def vorticity(u: ArrayLike) -> jax.Array:
    """Vorticity of a velocity field by second-order central differences.

    Differences wrap around periodically; values next to walls use the wall cells'
    velocities (their wall or boundary velocity).

    Args:
        u: Velocity ``(2, X, Y)`` or ``(3, X, Y, Z)``.

    Returns:
        ``(X, Y)`` scalar vorticity ``du_y/dx - du_x/dy`` in 2D, or the
        ``(3, X, Y, Z)`` curl in 3D.

    Raises:
        ValueError: If ``u`` is not a 2D or 3D velocity field.
    """
    u = jnp.asarray(u)
    if u.ndim not in (3, 4) or u.shape[0] != u.ndim - 1:
        raise ValueError(f"u must have shape (2, X, Y) or (3, X, Y, Z), got {u.shape}.")

    def ddx(a: jax.Array, axis: int) -> jax.Array:
        return 0.5 * (jnp.roll(a, -1, axis) - jnp.roll(a, 1, axis))

    if u.ndim == 3:
        return ddx(u[1], 0) - ddx(u[0], 1)
    return jnp.stack(
        [
            ddx(u[2], 1) - ddx(u[1], 2),
            ddx(u[0], 2) - ddx(u[2], 0),
            ddx(u[1], 0) - ddx(u[0], 1),
        ]
    )


def momentum_exchange_force(
    sim: Simulation, state: LBMState, mask: ArrayLike | None = None
) -> jax.Array:
    """Force exerted by the fluid on a solid body, by momentum exchange.

    Sums, over every link from a fluid cell ``x`` to a body cell ``x + c_i``, the
    momentum the bounced population carries into the wall and back:
    ``c_i (f*_i(x) + f_opp(i)(x, t+1))`` with ``f_opp = f*_i - 6 w_i (c_i . u_w)``
    (``u_w = 0`` except on ``WALL`` cells). This is the force per time step in
    lattice units acting during the step that follows ``state``.

    Args:
        sim: The simulation.
        state: Current state.
        mask: Boolean grid mask of the body; its cells must be ``SOLID`` or
            ``WALL``. Defaults to every ``SOLID`` and ``WALL`` cell.

    Returns:
        Force vector ``(D,)`` in the compute dtype.

    Raises:
        ValueError: If the mask does not match the grid or marks fluid cells.
    """
    ct = sim.cell_type
    wall_like = (ct == CellType.SOLID) | (ct == CellType.WALL)
    if mask is None:
        body = wall_like
    else:
        body = np.asarray(mask)
        if body.shape != sim.shape or body.dtype != np.bool_:
            raise ValueError(
                f"mask must be a boolean array of the grid shape {sim.shape}, got "
                f"{body.dtype} {body.shape}."
            )
        if np.any(body & ~wall_like):
            raise ValueError(
                "mask marks cells that are not SOLID or WALL; forces act on walls only."
            )
    lat = sim.lattice
    dtype = sim.storage.compute_dtype
    fluid = ct == CellType.FLUID
    axes = tuple(range(len(sim.shape)))
    moving_uw = sim.wall_velocity * (ct == CellType.WALL)
    links = []
    wall = []
    for ci, wi in zip(lat.c, lat.w, strict=True):
        back = tuple(-int(v) for v in ci)
        links.append(fluid & np.roll(body, back, axis=axes))
        uw_next = np.roll(moving_uw, back, axis=tuple(a + 1 for a in axes))
        wall.append(6.0 * wi * np.tensordot(ci.astype(np.float64), uw_next, axes=1))
    link = np.stack(links)
    c = lat.c.astype(np.float64)
    # host-side float64 part: the moving-wall terms and, for shifted storage, the
    # weights the stored values are offset by (kept out of the low-precision sum)
    constant = -np.where(link, np.stack(wall), 0.0).sum(axis=_grid_axes(len(axes))) @ c
    f = sim.populations(state, shifted=True)
    if sim.storage.shift:
        constant = constant + 2 * (lat.w * link.sum(axis=_grid_axes(len(axes)))) @ c
    per_dir = jnp.sum(jnp.where(link, 2 * f, 0), axis=_grid_axes(len(axes)))
    return per_dir @ c.astype(dtype) + constant.astype(dtype)


def _grid_axes(ndim: int) -> tuple[int, ...]:
    """Grid axes of a ``(Q, *grid)`` array."""
    return tuple(range(1, ndim + 1))
