"""The ``lbm_performance`` pipeline's figure and ``REPORT.md``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from experiments._report import (
    checks_section,
    markdown_table,
    new_figure,
    save_figure,
)

__all__ = ["cells", "figure", "write_report"]


def cells(row: dict[str, Any]) -> int:
    dims = int(row["lattice"][1])  # "D3Q19" -> 3
    return row["n"] ** dims


def figure(rows: list[dict[str, Any]], out_dir: Path) -> Path:
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


def write_report(
    out_dir: Path,
    scale: str,
    table: str,
    bandwidth: float,
    checks: dict[str, bool],
    env: dict[str, Any],
    fluidx3d: list[list[Any]],
    load: tuple[float, float],
    targets: str,
    scaling: str = "",
    memory: str = "",
    *,
    unresolved: dict[str, str] | None = None,
    devices: list[int] | None = None,
) -> None:
    counts = "/".join(map(str, devices or [env["device_count"]]))
    lines = [
        "# LBM performance",
        "",
        f"Scale **{scale}** on {env['backend']} ({env['device_kind']}); the timed "
        f"runs used {counts} device(s) each (the devices column); git "
        f"`{env['git_commit']}`.",
        "",
        "Each grid was measured by `python -m lbm_jax bench` in its own process "
        "(one host device per core), timing a flow (Taylor-Green vortices, "
        "U0 = 0.05): every storage policy compiled and warmed up once, then timed "
        "in interleaved rounds (median of the timed repeats, `block_until_ready`); "
        "each row is the median round. The memory bandwidth was measured in the "
        "same processes (STREAM-like, `lbm_jax.bench.measure_bandwidth`): "
        f"**{bandwidth:.1f} GB/s** (median). Roofline = bandwidth / bytes per "
        "cell; 'vs FP32' is the median of the per-round ratios to FP32/FP32 on the "
        "same grid, timed side by side.",
        "",
        table,
        "",
        *(["## Stated speed ratios", "", targets, ""] if targets else []),
        *_scaling_section(scaling),
        *_memory_section(memory),
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
    lines += checks_section(checks, unresolved)
    (out_dir / "REPORT.md").write_text("\n".join(lines) + "\n")


def _scaling_section(scaling: str) -> list[str]:
    """The report's section on scaling over devices (none without a table)."""
    if not scaling:
        return []
    return [
        "## Scaling over devices (D3Q19, box split along x, XLA step)",
        "",
        "Each run is `python -m lbm_jax bench --devices P` in its own "
        "process with exactly P host devices "
        "(`XLA_FLAGS=--xla_force_host_platform_device_count=P`). Strong: "
        "the same box on every count; weak: about the same cells per "
        "device (the box side rounded to a multiple of P). Efficiency = "
        "MLUPs_P / (P MLUPs_1); halo = ghost layers sent per step (whole "
        "x-faces of q values in the storage format, both directions, all "
        "devices); halo share = halo bytes / population bytes of a step. "
        "On a CPU the devices share the cores and the memory bus.",
        "",
        scaling,
        "",
    ]


def _memory_section(memory: str) -> list[str]:
    """The report's section on the memory footprint (none without a table)."""
    if not memory:
        return []
    return [
        "## Memory footprint (D3Q19, host memory, GB = 1e9 B)",
        "",
        "Each operation runs in its own process (`python -m "
        "lbm_jax.bench_memory`); bound = the interpreter's baseline + the "
        "state + the output + the scheme's scratch (a second population "
        "buffer for two-buffer streaming); `cold` includes compilation.",
        "",
        memory,
        "",
    ]
