"""The ``lbm_performance`` pipeline's figure and ``REPORT.md``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from experiments._report import (
    checks_section,
    fmt,
    markdown_table,
    new_figure,
    save_figure,
)

__all__ = ["cells", "figure", "write_report"]


def cells(row: dict[str, Any]) -> int:
    dims = int(row["lattice"][1])  # "D3Q19" -> 3
    return row["n"] ** dims


def figure(rows: list[dict[str, Any]], out_dir: Path, *, caption: str = "") -> Path:
    """Bar charts of the measured MLUPs, one panel per grid on a linear axis from
    zero, with each storage's bandwidth roofline, and the fraction of the roofline
    reached; storages keep one colour and the legend's order everywhere."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    grids = list(dict.fromkeys((r["lattice"], r["n"]) for r in rows))
    storages = list(dict.fromkeys(r["storage"] for r in rows))
    colour = {s: f"C{j}" for j, s in enumerate(storages)}
    fig, axes = new_figure(1, len(grids) + 1, size=(3.6, 4.2))
    for i, grid in enumerate(grids):
        ax = axes[0, i]
        match = {r["storage"]: r for r in rows if (r["lattice"], r["n"]) == grid}
        shown = [s for s in storages if s in match]
        xs = range(len(shown))
        ax.bar(
            xs,
            [match[s]["mlups"] for s in shown],
            0.7,
            color=[colour[s] for s in shown],
        )
        ax.hlines(
            [match[s]["roofline_mlups"] for s in shown],
            [x - 0.35 for x in xs],
            [x + 0.35 for x in xs],
            colors="k",
            lw=1.5,
        )
        ax.set_xticks(list(xs), shown, rotation=45, ha="right", fontsize="x-small")
        ax.set_ylim(bottom=0)
        ax.grid(axis="y", alpha=0.3)
        lattice, n = grid
        ax.set_title(f"{lattice}, {_grid_text(lattice, n)} cells", fontsize="small")
        ax.set_ylabel("million lattice updates per second (median)")
    ax_frac = axes[0, -1]
    width = 0.8 / len(storages)
    for j, storage in enumerate(storages):
        xs, fr = [], []
        for i, grid in enumerate(grids):
            match = [
                r
                for r in rows
                if (r["lattice"], r["n"]) == grid and r["storage"] == storage
            ]
            if match:
                xs.append(i + (j - (len(storages) - 1) / 2) * width)
                fr.append(match[0]["roofline_fraction"])
        ax_frac.bar(xs, fr, width, color=colour[storage])
    ax_frac.set_xticks(
        range(len(grids)), [f"{lat}\n{_grid_text(lat, n)}" for lat, n in grids]
    )
    ax_frac.set_ylim(bottom=0)
    ax_frac.grid(axis="y", alpha=0.3)
    ax_frac.axhline(1.0, color="k", lw=0.8, ls="--")
    ax_frac.set_ylabel("fraction of bandwidth roofline")
    ax_frac.set_title("measured / (bandwidth / bytes per cell)", fontsize="small")
    handles = [Patch(color=colour[s], label=s) for s in storages]
    handles.append(Line2D([], [], color="k", lw=1.5, label="bandwidth roofline"))
    fig.legend(
        handles=handles,
        loc="outside lower center",
        ncol=min(len(handles), 6),
        fontsize="small",
    )
    fig.suptitle("Lattice updates per second per storage")
    return save_figure(fig, out_dir / "mlups.png", caption=caption)


def _grid_text(lattice: str, n: int) -> str:
    """``2048^2`` or ``128^3``."""
    return f"{n}^{lattice[1]}"


def write_report(
    out_dir: Path,
    scale: str,
    table: str,
    bandwidth: float,
    checks: dict[str, bool],
    env: dict[str, Any],
    fluidx3d: list[list[Any]],
    other_cores: float | None,
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
        f"Cores kept busy by other processes during the sweep: "
        f"{fmt(other_cores, '.2f')} of {env['cpu_count']} (from /proc/stat); a busy "
        "machine slows every row, so compare the ratios, measured side by side in "
        "this run.",
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
