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
``lhs``, ``rhs``, ``grad``), a float32 ``amax`` field that is always zero and, as
static pytree metadata, the :class:`Fp8Config` itself (the one copy the optimizer
wrapper reads, so it cannot use another margin or format). The
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

Every product receives its operands as ``convert(f8 operand) * scale`` in the
compute dtype, right before ``dot_general``. On GPUs with fp8 tensor cores (H100
and later) XLA rewrites that pattern into a cuBLASLt fp8 matrix product
(``__cublas$lt$matmul$f8``); on a CPU the fp8 formats are emulated and the product
runs in the compute dtype.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
from collections.abc import Callable
from typing import Any

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


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["scale_bits", "history_bits", "amax"],
    meta_fields=["config"],
)
@dataclasses.dataclass(frozen=True)
class Fp8MetaValue:
    """Delayed-scaling state of one fp8 matrix product.

    Rows are the left operand, the right operand and the incoming gradient. The
    :class:`Fp8Config` travels with the state as static pytree metadata, so the
    optimizer wrapper reads the margin and formats the model was built with (it
    survives ``nnx.split``, gradients, ``optax.apply_updates`` and checkpoints
    that keep the tree structure).

    Attributes:
        scale_bits: int32 ``[3]``, bit patterns of the float32 scales.
        history_bits: int32 ``[3, history_length]``, bit patterns of the float32
            amax histories (newest first after each update).
        amax: float32 ``[3]``, always zero; the backward pass returns the amaxes
            it measured as its gradient.
        config: the hyperparameters of this product, or ``None`` when the state
            was built without them (the optimizer wrapper's config applies).
    """

    scale_bits: jax.Array
    history_bits: jax.Array
    amax: jax.Array
    config: Fp8Config | None = None

    @property
    def scale(self) -> jax.Array:
        """float32 ``[3]``: the scales (divisors of the quantiser)."""
        return _from_bits(self.scale_bits)

    @property
    def amax_history(self) -> jax.Array:
        """float32 ``[3, history_length]``: the amax histories."""
        return _from_bits(self.history_bits)

    def _replace(self, **changes: Any) -> Fp8MetaValue:
        """A copy with ``changes`` applied (the ``NamedTuple`` spelling)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def create(
        cls, scale: Any, amax_history: Any, config: Fp8Config | None = None
    ) -> Fp8MetaValue:
        """The state holding float32 ``scale [3]`` and ``amax_history [3, n]``."""
        scale = jnp.asarray(scale, jnp.float32)
        history = jnp.asarray(amax_history, jnp.float32)
        if scale.shape != (3,) or history.ndim != 2 or history.shape[0] != 3:
            raise ValueError(
                "Fp8MetaValue.create expects scale of shape (3,) and amax_history "
                f"of shape (3, n), got {scale.shape} and {history.shape}."
            )
        amax = jnp.zeros(3, jnp.float32)
        return cls(_to_bits(scale), _to_bits(history), amax, config)

    @classmethod
    def initial(cls, config: Fp8Config) -> Fp8MetaValue:
        """Scales of one and empty (zero) histories, carrying ``config``."""
        length = config.history_length
        return cls.create(jnp.ones(3), jnp.zeros((3, length)), config)


class Fp8Meta(nnx.Variable):
    """The NNX variable type holding a :class:`Fp8MetaValue`.

    Keep it with the parameters the train step differentiates, e.g.
    ``nnx.split(model, (nnx.Param, mpjax.Fp8Meta), ...)``.
    """


def is_meta(x: Any) -> bool:
    """Whether ``x`` is fp8 state: an :class:`Fp8Meta` variable or, in the pure
    trees ``nnx.Optimizer`` hands its transformation, an :class:`Fp8MetaValue`."""
    return isinstance(x, Fp8Meta | Fp8MetaValue)


def meta_value(x: Fp8Meta | Fp8MetaValue) -> Fp8MetaValue:
    """The :class:`Fp8MetaValue` of a leaf accepted by :func:`is_meta`."""
    return x.get_value() if isinstance(x, Fp8Meta) else x


def with_meta_value(x: Fp8Meta | Fp8MetaValue, value: Fp8MetaValue) -> Any:
    """``x`` holding ``value`` instead: a variable stays a variable."""
    return x.replace(value) if isinstance(x, Fp8Meta) else value


def _max_combining(leaf: Any) -> Any:
    if not is_meta(leaf):
        return leaf
    value = meta_value(leaf)
    amax = lax.convert_element_type(value.amax.astype(jnp.float32), fp8_ops.fm32)
    return with_meta_value(leaf, value._replace(amax=amax))


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
        params = jax.tree.map(_max_combining, params, is_leaf=is_meta)
        return loss_fn(params, *args)

    return wrapped
