"""A simulation's state construction and read-outs, with their input checks.

The slab-wise, compiled work is :mod:`lbm_jax.sim._slabs`'; here are the host-side
parts a :class:`~lbm_jax.Simulation` adds around it: the check that a state
belongs to the simulation, the checked initial density and velocity, the
force whose Guo half-force a read-out takes off, and a state re-encoded for
another storage.
"""

from __future__ import annotations

from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from lbm_jax.core._collision import direction_constants
from lbm_jax.core._validation import (
    check_density,
    check_speed,
    is_traced,
    traced_field,
    vector_field,
    vector_or_field,
)
from lbm_jax.sim import _slabs
from lbm_jax.sim._config import StepArrays, host_force
from lbm_jax.step._layout import to_layout

__all__ = [
    "Readable",
    "check_state",
    "converted_populations",
    "initial_populations",
    "readout_force",
]


class Readable(_slabs.Grid, Protocol):
    """What the read-outs read from a simulation, beyond its grid."""

    @property
    def force(self) -> np.ndarray | None: ...


def check_state(sim: Readable, state: Any) -> None:
    """Raise unless ``state`` holds populations of ``sim``'s layout.

    Uses static shapes and dtypes only, so it runs on the host for concrete
    and traced states alike.

    Raises:
        TypeError: Not a state (no populations ``f``).
        ValueError: Populations of another shape, lattice or storage.
    """
    f = getattr(state, "f", None)
    if not hasattr(f, "shape") or not hasattr(f, "dtype"):
        raise TypeError(
            f"state must be an LBMState of this simulation, got "
            f"{type(state).__name__}; build one with sim.init()."
        )
    shape = (sim.shape[0], sim.lattice.q, *sim.shape[1:])
    dtype = sim.storage.storage_dtype
    if tuple(f.shape) != shape or np.dtype(f.dtype) != dtype:
        raise ValueError(
            f"state does not belong to this simulation: its populations have "
            f"shape {tuple(f.shape)} and dtype {np.dtype(f.dtype)}, but {sim!r} "
            f"stores shape {shape} and dtype {dtype}; read a state with the "
            "Simulation that made it (or build one with sim.init())."
        )


def readout_force(
    sim: Readable, arrays: StepArrays, force: ArrayLike | None
) -> jax.Array | None:
    """The force of the step that produced a state, in the compute dtype: the
    given one, else the simulation's own (its field among ``arrays``, or its
    construction vector), or ``None`` without a force."""
    dtype = sim.storage.compute_dtype
    if force is not None:
        return arrays.with_force(force, sim.shape, dtype).force
    if arrays.force is not None:
        return arrays.force
    if sim.force is not None:
        return jnp.asarray(sim.force.astype(dtype))
    return None


def initial_populations(
    sim: Readable,
    arrays: StepArrays,
    rho: ArrayLike,
    u: ArrayLike | None,
    force: ArrayLike | None,
) -> jax.Array:
    """The stored equilibrium populations of ``rho`` and ``u`` (see
    :meth:`Simulation.init <lbm_jax.Simulation.init>`), with the Guo half-force
    of ``force`` (or of the simulation's own force).

    Traced values (inside ``jax.grad``, ``jax.vmap``, ...) are checked for
    shape and dtype only: their values are not known until the program runs.

    Raises:
        ValueError: Shapes that do not fit the grid, non-positive density or a
            velocity above the low-Mach limit.
    """
    lat, shape = sim.lattice, sim.shape
    dtype = sim.storage.compute_dtype
    if is_traced((rho, u, force)):
        r, uu = _traced_fields(lat.d, shape, rho, u, dtype)
        fv = readout_force(sim, arrays, force)
        bnd = arrays.boundary
        return _slabs.init_state(sim, r, uu, fv, bnd.fixed_mask, bnd.fixed)
    # uniform values stay scalars/vectors: no grid-sized host temporaries
    r = check_density("rho", rho, () if np.ndim(rho) == 0 else shape)
    if u is None or np.shape(u) == (lat.d,):
        uu = vector_field("u", u, lat.d, (1,) * len(shape))
        check_speed("initial velocity u", uu)
        uu = uu.reshape(lat.d)
    else:
        uu = vector_field("u", u, lat.d, shape)
        check_speed("initial velocity u", uu)
    # post-collision momentum is rho u + F/2 (Guo)
    given = None if force is None else host_force(force, lat.d, shape)
    fv = readout_force(sim, arrays, given)
    bnd = arrays.boundary
    return _slabs.init_state(
        sim,
        jnp.asarray(r.astype(dtype)),
        jnp.asarray(uu.astype(dtype)),
        fv,
        bnd.fixed_mask,
        bnd.fixed,
    )


def _traced_fields(
    d: int, shape: tuple[int, ...], rho: ArrayLike, u: ArrayLike | None, dtype: Any
) -> tuple[jax.Array, jax.Array]:
    """Density and velocity of a traced :func:`initial_populations` call, their
    shapes and dtypes checked."""
    r = traced_field("rho", rho, ((), shape), f"a scalar or of shape {shape}")
    if u is None:
        return r.astype(dtype), jnp.zeros(d, dtype)
    uu = traced_field("u", u, ((d,), (d, *shape)), vector_or_field(d, shape))
    return r.astype(dtype), uu.astype(dtype)


def converted_populations(sim: Readable, source: Readable, f: jax.Array) -> jax.Array:
    """``source``'s stored populations ``f`` in ``sim``'s storage (population layout):
    decoded by ``source``'s format, shifted or unshifted as ``sim`` stores them,
    encoded by ``sim``'s format (one rounding). Same lattice and grid.

    Raises:
        ValueError: Simulations of different lattices or grids.
    """
    if source.lattice.name != sim.lattice.name or source.shape != sim.shape:
        raise ValueError(
            f"a state converts between simulations of one lattice and grid; the "
            f"source has {source.lattice.name} {source.shape}, this one "
            f"{sim.lattice.name} {sim.shape}."
        )
    pol = sim.storage
    values = _slabs.populations(source, f, shifted=pol.shift)
    values = values.astype(pol.compute_dtype)
    if pol.shift and not source.storage.shift:
        values = (
            values
            - direction_constants(sim.lattice, pol.compute_dtype, len(sim.shape))[0]
        )
    return pol.encode(to_layout(values))
