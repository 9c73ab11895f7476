"""The immersed-boundary coupling of a membrane and a fluid: one pure coupled step.

:class:`ImmersedBoundary` joins a 3-D :class:`~lbm_jax.Simulation` and a
:class:`Membrane` through a regularised delta kernel. One coupled step (Peskin's
scheme, as in Krueger et al. 2011):

1. membrane forces ``F = -dE/dX`` at the current node positions ``X``;
2. spread onto the grid, ``f(x) = sum_X F delta(x - X)``;
3. one fluid step with that body-force field (Guo forcing);
4. interpolate the fluid velocity at the nodes, ``U(X) = sum_x u(x) delta(x - X)``,
   where ``u`` is the physical velocity of the new state: the momentum of the
   stored post-collision populations less half the force, which is the same
   ``(sum_i c_i f_i + F/2) / rho`` of the populations before collision;
5. move the nodes with the fluid, ``X += U`` (no-slip).

Node positions are in lattice units with fluid node ``i`` at ``x = i`` along every
axis; they are not wrapped into the box (a membrane that crosses a periodic border
stays in one piece), the kernel wraps around instead. The coupled state is the
pytree :class:`IBMState`, so it runs through :func:`lbm_jax.run` like any other
(health checks, sampling, early stop, checkpoints).
"""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from lbm_jax.core._pytree import pytree_attributes
from lbm_jax.core._validation import renamed_keyword
from lbm_jax.ibm._kernels import get_kernel, interpolate, spread
from lbm_jax.ibm._membrane import Membrane
from lbm_jax.sim._simulation import LBMState, Simulation

__all__ = ["IBMState", "ImmersedBoundary"]


class IBMState(NamedTuple):
    """State of a fluid with an immersed membrane (a pytree of arrays).

    Attributes:
        fluid: The fluid's state.
        nodes: Membrane node positions ``(N, 3)`` in lattice units, in the fluid's
            compute dtype.
    """

    fluid: LBMState
    nodes: jax.Array


@pytree_attributes(data=("sim", "membrane"), meta=("delta",))
class ImmersedBoundary:
    """A membrane immersed in a fluid, coupled by the immersed-boundary method.

    Args:
        sim: The fluid: a 3-D simulation whose per-step force the membrane sets
            (its construction force, if any, is replaced by the membrane's).
        membrane: The membrane's mechanics (reference shape and laws).
        delta: The regularised delta function's width: ``2`` (linear), ``3``
            (Roma) or ``4`` (Peskin) points, or its name.
        kernel: Deprecated alias of ``delta`` (it warns; removed in the next
            release).

    Raises:
        ValueError: A lattice that is not 3-D, an unknown delta function, or
            both ``delta`` and ``kernel``.
        TypeError: Arguments of the wrong type.
    """

    def __init__(
        self,
        sim: Simulation,
        membrane: Membrane,
        *,
        delta: int | str | None = None,
        kernel: int | str | None = None,
    ) -> None:
        if not isinstance(sim, Simulation):
            raise TypeError(f"sim must be an lbm_jax.Simulation, got {sim!r}.")
        if not isinstance(membrane, Membrane):
            raise TypeError(
                f"membrane must be an lbm_jax.ibm.Membrane, got {membrane!r}."
            )
        if sim.lattice.d != 3:
            raise ValueError(
                f"an immersed membrane needs a 3-D lattice, got {sim.lattice.name}."
            )
        delta = renamed_keyword(
            delta,
            kernel,
            name="delta",
            old_name="kernel",
            caller="ImmersedBoundary",
            what="the delta function's width, 2, 3 or 4 points",
        )
        self.sim = sim
        self.membrane = membrane
        self.delta = get_kernel(4 if delta is None else delta)

    @property
    def kernel(self) -> Any:
        """Deprecated alias of ``delta`` (it warns)."""
        warnings.warn(
            "ImmersedBoundary.kernel is deprecated; use .delta.",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.delta

    @property
    def dtype(self) -> np.dtype:
        """Compute dtype of the fluid, in which the membrane is computed too."""
        return np.dtype(self.sim.storage.compute_dtype)

    def init(self, fluid: LBMState, nodes: ArrayLike | None = None) -> IBMState:
        """A coupled state from a fluid state and node positions.

        Args:
            fluid: The fluid's initial state.
            nodes: Node positions ``(N, 3)`` in lattice units; default the
                membrane's reference shape (a membrane at rest).
        """
        ref = self.membrane.reference_nodes
        x = np.asarray(ref if nodes is None else nodes, dtype=np.float64)
        if x.shape != ref.shape:
            raise ValueError(
                f"nodes must have shape {ref.shape} (one row per membrane node), got "
                f"{x.shape}."
            )
        if not np.all(np.isfinite(x)):
            raise ValueError("nodes contain non-finite positions.")
        return IBMState(fluid=fluid, nodes=jnp.asarray(x.astype(self.dtype)))

    def force_field(self, nodes: jax.Array) -> jax.Array:
        """The membrane's force density on the grid, ``(3, *sim.shape)``."""
        return spread(self.membrane.forces(nodes), nodes, self.sim.shape, self.delta)

    def step(self, state: IBMState) -> IBMState:
        """One coupled step (pure, jit-able): forces, spread, fluid step, move."""
        force = self.force_field(state.nodes)
        fluid = self.sim.step(state.fluid, force)
        _, u = self.sim.fields(fluid, force)
        velocity = interpolate(u, state.nodes, self.delta)
        return IBMState(fluid=fluid, nodes=state.nodes + velocity)

    def healthy(self, state: IBMState) -> jax.Array:
        """Fluid healthy (finite, positive density) and every node finite."""
        return self.sim.healthy(state.fluid) & jnp.all(jnp.isfinite(state.nodes))
