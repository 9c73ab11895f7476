"""The GPU targets of the performance sweep (``lbm_performance --full``).

The fused GPU step (:mod:`lbm_jax.step._gpu`) is measured against FluidX3D's published
figures for an NVIDIA H200 SXM5 (FluidX3D README, "Single-GPU/CPU Benchmarks";
Lehmann et al., Phys. Rev. E 106, 015308 (2022) for the method): 23,056 MLUPs
with FP32/FP32 storage, 36,610 with FP32/FP16S and 20,291 with FP32/FP16C, D3Q19
at 256^3. The targets below hold on that device only; on another GPU they are
reported without a verdict, since its bandwidth sets other figures.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from experiments._report import markdown_table

__all__ = ["GPU_TARGETS", "GpuTarget", "TARGET_DEVICE", "gpu_checks", "gpu_table"]

#: The device the targets are stated for (matched in ``device_kind``).
TARGET_DEVICE = "H200"


@dataclasses.dataclass(frozen=True)
class GpuTarget:
    """A lower bound on one figure of the GPU sweep.

    Attributes:
        lattice, n, storage: The run the figure comes from.
        quantity: ``"mlups"``, ``"vs_fp32"`` (speed relative to FP32/FP32 on the
            same grid), ``"vs_fp16s"`` (relative to FP32/FP16S) or
            ``"roofline_fraction"`` (of the bandwidth measured in the same run).
        low: The bound the figure must reach.
        claim: What is stated, in words.
    """

    lattice: str
    n: int
    storage: str
    quantity: str
    low: float
    claim: str

    @property
    def name(self) -> str:
        """The check's name in the report."""
        return (
            f"{self.lattice} {self.n}: {self.storage} {self.quantity} >= {self.low:g}"
        )

    def value(self, rows: list[dict[str, Any]]) -> float | None:
        """The measured figure (``None`` when a run is missing)."""
        row = _row(rows, self.lattice, self.n, self.storage)
        if row is None:
            return None
        if self.quantity in ("mlups", "roofline_fraction"):
            return float(row[self.quantity])
        ref_name = {"vs_fp32": "FP32/FP32", "vs_fp16s": "FP32/FP16S"}[self.quantity]
        ref = _row(rows, self.lattice, self.n, ref_name)
        return None if ref is None else float(row["mlups"]) / float(ref["mlups"])


def _row(rows, lattice, n, storage) -> dict[str, Any] | None:
    match = [
        r for r in rows if (r["lattice"], r["n"], r["storage"]) == (lattice, n, storage)
    ]
    return match[0] if match else None


GPU_TARGETS: tuple[GpuTarget, ...] = (
    GpuTarget(
        "D3Q19", 256, "FP32/FP32", "mlups", 23000.0, "FP32 at least FluidX3D's 23,056"
    ),
    GpuTarget(
        "D3Q19", 256, "FP32/FP16S", "mlups", 36000.0, "FP16S at least FluidX3D's 36,610"
    ),
    GpuTarget(
        "D3Q19", 256, "FP32/FP16C", "mlups", 20300.0, "FP16C at least FluidX3D's 20,291"
    ),
    GpuTarget(
        "D3Q19",
        256,
        "FP32/FP16S",
        "vs_fp32",
        1.5,
        "16-bit storage pays: FP16S 1.5x FP32",
    ),
    GpuTarget(
        "D3Q19", 256, "FP32/bfloat16", "vs_fp16s", 0.95, "bfloat16 as fast as FP16S"
    ),
    GpuTarget(
        "D3Q19",
        256,
        "FP32/posit16",
        "vs_fp16s",
        0.6,
        "posit16, decoded in software, at least 0.6x FP16S",
    ),
    GpuTarget(
        "D2Q9",
        4096,
        "FP32/FP32",
        "roofline_fraction",
        0.8,
        "D2Q9 FP32 within 80 % of the measured bandwidth roofline",
    ),
)


def gpu_checks(rows: list[dict[str, Any]], device_kind: str) -> dict[str, bool]:
    """Pass/fail per target on the target device (empty elsewhere)."""
    if TARGET_DEVICE not in device_kind:
        return {}
    checks = {}
    for t in GPU_TARGETS:
        value = t.value(rows)
        checks[t.name] = value is not None and math.isfinite(value) and value >= t.low
    return checks


def gpu_table(rows: list[dict[str, Any]], device_kind: str) -> str:
    """Markdown table of the GPU targets: claim, bound, measured figure, verdict."""
    judged = TARGET_DEVICE in device_kind
    body = []
    for t in GPU_TARGETS:
        value = t.value(rows)
        verdict = (
            "missing"
            if value is None
            else ("pass" if value >= t.low else "FAIL")
            if judged
            else f"not judged ({device_kind})"
        )
        body.append([t.claim, t.name, "missing" if value is None else value, verdict])
    return markdown_table(["claim", "bound", "measured", "check"], body)
