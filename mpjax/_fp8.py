"""fp8 matrix products with delayed scaling for Flax NNX layers.

Every fp8 matrix product quantises its two forward operands to ``float8_e4m3fn``
and the cotangent flowing back into it to ``float8_e5m2``, each with a per-tensor
scale computed from a history of absolute maxima (*amax*), the recipe of
Transformer Engine and of :mod:`flax.linen.fp8_ops`, whose ``dequantize``,
``compute_scale`` and ``compute_amax_history`` and max-accumulating ``fm32``
dtype are reused here.

How the state moves. A layer converted by ``mpjax.apply_policy(model, policy,
fp8=Fp8Config(...))`` holds one :class:`Fp8Meta` variable per matrix product whose
value is a :class:`Fp8MetaValue`: the three scales and amax histories (rows
``lhs``, ``rhs``, ``grad``) and a float32 ``amax`` field that is always zero. The
forward pass quantises with the stored scales (those of the previous steps) and
the backward pass returns the amaxes it measured *as the gradient of* ``amax``.
:func:`mpjax.fp8_delayed_scaling` wraps the optimizer, keeps these variables
away from the inner optimizer and writes the updated histories and scales back.
:func:`fp8_loss` makes a layer used several times in one step record the maximum
of its amaxes rather than their sum (``amax`` travels as Flax's ``fm32`` dtype,
whose gradients accumulate with ``max``).

Scales and histories are stored as the int32 bit patterns of float32 values:
``optax.apply_updates`` adds updates to parameters, and ``old + (new - old)`` is
exact in two's-complement integers but not in floating point. Read them with
:attr:`Fp8MetaValue.scale` and :attr:`Fp8MetaValue.amax_history`. A scale here is
the divisor of the quantiser, ``x_fp8 = x / scale`` (the reciprocal of Transformer
Engine's ``scale``): ``scale = max(amax_history) * 2**margin / fp8_max``.

On a CPU the fp8 formats are emulated: operands are quantised to fp8 and
dequantised to the compute dtype, and the product runs in the compute dtype. On
GPUs with fp8 tensor cores (H100 and later) XLA rewrites the dequantise-then-dot
pattern into an fp8 matrix product.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.linen import fp8_ops
from jax import lax

__all__ = [
    "Fp8Config",
    "Fp8Meta",
    "Fp8MetaValue",
    "attach_fp8",
    "fp8_loss",
]

_FP8_DTYPES = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")


def _fp8_dtype(value: Any, what: str) -> np.dtype:
    try:
        dtype = np.dtype(value)
    except TypeError as err:
        raise TypeError(
            f"{what} must be an fp8 dtype, got {value!r}; pass one of {_FP8_DTYPES}."
        ) from err
    if dtype.name not in _FP8_DTYPES:
        raise ValueError(
            f"{what} must be an fp8 dtype, got {dtype.name!r}; pass one of "
            f"{_FP8_DTYPES}."
        )
    return dtype


@dataclasses.dataclass(frozen=True)
class Fp8Config:
    """Hyperparameters of fp8 delayed scaling.

    Attributes:
        history_length: number of past steps whose amax sets a scale (Transformer
            Engine's and Flax's default is 1024; shorter histories adapt faster).
        margin: the scale leaves ``2**margin`` of headroom above the largest
            amax of the history (a non-negative integer).
        forward_dtype: fp8 format of activations and weights.
        gradient_dtype: fp8 format of the cotangents flowing back into a product.

    Example:
        >>> Fp8Config(history_length=16).forward_dtype
        dtype(float8_e4m3fn)
    """

    history_length: int = 1024
    margin: int = 0
    forward_dtype: Any = jnp.float8_e4m3fn
    gradient_dtype: Any = jnp.float8_e5m2

    def __post_init__(self) -> None:
        for name in ("history_length", "margin"):
            value = getattr(self, name)
            low = 1 if name == "history_length" else 0
            if (
                isinstance(value, bool)
                or not isinstance(value, numbers.Integral)
                or value < low
            ):
                raise ValueError(
                    f"Fp8Config.{name} must be an integer >= {low}, got {value!r}; "
                    f"pass e.g. {name}={16 if low else 0}."
                )
            object.__setattr__(self, name, int(value))
        for name in ("forward_dtype", "gradient_dtype"):
            dtype = _fp8_dtype(getattr(self, name), f"Fp8Config.{name}")
            object.__setattr__(self, name, dtype)

    @property
    def fp8_max(self) -> np.ndarray:
        """float32 ``[3]``: largest finite value of the format of each row."""
        dtypes = (self.forward_dtype, self.forward_dtype, self.gradient_dtype)
        return np.array([float(jnp.finfo(d).max) for d in dtypes], np.float32)


def _to_bits(x: jax.Array) -> jax.Array:
    return lax.bitcast_convert_type(jnp.asarray(x, jnp.float32), jnp.int32)


def _from_bits(bits: jax.Array) -> jax.Array:
    return lax.bitcast_convert_type(bits, jnp.float32)


class Fp8MetaValue(NamedTuple):
    """Delayed-scaling state of one fp8 matrix product.

    Rows are the left operand, the right operand and the incoming gradient.

    Attributes:
        scale_bits: int32 ``[3]``, bit patterns of the float32 scales.
        history_bits: int32 ``[3, history_length]``, bit patterns of the float32
            amax histories (newest first after each update).
        amax: float32 ``[3]``, always zero; the backward pass returns the amaxes
            it measured as its gradient.
    """

    scale_bits: jax.Array
    history_bits: jax.Array
    amax: jax.Array

    @property
    def scale(self) -> jax.Array:
        """float32 ``[3]``: the scales (divisors of the quantiser)."""
        return _from_bits(self.scale_bits)

    @property
    def amax_history(self) -> jax.Array:
        """float32 ``[3, history_length]``: the amax histories."""
        return _from_bits(self.history_bits)

    @classmethod
    def create(cls, scale: Any, amax_history: Any) -> Fp8MetaValue:
        """The state holding float32 ``scale [3]`` and ``amax_history [3, n]``."""
        scale = jnp.asarray(scale, jnp.float32)
        history = jnp.asarray(amax_history, jnp.float32)
        if scale.shape != (3,) or history.ndim != 2 or history.shape[0] != 3:
            raise ValueError(
                "Fp8MetaValue.create expects scale of shape (3,) and amax_history "
                f"of shape (3, n), got {scale.shape} and {history.shape}."
            )
        return cls(_to_bits(scale), _to_bits(history), jnp.zeros(3, jnp.float32))

    @classmethod
    def initial(cls, history_length: int) -> Fp8MetaValue:
        """Scales of one and empty (zero) histories."""
        return cls.create(jnp.ones(3), jnp.zeros((3, history_length)))


class Fp8Meta(nnx.Variable):
    """The NNX variable type holding a :class:`Fp8MetaValue`.

    Keep it with the parameters the train step differentiates, e.g.
    ``nnx.split(model, (nnx.Param, mpjax.Fp8Meta), ...)``.
    """


def _quantize(x: jax.Array, dtype: np.dtype, scale: jax.Array) -> jax.Array:
    """``x / scale`` saturated to the fp8 range; infinities stay non-finite so that
    an overflow still reaches the loss scaler (``float8_e4m3fn`` turns them to NaN).
    """
    scaled = x.astype(jnp.float32) / scale
    limit = fp8_ops.get_fp8_max(dtype, jnp.float32)
    clipped = jnp.clip(scaled, -limit, limit)
    return jnp.where(jnp.isinf(scaled), scaled, clipped).astype(dtype)


def _dequantize(q: jax.Array, scale: jax.Array, dtype: Any) -> jax.Array:
    return fp8_ops.dequantize(q, jnp.float32, scale).astype(dtype)


def _amax(x: jax.Array) -> jax.Array:
    return jnp.max(jnp.abs(x)).astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class _Spec:
    """Static arguments of one fp8 product."""

    dimension_numbers: Any
    precision: Any
    preferred_element_type: Any
    out_sharding: Any
    forward_dtype: np.dtype
    gradient_dtype: np.dtype
    lhs_dtype: np.dtype
    rhs_dtype: np.dtype
    amax_dtype: Any
    # the static arguments of lax.conv_general_dilated, for a convolution
    conv: tuple[tuple[str, Any], ...] | None = None

    def dot(self, lhs: jax.Array, rhs: jax.Array) -> jax.Array:
        kwargs = (
            {} if self.out_sharding is None else {"out_sharding": self.out_sharding}
        )
        if self.conv is not None:
            return lax.conv_general_dilated(
                lhs,
                rhs,
                precision=self.precision,
                preferred_element_type=self.preferred_element_type,
                **dict(self.conv),
                **kwargs,
            )
        return lax.dot_general(
            lhs,
            rhs,
            self.dimension_numbers,
            precision=self.precision,
            preferred_element_type=self.preferred_element_type,
            **kwargs,
        )


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fp8_dot(spec: _Spec, lhs, rhs, scale, amax):
    return _fp8_dot_fwd(spec, lhs, rhs, scale, amax)[0]


def _fp8_dot_fwd(spec: _Spec, lhs, rhs, scale, amax):
    del amax  # only its gradient is used
    q_lhs = _quantize(lhs, spec.forward_dtype, scale[0])
    q_rhs = _quantize(rhs, spec.forward_dtype, scale[1])
    out = spec.dot(
        _dequantize(q_lhs, scale[0], spec.lhs_dtype),
        _dequantize(q_rhs, scale[1], spec.rhs_dtype),
    )
    return out, (q_lhs, q_rhs, scale, _amax(lhs), _amax(rhs))


def _fp8_dot_bwd(spec: _Spec, residuals, g):
    q_lhs, q_rhs, scale, amax_lhs, amax_rhs = residuals
    q_g = _quantize(g, spec.gradient_dtype, scale[2])
    _, vjp = jax.vjp(
        spec.dot,
        _dequantize(q_lhs, scale[0], spec.lhs_dtype),
        _dequantize(q_rhs, scale[1], spec.rhs_dtype),
    )
    grad_lhs, grad_rhs = vjp(_dequantize(q_g, scale[2], g.dtype))
    observed = jnp.stack([amax_lhs, amax_rhs, _amax(g)])
    if isinstance(spec.amax_dtype, fp8_ops.fp8_meta_dtype_wrapper):
        observed = lax.convert_element_type(observed, fp8_ops.fm32)
    else:
        observed = observed.astype(spec.amax_dtype)
    return grad_lhs, grad_rhs, jnp.zeros_like(scale), observed


_fp8_dot.defvjp(_fp8_dot_fwd, _fp8_dot_bwd)


class Fp8DotGeneral(nnx.Module):
    """A drop-in ``lax.dot_general`` computing in fp8 with delayed scaling.

    Set as the ``dot_general`` of :class:`flax.nnx.Linear` or
    :class:`flax.nnx.LinearGeneral` (``mpjax.apply_policy(..., fp8=...)`` does).

    Args:
        config: the delayed-scaling hyperparameters.
    """

    def __init__(self, config: Fp8Config) -> None:
        if not isinstance(config, Fp8Config):
            raise TypeError(
                f"config must be an mpjax.Fp8Config, got {type(config).__name__}; "
                "pass e.g. mpjax.Fp8Config(history_length=16)."
            )
        self.config = config
        self.fp8_meta = Fp8Meta(Fp8MetaValue.initial(config.history_length))

    def __call__(
        self,
        lhs: jax.Array,
        rhs: jax.Array,
        dimension_numbers: Any,
        precision: Any = None,
        preferred_element_type: Any = None,
        out_sharding: Any = None,
    ) -> jax.Array:
        meta = self.fp8_meta.get_value()
        lhs, rhs = jnp.asarray(lhs), jnp.asarray(rhs)
        (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
        dims = tuple(
            tuple(tuple(int(a) for a in axes) for axes in pair)
            for pair in ((lhs_contract, rhs_contract), (lhs_batch, rhs_batch))
        )
        spec = _Spec(
            dimension_numbers=dims,
            precision=precision,
            preferred_element_type=preferred_element_type,
            out_sharding=out_sharding,
            forward_dtype=self.config.forward_dtype,
            gradient_dtype=self.config.gradient_dtype,
            lhs_dtype=lhs.dtype,
            rhs_dtype=rhs.dtype,
            amax_dtype=meta.amax.dtype,
        )
        scale = lax.stop_gradient(meta.scale)
        return _fp8_dot(spec, lhs, rhs, scale, meta.amax)


def _static(value: Any) -> Any:
    """A hashable copy of a (nested) sequence argument of a convolution."""
    if isinstance(value, list | tuple) and not hasattr(value, "_fields"):
        return tuple(_static(v) for v in value)
    return value


class Fp8ConvGeneralDilated(Fp8DotGeneral):
    """A drop-in ``lax.conv_general_dilated`` (the ``conv_general_dilated`` of
    :class:`flax.nnx.Conv`) computing in fp8 with delayed scaling: the input and
    the kernel in the forward format, the incoming gradient in the gradient
    format, as for :class:`Fp8DotGeneral`."""

    def __call__(  # type: ignore[override]
        self,
        lhs: jax.Array,
        rhs: jax.Array,
        window_strides: Any,
        padding: Any,
        lhs_dilation: Any = None,
        rhs_dilation: Any = None,
        dimension_numbers: Any = None,
        feature_group_count: int = 1,
        batch_group_count: int = 1,
        precision: Any = None,
        preferred_element_type: Any = None,
        out_sharding: Any = None,
    ) -> jax.Array:
        meta = self.fp8_meta.get_value()
        lhs, rhs = jnp.asarray(lhs), jnp.asarray(rhs)
        conv = {
            "window_strides": window_strides,
            "padding": padding,
            "lhs_dilation": lhs_dilation,
            "rhs_dilation": rhs_dilation,
            "dimension_numbers": dimension_numbers,
            "feature_group_count": feature_group_count,
            "batch_group_count": batch_group_count,
        }
        spec = _Spec(
            dimension_numbers=None,
            precision=precision,
            preferred_element_type=preferred_element_type,
            out_sharding=out_sharding,
            forward_dtype=self.config.forward_dtype,
            gradient_dtype=self.config.gradient_dtype,
            lhs_dtype=lhs.dtype,
            rhs_dtype=rhs.dtype,
            amax_dtype=meta.amax.dtype,
            conv=tuple((k, _static(v)) for k, v in conv.items()),
        )
        scale = lax.stop_gradient(meta.scale)
        return _fp8_dot(spec, lhs, rhs, scale, meta.amax)


class Fp8Einsum(Fp8DotGeneral):
    """A drop-in ``jnp.einsum`` (the ``einsum_op`` of :class:`flax.nnx.Einsum`)
    whose matrix products run through :class:`Fp8DotGeneral`."""

    def __call__(  # type: ignore[override]
        self,
        subscripts: str,
        *operands: jax.Array,
        precision: Any = None,
        preferred_element_type: Any = None,
        out_sharding: Any = None,
    ) -> jax.Array:
        return jnp.einsum(
            subscripts,
            *operands,
            precision=precision,
            preferred_element_type=preferred_element_type,
            out_sharding=out_sharding,
            _dot_general=super().__call__,
        )


def attach_fp8(model: nnx.Module, config: Fp8Config) -> int:
    """Gives every default matrix product of ``model`` an fp8 one, in place.

    :class:`flax.nnx.Linear` and :class:`flax.nnx.LinearGeneral` (which includes
    the projections of :class:`flax.nnx.MultiHeadAttention`) get a
    :class:`Fp8DotGeneral`, :class:`flax.nnx.Einsum` an :class:`Fp8Einsum`,
    :class:`flax.nnx.Conv` an :class:`Fp8ConvGeneralDilated`. Layers with a custom
    product function, and transposed convolutions, are left alone. Prefer
    ``mpjax.apply_policy(model, policy, fp8=config)``, which calls this on a copy.

    Args:
        model: the module to convert.
        config: the delayed-scaling hyperparameters.

    Returns:
        The number of products converted.

    Raises:
        TypeError: ``config`` is not an :class:`Fp8Config`.
    """
    if not isinstance(config, Fp8Config):
        raise TypeError(
            f"fp8 must be an mpjax.Fp8Config or None, got {type(config).__name__}; "
            "pass e.g. mpjax.Fp8Config(history_length=16)."
        )
    count = 0
    for _, module in list(nnx.iter_graph(model)):
        if isinstance(module, nnx.Linear) and module.dot_general is lax.dot_general:
            module.dot_general = nnx.data(Fp8DotGeneral(config))
        elif (
            isinstance(module, nnx.LinearGeneral)
            and module.dot_general_cls is None
            and module.dot_general in (None, lax.dot_general)
        ):
            module.dot_general = nnx.data(Fp8DotGeneral(config))
        elif isinstance(module, nnx.Einsum) and module.einsum_op is jnp.einsum:
            module.einsum_op = nnx.data(Fp8Einsum(config))
        elif (
            isinstance(module, nnx.Conv)
            and module.conv_general_dilated is lax.conv_general_dilated
        ):
            module.conv_general_dilated = nnx.data(Fp8ConvGeneralDilated(config))
        else:
            continue
        count += 1
    return count


def _is_meta(x: Any) -> bool:
    return isinstance(x, Fp8Meta)


def _max_combining(leaf: Any) -> Any:
    if not _is_meta(leaf):
        return leaf
    value = leaf.get_value()
    amax = lax.convert_element_type(value.amax.astype(jnp.float32), fp8_ops.fm32)
    return leaf.replace(value._replace(amax=amax))


def fp8_loss(loss_fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps ``loss_fn(params, *args)`` so that fp8 amaxes combine by maximum.

    A layer used more than once in a step (shared weights, a loop, ``scan``)
    sends one amax per use back through the gradient of its :class:`Fp8Meta`;
    without this wrapper they add up. The wrapper converts the ``amax`` fields of
    the :class:`Fp8Meta` variables in ``params`` to Flax's ``fm32`` dtype, whose
    gradients accumulate with ``max``, and compiles the call with ``jax.jit`` (the
    dtype cannot leave compiled code), so the arguments must be arrays.

    Args:
        loss_fn: ``loss_fn(params, *args)`` where ``params`` is an
            :class:`flax.nnx.State` (its variables kept, not a pure dict).

    Returns:
        The wrapped function, with the same signature and results.

    Raises:
        TypeError: ``loss_fn`` is not callable.
    """
    if not callable(loss_fn):
        raise TypeError(
            f"fp8_loss expects a callable loss_fn(params, *args), got "
            f"{type(loss_fn).__name__}."
        )

    @jax.jit
    @functools.wraps(loss_fn)
    def wrapped(params: Any, *args: Any) -> Any:
        params = jax.tree.map(_max_combining, params, is_leaf=_is_meta)
        return loss_fn(params, *args)

    return wrapped
