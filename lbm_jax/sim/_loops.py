"""A simulation's compiled loops on one device's sub-domain.

:class:`lbm_jax.Simulation` runs them per device (inside ``shard_map`` when the
grid is split) from its configuration (:class:`lbm_jax.sim._config.SimulationConfig`):
one step, the fast multi-step loop, and that loop with the checkpointed
derivative of :mod:`lbm_jax.core._remat`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lbm_jax.core._remat import differentiable_loop
from lbm_jax.sim._config import SimulationConfig, StepArrays
from lbm_jax.sim._decomp import exchange

__all__ = ["advance", "differentiable_advance", "step"]


def step(
    config: SimulationConfig,
    aux: StepArrays,
    f: jax.Array,
    g: jax.Array,
    *,
    differentiated: bool = False,
) -> jax.Array:
    """One step from ``f`` into ``g`` (exchanging halos when split);
    ``differentiated``: the step a checkpointed derivative runs (the reference
    XLA step, or the native step where its adjoint differentiates it)."""
    plan = config.plan
    step_into = plan.differentiated_step_into if differentiated else plan.step_into
    if config.decomp is None:
        return step_into(aux, f, g)
    return step_into(aux, f, g, exchange(f, config.decomp))


def advance(
    config: SimulationConfig, aux: StepArrays, f: jax.Array, steps: jax.Array
) -> jax.Array:
    """``steps`` steps (a traced count): in place in ``f``, or two per loop
    iteration (f -> g -> f, no buffer swap)."""
    advance_inplace = config.plan.advance_inplace
    if advance_inplace is not None:
        return advance_inplace(aux, f, steps)
    g = jnp.zeros_like(f)

    def pair(_: jax.Array, fg: tuple[jax.Array, jax.Array]):
        f, g = fg
        g = step(config, aux, f, g)
        return step(config, aux, g, f), g

    f, g = jax.lax.fori_loop(0, steps // 2, pair, (f, g))
    return jax.lax.cond(steps % 2 == 1, lambda: step(config, aux, f, g), lambda: f)


def differentiable_advance(
    config: SimulationConfig,
    aux: StepArrays,
    f: jax.Array,
    *,
    steps: int,
    levels: tuple[int, ...],
) -> jax.Array:
    """:func:`advance` by ``steps`` (a Python int), differentiated as the
    checkpointed loop of the plan's differentiated step with segment lengths
    ``levels``."""
    return differentiable_loop(
        lambda aux, f: advance(config, aux, f, jnp.int32(steps)),
        lambda aux, f: step(config, aux, f, jnp.zeros_like(f), differentiated=True),
        (aux, f),
        steps,
        levels,
    )
