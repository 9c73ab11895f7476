"""The registry of named formats, `get_format`, `list_formats` and `round`."""

from __future__ import annotations

import types
from collections.abc import Mapping, Sequence
from typing import Any

import jax

from mpjax.formats._base import NumberFormat
from mpjax.formats._minifloat import minifloat
from mpjax.formats._posit import posit
from mpjax.formats._scaled import scaled

__all__ = ["facts_table", "format_aliases", "get_format", "list_formats", "round"]


def _build() -> Mapping[str, NumberFormat]:
    float16 = minifloat(
        "float16", exponent_bits=5, mantissa_bits=10, native_dtype="float16"
    )
    posit16 = posit(16, 1, name="posit16")
    formats = [
        minifloat(
            "float64", exponent_bits=11, mantissa_bits=52, native_dtype="float64"
        ),
        minifloat("float32", exponent_bits=8, mantissa_bits=23, native_dtype="float32"),
        minifloat(
            "bfloat16", exponent_bits=8, mantissa_bits=7, native_dtype="bfloat16"
        ),
        float16,
        minifloat(
            "float8_e4m3fn",
            exponent_bits=4,
            mantissa_bits=3,
            has_inf=False,
            native_dtype="float8_e4m3fn",
        ),
        minifloat(
            "float8_e5m2",
            exponent_bits=5,
            mantissa_bits=2,
            native_dtype="float8_e5m2",
        ),
        scaled(float16, 15, name="fp16s"),
        minifloat(
            "fp16c",
            exponent_bits=4,
            mantissa_bits=11,
            bias=15,
            has_inf=False,
            has_nan=False,
        ),
        posit16,
        posit(16, 2, name="posit16_es2"),
        # posit16 with its 12-fraction-bit region, |y| in [2**-2, 2**2), moved
        # onto DDF-shifted LBM populations, |x| in [2**-12, 2**-8): the scale is
        # minus the median of floor(log2|f_i - w_i|) in the 2-D validation cases
        # (-10; quartiles -11, -9), re-measured by
        # tests/lbm_jax/test_population_range.py.
        scaled(posit16, 10, name="posit16s"),
    ]
    return types.MappingProxyType({f.name: f for f in formats})


_REGISTRY = _build()

# Other spellings of registered formats: the short dtype names of the policy
# grammar and the lbm_jax storage short names.
_ALIASES = types.MappingProxyType(
    {
        "f64": "float64",
        "fp64": "float64",
        "f32": "float32",
        "fp32": "float32",
        "bf16": "bfloat16",
        "f16": "float16",
        "fp16": "float16",
        "f8e4m3fn": "float8_e4m3fn",
        "f8e5m2": "float8_e5m2",
    }
)
_BY_LOWER = types.MappingProxyType(
    {k.lower(): v for k, v in _REGISTRY.items()}
    | {alias: _REGISTRY[name] for alias, name in _ALIASES.items()}
)


def format_aliases() -> Mapping[str, str]:
    """Other accepted spellings of registered formats: alias -> name.

    Every function that takes a format name accepts these (case-insensitively).

    >>> format_aliases()["bf16"]
    'bfloat16'
    """
    return _ALIASES


def list_formats() -> tuple[str, ...]:
    """Names of the registered formats, widest IEEE first.

    >>> list_formats()[:3]
    ('float64', 'float32', 'bfloat16')
    """
    return tuple(_REGISTRY)


def get_format(name: str | NumberFormat) -> NumberFormat:
    """Returns the registered format called `name` (case-insensitive).

    A `NumberFormat` is returned unchanged, so functions can accept either.

    Args:
        name: a name from `list_formats()`, e.g. "fp16c", or one of its aliases
            (`format_aliases()`, e.g. "bf16"), any case; or a `NumberFormat`.

    Returns:
        The format.

    Raises:
        ValueError: for an unknown name; the message lists the registered names.
        TypeError: if `name` is neither a str nor a `NumberFormat`.

    >>> get_format("fp16s").max
    1.9990234375
    """
    if isinstance(name, NumberFormat):
        return name
    if not isinstance(name, str):
        raise TypeError(
            f"format name must be a str or NumberFormat, got {type(name).__name__} "
            f"{name!r}"
        )
    fmt = _BY_LOWER.get(name.strip().lower())
    if fmt is None:
        raise ValueError(
            f"unknown number format {name!r}; registered formats: "
            f"{', '.join(_REGISTRY)} (or an alias: {', '.join(_ALIASES)}). Build "
            "others with minifloat(), scaled() or posit()"
        )
    return fmt


def round(  # noqa: A001 - the module-level twin of NumberFormat.round
    fmt: str | NumberFormat, x: Any, *, straight_through: bool = False
) -> jax.Array:
    """Returns `x` rounded to `fmt`: `fmt.decode(fmt.encode(x))` in x's dtype.

    Args:
        fmt: a format or registered name.
        x: a floating-point array or Python float.
        straight_through: use the straight-through gradient (identity) instead
            of the true gradient of rounding (zero).

    Returns:
        The rounded array, with x's dtype and shape.

    >>> float(round("float16", 0.1))
    0.0999755859375
    """
    return get_format(fmt).round(x, straight_through=straight_through)


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.9g}"


def facts_table(names: Sequence[str] | None = None) -> str:
    """A Markdown table of the facts of the given (default: all) formats.

    Args:
        names: registered names or None for every registered format.

    Returns:
        The table as a string, one row per format.
    """
    chosen = list_formats() if names is None else tuple(names)
    header = (
        "| name | bits | storage | max | min normal | min subnormal | epsilon "
        "| decimal digits | inf | nan |"
    )
    lines = [header, "|" + "---|" * 10]
    for n in chosen:
        f = get_format(n)
        lines.append(
            f"| {f.name} | {f.bits} | {f.storage_dtype} | {_fmt(f.max)} | "
            f"{_fmt(f.min_normal)} | {_fmt(f.min_subnormal)} | {_fmt(f.epsilon)} | "
            f"{f.decimal_digits:.2f} | {'yes' if f.has_inf else 'no'} | "
            f"{'yes' if f.has_nan else 'no'} |"
        )
    return "\n".join(lines)
