"""Reverse-mode benchmark: the memory of a checkpointed gradient, the cost of an
adjoint step.

1. **Memory.** ``jax.grad`` of the kinetic energy of a D3Q19 ``n^3``
   Taylor-Green flow after ``steps`` steps by its amplitude, through
   :meth:`~lbm_jax.Simulation.advance` (default checkpoints), for each storage and
   step count. The **planned** memory is XLA's buffer assignment for the compiled
   gradient (``memory_analysis()``: arguments, outputs and temporaries; on a CPU
   the temporaries are one allocation of that size), read without running it, so
   it is cheap at any size; the **tape** is the same figure with
   ``checkpoint_every=1`` (every step kept), what an unchecked reverse mode
   holds. ``--run`` also runs each gradient in a fresh process and reads its peak
   resident memory (``VmHWM``, as :mod:`lbm_jax.bench_memory` does).
   Targets (:data:`MEMORY_TARGETS`): at ``n = 128`` and 1000 steps the 16-bit
   (FP16S) gradient plans at most 3 GB and at most 0.6 times the FP32 one.
2. **Cost.** One vector-Jacobian step (``jax.vjp`` of
   :meth:`~lbm_jax.Simulation.step` applied to a cotangent; what the compiled
   program keeps of the forward pass, and the adjoint) against one forward step
   of the backend ``"auto"`` picks (on a CPU the native step, differentiated by
   its own adjoint, ``lbm_jax/step/_native/lbm_adjoint.cc``), and of the XLA
   step, timed side by side in one process (median of ``repeats`` after a
   warm-up). The ``derivative`` column names the backend whose derivative runs.
   Target (:data:`COST_TARGET`): the rows of the backend ``"auto"`` picks cost at
   most 3 forward steps of that backend; the XLA rows are for comparison.

Run::

    python -m lbm_jax.bench_gradient --n 128 --steps 10,100,1000 --json out.json
    python -m lbm_jax.bench_gradient --cost-only --cost-n 64   # the cost rows only

The exit status is 1 when a target is missed or a measurement fails.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

import lbm_jax
from lbm_jax.bench import median_seconds, taylor_green_velocity

__all__ = ["COST_TARGET", "MEMORY_TARGETS", "check", "cost", "main", "memory"]

#: ``(n, steps)`` at which the memory targets apply, the most the FP16S gradient
#: may plan there (bytes), and its largest ratio to the FP32 gradient.
MEMORY_TARGETS = {"n": 128, "steps": 1000, "fp16s_bytes": 3e9, "fp16s_vs_fp32": 0.6}
#: The most one vector-Jacobian step may cost, in forward steps of its backend.
COST_TARGET = 3.0
GB = 1e9


def _gradient(n: int, storage: str, steps: int, every: Any = None):
    """The jitted gradient ``amp -> d energy / d amp`` and its argument."""
    sim = lbm_jax.Simulation("D3Q19", (n,) * 3, tau=0.8, storage=storage)
    shape = jnp.asarray(taylor_green_velocity(3, n, 1.0), sim.storage.compute_dtype)

    def energy(amp: jax.Array) -> jax.Array:
        state = sim.advance(sim.init(u=amp * shape), steps, checkpoint_every=every)
        return jnp.sum(sim.fields(state, which="velocity")[1] ** 2)

    return jax.jit(jax.grad(energy)), jnp.asarray(0.05, sim.storage.compute_dtype)


def _planned(n: int, storage: str, steps: int, every: Any = None) -> int:
    grad, amp = _gradient(n, storage, steps, every)
    m = grad.lower(amp).compile().memory_analysis()
    return m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes


def _peak_in_subprocess(n: int, storage: str, steps: int) -> float:
    """Peak resident memory (bytes) of one gradient run in a fresh process."""
    cmd = [sys.executable, "-m", "lbm_jax.bench_gradient", "--worker"]
    cmd += ["--n", str(n), "--storage", storage, "--steps", str(steps)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    return float(proc.stdout.strip().splitlines()[-1])


def _worker(n: int, storage: str, steps: int) -> float:
    from lbm_jax.bench_memory import peak_rss

    grad, amp = _gradient(n, storage, steps)
    jax.block_until_ready(grad(amp))
    return float(peak_rss())


def memory(
    n: int, storages: Sequence[str], steps: Sequence[int], *, run: bool = False
) -> list[dict[str, Any]]:
    """One row per storage and step count: planned bytes of the checkpointed
    gradient and of the tape, and with ``run`` the measured peak."""
    rows = []
    for storage in storages:
        for count in steps:
            row = {"n": n, "storage": lbm_jax.get_storage(storage).name}
            row |= {"steps": count, "planned": _planned(n, storage, count)}
            row["tape"] = _planned(n, storage, count, every=1)
            if run:
                row["peak"] = _peak_in_subprocess(n, storage, count)
            rows.append(row)
    return rows


def _step_seconds(sim: lbm_jax.Simulation, n: int, repeats: int) -> tuple[float, float]:
    """Median seconds of one forward step and of one vector-Jacobian step."""
    state = sim.init(u=jnp.asarray(taylor_green_velocity(3, n, 0.05), jnp.float32))

    def forward(f: jax.Array) -> jax.Array:
        return sim.step(lbm_jax.LBMState(f, state.t)).f

    fwd = jax.jit(forward)
    vjp = jax.jit(lambda f, ct: jax.vjp(forward, f)[1](ct)[0])
    ct = jnp.ones_like(state.f)
    return (
        median_seconds(lambda: fwd(state.f), repeats),
        median_seconds(lambda: vjp(state.f, ct), repeats),
    )


def cost(n: int, *, repeats: int = 25) -> list[dict[str, Any]]:
    """Seconds of one forward and one vector-Jacobian step, per backend (FP32 and
    FP16S storage), measured side by side."""
    rows = []
    for storage in ("fp32", "fp16s"):
        for backend in ("auto", "xla"):
            sim = lbm_jax.Simulation(
                "D3Q19", (n,) * 3, tau=0.8, storage=storage, backend=backend
            )
            forward, vjp = _step_seconds(sim, n, repeats)
            rows.append(
                {
                    "n": n,
                    "storage": sim.storage.name,
                    "backend": sim.backend,
                    "derivative": sim.backends["derivative"],
                    "forward_s": forward,
                    "vjp_s": vjp,
                    "ratio": vjp / forward,
                    "target": backend == "auto",
                }
            )
    return rows


def check(memory_rows: Sequence[dict] | None, cost_rows: Sequence[dict]) -> list[str]:
    """The missed targets (empty when all are met); a target whose row is
    missing is missed. ``memory_rows`` ``None``: the memory targets are not
    checked (``--cost-only``); the cost target applies to the rows marked
    ``target`` (the backend ``"auto"`` picks)."""
    failures = []
    if memory_rows is not None:
        failures += _check_memory(memory_rows)
    checked = [r for r in cost_rows if r.get("target", True)]
    if not checked:
        failures.append("cost: no rows")
    for r in checked:
        if r["ratio"] > COST_TARGET:
            failures.append(
                f"cost: {r['storage']} {r['backend']} step: one vector-Jacobian "
                f"step (the {r['derivative']} derivative) costs {r['ratio']:.2f} "
                f"forward steps > {COST_TARGET}"
            )
    return failures


def _check_memory(memory_rows: Sequence[dict]) -> list[str]:
    failures = []
    t = MEMORY_TARGETS
    at = {
        r["storage"]: r
        for r in memory_rows
        if (r["n"], r["steps"]) == (t["n"], t["steps"])
    }
    fp16s, fp32 = at.get("FP32/FP16S"), at.get("FP32/FP32")
    if fp16s is None or fp32 is None:
        failures.append(
            f"memory: no FP16S and FP32 rows at n={t['n']}, {t['steps']} steps"
        )
    else:
        used = max(fp16s["planned"], fp16s.get("peak", 0.0))
        if used > t["fp16s_bytes"]:
            failures.append(
                f"memory: FP16S gradient {used / GB:.2f} GB "
                f"> {t['fp16s_bytes'] / GB:.0f} GB"
            )
        ratio = fp16s["planned"] / fp32["planned"]
        if ratio > t["fp16s_vs_fp32"]:
            failures.append(f"memory: FP16S/FP32 {ratio:.2f} > {t['fp16s_vs_fp32']}")
    return failures


def _tables(memory_rows: Sequence[dict], cost_rows: Sequence[dict]) -> str:
    head = ("n", "storage", "steps", "planned GB", "tape GB", "peak GB")
    lines = [
        "reverse-mode memory (D3Q19 Taylor-Green, d energy / d amplitude)",
        "{:>5} {:<12} {:>6} {:>11} {:>9} {:>8}".format(*head),
    ]
    for r in memory_rows:
        peak = f"{r['peak'] / GB:8.2f}" if "peak" in r else f"{'-':>8}"
        lines.append(
            f"{r['n']:>5} {r['storage']:<12} {r['steps']:>6} "
            f"{r['planned'] / GB:11.2f} {r['tape'] / GB:9.1f} {peak}"
        )
    head = ("n", "storage", "backend", "derivative", "forward", "vjp", "ratio")
    lines += [
        "",
        "one step: forward vs vector-Jacobian (median seconds; * target rows)",
        "{:>5} {:<12} {:<7} {:<10} {:>9} {:>9} {:>6}".format(*head),
    ]
    for r in cost_rows:
        mark = " *" if r.get("target", True) else ""
        lines.append(
            f"{r['n']:>5} {r['storage']:<12} {r['backend']:<7} "
            f"{r['derivative']:<10} {r['forward_s']:9.4f} {r['vjp_s']:9.4f} "
            f"{r['ratio']:6.2f}{mark}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--n",
        type=int,
        default=MEMORY_TARGETS["n"],
        help="cube side of the memory rows",
    )
    parser.add_argument(
        "--steps", default="10,100,1000", help="step counts of the memory rows"
    )
    parser.add_argument("--storage", default="fp32,fp16s")
    parser.add_argument(
        "--cost-n", type=int, default=64, help="cube side of the cost rows"
    )
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument(
        "--run",
        action="store_true",
        help="also run each gradient and read its peak memory",
    )
    parser.add_argument(
        "--cost-only",
        action="store_true",
        help="measure and check the cost rows only (no memory rows)",
    )
    parser.add_argument("--json", default=None, help="write the rows to this file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(_worker(args.n, args.storage, int(args.steps)))
        return 0
    steps = [int(s) for s in args.steps.split(",")]
    mem = (
        None
        if args.cost_only
        else memory(args.n, args.storage.split(","), steps, run=args.run)
    )
    costs = cost(args.cost_n, repeats=args.repeats)
    print(_tables(mem or [], costs))
    failures = check(mem, costs)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {"memory": mem, "cost": costs, "failures": failures}, fh, indent=2
            )
    for f in failures:
        print("MISSED:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
