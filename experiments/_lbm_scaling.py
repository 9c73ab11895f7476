"""Strong and weak scaling of the LBM step over device counts.

Part of the ``lbm_performance`` pipeline: every point is ``python -m lbm_jax bench
--devices P`` in its own process with exactly ``P`` host devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=P``), the box split along x.
Strong scaling keeps the box, weak scaling about the cells per device. The table
reports MLUPs, speedup, efficiency ``MLUPs_P / (P MLUPs_1)`` and the halo traffic
per step, and every figure has a check (:func:`scaling_checks`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import lbm_jax
from experiments._report import markdown_table, progress
from experiments._stats import spread_verdict

__all__ = [
    "Scaling",
    "analyse_scaling",
    "bench_json",
    "expected_halo_bytes",
    "measure_scaling",
    "scaling_checks",
    "scaling_command",
    "scaling_env",
    "scaling_table",
    "scaling_unresolved",
]


@dataclasses.dataclass(frozen=True)
class Scaling:
    """Strong and weak scaling over device counts (x-split boxes of D3Q19).

    Attributes:
        n: Box side of the strong-scaling runs (the same box on every count) and
            of the one-device weak-scaling run.
        devices: Device counts; each runs in its own process with that many
            (host) devices, the box split along x.
        updates, repeats, rounds: As in :class:`Settings`, per run.
        lattice, storage: What is timed.
        backend: The step timed (``"xla"`` by default: on a CPU the native step
            already spreads one device's work over every core with threads, so
            its host devices are not units of compute; XLA's are, as GPUs are).
        min_speedup: The stated least strong-scaling speedup of the largest
            count over one device (checked when given).
    """

    n: int
    devices: tuple[int, ...]
    updates: float
    repeats: int
    rounds: int
    lattice: str = "D3Q19"
    storage: str = "fp32"
    backend: str = "xla"
    min_speedup: float | None = None

    def weak_n(self, devices: int) -> int:
        """Box side with about ``n^3`` cells per device, divisible by ``devices``.

        >>> Scaling(128, (1, 2), 1e6, 1, 1).weak_n(2)
        160
        """
        d = int(self.lattice[1])
        side = round(self.n * devices ** (1 / d))
        return side - side % devices

    def runs(self) -> list[tuple[str, int, int]]:
        """``(kind, devices, n)`` of every run; one device is shared by both."""
        strong = [("strong", p, self.n) for p in self.devices]
        return strong + [("weak", p, self.weak_n(p)) for p in self.devices if p > 1]


def bench_json(cmd: list, path: Path, env: dict[str, str] | None = None) -> dict:
    """Run a ``python -m lbm_jax bench ... --json path`` command; its report."""
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd[1:])} failed (exit {proc.returncode}):\n"
            f"{proc.stdout[-2000:]}{proc.stderr[-4000:]}"
        )
    return json.loads(path.read_text())


def scaling_command(scaling: Scaling, devices: int, n: int, json_path: Path) -> list:
    """The ``python -m lbm_jax bench`` command line of one scaling run (to be run
    with :func:`scaling_env`)."""
    steps = lbm_jax.bench.steps_for(n ** int(scaling.lattice[1]), scaling.updates)
    cmd = [
        *(sys.executable, "-m", "lbm_jax", "bench", "--lattice", scaling.lattice),
        *("--n", str(n), "--storage", scaling.storage, "--steps", str(steps)),
        *("--repeats", str(scaling.repeats), "--rounds", str(scaling.rounds)),
        *("--devices", str(devices), "--json", str(json_path)),
        *("--backend", scaling.backend),
    ]
    return cmd


def scaling_env(devices: int) -> dict[str, str]:
    """The environment of a scaling run: exactly ``devices`` host devices."""
    flags = [
        f
        for f in os.environ.get("XLA_FLAGS", "").split()
        if not f.startswith("--xla_force_host_platform_device_count")
    ]
    flags.append(f"--xla_force_host_platform_device_count={devices}")
    return dict(os.environ, XLA_FLAGS=" ".join(flags))


def measure_scaling(scaling: Scaling) -> list[dict[str, Any]]:
    """Run every scaling point in its own process; one row per run."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind, devices, n in progress(scaling.runs(), desc="scaling"):
            path = Path(tmp) / f"{kind}_{devices}.json"
            cmd = scaling_command(scaling, devices, n, path)
            (out,) = bench_json(cmd, path, scaling_env(devices))["results"]
            keys = ("lattice", "n", "cells", "storage", "mlups", "bytes_per_cell")
            keys += ("devices", "decomposition", "halo_bytes")
            rounds = out.get("mlups_rounds", [out["mlups"]])
            rows.append({"kind": kind, **{k: out[k] for k in keys}, "rounds": rounds})
    return rows


def expected_halo_bytes(row: dict[str, Any], q: int) -> int:
    """Halo bytes per step of an x-split box from its face sizes: each of the
    ``p`` blocks sends its two x-faces of ``n^(d-1)`` cells, ``q`` values each."""
    p, n, d = row["devices"], row["n"], int(row["lattice"][1])
    itemsize = row["bytes_per_cell"] // (2 * q)
    return 0 if p == 1 else p * 2 * n ** (d - 1) * q * itemsize


def analyse_scaling(rows: list[dict[str, Any]]) -> None:
    """Add speedup, efficiency and halo-traffic share to every scaling row.

    Efficiency is ``MLUPs_p / (p MLUPs_1)`` against the one-device run (for weak
    scaling, per-device throughput at about the same cells per device); the halo
    share is the halo bytes over the populations' bytes of a step.
    """
    one = [r for r in rows if r["devices"] == 1]
    base = one[0]["mlups"] if one else math.nan
    for r in rows:
        r["cells_per_device"] = r["cells"] // r["devices"]
        r["speedup"] = r["mlups"] / base
        r["efficiency"] = r["speedup"] / r["devices"]
        r["halo_share"] = r["halo_bytes"] / (r["cells"] * r["bytes_per_cell"])


def scaling_checks(rows: list[dict[str, Any]], scaling: Scaling) -> dict[str, bool]:
    """Checks of the scaling table (a missing run fails every one)."""
    q = lbm_jax.get_lattice(scaling.lattice).q
    wanted = {(k, p) for k, p, _ in scaling.runs()}
    have = {(r["kind"], r["devices"]): r for r in rows}
    complete = wanted <= set(have)
    checks = {
        "scaling: every run measured, MLUPs and efficiency finite and positive": (
            complete
            and all(
                math.isfinite(r["efficiency"])
                and r["mlups"] > 0
                and r["efficiency"] > 0
                for r in rows
            )
        ),
        "scaling: each run split x over its devices": complete
        and all(
            r["decomposition"][0] == r["devices"] == math.prod(r["decomposition"])
            for r in rows
        ),
        "scaling: halo bytes = devices x 2 faces x n^2 cells x q x storage bytes": (
            complete and all(r["halo_bytes"] == expected_halo_bytes(r, q) for r in rows)
        ),
    }
    if scaling.min_speedup is not None:
        name, met, _ = _judge_speedup(rows, scaling)
        checks[name] = met
    return checks


def _judge_speedup(
    rows: list[dict[str, Any]], scaling: Scaling
) -> tuple[str, bool, str | None]:
    """``(check name, met, unresolved spread)`` of the strong-scaling speedup.

    Its spread is every ratio of a round of the largest count to a round of one
    device (two processes, so their rounds are not paired).
    """
    top = max(scaling.devices)
    name = f"scaling: strong speedup on {top} devices >= {scaling.min_speedup:g}"
    have = {(r["kind"], r["devices"]): r for r in rows}
    row, one = have.get(("strong", top)), have.get(("strong", 1))
    if row is None or one is None:
        return name, False, None
    ratios = [
        a / b
        for a in row.get("rounds") or [row["mlups"]]
        for b in one.get("rounds") or [one["mlups"]]
    ]
    met, spread = spread_verdict(ratios, scaling.min_speedup)
    return name, met, spread


def scaling_unresolved(rows: list[dict[str, Any]], scaling: Scaling) -> dict[str, str]:
    """The scaling checks the machine's load left unresolved: name -> spread."""
    if scaling.min_speedup is None:
        return {}
    name, _, spread = _judge_speedup(rows, scaling)
    return {name: spread} if spread else {}


def scaling_table(rows: list[dict[str, Any]]) -> str:
    """Markdown table of the scaling runs."""
    return markdown_table(
        [
            "scaling",
            "devices",
            "split",
            "box",
            "cells/device",
            "MLUPs",
            "MLUPs/device",
            "speedup",
            "efficiency",
            "halo MB/step",
            "halo share",
        ],
        [
            [
                r["kind"],
                r["devices"],
                "x".join(map(str, r["decomposition"])),
                f"{r['n']}^{r['lattice'][1]}",
                r["cells_per_device"],
                r["mlups"],
                r["mlups"] / r["devices"],
                r["speedup"],
                r["efficiency"],
                r["halo_bytes"] / 1e6,
                r["halo_share"],
            ]
            for r in rows
        ],
    )
