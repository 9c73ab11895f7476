"""Storage policies: the number format populations are stored in between steps.

A :class:`StoragePolicy` is the lattice Boltzmann twin of :class:`mpjax.Policy`: it
names the arithmetic (compute) dtype and the :class:`mpjax.formats.NumberFormat`
that holds the populations in memory. Populations are decoded once when a step
loads them and encoded once when it stores them.

With DDF-shifting (``shift=True``, the default; Lehmann et al. 2022, section 2.2)
the stored value is ``f_i - w_i`` rather than ``f_i``: values stay small and centred
on zero, which is what makes 16-bit formats such as fp16s and fp16c usable.

Names follow the paper (``"FP32/FP16S"``), short names are accepted too (``"fp16s"``):

=================== =========== ============ ================
name                short name  compute      storage format
=================== =========== ============ ================
FP64/FP64           fp64        float64      float64
FP32/FP32           fp32        float32      float32
FP32/FP16           fp16        float32      float16
FP32/FP16S          fp16s       float32      fp16s
FP32/FP16C          fp16c       float32      fp16c
FP32/posit16        posit16     float32      posit16 (es=1)
FP32/posit16_es2    posit16_es2 float32      posit16_es2
FP32/posit16s       posit16s    float32      posit16s
FP32/bfloat16       bf16        float32      bfloat16
=================== =========== ============ ================

bfloat16 populations are held as their 16-bit patterns (``uint16``): XLA:CPU moves
``bfloat16`` arrays through streaming copies an order of magnitude slower than
16-bit integers (3 against 31 MLUPs measured, D3Q19 64^3 on one core), while the
encoded values are the same bits.

Encoding and decoding have the straight-through derivative (the derivative of
``decode(encode(x))`` is the identity), so ``jax.grad`` and ``jax.jvp`` pass through
the storage of every policy whose populations are held in a floating-point dtype
(:func:`differentiable_storages`); through the others (bit patterns in ``uint16``)
they raise a ``TypeError`` while tracing rather than return a zero. Those formats
are differentiated **emulated**: ``get_storage("FP32/FP16C", emulate=True)`` rounds
every stored population to the format exactly as the 16-bit storage does, but holds
the rounded values in the compute dtype (twice the memory, the same trajectory), so
a derivative can ride along; emulated storage runs on the XLA step.

posit16s is posit16 applied to ``x * 2**10``, the posit twin of fp16s: its region
of highest precision (12 fraction bits) lies on the magnitudes DDF-shifted
populations take, ``[2**-12, 2**-8)`` (see :mod:`mpjax.formats`).

>>> get_storage("fp16s").name
'FP32/FP16S'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from lbm_jax.core._lattice import did_you_mean
from mpjax import formats as _formats

__all__ = [
    "StoragePolicy",
    "differentiable_storages",
    "get_storage",
    "list_storages",
]

# canonical name -> (short name, compute dtype, mpjax format name)
_POLICIES: dict[str, tuple[str, str, str]] = {
    "FP64/FP64": ("fp64", "float64", "float64"),
    "FP32/FP32": ("fp32", "float32", "float32"),
    "FP32/FP16": ("fp16", "float32", "float16"),
    "FP32/FP16S": ("fp16s", "float32", "fp16s"),
    "FP32/FP16C": ("fp16c", "float32", "fp16c"),
    "FP32/posit16": ("posit16", "float32", "posit16"),
    "FP32/posit16_es2": ("posit16_es2", "float32", "posit16_es2"),
    "FP32/posit16s": ("posit16s", "float32", "posit16s"),
    "FP32/bfloat16": ("bf16", "float32", "bfloat16"),
}
# Formats whose native dtype is held as an integer bit pattern of the same width
# (see the module docstring).
_CONTAINERS: dict[np.dtype, np.dtype] = {
    np.dtype(jnp.bfloat16): np.dtype(np.uint16),
}
# Every spelling of a policy, lower case: its canonical and short names, and its
# format's name with the format's aliases (``"bfloat16"``, ``"bf16"``).
_LOOKUP: dict[str, str] = {}
for _canon, (_short, _, _fmt) in _POLICIES.items():
    _LOOKUP[_canon.lower()] = _canon
    _LOOKUP[_short.lower()] = _canon
    _LOOKUP[_fmt.lower()] = _canon
for _alias, _fmt_name in _formats.format_aliases().items():
    _owner = next((c for c, (_, _, f) in _POLICIES.items() if f == _fmt_name), None)
    if _owner is not None:
        _LOOKUP.setdefault(_alias.lower(), _owner)


@dataclasses.dataclass(frozen=True)
class StoragePolicy:
    """Compute dtype plus storage number format of the populations.

    Build one with :func:`get_storage`.

    Attributes:
        name: Canonical name, e.g. ``"FP32/FP16S"``.
        compute_dtype: dtype of all arithmetic (float32 or float64).
        format: The :class:`mpjax.formats.NumberFormat` holding stored populations.
        shift: Whether populations are stored DDF-shifted (``f_i - w_i``).
        emulate: Hold the populations rounded to the format but in the compute
            dtype (differentiable for every format; see the module docstring).
    """

    name: str
    compute_dtype: np.dtype
    format: _formats.NumberFormat
    shift: bool = True
    emulate: bool = False

    @property
    def storage_dtype(self) -> np.dtype:
        """Array dtype of the stored populations (``uint16`` bit patterns for
        bfloat16, the compute dtype when emulated; see the module docstring)."""
        if self.emulate:
            return np.dtype(self.compute_dtype)
        native = np.dtype(self.format.storage_dtype)
        return _CONTAINERS.get(native, native)

    @property
    def bytes_per_value(self) -> int:
        """Bytes one stored population occupies."""
        return self.storage_dtype.itemsize

    @property
    def short_name(self) -> str:
        """Short name, e.g. ``"fp16s"``."""
        return _POLICIES[self.name][0]

    @property
    def needs_x64(self) -> bool:
        """Whether the policy computes in float64 (JAX's 64-bit types must be on)."""
        return self.compute_dtype == np.dtype(np.float64)

    def encode(self, f: jax.Array) -> jax.Array:
        """Encode (already shifted, if shifting) compute-dtype values for storage.

        Differentiable straight through (see ``_encoded``): the derivative
        of ``decode(encode(f))`` is the identity.
        """
        return _encoded(self, f)

    def decode(self, stored: jax.Array) -> jax.Array:
        """Decode stored values to the compute dtype (straight-through
        derivative, see :meth:`encode`)."""
        return _decoded(self, stored)

    def check_enabled(self) -> None:
        """Raise ``ValueError`` if the compute dtype is unavailable (x64 off)."""
        if self.needs_x64:
            _formats.require_x64(f"Storage policy {self.name}")

    def __str__(self) -> str:
        notes = [
            n
            for n, on in (("unshifted", not self.shift), ("emulated", self.emulate))
            if on
        ]
        return f"{self.name} ({', '.join(notes)})" if notes else self.name


def _store(storage: StoragePolicy, f: jax.Array) -> jax.Array:
    if storage.emulate:
        codes = storage.format.encode(f.astype(storage.compute_dtype))
        return storage.format.decode(codes, dtype=storage.compute_dtype)
    if storage.storage_dtype == np.dtype(storage.compute_dtype):
        return f.astype(storage.compute_dtype)
    codes = storage.format.encode(f)
    if codes.dtype != storage.storage_dtype:
        codes = lax.bitcast_convert_type(codes, storage.storage_dtype)
    return codes


def _load(storage: StoragePolicy, stored: jax.Array) -> jax.Array:
    if stored.dtype == np.dtype(storage.compute_dtype):
        return stored
    native = np.dtype(storage.format.storage_dtype)
    if stored.dtype != native:
        stored = lax.bitcast_convert_type(stored, native)
    return storage.format.decode(stored, dtype=storage.compute_dtype)


# The storage rounding is piecewise constant: its own derivative is zero almost
# everywhere, and on integer bit patterns JAX cuts it altogether. Its useful
# derivative is the straight-through one, d decode(encode(x))/dx = 1:
# the tangent is carried through the stored array as a value of its dtype (rounded
# to it in 16-bit storage, as the state is), so the gradient is the compute-dtype
# adjoint along the trajectory actually stored. The primal computations are the
# codecs themselves, unchanged bit for bit. Integer containers (bit patterns)
# cannot carry a tangent: differentiating through them raises.
def _straight_through(
    codec: Callable[[StoragePolicy, jax.Array], jax.Array],
    check: Callable[[StoragePolicy, jax.Array], None],
) -> Callable[[StoragePolicy, jax.Array], jax.Array]:
    """``codec`` with the identity as its derivative (the tangent cast to the
    result's dtype); ``check`` sees the result first and may refuse."""
    rounded = jax.custom_jvp(codec, nondiff_argnums=(0,))

    @rounded.defjvp
    def _jvp(storage: StoragePolicy, primals: tuple, tangents: tuple) -> tuple:
        (x,), (dx,) = primals, tangents
        y = rounded(storage, x)
        check(storage, y)
        return y, dx.astype(y.dtype)

    return rounded


def _require_float_container(storage: StoragePolicy, codes: jax.Array) -> None:
    if not jnp.issubdtype(codes.dtype, jnp.floating):
        raise TypeError(
            f"Cannot differentiate through {storage} storage: it holds populations "
            f"as {codes.dtype} bit patterns, which carry no derivative. "
            "Differentiate a simulation with a floating-point container instead "
            f"(storage one of {differentiable_storages()}), or emulate this one: "
            f"storage=lbm_jax.get_storage({storage.name!r}, emulate=True) (the same "
            "rounding, values held in the compute dtype)."
        )


_encoded = _straight_through(_store, _require_float_container)
_decoded = _straight_through(_load, lambda storage, values: None)


def differentiable_storages() -> tuple[str, ...]:
    """Canonical names of the storage policies a derivative passes through
    (those whose populations are held in a floating-point dtype).

    >>> "FP32/FP16S" in differentiable_storages()
    True
    """
    return tuple(
        name
        for name in _POLICIES
        if jnp.issubdtype(get_storage(name).storage_dtype, jnp.floating)
    )


def get_storage(
    name: str | StoragePolicy,
    *,
    shift: bool | None = None,
    emulate: bool | None = None,
) -> StoragePolicy:
    """Return a storage policy by name.

    Args:
        name: Canonical (``"FP32/FP16S"``) or short (``"fp16s"``) name, or the
            name of the stored format or one of its aliases (``"bfloat16"``,
            ``"bf16"``, ``"float16"``), matched case-insensitively; a
            :class:`StoragePolicy` is returned as is, or with ``shift`` applied
            when ``shift`` is given.
        shift: Store DDF-shifted populations ``f_i - w_i`` (recommended);
            ``None`` keeps a policy's own flag, and means ``True`` for a name.
        emulate: Hold the populations rounded to the format but in the compute
            dtype, so that ``jax.grad`` passes through every format (see the
            module docstring); ``None`` keeps a policy's own flag, and means
            ``False`` for a name.

    >>> pol = get_storage("fp16c", emulate=True)
    >>> str(pol), pol.storage_dtype.name
    ('FP32/FP16C (emulated)', 'float32')

    Raises:
        ValueError: For an unknown name.
        TypeError: For a name that is not a string.
    """
    for flag, value in (("shift", shift), ("emulate", emulate)):
        if value is not None and not isinstance(value, bool):
            raise TypeError(
                f"{flag} must be a bool or None, got {value!r}; pass {flag}=True "
                f"or {flag}=False."
            )
    if isinstance(name, StoragePolicy):
        flags = {
            k: v for k, v in (("shift", shift), ("emulate", emulate)) if v is not None
        }
        return dataclasses.replace(name, **flags) if flags else name
    if not isinstance(name, str):
        raise TypeError(
            f"Storage name must be a str or StoragePolicy, got {type(name).__name__}."
        )
    canon = _LOOKUP.get(name.strip().lower())
    if canon is None:
        close = did_you_mean(name.strip().lower(), _LOOKUP)
        raise ValueError(
            f"Unknown storage policy {name!r}{close}; expected one of "
            f"{list_storages()}, the short names "
            f"{tuple(v[0] for v in _POLICIES.values())} or a stored format's name "
            f"{tuple(v[2] for v in _POLICIES.values())}."
        )
    _, compute, fmt = _POLICIES[canon]
    return StoragePolicy(
        name=canon,
        compute_dtype=np.dtype(compute),
        format=_formats.get_format(fmt),
        shift=True if shift is None else shift,
        emulate=bool(emulate),
    )


def list_storages() -> tuple[str, ...]:
    """Canonical names accepted by :func:`get_storage`."""
    return tuple(_POLICIES)
