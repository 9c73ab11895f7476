"""Cost of `mpjax.profile` against the training step it profiles.

The profiled program is the loss of an MLP classifier (64-128-128-10, ReLU, the
`experiments._models.MLP` of the experiments) on a batch of 256 random inputs,
forward and backward (`grads=True`); the baseline is the jitted Adam training
step of the same model and batch (loss, gradients and the optax update). Both
are compiled first (the compile time of each profiling program is reported),
then every round times the training step once and each profiling program once,
each call ending in `block_until_ready`. The headline ratio profile / step is
taken within each round; the median over rounds and its 95 % interval are
reported (`experiments._stats`), for the profile without candidate formats and
with the default formats of `mpjax.profile`.

Target: a profile costs at most `TARGET` training steps. The command exits with
status 1 when the median ratio of any variant misses it; the verdict of the
interval (met, missed or unresolved) says whether the measurement can tell.

Run ``python -m experiments.bench_profile [--repeats 21] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

import mpjax
from experiments import _framework
from experiments._models import MLP, classification_loss
from experiments._stats import LEVEL, median_interval, verdict
from experiments.bench_formats import check_json_path, time_call
from mpjax import profile_program

__all__ = ["TARGET", "bench", "main", "table"]

#: Largest acceptable (profile time) / (training step time).
TARGET = 3.0

#: (label, candidate formats) of the profiling variants.
VARIANTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("no formats", ()),
    ("default formats", inspect.signature(mpjax.profile).parameters["formats"].default),
)


def _task(batch: int, seed: int) -> tuple[Any, Any, Any, jax.Array, jax.Array]:
    model = MLP(64, 128, 10, depth=2, rngs=nnx.Rngs(seed))
    graphdef, params = nnx.split(model)
    kx, ky = jax.random.split(jax.random.key(seed))
    x = jax.random.normal(kx, (batch, 64), jnp.float32)
    y = jax.random.randint(ky, (batch,), 0, 10)

    def loss(p: Any, xb: jax.Array, yb: jax.Array) -> jax.Array:
        return classification_loss(nnx.merge(graphdef, p), (xb, yb))

    return loss, graphdef, params, x, y


def bench(
    *, repeats: int = 21, batch: int = 256, sample: int | None = None, seed: int = 0
) -> dict[str, Any]:
    """Times the profiling programs against the training step, round by round.

    Args:
        repeats: timed rounds after the warm-up (>= 6 for a 95 % interval).
        batch: batch size.
        sample: `sample` argument of the profile; None for its default.
        seed: seed of the model and data.

    Returns:
        A JSON-able dict: step and profile times (ms), compile times (s), the
        per-round ratios' median and interval per variant, and the verdicts.
    """
    median_interval(range(repeats))  # raises early when too few rounds
    loss, _, params, x, y = _task(batch, seed)
    opt = optax.adam(1e-3)

    @jax.jit
    def step(p: Any, state: Any, xb: jax.Array, yb: jax.Array) -> Any:
        value, g = jax.value_and_grad(loss)(p, xb, yb)
        updates, state = opt.update(g, state, p)
        return optax.apply_updates(p, updates), state, value

    opt_state = opt.init(params)
    jax.block_until_ready(step(params, opt_state, x, y))
    extra = {} if sample is None else {"sample": sample}
    programs, compile_s, values = {}, {}, {}
    for label, fmts in VARIANTS:
        program, inputs, finish = profile_program(
            loss, params, x, y, grads=True, formats=fmts, **extra
        )
        start = time.perf_counter()
        compiled = program.lower(*inputs).compile()
        compile_s[label] = time.perf_counter() - start
        values[label] = len(finish(jax.device_get(compiled(*inputs))).records)
        programs[label] = (compiled, inputs)
    times: dict[str, list[float]] = {"step": [], **{k: [] for k, _ in VARIANTS}}
    for _ in range(repeats):
        times["step"].append(time_call(lambda: step(params, opt_state, x, y)))
        for label, (compiled, inputs) in programs.items():
            times[label].append(time_call(lambda c=compiled, i=inputs: c(*i)))
    rows = []
    for label, fmts in VARIANTS:
        ratios = [p / s for p, s in zip(times[label], times["step"], strict=True)]
        low, high = median_interval(ratios, LEVEL)
        median = statistics.median(ratios)
        rows.append(
            {
                "variant": label,
                "formats": list(fmts),
                "values": values[label],
                "profile_ms": 1e3 * statistics.median(times[label]),
                "compile_s": compile_s[label],
                "ratio": median,
                "low": low,
                "high": high,
                "meets_target": median <= TARGET,
                "verdict": verdict(low, high, TARGET, at_most=True),
            }
        )
    return {
        "batch": batch,
        "repeats": repeats,
        "sample": sample,
        "target": TARGET,
        "step_ms": 1e3 * statistics.median(times["step"]),
        "rows": rows,
        "environment": _framework.capture_environment(seed=seed),
    }


def table(result: dict[str, Any]) -> str:
    """A markdown table of a `bench` result, one row per profiling variant."""
    lines = [
        f"MLP 64-128-128-10, batch {result['batch']}, Adam step "
        f"{result['step_ms']:.3f} ms, median of {result['repeats']} rounds "
        f"({result['environment']['device_kind']})",
        "",
        "| variant | values | profile ms | compile s | profile/step | "
        f"{LEVEL:.0%} interval | target | ok | interval verdict |",
        "|---|---:|---:|---:|---:|---|---:|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['variant']} | {r['values']} | {r['profile_ms']:.3f} | "
            f"{r['compile_s']:.1f} | {r['ratio']:.2f}x | [{r['low']:.2f}, "
            f"{r['high']:.2f}] | <= {result['target']:g}x | "
            f"{'yes' if r['meets_target'] else 'NO'} | {r['verdict']} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: run the benchmark, print the table, optionally write JSON.

    Returns:
        0 when every variant meets `TARGET`, 1 otherwise (2, by ``SystemExit``,
        for invalid arguments).
    """
    parser = argparse.ArgumentParser(
        prog="python -m experiments.bench_profile", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--repeats", type=int, default=21, help="timed rounds")
    parser.add_argument("--batch", type=int, default=256, help="batch size")
    parser.add_argument("--sample", type=int, default=None, help="profile sample")
    parser.add_argument("--json", type=Path, default=None, help="write results here")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.repeats < 6:
        parser.error(f"--repeats must be >= 6 (95 % interval), got {args.repeats}")
    if args.batch < 1:
        parser.error(f"--batch must be >= 1, got {args.batch}")
    if args.sample is not None and args.sample < 1:
        parser.error(f"--sample must be >= 1, got {args.sample}")
    check_json_path(parser, args.json)
    result = bench(
        repeats=args.repeats, batch=args.batch, sample=args.sample, seed=args.seed
    )
    print(table(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")
    missed = [r for r in result["rows"] if not r["meets_target"]]
    for r in missed:
        print(
            f"{r['variant']}: profile / step {r['ratio']:.2f}x misses the target "
            f"of {TARGET:g}x",
            file=sys.stderr,
        )
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
