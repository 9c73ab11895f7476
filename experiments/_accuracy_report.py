"""Tables, findings and ``REPORT.md`` of the accuracy study (part of
:mod:`experiments.lbm_accuracy`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiments._accuracy_runs import (
    SHEDDING_METRICS,
    Settings,
    find_run,
    reference_label,
    run_status,
    storage_label,
)
from experiments._lbm_figures import (
    cavity_figure,
    cylinder_figure,
    error_figure,
    metric,
    taylor_green_figure,
    vorticity_figure,
    width_figure,
)
from experiments._report import checks_section, markdown_table

__all__ = [
    "SHEDDING_NOTE",
    "findings",
    "shedding_table",
    "strip_fields",
    "study_figures",
    "study_tables",
    "table_rows",
    "write_report",
]


def table_rows(records: list[dict[str, Any]], keys: Sequence[str]) -> list[list[Any]]:
    """One table row per record: its label, whether it stayed stable, ``keys``."""
    rows = []
    for r in records:
        status = run_status(r)
        values = [metric(r, k) for k in keys]
        rows.append([r["label"], status, *values])
    return rows


def strip_fields(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records without field arrays and histories, for results.json."""
    return [
        {k: v for k, v in r.items() if k not in ("fields", "history")} for r in records
    ]


_MAIN_KEYS = ("l2_error", "err_vs_fp64")
_TG_KEYS = ("l2_error", "decay_rate_error", "err_vs_fp64")
_CAVITY_KEYS = ("ghia_max_error", "err_vs_fp64")

#: Column names of the shedding statistics.
_SHEDDING_COLUMNS = {
    "strouhal": "St",
    "cd_max": "c_d max",
    "cd_mean": "c_d mean",
    "cl_max": "c_l max",
    "cl_amplitude": "c_l amplitude",
}

#: Why the cylinders are not compared by their velocity fields (for REPORT.md).
SHEDDING_NOTE = (
    "The cylinders shed vortices, and the shedding phase drifts between number "
    "formats: a tiny difference in when shedding starts or in its frequency "
    "accumulates over the run, so two equally accurate runs end with the same "
    "vortex street shifted in phase (see the vorticity figures). The relative L2 "
    "difference of their velocity fields then measures that phase shift, not the "
    "accuracy, and is not used. The cylinder tables compare phase-insensitive "
    "statistics of the shedding with the reference run instead: the Strouhal "
    "number, the drag coefficient (mean, or maximum for Schaefer-Turek) and the "
    "lift coefficient (amplitude, or maximum for Schaefer-Turek), each as the "
    "relative difference value / reference - 1."
)


def shedding_table(case: str, records: Sequence[dict[str, Any]]) -> str:
    """Markdown table of a shedding case: its statistics, and their relative
    differences to the reference run (named in the headers)."""
    keys = SHEDDING_METRICS[case]
    ref = reference_label(records)
    names = [_SHEDDING_COLUMNS[k] for k in keys]
    return markdown_table(
        ["storage", "status", *names, *(f"{n} vs {ref}" for n in names)],
        table_rows(list(records), [*keys, *(f"{k}_vs_ref" for k in keys)]),
    )


def _deviation(case: str, record: dict[str, Any]) -> float:
    """How far a run is from the reference run: the relative L2 of the velocity,
    or for a shedding case the largest relative difference of its statistics."""
    if case not in SHEDDING_METRICS:
        return record["err_vs_fp64"]
    return max(abs(metric(record, f"{k}_vs_ref")) for k in SHEDDING_METRICS[case])


def _measure_words(case: str) -> str:
    if case not in SHEDDING_METRICS:
        return "relative L2 of the velocity"
    names = ", ".join(_SHEDDING_COLUMNS[k] for k in SHEDDING_METRICS[case])
    return f"largest relative difference of {names}"


def _findings(studies: dict[str, tuple[str, list[dict[str, Any]]]]) -> list[str]:
    """Plain-language summary lines computed from the run records.

    ``studies`` maps a study's name in words to its case and run records.
    """
    lines = []
    for name, (case, records) in studies.items():
        if not records:
            continue
        ref, words = reference_label(records), _measure_words(case)
        unstable = [r["label"] for r in records if not r["stable"]]
        if unstable:
            lines.append(f"- {name}: unstable runs: {', '.join(unstable)}.")
        fp16, fp16s = find_run(records, "fp16", False), find_run(records, "fp16s", True)
        if fp16 and fp16s and fp16["stable"] and fp16s["stable"]:
            a, b = _deviation(case, fp16), _deviation(case, fp16s)
            lines.append(
                f"- {name}: unshifted FP16 deviates {a / max(b, 1e-300):.3g}x more "
                f"from {ref} than shifted FP16S ({words}: {a:.3g} vs {b:.3g})."
            )
        shifted = [
            (_deviation(case, r), r["label"])
            for r in records
            if r["stable"]
            and r["shift"]
            and r["storage"] not in ("FP64/FP64", "FP32/FP32")
        ]
        shifted = [(d, label) for d, label in shifted if math.isfinite(d)]
        if len(shifted) > 1:
            (lo, best), (hi, worst) = min(shifted), max(shifted)
            lines.append(
                f"- {name}: closest shifted 16-bit format to {ref}: {best} "
                f"({lo:.3g}); farthest: {worst} ({hi:.3g}) ({words})."
            )
        elif case in SHEDDING_METRICS and shifted:
            ((d, label),) = shifted
            lines.append(f"- {name}: {label} vs {ref}: {words} {d:.3g}.")
    return lines


def write_report(
    out_dir: Path,
    scale: str,
    st: Settings,
    tables: dict[str, str],
    figures: list[Path],
    checks: dict[str, bool],
    env: dict[str, Any],
    findings: list[str],
) -> None:
    """Write ``REPORT.md``: what ran, the findings, the tables, figures, checks."""
    cyl = ", ".join(storage_label(s, sh) for s, sh in st.cylinder_runs) or "no storage"
    unc = ", ".join(storage_label(s, sh) for s, sh in st.unconfined_runs) or (
        "no storage"
    )
    cav = ", ".join(storage_label(s, sh) for s, sh in st.cavity_runs) or "no storage"
    lines = [
        "# LBM accuracy of 16-bit population storage",
        "",
        f"Scale **{scale}** on {env['backend']} ({env['device_kind']}); git "
        f"`{env['git_commit']}`; `python -m experiments lbm_accuracy"
        f"{' --full' if scale == 'full' else ''}`.",
        "",
        "Storage labels: `FP32/FP16S S` = stored DDF-shifted, `FP32/FP16S -` = "
        "stored unshifted; FP64/FP64 and FP32/FP32 run shifted. Every run is "
        "compared with the reference run of the same case, named in the column "
        "headers: FP64/FP64, or FP32/FP32 where the case has no FP64 run. "
        "'L2 vs <reference>' is the relative L2 norm of the velocity difference "
        "to it; '<quantity> vs <reference>' a relative difference, value / "
        "reference - 1.",
        "",
        f"What ran: Poiseuille with N = {st.poiseuille_n} and Taylor-Green with "
        f"N = {st.taylor_green_n} for {len(st.runs)} storage variants; Poiseuille "
        f"widths {list(st.widths)}; cavity at Re {list(st.cavity_re)} with "
        f"N = {st.cavity_n} for {cav}; "
        "confined cylinder (Schaefer-Turek 2D-2, Re 100, diameter "
        f"{st.cylinder_n or 'default'} cells, options "
        f"{dict(st.cylinder_options) or 'default'}) for {cyl}; unconfined "
        f"cylinder (Karman street, Re 100, diameter {st.unconfined_n or 'default'} "
        f"cells, options {dict(st.unconfined_options) or 'default'}) for {unc}. Case "
        "defaults (relaxation time, velocity, steps) come from "
        "`lbm_jax.cases.run_case`; see `results.json` for every parameter.",
        "",
    ]
    lines += [
        "## Findings",
        "",
        *findings,
        "",
        "Reading the Poiseuille numbers: the driving body force is "
        "g = 8 nu u_ref / N^2, so its increment per step shrinks with the channel "
        "width and approaches the resolution of 16-bit stored populations; the "
        "16-bit errors grow with N (`poiseuille_width.png`) while FP32 stays near "
        "round-off. Scaling (FP16S) keeps small shifted values out of the float16 "
        "subnormal range but has the same 11-bit significand as FP16, so shifted "
        "FP16 and FP16S can land close together; FP16C trades exponent range for "
        "one more significand bit.",
        "",
    ]
    if st.cylinder_runs or st.unconfined_runs:
        lines += [SHEDDING_NOTE, ""]
    for name, table in tables.items():
        lines += [f"## {name}", "", table, ""]
    lines += [f"![{p.stem}]({p.name})" for p in figures]
    lines += ["", *checks_section(checks)]
    (out_dir / "REPORT.md").write_text("\n".join(lines) + "\n")


def study_tables(studies: dict[str, list[dict[str, Any]]]) -> dict[str, str]:
    """Markdown tables of the studies (see :func:`~experiments._accuracy_runs.
    run_studies`), by title; the cavity and cylinders only when they ran."""
    poiseuille, taylor_green = studies["poiseuille"], studies["taylor_green"]
    cavity = studies["cavity"]
    tables = {
        "Poiseuille": markdown_table(
            [
                "storage",
                "status",
                "L2 vs analytic",
                f"L2 vs {reference_label(poiseuille)}",
            ],
            table_rows(poiseuille, _MAIN_KEYS),
        ),
        "Taylor-Green": markdown_table(
            [
                "storage",
                "status",
                "L2 vs analytic",
                "decay-rate error",
                f"L2 vs {reference_label(taylor_green)}",
            ],
            table_rows(taylor_green, _TG_KEYS),
        ),
    }
    if cavity:
        tables["Lid-driven cavity"] = markdown_table(
            [
                "storage",
                "Re",
                "status",
                "max error vs Ghia",
                f"L2 vs {reference_label(cavity)}",
            ],
            [
                [r[0], int(c["re"]), *r[1:]]
                for r, c in zip(table_rows(cavity, _CAVITY_KEYS), cavity, strict=True)
            ],
        )
    if studies["cylinder"]:
        tables["Cylinder (Schaefer-Turek 2D-2)"] = shedding_table(
            "cylinder", studies["cylinder"]
        )
    if studies["cylinder_unconfined"]:
        tables["Unconfined cylinder (Karman street, Re 100)"] = shedding_table(
            "cylinder_unconfined", studies["cylinder_unconfined"]
        )
    return tables


def study_figures(
    studies: dict[str, list[dict[str, Any]]], out_dir: Path, *, caption: str = ""
) -> list[Path]:
    """Write the study's figures to ``out_dir``; their paths.

    ``caption`` (scale and machine, :func:`experiments._report.run_caption`) goes
    into every figure's title.
    """
    poiseuille, taylor_green = studies["poiseuille"], studies["taylor_green"]
    figures = [
        error_figure(
            {"poiseuille": poiseuille, "taylor_green": taylor_green},
            {"poiseuille": "l2_error", "taylor_green": "l2_error"},
            out_dir,
            caption=caption,
        ),
        width_figure(studies["poiseuille_width"], out_dir, caption=caption),
        taylor_green_figure(taylor_green, out_dir, caption=caption),
    ]
    if studies["cavity"]:
        figures.append(cavity_figure(studies["cavity"], out_dir, caption=caption))
    for case in ("cylinder", "cylinder_unconfined"):
        if studies[case]:
            for writer in (cylinder_figure, vorticity_figure):
                figures.append(
                    writer(studies[case], out_dir, case=case, caption=caption)
                )
    return figures


def findings(studies: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Plain-language summary lines of the studies (see :func:`_findings`)."""
    return _findings(
        {
            "Poiseuille": ("poiseuille", studies["poiseuille"]),
            "Taylor-Green": ("taylor_green", studies["taylor_green"]),
            "cavity": ("cavity", studies["cavity"]),
            "cylinder": ("cylinder", studies["cylinder"]),
            "unconfined cylinder": (
                "cylinder_unconfined",
                studies["cylinder_unconfined"],
            ),
        }
    )
