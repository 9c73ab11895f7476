"""Tables, figure, findings and ``REPORT.md`` of the gradient study (part of
:mod:`experiments.lbm_gradients`).

Every function takes the study's run records by problem (see
:func:`experiments._gradient_runs.problem_sweep`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from experiments._accuracy_runs import storage_label
from experiments._gradient_runs import FD_STEP, PROBLEMS
from experiments._lbm_figures import CASE_NAMES, LABEL_KEY, distinct_colours
from experiments._report import (
    checks_section,
    fmt,
    markdown_table,
    new_figure,
    save_figure,
)

__all__ = [
    "error_table",
    "findings",
    "gradient_figure",
    "reference_table",
    "setup_words",
    "write_report",
]

Studies = Mapping[str, list[dict[str, Any]]]
Targets = Mapping[tuple[str, bool], float]


def _labels(studies: Studies) -> list[str]:
    """Every storage label that ran, in the order of first appearance."""
    return list(dict.fromkeys(r["label"] for rs in studies.values() for r in rs))


def _record(studies: Studies, problem: str, label: str) -> dict[str, Any] | None:
    return next((r for r in studies.get(problem, []) if r["label"] == label), None)


def _held_as(record: dict[str, Any]) -> str:
    """How a run held its populations (and so its tangents and adjoints)."""
    if record["emulated"]:
        return "float32 (format emulated)"
    return {"FP64/FP64": "float64", "FP32/FP32": "float32"}.get(
        record["storage"], "float16"
    )


def setup_words(problem: str, records: list[dict[str, Any]]) -> str:
    """A problem's grid and steps in words, for titles.

    >>> setup_words("cavity", [{"n": 32, "steps": 500}])
    'Lid-driven cavity, 32 x 32 cells, 500 steps'
    >>> setup_words("poiseuille", [{"n": 16, "steps": 100}])
    'Poiseuille channel, width 16 cells, 100 steps'
    """
    if not records:
        return f"{CASE_NAMES[problem]}, not run"
    n, steps = records[0]["n"], records[0]["steps"]
    grid = f"width {n} cells" if problem == "poiseuille" else f"{n} x {n} cells"
    return f"{CASE_NAMES[problem]}, {grid}, {steps} steps"


def error_table(studies: Studies, targets: Targets, target_problem: str) -> str:
    """Storage x problem: the relative error of ``dL/dtheta`` against FP64/FP64
    (``reference`` for the FP64 run itself, ``not run`` where it did not run)."""
    target_of = {storage_label(*k): v for k, v in targets.items()}
    rows = []
    for label in _labels(studies):
        first = next(r for rs in studies.values() for r in rs if r["label"] == label)
        cells = []
        for problem in studies:
            r = _record(studies, problem, label)
            if r is None:
                cells.append("not run")
            elif r["storage"] == "FP64/FP64":
                cells.append("reference")
            else:
                cells.append(fmt(r["rel_error"], ".2e"))
        rows.append([label, _held_as(first), *cells, fmt(target_of.get(label), "g")])
    headers = [
        "storage",
        "populations held as",
        *(CASE_NAMES[p] for p in studies),
        f"target ({CASE_NAMES[target_problem]})",
    ]
    return markdown_table(headers, rows)


def reference_table(studies: Studies) -> str:
    """Per problem: theta, L and the FP64 adjoint against central differences."""
    rows = []
    for problem, records in studies.items():
        ref = _record(studies, problem, "FP64/FP64")
        theta, loss = PROBLEMS[problem]
        values = (
            [math.nan] * 5
            if ref is None
            else [
                ref["theta"],
                ref["loss"],
                ref["grad"],
                ref.get("central_difference", math.nan),
                ref.get("fd_rel_diff", math.nan),
            ]
        )
        rows.append(
            [
                setup_words(problem, records),
                f"{theta} θ = {fmt(values[0], '.4g')}",
                f"{loss}: {fmt(values[1], '.6g')}",
                fmt(values[2], ".10g"),
                fmt(values[3], ".10g"),
                fmt(values[4], ".1e"),
            ]
        )
    return markdown_table(
        [
            "problem",
            "θ",
            "L",
            "dL/dθ (adjoint)",
            f"dL/dθ (central differences, step {FD_STEP:g} θ)",
            "relative difference",
        ],
        rows,
    )


def _draw_targets(ax: Any, xs: dict[str, int], targets: Targets, bottom: float) -> Any:
    """Shade each target band (0 to the target) over its storage's position."""
    handle = None
    for key, target in targets.items():
        x = xs.get(storage_label(*key))
        if x is None:
            continue
        handle = ax.fill_between(
            [x - 0.4, x + 0.4], bottom, target, color="0.5", alpha=0.2, lw=0
        )
        ax.hlines(target, x - 0.4, x + 0.4, color="0.3", lw=1.5)
    return handle


def build_gradient_figure(
    studies: Studies, targets: Targets, target_problem: str = "taylor_green"
) -> Any:
    """Grouped dots: per storage, the relative error of each problem's
    ``dL/dtheta`` (one colour per problem, log scale), the targets shaded.

    An error of exactly zero is drawn on the bottom edge and marked "0"; a
    gradient that is not finite is a red cross on the top edge.
    """
    from matplotlib.lines import Line2D

    labels = [lab for lab in _labels(studies) if lab != "FP64/FP64"]
    xs = {lab: i for i, lab in enumerate(labels)}
    fig, axes = new_figure(size=(max(7.5, 0.75 * len(labels) + 2.5), 4.6))
    ax = axes[0, 0]
    errors = [r["rel_error"] for rs in studies.values() for r in rs]
    finite = [e for e in errors if math.isfinite(e) and e > 0] + list(targets.values())
    bottom, top = min(finite) / 10, max(finite) * 10
    colours = distinct_colours(len(studies))
    offsets = np.linspace(-0.2, 0.2, len(studies)) if len(studies) > 1 else [0.0]
    handles = []
    for colour, dx, (problem, records) in zip(
        colours, offsets, studies.items(), strict=True
    ):
        for r in records:
            if r["label"] not in xs:
                continue
            x, e = xs[r["label"]] + dx, r["rel_error"]
            if not math.isfinite(e):
                ax.plot(x, top, "x", color="tab:red", ms=9, mew=2)
            elif e == 0.0:
                ax.plot(x, bottom, "v", color=colour, ms=7)
                ax.annotate("0", (x, bottom), ha="center", va="bottom", fontsize=7)
            else:
                ax.plot(x, e, "o", color=colour, ms=7)
        if not any(r["label"] in xs for r in records):
            continue  # only its reference ran: nothing drawn
        theta, loss = PROBLEMS[problem]
        handles.append(
            Line2D(
                [],
                [],
                marker="o",
                ls="",
                color=colour,
                label=f"{CASE_NAMES[problem]}: L = {loss}, θ = {theta}",
            )
        )
    band = _draw_targets(ax, xs, targets, bottom)
    if band is not None:
        band.set_label(f"target band ({CASE_NAMES[target_problem]})")
        handles.append(band)
    ax.set_yscale("log")
    ax.set_ylim(bottom, top * 2)
    ax.set_xticks(range(len(labels)), labels, rotation=40, ha="right")
    ax.set_xlabel("storage (compute / stored format)")
    ax.set_ylabel("relative error of dL/dθ\nvs FP64/FP64 (dimensionless)")
    ax.grid(axis="y", alpha=0.3)
    fig.legend(
        handles=handles,
        loc="outside lower center",
        ncol=1,
        fontsize="small",
        title=LABEL_KEY,
        title_fontsize="x-small",
    )
    setups = "\n".join(
        setup_words(p, rs)
        + ("" if any(r["label"] in xs for r in rs) else ": FP64 reference only")
        for p, rs in studies.items()
    )
    fig.suptitle(
        "Relative error of dL/dθ through stored populations against the "
        f"FP64/FP64 adjoint\n{setups}",
        fontsize="medium",
    )
    return fig


def gradient_figure(
    studies: Studies, targets: Targets, path: Path, *, caption: str = ""
) -> Path:
    """Write :func:`build_gradient_figure` to ``path``."""
    return save_figure(build_gradient_figure(studies, targets), path, caption=caption)


def findings(
    studies: Studies, targets: Targets, target_problem: str, fd_tolerance: float
) -> list[str]:
    """Plain-language summary lines computed from the records."""
    lines = []
    diffs = [
        r.get("fd_rel_diff", math.nan)
        for rs in studies.values()
        for r in rs
        if r["storage"] == "FP64/FP64"
    ]
    if diffs:
        worst = max(diffs, key=lambda d: d if math.isfinite(d) else math.inf)
        verdict = "within" if worst <= fd_tolerance else "NOT within"
        lines.append(
            f"- The FP64/FP64 adjoint agrees with float64 central differences to "
            f"{worst:.1e} at worst ({verdict} {fd_tolerance:g}) on "
            f"{len(diffs)} problem(s)."
        )
    for problem, records in studies.items():
        others = [r for r in records if r["storage"] != "FP64/FP64"]
        if not others:
            continue
        ranked = sorted(others, key=lambda r: _sort_key(r["rel_error"]))
        parts = ", ".join(f"{r['label']} {fmt(r['rel_error'], '.1e')}" for r in ranked)
        lines.append(f"- {CASE_NAMES[problem]}, from closest to farthest: {parts}.")
    for key, target in targets.items():
        r = _record(studies, target_problem, storage_label(*key))
        error = math.nan if r is None else r["rel_error"]
        met = "meets" if error <= target else "MISSES"
        lines.append(
            f"- {CASE_NAMES[target_problem]}: {storage_label(*key)} "
            f"{fmt(error, '.1e')} {met} its target {target:g}."
        )
    lines += _shift_findings(studies)
    return lines


def _sort_key(error: float) -> float:
    return error if math.isfinite(error) else math.inf


def _shift_findings(studies: Studies) -> list[str]:
    """Where a format ran both shifted and unshifted: the ratio of their errors."""
    lines = []
    for problem, records in studies.items():
        by_label = {r["label"]: r for r in records}
        for r in records:
            if not r["label"].endswith(" -"):
                continue
            shifted = by_label.get(r["label"][:-2] + " S")
            if shifted is None or not shifted["rel_error"] > 0:
                continue
            ratio = r["rel_error"] / shifted["rel_error"]
            lines.append(
                f"- {CASE_NAMES[problem]}: unshifted {r['label'][:-2]} is "
                f"{ratio:.3g}x the error of the DDF-shifted one."
            )
    return lines


def write_report(
    out_dir: Path,
    scale: str,
    env: Mapping[str, Any],
    tables: Mapping[str, str],
    figures: list[Path],
    checks: Mapping[str, bool],
    findings: list[str],
) -> None:
    """Write ``REPORT.md``: what ran, the findings, the tables, figure, checks."""
    lines = [
        "# Gradients through 16-bit population storage",
        "",
        f"Scale **{scale}** on {env['backend']} ({env['device_kind']}); git "
        f"`{env['git_commit']}`; `python -m experiments lbm_gradients"
        f"{f' --{scale}' if scale in ('standard', 'full') else ''}`.",
        "",
        "Each problem is one of the accuracy study's cases with a parameter θ and "
        "a scalar L of the final state: Taylor-Green vortices (L = kinetic energy, "
        "θ = initial amplitude), the Poiseuille channel (L = flux, the mean "
        "x-velocity, θ = the driving body force) and the lid-driven cavity (L = "
        "circulation of the primary vortex around the square through the quarter "
        "points, θ = lid speed). dL/dθ is the adjoint (`jax.value_and_grad`) "
        "through `Simulation.advance`, whose reverse mode keeps its checkpoints in "
        "the storage format; the storage rounding has the straight-through "
        "derivative, so the gradient is the float32 adjoint along the stored "
        "trajectory. FP16 and FP16S hold populations, tangents and adjoints in "
        "float16; FP16C, bfloat16 and the posits run emulated (every stored value "
        "rounded to the format as in 16-bit storage, the same trajectory bit for "
        "bit, held in float32, so their tangents and adjoints are float32). "
        "Storage labels: `S` = DDF-shifted, `-` = unshifted.",
        "",
        "## Findings",
        "",
        *findings,
        "",
    ]
    for name, table in tables.items():
        lines += [f"## {name}", "", table, ""]
    lines += [f"![{p.stem}]({p.name})" for p in figures]
    lines += ["", *checks_section(dict(checks))]
    (out_dir / "REPORT.md").write_text("\n".join(lines) + "\n")
