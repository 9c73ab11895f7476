"""Loss scaling as Optax transformations that wrap an inner optimizer.

Each factory returns an :class:`optax.GradientTransformationExtraArgs` whose
``update`` receives the gradients of the *scaled* loss. It unscales them in float32
(float64 for float64 leaves), checks them for Inf/NaN and runs the inner
transformation only when every floating leaf is finite. When ``update`` is given the
parameters, a step whose update would make any floating parameter non-finite is
rejected too (an optimizer constant that underflows in a low-precision parameter
dtype, such as Adam's ``eps=1e-8`` in float16, divides by zero). A rejected step
returns zero updates and the inner state untouched, counts in ``skipped``, and the
dynamic variant lowers the scale as for an overflow.

A run whose steps are all rejected would otherwise stall without a word: the
state counts the rejected steps in a row (``consecutive``), and after
``max_consecutive_skips`` of them (100 by default) the update raises (``on_stuck=
"raise"``: a checked error from compiled code, see :func:`_report_stuck`) or sets
the state's ``stuck`` flag, which :func:`mpjax.make_train_step` reports in its
metrics (``on_stuck="flag"``).

Because the inner transformation only ever sees unscaled gradients,
``optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(...))`` inside a loss
scaler clips the true gradients.

Hyperparameters live in the factory closure as static Python numbers; the state
is a NamedTuple of arrays only, so it survives ``jit``, ``lax.scan``, pytree
round trips and checkpointing unchanged, and a new scale value never retraces.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

__all__ = [
    "DynamicLossScaleState",
    "NoLossScaleState",
    "StaticLossScaleState",
    "dynamic_loss_scaling",
    "no_loss_scaling",
    "static_loss_scaling",
]

_SKIP_STRATEGIES = ("cond", "select")
_ON_STUCK = ("raise", "flag")
#: Default of ``max_consecutive_skips``: dynamic scaling needs at most 24 halvings
#: from 2**24 down to 1, so a hundred rejected steps in a row is a stuck run.
DEFAULT_MAX_CONSECUTIVE_SKIPS = 100
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


def _check_limit(limit: Any, on_stuck: Any) -> tuple[int | None, str]:
    if limit is not None and (
        isinstance(limit, bool) or not isinstance(limit, numbers.Integral) or limit < 1
    ):
        raise ValueError(
            f"max_consecutive_skips must be a positive int or None, got {limit!r}; "
            f"pass e.g. {DEFAULT_MAX_CONSECUTIVE_SKIPS} (None never gives up)."
        )
    if on_stuck not in _ON_STUCK:
        raise ValueError(
            f"on_stuck must be one of {_ON_STUCK}, got {on_stuck!r}; 'raise' stops "
            "the run with an error, 'flag' sets the state's stuck flag."
        )
    return (None if limit is None else int(limit)), on_stuck


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


def _stays_finite(params: Any, updates: Any) -> jax.Array | None:
    """Whether ``params + updates`` keeps every parameter narrower than float32
    finite (``None``: none to check). Not float32/float64: the check keeps the
    update from fusing with its application (1.5x a 3M-parameter Adam step)."""
    if params is None or jax.tree.structure(params) != jax.tree.structure(updates):
        return None
    ok = None
    for p, u in zip(jax.tree.leaves(params), jax.tree.leaves(updates), strict=True):
        if (
            _is_inexact_array(p)
            and _is_inexact_array(u)
            and np.dtype(p.dtype).itemsize < 4
        ):
            new = (jnp.asarray(p) + jnp.asarray(u).astype(p.dtype)).astype(p.dtype)
            finite = jnp.all(jnp.isfinite(new))
            ok = finite if ok is None else jnp.logical_and(ok, finite)
    return ok


def _guarded_inner_update(
    inner: optax.GradientTransformationExtraArgs,
    skip: str,
    finite: jax.Array,
    grads: Any,
    inner_state: Any,
    params: Any,
    extra_args: dict[str, Any],
) -> tuple[Any, Any, jax.Array]:
    """Runs ``inner.update`` when ``finite``; else zero updates and the old state.

    A computed update that would make a parameter narrower than float32 non-finite
    is rejected the same way. Returns ``(updates, inner_state, accepted)``. Updates
    are returned in the dtypes of ``params`` (of the gradients when no params are
    given) and the new inner state keeps the dtypes of the old one, so that both
    branches, and every step of a scan, have identical types.
    """
    reference = grads
    if params is not None and (jax.tree.structure(params) == jax.tree.structure(grads)):
        reference = params

    def compute() -> tuple[Any, Any]:
        updates, new_state = inner.update(grads, inner_state, params, **extra_args)
        return _cast_like(updates, reference), _cast_like(new_state, inner_state)

    def reject() -> tuple[Any, Any, jax.Array]:
        shapes = jax.eval_shape(compute)[0]
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
        return zeros, inner_state, jnp.array(False)

    def choose(ok: jax.Array, accepted: tuple, rejected: tuple) -> tuple:
        return jax.tree.map(lambda a, r: jnp.where(ok, a, r), accepted, rejected)

    def do_update() -> tuple[Any, Any, jax.Array]:
        updates, new_state = compute()
        ok = _stays_finite(params, updates)
        if ok is None:
            return updates, new_state, jnp.array(True)
        return choose(ok, (updates, new_state, ok), reject())

    if skip == "cond":
        return lax.cond(finite, do_update, reject)
    return choose(finite, do_update(), reject())


def _stuck_message(consecutive: Any) -> str:
    return (
        f"loss scaling: {int(np.max(consecutive))} steps in a row had non-finite "
        "gradients or would have made a parameter non-finite, and were skipped; the "
        "run is stuck. Look for a NaN/Inf in the data or the loss, lower the "
        "learning rate, keep float32 master parameters (policy 'mixed_float16'), "
        "or raise max_consecutive_skips (on_stuck='flag' reports instead of raising)."
    )


def _raise_stuck(stuck: Any, consecutive: Any) -> None:
    if np.any(stuck):  # under vmap, one flag per member
        raise FloatingPointError(_stuck_message(consecutive))


def _report_stuck(stuck: jax.Array, consecutive: jax.Array) -> None:
    """The checked error of a stuck run, usable under ``jit``, ``scan`` and ``vmap``.

    A host callback (``jax.debug.callback``) raises :class:`FloatingPointError` in
    the branch of a ``lax.cond`` that runs only when ``stuck``, so a healthy step
    never leaves the device. Outside ``jit`` the error is raised as is; from a
    compiled program it reaches the caller as :class:`jax.errors.JaxRuntimeError`
    (a ``RuntimeError``) whose message holds this one.
    """
    lax.cond(
        stuck,
        lambda: jax.debug.callback(_raise_stuck, stuck, consecutive),
        lambda: None,
    )


class _Counts(NamedTuple):
    """The rejected-step counters every loss-scaling state carries."""

    skipped: jax.Array
    consecutive: jax.Array
    stuck: jax.Array


def _zero_counts() -> _Counts:
    zero = jnp.zeros((), jnp.int32)
    return _Counts(zero, zero, jnp.array(False))


def _make_transform(
    inner: Any,
    *,
    skip: str,
    max_consecutive_skips: int | None,
    on_stuck: str,
    state_type: type,
    scale_fields: Callable[[], dict[str, jax.Array]],
    next_scale_fields: Callable[[Any, jax.Array], dict[str, jax.Array]],
) -> optax.GradientTransformationExtraArgs:
    """The one ``init``/``update`` pair of the three loss scalers.

    ``scale_fields()`` gives the initial scale fields of ``state_type`` (none for
    :func:`no_loss_scaling`); ``next_scale_fields(state, accepted)`` the fields
    after a step. The state's ``scale`` (if any) unscales the gradients.
    """
    inner = _check_inner(inner)
    skip = _check_skip(skip)
    limit, on_stuck = _check_limit(max_consecutive_skips, on_stuck)

    def init_fn(params: optax.Params) -> Any:
        return state_type(
            **scale_fields(), **_zero_counts()._asdict(), inner_state=inner.init(params)
        )

    def update_fn(
        updates: optax.Updates,
        state: Any,
        params: optax.Params | None = None,
        **extra_args: Any,
    ) -> tuple[optax.Updates, Any]:
        grads, finite = _unscale(updates, getattr(state, "scale", None))
        new_updates, inner_state, accepted = _guarded_inner_update(
            inner, skip, finite, grads, state.inner_state, params, extra_args
        )
        rejected = jnp.logical_not(accepted).astype(jnp.int32)
        consecutive = jnp.where(accepted, 0, state.consecutive + 1)
        stuck = jnp.array(False) if limit is None else consecutive >= limit
        if limit is not None and on_stuck == "raise":
            _report_stuck(stuck, consecutive)
        counts = _Counts(state.skipped + rejected, consecutive, stuck)
        return new_updates, state_type(
            **next_scale_fields(state, accepted),
            **counts._asdict(),
            inner_state=inner_state,
        )

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


# --------------------------------------------------------------------------------
# The three variants.


class NoLossScaleState(NamedTuple):
    """State of :func:`no_loss_scaling`.

    Attributes:
      skipped: int32 count of steps skipped because of Inf/NaN gradients or
        an update that would make a parameter non-finite.
      consecutive: int32 count of such steps in a row (0 after an accepted step).
      stuck: bool, whether ``consecutive`` reached ``max_consecutive_skips``.
      inner_state: state of the inner transformation.
    """

    skipped: jax.Array
    consecutive: jax.Array
    stuck: jax.Array
    inner_state: optax.OptState


def no_loss_scaling(
    inner: optax.GradientTransformation,
    *,
    skip: str = "cond",
    max_consecutive_skips: int | None = DEFAULT_MAX_CONSECUTIVE_SKIPS,
    on_stuck: str = "raise",
) -> optax.GradientTransformationExtraArgs:
    """Wraps ``inner`` without scaling, but still skipping non-finite steps.

    Useful as the float32/bfloat16 member of a family of optimizers that all
    expose the same state layout and metrics (the loss scale reads as 1.0).

    Args:
      inner: the inner optimizer.
      skip: ``"cond"`` (skip with ``lax.cond``) or ``"select"``.
      max_consecutive_skips: rejected steps in a row after which the run
        counts as stuck (default 100), or ``None`` to never give up.
      on_stuck: ``"raise"`` (a checked error from the compiled step, reaching
        the caller as ``jax.errors.JaxRuntimeError``) or ``"flag"`` (the state's
        ``stuck`` flag, the ``"stuck"`` metric of :func:`mpjax.make_train_step`).

    Returns:
      The wrapped transformation.

    >>> opt = no_loss_scaling(optax.sgd(0.1))
    >>> state = opt.init({"w": jnp.ones(2)})
    >>> int(state.skipped)
    0
    """
    return _make_transform(
        inner,
        skip=skip,
        max_consecutive_skips=max_consecutive_skips,
        on_stuck=on_stuck,
        state_type=NoLossScaleState,
        scale_fields=dict,
        next_scale_fields=lambda state, accepted: {},
    )


class StaticLossScaleState(NamedTuple):
    """State of :func:`static_loss_scaling`.

    Attributes:
      scale: float32 loss scale (constant; an array, so changing it never
        retraces).
      skipped: int32 count of steps skipped because of Inf/NaN gradients or
        an update that would make a parameter non-finite.
      consecutive: int32 count of such steps in a row (0 after an accepted step).
      stuck: bool, whether ``consecutive`` reached ``max_consecutive_skips``.
      inner_state: state of the inner transformation.
    """

    scale: jax.Array
    skipped: jax.Array
    consecutive: jax.Array
    stuck: jax.Array
    inner_state: optax.OptState


def static_loss_scaling(
    inner: optax.GradientTransformation,
    scale: float,
    *,
    skip: str = "cond",
    max_consecutive_skips: int | None = DEFAULT_MAX_CONSECUTIVE_SKIPS,
    on_stuck: str = "raise",
) -> optax.GradientTransformationExtraArgs:
    """Wraps ``inner`` with a constant loss scale.

    Args:
      inner: the inner optimizer; it receives unscaled gradients.
      scale: the loss scale, a positive finite number.
      skip: ``"cond"`` (skip with ``lax.cond``) or ``"select"``.
      max_consecutive_skips: rejected steps in a row after which the run
        counts as stuck (default 100), or ``None`` to never give up.
      on_stuck: ``"raise"`` (a checked error from the compiled step, reaching
        the caller as ``jax.errors.JaxRuntimeError``) or ``"flag"`` (the state's
        ``stuck`` flag, the ``"stuck"`` metric of :func:`mpjax.make_train_step`).

    Returns:
      The wrapped transformation.

    Raises:
      ValueError: if ``scale`` is not positive and finite, or ``skip``,
        ``max_consecutive_skips`` or ``on_stuck`` is invalid.

    >>> opt = static_loss_scaling(optax.sgd(1.0), 128.0)
    >>> state = opt.init({"w": jnp.zeros(2)})
    >>> updates, state = opt.update({"w": jnp.full(2, 128.0)}, state)
    >>> updates["w"].tolist()
    [-1.0, -1.0]
    """
    scale = _check_scale("scale", scale)
    return _make_transform(
        inner,
        skip=skip,
        max_consecutive_skips=max_consecutive_skips,
        on_stuck=on_stuck,
        state_type=StaticLossScaleState,
        scale_fields=lambda: {"scale": jnp.asarray(scale, jnp.float32)},
        next_scale_fields=lambda state, accepted: {"scale": state.scale},
    )


class DynamicLossScaleState(NamedTuple):
    """State of :func:`dynamic_loss_scaling`.

    Attributes:
      scale: float32 current loss scale.
      counter: int32 number of consecutive finite steps since the scale last
        changed.
      skipped: int32 count of steps skipped because of Inf/NaN gradients or
        an update that would make a parameter non-finite.
      consecutive: int32 count of such steps in a row (0 after an accepted step).
      stuck: bool, whether ``consecutive`` reached ``max_consecutive_skips``.
      inner_state: state of the inner transformation.
    """

    scale: jax.Array
    counter: jax.Array
    skipped: jax.Array
    consecutive: jax.Array
    stuck: jax.Array
    inner_state: optax.OptState


def _check_dynamic(
    init_scale: Any, period: Any, factor: Any, min_scale: Any, max_scale: Any
) -> tuple[float, int, float, float, float]:
    """Validated hyperparameters of :func:`dynamic_loss_scaling`."""
    init_scale = _check_scale("init_scale", init_scale)
    min_scale = _check_scale("min_scale", min_scale)
    max_scale = _check_scale("max_scale", max_scale)
    factor = _check_scale("factor", factor)
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
    return init_scale, period, factor, min_scale, max_scale


def dynamic_loss_scaling(
    inner: optax.GradientTransformation,
    *,
    init_scale: float = 2.0**15,
    period: int = 2000,
    factor: float = 2.0,
    min_scale: float = 1.0,
    max_scale: float = 2.0**24,
    skip: str = "cond",
    max_consecutive_skips: int | None = DEFAULT_MAX_CONSECUTIVE_SKIPS,
    on_stuck: str = "raise",
) -> optax.GradientTransformationExtraArgs:
    """Wraps ``inner`` with a dynamic loss scale.

    After ``period`` consecutive accepted steps the scale is multiplied by
    ``factor``; on a rejected step (Inf/NaN gradients, or an update that would
    make a parameter non-finite) it is divided by ``factor`` and the step is
    skipped. The scale is always clamped to ``[min_scale, max_scale]``. Defaults
    follow jmp/Keras (initial scale 2**15, growth every 2000 steps, factor 2);
    PyTorch's GradScaler starts at 2**16.

    Args:
      inner: the inner optimizer; it receives unscaled gradients.
      init_scale: initial scale, within ``[min_scale, max_scale]``.
      period: number of consecutive finite steps before the scale grows (>= 1).
      factor: growth and back-off factor (> 1).
      min_scale: lower bound of the scale (> 0).
      max_scale: upper bound of the scale (>= ``min_scale``).
      skip: ``"cond"`` (skip with ``lax.cond``) or ``"select"``.
      max_consecutive_skips: rejected steps in a row after which the run counts
        as stuck (default 100), or ``None`` to never give up.
      on_stuck: ``"raise"`` (a checked error from the compiled step, reaching
        the caller as ``jax.errors.JaxRuntimeError``) or ``"flag"`` (the state's
        ``stuck`` flag, the ``"stuck"`` metric of :func:`mpjax.make_train_step`).

    Returns:
      The wrapped transformation.

    Raises:
      ValueError: on non-positive scales, ``period < 1``, ``factor <= 1``,
        ``min_scale > max_scale``, an initial scale outside the bounds, an
        unknown ``skip`` or ``on_stuck``, or ``max_consecutive_skips < 1``.
      TypeError: if a hyperparameter is not a Python number (``period`` must be
        an int).

    >>> opt = dynamic_loss_scaling(optax.sgd(0.1), init_scale=8.0, period=1)
    >>> state = opt.init({"w": jnp.zeros(2)})
    >>> _, state = opt.update({"w": jnp.ones(2)}, state)
    >>> float(state.scale)
    16.0
    """
    init_scale, period, factor, min_scale, max_scale = _check_dynamic(
        init_scale, period, factor, min_scale, max_scale
    )

    def initial() -> dict[str, jax.Array]:
        return {
            "scale": jnp.asarray(init_scale, jnp.float32),
            "counter": jnp.zeros((), jnp.int32),
        }

    def adjust(state: DynamicLossScaleState, accepted: jax.Array) -> dict:
        f = jnp.float32(factor)
        counter = state.counter + 1
        grow = jnp.logical_and(accepted, counter >= period)
        scale = jnp.where(
            accepted, jnp.where(grow, state.scale * f, state.scale), state.scale / f
        )
        scale = jnp.clip(scale, jnp.float32(min_scale), jnp.float32(max_scale))
        counter = jnp.where(jnp.logical_and(accepted, ~grow), counter, 0)
        return {
            "scale": scale.astype(jnp.float32),
            "counter": counter.astype(jnp.int32),
        }

    return _make_transform(
        inner,
        skip=skip,
        max_consecutive_skips=max_consecutive_skips,
        on_stuck=on_stuck,
        state_type=DynamicLossScaleState,
        scale_fields=initial,
        next_scale_fields=adjust,
    )


#: The three loss-scaling state types (readers search optimizer states for them).
STATE_TYPES = (DynamicLossScaleState, StaticLossScaleState, NoLossScaleState)
