"""The top-level report of ``python -m experiments reproduce``: one line per
pipeline (status, checks passed, wall time against its quick budget, a link to its
own report) in ``REPORT.md``, and the same with the environment in
``summary.json``, both beside the pipelines' result directories.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from pathlib import Path

from experiments._framework import (
    QUICK_BUDGET_S,
    UNRESOLVED,
    PipelineOutcome,
    capture_environment,
    resolve_scale,
    write_json,
)

__all__ = ["write_top_level_report"]


def write_top_level_report(
    out_root: Path, outcomes: Sequence[PipelineOutcome], *, quick: bool, seed: int
) -> None:
    """Write ``summary.json`` and ``REPORT.md`` into ``out_root`` (``reproduce``)."""
    out_root = Path(out_root)
    out_root.mkdir(parents=True, exist_ok=True)
    scale = resolve_scale(quick)
    total = sum(o.wall_s for o in outcomes)
    summary = {
        "scale": scale,
        "seed": seed,
        "total_wall_s": total,
        "quick_budget_s": dict(QUICK_BUDGET_S),
        "load_average_end": list(os.getloadavg()),
        "passed": all(o.passed for o in outcomes),
        "pipelines": {
            o.name: {
                "passed": o.passed,
                "wall_s": o.wall_s,
                "over_budget": o.over_budget is not None,
                "checks": dict(o.checks),
                "unresolved": dict(o.unresolved),
                "error": o.error,
                "out_dir": o.out_dir.name if o.out_dir is not None else None,
            }
            for o in outcomes
        },
        "environment": capture_environment(seed=seed, scale=scale),
    }
    write_json(out_root / "summary.json", summary)
    lines = [
        "# Reproduction summary",
        "",
        f"Scale: **{scale}**, seed {seed}, git commit "
        f"`{summary['environment']['git_commit']}`, backend "
        f"{summary['environment']['backend']} "
        f"({summary['environment']['device_kind']}).",
        "",
        "| pipeline | status | checks passed | wall time (s) | quick budget (s) "
        "| report |",
        "|---|---|---|---:|---:|---|",
    ]
    for o in outcomes:
        n_ok = sum(o.checks.values())
        budget = QUICK_BUDGET_S.get(o.name)
        budget_text = f"{budget:.0f}" if budget is not None else "-"
        if o.over_budget is not None and scale == "quick":
            budget_text += " (over)"
        report = f"[{o.name}/REPORT.md]({o.name}/REPORT.md)" if o.out_dir else "-"
        lines.append(
            f"| {o.name} | {o.status} | {n_ok}/{len(o.checks)} | {o.wall_s:.1f} | "
            f"{budget_text} | {report} |"
        )
    load = os.getloadavg()
    lines += [
        "",
        f"Total wall time: {total:.1f} s (quick budget: "
        f"{sum(QUICK_BUDGET_S.values()):.0f} s on a 2-core CPU). Load average at "
        f"the end (1/5/15 min): {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} on "
        f"{os.cpu_count()} logical CPUs; wall times grow with a busy machine.",
        "",
    ]
    for o in outcomes:
        if o.error is None and o.failure is not None:
            lines.append(f"- {o.name}: {o.failure}")
        for check, spread in o.unresolved.items():
            lines.append(f"- {o.name}: {check}: {UNRESOLVED}, {spread}")
        if o.over_budget is not None and scale == "quick":
            lines.append(
                f"- {o.name}: over budget, {o.wall_s:.0f} s against its quick budget "
                f"of {o.over_budget:.0f} s (load average {load[0]:.1f})"
            )
        if o.error:
            last = o.error.strip().splitlines()[-1]
            lines.append(f"- {o.name}: raised `{last}`")
    tmp = out_root / f".REPORT.md.tmp-{uuid.uuid4().hex[:8]}"
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, out_root / "REPORT.md")
