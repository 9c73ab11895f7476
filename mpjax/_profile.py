"""Number-range profiling: statistics of every floating-point value of a program.

`profile(fn, *args)` traces `fn` to a jaxpr and evaluates it once, under
`jax.jit`, with an interpreter that computes on-device statistics of every
floating-point value: the inputs (parameters included), every equation's outputs
and the final outputs. Sub-jaxprs of `jit`, `custom_jvp_call`,
`custom_vjp_call`, `closed_call` and `remat` are inlined and their equations
recorded one by one; control flow (`scan`, `while`, `cond`) is one equation whose
outputs are recorded. Each value costs a fixed-size summary (a histogram of
binary exponents, a few scalars and the rounding error per candidate format), so
memory grows with the number of values, not their sizes.

The summaries are computed in bulk rather than value by value, which keeps both
the run time and the compile time of the statistics program low: one
scatter-add accumulates the (exact) histograms of all values, and each format's
`round` runs once on a (values, sample) matrix of NaN-padded strided samples,
whose row medians are found by bisection on the bit patterns instead of a sort.

All bit-level statistics are taken from the IEEE bit patterns, so subnormal
float32 values are counted correctly even on backends that flush them in
arithmetic (XLA:CPU treats subnormal operands as zero).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core as jcore
from jax.extend import source_info_util

from mpjax._profile_report import DEFAULT_FORMATS, ProfileReport, Record
from mpjax.formats import NumberFormat, get_format

__all__ = ["profile", "profile_program"]

# Primitives whose sub-jaxpr is evaluated in line, and the parameter holding it.
_INLINE_PARAMS = {
    "jit": "jaxpr",
    "pjit": "jaxpr",
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
    "remat": "jaxpr",
    "checkpoint": "jaxpr",
}

# (unsigned bit dtype, signed dtype, mantissa bits, exponent bias) per float width.
_LAYOUTS = {4: (jnp.uint32, jnp.int32, 23, 127), 8: (jnp.uint64, jnp.int64, 52, 1023)}


def _is_float(aval: Any) -> bool:
    dtype = getattr(aval, "dtype", None)
    return dtype is not None and jnp.issubdtype(dtype, jnp.floating)


def _working(x: jax.Array) -> jax.Array:
    """`x` exactly in float32 (or float64 when it already is float64)."""
    return x if x.dtype == jnp.float64 else x.astype(jnp.float32)


def _magnitude_bits(x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Sign-less bit pattern, floor(log2|x|) and a non-zero-finite mask of `x`."""
    ubits, sbits, mant_bits, bias = _LAYOUTS[x.dtype.itemsize]
    width = 8 * x.dtype.itemsize
    mag = lax.bitcast_convert_type(x, ubits) & ubits(2 ** (width - 1) - 1)
    mag = mag.astype(sbits)
    field = mag >> mant_bits
    mant = mag & sbits(2**mant_bits - 1)
    top = 2 ** (width - 1 - mant_bits) - 1
    # subnormal: mant * 2**(1 - bias - mant_bits); floor(log2 mant) from clz
    sub_exp = (width - 1) + (1 - bias - mant_bits) - lax.clz(mant)
    exponent = jnp.where(field > 0, field - bias, sub_exp)
    nonzero_finite = (mag != 0) & (field != top)
    return mag, exponent, nonzero_finite


def _strided_sample(x: jax.Array, sample: int) -> jax.Array:
    """A strided sample of at most `sample` elements of `x`, NaN-padded to `sample`."""
    flat = x.ravel()
    stride = max(1, math.ceil(flat.size / sample))
    s = flat[::stride]
    return jnp.pad(s, (0, sample - s.size), constant_values=jnp.nan)


def _nanmedian_last(x: jax.Array) -> jax.Array:
    """`jnp.nanmedian(x, axis=-1)` of non-negative `x`, without sorting.

    Each row's lower middle element is found by bisection on the bit patterns
    (monotonic in the value for non-negative floats), one counting pass per
    bit, and the upper middle by one more pass; the cost is linear in the
    elements, where XLA:CPU's sort is many times slower.
    """
    _, sbits, _, _ = _LAYOUTS[x.dtype.itemsize]
    valid = ~jnp.isnan(x)
    n = jnp.sum(valid, axis=-1, dtype=sbits)
    rank = (n - 1) // 2  # 0-based rank of the lower middle element
    top = lax.bitcast_convert_type(jnp.asarray(jnp.inf, x.dtype), sbits)
    # NaN above every threshold; the reduced axis first reduces fastest on CPU
    bits = lax.bitcast_convert_type(x, sbits)
    bits = jnp.moveaxis(jnp.where(valid, bits, jnp.iinfo(sbits).max), -1, 0)

    def count_to(t: jax.Array) -> jax.Array:
        return jnp.sum(bits <= t[None], axis=0, dtype=sbits)

    def step(_: int, bounds: tuple[jax.Array, jax.Array]) -> tuple[Any, Any]:
        lo, hi = bounds
        mid = lo + (hi - lo) // 2
        enough = count_to(mid) > rank
        return jnp.where(enough, lo, mid + 1), jnp.where(enough, mid, hi)

    bounds = (jnp.zeros_like(n), jnp.full_like(n, top))
    lower, _ = lax.fori_loop(0, 8 * x.dtype.itemsize - 1, step, bounds)
    above = jnp.min(jnp.where(bits > lower[None], bits, top), axis=0)
    upper = jnp.where(count_to(lower) > n // 2, lower, above)
    a = lax.bitcast_convert_type(lower, x.dtype)
    b = lax.bitcast_convert_type(upper, x.dtype)
    median = jnp.where(a == b, a, a / 2 + b / 2)
    return jnp.where(n > 0, median, jnp.nan)


def _median_rel_errors(
    samples: jax.Array, formats: Sequence[NumberFormat]
) -> jax.Array:
    """Median |round(s) - s| / |s| per row of `samples` (values, sample) and format.

    Each format's `round` runs once on the whole matrix, and the medians of all
    formats are found together; NaN (padding) and non-normal elements are left
    out of the medians.
    """
    if not formats:
        return jnp.zeros((samples.shape[0], 0), jnp.float32)
    _, _, keep = _magnitude_bits(samples)
    # only normal values: backends flushing subnormals would divide by zero
    keep = keep & (jnp.abs(samples) >= jnp.finfo(samples.dtype).tiny)
    nan = jnp.asarray(jnp.nan, samples.dtype)
    errors = []
    for fmt in formats:
        r = fmt.round(samples)
        rel = jnp.abs(r - samples) / jnp.abs(samples)
        rel = jnp.where(jnp.isfinite(r), rel, jnp.inf)
        errors.append(jnp.where(keep, rel, nan))
    return _nanmedian_last(jnp.stack(errors, axis=1)).astype(jnp.float32)


def _summaries(
    values: Sequence[jax.Array],
    bins: tuple[int, int],
    formats: Sequence[NumberFormat],
    sample: int,
) -> dict[str, jax.Array]:
    """On-device summaries of floating-point arrays, stacked along a first axis.

    The histograms (with two extra bins counting zeros and non-finite elements)
    of all values are accumulated by one scatter-add over their concatenated bin
    indexes, offset by value; the rounding errors come from one matrix of
    fixed-size samples per working dtype.
    """
    lo, hi = bins
    nbins = hi - lo + 1
    width = nbins + 2  # exponent bins, zeros, non-finite
    indexes, mins, maxs = [], [], []
    groups: dict[Any, list[tuple[int, jax.Array]]] = {}
    for i, value in enumerate(values):
        x = _working(jnp.asarray(value))
        mag, exponent, nz = _magnitude_bits(x)
        extra = jnp.where(mag == 0, nbins, nbins + 1)
        idx = jnp.where(nz, jnp.clip(exponent, lo, hi) - lo, extra)
        indexes.append((idx.astype(jnp.int32) + i * width).ravel())
        big = jnp.iinfo(mag.dtype).max
        # all-masked reductions give NaN bit patterns (no value)
        mins.append(lax.bitcast_convert_type(jnp.min(jnp.where(nz, mag, big)), x.dtype))
        maxs.append(lax.bitcast_convert_type(jnp.max(jnp.where(nz, mag, -1)), x.dtype))
        if formats:
            groups.setdefault(x.dtype, []).append((i, _strided_sample(x, sample)))
    counts = jnp.zeros(len(values) * width, jnp.int32)
    counts = counts.at[jnp.concatenate(indexes)].add(1).reshape(-1, width)
    errors = jnp.zeros((len(values), len(formats)), jnp.float32)
    for members in groups.values():
        rows = np.array([i for i, _ in members])
        matrix = jnp.stack([s for _, s in members])
        errors = errors.at[rows].set(_median_rel_errors(matrix, formats))
    return {
        "zeros": counts[:, nbins],
        "nonfinite": counts[:, nbins + 1],
        "min_abs": jnp.stack([m.astype(jnp.float32) for m in mins]),
        "max_abs": jnp.stack([m.astype(jnp.float32) for m in maxs]),
        "histogram": counts[:, :nbins],
        "rounding_error": errors,
    }


def _inline_target(eqn: Any) -> tuple[Any, list[Any], str] | None:
    key = _INLINE_PARAMS.get(eqn.primitive.name)
    sub = eqn.params.get(key) if key else None
    if sub is None:
        return None
    if isinstance(sub, jcore.ClosedJaxpr):
        return sub.jaxpr, list(sub.consts), str(eqn.params.get("name", ""))
    if isinstance(sub, jcore.Jaxpr) and not sub.constvars:
        return sub, [], ""
    return None


def _join(*parts: str) -> str:
    return "/".join(p for p in parts if p)


def _evaluate(jaxpr, consts, args, stack, location, emit) -> list[Any]:  # noqa: ANN001
    """Evaluates `jaxpr`, calling `emit(value, primitive, stack, location)`."""
    env: dict[Any, Any] = {}

    def read(atom: Any) -> Any:
        return atom.val if isinstance(atom, jcore.Literal) else env[atom]

    env.update(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))
    for eqn in jaxpr.eqns:
        invals = [read(a) for a in eqn.invars]
        here = _join(stack, str(eqn.source_info.name_stack))
        summary = source_info_util.summarize(eqn.source_info)
        loc = summary if summary and summary != "unknown" else location
        target = _inline_target(eqn)
        if target is not None:
            sub, sub_consts, name = target
            outs = _evaluate(sub, sub_consts, invals, _join(here, name), loc, emit)
        else:
            params = eqn.primitive.get_bind_params(eqn.params)
            with eqn.ctx.manager:
                outs = eqn.primitive.bind(*invals, **params)
            outs = outs if eqn.primitive.multiple_results else [outs]
            for var, out in zip(eqn.outvars, outs, strict=True):
                if _is_float(var.aval):
                    emit(out, eqn.primitive.name, here, loc)
        env.update(zip(eqn.outvars, outs, strict=True))
    return [read(v) for v in jaxpr.outvars]


def _has_float(jaxpr: Any) -> bool:
    atoms = [*jaxpr.constvars, *jaxpr.invars, *jaxpr.outvars]
    if any(_is_float(getattr(a, "aval", None)) for a in atoms):
        return True
    for eqn in jaxpr.eqns:
        if any(_is_float(v.aval) for v in eqn.outvars):
            return True
        for param in eqn.params.values():
            for sub in param if isinstance(param, tuple | list) else (param,):
                inner = getattr(sub, "jaxpr", sub)
                if isinstance(inner, jcore.Jaxpr) and _has_float(inner):
                    return True
    return False


def _checked_call(fn: Callable, args: tuple) -> Any:
    out = fn(*args)
    leaves = jax.tree_util.tree_flatten_with_path(out, is_leaf=lambda v: v is None)[0]
    for path, leaf in leaves:
        if leaf is None or not isinstance(
            leaf, jax.Array | np.ndarray | np.generic | float | int | bool
        ):
            where = f"output {jax.tree_util.keystr(path)}" if path else "the output"
            raise TypeError(
                f"profile: fn must return arrays, but {where} is "
                f"{type(leaf).__name__} ({leaf!r:.40}); return only arrays and keep "
                "other values out of the outputs"
            )
    return out


def _forward_backward(fn: Callable) -> Callable:
    def run(*args: Any) -> Any:
        if not args:
            raise ValueError(
                "profile(grads=True) differentiates with respect to the first "
                "argument, but fn got no arguments; pass the parameters first"
            )
        out, vjp = jax.vjp(lambda a0: _checked_call(fn, (a0, *args[1:])), args[0])
        if not (isinstance(out, jax.Array) and out.shape == () and _is_float(out)):
            got = jax.tree.map(lambda v: f"{v.dtype}{list(v.shape)}", out)
            raise ValueError(
                f"profile(grads=True) needs fn to return one floating-point scalar "
                f"(a loss), got {got}; reduce the output (e.g. jnp.mean) or profile "
                "with grads=False"
            )
        (grads,) = vjp(jnp.ones_like(out))
        return out, grads

    return run


def _check_bins(bins: Any) -> tuple[int, int]:
    ok = (
        isinstance(bins, tuple | list)
        and len(bins) == 2
        and all(isinstance(b, int) and not isinstance(b, bool) for b in bins)
        and bins[0] < bins[1]
    )
    if not ok:
        raise ValueError(
            f"bins must be a pair of ints (lowest, highest binary exponent) with "
            f"lowest < highest, got {bins!r}; pass e.g. bins=(-160, 130)"
        )
    return int(bins[0]), int(bins[1])


def profile(
    fn: Callable[..., Any],
    *args: Any,
    formats: Sequence[str] = DEFAULT_FORMATS,
    grads: bool = False,
    bins: tuple[int, int] = (-160, 130),
    sample: int = 256,
) -> ProfileReport:
    """Profiles the number range of every floating-point value of `fn(*args)`.

    Args:
        fn: a JAX-traceable function of arrays (pytrees allowed) returning arrays.
            Close over non-array arguments.
        *args: the arguments; their floating-point leaves are recorded as inputs.
        formats: candidate format names of `mpjax.formats` to assess.
        grads: also record the backward pass: `fn` must return a floating-point
            scalar and the cotangents of `jax.vjp` with respect to `args[0]`
            are recorded with `kind="grad"`.
        bins: lowest and highest binary exponent floor(log2|x|) of the
            histograms; values beyond fall into the end bins.
        sample: at most this many elements (a strided sample) per value are
            rounded to measure the median relative rounding error. The
            histograms, counts and extremes always cover every element. The
            default of 256 keeps the rounding, the dominant cost of a profile
            with candidate formats, small; raise it for smoother medians.

    Returns:
        A `ProfileReport` with one `Record` per floating-point value.

    Raises:
        ValueError: on an unknown format, bad `bins` or `sample`, a program
            without floating-point values, or a non-scalar output with
            `grads=True`.
        TypeError: if `fn` is not callable or returns a non-array leaf.

    >>> import jax.numpy as jnp, mpjax
    >>> report = mpjax.profile(lambda x: x * 1e5, jnp.ones(4), formats=("float16",))
    >>> [(r.primitive, r.max_abs) for r in report.records]
    [('input', 1.0), ('mul', 100000.0), ('output', 100000.0)]
    >>> report.fractions("float16")[1].overflow
    1.0
    """
    program, inputs, finish = profile_program(
        fn, *args, formats=formats, grads=grads, bins=bins, sample=sample
    )
    return finish(jax.device_get(program(*inputs)))


def profile_program(
    fn: Callable[..., Any],
    *args: Any,
    formats: Sequence[str] = DEFAULT_FORMATS,
    grads: bool = False,
    bins: tuple[int, int] = (-160, 130),
    sample: int = 256,
) -> tuple[Callable[..., Any], tuple[Any, ...], Callable[[Any], ProfileReport]]:
    """The compiled statistics program of `profile`, split from its report.

    Arguments as for `profile` (validated the same way). Useful to time or
    repeat the on-device part alone: ``finish(jax.device_get(program(*inputs)))``
    equals ``profile(fn, *args, ...)``.

    Returns:
        ``(program, inputs, finish)``: the jitted statistics function, its inputs
        and the function building the `ProfileReport` from its fetched outputs.
    """
    if not callable(fn):
        raise TypeError(f"profile: fn must be callable, got {type(fn).__name__}")
    if isinstance(formats, str):
        raise TypeError(
            f"formats must be a sequence of format names, got the string "
            f"{formats!r}; pass formats=({formats!r},)"
        )
    fmts = [get_format(name) for name in formats]
    lo, hi = _check_bins(bins)
    if not isinstance(sample, int) or isinstance(sample, bool) or sample < 1:
        raise ValueError(f"sample must be a positive int, got {sample!r}; e.g. 256")
    traced_fn = _forward_backward(fn) if grads else (lambda *a: _checked_call(fn, a))
    closed = jax.make_jaxpr(traced_fn)(*args)
    if not _has_float(closed.jaxpr):
        raise ValueError(
            "profile: fn computes no floating-point values (only integers or "
            "booleans), so there is nothing to profile; pass float arrays"
        )
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree.leaves_with_path(args)]
    flat_args = jax.tree.leaves(args)
    metas: list[tuple[str, str, str, str, tuple[int, ...], str]] = []

    def run(consts: list[Any], flat: list[Any]) -> dict[str, jax.Array]:
        metas.clear()
        values: list[jax.Array] = []

        def emit(
            value: Any, primitive: str, stack: str, location: str, kind: str = ""
        ) -> None:
            value = jnp.asarray(value)
            kind = kind or ("grad" if "transpose(" in stack else "value")
            meta = (kind, primitive, stack, location, value.shape, str(value.dtype))
            metas.append(meta)
            values.append(value)

        jaxpr = closed.jaxpr
        for var, value in zip(jaxpr.constvars, consts, strict=True):
            if _is_float(var.aval):
                emit(value, "const", "", "closed-over constant")
        for var, value, path in zip(jaxpr.invars, flat, paths, strict=True):
            if _is_float(var.aval):
                emit(value, "input", f"args{path}", "argument")
        outs = _evaluate(jaxpr, consts, flat, "", "unknown", emit)
        for i, (var, value) in enumerate(zip(jaxpr.outvars, outs, strict=True)):
            if _is_float(var.aval):
                kind = "grad" if grads and i > 0 else "value"
                emit(value, "output", f"outputs[{i}]", "result", kind)
        return _summaries(values, (lo, hi), fmts, sample)

    names = tuple(formats)

    def finish(stats: Any) -> ProfileReport:
        stats = {k: np.asarray(v) for k, v in stats.items()}
        records = tuple(
            Record.from_stats(i, meta, {k: v[i] for k, v in stats.items()}, names)
            for i, meta in enumerate(metas)
        )
        return ProfileReport(records=records, formats=names, bins=(lo, hi))

    return jax.jit(run), (list(closed.consts), flat_args), finish
