"""Free-surface benchmark: the free-surface step's MLUPs beside the plain step's.

A free-surface step does more than a plain lattice Boltzmann step (the fill
level, the curvature near the interface, the mass exchange, the conversions and
the excess mass), so its throughput is judged against the plain step measured
in the same process, in interleaved rounds (the machine's load changes between
runs): the row's figure is the median of the per-round ratios
``free-surface MLUPs / plain MLUPs``.

The timed flow: D3Q19, an ``n^3`` box with a solid floor and ceiling (the
raindrop case's walls; the side walls periodic), tau 0.6, BGK, a pool filling
the lower half and a drop of radius ``n/8`` falling into it at 0.02 (sigma
1e-3, gravity 1e-5); MLUPs count every cell, gas and walls included. The plain step
is :class:`lbm_jax.bench.BenchRun` on the same grid and storage, on one device
(the free-surface step runs on one). Both use the backend ``--backend`` selects
(``auto``: the native CPU steps where they cover the configuration, the fused
GPU steps on a GPU).

Run::

    python -m lbm_jax.bench_free_surface --n 64 --storage fp32,fp16s --rounds 3 \\
        --json out.json

The exit status is 1 when a storage's median ratio is below ``--target``
(:data:`TARGET_RATIO`), 2 for invalid arguments.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from lbm_jax.cli._parser import Parser, choice_of
from lbm_jax.step._backend import BACKENDS

__all__ = ["TARGET_RATIO", "bench_free_surface", "main"]

#: The free-surface step's throughput the project aims at, relative to the
#: plain step's on the same grid and storage.
TARGET_RATIO = 0.4


def _free_surface_run(n: int, storage: str, steps: int, backend: str) -> Any:
    """``(fs, advance, state)``: the timed flow, compiled and warmed up."""
    import lbm_jax
    from lbm_jax.cases.free_surface import floor_and_ceiling
    from lbm_jax.free_surface import FreeSurface, sphere_fill

    shape = (n, n, n)
    sim = lbm_jax.Simulation(
        "D3Q19", shape, tau=0.6, storage=storage, cell_type=floor_and_ceiling(shape)
    )
    fs = FreeSurface(sim, sigma=1e-3, gravity=(0.0, 0.0, -1e-5), backend=backend)
    drop = sphere_fill(shape, (n / 2, n / 2, 0.7 * n), n / 8, samples=2)
    pool = np.zeros(shape)
    pool[..., : n // 2] = 1.0
    u = np.zeros((3, *shape))
    u[2] = np.where(drop > 0, -0.02, 0.0)
    state = fs.init(np.maximum(drop, pool), u=u)

    @jax.jit
    def advance(s: Any) -> Any:
        return jax.lax.fori_loop(0, steps, lambda _, x: fs.step(x), s)

    return fs, advance, jax.block_until_ready(advance(state))


def bench_free_surface(
    n: int = 64,
    storages: Sequence[str] = ("fp32", "fp16s"),
    *,
    steps: int = 20,
    repeats: int = 5,
    rounds: int = 3,
    backend: str = "auto",
) -> dict[str, Any]:
    """Free-surface and plain MLUPs, side by side, per storage.

    Args:
        n: Cells per side (>= 16).
        storages: Storage policy names.
        steps: Steps per timed run.
        repeats: Timed runs per round (the median is the round's figure).
        rounds: Interleaved rounds (the median ratio is the row's figure).
        backend: ``"auto"``, ``"gpu"``, ``"native"`` or ``"xla"``, for both steps.

    Returns:
        ``{"target_ratio": ..., "results": [row per storage]}``, each row with
        ``storage``, ``n``, ``steps``, ``free_surface_backend``,
        ``plain_backend``, the per-round ``free_surface_mlups``, ``plain_mlups``
        and ``ratios``, and their medians ``free_surface``, ``plain`` and
        ``ratio``.

    Raises:
        ValueError: Bad sizes or counts, an unknown storage (before compiling).
    """
    from lbm_jax import bench
    from lbm_jax.core._lattice import get_lattice
    from lbm_jax.core._storage import get_storage

    for name, value, minimum in (
        ("n", n, 16),
        ("steps", steps, 1),
        ("repeats", repeats, 1),
        ("rounds", rounds, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}.")
    policies = [get_storage(s) for s in storages]
    lat = get_lattice("D3Q19")
    runs = []
    for policy in policies:
        plain = bench.BenchRun(
            lat, n, policy, steps=steps, collision="bgk", devices=1, backend=backend
        )
        runs.append((policy, plain, *_free_surface_run(n, policy.name, steps, backend)))
    per_round: dict[str, dict[str, list[float]]] = {}
    for _ in range(rounds):
        for policy, plain, _, advance, state in runs:
            holder = [state]

            def timed(advance: Any = advance, holder: list = holder) -> Any:
                holder[0] = advance(holder[0])
                return holder[0]

            fs_mlups = n**3 * steps / bench.median_seconds(timed, repeats) / 1e6
            plain_mlups = n**3 * steps / plain.time(repeats) / 1e6
            row = per_round.setdefault(policy.name, {"fs": [], "plain": []})
            row["fs"].append(fs_mlups)
            row["plain"].append(plain_mlups)
    results = []
    for policy, plain, fs, _, _ in runs:
        row = per_round[policy.name]
        ratios = [a / b for a, b in zip(row["fs"], row["plain"], strict=True)]
        results.append(
            {
                "storage": policy.name,
                "n": n,
                "steps": steps,
                "free_surface_backend": fs.backend,
                "plain_backend": plain.sim.backend,
                "free_surface_mlups": row["fs"],
                "plain_mlups": row["plain"],
                "ratios": ratios,
                "free_surface": statistics.median(row["fs"]),
                "plain": statistics.median(row["plain"]),
                "ratio": statistics.median(ratios),
            }
        )
    return {"target_ratio": TARGET_RATIO, "results": results}


def main(argv: Sequence[str] | None = None) -> int:
    """Command line; returns the exit status (1: a ratio below the target)."""
    parser = Parser(
        prog="python -m lbm_jax.bench_free_surface",
        description="Free-surface step MLUPs against the plain step's (D3Q19).",
    )
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--storage", default="fp32,fp16s")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--backend", default="auto", type=choice_of(BACKENDS), choices=BACKENDS
    )
    parser.add_argument("--target", type=float, default=TARGET_RATIO)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if not args.target > 0:
        parser.error(f"--target must be a positive ratio, got {args.target}.")
    if args.json is not None and args.json.is_dir():
        parser.error(f"--json {args.json} is a directory; give a file name.")
    try:
        report = bench_free_surface(
            args.n,
            [s.strip() for s in args.storage.split(",")],
            steps=args.steps,
            repeats=args.repeats,
            rounds=args.rounds,
            backend=args.backend,
        )
    except ValueError as err:
        parser.error(str(err))
    report["target_ratio"] = args.target
    print("| storage | free surface MLUPs | plain MLUPs | ratio | backends |")
    print("|---|---:|---:|---:|---|")
    for r in report["results"]:
        print(
            f"| {r['storage']} | {r['free_surface']:.1f} | {r['plain']:.1f} | "
            f"{r['ratio']:.2f} | {r['free_surface_backend']} / {r['plain_backend']} |"
        )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    short = [r["storage"] for r in report["results"] if r["ratio"] < args.target]
    if short:
        print(f"below the target ratio {args.target}: {', '.join(short)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
