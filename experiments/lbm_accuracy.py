"""LBM accuracy of 16-bit population storage (after Lehmann et al., PRE 106, 2022).

Every case runs through :func:`lbm_jax.cases.run_case` once per storage policy:
FP64/FP64 and FP32/FP32 (DDF-shifted, the solver's default) and each 16-bit format
(FP16, FP16S, FP16C, posit16, posit16_es2, posit16s, bfloat16) both without and with
DDF-shifting. Each run is compared with the analytic or published reference (the
case's own metric) and with the reference run of the same case: FP64/FP64, or
FP32/FP32 where the case has no FP64 run. The comparison is the relative L2 norm of
the velocity difference, except for the cylinders: their vortex shedding drifts in
phase between number formats, so two equally accurate runs end at different
phases of the street and the field difference measures that phase shift. The
cylinders are compared by phase-insensitive statistics instead
(:data:`SHEDDING_METRICS`: Strouhal number, drag and lift coefficients), as relative
differences to the reference run.

Studies and their figures:

* Poiseuille channel: error against the analytic profile for every policy, and error
  versus channel width for a few policies (``poiseuille_width.png``);
* Taylor-Green vortex: velocity error and error of the viscous decay rate;
* lid-driven cavity against Ghia et al. (1982): centre-line profiles
  with their difference to FP64 (``cavity_centrelines.png``), Re 100 at the CPU
  scales, Re 100/400/1000 in full mode;
* Karman vortex street (confined cylinder, Schaefer & Turek 2D-2): lift signal,
  Strouhal number, maximum drag and lift coefficients; the unconfined cylinder at
  Re 100 (Strouhal number, mean drag, lift amplitude); the final vorticity of every
  run with the cylinder drawn (``<case>_vorticity.png``).

Scale ``quick`` (the main job) runs FP64, FP32, FP16 unshifted and FP16S for
Poiseuille and Taylor-Green on small grids, FP32 over two channel widths, and the
cavity at Re 100 for FP32/FP16S, without the cylinders. Scale
``standard`` runs every policy for Poiseuille and Taylor-Green on the same grids, the
cavity for FP64/FP32/FP16/FP16S/FP16C, and the cylinder for FP32/FP16S/FP16C, the
unconfined cylinder for FP32/FP16S;
``full`` runs paper-like sizes and every policy everywhere except the unconfined
cylinder (FP64, FP32, FP16 unshifted, FP16S, FP16C). ``tiny`` (tests) runs no
cylinder.
An unstable run (``lbm_jax.InstabilityError``) is a result, recorded as unstable.

Outputs: ``results.json``, ``errors.png``, ``poiseuille_width.png``,
``taylor_green_decay.png``, ``cavity_centrelines.png``, ``cylinder.png``,
``cylinder_unconfined.png``, ``cylinder_vorticity.png``,
``cylinder_unconfined_vorticity.png``, ``REPORT.md`` and per-run files under
``runs/``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from experiments import _framework
from experiments._accuracy_checks import SHEDDING_TOLERANCE, evaluate_checks
from experiments._accuracy_report import (
    SHEDDING_NOTE,
    findings,
    shedding_table,
    strip_fields,
    study_figures,
    study_tables,
    write_report,
)
from experiments._accuracy_runs import (
    RUNS_ALL,
    SHEDDING_METRICS,
    SIXTEEN_BIT,
    Settings,
    compare_runs,
    run_one,
    run_studies,
    settings_for,
    storage_label,
    sweep,
)
from experiments._report import run_caption

__all__ = [
    "RUNS_ALL",
    "SHEDDING_METRICS",
    "SHEDDING_NOTE",
    "SHEDDING_TOLERANCE",
    "SIXTEEN_BIT",
    "Settings",
    "compare_runs",
    "evaluate_checks",
    "run",
    "run_one",
    "settings_for",
    "shedding_table",
    "storage_label",
    "sweep",
]


def run(
    out_dir: Path,
    *,
    quick: bool = True,
    seed: int = 0,
    scale: str | None = None,
    work_dir: Path | None = None,
) -> dict[str, Any]:
    """Run the accuracy study; write JSON, figures and ``REPORT.md`` to ``out_dir``.

    Args:
        out_dir: an existing, empty directory.
        quick: CPU-sized study (``True``) or paper-like sizes (for a GPU).
        seed: recorded for provenance (every case starts from a deterministic state).
        scale: override the scale (``"tiny"`` for tests); see
            :func:`experiments._framework.resolve_scale`.
        work_dir: where finished simulations are kept while the study runs (the
            framework passes one that survives an interruption, so a re-run reuses
            them); ``None`` keeps nothing.

    Returns:
        ``{"table", "checks", "scale", "records"}`` where ``records`` maps each study
        to its run records (summaries and errors, no field arrays).
    """
    scale = _framework.resolve_scale(quick, scale)
    st = settings_for(scale)
    out_dir = Path(out_dir)
    env = _framework.capture_environment(seed=seed, scale=scale)
    studies = run_studies(st, out_dir / "runs", work_dir)
    checks = evaluate_checks(
        studies["poiseuille"],
        studies["taylor_green"],
        studies["cavity"],
        studies["cylinder"],
        st,
        unconfined=studies["cylinder_unconfined"],
    )
    tables = study_tables(studies)
    table = "\n\n".join(f"**{name}**\n\n{t}" for name, t in tables.items())
    figures = study_figures(studies, out_dir, caption=run_caption(env))
    records = {name: strip_fields(study) for name, study in studies.items()}
    _framework.write_json(
        out_dir / "results.json",
        {
            "pipeline": "lbm_accuracy",
            "settings": dataclasses.asdict(st),
            "records": records,
            "checks": checks,
            "environment": env,
        },
    )
    write_report(out_dir, scale, st, tables, figures, checks, env, findings(studies))
    return {"table": table, "checks": checks, "scale": scale, "records": records}
