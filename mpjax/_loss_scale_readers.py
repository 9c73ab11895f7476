"""Reading loss-scaling state out of any optimizer state.

The loss scalers of :mod:`mpjax._loss_scaling` may sit anywhere in an optimizer
(inside ``optax.chain``, ``optax.MultiSteps``, ``optax.inject_hyperparams``, an
``nnx.Optimizer``); the readers here find the one loss-scaling state and return
its scale, skip count or stuck flag.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from mpjax._loss_scaling import STATE_TYPES, NoLossScaleState

__all__ = [
    "get_loss_scale",
    "get_skipped_steps",
    "loss_scale_or_one",
    "skipped_steps_or_zero",
    "stuck_or_false",
]


def _from_nnx_mapping(tree: Any) -> Any:
    """Rebuilds loss-scaling states that ``nnx.state`` turned into mappings.

    ``nnx.state(optimizer)`` stores a NamedTuple as a :class:`flax.nnx.State` keyed
    by its field names; a mapping whose keys are exactly the fields of one of the
    loss-scaling states is turned back into that state.
    """
    if not isinstance(tree, Mapping):
        return tree
    keys = set(tree.keys())
    for state_type in STATE_TYPES:
        if keys == set(state_type._fields):
            return state_type(**{k: tree[k] for k in state_type._fields})
    return {k: _from_nnx_mapping(v) for k, v in tree.items()}


def _as_optax_state(opt_state: Any) -> Any:
    """Unwraps what Flax NNX users hold into a plain optax state; rejects the rest.

    Accepts an optax state, an :class:`flax.nnx.Optimizer`, its ``opt_state``
    (leaves wrapped in :class:`flax.nnx.Variable`) and :class:`flax.nnx.State`
    trees of either.
    """
    if isinstance(opt_state, nnx.Optimizer):
        opt_state = opt_state.opt_state
    elif isinstance(opt_state, nnx.Module):
        raise TypeError(
            f"Expected an optimizer state, got the Flax module "
            f"{type(opt_state).__name__}; pass the nnx.Optimizer (or its "
            "opt_state) that trains it, not the model."
        )
    is_nnx_state = isinstance(opt_state, nnx.State)
    opt_state = nnx.as_pure(opt_state)
    if is_nnx_state:
        opt_state = _from_nnx_mapping(opt_state)
    treedef = jax.tree.structure(opt_state)
    if opt_state is None or (treedef.num_nodes == 1 and treedef.num_leaves == 1):
        raise TypeError(
            f"Expected an optimizer state, got {type(opt_state).__name__} "
            f"{opt_state!r}; pass the state returned by the optimizer's init or "
            "update (e.g. opt.init(params)), a TrainState's opt_state, or a Flax "
            "nnx.Optimizer."
        )
    return opt_state


def _find_states(opt_state: Any) -> list[Any]:
    leaves = jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, STATE_TYPES))
    return [x for x in leaves if isinstance(x, STATE_TYPES)]


def _single_state(opt_state: Any, what: str) -> Any | None:
    states = _find_states(_as_optax_state(opt_state))
    if len(states) > 1:
        raise ValueError(
            f"Cannot read the {what}: the optimizer state holds {len(states)} "
            "loss-scaling states, but the loss is scaled only once; wrap the whole "
            "optimizer (e.g. the optax.multi_transform) in a single loss scaler."
        )
    return states[0] if states else None


def get_loss_scale(opt_state: optax.OptState) -> jax.Array:
    """Returns the current loss scale found anywhere in an optimizer state.

    Works through any nesting (``optax.chain``, ``optax.MultiSteps``,
    ``optax.inject_hyperparams``, ``optax.multi_transform``). Flax NNX training
    state is read as well: an :class:`flax.nnx.Optimizer`, its ``opt_state``
    (whose leaves are :class:`flax.nnx.Variable` objects) or an
    :class:`flax.nnx.State` of either (``nnx.state(optimizer)``).

    Args:
      opt_state: an optimizer state, or a Flax NNX optimizer or its state.

    Returns:
      The scale of the (single) loss-scaling state as a float32 scalar array,
      1.0 for a :func:`no_loss_scaling` state.

    Raises:
      ValueError: if the state holds no loss-scaling state (wrap the optimizer in
        :func:`dynamic_loss_scaling`, :func:`static_loss_scaling` or
        :func:`no_loss_scaling`), or more than one.
      TypeError: if ``opt_state`` is not an optimizer state (``None``, a number,
        a string, an array, a Flax model).

    >>> import mpjax
    >>> opt = optax.chain(mpjax.dynamic_loss_scaling(optax.sgd(0.1), init_scale=4.0))
    >>> float(get_loss_scale(opt.init({"w": jnp.zeros(2)})))
    4.0
    """
    _required(opt_state, "loss scale")
    return loss_scale_or_one(opt_state)


def loss_scale_or_one(opt_state: optax.OptState) -> jax.Array:
    """:func:`get_loss_scale`, but 1.0 for a state without loss scaling.

    For the training steps, which work with or without loss scaling.
    """
    state = _single_state(opt_state, "loss scale")
    if state is None or isinstance(state, NoLossScaleState):
        return jnp.ones((), jnp.float32)
    return state.scale


def _required(opt_state: Any, what: str) -> None:
    """Raise ``ValueError`` if ``opt_state`` holds no loss-scaling state."""
    if _single_state(opt_state, what) is None:
        raise ValueError(
            f"Cannot read the {what}: the optimizer state holds no loss-scaling "
            "state. Wrap the optimizer in mpjax.dynamic_loss_scaling, "
            "static_loss_scaling or no_loss_scaling to have one."
        )


def get_skipped_steps(opt_state: optax.OptState) -> jax.Array:
    """Returns the int32 number of skipped (non-finite) steps in an optimizer state.

    Args:
      opt_state: an optimizer state, searched like in :func:`get_loss_scale`.

    Returns:
      The skip count of the (single) loss-scaling state.

    Raises:
      ValueError: if the state holds no loss-scaling state, or more than one.
      TypeError: if ``opt_state`` is not an optimizer state.
    """
    _required(opt_state, "skipped-step count")
    return skipped_steps_or_zero(opt_state)


def skipped_steps_or_zero(opt_state: optax.OptState) -> jax.Array:
    """:func:`get_skipped_steps`, but 0 for a state without loss scaling."""
    state = _single_state(opt_state, "skipped-step count")
    if state is None:
        return jnp.zeros((), jnp.int32)
    return state.skipped


def stuck_or_false(opt_state: optax.OptState) -> jax.Array:
    """The bool ``stuck`` flag of the loss-scaling state (False without one)."""
    state = _single_state(opt_state, "stuck flag")
    if state is None:
        return jnp.array(False)
    return state.stuck
