"""Loss scaling as Optax transformations that wrap an inner optimizer.

Each factory returns an :class:`optax.GradientTransformationExtraArgs` whose
``update`` receives the gradients of the *scaled* loss. It unscales them in float32
(float64 for float64 leaves), checks them for Inf/NaN and runs the inner
transformation only when every floating leaf is finite; otherwise the updates are
zero and the inner state is returned untouched. The dynamic variant then adjusts
the scale. Because the inner transformation only ever sees unscaled gradients,
``optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(...))`` inside a loss
scaler clips the true gradients.

Hyperparameters live in the factory closure as static Python numbers; the state
is a NamedTuple of arrays only, so it survives ``jit``, ``lax.scan``, pytree
round trips and checkpointing unchanged, and a new scale value never retraces.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax import lax

__all__ = [
    "DynamicLossScaleState",
    "NoLossScaleState",
    "StaticLossScaleState",
    "dynamic_loss_scaling",
    "get_loss_scale",
    "get_skipped_steps",
    "no_loss_scaling",
    "static_loss_scaling",
]

_SKIP_STRATEGIES = ("cond", "select")
_F32_MAX = float(np.finfo(np.float32).max)


# --------------------------------------------------------------------------------
# Argument validation (static Python values, checked before anything is traced).


def _check_scale(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{name} must be a Python number, got {type(value).__name__} {value!r}; "
            "loss-scaling hyperparameters are static, pass e.g. 2.0**15."
        )
    value = float(value)
    if not math.isfinite(value) or value <= 0.0 or value > _F32_MAX:
        raise ValueError(
            f"{name} must be a positive, finite float32 value, got {value!r}; use a "
            "power of two such as 2.0**15 (1.0 disables scaling)."
        )
    return value


def _check_skip(skip: Any) -> str:
    if skip not in _SKIP_STRATEGIES:
        raise ValueError(
            f"skip must be one of {_SKIP_STRATEGIES}, got {skip!r}; 'cond' skips the "
            "inner update with lax.cond, 'select' computes it and selects with where."
        )
    return skip


def _check_inner(inner: Any) -> optax.GradientTransformationExtraArgs:
    if not (callable(getattr(inner, "init", None)) and callable(inner.update)):
        raise TypeError(
            "inner must be an optax.GradientTransformation (with init and update), "
            f"got {type(inner).__name__}; pass e.g. optax.adam(1e-3)."
        )
    return optax.with_extra_args_support(inner)


# --------------------------------------------------------------------------------
# Shared machinery.


def is_float_array(x: Any) -> bool:
    """Whether ``x`` is an array (or array-like) with a real floating dtype."""
    return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)


def _is_inexact_array(x: Any) -> bool:
    """Real or complex floating array: the gradient leaves that carry the scale."""
    return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.inexact)


def wide_dtype(dtype: Any) -> np.dtype:
    """float32, or the dtype itself when it is wider (float64) or complex."""
    dtype = np.dtype(dtype)
    if dtype.itemsize > 4 or jnp.issubdtype(dtype, jnp.complexfloating):
        return dtype
    return np.dtype(np.float32)


def _unscale(updates: Any, scale: jax.Array | None) -> tuple[Any, jax.Array]:
    """Divides floating leaves by ``scale`` in float32 (or float64) and checks them.

    Returns the unscaled tree, with every leaf in its original dtype, and a scalar
    bool that is True when every floating (real or complex) leaf is finite.
    Integer and boolean leaves (counters) pass through untouched and unchecked.
    """
    finite = jnp.array(True)
    out = []
    leaves, treedef = jax.tree.flatten(updates)
    for g in leaves:
        if not _is_inexact_array(g):
            out.append(g)
            continue
        g = jnp.asarray(g)
        if scale is not None:
            wide = wide_dtype(g.dtype)
            g = (g.astype(wide) / scale.astype(wide)).astype(g.dtype)
        finite = jnp.logical_and(finite, jnp.all(jnp.isfinite(g)))
        out.append(g)
    return jax.tree.unflatten(treedef, out), finite


def _cast_like(tree: Any, reference: Any) -> Any:
    """Casts each array leaf of ``tree`` to the dtype of the matching reference."""

    def cast(x: Any, ref: Any) -> Any:
        if hasattr(x, "dtype") and hasattr(ref, "dtype") and x.dtype != ref.dtype:
            return jnp.asarray(x).astype(ref.dtype)
        return x

    return jax.tree.map(cast, tree, reference)


def _guarded_inner_update(
    inner: optax.GradientTransformationExtraArgs,
    skip: str,
    finite: jax.Array,
    grads: Any,
    inner_state: Any,
    params: Any,
    extra_args: dict[str, Any],
) -> tuple[Any, Any]:
    """Runs ``inner.update`` when ``finite``; else zero updates and the old state.

    Updates are returned in the dtypes of ``params`` (of the gradients when no
    params are given) and the new inner state keeps the dtypes of the old one, so
    that both branches, and every step of a scan, have identical types.
    """
    reference = grads
    if params is not None and (jax.tree.structure(params) == jax.tree.structure(grads)):
        reference = params

    def do_update() -> tuple[Any, Any]:
        updates, new_state = inner.update(grads, inner_state, params, **extra_args)
        return _cast_like(updates, reference), _cast_like(new_state, inner_state)

    def reject_update() -> tuple[Any, Any]:
        shapes = jax.eval_shape(do_update)[0]
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
        return zeros, inner_state

    if skip == "cond":
        return lax.cond(finite, do_update, reject_update)
    accepted, rejected = do_update(), reject_update()
    return jax.tree.map(lambda a, r: jnp.where(finite, a, r), accepted, rejected)


def _count_skip(skipped: jax.Array, finite: jax.Array) -> jax.Array:
    return skipped + jnp.logical_not(finite).astype(jnp.int32)


# --------------------------------------------------------------------------------
# The three variants.


class NoLossScaleState(NamedTuple):
    """State of :func:`no_loss_scaling`.

    Attributes:
      skipped: int32 count of steps skipped because of Inf/NaN gradients.
      inner_state: state of the inner transformation.
    """

    skipped: jax.Array
    inner_state: optax.OptState


def no_loss_scaling(
    inner: optax.GradientTransformation, *, skip: str = "cond"
) -> optax.GradientTransformationExtraArgs:
    """Wraps ``inner`` without scaling, but still skipping non-finite steps.

    Useful as the float32/bfloat16 member of a family of optimizers that all
    expose the same state layout and metrics (the loss scale reads as 1.0).

    Args:
      inner: the inner optimizer.
      skip: ``"cond"`` (skip with ``lax.cond``) or ``"select"``.

    Returns:
      The wrapped transformation.

    >>> opt = no_loss_scaling(optax.sgd(0.1))
    >>> state = opt.init({"w": jnp.ones(2)})
    >>> int(state.skipped)
    0
    """
    inner = _check_inner(inner)
    skip = _check_skip(skip)

    def init_fn(params: optax.Params) -> NoLossScaleState:
        return NoLossScaleState(
            skipped=jnp.zeros((), jnp.int32), inner_state=inner.init(params)
        )

    def update_fn(
        updates: optax.Updates,
        state: NoLossScaleState,
        params: optax.Params | None = None,
        **extra_args: Any,
    ) -> tuple[optax.Updates, NoLossScaleState]:
        grads, finite = _unscale(updates, None)
        new_updates, inner_state = _guarded_inner_update(
            inner, skip, finite, grads, state.inner_state, params, extra_args
        )
        return new_updates, NoLossScaleState(
            skipped=_count_skip(state.skipped, finite), inner_state=inner_state
        )

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


class StaticLossScaleState(NamedTuple):
    """State of :func:`static_loss_scaling`.

    Attributes:
      scale: float32 loss scale (constant; an array, so changing it never
        retraces).
      skipped: int32 count of steps skipped because of Inf/NaN gradients.
      inner_state: state of the inner transformation.
    """

    scale: jax.Array
    skipped: jax.Array
    inner_state: optax.OptState


def static_loss_scaling(
    inner: optax.GradientTransformation, scale: float, *, skip: str = "cond"
) -> optax.GradientTransformationExtraArgs:
    """Wraps ``inner`` with a constant loss scale.

    Args:
      inner: the inner optimizer; it receives unscaled gradients.
      scale: the loss scale, a positive finite number.
      skip: ``"cond"`` (skip with ``lax.cond``) or ``"select"``.

    Returns:
      The wrapped transformation.

    Raises:
      ValueError: if ``scale`` is not positive and finite, or ``skip`` is unknown.

    >>> opt = static_loss_scaling(optax.sgd(1.0), 128.0)
    >>> state = opt.init({"w": jnp.zeros(2)})
    >>> updates, state = opt.update({"w": jnp.full(2, 128.0)}, state)
    >>> updates["w"].tolist()
    [-1.0, -1.0]
    """
    inner = _check_inner(inner)
    scale = _check_scale("scale", scale)
    skip = _check_skip(skip)

    def init_fn(params: optax.Params) -> StaticLossScaleState:
        return StaticLossScaleState(
            scale=jnp.asarray(scale, jnp.float32),
            skipped=jnp.zeros((), jnp.int32),
            inner_state=inner.init(params),
        )

    def update_fn(
        updates: optax.Updates,
        state: StaticLossScaleState,
        params: optax.Params | None = None,
        **extra_args: Any,
    ) -> tuple[optax.Updates, StaticLossScaleState]:
        grads, finite = _unscale(updates, state.scale)
        new_updates, inner_state = _guarded_inner_update(
            inner, skip, finite, grads, state.inner_state, params, extra_args
        )
        return new_updates, StaticLossScaleState(
            scale=state.scale,
            skipped=_count_skip(state.skipped, finite),
            inner_state=inner_state,
        )

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


class DynamicLossScaleState(NamedTuple):
    """State of :func:`dynamic_loss_scaling`.

    Attributes:
      scale: float32 current loss scale.
      counter: int32 number of consecutive finite steps since the scale last
        changed.
      skipped: int32 count of steps skipped because of Inf/NaN gradients.
      inner_state: state of the inner transformation.
    """

    scale: jax.Array
    counter: jax.Array
    skipped: jax.Array
    inner_state: optax.OptState


def dynamic_loss_scaling(
    inner: optax.GradientTransformation,
    *,
    init_scale: float = 2.0**15,
    period: int = 2000,
    factor: float = 2.0,
    min_scale: float = 1.0,
    max_scale: float = 2.0**24,
    skip: str = "cond",
) -> optax.GradientTransformationExtraArgs:
    """Wraps ``inner`` with a dynamic loss scale.

    After ``period`` consecutive finite steps the scale is multiplied by
    ``factor``; on a step with Inf/NaN gradients it is divided by ``factor`` (and
    the step is skipped). The scale is always clamped to ``[min_scale,
    max_scale]``. Defaults follow jmp/Keras (initial scale 2**15, growth every
    2000 steps, factor 2); PyTorch's GradScaler starts at 2**16.

    Args:
      inner: the inner optimizer; it receives unscaled gradients.
      init_scale: initial scale, within ``[min_scale, max_scale]``.
      period: number of consecutive finite steps before the scale grows (>= 1).
      factor: growth and back-off factor (> 1).
      min_scale: lower bound of the scale (> 0).
      max_scale: upper bound of the scale (>= ``min_scale``).
      skip: ``"cond"`` (skip with ``lax.cond``) or ``"select"``.

    Returns:
      The wrapped transformation.

    Raises:
      ValueError: on non-positive scales, ``period < 1``, ``factor <= 1``,
        ``min_scale > max_scale``, an initial scale outside the bounds, or an
        unknown ``skip``.
      TypeError: if a hyperparameter is not a Python number (``period`` must be
        an int).

    >>> opt = dynamic_loss_scaling(optax.sgd(0.1), init_scale=8.0, period=1)
    >>> state = opt.init({"w": jnp.zeros(2)})
    >>> _, state = opt.update({"w": jnp.ones(2)}, state)
    >>> float(state.scale)
    16.0
    """
    inner = _check_inner(inner)
    init_scale = _check_scale("init_scale", init_scale)
    min_scale = _check_scale("min_scale", min_scale)
    max_scale = _check_scale("max_scale", max_scale)
    factor = _check_scale("factor", factor)
    skip = _check_skip(skip)
    if isinstance(period, bool) or not isinstance(period, numbers.Integral):
        raise TypeError(
            f"period must be an int, got {type(period).__name__} {period!r}; pass "
            "the number of finite steps between scale increases, e.g. 2000."
        )
    period = int(period)
    if period < 1:
        raise ValueError(
            f"period must be >= 1, got {period}; it counts the consecutive finite "
            "steps before the scale grows (e.g. 2000)."
        )
    if factor <= 1.0:
        raise ValueError(
            f"factor must be > 1, got {factor}; use e.g. 2.0 (for a constant scale "
            "use static_loss_scaling)."
        )
    if min_scale > max_scale:
        raise ValueError(
            f"min_scale ({min_scale}) must not exceed max_scale ({max_scale}); swap "
            "them or widen the range."
        )
    if not min_scale <= init_scale <= max_scale:
        raise ValueError(
            f"init_scale ({init_scale}) must lie within [min_scale, max_scale] = "
            f"[{min_scale}, {max_scale}]; change init_scale or the bounds."
        )

    def init_fn(params: optax.Params) -> DynamicLossScaleState:
        return DynamicLossScaleState(
            scale=jnp.asarray(init_scale, jnp.float32),
            counter=jnp.zeros((), jnp.int32),
            skipped=jnp.zeros((), jnp.int32),
            inner_state=inner.init(params),
        )

    def update_fn(
        updates: optax.Updates,
        state: DynamicLossScaleState,
        params: optax.Params | None = None,
        **extra_args: Any,
    ) -> tuple[optax.Updates, DynamicLossScaleState]:
        grads, finite = _unscale(updates, state.scale)
        new_updates, inner_state = _guarded_inner_update(
            inner, skip, finite, grads, state.inner_state, params, extra_args
        )
        f = jnp.float32(factor)
        counter = state.counter + 1
        grow = jnp.logical_and(finite, counter >= period)
        scale = jnp.where(
            finite, jnp.where(grow, state.scale * f, state.scale), state.scale / f
        )
        scale = jnp.clip(scale, jnp.float32(min_scale), jnp.float32(max_scale))
        counter = jnp.where(jnp.logical_and(finite, ~grow), counter, 0)
        return new_updates, DynamicLossScaleState(
            scale=scale.astype(jnp.float32),
            counter=counter.astype(jnp.int32),
            skipped=_count_skip(state.skipped, finite),
            inner_state=inner_state,
        )

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


# --------------------------------------------------------------------------------
# Helpers.

_STATE_TYPES = (DynamicLossScaleState, StaticLossScaleState, NoLossScaleState)


def _from_nnx_mapping(tree: Any) -> Any:
    """Rebuilds loss-scaling states that ``nnx.state`` turned into mappings.

    ``nnx.state(optimizer)`` stores a NamedTuple as a :class:`flax.nnx.State` keyed
    by its field names; a mapping whose keys are exactly the fields of one of the
    loss-scaling states is turned back into that state.
    """
    if not isinstance(tree, Mapping):
        return tree
    keys = set(tree.keys())
    for state_type in _STATE_TYPES:
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
    leaves = jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, _STATE_TYPES))
    return [x for x in leaves if isinstance(x, _STATE_TYPES)]


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
      A float32 scalar array, the scale of the (single) loss-scaling state, 1.0
      for a :func:`no_loss_scaling` state.

    Raises:
      ValueError: if the state holds no loss-scaling state (wrap the optimizer in
        :func:`dynamic_loss_scaling`, :func:`static_loss_scaling` or
        :func:`no_loss_scaling`), or more than one.
      TypeError: if ``opt_state`` is not an optimizer state (``None``, a number,
        a string, an array, a Flax model).

    >>> opt = optax.chain(dynamic_loss_scaling(optax.sgd(0.1), init_scale=4.0))
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
