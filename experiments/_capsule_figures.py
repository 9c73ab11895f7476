"""The capsule study's figure (the Taylor deformation per storage format) and its
reference run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from experiments._report import new_figure, save_figure

__all__ = ["deformation_figure", "reference_run"]


def reference_run(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The run the others are compared with: FP64/FP64, else FP32/FP32, else None."""
    for storage in ("FP64/FP64", "FP32/FP32"):
        found = next((r for r in records if r["storage"] == storage), None)
        if found is not None:
            return found
    return None


def deformation_figure(
    studies: dict[float, list[dict[str, Any]]],
    out: Path,
    *,
    title: str,
    caption: str = "",
) -> Path:
    """D(t) per storage at each capillary number, and its deviation from the
    reference run (FP64, else FP32), written to ``out/deformation.png``."""
    fig, axes = new_figure(2, len(studies), size=(6.0, 4.0))
    fig.suptitle(title)
    runs = max(len(records) for records in studies.values())
    colours = [f"C{i}" for i in range(runs)]
    for col, (ca, records) in enumerate(studies.items()):
        top, bottom = axes[0, col], axes[1, col]
        ref = reference_run(records)
        for i, r in enumerate(records):
            if not r["stable"] or "history" not in r:
                continue
            h = r["history"]
            top.plot(h["t"], h["D"], color=colours[i], label=r["label"])
            if ref is not None and r is not ref:
                diff = np.abs(h["D"] - ref["history"]["D"])
                bottom.semilogy(
                    h["t"], np.maximum(diff, 1e-12), color=colours[i], label=r["label"]
                )
        theory = records[0]["summary"].get("deformation_theory")
        if theory is not None:
            top.axhline(theory, color="black", linestyle=":", label="theory, D_inf")
        top.set_title(f"Taylor deformation, Ca = {ca:g}")
        top.set_xlabel("time step")
        top.set_ylabel("D = (L - B)/(L + B)")
        top.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
        name = "the reference" if ref is None else ref["storage"]
        bottom.set_title(f"deviation from {name}, Ca = {ca:g}")
        bottom.set_xlabel("time step")
        bottom.set_ylabel("|D - D(reference)| (floored at 1e-12)")
        if bottom.get_legend_handles_labels()[0]:
            bottom.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return save_figure(fig, out / "deformation.png", caption=caption)
