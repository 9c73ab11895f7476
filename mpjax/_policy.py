"""Precision policies: which dtype parameters, computation and outputs live in.

A :class:`Policy` is a frozen value holding three floating-point dtypes. Its cast
methods touch only the floating-point leaves of a pytree, so integer counters,
booleans and PRNG keys pass through unchanged. :func:`get_policy` parses jmp's
string grammar plus Keras-style ``mixed_*`` names and float8 names, and converts
``jmp.Policy`` values (jmp itself is imported lazily, only for interop).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from mpjax.formats import format_aliases, get_format, list_formats, require_x64

__all__ = [
    "Policy",
    "get_policy",
    "list_policies",
    "override_table",
    "parse_dtype",
    "resolve_policy",
]

T = TypeVar("T")

_KEYS = {
    "p": "param",
    "params": "param",
    "param": "param",
    "c": "compute",
    "compute": "compute",
    "o": "output",
    "output": "output",
}

_FLOAT8_NAMES = (
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e4m3b11fnuz",
    "float8_e4m3",
    "float8_e3m4",
)


def _build_name_table() -> Mapping[str, np.dtype]:
    """Dtype names: the native formats of :mod:`mpjax.formats` with their aliases
    (one list of spellings for formats and policies), ``full``, and the float8
    dtypes the registry does not hold."""
    table: dict[str, np.dtype] = {"full": np.dtype(jnp.float32)}
    for name in (*list_formats(), *format_aliases()):
        dtype = np.dtype(get_format(name).storage_dtype)
        if dtype.name == get_format(name).name:  # native: arrays can be cast to it
            table[name.lower()] = dtype
    for name in _FLOAT8_NAMES:
        scalar_type = getattr(jnp, name, None)
        if scalar_type is None:  # older ml_dtypes/jax without this format
            continue
        dtype = np.dtype(scalar_type)
        table[name] = dtype
        table["f8" + name.removeprefix("float8_")] = dtype  # e.g. "f8e4m3fn"
    return table


# Read-only lookup table built once at import (a constant, not mutable state).
_NAME_TO_DTYPE: Mapping[str, np.dtype] = _build_name_table()


def _half_dtype() -> np.dtype:
    # jmp's rule: "half" is bfloat16 on TPU and float16 everywhere else.
    return np.dtype(jnp.bfloat16 if jax.default_backend() == "tpu" else jnp.float16)


def parse_dtype(name: str) -> np.dtype:
    """Parses a dtype name of the policy grammar into a floating-point dtype.

    Accepted names (case-insensitive): ``full``/``f32``/``float32``,
    ``half`` (bfloat16 on TPU, float16 elsewhere, as in jmp), ``f16``/``float16``,
    ``bf16``/``bfloat16``, ``f64``/``float64`` and the float8 names such as
    ``float8_e4m3fn`` (short form ``f8e4m3fn``) or ``float8_e5m2`` (``f8e5m2``).

    Args:
      name: the dtype name.

    Returns:
      The canonical ``numpy.dtype``.

    Raises:
      TypeError: if ``name`` is not a string.
      ValueError: if the name is unknown or names a non-floating dtype.

    >>> parse_dtype("bf16")
    dtype(bfloat16)
    """
    if not isinstance(name, str):
        raise TypeError(
            f"dtype name must be a str, got {type(name).__name__} {name!r}; pass a "
            "name such as 'float32', 'bf16' or 'float8_e4m3fn'."
        )
    key = name.strip().lower()
    if key == "half":
        return _half_dtype()
    if key in _NAME_TO_DTYPE:
        return _NAME_TO_DTYPE[key]
    try:
        other = np.dtype(key)
    except TypeError:
        other = None
    if other is not None and not jnp.issubdtype(other, jnp.floating):
        raise ValueError(
            f"Policy dtypes must be floating point, got {name!r} ({other}); use a "
            "floating dtype such as 'float32', 'bfloat16' or 'float16'."
        )
    known = ", ".join(sorted([*_NAME_TO_DTYPE, "half"]))
    raise ValueError(
        f"Unknown dtype name {name!r}; expected one of: {known}. Fix the spelling "
        "or use a full numpy name such as 'bfloat16'."
    )


def _canonical_dtype(value: Any, role: str) -> np.dtype:
    """Turns any dtype-like (name, dtype, scalar type, native format) into a dtype.

    Raises ``ValueError`` for float64 while 64-bit types are disabled, where JAX
    would silently compute in float32 instead.
    """
    if value is None:
        # jnp.dtype(None) is the default float dtype, which would hide the mistake.
        raise TypeError(
            f"{role}_dtype must be a dtype, dtype name or native number format, "
            "got None; pass e.g. jnp.float32 or 'bfloat16'."
        )
    if isinstance(value, str):
        dtype = parse_dtype(value)
    elif hasattr(value, "storage_dtype") and hasattr(value, "name"):
        # A native mpjax.formats.NumberFormat (e.g. get_format("bfloat16")).
        dtype = np.dtype(value.storage_dtype)
        if value.name != dtype.name:
            raise ValueError(
                f"{role}_dtype: number format {value.name!r} is stored as {dtype} but "
                "is not a native dtype, so arrays cannot be cast to it; use a native "
                "format (float32, bfloat16, float16, float8_*) for policies."
            )
    else:
        try:
            dtype = jnp.dtype(value)
        except TypeError as err:
            raise TypeError(
                f"{role}_dtype must be a dtype, dtype name or native number format, "
                f"got {type(value).__name__} {value!r}; pass e.g. jnp.float32 or "
                "'bfloat16'."
            ) from err
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(
            f"{role}_dtype must be a floating dtype, got {dtype}; use a floating "
            "dtype such as float32, bfloat16 or float16 (integer and boolean leaves "
            "are never cast by a policy, so they need no entry)."
        )
    if dtype == np.dtype(np.float64):
        require_x64(f"{role}_dtype")
    return dtype


def _cast_leaf(x: Any, dtype: np.dtype) -> Any:
    if isinstance(x, jax.ShapeDtypeStruct):
        if jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dtype:
            return jax.ShapeDtypeStruct(x.shape, dtype, sharding=x.sharding)
        return x
    if isinstance(x, jax.Array | np.ndarray | np.generic):
        if jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dtype:
            return x.astype(dtype)
    return x


def _cast_floating(tree: T, dtype: np.dtype) -> T:
    return jax.tree.map(lambda x: _cast_leaf(x, dtype), tree)


@dataclasses.dataclass(frozen=True, init=False)
class Policy:
    """A mixed-precision policy: dtypes for parameters, computation and outputs.

    Dtypes are canonicalised to ``numpy.dtype`` and must be floating point. The
    cast methods convert only floating-point array leaves (``jax.Array``, NumPy
    arrays and scalars, ``jax.ShapeDtypeStruct``); integer, boolean, PRNG-key and
    Python-scalar leaves are returned unchanged, and leaves already in the target
    dtype are not copied.

    Each dtype may be given as a ``numpy``/``jax.numpy`` dtype or scalar type, a
    name of the policy grammar (``"bf16"``, ``"float8_e4m3fn"``, see
    ``parse_dtype``), or a native :class:`mpjax.formats.NumberFormat`
    (``get_format("bfloat16")``); encoded formats such as ``fp16s`` or posits
    are rejected, since arrays cannot be cast to them.

    Args:
      param_dtype: dtype of stored (master) parameters.
      compute_dtype: dtype the model computes in.
      output_dtype: dtype of the model's outputs (e.g. the loss).

    Raises:
      ValueError: for unknown names, non-floating dtypes or encoded formats, and
        for float64 while 64-bit types are disabled (enable them with
        ``jax.config.update("jax_enable_x64", True)`` or ``jax.enable_x64``).
      TypeError: for values that are not dtype-like (including ``None``).

    >>> p = Policy("float32", "bfloat16", "float32")
    >>> str(p)
    'p=float32,c=bfloat16,o=float32'
    >>> p.cast_to_compute({"w": jnp.ones(2), "n": jnp.int32(3)})["w"].dtype
    dtype(bfloat16)
    """

    param_dtype: np.dtype
    compute_dtype: np.dtype
    output_dtype: np.dtype

    def __init__(self, param_dtype: Any, compute_dtype: Any, output_dtype: Any):
        object.__setattr__(self, "param_dtype", _canonical_dtype(param_dtype, "param"))
        object.__setattr__(
            self, "compute_dtype", _canonical_dtype(compute_dtype, "compute")
        )
        object.__setattr__(
            self, "output_dtype", _canonical_dtype(output_dtype, "output")
        )

    def cast_to_param(self, tree: T) -> T:
        """Casts the floating-point leaves of ``tree`` to ``param_dtype``."""
        return _cast_floating(tree, self.param_dtype)

    def cast_to_compute(self, tree: T) -> T:
        """Casts the floating-point leaves of ``tree`` to ``compute_dtype``."""
        return _cast_floating(tree, self.compute_dtype)

    def cast_to_output(self, tree: T) -> T:
        """Casts the floating-point leaves of ``tree`` to ``output_dtype``."""
        return _cast_floating(tree, self.output_dtype)

    def with_param_dtype(self, param_dtype: Any) -> Policy:
        """Returns a copy with a different ``param_dtype``."""
        return Policy(param_dtype, self.compute_dtype, self.output_dtype)

    def with_compute_dtype(self, compute_dtype: Any) -> Policy:
        """Returns a copy with a different ``compute_dtype``."""
        return Policy(self.param_dtype, compute_dtype, self.output_dtype)

    def with_output_dtype(self, output_dtype: Any) -> Policy:
        """Returns a copy with a different ``output_dtype``."""
        return Policy(self.param_dtype, self.compute_dtype, output_dtype)

    def to_jmp(self) -> Any:
        """Converts to an equivalent ``jmp.Policy`` (requires the ``jmp`` package)."""
        import jmp  # lazy: jmp is only needed for interop

        def scalar_type(dtype: np.dtype) -> Any:
            # jmp's own policies hold jnp scalar types; use them where they exist
            # so that str() of the jmp policy works for the dtypes jmp knows.
            return getattr(jnp, dtype.name, dtype)

        return jmp.Policy(
            param_dtype=scalar_type(self.param_dtype),
            compute_dtype=scalar_type(self.compute_dtype),
            output_dtype=scalar_type(self.output_dtype),
        )

    @classmethod
    def from_jmp(cls, policy: Any) -> Policy:
        """Builds a :class:`Policy` from a ``jmp.Policy`` (or any object with the
        attributes ``param_dtype``, ``compute_dtype`` and ``output_dtype``)."""
        missing = [
            a
            for a in ("param_dtype", "compute_dtype", "output_dtype")
            if not hasattr(policy, a)
        ]
        if missing:
            raise TypeError(
                f"from_jmp expects a jmp.Policy, got {type(policy).__name__} without "
                f"attribute(s) {', '.join(missing)}; pass jmp.get_policy(...)."
            )
        return cls(policy.param_dtype, policy.compute_dtype, policy.output_dtype)

    def __str__(self) -> str:
        return (
            f"p={self.param_dtype.name},c={self.compute_dtype.name},"
            f"o={self.output_dtype.name}"
        )

    def __repr__(self) -> str:
        return (
            f"Policy(param_dtype={self.param_dtype.name}, "
            f"compute_dtype={self.compute_dtype.name}, "
            f"output_dtype={self.output_dtype.name})"
        )


def _parse_spec(spec: str) -> Policy:
    text = spec.strip()
    if not text:
        raise ValueError(
            "Empty policy spec; use e.g. 'float32', 'mixed_bfloat16' or "
            "'p=f32,c=bf16,o=f32'."
        )
    lowered = text.lower()
    if lowered.startswith("mixed_"):
        # Keras names: float32 variables, reduced-precision compute. The model's
        # final output (e.g. the loss) is returned in float32.
        compute = parse_dtype(lowered.removeprefix("mixed_"))
        return Policy(jnp.float32, compute, jnp.float32)
    if "=" not in text:
        dtype = parse_dtype(text)
        return Policy(dtype, dtype, dtype)
    values: dict[str, np.dtype] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or "=" in value:
            raise ValueError(
                f"Malformed entry {part!r} in policy spec {spec!r}; each entry must "
                "be key=dtype, e.g. 'p=f32,c=bf16,o=f32'."
            )
        if key not in _KEYS:
            raise ValueError(
                f"Unknown key {key!r} in policy spec {spec!r}; use 'p'/'params', "
                "'c'/'compute' or 'o'/'output'."
            )
        role = _KEYS[key]
        if role in values:
            raise ValueError(
                f"Key {key!r} given twice in policy spec {spec!r}; give each of "
                "params, compute and output at most once."
            )
        values[role] = parse_dtype(value)
    # jmp's defaults: params float32, compute follows params, output follows compute.
    param = values.get("param", np.dtype(jnp.float32))
    compute = values.get("compute", param)
    output = values.get("output", compute)
    return Policy(param, compute, output)


def list_policies() -> tuple[str, ...]:
    """Named policies :func:`get_policy` accepts, canonical spellings.

    One per floating dtype (that dtype for params, compute and output), ``"half"``,
    and Keras-style ``"mixed_<dtype>"`` for every narrower dtype (float32 params
    and output). Aliases of the dtype names (``"bf16"``, ``"f16"``; see
    ``parse_dtype``) and the ``key=dtype`` grammar (``"p=f32,c=bf16"``) are
    accepted too.

    >>> "mixed_bfloat16" in list_policies()
    True
    """
    dtypes = sorted({d.name for d in _NAME_TO_DTYPE.values()}, key=_width_then_name)
    narrow = [d for d in dtypes if np.dtype(d).itemsize < 4]
    return (*dtypes, "half", *(f"mixed_{d}" for d in narrow))


def _width_then_name(name: str) -> tuple[int, str]:
    return -np.dtype(name).itemsize, name


def get_policy(spec: str | Policy | Any) -> Policy:
    """Returns the :class:`Policy` described by ``spec``.

    ``spec`` may be a :class:`Policy` (returned unchanged), a ``jmp.Policy``
    (converted), or a string in one of these forms:

    * jmp's grammar: comma-separated ``key=dtype`` entries with keys
      ``p``/``params``, ``c``/``compute``, ``o``/``output``. Params default to
      float32, compute follows params and output follows compute, as in jmp
      (``"c=bf16"`` is ``p=float32,c=bfloat16,o=bfloat16``).
    * a bare dtype name (``"float32"``, ``"bf16"``, ``"half"``, ``"full"``), used
      for all three dtypes.
    * Keras-style ``"mixed_float16"``, ``"mixed_bfloat16"`` and ``"mixed_<dtype>"``
      for any float8 name (``"mixed_float8_e4m3fn"``): float32 params and output,
      reduced-precision compute.

    Dtype names are those of ``parse_dtype``; float8 names such as
    ``"p=f32,c=float8_e4m3fn,o=f32"`` are accepted. ``str(policy)`` always parses
    back to an equal policy.

    Args:
      spec: the policy description.

    Returns:
      The policy.

    Raises:
      ValueError: on a malformed spec, unknown/non-floating dtype names, or a
        float64 dtype while 64-bit types are disabled.
      TypeError: if ``spec`` has an unsupported type.

    >>> get_policy("mixed_bfloat16")
    Policy(param_dtype=float32, compute_dtype=bfloat16, output_dtype=float32)
    >>> get_policy("c=f16")
    Policy(param_dtype=float32, compute_dtype=float16, output_dtype=float16)
    """
    if isinstance(spec, Policy):
        return spec
    if isinstance(spec, str):
        return _parse_spec(spec)
    if all(hasattr(spec, a) for a in ("param_dtype", "compute_dtype", "output_dtype")):
        return Policy.from_jmp(spec)
    raise TypeError(
        f"get_policy expects a str, mpjax.Policy or jmp.Policy, got "
        f"{type(spec).__name__} {spec!r}; pass e.g. 'mixed_bfloat16'."
    )


def resolve_policy(spec: Any, what: str) -> Policy:
    """:func:`get_policy`, with ``what`` (``"policy"``, ``"overrides[LayerNorm]"``)
    named in the error message."""
    try:
        return get_policy(spec)
    except (TypeError, ValueError) as err:
        raise type(err)(f"{what}: {err}") from err


def override_table(
    overrides: Any,
    defaults: Mapping[type, Any],
    *,
    base: type,
    library: str,
    example: str,
) -> dict[type, Policy]:
    """Per-class policies of a model library: ``defaults`` with ``overrides`` merged
    over them, every key checked to be a subclass of ``base`` and every value
    resolved with :func:`resolve_policy`.

    Args:
        overrides: the user's mapping from module classes to policy specs, or
            ``None``.
        defaults: the library's default overrides (normalisation layers).
        base: the library's module base class.
        library: its name in messages (``"Flax NNX"``, ``"Equinox"``).
        example: a class name for the messages (``"nnx.LayerNorm"``).

    Raises:
        TypeError: ``overrides`` is not a mapping, or a key is not a subclass of
            ``base``.
        ValueError: a policy cannot be parsed.
    """
    if overrides is None:
        overrides = {}
    if not isinstance(overrides, Mapping):
        raise TypeError(
            f"overrides must be a mapping from {library} module classes to "
            f"policies, got {type(overrides).__name__}; pass e.g. "
            f"{{{example}: 'float32'}}."
        )
    table = {
        cls: resolve_policy(spec, f"default override for {cls.__name__}")
        for cls, spec in defaults.items()
    }
    for cls, spec in overrides.items():
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise TypeError(
                f"overrides keys must be {library} module classes, got {cls!r}; "
                f"pass the class itself, e.g. {example}, not an instance or a name."
            )
        table[cls] = resolve_policy(spec, f"overrides[{cls.__name__}]")
    return table
