"""Precision policies for Equinox modules (Equinox is imported lazily).

:func:`apply_policy_equinox` (reached through :func:`mpjax.apply_policy`) returns
a copy of an ``eqx.Module`` that trains under a policy:

1. every floating array leaf is stored in the param dtype of the policy that
   governs it (the main policy, or a per-type override such as float32 for
   normalisation layers; the nearest class in a module's MRO wins, and a module
   without an override inherits the policy of the module that holds it);
2. the root, and every module under an override of its own, becomes an instance
   of a subclass of its class (same name, same fields, one more static field,
   ``mpjax_policy``) whose ``__call__`` casts its own floating array leaves and
   floating positional arguments to its compute dtype, runs the original
   ``__call__`` and casts the floating outputs: the root's to the policy's
   output dtype, an override's back to the compute dtype of the module around it
   (Equinox layers do not cast their inputs, so the next layer gets what it
   computes in). The submodules an override holds are cast by it, not again by
   the root;
3. with an :class:`mpjax.Fp8Config`, every ``eqx.nn.Linear`` (not ``"scalar"``)
   becomes an instance of a subclass holding a :class:`mpjax.Fp8MetaValue`
   (``fp8_meta``) whose product runs through the fp8 product of the Flax layers
   (:func:`mpjax._fp8_ops.fp8_product`); :func:`mpjax.fp8_delayed_scaling`
   updates it as for Flax.

No object's class is reassigned: the copy is built from new instances, the model
given is left as it was. Modules stay pytrees, so ``eqx.filter_jit``,
``eqx.filter_grad``, :func:`mpjax.scaled_value_and_grad` and
:func:`mpjax.make_train_step` take them as they are.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap

from mpjax._fp8 import Fp8Config, Fp8MetaValue
from mpjax._fp8_ops import fp8_product
from mpjax._policy import Policy, override_table, resolve_policy
from mpjax._trees import is_array

__all__ = ["apply_policy_equinox", "is_equinox_module", "require_equinox"]

# Normalisation layers keep their parameters and statistics in float32 (as the
# Flax route does); names of eqx.nn classes, resolved when Equinox is imported.
_DEFAULT_OVERRIDE_NAMES = ("LayerNorm", "RMSNorm", "GroupNorm", "BatchNorm")


# Fields this module adds: the policy (static) and the fp8 state (never cast).
_OWN_FIELDS = ("mpjax_policy", "fp8_meta")


def require_equinox() -> Any:
    """The ``equinox`` module, or an ``ImportError`` saying how to install it."""
    try:
        import equinox
    except ImportError as err:
        raise ImportError(
            "This needs Equinox, which is not installed; install it with "
            "`pip install 'mpjax[equinox]'` (or `pip install equinox`)."
        ) from err
    return equinox


def is_equinox_module(x: Any) -> bool:
    """Whether ``x`` is an ``eqx.Module`` (False, without importing Equinox,
    where nothing has imported it: then ``x`` cannot be one)."""
    equinox = sys.modules.get("equinox")
    return equinox is not None and isinstance(x, equinox.Module)


def _original_class(cls: type) -> type:
    return getattr(cls, "_mpjax_original_class", cls)


def _rebuild(cls: type, module: Any, fields: Mapping[str, Any]) -> Any:
    """A new ``cls`` instance holding ``fields``, the other fields taken from
    ``module`` (the pytree unflattening path: no ``__init__``, no checks)."""
    new = object.__new__(cls)
    for field in dataclasses.fields(cls):
        value = (
            fields[field.name] if field.name in fields else getattr(module, field.name)
        )
        object.__setattr__(new, field.name, value)
    return new


def _is_policy_module(x: Any) -> bool:
    return hasattr(type(x), "_mpjax_policy_class")


def _cast_arrays(tree: Any, dtype: Any, *, skip: Any = None) -> Any:
    """Floating array leaves of ``tree`` cast to ``dtype``; policy modules inside
    it (other than ``skip``) are left to cast themselves."""

    def cast(x: Any) -> Any:
        if is_array(x) and jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dtype:
            return jnp.asarray(x).astype(dtype)
        return x

    def inner_policy(x: Any) -> bool:
        return x is not skip and _is_policy_module(x)

    return jax.tree.map(cast, tree, is_leaf=inner_policy)


@functools.cache
def _policy_class(cls: type) -> type:
    """A subclass of the Equinox module class ``cls`` whose ``__call__`` runs the
    original under the instance's ``mpjax_policy`` (static field)."""
    equinox = require_equinox()
    original_call = cls.__call__

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        policy = self.mpjax_policy
        inner = _cast_arrays(self, policy.compute_dtype, skip=self)
        out = original_call(inner, *_cast_arrays(args, policy.compute_dtype), **kwargs)
        return _cast_arrays(out, policy.output_dtype)

    __call__.__doc__ = original_call.__doc__
    namespace = {
        "__annotations__": {"mpjax_policy": Policy},
        "mpjax_policy": equinox.field(static=True, default=None),
        "__call__": __call__,
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "_mpjax_original_class": _original_class(cls),
        "_mpjax_policy_class": True,
    }
    return type(cls.__name__, (cls,), namespace)


def _fp8_linear(meta: Fp8MetaValue, weight: Any, bias: Any, x: Any) -> jax.Array:
    """``x @ weight.T + bias`` with the product in fp8; ``x`` may carry leading
    batch axes."""
    x = jnp.asarray(x)
    contract = (((x.ndim - 1,), (1,)), ((), ()))
    y = fp8_product(meta, x, weight, dimension_numbers=contract)
    if bias is not None:
        y = y + bias.reshape((1,) * (y.ndim - 1) + bias.shape)
    return y


@custom_vmap
def _fp8_linear_mapped(meta: Fp8MetaValue, weight: Any, bias: Any, x: Any) -> Any:
    return _fp8_linear(meta, weight, bias, x)


@_fp8_linear_mapped.def_vmap
def _fp8_linear_batch(
    axis_size: int, in_batched: list, meta: Any, weight: Any, bias: Any, x: Any
) -> tuple[jax.Array, bool]:
    """Under ``jax.vmap`` over the examples (the Equinox idiom) the product runs
    once on the whole batch, so its amaxes are the batch's, not a sum of one per
    example; a mapped layer (batched weights) maps the product itself."""
    del axis_size
    if any(jax.tree.leaves(in_batched[:3])):
        axes = [jax.tree.map(lambda b: 0 if b else None, a) for a in in_batched]
        return jax.vmap(_fp8_linear, in_axes=axes)(meta, weight, bias, x), True
    if not in_batched[3]:
        return _fp8_linear(meta, weight, bias, x), False
    return _fp8_linear(meta, weight, bias, x), True


def _fp8_call(self: Any, x: Any, *, key: Any = None) -> jax.Array:
    """``eqx.nn.Linear.__call__`` with the product in fp8, on a batch in leading
    axes or on one example under ``jax.vmap`` (either way the amaxes are the
    batch's). One example differentiated without ``vmap`` is refused by JAX (its
    ``custom_vmap`` has no derivative outside ``vmap``)."""
    del key
    x = jnp.asarray(x)
    if x.ndim > 1:
        return _fp8_linear(self.fp8_meta, self.weight, self.bias, x)
    return _fp8_linear_mapped(self.fp8_meta, self.weight, self.bias, x)


@functools.cache
def _fp8_linear_class(cls: type) -> type:
    """A subclass of ``eqx.nn.Linear`` (or of a subclass) with an fp8 product."""
    namespace = {
        "__annotations__": {"fp8_meta": Fp8MetaValue},
        "fp8_meta": None,
        "__call__": _fp8_call,
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "_mpjax_original_class": _original_class(cls),
    }
    return type(cls.__name__, (cls,), namespace)


@dataclasses.dataclass(frozen=True)
class _Converter:
    """One walk over a module tree: policies per module, fp8 products."""

    equinox: Any
    table: Mapping[type, Policy]
    fp8: Fp8Config | None

    def override(self, module: Any) -> Policy | None:
        for cls in _original_class(type(module)).__mro__:
            if cls in self.table:
                return self.table[cls]
        return None

    def children(self, value: Any, policy: Policy) -> Any:
        """A field's value with its modules converted and its floating arrays
        stored in ``policy.param_dtype``."""

        def convert(x: Any) -> Any:
            if isinstance(x, self.equinox.Module):
                return self.module(x, policy, output=policy.compute_dtype)
            return _cast_arrays(x, policy.param_dtype)

        return jax.tree.map(
            convert, value, is_leaf=lambda x: isinstance(x, self.equinox.Module)
        )

    def module(self, module: Any, parent: Policy, *, output: Any) -> Any:
        own = self.override(module)
        policy = parent if own is None else own
        fields = {
            f.name: self.children(getattr(module, f.name), policy)
            for f in dataclasses.fields(module)
            if not f.metadata.get("static", False) and f.name not in _OWN_FIELDS
        }
        cls = _original_class(type(module))
        linear = self.equinox.nn.Linear
        if (
            self.fp8 is not None
            and issubclass(cls, linear)
            and "scalar"
            not in (
                module.in_features,
                module.out_features,
            )
        ):
            cls = _fp8_linear_class(cls)
            meta = getattr(module, "fp8_meta", None)
            fields["fp8_meta"] = meta or Fp8MetaValue.initial(self.fp8)
        if own is not None or output is None:
            out_dtype = policy.output_dtype if output is None else output
            fields["mpjax_policy"] = policy.with_output_dtype(out_dtype)
            cls = _policy_class(cls)
        return _rebuild(cls, module, fields)


def apply_policy_equinox(
    model: Any,
    policy: Any,
    *,
    overrides: Mapping[type, Any] | None,
    fp8: Fp8Config | None,
) -> Any:
    """The Equinox route of :func:`mpjax.apply_policy` (see the module docs).

    Args:
        model: the ``eqx.Module`` to convert; it is not modified.
        policy: the main policy (anything :func:`mpjax.get_policy` takes).
        overrides: per-class policies over the defaults (``eqx.nn.LayerNorm``,
            ``RMSNorm``, ``GroupNorm`` and ``BatchNorm`` in ``"float32"``).
        fp8: an :class:`mpjax.Fp8Config` for fp8 products in every
            ``eqx.nn.Linear``, or ``None``.

    Returns:
        The converted copy: an instance of a subclass of ``type(model)`` with the
        same name and fields, plus the static field ``mpjax_policy``.
    """
    equinox = require_equinox()
    if fp8 is not None and not isinstance(fp8, Fp8Config):
        raise TypeError(
            f"fp8 must be an mpjax.Fp8Config or None, got {type(fp8).__name__}; "
            "pass e.g. mpjax.Fp8Config(history_length=16)."
        )
    main = resolve_policy(policy, "policy")
    defaults = {
        getattr(equinox.nn, name): "float32"
        for name in _DEFAULT_OVERRIDE_NAMES
        if hasattr(equinox.nn, name)
    }
    table = override_table(
        overrides,
        defaults,
        base=equinox.Module,
        library="Equinox",
        example="eqx.nn.LayerNorm",
    )
    converter = _Converter(equinox, table, fp8)
    return converter.module(model, main, output=None)
