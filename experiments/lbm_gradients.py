"""Accuracy of derivatives through 16-bit population storage (the accuracy study of
Lehmann et al., PRE 106, 2022, extended to ``dL/dtheta``).

The solver is differentiable: :meth:`lbm_jax.Simulation.advance` runs reverse mode
with its checkpoints kept in the storage format, and the storage rounding has the
straight-through derivative, so a gradient through 16-bit storage is the float32
adjoint along the trajectory actually stored. This study asks how far such a
gradient lies from float64's, on three of the accuracy study's cases
(:mod:`experiments._gradient_runs` defines them):

* Taylor-Green vortices (D2Q9, periodic): ``L`` = kinetic energy after the run,
  ``theta`` = the initial amplitude;
* the Poiseuille channel (walls on two sides, a body force): ``L`` = the flux (mean
  x-velocity), ``theta`` = the driving force;
* the lid-driven cavity: ``L`` = the circulation of the primary vortex, ``theta`` =
  the lid speed.

For each storage the measure is the relative error of ``dL/dtheta`` against the
FP64/FP64 adjoint, which is itself checked against float64 central differences
(relative agreement :data:`FD_TOLERANCE`). Targets on Taylor-Green
(:data:`TARGETS`): FP32 within 1e-4, FP16S and FP16C within 1 %, bfloat16 within
10 % (DDF-shifted). A planned run that is missing or not finite fails its check.

Scales: ``tiny`` (tests), ``quick`` (the main job, a 32^2 grid and 500 steps: the
four target storages on Taylor-Green only; each storage and problem compiles one
gradient program, 5 to 10 CPU seconds on a 2-core CPU, which dominates the
time), ``standard`` (1000 steps: on Taylor-Green every 16-bit format shifted and
FP16 and bfloat16 unshifted too; on the other two FP32, FP16 unshifted,
FP16S, FP16C and bfloat16), ``full`` (64^2 grids, 4000 steps, every storage with and
without shifting on every problem). Outputs: ``results.json``,
``gradient_errors.png`` and ``REPORT.md``.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from experiments import _framework
from experiments._accuracy_runs import RUNS_ALL, storage_label
from experiments._gradient_report import (
    error_table,
    findings,
    gradient_figure,
    reference_table,
    write_report,
)
from experiments._gradient_runs import PROBLEMS, problem_sweep
from experiments._lbm_figures import CASE_NAMES
from experiments._report import run_caption

__all__ = [
    "FD_TOLERANCE",
    "TARGETS",
    "Problem",
    "Settings",
    "evaluate_checks",
    "run",
    "settings_for",
]

#: Largest relative error of ``dL/dtheta`` against FP64/FP64 on Taylor-Green, per
#: (storage, shift).
TARGETS: dict[tuple[str, bool], float] = {
    ("fp32", True): 1e-4,
    ("fp16s", True): 1e-2,
    ("fp16c", True): 1e-2,
    ("bf16", True): 0.1,
}
#: Largest relative difference of the FP64/FP64 adjoint to float64 central
#: differences.
FD_TOLERANCE = 1e-6
#: The problem the targets hold on.
TARGET_PROBLEM = "taylor_green"


@dataclasses.dataclass(frozen=True)
class Problem:
    """One problem of a scale: its grid size, steps and (storage, shift) runs."""

    name: str
    n: int
    steps: int
    runs: tuple[tuple[str, bool], ...]


@dataclasses.dataclass(frozen=True)
class Settings:
    """The problems of one scale; ``checkpoint_every`` goes to ``advance``."""

    problems: tuple[Problem, ...]
    checkpoint_every: int | None = None


_FP64 = (("fp64", True),)
_TARGET_RUNS = (*_FP64, *TARGETS)
_STANDARD_RUNS = (
    *_FP64,
    ("fp32", True),
    ("fp16", False),
    ("fp16", True),
    ("fp16s", True),
    ("fp16c", True),
    ("posit16", True),
    ("posit16_es2", True),
    ("posit16s", True),
    ("bf16", False),
    ("bf16", True),
)
_FEW_RUNS = (
    *_FP64,
    ("fp32", True),
    ("fp16", False),
    ("fp16s", True),
    ("fp16c", True),
    ("bf16", True),
)

_SETTINGS = {
    # every state kept (checkpoint_every=1): under 100 MB on these grids, and the
    # smallest programs to compile (standard: 214 CPU s, 392 with the default
    # nesting); the gradients differ from the nested loop's by the order of the
    # adjoint's float32 sums only (1e-7 relative)
    "tiny": Settings(
        (
            Problem("taylor_green", 16, 100, _TARGET_RUNS),
            Problem("poiseuille", 8, 100, _FP64),
            Problem("cavity", 16, 100, _FP64),
        ),
        checkpoint_every=1,
    ),
    # the main job's: the targets' problem only (each storage compiles its own
    # gradient program, 5-10 CPU s on a 2-core CPU)
    "quick": Settings(
        (Problem("taylor_green", 32, 500, _TARGET_RUNS),),
        checkpoint_every=1,
    ),
    "standard": Settings(
        (
            Problem("taylor_green", 32, 1000, _STANDARD_RUNS),
            Problem("poiseuille", 32, 1000, _FEW_RUNS),
            Problem("cavity", 32, 1000, _FEW_RUNS),
        ),
        checkpoint_every=1,
    ),
    "full": Settings(tuple(Problem(name, 64, 4000, RUNS_ALL) for name in PROBLEMS)),
}


def settings_for(scale: str) -> Settings:
    """The settings of ``scale`` (one of :data:`experiments._framework.SCALES`)."""
    return _framework.settings_for(_SETTINGS, scale)


def _find(records: list[dict[str, Any]], storage: str, shift: bool) -> dict | None:
    label = storage_label(storage, shift)
    return next((r for r in records if r["label"] == label), None)


def evaluate_checks(
    studies: dict[str, list[dict[str, Any]]], settings: Settings
) -> dict[str, bool]:
    """The study's checks, ``{name: passed}``; what is missing fails.

    Per planned problem: the FP64/FP64 adjoint agrees with float64 central
    differences within :data:`FD_TOLERANCE`, and every planned gradient is finite.
    On Taylor-Green: each of :data:`TARGETS`.
    """
    checks: dict[str, bool] = {}
    for problem in settings.problems:
        records = studies.get(problem.name, [])
        words = CASE_NAMES[problem.name]
        ref = _find(records, "fp64", True)
        diff = math.nan if ref is None else ref.get("fd_rel_diff", math.nan)
        checks[
            f"{words}: FP64/FP64 adjoint within {FD_TOLERANCE:g} of float64 central "
            "differences"
        ] = bool(diff <= FD_TOLERANCE)
        found = [_find(records, *run) for run in problem.runs]
        checks[f"{words}: every planned gradient ran and is finite"] = all(
            r is not None and math.isfinite(r["grad"]) for r in found
        )
    tg = studies.get(TARGET_PROBLEM, [])
    for (storage, shift), target in TARGETS.items():
        r = _find(tg, storage, shift)
        error = math.nan if r is None else r["rel_error"]
        checks[
            f"{CASE_NAMES[TARGET_PROBLEM]}: {storage_label(storage, shift)} "
            f"dL/dtheta within {target:g} of FP64/FP64 (relative)"
        ] = bool(error <= target)
    return checks


def run(
    out_dir: Path, *, quick: bool = True, seed: int = 0, scale: str | None = None
) -> dict[str, Any]:
    """Run the study into ``out_dir``; returns the tables and the checks.

    Args:
        out_dir: an existing, empty directory.
        quick: CPU-sized study (``True``) or the full one.
        seed: recorded for provenance (every run is deterministic).
        scale: override the scale (``"tiny"`` for tests); see
            :func:`experiments._framework.resolve_scale`.
    """
    scale = _framework.resolve_scale(quick, scale)
    st = settings_for(scale)
    env = _framework.capture_environment(seed=seed, scale=scale)
    studies = {
        p.name: problem_sweep(
            p.name, p.runs, p.n, p.steps, checkpoint_every=st.checkpoint_every
        )
        for p in st.problems
    }
    checks = evaluate_checks(studies, st)
    tables = {
        "Relative error of dL/dθ against the FP64/FP64 adjoint": error_table(
            studies, TARGETS, TARGET_PROBLEM
        ),
        "The FP64/FP64 adjoint against float64 central differences": (
            reference_table(studies)
        ),
    }
    figure = gradient_figure(
        studies, TARGETS, out_dir / "gradient_errors.png", caption=run_caption(env)
    )
    _framework.write_json(
        out_dir / "results.json",
        {
            "pipeline": "lbm_gradients",
            "settings": dataclasses.asdict(st),
            "targets": [[s, sh, t] for (s, sh), t in TARGETS.items()],
            "fd_tolerance": FD_TOLERANCE,
            "records": studies,
            "checks": checks,
            "environment": env,
        },
    )
    lines = findings(studies, TARGETS, TARGET_PROBLEM, FD_TOLERANCE)
    write_report(out_dir, scale, env, tables, [figure], checks, lines)
    table = "\n\n".join(f"**{name}**\n\n{t}" for name, t in tables.items())
    return {"table": table, "checks": checks, "scale": scale}
