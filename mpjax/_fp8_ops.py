"""The fp8 products of :mod:`mpjax._fp8`: quantisers, the custom-gradient product
and the NNX modules that stand in for ``lax.dot_general``, ``jnp.einsum`` and
``lax.conv_general_dilated``; :func:`attach_fp8` installs them in a model.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.linen import fp8_ops
from jax import lax

from mpjax import formats
from mpjax._fp8 import Fp8Config, Fp8Meta, Fp8MetaValue

__all__ = [
    "Fp8ConvGeneralDilated",
    "Fp8DotGeneral",
    "Fp8Einsum",
    "attach_fp8",
    "fp8_product",
]


def _quantize(x: jax.Array, dtype: np.dtype, scale: jax.Array) -> jax.Array:
    """``x / scale`` saturated to the fp8 range; infinities stay non-finite so that
    an overflow still reaches the loss scaler (``float8_e4m3fn`` turns them to NaN).

    The fp8 rounding is the format's integer codec, not a convert: a convert
    pair f32 -> fp8 -> f32 is removed by XLA's GPU compiler (excess precision),
    which would skip the quantisation there.
    """
    scaled = x.astype(jnp.float32) / scale
    limit = fp8_ops.get_fp8_max(dtype, jnp.float32)
    clipped = jnp.clip(scaled, -limit, limit)
    fmt = formats.get_format(np.dtype(dtype).name)
    return fmt.encode(jnp.where(jnp.isinf(scaled), scaled, clipped))


def _dequantize(q: jax.Array, scale: jax.Array, dtype: Any) -> jax.Array:
    """``convert(q) * scale`` straight into the compute ``dtype``, right before the
    product: the pattern XLA's GPU rewriter turns into a cuBLASLt fp8 GEMM (it
    needs the fp8 operand to reach the multiply; converting through float32 first
    would hide it). The scale is a separate multiply, as in Flax's ``dequantize``.
    """
    return fp8_ops.dequantize(q, dtype, scale)


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


def _config_of(meta: Fp8MetaValue) -> Fp8Config:
    """The config ``meta`` carries, or the default one of its history length."""
    if meta.config is not None:
        return meta.config
    return Fp8Config(history_length=meta.history_bits.shape[-1])


def fp8_product(
    meta: Fp8MetaValue,
    lhs: Any,
    rhs: Any,
    *,
    dimension_numbers: Any,
    precision: Any = None,
    preferred_element_type: Any = None,
    out_sharding: Any = None,
    conv: tuple[tuple[str, Any], ...] | None = None,
) -> jax.Array:
    """The fp8 product of ``lhs`` and ``rhs`` under the delayed-scaling state
    ``meta``: the one product every fp8 layer (Flax or Equinox) runs.

    A ``lax.dot_general`` with ``dimension_numbers``, or with ``conv`` (the static
    arguments of ``lax.conv_general_dilated`` as sorted pairs) a convolution. The
    operands are quantised with the stored scales; the gradient of
    ``meta.amax`` returns the amaxes measured in this step (rows lhs, rhs,
    incoming gradient).
    """
    lhs, rhs = jnp.asarray(lhs), jnp.asarray(rhs)
    config = _config_of(meta)
    spec = _Spec(
        dimension_numbers=dimension_numbers,
        precision=precision,
        preferred_element_type=preferred_element_type,
        out_sharding=out_sharding,
        forward_dtype=config.forward_dtype,
        gradient_dtype=config.gradient_dtype,
        lhs_dtype=lhs.dtype,
        rhs_dtype=rhs.dtype,
        amax_dtype=meta.amax.dtype,
        conv=conv,
    )
    scale = lax.stop_gradient(meta.scale)
    return _fp8_dot(spec, lhs, rhs, scale, meta.amax)


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
        self.fp8_meta = Fp8Meta(Fp8MetaValue.initial(config))

    @property
    def config(self) -> Fp8Config:
        """The hyperparameters, read from the state (one copy, in the model)."""
        return _config_of(self.fp8_meta.get_value())

    def __call__(
        self,
        lhs: jax.Array,
        rhs: jax.Array,
        dimension_numbers: Any,
        precision: Any = None,
        preferred_element_type: Any = None,
        out_sharding: Any = None,
    ) -> jax.Array:
        (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
        dims = tuple(
            tuple(tuple(int(a) for a in axes) for axes in pair)
            for pair in ((lhs_contract, rhs_contract), (lhs_batch, rhs_batch))
        )
        return self._product(
            lhs,
            rhs,
            dimension_numbers=dims,
            precision=precision,
            preferred_element_type=preferred_element_type,
            out_sharding=out_sharding,
        )

    def _product(self, lhs: Any, rhs: Any, **static: Any) -> jax.Array:
        """The fp8 product of ``lhs`` and ``rhs``; ``static`` fills the `_Spec`."""
        return fp8_product(self.fp8_meta.get_value(), lhs, rhs, **static)


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
        conv = {
            "window_strides": window_strides,
            "padding": padding,
            "lhs_dilation": lhs_dilation,
            "rhs_dilation": rhs_dilation,
            "dimension_numbers": dimension_numbers,
            "feature_group_count": feature_group_count,
            "batch_group_count": batch_group_count,
        }
        return self._product(
            lhs,
            rhs,
            dimension_numbers=None,
            precision=precision,
            preferred_element_type=preferred_element_type,
            out_sharding=out_sharding,
            conv=tuple((k, _static(v)) for k, v in conv.items()),
        )


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
