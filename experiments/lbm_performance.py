"""LBM performance: MLUPs per lattice x storage x grid size, against the roofline.

Every grid is measured by the benchmark command itself, ``python -m lbm_jax bench
--lattice L --n N --storage a,b,... --rounds K`` (one process per grid, so the
pipeline measures exactly what that command reports, with the host split into one
device per core): each storage policy is compiled and warmed up once, then the
policies are timed in ``rounds`` interleaved rounds (median of ``repeats`` timed runs
each, ``block_until_ready``), and the memory bandwidth is measured in the same process
before and after (`lbm_jax.bench.measure_bandwidth`). The memory-bandwidth roofline of
a storage policy is ``bandwidth / bytes_per_cell`` (each cell loads and stores its
``q`` populations once per step); the table reports the fraction of it the solver
reaches and the speed relative to FP32/FP32 on the same grid, the median of the
per-round paired ratios (robust to load drifting on a shared machine).

The speed ratios the project states are checked here (:data:`RATIO_TARGETS`, with a
margin for noise), judged on that paired median: a missed ratio fails the pipeline.

On a GPU, ``--full`` runs D2Q9 4096^2 and D3Q19 256^3 and compares with FluidX3D's
published H200 figures (FluidX3D README; Lehmann et al. 2022): 23,056 MLUPs
(FP32/FP32), 36,610 (FP32/FP16S) and 20,291 (FP32/FP16C); on an H200 the targets of
:mod:`experiments._lbm_gpu_targets` are checked (a miss fails the pipeline).

Strong and weak scaling over device counts (:class:`Scaling`) run the same
command with ``--devices P`` in a process with exactly ``P`` host devices, and
report MLUPs, speedup, efficiency and the halo traffic per step.

Outputs: ``results.json``, ``mlups.png``, ``REPORT.md``.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import lbm_jax
from experiments import _framework, _timing
from experiments._lbm_gpu_targets import gpu_checks, gpu_table
from experiments._lbm_memory import (
    MemorySweep,
    measure_memory,
    memory_checks,
    memory_table,
)
from experiments._lbm_performance_report import cells, figure, write_report
from experiments._lbm_scaling import (
    Scaling,
    analyse_scaling,
    bench_json,
    measure_scaling,
    scaling_checks,
    scaling_table,
    scaling_unresolved,
)
from experiments._outcome import UNRESOLVED
from experiments._report import (
    markdown_table,
    progress,
    run_caption,
)
from experiments._stats import spread_verdict

__all__ = [
    "FLUIDX3D_H200_MLUPS",
    "RATIO_TARGETS",
    "RatioTarget",
    "Scaling",
    "Settings",
    "analyse_rows",
    "evaluate_checks",
    "fluidx3d_rows",
    "run",
    "settings_for",
    "unresolved_targets",
]

#: FluidX3D's published D3Q19 figures on an NVIDIA H200 (MLUPs).
FLUIDX3D_H200_MLUPS: dict[str, float] = {
    "FP32/FP32": 23056.0,
    "FP32/FP16S": 36610.0,
    "FP32/FP16C": 20291.0,
}


@dataclasses.dataclass(frozen=True)
class RatioTarget:
    """A stated speed ratio to FP32/FP32 on one grid, with its noise margin.

    Attributes:
        lattice, n: The grid (``n`` cells per side).
        storage: Storage policy name, as the benchmark reports it.
        low, high: Bounds of the median paired ratio (``high`` may be ``inf``).
        claim: What is stated, in words (the report shows it next to the figure).
    """

    lattice: str
    n: int
    storage: str
    low: float
    high: float
    claim: str

    @property
    def name(self) -> str:
        """The check's name in the report."""
        bound = (
            f">= {self.low:g}"
            if math.isinf(self.high)
            else f"<= {self.high:g}"
            if self.low <= 0
            else f"in [{self.low:g}, {self.high:g}]"
        )
        return f"{self.lattice} {self.n}: {self.storage} / FP32/FP32 {bound}"

    def judge(self, row: dict[str, Any]) -> tuple[bool, str | None]:
        """``(met, unresolved)`` of a result row: the median paired ratio decides,
        a miss whose per-round spread straddles the bound is unresolved (see
        :func:`experiments._stats.spread_verdict`); a missing figure fails."""
        ratio = row.get("speedup_vs_fp32")
        if ratio is None:
            return False, None
        return spread_verdict(row.get("vs_fp32_rounds") or [ratio], self.low, self.high)

    def met(self, row: dict[str, Any]) -> bool:
        """Whether a result row meets the target (a missing figure does not)."""
        return self.judge(row)[0]


#: The speed ratios stated for the CPU sweep (the standard scale; the quick scale
#: checks the first), measured on 2 CPU cores: the bounds leave room for noise
#: around the figures in the README.
RATIO_TARGETS: tuple[RatioTarget, ...] = (
    RatioTarget(
        "D3Q19",
        128,
        "FP32/FP16S",
        1.2,
        math.inf,
        "16-bit FP16S storage is faster than FP32, both on the native step "
        "(measured 1.47x)",
    ),
    RatioTarget(
        "D3Q19",
        128,
        "FP32/FP16C",
        0.9,
        math.inf,
        "FP16C, its codec integer code in the native step, keeps pace with FP32 "
        "(measured 1.17x)",
    ),
    RatioTarget(
        "D3Q19",
        128,
        "FP32/bfloat16",
        0.9,
        math.inf,
        "bfloat16, its codec integer code in the native step, keeps pace with FP32 "
        "(measured 1.19-1.47x)",
    ),
    RatioTarget(
        "D2Q9",
        2048,
        "FP32/FP16S",
        1.5,
        math.inf,
        "in 2-D, 16-bit FP16S storage pays more (measured 1.72-1.82x; the goal is "
        "1.6x)",
    ),
    RatioTarget(
        "D3Q19",
        128,
        "FP64/FP64",
        0.0,
        0.8,
        "FP64, twice the bytes, is clearly slower than FP32",
    ),
)


@dataclasses.dataclass(frozen=True)
class Settings:
    """What one scale of the performance sweep measures.

    Attributes:
        grids: ``(lattice, n)`` pairs (cubic/square grids of side ``n``).
        storages: storage policy names (see :func:`lbm_jax.get_storage`).
        updates: cell updates per timed repeat; the number of steps is
            ``max(4, round(updates / cells))``.
        repeats: timed repeats per configuration and round (the median is the
            round's figure).
        rounds: interleaved rounds over the storage policies of a grid.
        targets: the speed ratios checked at this scale.
        scaling: the strong and weak scaling sweep (``None`` for none).
        memory: the memory-footprint sweep (``None`` for none).
    """

    grids: tuple[tuple[str, int], ...]
    storages: tuple[str, ...]
    updates: float
    repeats: int
    rounds: int
    targets: tuple[RatioTarget, ...] = ()
    scaling: Scaling | None = None
    memory: MemorySweep | None = None

    def steps(self, lattice: str, n: int) -> int:
        """Time steps per timed repeat on an ``n``-cell-per-side grid."""
        return lbm_jax.bench.steps_for(n ** int(lattice[1]), self.updates)


_SETTINGS = {
    "tiny": Settings(
        grids=(("D2Q9", 32), ("D3Q19", 12)),
        storages=("fp32", "fp16s"),
        updates=2e5,
        repeats=3,
        rounds=2,
        scaling=Scaling(n=16, devices=(1, 2), updates=2e5, repeats=2, rounds=1),
        memory=MemorySweep(
            n=32, operations=("init", "velocity"), storages=("fp16s",), whole_run_n=None
        ),
    ),
    # the main job: FP16S against FP32 on D3Q19 128^3 (its stated ratio) with half
    # the updates per repeat, and two operations of the memory sweep. Every
    # process imports JAX, measures the bandwidth twice and compiles each policy
    # (15-20 s on a 2-core CPU), so the other grids and formats, the scaling
    # sweep and the whole-run memory comparison are the standard scale's.
    "quick": Settings(
        grids=(("D3Q19", 128),),
        storages=("fp32", "fp16s"),
        updates=2e6,
        repeats=3,
        rounds=3,
        targets=tuple(
            t
            for t in RATIO_TARGETS
            if (t.lattice, t.storage) == ("D3Q19", "FP32/FP16S")
        ),
        memory=MemorySweep(
            n=64,
            operations=("init", "velocity"),
            storages=("fp16s",),
            whole_run_n=None,
        ),
    ),
    "standard": Settings(
        grids=(("D2Q9", 2048), ("D3Q19", 128)),
        storages=("fp64", "fp32", "fp16s", "fp16c", "bf16"),
        updates=4e6,
        repeats=3,
        rounds=3,
        targets=RATIO_TARGETS,
        scaling=Scaling(
            n=128, devices=(1, 2), updates=4e6, repeats=3, rounds=2, min_speedup=1.0
        ),
        memory=MemorySweep(
            n=96,
            operations=("simulation", "init", "advance", "velocity", "save_state"),
            storages=("fp16s",),
        ),
    ),
    # GPU-sized: the grids of FluidX3D's H200 figures (see
    # experiments._lbm_gpu_targets), every 16-bit format of the targets
    "full": Settings(
        grids=(("D2Q9", 4096), ("D3Q19", 256)),
        storages=("fp32", "fp16s", "fp16c", "bf16", "posit16"),
        updates=4e9,  # about 0.2 s per repeat at FluidX3D's H200 speed
        repeats=5,
        rounds=3,
    ),
}


def settings_for(scale: str) -> Settings:
    """Return the sweep settings of ``scale`` (one of ``_framework.SCALES``)."""
    return _framework.settings_for(_SETTINGS, scale)


def bench_command(settings: Settings, lattice: str, n: int, json_path: Path) -> list:
    """The ``python -m lbm_jax bench`` command line that measures one grid."""
    return [
        sys.executable,
        "-m",
        "lbm_jax",
        "bench",
        "--lattice",
        lattice,
        "--n",
        str(n),
        "--storage",
        ",".join(settings.storages),
        "--steps",
        str(settings.steps(lattice, n)),
        "--repeats",
        str(settings.repeats),
        "--rounds",
        str(settings.rounds),
        "--json",
        str(json_path),
    ]


def _measure(settings: Settings) -> tuple[list[dict[str, Any]], list[float]]:
    rows, bandwidths = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for lattice, n in progress(settings.grids, desc="lbm_performance"):
            path = Path(tmp) / f"{lattice}_{n}.json"
            cmd = bench_command(settings, lattice, n, path)
            report = bench_json(cmd, path)
            bandwidths += [report["bandwidth_before"], report["bandwidth_after"]]
            for out in report["results"]:
                rows.append(
                    {
                        **{k: v for k, v in out.items() if _is_scalar(v)},
                        "mlups_rounds": out["mlups_rounds"],
                        "vs_fp32_rounds": out.get("vs_fp32_rounds"),
                        "mlups": float(out["mlups"]),
                        "bytes_per_cell": float(out["bytes_per_cell"]),
                    }
                )
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
        paired = r.get("vs_fp32_rounds")
        if paired:  # the median of the per-round paired ratios
            r["speedup_vs_fp32"] = statistics.median(paired)
        else:
            r["speedup_vs_fp32"] = r["mlups"] / base if base else None


#: Population bytes (FP32 storage, two buffers) above which a grid is far larger
#: than any CPU cache, so that a step cannot beat the bandwidth roofline.
OUT_OF_CACHE_BYTES = 256 * 2**20


def stored_bytes_per_cell(lattice: str, storage: str) -> float:
    """Population bytes per cell of a real state (a 4-cell-per-side grid)."""
    import jax

    d = lbm_jax.get_lattice(lattice).d
    with jax.enable_x64(lbm_jax.get_storage(storage).needs_x64):
        sim = lbm_jax.Simulation(lattice, (4,) * d, tau=1.0, storage=storage)
        state = sim.init()
        return state.f.nbytes / state.num_cells


def evaluate_checks(
    rows: list[dict[str, Any]],
    bandwidths: list[float],
    targets: tuple[RatioTarget, ...] = (),
) -> dict[str, bool]:
    checks = {
        "bandwidth_measured": all(math.isfinite(b) and b > 0 for b in bandwidths),
        "mlups_positive_finite": all(
            math.isfinite(r["mlups"]) and r["mlups"] > 0 for r in rows
        ),
    }
    # A step loads and stores every population once: twice the bytes per cell
    # that a state of the same lattice and storage holds.
    checks["bytes_per_cell_consistent"] = all(
        r["bytes_per_cell"] == 2 * stored_bytes_per_cell(r["lattice"], r["storage"])
        for r in rows
    )
    # A step cannot beat the bandwidth roofline once its grid is far out of cache.
    large = [r for r in rows if cells(r) * r["bytes_per_cell"] >= OUT_OF_CACHE_BYTES]
    if large:
        checks["out-of-cache grids below the bandwidth roofline"] = all(
            r["roofline_fraction"] <= 1.0 for r in large
        )
    for t in targets:
        checks[t.name] = t.met(_target_row(rows, t))
    return checks


def unresolved_targets(
    rows: list[dict[str, Any]], targets: tuple[RatioTarget, ...]
) -> dict[str, str]:
    """The failed targets whose per-round spread straddles the bound: name ->
    the spread (the measurement cannot decide them)."""
    judged = {t.name: t.judge(_target_row(rows, t)) for t in targets}
    return {name: spread for name, (_, spread) in judged.items() if spread}


def _target_row(rows: list[dict[str, Any]], t: RatioTarget) -> dict[str, Any]:
    """The row a target is judged on (empty when the run is missing)."""
    key = (t.lattice, t.n, t.storage)
    match = [r for r in rows if (r["lattice"], r["n"], r["storage"]) == key]
    return match[0] if match else {}


def target_table(rows: list[dict[str, Any]], targets: tuple[RatioTarget, ...]) -> str:
    """Markdown table of the stated ratios: bound, median paired ratio, rounds."""
    if not targets:
        return ""
    body = []
    for t in targets:
        row = _target_row(rows, t)
        ratio = row.get("speedup_vs_fp32")
        met, spread = t.judge(row)
        body.append(
            [
                t.claim,
                t.name,
                "missing" if ratio is None else ratio,
                ", ".join(f"{x:.2f}" for x in row.get("vs_fp32_rounds") or []) or "-",
                "pass" if met else UNRESOLVED if spread else "FAIL",
            ]
        )
    return markdown_table(
        ["claim", "bound", "median paired ratio", "per-round ratios", "check"], body
    )


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


def _rows_table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of the measured rows: speed, bytes, roofline, ratio."""
    return markdown_table(
        [
            "lattice",
            "n",
            "storage",
            "devices",
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
                r["devices"],
                r["mlups"],
                r["bytes_per_cell"],
                r["roofline_mlups"],
                r["roofline_fraction"],
                r["speedup_vs_fp32"],
            ]
            for r in rows
        ],
    )


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
    since = _timing.cpu_sample()
    rows, bandwidths = _measure(settings)
    scaling_rows = [] if settings.scaling is None else measure_scaling(settings.scaling)
    memory = None if settings.memory is None else measure_memory(settings.memory)
    other_cores = _timing.load_besides(since)
    bandwidth = statistics.median(bandwidths)
    analyse_rows(rows, bandwidth)
    checks = evaluate_checks(rows, bandwidths, settings.targets)
    unresolved = unresolved_targets(rows, settings.targets)
    scaling = ""
    if settings.scaling is not None:
        analyse_scaling(scaling_rows)
        checks |= scaling_checks(scaling_rows, settings.scaling)
        unresolved |= scaling_unresolved(scaling_rows, settings.scaling)
        scaling = scaling_table(scaling_rows)
    unresolved = _timing.with_load_reason(unresolved, since)
    memory_text = ""
    if memory is not None:
        checks |= memory_checks(memory, settings.memory)
        memory_text = memory_table(memory)
    targets = target_table(rows, settings.targets)
    if scale == "full":  # the GPU targets (FluidX3D's H200 figures)
        checks |= gpu_checks(rows, env["device_kind"])
        targets = "\n\n".join(
            t for t in (targets, gpu_table(rows, env["device_kind"])) if t
        )
    table = _rows_table(rows)
    fluidx3d = fluidx3d_rows(rows) if env["backend"] == "gpu" else []
    figure(rows, out_dir, caption=run_caption(env))
    _framework.write_json(
        out_dir / "results.json",
        {
            "pipeline": "lbm_performance",
            "settings": dataclasses.asdict(settings),
            "bandwidth_gbs": bandwidth,
            "bandwidth_samples_gbs": bandwidths,
            "cores_busy_besides_run": other_cores,
            "rows": rows,
            "scaling_rows": scaling_rows,
            "memory": memory,
            "fluidx3d_h200_mlups": FLUIDX3D_H200_MLUPS,
            "fluidx3d_comparison": fluidx3d,
            "ratio_targets": [dataclasses.asdict(t) for t in settings.targets],
            "checks": checks,
            "unresolved": unresolved,
            "environment": env,
        },
    )
    write_report(
        out_dir,
        scale,
        table,
        bandwidth,
        checks,
        env,
        fluidx3d,
        other_cores,
        targets,
        scaling,
        memory_text,
        unresolved=unresolved,
        devices=sorted({r["devices"] for r in rows + scaling_rows}),
    )
    return {
        "table": table,
        "checks": checks,
        "unresolved": unresolved,
        "rows": rows,
        "bandwidth_gbs": bandwidth,
        "scale": scale,
    }
