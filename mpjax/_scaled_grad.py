"""Value-and-gradient of a loss multiplied by a loss scale.

:func:`scaled_value_and_grad` is the other half of the loss-scaling transforms in
:mod:`mpjax._loss_scaling`: it produces the *scaled* gradients those transforms
unscale, together with the unscaled loss.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from mpjax._loss_scale_readers import loss_scale_or_one
from mpjax._loss_scaling import is_float_array, wide_dtype
from mpjax._trees import gradient_placeholder, is_inexact_array

__all__ = ["nnx_value_and_grad", "scaled_value_and_grad"]


def _scale(out: Any, loss_scale: Any, has_aux: bool) -> tuple[Any, Any]:
    """``(loss * scale in float32 or wider, (loss, aux))`` of a loss function's
    output, after checking that the loss is a floating scalar."""
    loss, aux = out if has_aux else (out, None)
    if not is_float_array(loss) or jnp.ndim(loss) != 0:
        raise TypeError(
            "loss_fn must return a floating scalar"
            + (" as the first element of (loss, aux)" if has_aux else "")
            + f", got {getattr(loss, 'dtype', type(loss).__name__)} with shape "
            f"{jnp.shape(loss)}; reduce the loss (e.g. jnp.mean) and return it."
        )
    wide = wide_dtype(loss.dtype)
    scale = lax.stop_gradient(jnp.asarray(loss_scale, jnp.float32)).astype(wide)
    return loss.astype(wide) * scale, (loss, aux)


def scaled_value_and_grad(
    loss_fn: Callable[..., Any], *, has_aux: bool = False
) -> Callable[..., tuple[Any, Any]]:
    """Turns ``loss_fn(params, *args)`` into one returning scaled gradients.

    The returned ``f(params, loss_scale, *args)`` multiplies the loss by
    ``loss_scale`` in float32 before differentiating and returns ``(loss,
    scaled_grads)`` (``((loss, aux), scaled_grads)`` with ``has_aux``), where
    ``loss`` is the unscaled loss in its own dtype. Feed the gradients to a loss
    scaler's ``update``, which unscales them. ``params`` may be any pytree, an
    Equinox module included, with the filter semantics of
    ``eqx.filter_value_and_grad``: only floating-point array leaves are
    differentiated; integer and boolean arrays (counters, masks) get zero
    gradients of their own dtype, to be left alone by the optimizer (e.g.
    ``optax.multi_transform`` with ``optax.set_to_zero()`` for them), and leaves
    that are not arrays (functions, flags, Python numbers) get ``None``.

    Args:
      loss_fn: a function of ``(params, *args)`` returning a floating scalar (or
        ``(scalar, aux)`` with ``has_aux``).
      has_aux: whether ``loss_fn`` returns auxiliary data.

    Returns:
      The scaled value-and-grad function.

    >>> f = scaled_value_and_grad(lambda w, x: jnp.sum(w * x))
    >>> loss, g = f(jnp.ones(2), jnp.float32(8.0), jnp.arange(2.0))
    >>> float(loss), g.tolist()
    (1.0, [0.0, 8.0])
    """
    if not callable(loss_fn):
        raise TypeError(
            f"loss_fn must be callable, got {type(loss_fn).__name__}; pass a "
            "function loss_fn(params, *args) -> scalar."
        )

    def scaled_loss(
        float_leaves: list[Any],
        leaves: list[Any],
        treedef: Any,
        loss_scale: Any,
        *args: Any,
    ) -> tuple[Any, Any]:
        it = iter(float_leaves)
        merged = [next(it) if is_inexact_array(x) else x for x in leaves]
        out = loss_fn(jax.tree.unflatten(treedef, merged), *args)
        return _scale(out, loss_scale, has_aux)

    grad_fn = jax.grad(scaled_loss, has_aux=True)

    def value_and_scaled_grad(
        params: Any, loss_scale: Any, *args: Any
    ) -> tuple[Any, Any]:
        leaves, treedef = jax.tree.flatten(params)
        float_leaves = [x for x in leaves if is_inexact_array(x)]
        float_grads, (loss, aux) = grad_fn(
            float_leaves, leaves, treedef, loss_scale, *args
        )
        it = iter(float_grads)
        grads = [
            next(it) if is_inexact_array(x) else gradient_placeholder(x) for x in leaves
        ]
        return ((loss, aux) if has_aux else loss), jax.tree.unflatten(treedef, grads)

    return value_and_scaled_grad


def nnx_value_and_grad(
    loss_fn: Callable[..., Any],
    optimizer: Any,
    *,
    argnums: int | Sequence[int] = 0,
    has_aux: bool = False,
) -> Callable[..., tuple[Any, Any]]:
    """``nnx.value_and_grad`` whose gradients carry the optimizer's loss scale.

    The Flax NNX twin of :func:`scaled_value_and_grad`: it reads the current loss
    scale from ``optimizer`` (an ``nnx.Optimizer`` built around a loss-scaling
    transform, e.g. ``mpjax.dynamic_loss_scaling(optax.adam(1e-3))``), multiplies
    the loss by it in float32 before differentiating, and returns the unscaled
    loss with the scaled gradients, which ``optimizer.update(model, grads)``
    unscales (skipping the step if they overflowed). Without a loss-scaling
    transform the scale is 1 and this is ``nnx.value_and_grad``. Call it inside
    the jitted train step, so the scale is read at every step.

    Args:
      loss_fn: ``loss_fn(model, *args)`` returning a floating scalar (or
        ``(scalar, aux)`` with ``has_aux``).
      optimizer: the ``nnx.Optimizer`` whose state holds the loss scale.
      argnums: which arguments to differentiate, as for ``nnx.value_and_grad``.
      has_aux: whether ``loss_fn`` returns auxiliary data.

    Returns:
      ``f(*args) -> (loss, grads)`` (``((loss, aux), grads)`` with ``has_aux``).

    >>> import optax
    >>> from flax import nnx
    >>> import mpjax
    >>> model = nnx.Linear(2, 1, rngs=nnx.Rngs(0))
    >>> tx = mpjax.dynamic_loss_scaling(optax.sgd(0.1), init_scale=8.0)
    >>> opt = nnx.Optimizer(model, tx, wrt=nnx.Param)
    >>> loss_fn = lambda m: jnp.mean(m(jnp.ones((1, 2))) ** 2)
    >>> loss, grads = nnx_value_and_grad(loss_fn, opt)(model)
    >>> plain = nnx.grad(loss_fn)(model)
    >>> bool(jnp.allclose(grads["kernel"][...], 8.0 * plain["kernel"][...]))
    True
    """
    from flax import nnx

    if not callable(loss_fn):
        raise TypeError(
            f"loss_fn must be callable, got {type(loss_fn).__name__}; pass a "
            "function loss_fn(model, *args) -> scalar."
        )
    if not isinstance(optimizer, nnx.Optimizer):
        raise TypeError(
            f"optimizer must be an nnx.Optimizer, got {type(optimizer).__name__}; "
            "for functional (optax) training use mpjax.scaled_value_and_grad."
        )

    def value_and_scaled_grad(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
        scale = loss_scale_or_one(optimizer)

        def scaled(*a: Any, **kw: Any) -> tuple[Any, Any]:
            return _scale(loss_fn(*a, **kw), scale, has_aux)

        # allow_int: the fp8 state (int32 bit patterns) rides along with the
        # parameters; only its float32 amax field carries a gradient.
        grad_fn = nnx.value_and_grad(
            scaled, argnums=argnums, has_aux=True, allow_int=True
        )
        (_, (loss, aux)), grads = grad_fn(*args, **kwargs)
        return ((loss, aux) if has_aux else loss), grads

    return value_and_scaled_grad
