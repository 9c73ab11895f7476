"""The `NumberFormat` interface shared by every codec.

A number format is an immutable, hashable value. Concrete formats are frozen
dataclasses (`MinifloatFormat`, `ScaledFormat`, `PositFormat`) whose fields are the
codec parameters, so two formats built from the same parameters compare equal and
can be passed as static arguments to `jax.jit`.

The public methods (`encode`, `decode`, `round`) validate their arguments eagerly
(dtype checks are static, so they also run while tracing) and then call the codec,
which is pure `jax.numpy`/`lax` and jit-compiled once per format.
"""

from __future__ import annotations

import abc
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["NumberFormat"]

_X64_HINT = (
    "64-bit types are disabled in JAX; enable them with "
    "`jax.config.update('jax_enable_x64', True)` at program start, the "
    "`jax.enable_x64(True)` context manager or JAX_ENABLE_X64=1"
)


def x64_enabled() -> bool:
    """Whether JAX currently keeps float64 values (respects context managers)."""
    return jax.dtypes.canonicalize_dtype(np.float64) == np.dtype(np.float64)


def check_float_input(x: Any, who: str) -> jax.Array:
    """Converts `x` to a JAX float array, raising `TypeError` for other dtypes."""
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        if isinstance(x, complex):
            raise TypeError(
                f"{who} expects real floating-point input, got the complex number "
                f"{x!r}; encode its real and imaginary parts separately"
            )
        if isinstance(x, bool | int):
            raise TypeError(
                f"{who} expects floating-point input, got the Python "
                f"{type(x).__name__} {x!r}; pass a float such as {float(x)!r}"
            )
        try:
            x = jnp.asarray(x)
        except TypeError as err:
            raise TypeError(
                f"{who} expects a floating-point array, got {type(x).__name__}"
            ) from err
        dtype = x.dtype
    dtype = np.dtype(dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(
            f"{who} expects a floating-point array, got dtype {dtype}; "
            + (
                "encode the real and imaginary parts separately"
                if jnp.issubdtype(dtype, jnp.complexfloating)
                else "cast it first, e.g. `x.astype(jnp.float32)`"
            )
        )
    return jnp.asarray(x)


def working_dtype(dtype: np.dtype) -> np.dtype:
    """The exact working precision for input of `dtype` (float32 or float64)."""
    if np.dtype(dtype) == np.dtype(np.float64):
        return np.dtype(np.float64)
    return np.dtype(np.float32)


def check_output_dtype(dtype: Any, who: str) -> np.dtype:
    """Validates the `dtype` argument of `decode`."""
    try:
        dt = np.dtype(dtype)
    except TypeError as err:
        raise TypeError(
            f"{who}: dtype must be a floating-point dtype such as jnp.float32, "
            f"got {dtype!r}"
        ) from err
    if not jnp.issubdtype(dt, jnp.floating):
        raise TypeError(
            f"{who}: dtype must be a floating-point dtype such as jnp.float32, got {dt}"
        )
    if dt == np.dtype(np.float64) and not x64_enabled():
        raise ValueError(f"{who}: dtype=float64 was requested but {_X64_HINT}")
    return dt


def require_x64(who: str) -> None:
    """Raises `ValueError` when 64-bit types are disabled."""
    if not x64_enabled():
        raise ValueError(f"{who} needs float64, but {_X64_HINT}")


class NumberFormat(abc.ABC):
    """A number format: how real numbers are stored in a fixed number of bits.

    Concrete formats come from `minifloat`, `scaled` and `posit` (or the registry,
    `get_format`). Every format offers:

    * `encode(x)`: round a float array to the format (round to nearest, ties to
      even) and return the stored representation, an array of `storage_dtype`
      with the shape of `x`;
    * `decode(stored, dtype=jnp.float32)`: the exact values of stored codes;
    * `round(x)`: `decode(encode(x))` in the dtype of `x`;
    * the facts `bits`, `max`, `min_normal`, `min_subnormal`, `epsilon`,
      `decimal_digits`, `has_inf` and `has_nan` as Python values.

    All three methods accept any array shape and work under `jax.jit`,
    `jax.vmap` and `jax.grad` (see `round` for gradients).
    """

    # Subclasses are frozen dataclasses; `name` is always a field, `has_inf` and
    # `has_nan` are fields or properties.
    name: str
    has_inf: bool  # whether the format has codes for +-infinity
    has_nan: bool  # whether the format has a NaN code (posits: NaR)

    # ----------------------------------------------------------------- facts
    @property
    @abc.abstractmethod
    def bits(self) -> int:
        """Number of bits of one stored value."""

    @property
    @abc.abstractmethod
    def storage_dtype(self) -> np.dtype:
        """Dtype of the arrays returned by `encode`."""

    @property
    @abc.abstractmethod
    def max(self) -> float:
        """Largest finite representable value."""

    @property
    @abc.abstractmethod
    def min_normal(self) -> float | None:
        """Smallest positive normal value (`None` for posits, which have none)."""

    @property
    @abc.abstractmethod
    def min_subnormal(self) -> float:
        """Smallest positive value (the smallest subnormal, or minpos)."""

    @property
    @abc.abstractmethod
    def epsilon(self) -> float:
        """Distance from 1.0 to the next larger representable value."""

    @property
    def decimal_digits(self) -> float:
        """Decimal digits of precision near 1.0: `log10(2 / epsilon)`.

        For IEEE-like formats with `p` significand bits this is `p * log10(2)`
        (7.22 for float32, 3.31 for float16).
        """
        return math.log10(2.0 / self.epsilon)

    # ------------------------------------------------------------ codec API
    @abc.abstractmethod
    def _encode(self, x: jax.Array) -> jax.Array:
        """Codec: float32/float64 array -> stored array (no validation)."""

    @abc.abstractmethod
    def _decode(self, stored: jax.Array, dtype: np.dtype) -> jax.Array:
        """Codec: stored array -> values in float32/float64 `dtype`."""

    def _check_x64(self, who: str) -> None:
        if self.storage_dtype == np.dtype(np.float64):
            require_x64(f"{who} (float64 storage)")

    def encode(self, x: Any) -> jax.Array:
        """Rounds `x` to this format and returns the stored representation.

        Args:
            x: a floating-point array (any shape; float16, bfloat16, float32 or,
                with x64 enabled, float64) or a Python float.

        Returns:
            An array of `storage_dtype` with the shape of `x`.

        Raises:
            TypeError: if `x` is not floating point (integer, bool, complex).
            ValueError: if the format stores float64 and 64-bit types are
                disabled.
        """
        arr = check_float_input(x, f"{self.name}.encode")
        self._check_x64(f"{self.name}.encode")
        wdt = working_dtype(arr.dtype)
        return self._encode_compiled(arr.astype(wdt))

    def decode(self, stored: Any, dtype: Any = jnp.float32) -> jax.Array:
        """Returns the values held by the stored codes `stored`.

        Args:
            stored: an array of `storage_dtype`, as returned by `encode`.
            dtype: the floating-point dtype of the result. Decoding is exact into
                float32 (and float64, which needs x64); other dtypes round.

        Returns:
            A `dtype` array with the shape of `stored`.

        Raises:
            TypeError: if `stored` does not have `storage_dtype` or `dtype` is not
                a floating-point dtype.
            ValueError: if `dtype` is float64 while 64-bit types are disabled.
        """
        who = f"{self.name}.decode"
        sdt = getattr(stored, "dtype", None)
        if sdt is None or np.dtype(sdt) != self.storage_dtype:
            got = f"dtype {np.dtype(sdt)}" if sdt is not None else type(stored).__name__
            raise TypeError(
                f"{who} expects stored codes of dtype {self.storage_dtype} (the "
                f"output of encode), got {got}; convert bit patterns with "
                f"`jnp.asarray(codes, jnp.{self.storage_dtype})` or "
                "`jax.lax.bitcast_convert_type`"
            )
        self._check_x64(who)
        out = check_output_dtype(dtype, who)
        wdt = working_dtype(out)
        return self._decode_compiled(jnp.asarray(stored), wdt).astype(out)

    def round(self, x: Any, *, straight_through: bool = False) -> jax.Array:
        """Returns `decode(encode(x))`: the value this format would hold.

        Args:
            x: a floating-point array or Python float.
            straight_through: gradient rule. `False` (default): rounding is
                piecewise constant, so the gradient is zero. `True`: the
                straight-through estimator, gradient one (the identity), for
                quantisation-aware training.

        Returns:
            An array with the dtype and shape of `x`.
        """
        arr = check_float_input(x, f"{self.name}.round")
        self._check_x64(f"{self.name}.round")
        if straight_through:
            return _round_ste(self, arr)
        wdt = working_dtype(arr.dtype)
        out = self._decode_compiled(self._encode_compiled(arr.astype(wdt)), wdt)
        return jax.lax.stop_gradient(out.astype(arr.dtype))

    @functools.partial(jax.jit, static_argnums=0)
    def _encode_compiled(self, x: jax.Array) -> jax.Array:
        return self._encode(x)

    @functools.partial(jax.jit, static_argnums=(0, 2))
    def _decode_compiled(self, stored: jax.Array, dtype: np.dtype) -> jax.Array:
        return self._decode(stored, dtype)

    def __str__(self) -> str:
        return self.name


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _round_ste(fmt: NumberFormat, x: jax.Array) -> jax.Array:
    return fmt.round(x)


@_round_ste.defjvp
def _round_ste_jvp(
    fmt: NumberFormat, primals: tuple[jax.Array], tangents: tuple[jax.Array]
) -> tuple[jax.Array, jax.Array]:
    (x,), (t,) = primals, tangents
    return _round_ste(fmt, x), t
