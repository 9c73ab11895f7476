"""The optimizer side of fp8 delayed scaling: writing amax histories back.

:func:`fp8_delayed_scaling` wraps an optax optimizer (normally a loss scaler
around Adam). The :class:`mpjax.Fp8Meta` variables of the parameters never reach
the inner optimizer: their "gradients" are the amaxes the backward pass measured,
and the wrapper turns them into new histories and scales with
:func:`update_fp8_meta`, returned as updates that ``optax.apply_updates`` adds
exactly (the state is stored as int32 bit patterns).

How fp8 and loss scaling share the gradients. The gradient amax is measured on
the *loss-scaled* cotangents, so the ``float8_e5m2`` scale absorbs the loss scale:
``g_fp8 = (S * g) / (S * amax(g) / fp8_max)`` is the same number as without loss
scaling, and loss scaling keeps its own job (float16 cotangents that do not
underflow). Three rules keep the two scales from fighting:

1. the quantiser keeps infinities non-finite, so an overflow still reaches the
   loss scaler, which skips the step;
2. on a skipped step (the inner state's skipped-step count went up) the fp8 state
   is left as it was: the measured amaxes are those of a step that did not happen;
3. when the loss scale changes from ``S`` to ``S'``, the gradient row's history and
   scale are multiplied by ``S' / S`` (a power of two, so exactly), so the next
   step's delayed scale is already in the new units.

Independently of loss scaling, a non-finite amax is never pushed into a history
(it would pin the scale for the whole history length); that row keeps its history
and scale for the step.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax.linen import fp8_ops

from mpjax._fp8 import Fp8Config, Fp8MetaValue, is_meta, meta_value, with_meta_value
from mpjax._loss_scale_readers import loss_scale_or_one, skipped_steps_or_zero

__all__ = ["Fp8DelayedScalingState", "fp8_delayed_scaling", "update_fp8_meta"]


def update_fp8_meta(
    value: Fp8MetaValue,
    amax: jax.Array,
    config: Fp8Config,
    *,
    skipped: jax.Array | bool = False,
    loss_scale_ratio: jax.Array | float = 1.0,
) -> Fp8MetaValue:
    """One delayed-scaling update of the state of one fp8 product.

    For each row whose ``amax`` is finite (and unless ``skipped``): push ``amax``
    into the history (Flax's ``compute_amax_history``: roll, newest at index 0),
    then ``scale = max(history) * 2**margin / fp8_max`` (Flax's ``compute_scale``,
    which keeps the previous scale while the history is all zero). Finally the
    gradient row's history and scale are multiplied by ``loss_scale_ratio``.

    Args:
        value: the current state.
        amax: float ``[3]``, this step's amaxes (lhs, rhs, gradient).
        config: the hyperparameters (``margin`` and the fp8 formats).
        skipped: whether the step was skipped; the state then only gets rescaled.
        loss_scale_ratio: new loss scale over the one the step used.

    Returns:
        The new state (its ``amax`` field zero).

    Example:
        >>> config = Fp8Config(history_length=2)
        >>> v = update_fp8_meta(Fp8MetaValue.initial(config),
        ...                     jnp.array([448.0, 224.0, jnp.inf]), config)
        >>> v.scale.tolist(), v.amax_history[:, 0].tolist()
        ([1.0, 0.5, 1.0], [448.0, 224.0, 0.0])
    """
    history = value.amax_history
    scale = value.scale
    amax = jnp.asarray(amax).astype(jnp.float32)
    push = jnp.isfinite(amax) & jnp.logical_not(jnp.asarray(skipped))
    pushed = jax.vmap(fp8_ops.compute_amax_history)(amax, history)
    history = jnp.where(push[:, None], pushed, history)
    fp8_max = jnp.asarray(config.fp8_max)
    new_scale = fp8_ops.compute_scale(
        jnp.max(history, axis=1), scale, fp8_max, config.margin
    )
    scale = jnp.where(push, new_scale, scale)
    ratio = jnp.asarray(loss_scale_ratio, jnp.float32)
    factor = jnp.stack([jnp.ones((), jnp.float32), jnp.ones((), jnp.float32), ratio])
    return Fp8MetaValue.create(scale * factor, history * factor[:, None], value.config)


def _split(tree: Any, what: str) -> tuple[list[Any], Any]:
    leaves, treedef = jax.tree.flatten(tree, is_leaf=is_meta)
    if not any(is_meta(x) for x in leaves):
        raise ValueError(
            f"fp8_delayed_scaling found no mpjax.Fp8Meta variable in the {what}; "
            "build the model with mpjax.apply_policy(model, policy, fp8=config) and "
            "pass its fp8 state along, e.g. nnx.split(model, (nnx.Param, "
            "mpjax.Fp8Meta), ...), or nnx.Optimizer(..., wrt=(nnx.Param, "
            "mpjax.Fp8Meta))."
        )
    return leaves, treedef


def _masked(leaves: list[Any], treedef: Any) -> Any:
    return jax.tree.unflatten(
        treedef, [optax.MaskedNode() if is_meta(x) else x for x in leaves]
    )


def _carried_config(leaf: Any, config: Fp8Config | None) -> Fp8Config:
    """The config an fp8 state carries (``config``, or one of its history
    length, for a state built without one), checked against ``config``.

    Raises:
        ValueError: ``config`` differs from the carried one, or the state's
            history length from its config's.
    """
    value = meta_value(leaf)
    carried = value.config
    if carried is None:
        carried = config or Fp8Config(history_length=value.history_bits.shape[-1])
    elif config is not None and config != carried:
        raise ValueError(
            f"fp8_delayed_scaling was given {config} but the model carries "
            f"{carried}; leave config out (the model's is used) or build the "
            "model with the same one."
        )
    length = value.history_bits.shape[-1]
    if length != carried.history_length:
        raise ValueError(
            f"an fp8 state has a history of {length} steps but the config says "
            f"{carried.history_length}; pass the Fp8Config given to "
            "mpjax.apply_policy."
        )
    return carried


def _meta_update(
    param: Any, grad: Any, config: Fp8Config, skipped: Any, ratio: Any
) -> Any:
    """The update of one fp8 state: the difference between its
    :func:`update_fp8_meta` result (from the amax its gradient carries) and the
    state, so that applying updates writes the new state."""
    old = meta_value(param)
    new = update_fp8_meta(
        old,
        meta_value(grad).amax,
        config,
        skipped=skipped,
        loss_scale_ratio=ratio,
    )
    delta = Fp8MetaValue(
        new.scale_bits - old.scale_bits,
        new.history_bits - old.history_bits,
        jnp.zeros_like(old.amax),
        old.config,
    )
    return with_meta_value(param, delta)


class Fp8DelayedScalingState(NamedTuple):
    """State of :func:`fp8_delayed_scaling`.

    Attributes:
        inner_state: the state of the wrapped optimizer (the fp8 state itself
            lives with the parameters).
    """

    inner_state: optax.OptState


def fp8_delayed_scaling(
    inner: optax.GradientTransformation, config: Fp8Config | None = None
) -> optax.GradientTransformationExtraArgs:
    """Wraps an optimizer so that it updates fp8 state instead of optimizing it.

    Use it outermost, around the loss scaler if there is one:
    ``fp8_delayed_scaling(mpjax.dynamic_loss_scaling(optax.adam(1e-3)))``.
    The inner optimizer sees the parameters without the :class:`mpjax.Fp8Meta`
    variables; their updates come from :func:`update_fp8_meta`, skipped on steps
    the inner loss scaler skips and rescaled when its loss scale changes. The
    margin and formats are those the model carries (the :class:`mpjax.Fp8Config`
    given to :func:`mpjax.apply_policy` travels with every fp8 state), so the
    wrapper cannot use other ones. Works with :func:`mpjax.make_train_step` on an
    ``nnx.State`` and with ``nnx.Optimizer(model, tx, wrt=(nnx.Param,
    mpjax.Fp8Meta))``, which hands it pure trees.

    Args:
        inner: the optimizer of the other parameters.
        config: optional; if given it must equal the config the model carries
            (a check, not a setting). It applies to states built without one.

    Returns:
        The wrapped transformation. Its ``update`` needs ``params``.

    Raises:
        TypeError: ``inner`` is not an optax transformation or ``config`` not an
            :class:`mpjax.Fp8Config`.
        ValueError: (from ``init``/``update``) the parameters hold no fp8 state,
            or ``config`` differs from the model's.
    """
    if not (callable(getattr(inner, "init", None)) and callable(inner.update)):
        raise TypeError(
            "inner must be an optax.GradientTransformation, got "
            f"{type(inner).__name__}; pass e.g. "
            "mpjax.dynamic_loss_scaling(optax.adam(1e-3))."
        )
    if config is not None and not isinstance(config, Fp8Config):
        raise TypeError(
            f"config must be an mpjax.Fp8Config or None, got "
            f"{type(config).__name__}; leave it out to use the model's."
        )
    inner = optax.with_extra_args_support(inner)

    def check(leaves: list[Any]) -> None:
        for leaf in leaves:
            if is_meta(leaf):
                _carried_config(leaf, config)

    def init_fn(params: Any) -> Fp8DelayedScalingState:
        leaves, treedef = _split(params, "parameters")
        check(leaves)
        return Fp8DelayedScalingState(inner.init(_masked(leaves, treedef)))

    def update_fn(
        updates: Any,
        state: Fp8DelayedScalingState,
        params: Any = None,
        **extra_args: Any,
    ) -> tuple[Any, Fp8DelayedScalingState]:
        if params is None:
            raise ValueError(
                "fp8_delayed_scaling needs params in update(grads, state, params): "
                "the new fp8 state is written as the difference from the current one."
            )
        grad_leaves, treedef = _split(updates, "gradients")
        param_leaves, param_treedef = _split(params, "parameters")
        if param_treedef != treedef:
            raise ValueError(
                "gradients and parameters of fp8_delayed_scaling differ in "
                f"structure: {treedef} vs {param_treedef}."
            )
        inner_updates, inner_state = inner.update(
            _masked(grad_leaves, treedef),
            state.inner_state,
            _masked(param_leaves, treedef),
            **extra_args,
        )
        skipped = skipped_steps_or_zero(inner_state) > skipped_steps_or_zero(
            state.inner_state
        )
        ratio = loss_scale_or_one(inner_state) / loss_scale_or_one(state.inner_state)
        inner_leaves = jax.tree.leaves(
            inner_updates, is_leaf=lambda x: isinstance(x, optax.MaskedNode)
        )
        out = []
        for grad, param, inner_update in zip(
            grad_leaves, param_leaves, inner_leaves, strict=True
        ):
            if not is_meta(param):
                out.append(inner_update)
                continue
            cfg = _carried_config(param, config)
            out.append(_meta_update(param, grad, cfg, skipped, ratio))
        return jax.tree.unflatten(treedef, out), Fp8DelayedScalingState(inner_state)

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)
