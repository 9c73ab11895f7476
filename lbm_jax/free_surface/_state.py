"""The free-surface model's state, cell flags and the array helpers its steps share.

The flags, the fill margin and the state are used by the model
(:mod:`lbm_jax.free_surface._model`) and by its XLA step
(:mod:`lbm_jax.free_surface._xla_step`); the native step
(``lbm_jax/step/_native/lbm_free_surface.cc``) uses the same flag values.
"""

from __future__ import annotations

import enum
import itertools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from lbm_jax.sim._simulation import LBMState

__all__ = [
    "FILL_MARGIN",
    "Flag",
    "FreeSurfaceState",
    "double_add",
    "fill_level",
    "is_liquid",
    "materialise",
    "neighbour_sum",
    "two_sum",
]

#: Relative overfill at which an interface cell converts to fluid.
FILL_MARGIN = 1e-3


class Flag(enum.IntEnum):
    """Cell types of the free-surface model."""

    GAS = 0
    INTERFACE = 1
    FLUID = 2
    SOLID = 3


class FreeSurfaceState(NamedTuple):
    """State of a free-surface flow (a pytree of arrays).

    Attributes:
        fluid: Populations and step counter (the populations of gas cells are
            meaningless).
        mass: Liquid mass per cell, compute dtype, grid-shaped.
        flags: :class:`Flag` per cell, ``int8``, grid-shaped.
        carry: Round-off of the mass updates, carried by compensated summation
            (Kahan's TwoSum): the mass of a cell is ``mass + carry``. Without it
            a float32 mass loses the small exchanges of nearly static fluid
            cells, a drift of about 1e-9 of the total per step.
    """

    fluid: LBMState
    mass: jax.Array
    flags: jax.Array
    carry: jax.Array


def neighbour_sum(lattice: Any, a: jax.Array) -> jax.Array:
    """``sum_i a(x - c_i)`` over a lattice's moving directions, periodic.

    Lattices here hold every neighbour with a given number of non-zero velocity
    components or none of them, so the sum is the separable 3^D box sum less the
    cell itself and the neighbour classes the lattice lacks (the 8 corners of
    D3Q19): 4 rolls per axis instead of one per direction.
    """
    d = a.ndim

    def pair(x: jax.Array, ax: int) -> jax.Array:
        return jnp.roll(x, 1, ax) + jnp.roll(x, -1, ax)

    box = a
    for ax in range(d):
        box = box + pair(box, ax)
    total = box - a
    present = {int(np.count_nonzero(c)) for c in lattice.c}
    for k in range(2, d + 1):
        if k in present:
            continue
        for axes in itertools.combinations(range(d), k):
            part = a
            for ax in axes:
                part = pair(part, ax)
            total = total - part
    return total


def materialise(pred: jax.Array, *arrays: Any) -> Any:
    """``arrays`` unchanged, but computed once into buffers.

    XLA's CPU compiler drops optimisation barriers before fusing; a conditional
    on a traced predicate (always true) is a fusion boundary it keeps.
    """
    return jax.lax.cond(
        pred, lambda a: a, lambda a: jax.tree.map(jnp.zeros_like, a), arrays
    )


def double_add(
    a: tuple[jax.Array, jax.Array], b: tuple[jax.Array, jax.Array]
) -> tuple[jax.Array, jax.Array]:
    """Sum of two double-word numbers ``hi + lo`` (TwoSum of the high parts)."""
    return two_sum(a[0], a[1] + b[1], b[0])


def two_sum(
    mass: jax.Array, carry: jax.Array, add: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """``mass + add`` with the rounding error moved into ``carry`` (TwoSum)."""
    total = mass + add
    b = total - mass
    err = (mass - (total - b)) + (add - b)
    return total, carry + err


def is_liquid(flags: jax.Array) -> jax.Array:
    return (flags == Flag.FLUID) | (flags == Flag.INTERFACE)


def fill_level(flags: jax.Array, mass: jax.Array, rho: jax.Array) -> jax.Array:
    """Fill level: 1 in fluid, ``clip(m / rho)`` in interface cells, 0 elsewhere."""
    safe = jnp.where(is_liquid(flags), rho, 1)
    phi = jnp.clip(mass / safe, 0, 1)
    return jnp.where(
        flags == Flag.FLUID, 1, jnp.where(flags == Flag.INTERFACE, phi, 0)
    ).astype(mass.dtype)
