"""Encode + decode throughput of every number format against a plain copy.

For each registered format (float64 only with x64 enabled), the benchmark times
`fmt.encode` of an `n`-element float32 array and `fmt.decode` of the result, and a
jitted float32 copy of the same array, all in the same process. Measurements are
interleaved round-robin (one repeat of every variant per round, after a warm-up
call that compiles), each call ends in `block_until_ready`, and the reported time is
the median over the rounds. The ratio `(encode + decode) / copy` is the headline,
taken within each round and then the median over rounds (robust against load that
drifts between rounds; the ratio of the median times is reported alongside):
a copy reads and writes 4 bytes per value, encode + decode of a 16-bit format
moves 4 + 2 + 2 + 4 bytes, so 1.5x is the memory-bound floor for 16 bits once the
arrays are much larger than the caches (as at the default 2**26 values).

Targets (issue #2, a 2-core AVX2/F16C CPU): float16 and fp16s within 2x of the
copy; fp16c and the posits within 6x. The command exits with status 1 when a
format misses its target.

Run ``python -m experiments.bench_formats [--log2n 26] [--repeats 5] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from mpjax import formats

__all__ = ["TARGETS", "bench", "main", "table"]

#: Largest acceptable (encode + decode) / copy time ratio per format.
TARGETS: dict[str, float] = {
    "float16": 2.0,
    "fp16s": 2.0,
    "fp16c": 6.0,
    "posit16": 6.0,
    "posit16_es2": 6.0,
}


def _time(fn: Callable[[], jax.Array]) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start


def _inputs(n: int, seed: int) -> jax.Array:
    """Values spread over the typical range of DDF-shifted populations, +-[1e-6, 1]."""
    rng = np.random.default_rng(seed)
    mags = np.exp(rng.uniform(np.log(1e-6), 0.0, n)).astype(np.float32)
    signs = np.where(rng.random(n) < 0.5, np.float32(-1), np.float32(1))
    return jnp.asarray(mags * signs)


def bench(
    n: int = 2**26,
    *,
    repeats: int = 5,
    names: Sequence[str] | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Times encode and decode of every format against a float32 copy.

    Args:
        n: number of float32 values.
        repeats: timed rounds after the warm-up (>= 1; use >= 5 for reports).
        names: formats to time; default every registered one (float64 only when
            x64 is enabled).
        seed: seed of the input values.

    Returns:
        ``{"n", "repeats", "copy_ms", "rows": [{"name", "bits", "encode_ms",
        "decode_ms", "total_ms", "ratio", "ratio_paired", "target",
        "meets_target", "bytes_per_value"}], "device", "cpu_count", "jax"}``.
        ``ratio`` divides the median times; ``ratio_paired`` is the median of the
        per-round ratios.

    Raises:
        ValueError: for n < 1, repeats < 1 or an unknown format name.
    """
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive int, got {repeats!r}")
    x64 = jax.dtypes.canonicalize_dtype(np.float64) == np.dtype(np.float64)
    if names is None:
        names = [m for m in formats.list_formats() if m != "float64" or x64]
    fmts = [formats.get_format(m) for m in names]  # raises on unknown names

    x = _inputs(n, seed)
    copy = jax.jit(jnp.copy)
    stored = {f.name: f.encode(x) for f in fmts}  # warm-up (compiles) encode
    for f in fmts:
        jax.block_until_ready(f.decode(stored[f.name]))  # warm-up decode
    jax.block_until_ready(copy(x))

    times: dict[str, list[float]] = {"copy": []}
    for f in fmts:
        times[f"{f.name}/encode"] = []
        times[f"{f.name}/decode"] = []
    for _ in range(repeats):
        times["copy"].append(_time(lambda: copy(x)))
        for f in fmts:
            times[f"{f.name}/encode"].append(_time(lambda f=f: f.encode(x)))
            s = stored[f.name]
            times[f"{f.name}/decode"].append(_time(lambda f=f, s=s: f.decode(s)))

    copy_ms = 1e3 * statistics.median(times["copy"])
    rows = []
    for f in fmts:
        enc = 1e3 * statistics.median(times[f"{f.name}/encode"])
        dec = 1e3 * statistics.median(times[f"{f.name}/decode"])
        target = TARGETS.get(f.name)
        ratio = (enc + dec) / copy_ms
        # The same ratio taken within each round, then the median: robust against
        # load that drifts between rounds on a shared machine.
        paired = statistics.median(
            (e + d) / c
            for e, d, c in zip(
                times[f"{f.name}/encode"],
                times[f"{f.name}/decode"],
                times["copy"],
                strict=True,
            )
        )
        rows.append(
            {
                "name": f.name,
                "bits": f.bits,
                "encode_ms": enc,
                "decode_ms": dec,
                "total_ms": enc + dec,
                "ratio": ratio,
                "ratio_paired": paired,
                "target": target,
                "meets_target": None if target is None else paired <= target,
                "bytes_per_value": f.storage_dtype.itemsize,
            }
        )
    return {
        "n": n,
        "repeats": repeats,
        "copy_ms": copy_ms,
        "rows": rows,
        "device": str(jax.devices()[0].device_kind),
        "cpu_count": os.cpu_count(),
        "jax": jax.__version__,
    }


def table(result: dict[str, Any]) -> str:
    """A markdown table of a `bench` result, one row per format."""
    lines = [
        f"n = {result['n']:,} float32 values, median of {result['repeats']} "
        f"repeats; float32 copy: {result['copy_ms']:.2f} ms",
        "",
        "| format | bits | encode ms | decode ms | (enc+dec)/copy | per-round "
        "| target | ok |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in result["rows"]:
        target = "" if r["target"] is None else f"<= {r['target']:g}x"
        ok = {None: "", True: "yes", False: "NO"}[r["meets_target"]]
        lines.append(
            f"| {r['name']} | {r['bits']} | {r['encode_ms']:.2f} | "
            f"{r['decode_ms']:.2f} | {r['ratio']:.2f}x | {r['ratio_paired']:.2f}x "
            f"| {target} | {ok} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: run the benchmark, print the table, optionally write JSON.

    Returns:
        0 when every format with a target meets it, 1 otherwise (2, by
        ``SystemExit``, for invalid arguments).
    """
    parser = argparse.ArgumentParser(
        prog="python -m experiments.bench_formats", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--log2n", type=int, default=26, help="array size 2**log2n")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds")
    parser.add_argument("--json", type=Path, default=None, help="write results here")
    parser.add_argument("--formats", nargs="*", default=None, help="format names")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not 1 <= args.log2n <= 30:
        parser.error(f"--log2n must be in [1, 30], got {args.log2n}")
    if args.json is not None:
        # checked (and its directory made) before measuring, not after
        if args.json.is_dir():
            parser.error(f"--json {args.json}: is a directory; give a file name.")
        try:
            args.json.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            parser.error(
                f"--json {args.json}: cannot create directory {args.json.parent} "
                f"({err.strerror}); write the file elsewhere."
            )
        if not os.access(args.json.parent, os.W_OK | os.X_OK):
            parser.error(
                f"--json {args.json}: directory {args.json.parent} is not "
                "writable; write the file elsewhere."
            )
    try:
        result = bench(
            2**args.log2n, repeats=args.repeats, names=args.formats, seed=args.seed
        )
    except ValueError as err:
        parser.error(str(err))
    print(table(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")
    missed = [r for r in result["rows"] if r["meets_target"] is False]
    for r in missed:
        print(
            f"{r['name']}: (encode + decode)/copy {r['ratio_paired']:.2f}x misses "
            f"the target of {r['target']:g}x",
            file=sys.stderr,
        )
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
