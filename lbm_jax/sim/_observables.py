"""Observables: density, velocity, vorticity and momentum-exchange forces.

All functions are pure and jit-able; they read the state through its simulation,
so they decode the storage format and undo the DDF shift and the Guo half-force.
Values are in lattice units at time ``state.t``. Each is computed slab by slab
inside one compiled loop (:mod:`lbm_jax.sim._slabs`): a call holds the state and its
output, never a decoded full-precision copy of the state.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from lbm_jax.core._boundaries import CellType
from lbm_jax.sim._simulation import LBMState, Simulation
from lbm_jax.sim._slabs import curl, fields, link_sums, mesh_of

__all__ = ["density", "momentum_exchange_force", "velocity", "vorticity"]


def density(sim: Simulation, state: LBMState) -> jax.Array:
    """Density field, shape ``sim.shape``, in the compute dtype.

    >>> import lbm_jax
    >>> sim = lbm_jax.Simulation("D2Q9", (8, 8), tau=0.7)
    >>> float(lbm_jax.density(sim, sim.init(rho=1.5)).mean())
    1.5
    """
    sim.check_state(state)
    return fields(sim, state.f, None, which="density")[0]


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
    return sim.fields(state, force, which="velocity")[1]


def vorticity(u: ArrayLike) -> jax.Array:
    """Vorticity of a velocity field by second-order central differences.

    Differences wrap around periodically; values next to walls use the wall cells'
    velocities (their wall or boundary velocity). Computed slab by slab in one
    compiled loop; a field split over devices stays split.

    Args:
        u: Velocity ``(2, X, Y)`` or ``(3, X, Y, Z)``.

    Returns:
        ``(X, Y)`` scalar vorticity ``du_y/dx - du_x/dy`` in 2D, or the
        ``(3, X, Y, Z)`` curl in 3D.

    Raises:
        ValueError: If ``u`` is not a 2D or 3D velocity field.
    """
    if not isinstance(u, jax.Array):
        u = jnp.asarray(u)
    if u.ndim not in (3, 4) or u.shape[0] != u.ndim - 1:
        raise ValueError(f"u must have shape (2, X, Y) or (3, X, Y, Z), got {u.shape}.")
    return curl(u, mesh=mesh_of(u))


def momentum_exchange_force(
    sim: Simulation, state: LBMState, mask: ArrayLike | None = None
) -> jax.Array:
    """Force exerted by the fluid on a solid body, by momentum exchange.

    Sums, over every link from a fluid cell ``x`` to a body cell ``x + c_i``, the
    momentum the bounced population carries into the wall and back:
    ``c_i (f*_i(x) + f_opp(i)(x, t+1))`` with ``f_opp = f*_i - 6 w_i (c_i . u_w)``
    (``u_w = 0`` except on ``WALL`` cells). This is the force per time step in
    lattice units acting during the step that follows ``state``.

    The populations are summed slab by slab on the device; the moving-wall terms
    and, for shifted storage, the weights the stored values are offset by are
    summed on the host in float64 (kept out of the low-precision sum).

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
    wall_like = _of_type(ct, CellType.SOLID, CellType.WALL)
    if mask is None:
        body = wall_like
    else:
        body = np.asarray(mask)
        if body.shape != sim.shape or body.dtype != np.bool_:
            raise ValueError(
                f"mask must be a boolean array of the grid shape {sim.shape}, got "
                f"{body.dtype} {body.shape}."
            )
        if np.any(body > wall_like):
            raise ValueError(
                "mask marks cells that are not SOLID or WALL; forces act on walls only."
            )
    sim.check_state(state)
    lat = sim.lattice
    dtype = sim.storage.compute_dtype
    c = lat.c.astype(np.float64)
    sums = link_sums(
        sim, state.f, jnp.asarray(ct), None if mask is None else jnp.asarray(body)
    )
    # host-side float64 part (static: it depends on the masks only), one direction
    # at a time: for shifted storage, the weights the stored values are offset by
    # (kept out of the low-precision sum), and the moving-wall terms, summed over
    # the body's WALL cells y, whose links come from the fluid cells y - c_i
    fluid = _of_type(ct, CellType.FLUID)
    axes = tuple(range(len(sim.shape)))
    moving = _of_type(ct, CellType.WALL)
    moving = np.nonzero(np.logical_and(moving, body, out=moving))
    uw = sim.wall_velocity[(slice(None), *moving)]
    constant = np.zeros(lat.d)
    for ci, wi, cf in zip(lat.c, lat.w, c, strict=True):
        if sim.storage.shift:
            links = np.roll(body, tuple(-int(v) for v in ci), axis=axes)
            count = np.count_nonzero(np.logical_and(links, fluid, out=links))
            constant += 2 * wi * count * cf
        if moving[0].size:
            source = tuple(
                (idx - int(v)) % n
                for idx, v, n in zip(moving, ci, sim.shape, strict=True)
            )
            constant -= 6.0 * wi * np.sum(fluid[source] * (cf @ uw)) * cf
    return sums @ c.astype(dtype) + constant.astype(dtype)


def _of_type(cell_type: np.ndarray, *codes: CellType) -> np.ndarray:
    """Boolean grid of the cells of the given types (one grid-sized array)."""
    table = np.zeros(256, bool)
    table[[int(code) for code in codes]] = True
    return table[cell_type.view(np.uint8)]
