"""Encode + decode throughput of every number format against a bandwidth-bound copy.

For each registered format (float64 only with x64 enabled), the benchmark times
`fmt.encode` of an `n`-element float32 array and `fmt.decode` of the result, each
compiled with its output written into a donated buffer of the right shape and dtype
(as inside a jitted solver step that updates its state in place), so that neither
side pays for allocating and page-faulting a fresh output array. The baseline is the
STREAM copy of `lbm_jax.bench.stream_bandwidths` (``b[:] = a`` into a preallocated
array of the same size, at least 1 MiB), measured in the same run: every round runs
the copy once and then each codec once (after a warm-up call that compiles), each
call ending in `block_until_ready`. The headline ratio `(encode + decode) / copy` is
taken within each round and then the median over rounds (robust against load that
drifts between rounds; the ratio of the median times is reported alongside), and the
copy bandwidth of every round is reported.

A copy reads and writes 4 bytes per value; encode + decode of a `b`-byte format
moves 4 + b + b + 4 bytes, so `1 + b / 4` (1.5x for 16 bits) is the memory-bound
floor of the ratio once the arrays are much larger than the caches (as at the
default 2**26 values). The copy runs on one thread, the codecs on every core XLA
uses: where one core cannot saturate the memory bus, a codec can come out below the
floor.

Targets (issue #2, a 2-core AVX2/F16C CPU), restated against this baseline: the
16-bit minifloats float16, fp16s and fp16c within 3x of the copy (at least half the
memory-bound speed), the posits within 6x (a quarter). The issue's 2x and 6x were
met against a copy that allocated its output and ran at 3-5 GB/s, several times
below the bandwidth; these are the targets the codecs are held to now. The command
exits with status 1 when a format misses its target.

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

from experiments import _framework
from lbm_jax.bench import stream_bandwidths
from mpjax import formats

__all__ = [
    "BASELINE",
    "TARGETS",
    "bench",
    "check_json_path",
    "in_place",
    "main",
    "table",
]

#: What the codec times are divided by.
BASELINE = (
    "STREAM copy b[:] = a into a preallocated float32 array "
    "(lbm_jax.bench.stream_bandwidths)"
)

#: Largest acceptable (encode + decode) / copy time ratio per format, against the
#: bandwidth-bound copy of `BASELINE`.
TARGETS: dict[str, float] = {
    "float16": 3.0,
    "fp16s": 3.0,
    "fp16c": 3.0,
    "posit16": 6.0,
    "posit16_es2": 6.0,
    "posit16s": 6.0,
}


def time_call(fn: Callable[[], jax.Array]) -> float:
    """Seconds one call of ``fn`` takes, until its result is ready."""
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start


def in_place(
    fmt: formats.NumberFormat, x: jax.Array
) -> tuple[Callable[[], jax.Array], Callable[[], jax.Array]]:
    """Encode of `x` and decode of its codes, each into a donated output buffer.

    Args:
        fmt: the number format.
        x: the float array to encode.

    Returns:
        ``(run_encode, run_decode)``: callables without arguments that return the
        codes of `x` and their decoded values. Every call writes into the buffer
        that the previous call returned (no allocation after the first), as a
        jitted step with a donated state does; the previous result is invalid.
    """
    encode = jax.jit(lambda out, v: fmt.encode(v), donate_argnums=0, keep_unused=True)
    decode = jax.jit(
        lambda out, s: fmt.decode(s, x.dtype), donate_argnums=0, keep_unused=True
    )
    buffers = [fmt.encode(x), jnp.zeros_like(x)]

    def run_encode() -> jax.Array:
        buffers[0] = encode(buffers[0], x)
        return buffers[0]

    def run_decode() -> jax.Array:
        buffers[1] = decode(buffers[1], buffers[0])
        return buffers[1]

    return run_encode, run_decode


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
    """Times encode and decode of every format against a bandwidth-bound copy.

    Args:
        n: number of float32 values.
        repeats: timed rounds after the warm-up (>= 1; use >= 5 for reports).
        names: formats to time; default every registered one (float64 only when
            x64 is enabled).
        seed: seed of the input values.

    Returns:
        ``{"n", "repeats", "baseline", "baseline_gbs", "baseline_gbs_rounds",
        "copy_ms", "rows": [{"name", "bits", "encode_ms", "decode_ms",
        "total_ms", "ratio", "ratio_paired", "floor", "target", "meets_target",
        "bytes_per_value"}], "device", "cpu_count", "jax"}``. ``baseline_gbs`` is
        the median STREAM copy bandwidth (GB/s, per round in
        ``baseline_gbs_rounds``) and ``copy_ms`` the time a copy of ``n`` values
        takes at it. ``ratio`` divides the median times; ``ratio_paired`` is the
        median of the per-round ratios; ``floor`` is the memory-bound ratio
        ``1 + bytes_per_value / 4``.

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
    copy_mib = max(1, -(-x.nbytes // 2**20))  # the same array size, in whole MiB
    codecs = {f.name: in_place(f, x) for f in fmts}
    for run_encode, run_decode in codecs.values():  # warm-up (compiles)
        jax.block_until_ready(run_encode())
        jax.block_until_ready(run_decode())

    gbs: list[float] = []
    times: dict[str, list[float]] = {"copy": []}
    for f in fmts:
        times[f"{f.name}/encode"] = []
        times[f"{f.name}/decode"] = []
    for _ in range(repeats):
        copy = stream_bandwidths(size_mib=copy_mib, repeats=1, kernels=("copy",))
        gbs.append(copy["copy"])
        times["copy"].append(2 * x.nbytes / (gbs[-1] * 1e9))
        for f in fmts:
            run_encode, run_decode = codecs[f.name]
            times[f"{f.name}/encode"].append(time_call(run_encode))
            times[f"{f.name}/decode"].append(time_call(run_decode))

    baseline_gbs = statistics.median(gbs)
    copy_ms = 1e3 * 2 * x.nbytes / (baseline_gbs * 1e9)
    rows = []
    for f in fmts:
        enc = 1e3 * statistics.median(times[f"{f.name}/encode"])
        dec = 1e3 * statistics.median(times[f"{f.name}/decode"])
        target = TARGETS.get(f.name)
        # The ratio taken within each round, then the median: robust against load
        # that drifts between rounds on a shared machine.
        paired = statistics.median(
            (e + d) / c
            for e, d, c in zip(
                times[f"{f.name}/encode"],
                times[f"{f.name}/decode"],
                times["copy"],
                strict=True,
            )
        )
        itemsize = f.storage_dtype.itemsize
        rows.append(
            {
                "name": f.name,
                "bits": f.bits,
                "encode_ms": enc,
                "decode_ms": dec,
                "total_ms": enc + dec,
                "ratio": (enc + dec) / copy_ms,
                "ratio_paired": paired,
                "floor": 1 + itemsize / x.dtype.itemsize,
                "target": target,
                "meets_target": None if target is None else paired <= target,
                "bytes_per_value": itemsize,
            }
        )
    return {
        "n": n,
        "repeats": repeats,
        "baseline": BASELINE,
        "baseline_gbs": baseline_gbs,
        "baseline_gbs_rounds": gbs,
        "copy_ms": copy_ms,
        "rows": rows,
        "environment": _framework.capture_environment(seed=seed),
    }


def table(result: dict[str, Any]) -> str:
    """A markdown table of a `bench` result, one row per format."""
    lines = [
        f"n = {result['n']:,} float32 values, median of {result['repeats']} "
        f"rounds; baseline: {result['baseline']}, {result['baseline_gbs']:.1f} "
        f"GB/s, {result['copy_ms']:.2f} ms for n values",
        "",
        "| format | bits | encode ms | decode ms | (enc+dec)/copy | per-round "
        "| floor | target | ok |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in result["rows"]:
        target = "" if r["target"] is None else f"<= {r['target']:g}x"
        ok = {None: "", True: "yes", False: "NO"}[r["meets_target"]]
        lines.append(
            f"| {r['name']} | {r['bits']} | {r['encode_ms']:.2f} | "
            f"{r['decode_ms']:.2f} | {r['ratio']:.2f}x | {r['ratio_paired']:.2f}x "
            f"| {r['floor']:g}x | {target} | {ok} |"
        )
    return "\n".join(lines)


def check_json_path(parser: argparse.ArgumentParser, path: Path | None) -> None:
    """Refuse a ``--json`` destination that cannot be written, before measuring.

    Makes the file's directory; reports through ``parser.error`` (exit status 2).
    """
    if path is None:
        return
    if path.is_dir():
        parser.error(f"--json {path}: is a directory; give a file name.")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        parser.error(
            f"--json {path}: cannot create directory {path.parent} "
            f"({err.strerror}); write the file elsewhere."
        )
    if not os.access(path.parent, os.W_OK | os.X_OK):
        parser.error(
            f"--json {path}: directory {path.parent} is not writable; write the "
            "file elsewhere."
        )


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
    check_json_path(parser, args.json)
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
            f"{r['name']}: (encode + decode) / copy {r['ratio_paired']:.2f}x misses "
            f"the target of {r['target']:g}x",
            file=sys.stderr,
        )
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
