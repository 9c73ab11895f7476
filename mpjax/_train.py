"""A mixed-precision train step: master params, cast compute, scaled loss.

:func:`make_train_step` returns a pure ``step(state, batch) -> (state, metrics)``.
Parameters stay in the policy's ``param_dtype`` (float32 master weights), the loss
function sees parameters and batch cast to ``compute_dtype``, its result is cast
to ``output_dtype``, and the gradients of the loss multiplied by the current loss
scale (read from the optimizer state with :func:`mpjax.get_loss_scale`) go to the
optimizer, which unscales them when it is a loss scaler.

The step donates nothing; jit it yourself, donating the state to update it in
place: ``step = jax.jit(make_train_step(...), donate_argnums=0)``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from mpjax._loss_scale_readers import (
    loss_scale_or_one,
    skipped_steps_or_zero,
    stuck_or_false,
)
from mpjax._policy import Policy, get_policy
from mpjax._scaled_grad import scaled_value_and_grad
from mpjax._trees import (
    apply_updates,
    arrays_only,
    gradient_placeholder,
    is_inexact_array,
)

__all__ = ["PrecisionWarning", "TrainState", "make_train_step"]

#: Gradient size of the probe step of ``check_master_precision``, before
#: loss scaling: an ordinary gradient whose square (Adam's second moment)
#: underflows in float16.
PROBE_GRADIENT = 2.0**-10


class PrecisionWarning(UserWarning):
    """A precision choice that will corrupt or stall training (for example
    float16 master parameters under Adam)."""


class TrainState(NamedTuple):
    """Training state: a pytree of arrays, ready for ``jit``, ``scan`` and
    checkpointing (the loss-scale state is part of ``opt_state``).

    Attributes:
      step: int32 number of train steps taken (skipped ones included).
      params: parameter pytree (master weights, normally float32); any pytree,
        an Equinox module included: leaves that are not arrays ride along
        untouched.
      opt_state: optimizer state, initialised on the array leaves of
        ``params`` (``None`` in place of the others).
    """

    step: jax.Array
    params: Any
    opt_state: optax.OptState

    @classmethod
    def create(
        cls,
        params: Any,
        optimizer: optax.GradientTransformation,
        *,
        policy: Policy | str | None = None,
    ) -> TrainState:
        """Creates the initial state.

        With master parameters narrower than float32 (float16, bfloat16), one
        probe step of ``optimizer`` checks that an ordinary gradient keeps them
        finite (see ``check_master_precision``); if not, a
        :class:`PrecisionWarning` says how to keep float32 masters.

        Args:
          params: initial parameters.
          optimizer: the optimizer whose state to initialise.
          policy: if given, floating parameters are first cast to its
            ``param_dtype``.

        Returns:
          A state with ``step == 0``.

        >>> import optax
        >>> s = TrainState.create({"w": jnp.zeros(2)}, optax.sgd(0.1))
        >>> int(s.step)
        0
        """
        _check_optimizer(optimizer)
        if policy is not None:
            params = get_policy(policy).cast_to_param(params)
        opt_state = optimizer.init(arrays_only(params))
        check_master_precision(params, optimizer, opt_state)
        return cls(step=jnp.zeros((), jnp.int32), params=params, opt_state=opt_state)


def _probe_rejects(params: Any, optimizer: Any, opt_state: Any) -> bool:
    """Whether one step with gradients of :data:`PROBE_GRADIENT` (times the loss
    scale) is rejected by a loss scaler or makes a parameter non-finite."""
    scale = float(loss_scale_or_one(opt_state))
    trainable = arrays_only(params)
    grads = jax.tree.map(
        lambda p: (
            jnp.full_like(p, PROBE_GRADIENT * scale)
            if is_inexact_array(p)
            else gradient_placeholder(p)
        ),
        trainable,
    )
    # optax's own transformations promote Python constants against the params
    with jax.numpy_dtype_promotion("standard"):
        updates, new_state = optimizer.update(grads, opt_state, trainable)
        new = apply_updates(trainable, updates)
    finite = all(
        bool(jnp.all(jnp.isfinite(x)))
        for x in jax.tree.leaves(new)
        if is_inexact_array(x)
    )
    return not finite or bool(
        skipped_steps_or_zero(new_state) > skipped_steps_or_zero(opt_state)
    )


def check_master_precision(params: Any, optimizer: Any, opt_state: Any) -> None:
    """Warns when master parameters narrower than float32 cannot take a step.

    Adam's ``eps=1e-8`` is 0 in float16, and the second moment of an ordinary
    gradient (``(1 - b2) * g**2``) underflows too, so the first update divides
    by zero. The check runs one probe step eagerly; it is skipped for float32 (or
    wider) masters and while tracing (``jax.eval_shape`` of a state).

    Warns:
      PrecisionWarning: when the probe step is rejected or makes a parameter
        non-finite.
    """
    leaves = [x for x in jax.tree.leaves(params) if is_inexact_array(x)]
    narrow = sorted({x.dtype.name for x in leaves if x.dtype.itemsize < 4})
    if not narrow or any(isinstance(x, jax.core.Tracer) for x in leaves):
        return
    if _probe_rejects(params, optimizer, opt_state):
        warnings.warn(
            f"TrainState.create: the master parameters are {', '.join(narrow)}, "
            f"and one step of this optimizer with gradients of {PROBE_GRADIENT:g} "
            "makes a parameter non-finite: a constant of the optimizer underflows "
            "in that dtype (Adam's eps=1e-8 is 0 in float16). Every such step "
            "will be skipped. Keep float32 master parameters: a policy with "
            "float32 params such as 'mixed_float16' (p=float32,c=float16,"
            "o=float32) instead of 'half' or 'float16', or create the state from "
            "float32 parameters.",
            PrecisionWarning,
            stacklevel=3,
        )


def _check_optimizer(optimizer: Any) -> None:
    if not (callable(getattr(optimizer, "init", None)) and callable(optimizer.update)):
        raise TypeError(
            "optimizer must be an optax.GradientTransformation (with init and "
            f"update), got {type(optimizer).__name__}; pass e.g. "
            "mpjax.dynamic_loss_scaling(optax.adam(1e-3))."
        )


def _global_norm_unscaled(grads: Any, scale: jax.Array) -> jax.Array:
    """Global L2 norm of ``grads / scale``, accumulated in float32.

    The fp8 state (:class:`mpjax.Fp8MetaValue`) travels as a "gradient" holding
    measured amaxes, not derivatives, and is left out.
    """
    from mpjax._fp8 import Fp8MetaValue

    squares = []
    leaves = jax.tree.leaves(grads, is_leaf=lambda x: isinstance(x, Fp8MetaValue))
    for g in leaves:
        if isinstance(g, Fp8MetaValue):
            continue
        if not (hasattr(g, "dtype") and jnp.issubdtype(g.dtype, jnp.inexact)):
            continue  # integer parameters carry no gradient
        if jnp.issubdtype(g.dtype, jnp.complexfloating):
            g = jnp.abs(g)
        squares.append(jnp.sum(jnp.square(g.astype(jnp.float32) / scale)))
    if not squares:
        return jnp.zeros((), jnp.float32)
    return jnp.sqrt(sum(squares[1:], squares[0]))


def make_train_step(
    loss_fn: Callable[..., Any],
    optimizer: optax.GradientTransformation,
    policy: Policy | str | Any,
    *,
    has_aux: bool = False,
) -> Callable[[TrainState, Any], tuple[TrainState, dict[str, Any]]]:
    """Builds a pure mixed-precision train step.

    Args:
      loss_fn: ``loss_fn(params, batch) -> scalar`` (or ``(scalar, aux)`` with
        ``has_aux``); it receives params and batch already cast to the policy's
        compute dtype (only floating leaves: integer labels stay integers).
      optimizer: an optax transformation; wrap it in
        :func:`mpjax.dynamic_loss_scaling` for float16 compute. Without a
        loss-scaling wrapper the scale is 1 and no step is ever skipped.
      policy: a :class:`mpjax.Policy` or anything :func:`mpjax.get_policy`
        accepts (``"mixed_bfloat16"``, ``"p=f32,c=f16,o=f32"``, a jmp policy).
      has_aux: whether ``loss_fn`` returns ``(loss, aux)``.

    Returns:
      ``step(state, batch) -> (state, metrics)``, pure and jit-able. ``metrics``
      holds float32 scalars ``"loss"`` (the unscaled loss, computed in the
      output dtype), ``"loss_scale"`` (the scale used for this step),
      ``"grad_norm"`` (global norm of the unscaled gradients; Inf/NaN on a
      skipped step), a bool ``"skipped"``, a bool ``"stuck"`` (the loss scaler
      has rejected ``max_consecutive_skips`` steps in a row; see
      :func:`mpjax.dynamic_loss_scaling`), and ``"aux"`` with ``has_aux``.
      ``params`` may be any pytree, an Equinox module included: only its
      floating array leaves are differentiated and trained (the filter
      semantics of ``eqx.filter_value_and_grad``).
      ``state.step`` counts calls, skipped ones included. The step donates
      nothing: compile it with ``jax.jit(step, donate_argnums=0)`` to update the
      state in place.

    Raises:
      TypeError: if ``loss_fn`` is not callable or ``optimizer`` is not an optax
        transformation.
      ValueError: if ``policy`` cannot be parsed.

    >>> import optax
    >>> opt = optax.sgd(0.5)
    >>> step = jax.jit(make_train_step(lambda p, b: jnp.sum((p - b) ** 2), opt,
    ...                                "float32"))
    >>> state, metrics = step(TrainState.create(jnp.zeros(2), opt), jnp.ones(2))
    >>> float(metrics["loss"]), state.params.tolist()
    (2.0, [1.0, 1.0])
    """
    if not callable(loss_fn):
        raise TypeError(
            f"loss_fn must be callable, got {type(loss_fn).__name__}; pass a "
            "function loss_fn(params, batch) -> scalar."
        )
    _check_optimizer(optimizer)
    policy = get_policy(policy)

    def compute_loss(params: Any, batch: Any) -> tuple[Any, Any]:
        out = loss_fn(policy.cast_to_compute(params), policy.cast_to_compute(batch))
        loss, aux = out if has_aux else (out, None)
        return policy.cast_to_output(loss), aux

    value_and_grad = scaled_value_and_grad(compute_loss, has_aux=True)

    def step(state: TrainState, batch: Any) -> tuple[TrainState, dict[str, Any]]:
        scale = loss_scale_or_one(state.opt_state)
        skipped_before = skipped_steps_or_zero(state.opt_state)
        (loss, aux), grads = value_and_grad(state.params, scale, batch)
        updates, opt_state = optimizer.update(
            grads, state.opt_state, arrays_only(state.params)
        )
        params = apply_updates(state.params, updates)
        metrics: dict[str, Any] = {
            "loss": jnp.asarray(loss).astype(jnp.float32),
            "loss_scale": scale,
            "skipped": skipped_steps_or_zero(opt_state) > skipped_before,
            "stuck": stuck_or_false(opt_state),
            "grad_norm": _global_norm_unscaled(grads, scale),
        }
        if has_aux:
            metrics["aux"] = aux
        new_state = TrainState(step=state.step + 1, params=params, opt_state=opt_state)
        return new_state, metrics

    return step
