"""Memory footprint of the LBM operations, part of the ``lbm_performance`` pipeline.

Every public operation runs in its own fresh process (:mod:`lbm_jax.bench_memory`),
and its peak host memory is held against what it must hold: the interpreter's
baseline, the population buffer(s), its output and its scheme's scratch. The
pipeline checks that no operation exceeds its bound by more than 10 %, and that a
whole run (``init`` + ``run``) with FP32/FP16S storage peaks at most at
:data:`WHOLE_RUN_RATIO` times the FP32/FP32 peak on a ``whole_run_n^3`` box (at
smaller boxes the interpreter's baseline, about 0.26 GB, dominates both).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from lbm_jax import bench_memory

__all__ = [
    "WHOLE_RUN_RATIO",
    "MemorySweep",
    "measure_memory",
    "memory_checks",
    "memory_table",
]

#: Stated largest ratio of the FP32/FP16S whole-run peak to the FP32/FP32 one.
WHOLE_RUN_RATIO = 0.6


@dataclasses.dataclass(frozen=True)
class MemorySweep:
    """What the memory part of the pipeline measures (D3Q19).

    Attributes:
        n: Box side of the per-operation sweep.
        operations: Names from :data:`lbm_jax.bench_memory.OPERATIONS`.
        storages: Storage policies of the sweep.
        whole_run_n: Box side of the FP32/FP32 vs FP32/FP16S whole-run
            comparison (``None``: not measured).
    """

    n: int
    operations: tuple[str, ...] = bench_memory.OPERATIONS
    storages: tuple[str, ...] = ("fp32", "fp16s")
    whole_run_n: int | None = 256


def measure_memory(sweep: MemorySweep) -> dict[str, list[dict[str, Any]]]:
    """``{"rows": per-operation rows, "whole_run": two-buffer run rows}``."""
    rows = bench_memory.measure(sweep.n, sweep.storages, sweep.operations)
    whole = []
    if sweep.whole_run_n is not None:
        whole = bench_memory.measure(
            sweep.whole_run_n, ("fp32", "fp16s"), ("run",), streaming=("two-buffer",)
        )
    return {"rows": rows, "whole_run": whole}


def whole_run_ratio(whole: list[dict[str, Any]]) -> float | None:
    """FP32/FP16S whole-run peak over FP32/FP32's (``None`` when one is missing)."""
    peaks = {r["storage"]: r.get("peak") for r in whole if "error" not in r}
    if not peaks.get("fp32") or not peaks.get("fp16s"):
        return None
    return peaks["fp16s"] / peaks["fp32"]


def memory_checks(result: dict[str, list[dict[str, Any]]], sweep: MemorySweep):
    """Checks of the memory sweep (a missing or failed measurement fails)."""
    rows = result["rows"]
    wanted = {(op, s) for op in sweep.operations for s in sweep.storages}
    have = {(r["operation"], r["storage"]) for r in rows}
    name = (
        f"memory: every operation peaks within {bench_memory.TOLERANCE:.0%} of its "
        f"bound (D3Q19 {sweep.n}^3)"
    )
    checks = {name: wanted <= have and not bench_memory.check(rows)}
    if sweep.whole_run_n is not None:
        ratio = whole_run_ratio(result["whole_run"])
        name = (
            f"memory: whole run with FP32/FP16S <= {WHOLE_RUN_RATIO} x FP32/FP32 "
            f"(D3Q19 {sweep.whole_run_n}^3, two buffers)"
        )
        checks[name] = ratio is not None and ratio <= WHOLE_RUN_RATIO
    return checks


def memory_table(result: dict[str, list[dict[str, Any]]]) -> str:
    """The report's text: the per-operation table and the whole-run ratio."""
    lines = ["```", bench_memory.table(result["rows"]), "```"]
    ratio = whole_run_ratio(result["whole_run"])
    if result["whole_run"]:
        lines += ["", "Whole run (`init` + `run`, two buffers):", ""]
        lines += ["```", bench_memory.table(result["whole_run"]), "```"]
        shown = "missing" if ratio is None else f"{ratio:.2f}"
        lines += ["", f"FP32/FP16S peak / FP32/FP32 peak: {shown}."]
    return "\n".join(lines)
