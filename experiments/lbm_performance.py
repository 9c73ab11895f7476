"""LBM performance: MLUPs per lattice x storage x grid size, against the roofline.

For every lattice, grid size and storage policy the pipeline times the compiled solver
with `lbm_jax.bench.bench` (warm-up first, median of ``repeats`` timed runs,
``block_until_ready``) and measures the memory bandwidth in the same process with
`lbm_jax.bench.measure_bandwidth` (before and after the sweep; the median is used).
The memory-bandwidth roofline of a storage policy is ``bandwidth / bytes_per_cell``
(each cell loads and stores its ``q`` populations once per step), and the table reports
the fraction of it that the solver reaches, plus the speed relative to FP32/FP32 on the
same grid (a ratio measured side by side in one run, robust to a shared machine).

On a GPU, ``--full`` runs D3Q19 up to 256^3 and compares with FluidX3D's published
H200 figures (Lehmann et al. / FluidX3D README): 23,056 MLUPs (FP32/FP32), 36,610
(FP32/FP16S) and 20,291 (FP32/FP16C).

Outputs: ``results.json``, ``mlups.png``, ``REPORT.md``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
from pathlib import Path
from typing import Any

import jax

import lbm_jax
from experiments import _framework
from experiments._report import (
    checks_section,
    markdown_table,
    new_figure,
    progress,
    save_figure,
)

__all__ = [
    "FLUIDX3D_H200_MLUPS",
    "Settings",
    "analyse_rows",
    "evaluate_checks",
    "fluidx3d_rows",
    "run",
    "settings_for",
]

#: FluidX3D's published D3Q19 figures on an NVIDIA H200 (MLUPs).
FLUIDX3D_H200_MLUPS: dict[str, float] = {
    "FP32/FP32": 23056.0,
    "FP32/FP16S": 36610.0,
    "FP32/FP16C": 20291.0,
}


@dataclasses.dataclass(frozen=True)
class Settings:
    """What one scale of the performance sweep measures.

    Attributes:
        grids: ``(lattice, n)`` pairs (cubic/square grids of side ``n``).
        storages: storage policy names (see :func:`lbm_jax.get_storage`).
        updates: cell updates per timed repeat; the number of steps is
            ``max(4, round(updates / cells))``.
        repeats: timed repeats per configuration (the median is reported).
        bandwidth_mib: array size of the bandwidth measurement (MiB per array;
            must exceed the caches for a meaningful roofline).
    """

    grids: tuple[tuple[str, int], ...]
    storages: tuple[str, ...]
    updates: float
    repeats: int
    bandwidth_mib: int

    def steps(self, lattice: str, n: int) -> int:
        """Time steps per timed repeat on an ``n``-cell-per-side grid."""
        return max(4, round(self.updates / n ** int(lattice[1])))


_SETTINGS = {
    "tiny": Settings(
        grids=(("D2Q9", 32), ("D3Q19", 12)),
        storages=("fp32", "fp16s"),
        updates=2e5,
        repeats=5,
        bandwidth_mib=16,
    ),
    "quick": Settings(
        grids=(("D2Q9", 128), ("D2Q9", 512), ("D3Q19", 64)),
        storages=("fp64", "fp32", "fp16s", "fp16c"),
        updates=2e6,
        repeats=5,
        bandwidth_mib=128,
    ),
    "full": Settings(
        grids=(
            ("D2Q9", 2048),
            ("D3Q19", 64),
            ("D3Q19", 128),
            ("D3Q19", 256),
            ("D3Q27", 128),
        ),
        storages=lbm_jax.list_storages(),
        updates=4e9,  # about 0.2 s per repeat at FluidX3D's H200 speed
        repeats=7,
        bandwidth_mib=1024,
    ),
}


def settings_for(scale: str) -> Settings:
    """Return the sweep settings of ``scale`` (``"tiny"``, ``"quick"``, ``"full"``)."""
    if scale not in _SETTINGS:
        raise ValueError(f"scale is {scale!r}; expected one of {tuple(_SETTINGS)}.")
    return _SETTINGS[scale]


def _canonical(storage: str) -> str:
    return lbm_jax.get_storage(storage).name


def _measure(settings: Settings) -> tuple[list[dict[str, Any]], list[float]]:
    mib = settings.bandwidth_mib
    bandwidths = [float(lbm_jax.bench.measure_bandwidth(size_mib=mib))]
    rows = []
    configs = [(lat, n, s) for lat, n in settings.grids for s in settings.storages]
    for lattice, n, storage in progress(configs, desc="lbm_performance"):
        kwargs = {
            "steps": settings.steps(lattice, n),
            "repeats": settings.repeats,
            "bandwidth": bandwidths[0],
        }
        with jax.enable_x64(lbm_jax.get_storage(storage).needs_x64):
            out = lbm_jax.bench.bench(lattice, n, storage, **kwargs)
        rows.append(
            {
                **{k: v for k, v in out.items() if _is_scalar(v)},
                "lattice": lattice,
                "n": n,
                "storage": _canonical(storage),
                "mlups": float(out["mlups"]),
                "bytes_per_cell": float(out["bytes_per_cell"]),
            }
        )
    bandwidths.append(float(lbm_jax.bench.measure_bandwidth(size_mib=mib)))
    return rows, bandwidths


def _is_scalar(value: Any) -> bool:
    return isinstance(value, bool | int | float | str) or value is None


def analyse_rows(rows: list[dict[str, Any]], bandwidth_gbs: float) -> None:
    fp32 = {
        (r["lattice"], r["n"]): r["mlups"] for r in rows if r["storage"] == "FP32/FP32"
    }
    for r in rows:
        roofline = bandwidth_gbs * 1e3 / r["bytes_per_cell"]  # GB/s / B -> MLUPs
        r["roofline_mlups"] = roofline
        r["roofline_fraction"] = r["mlups"] / roofline
        base = fp32.get((r["lattice"], r["n"]))
        r["speedup_vs_fp32"] = r["mlups"] / base if base else None


def evaluate_checks(
    rows: list[dict[str, Any]], bandwidths: list[float]
) -> dict[str, bool]:
    checks = {
        "bandwidth_measured": all(math.isfinite(b) and b > 0 for b in bandwidths),
        "mlups_positive_finite": all(
            math.isfinite(r["mlups"]) and r["mlups"] > 0 for r in rows
        ),
    }
    # 16-bit storage moves half the bytes of FP32 storage, FP64 twice as many.
    expected = {"FP64/FP64": 2.0, "FP32/FP32": 1.0}
    by_grid: dict[tuple[str, int], dict[str, float]] = {}
    for r in rows:
        by_grid.setdefault((r["lattice"], r["n"]), {})[r["storage"]] = r[
            "bytes_per_cell"
        ]
    consistent = True
    for per_storage in by_grid.values():
        ref = per_storage.get("FP32/FP32")
        if ref is None:
            continue
        for name, nbytes in per_storage.items():
            ratio = expected.get(name, 0.5)
            consistent &= math.isclose(nbytes, ratio * ref, rel_tol=1e-9)
    checks["bytes_per_cell_consistent"] = consistent
    # A step cannot beat the bandwidth roofline by much once the grid leaves the caches.
    cells = [_cells(r) for r in rows]
    checks["largest_grid_below_1.5x_roofline"] = all(
        r["roofline_fraction"] < 1.5
        for r, c in zip(rows, cells, strict=True)
        if c == max(cells)
    )
    return checks


def _cells(row: dict[str, Any]) -> int:
    dims = int(row["lattice"][1])  # "D3Q19" -> 3
    return row["n"] ** dims


def _figure(rows: list[dict[str, Any]], out_dir: Path) -> Path:
    grids = list(dict.fromkeys((r["lattice"], r["n"]) for r in rows))
    storages = list(dict.fromkeys(r["storage"] for r in rows))
    fig, axes = new_figure(1, 2, size=(6.4, 4.4))
    ax, ax_frac = axes[0]
    width = 0.8 / len(storages)
    for j, storage in enumerate(storages):
        xs, ys, fr, roof = [], [], [], []
        for i, grid in enumerate(grids):
            match = [r for r in rows if (r["lattice"], r["n"]) == grid]
            match = [r for r in match if r["storage"] == storage]
            if match:
                xs.append(i + (j - (len(storages) - 1) / 2) * width)
                ys.append(match[0]["mlups"])
                fr.append(match[0]["roofline_fraction"])
                roof.append(match[0]["roofline_mlups"])
        ax.bar(xs, ys, width, label=storage)
        ax.hlines(
            roof,
            [x - width / 2 for x in xs],
            [x + width / 2 for x in xs],
            colors="k",
            lw=1.2,
            label="bandwidth roofline" if j == 0 else None,
        )
        ax_frac.bar(xs, fr, width, label=storage)
    labels = [f"{lat}\n{n}^{2 if lat.startswith('D2') else 3}" for lat, n in grids]
    for a in (ax, ax_frac):
        a.set_xticks(range(len(grids)), labels)
        a.grid(axis="y", alpha=0.3)
    ax.set_yscale("log")
    ax.set_ylabel("million lattice updates per second (median)")
    ax.set_title("Lattice updates per second")
    fig.legend(
        *ax.get_legend_handles_labels(),
        loc="outside lower center",
        ncol=min(len(storages) + 1, 5),
        fontsize="small",
        title="black ticks: bandwidth roofline (the limit for this storage)",
        title_fontsize="small",
    )
    ax_frac.axhline(1.0, color="k", lw=0.8, ls="--", label="roofline")
    ax_frac.set_ylabel("fraction of bandwidth roofline")
    ax_frac.set_title("Measured / (bandwidth / bytes per cell)")
    return save_figure(fig, out_dir / "mlups.png")


def fluidx3d_rows(rows: list[dict[str, Any]]) -> list[list[Any]]:
    d3q19 = [r for r in rows if r["lattice"] == "D3Q19"]
    if not d3q19:
        return []
    largest = max(r["n"] for r in d3q19)
    ours = {r["storage"]: r["mlups"] for r in d3q19 if r["n"] == largest}
    return [
        [name, f"{ref:,.0f}", ours.get(name), ours.get(name, math.nan) / ref]
        for name, ref in FLUIDX3D_H200_MLUPS.items()
    ]


def _report(
    out_dir: Path,
    scale: str,
    table: str,
    bandwidth: float,
    checks: dict[str, bool],
    env: dict[str, Any],
    fluidx3d: list[list[Any]],
    load: tuple[float, float],
) -> None:
    lines = [
        "# LBM performance",
        "",
        f"Scale **{scale}** on {env['backend']} ({env['device_kind']}, "
        f"{env['device_count']} device(s)); git `{env['git_commit']}`.",
        "",
        "Each row: the compiled solver (`lbm_jax.bench.bench`) timed after warm-up, "
        "median of the timed repeats, `block_until_ready`. The memory bandwidth was "
        f"measured in the same run (STREAM-like, `lbm_jax.bench.measure_bandwidth`): "
        f"**{bandwidth:.1f} GB/s**. Roofline = bandwidth / bytes per cell; "
        "'vs FP32' is the speed ratio to FP32/FP32 on the same grid.",
        "",
        table,
        "",
        "![MLUPs](mlups.png)",
        "",
        f"Load average (1 min) before / after the sweep: {load[0]:.2f} / "
        f"{load[1]:.2f} on {env['cpu_count']} logical CPUs; a busy machine slows "
        "every row, so compare the ratios, measured side by side in this run.",
        "",
        "Notes: small grids fit in the caches, so their roofline fraction can exceed "
        "1; on a CPU, XLA upcasts 16-bit data and the 1-4-11 FP16C codec is "
        "integer-emulated, so 16-bit storage pays off only once a step is "
        "memory-bound (large grids, GPU).",
        "",
    ]
    if fluidx3d:
        lines += [
            "## Comparison with FluidX3D (published H200 figures, D3Q19)",
            "",
            markdown_table(
                ["storage", "FluidX3D H200 MLUPs", "this run MLUPs", "ratio"],
                fluidx3d,
            ),
            "",
            "Meaningful only when this run used an H200-class GPU with `--full`.",
            "",
        ]
    lines += checks_section(checks)
    (out_dir / "REPORT.md").write_text("\n".join(lines) + "\n")


def run(
    out_dir: Path, *, quick: bool = True, seed: int = 0, scale: str | None = None
) -> dict[str, Any]:
    """Run the sweep; write ``results.json``, ``mlups.png`` and ``REPORT.md``.

    Args:
        out_dir: an existing, empty directory.
        quick: CPU-sized sweep (``True``) or paper-scale sweep for a GPU.
        seed: recorded for provenance (the benchmark is deterministic).
        scale: override the scale (``"tiny"`` for tests); see
            :func:`experiments._framework.resolve_scale`.

    Returns:
        ``{"table", "checks", "rows", "bandwidth_gbs", "scale"}``.
    """
    scale = _framework.resolve_scale(quick, scale)
    settings = settings_for(scale)
    out_dir = Path(out_dir)
    env = _framework.capture_environment(seed=seed, scale=scale)
    load_before = os.getloadavg()[0]
    rows, bandwidths = _measure(settings)
    load = (load_before, os.getloadavg()[0])
    bandwidth = statistics.median(bandwidths)
    analyse_rows(rows, bandwidth)
    checks = evaluate_checks(rows, bandwidths)
    table = markdown_table(
        [
            "lattice",
            "n",
            "storage",
            "MLUPs",
            "B/cell",
            "roofline MLUPs",
            "fraction",
            "vs FP32",
        ],
        [
            [
                r["lattice"],
                r["n"],
                r["storage"],
                r["mlups"],
                r["bytes_per_cell"],
                r["roofline_mlups"],
                r["roofline_fraction"],
                r["speedup_vs_fp32"],
            ]
            for r in rows
        ],
    )
    fluidx3d = fluidx3d_rows(rows) if env["backend"] == "gpu" else []
    _figure(rows, out_dir)
    _framework.write_json(
        out_dir / "results.json",
        {
            "pipeline": "lbm_performance",
            "settings": dataclasses.asdict(settings),
            "bandwidth_gbs": bandwidth,
            "bandwidth_samples_gbs": bandwidths,
            "load_average_before_after": load,
            "rows": rows,
            "fluidx3d_h200_mlups": FLUIDX3D_H200_MLUPS,
            "fluidx3d_comparison": fluidx3d,
            "checks": checks,
            "environment": env,
        },
    )
    _report(out_dir, scale, table, bandwidth, checks, env, fluidx3d, load)
    return {
        "table": table,
        "checks": checks,
        "rows": rows,
        "bandwidth_gbs": bandwidth,
        "scale": scale,
    }
