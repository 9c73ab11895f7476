"""Number-range profiling: statistics of every floating-point value of a program.

`profile(fn, *args)` traces `fn` to a jaxpr and evaluates it once, under
`jax.jit`, with an interpreter (`mpjax._profile_eval`) that computes on-device
statistics of every floating-point value: the inputs (parameters included),
every equation's outputs and the final outputs. Sub-jaxprs of `jit`,
`custom_jvp_call`, `custom_vjp_call`, `closed_call` and `remat` are inlined and
their equations recorded one by one. The values inside `scan` and `while_loop`
bodies are recorded too, aggregated over all iterations (one record per body
value, source ``.../scan/body/...`` or ``.../while/body/...``); so are those of
the branches of `cond` (``.../cond/branch<i>/...``), counting only the taken
branch. Each value costs a fixed-size summary (a histogram of binary exponents,
a few scalars and the rounding error per candidate format, see
`mpjax._profile_stats`), so memory grows with the number of values, not with
their sizes or a loop's iteration count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jcore

from mpjax._profile_eval import Collector, evaluate
from mpjax._profile_nnx import module_scopes
from mpjax._profile_report import DEFAULT_FORMATS, ProfileReport, Record
from mpjax._profile_stats import is_float
from mpjax.formats import NumberFormat, get_format

__all__ = ["profile", "profile_program"]

#: Lowest and highest binary exponent of the histograms unless told otherwise:
#: every finite float64 magnitude that matters in practice, float32 subnormals
#: included.
DEFAULT_BINS = (-160, 130)


def _has_float(jaxpr: Any) -> bool:
    atoms = [*jaxpr.constvars, *jaxpr.invars, *jaxpr.outvars]
    if any(is_float(getattr(a, "aval", None)) for a in atoms):
        return True
    for eqn in jaxpr.eqns:
        if any(is_float(v.aval) for v in eqn.outvars):
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


def _check_argnums(argnums: Any, nargs: int) -> tuple[int, ...]:
    """`argnums` as a tuple of non-negative argument positions, validated."""
    nums = argnums if isinstance(argnums, tuple | list) else (argnums,)
    if not nums or not all(
        isinstance(a, int | np.integer) and not isinstance(a, bool) for a in nums
    ):
        raise TypeError(
            f"argnums must be an int or a non-empty tuple of ints (as in jax.grad), "
            f"got {argnums!r}; e.g. argnums=0 or argnums=(0, 1)"
        )
    if nargs == 0:
        raise ValueError(
            "profile(grads=True) differentiates with respect to fn's arguments "
            "(argnums), but fn got no arguments; pass the parameters as arguments"
        )
    out = []
    for a in nums:
        if not -nargs <= a < nargs:
            raise ValueError(
                f"argnums {argnums!r} selects argument {a}, but fn is profiled with "
                f"{nargs} positional argument(s); pick positions in "
                f"[{-nargs}, {nargs - 1}]"
            )
        out.append(int(a) % nargs)
    if len(set(out)) != len(out):
        raise ValueError(f"argnums {argnums!r} repeats an argument; list each once")
    return tuple(out)


def _forward_backward(fn: Callable, argnums: Any, args: tuple) -> Callable:
    nums = _check_argnums(argnums, len(args))
    for a in nums:
        if not any(is_float(leaf) for leaf in jax.tree.leaves(args[a])):
            raise ValueError(
                f"profile(grads=True) differentiates with respect to argument {a} "
                "(argnums), which has no floating-point leaves; select the "
                "parameters with argnums"
            )

    def run(*args: Any) -> Any:
        def selected(*chosen: Any) -> Any:
            full = list(args)
            for a, value in zip(nums, chosen, strict=True):
                full[a] = value
            return _checked_call(fn, tuple(full))

        out, vjp = jax.vjp(selected, *(args[a] for a in nums))
        if not (isinstance(out, jax.Array) and out.shape == () and is_float(out)):
            got = jax.tree.map(lambda v: f"{v.dtype}{list(v.shape)}", out)
            raise ValueError(
                f"profile(grads=True) needs fn to return one floating-point scalar "
                f"(a loss), got {got}; reduce the output (e.g. jnp.mean) or profile "
                "with grads=False"
            )
        return out, vjp(jnp.ones_like(out))

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


def check_settings(
    formats: Any, bins: Any, sample: Any
) -> tuple[list[NumberFormat], tuple[int, int]]:
    """Validates the statistics settings shared by `profile` and `RangeProbe`.

    Returns:
        The candidate formats and ``(lowest, highest)`` histogram exponents.
    """
    if isinstance(formats, str):
        raise TypeError(
            f"formats must be a sequence of format names, got the string "
            f"{formats!r}; pass formats=({formats!r},)"
        )
    fmts = [get_format(name) for name in formats]  # raises, listing known names
    bins = _check_bins(bins)
    if not isinstance(sample, int) or isinstance(sample, bool) or sample < 1:
        raise ValueError(f"sample must be a positive int, got {sample!r}; e.g. 128")
    return fmts, bins


def profile(
    fn: Callable[..., Any],
    *args: Any,
    formats: Sequence[str] = DEFAULT_FORMATS,
    grads: bool = False,
    argnums: int | Sequence[int] = 0,
    bins: tuple[int, int] = DEFAULT_BINS,
    sample: int = 128,
) -> ProfileReport:
    """Profiles the number range of every floating-point value of `fn(*args)`.

    Args:
        fn: a JAX-traceable function of arrays (pytrees allowed) returning arrays.
            Close over non-array arguments.
        *args: the arguments; their floating-point leaves are recorded as inputs.
        formats: candidate format names of `mpjax.formats` to assess.
        grads: also record the backward pass: `fn` must return a floating-point
            scalar and the cotangents of `jax.vjp` with respect to the
            arguments selected by `argnums` are recorded with `kind="grad"`.
        argnums: with `grads=True`, the position (int) or positions (tuple of
            ints) of the arguments to differentiate, as in `jax.grad`.
        bins: lowest and highest binary exponent floor(log2|x|) of the
            histograms; values beyond fall into the end bins.
        sample: at most this many elements (a strided sample) per value are
            rounded to measure the median relative rounding error (the lower
            median, to bfloat16 precision: see `Record.rounding_error`). The
            histograms, counts and extremes always cover every element. The
            default of 128 keeps the rounding, the dominant cost of a profile
            with candidate formats, small; raise it for smoother medians.

    Loop bodies (`scan`, `fori_loop`, `while_loop`) give one record per body
    value over all iterations: its `count`, histogram, zeros and non-finite
    count are sums over the iterations, its extremes those of all iterations
    and its rounding error the mean of the iterations' medians. A `cond`
    records every branch; only the taken branch counts elements. The loop and
    `cond` outputs are recorded as well; a `while_loop` condition is not.

    Returns:
        A `ProfileReport` with one `Record` per floating-point value.

    Raises:
        ValueError: on an unknown format, bad `bins` or `sample`, a program
            without floating-point values, a non-scalar output with
            `grads=True`, or `argnums` out of range, repeated, selecting an
            argument without floating-point leaves or given without `grads`.
        TypeError: if `fn` is not callable, returns a non-array leaf or
            `argnums` is not an int or tuple of ints.

    >>> import jax.numpy as jnp, mpjax
    >>> report = mpjax.profile(lambda x: x * 1e5, jnp.ones(4), formats=("float16",))
    >>> [(r.primitive, r.max_abs) for r in report.records]
    [('input', 1.0), ('mul', 100000.0), ('output', 100000.0)]
    >>> report.fractions("float16")[1].overflow
    1.0
    """
    program, inputs, finish = profile_program(
        fn,
        *args,
        formats=formats,
        grads=grads,
        argnums=argnums,
        bins=bins,
        sample=sample,
    )
    return finish(jax.device_get(program(*inputs)))


def profile_program(
    fn: Callable[..., Any],
    *args: Any,
    formats: Sequence[str] = DEFAULT_FORMATS,
    grads: bool = False,
    argnums: int | Sequence[int] = 0,
    bins: tuple[int, int] = DEFAULT_BINS,
    sample: int = 128,
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
    fmts, (lo, hi) = check_settings(formats, bins, sample)
    if grads:
        traced_fn = _forward_backward(fn, argnums, args)
    elif argnums != 0:
        raise ValueError(
            f"argnums={argnums!r} selects the arguments to differentiate, which "
            "only happens with grads=True; pass grads=True or drop argnums"
        )
    else:
        traced_fn = lambda *a: _checked_call(fn, a)  # noqa: E731
    with module_scopes(args):  # NNX modules name their values by their paths
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
        rec = Collector((lo, hi), fmts, sample)
        jaxpr = closed.jaxpr
        for var, value in zip(jaxpr.constvars, consts, strict=True):
            if is_float(var.aval):
                rec.value(value, "const", "", "closed-over constant")
        for var, value, path in zip(jaxpr.invars, flat, paths, strict=True):
            if is_float(var.aval):
                rec.value(value, "input", f"args{path}", "argument")
        outs = evaluate(jaxpr, consts, flat, "", "unknown", rec)
        for i, (var, value) in enumerate(zip(jaxpr.outvars, outs, strict=True)):
            if is_float(var.aval):
                kind = "grad" if grads and i > 0 else "value"
                rec.value(value, "output", f"outputs[{i}]", "result", kind)
        metas[:] = rec.metas
        return rec.summaries()

    names = tuple(formats)

    def finish(stats: Any) -> ProfileReport:
        stats = {k: np.asarray(v) for k, v in stats.items()}
        records = tuple(
            Record.from_stats(i, meta, {k: v[i] for k, v in stats.items()}, names)
            for i, meta in enumerate(metas)
        )
        return ProfileReport(records=records, formats=names, bins=(lo, hi))

    return jax.jit(run), (list(closed.consts), flat_args), finish
