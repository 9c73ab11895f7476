"""Precision policies for Flax models.

Two entry points:

* :func:`apply_policy` returns a copy of a Flax NNX module whose layers compute in a
  policy's compute dtype, keep their parameters in its param dtype and return the
  output dtype, with per-module-type overrides (normalisation layers in float32 by
  default, as Haiku's per-class policies do) and attention logits and softmax in
  float32.
* :func:`policy_apply` wraps any linen-style ``apply(params, *args, **kwargs)``
  function so that parameters and inputs are cast to the compute dtype and outputs
  to the output dtype.

How :func:`apply_policy` reaches into a model. Every NNX module in the model graph
gets an *effective policy*: the override registered for the nearest class in its
method resolution order, otherwise the effective policy of the module that holds it,
and the main policy at the root. Then, per module:

1. a ``dtype`` attribute (the computation dtype of Flax layers) is set to the
   compute dtype, and a ``param_dtype`` attribute to the param dtype;
2. every ``promote_dtype`` hook (also ``qkv_promote_dtype``, ``out_promote_dtype``,
   ...) is replaced by one that casts the floating-point operands to the compute
   dtype, even where a layer passes ``dtype=None``;
3. floating-point :class:`flax.nnx.Param` values are cast to the param dtype (other
   variables, such as batch statistics and RNG state, are left alone);
4. the default attention function of :class:`flax.nnx.MultiHeadAttention` (its
   ``attention_fn`` hook) is replaced by one that runs the fused
   :func:`jax.nn.dot_product_attention` (cuDNN's flash attention on a GPU where
   its rules allow, XLA's otherwise; softmax statistics in float32) when
   ``attention_softmax_dtype`` is float32 and no dropout is active and no weights
   are sown, and Flax's own attention weights in ``attention_softmax_dtype``
   otherwise;
5. the output is cast to the policy's output dtype at the root: the copy's root
   is a fresh instance of a subclass of the root's class whose ``__call__`` casts
   floating-point positional arguments to the compute dtype and the outputs to
   the output dtype, so ``isinstance`` checks, attribute paths and the state tree
   (``nnx.split``/``nnx.state``) are exactly those of the original. No object's
   class is ever reassigned, and no module inside the model is replaced: inside,
   every layer casts its own operands (step 2), so a module under an override
   returns what its layers compute in the override's compute dtype.

Only the root's ``__call__`` is wrapped; its other methods still run in the dtypes
set on the layers but return whatever the layers produce.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
from flax import nnx

from mpjax._equinox import apply_policy_equinox, is_equinox_module
from mpjax._fp8 import Fp8Config
from mpjax._fp8_ops import attach_fp8
from mpjax._policy import Policy, override_table, parse_dtype, resolve_policy

__all__ = ["apply_policy", "policy_apply"]

_M = TypeVar("_M", bound=nnx.Module)

# Normalisation layers keep their statistics, scale and output in float32: variance
# sums of bf16/fp16 activations lose most of their digits.
_DEFAULT_OVERRIDES: Mapping[type, str] = types.MappingProxyType(
    {
        nnx.LayerNorm: "float32",
        nnx.RMSNorm: "float32",
        nnx.BatchNorm: "float32",
        nnx.GroupNorm: "float32",
    }
)


def _floating_dtype(value: Any, what: str) -> jnp.dtype:
    """A floating dtype from a dtype, a type or a policy dtype name (``"bf16"``)."""
    try:
        dtype = parse_dtype(value) if isinstance(value, str) else jnp.dtype(value)
    except (TypeError, ValueError) as err:
        raise type(err)(
            f"{what} must be a floating-point dtype such as 'float32', got "
            f"{value!r} ({err}); pass a jnp dtype or its name."
        ) from err
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(
            f"{what} must be a floating-point dtype such as 'float32', got "
            f"{dtype.name!r}; pass a floating dtype or None."
        )
    return dtype


def _is_float_array(x: Any) -> bool:
    return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)


@dataclasses.dataclass(frozen=True)
class _PromoteTo:
    """A Flax ``promote_dtype`` hook that casts floating operands to ``dtype``.

    Non-floating operands and ``None`` pass through untouched; the ``dtype`` that
    a layer passes (often ``None`` for "infer") is ignored in favour of the
    policy's compute dtype.
    """

    dtype: jnp.dtype

    def __call__(self, args: tuple, /, *, dtype: Any = None, inexact: bool = True):
        del dtype, inexact
        return tuple(
            x.astype(self.dtype) if _is_float_array(x) else x
            for x in (jnp.asarray(a) if a is not None else None for a in args)
        )


_HALF = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
# what jax.nn.dot_product_attention raises (while tracing) for a shape, dtype or
# device that cuDNN's flash attention does not take
_CUDNN_REFUSALS = (ValueError, NotImplementedError, RuntimeError, TypeError)


def _standard_promotion(*args: Any, **kwargs: Any) -> jax.Array:
    """:func:`jax.nn.dot_product_attention` under standard dtype promotion: its XLA
    implementation mixes 16-bit operands with float32 logits on purpose (it calls
    ``promote_types(query.dtype, float32)``), which strict promotion refuses."""
    with jax.numpy_dtype_promotion("standard"):
        return jax.nn.dot_product_attention(*args, **kwargs)


def _fused_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    bias: jax.Array | None,
    mask: jax.Array | None,
    is_causal: bool,
) -> jax.Array:
    """:func:`jax.nn.dot_product_attention` on Flax's ``[batch..., length, heads,
    depth]`` layout: cuDNN's flash attention on a GPU when it takes the shapes and
    the (16-bit) dtype, XLA's implementation otherwise. Both keep the softmax
    statistics in float32 (XLA's computes the logits and softmax in float32)."""
    shape = query.shape
    if query.ndim > 4:  # jax.nn wants one batch dimension

        def flat(x: jax.Array | None) -> jax.Array | None:
            return None if x is None else x.reshape((-1, *x.shape[-3:]))

        query, key, value, bias, mask = map(flat, (query, key, value, bias, mask))
    if mask is not None:
        mask = mask.astype(jnp.bool_)
    attend = functools.partial(_standard_promotion, is_causal=is_causal)
    out = None
    if jax.default_backend() == "gpu" and query.dtype in _HALF:
        low = None if bias is None else bias.astype(query.dtype)
        try:
            out = attend(query, key, value, low, mask, implementation="cudnn")
        except _CUDNN_REFUSALS:
            out = None
    if out is None:
        wide = None if bias is None else bias.astype(jnp.float32)
        out = attend(query, key, value, wide, mask, implementation="xla")
    return out.reshape(shape[:-1] + out.shape[-1:])


@dataclasses.dataclass(frozen=True)
class _PolicyAttention:
    """NNX's ``attention_fn`` hook under a policy (same keyword arguments as
    :func:`flax.nnx.dot_product_attention`).

    Queries, keys and values are promoted to the compute dtype. With a float32
    ``softmax_dtype``, no active dropout, no weights to sow and no explicit
    precision (and, for float16, on a GPU), the attention is fused
    (:func:`jax.nn.dot_product_attention`, see `_fused_attention`). Otherwise Flax's own
    :func:`flax.nnx.nn.attention.dot_product_attention_weights` computes the
    weights from queries and keys in ``softmax_dtype`` (logits, mask, softmax,
    dropout and the sown weights in that dtype), and they multiply the values in
    the compute dtype.
    """

    softmax_dtype: jnp.dtype

    def __call__(
        self,
        query: jax.Array,
        key: jax.Array,
        value: jax.Array,
        bias: jax.Array | None = None,
        mask: jax.Array | None = None,
        broadcast_dropout: bool = True,
        dropout_rng: jax.Array | None = None,
        dropout_rate: float = 0.0,
        deterministic: bool = False,
        dtype: Any = None,
        precision: Any = None,
        module: nnx.Module | None = None,
        promote_dtype: Callable[..., tuple] | None = None,
        is_causal: bool = False,
    ) -> jax.Array:
        if promote_dtype is None:
            promote_dtype = nnx.nn.dtypes.promote_dtype
        query, key, value = promote_dtype((query, key, value), dtype=dtype)
        dropout = not deterministic and dropout_rate > 0.0
        wide = self.softmax_dtype
        # jax.nn's XLA attention asks for F16_F16_F32 products, which only GPUs
        # lower (the CPU and TPU refuse them at compile time)
        f16_ok = query.dtype != jnp.float16 or jax.default_backend() == "gpu"
        plain = not dropout and module is None and not precision
        if wide == jnp.float32 and plain and f16_ok:
            return _fused_attention(query, key, value, bias, mask, is_causal)
        weights = nnx.nn.attention.dot_product_attention_weights(
            query.astype(wide),
            key.astype(wide),
            None if bias is None else bias.astype(wide),
            mask,
            broadcast_dropout,
            dropout_rng,
            dropout_rate,
            deterministic,
            wide,
            precision,
            module,
            is_causal=is_causal,
        )
        if weights.shape[-3] != value.shape[-2]:  # grouped-query attention
            value = jnp.repeat(value, weights.shape[-3] // value.shape[-2], axis=-2)
        return jnp.einsum(
            "...hqk,...khd->...qhd",
            weights.astype(value.dtype),
            value,
            precision=precision,
        )


def _original_class(cls: type) -> type:
    return getattr(cls, "_mpjax_original_class", cls)


@functools.cache
def _policy_class(cls: type) -> type:
    """A subclass of ``cls`` whose ``__call__`` applies the instance's policy.

    Cached so that every policy-applied copy of a class shares one class object,
    which keeps graph definitions equal (and ``jit`` caches warm) across copies.
    """
    original_call = cls.__call__

    def __call__(self, *args, **kwargs):
        policy = self.mpjax_policy
        return policy.cast_to_output(
            original_call(self, *policy.cast_to_compute(args), **kwargs)
        )

    __call__.__doc__ = original_call.__doc__
    return type(
        cls.__name__,
        (cls,),
        {
            "__call__": __call__,
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
            "_mpjax_original_class": cls,
        },
    )


def _with_output_cast(module: _M, policy: Policy) -> _M:
    """A new instance of the policy subclass of ``module``'s class holding
    ``module``'s attributes (``module`` itself, a fresh copy, is dropped)."""
    root = object.__new__(_policy_class(_original_class(type(module))))
    vars(root).update(vars(module))
    root.mpjax_policy = policy
    return root


def _override_for(
    module: nnx.Module, overrides: Mapping[type, Policy]
) -> Policy | None:
    for cls in _original_class(type(module)).__mro__:
        if cls in overrides:
            return overrides[cls]
    return None


def _configure(
    module: nnx.Module, policy: Policy, softmax_dtype: jnp.dtype | None
) -> None:
    """Sets the dtype attributes and hooks of one module for ``policy``."""
    attributes = vars(module)
    if "dtype" in attributes:
        module.dtype = policy.compute_dtype
    if "param_dtype" in attributes:
        module.param_dtype = policy.param_dtype
    for name, value in list(attributes.items()):
        if (name == "promote_dtype" or name.endswith("_promote_dtype")) and callable(
            value
        ):
            setattr(module, name, _PromoteTo(policy.compute_dtype))
    if (
        softmax_dtype is not None
        and isinstance(module, nnx.MultiHeadAttention)
        and (
            module.attention_fn is nnx.dot_product_attention
            or isinstance(module.attention_fn, _PolicyAttention)
        )
    ):
        module.attention_fn = _PolicyAttention(softmax_dtype)


def apply_policy(
    model: _M,
    policy: Policy | str | Any,
    *,
    overrides: Mapping[type, Policy | str] | None = None,
    attention_softmax_dtype: Any = jnp.float32,
    fp8: Fp8Config | None = None,
) -> _M:
    """Returns a copy of a Flax NNX module that computes under a precision policy.

    An Equinox module (``eqx.Module``) takes the Equinox route: the same policy,
    overrides (keyed by Equinox classes; ``eqx.nn.LayerNorm``, ``RMSNorm``,
    ``GroupNorm`` and ``BatchNorm`` in float32 by default) and fp8 products in
    every ``eqx.nn.Linear``, described in ``mpjax._equinox``;
    ``attention_softmax_dtype`` does not apply there.

    Args:
        model: the :class:`flax.nnx.Module` (or ``eqx.Module``) to convert; it
            is not modified.
        policy: an :class:`mpjax.Policy`, a policy string for
            :func:`mpjax.get_policy` (``"mixed_bfloat16"``, ``"p=f32,c=f16,o=f32"``)
            or a ``jmp.Policy``.
        overrides: per-module-type policies, merged over the defaults (LayerNorm,
            RMSNorm, BatchNorm and GroupNorm in ``"float32"``). The nearest class
            in a module's MRO wins, and a module without an override inherits the
            policy of the module that holds it. To undo a default, map that class
            to the main policy.
        attention_softmax_dtype: dtype of the attention logits and softmax in
            :class:`flax.nnx.MultiHeadAttention` layers that use Flax's default
            attention function, or ``None`` to leave them in the compute dtype.
        fp8: an :class:`mpjax.Fp8Config` to run the matrix products of
            ``nnx.Linear``, ``nnx.LinearGeneral`` (attention projections included)
            and ``nnx.Einsum`` layers in fp8 with delayed scaling (see
            :func:`mpjax.fp8_delayed_scaling` for training), or ``None``.

    Returns:
        A policy-applied copy of ``model``, an instance of a subclass of its class
        (whose ``__call__`` casts to the output dtype) with the same attributes
        and state paths. Parameters of the copy share no state with ``model``.

    Raises:
        TypeError: ``model`` is not an NNX module, an override key is not an NNX
            module class, or ``fp8`` is not an :class:`mpjax.Fp8Config`.
        ValueError: a policy or dtype cannot be parsed.

    Example:
        >>> from flax import nnx
        >>> import jax.numpy as jnp
        >>> layer = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
        >>> mixed = apply_policy(layer, "mixed_bfloat16")
        >>> mixed(jnp.ones((1, 3))).dtype, mixed.kernel.dtype, mixed.dtype
        (dtype('float32'), dtype('float32'), dtype(bfloat16))
    """
    if is_equinox_module(model):
        return apply_policy_equinox(model, policy, overrides=overrides, fp8=fp8)
    if not isinstance(model, nnx.Module):
        raise TypeError(
            "apply_policy expects a Flax NNX module (an instance of "
            f"flax.nnx.Module) or an Equinox module (eqx.Module, with "
            f"`pip install 'mpjax[equinox]'`), got {type(model).__name__}; for a "
            "linen-style apply function use mpjax.policy_apply(apply_fn, policy)."
        )
    main = resolve_policy(policy, "policy")
    table = override_table(
        overrides,
        _DEFAULT_OVERRIDES,
        base=nnx.Module,
        library="Flax NNX",
        example="nnx.LayerNorm",
    )
    softmax_dtype = (
        None
        if attention_softmax_dtype is None
        else _floating_dtype(attention_softmax_dtype, "attention_softmax_dtype")
    )

    copy = nnx.clone(model)
    nodes = list(nnx.iter_graph(copy))
    modules = {path: node for path, node in nodes if isinstance(node, nnx.Module)}
    effective: dict[tuple, Policy] = {}
    for path in sorted(modules, key=len):
        module = modules[path]
        parent = next(
            (
                effective[path[:i]]
                for i in range(len(path) - 1, -1, -1)
                if path[:i] in effective
            ),
            main,
        )
        own = _override_for(module, table)
        chosen = parent if own is None else own
        effective[path] = chosen
        _configure(module, chosen, softmax_dtype)

    for path, node in nodes:
        if isinstance(node, nnx.Param):
            owner = next(
                effective[path[:i]]
                for i in range(len(path) - 1, -1, -1)
                if path[:i] in effective
            )
            value = node.get_value()
            if _is_float_array(value) and value.dtype != owner.param_dtype:
                node.set_value(value.astype(owner.param_dtype))
    if fp8 is not None:
        attach_fp8(copy, fp8)
    return _with_output_cast(copy, effective[()])


def policy_apply(
    apply_fn: Callable[..., Any], policy: Policy | str | Any
) -> Callable[..., Any]:
    """Wraps a linen-style ``apply(params, *args, **kwargs)`` function in a policy.

    The wrapper casts the floating-point leaves of ``params`` and of the positional
    arguments to the compute dtype, calls ``apply_fn`` and casts the floating-point
    leaves of its result to the output dtype. Keyword arguments (``rngs``,
    ``mutable``, ``train`` flags, ...) pass through unchanged. Keep the stored
    parameters in the param dtype (``policy.cast_to_param``); gradients taken
    through the wrapper come back in the dtype of the parameters passed in.

    Args:
        apply_fn: the function to wrap, e.g. ``flax.linen.Module.apply``.
        policy: an :class:`mpjax.Policy`, a policy string or a ``jmp.Policy``.

    Returns:
        ``wrapped(params, *args, **kwargs)`` with the same signature.

    Raises:
        TypeError: ``apply_fn`` is not callable.
        ValueError: ``policy`` cannot be parsed.

    Example:
        >>> import jax.numpy as jnp
        >>> apply = policy_apply(lambda p, x: x @ p["w"], "mixed_float16")
        >>> apply({"w": jnp.ones((2, 2))}, jnp.ones((1, 2))).dtype
        dtype('float32')
    """
    if not callable(apply_fn):
        raise TypeError(
            "policy_apply expects a callable apply(params, *args, **kwargs), got "
            f"{type(apply_fn).__name__}; pass e.g. model.apply."
        )
    resolved = resolve_policy(policy, "policy")

    @functools.wraps(apply_fn)
    def wrapped(params: Any, *args: Any, **kwargs: Any) -> Any:
        params = resolved.cast_to_compute(params)
        args = resolved.cast_to_compute(args)
        return resolved.cast_to_output(apply_fn(params, *args, **kwargs))

    return wrapped
