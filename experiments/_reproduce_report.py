"""The top-level report of ``python -m experiments reproduce``: one line per
pipeline (status, checks passed, wall time against its expected time and quick
budget, the load besides it, a link to its own report) in ``REPORT.md``, the same
with the environment in ``summary.json``, and ``index.html``, every pipeline's report
with its figures on one page, all beside the pipelines' result directories.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from pathlib import Path

from experiments import _timing
from experiments._framework import capture_environment, write_json
from experiments._html_report import write_index
from experiments._outcome import UNRESOLVED, PipelineOutcome
from experiments._report import fmt

__all__ = ["write_top_level_report"]


def write_top_level_report(
    out_root: Path, outcomes: Sequence[PipelineOutcome], *, scale: str, seed: int
) -> None:
    """Write ``summary.json``, ``REPORT.md`` and ``index.html`` into ``out_root``."""
    out_root = Path(out_root)
    out_root.mkdir(parents=True, exist_ok=True)
    total = sum(o.wall_s for o in outcomes)
    expected = _timing.EXPECTED_S.get(scale, {})
    summary = {
        "scale": scale,
        "seed": seed,
        "total_wall_s": total,
        "expected_s": dict(expected),
        "budget_s": {o.name: _timing.budget_s(o.name, scale) for o in outcomes},
        "passed": all(o.passed for o in outcomes),
        "pipelines": {
            o.name: {
                "passed": o.passed,
                "wall_s": o.wall_s,
                "cpu_s": o.cpu_s,
                "other_cores": o.other_cores,
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
    env = summary["environment"]
    lines = [
        "# Reproduction summary",
        "",
        f"Scale: **{scale}**, seed {seed}, git commit `{env['git_commit']}`, backend "
        f"{env['backend']} ({env['device_kind']}, {env['cpu_count']} logical CPUs), "
        f"{env['timestamp']}.",
        "",
        "| pipeline | status | checks passed | wall time (s) | expected (s) "
        "| budget (s) | CPU time (s) | other load (cores) | report |",
        "|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for o in outcomes:
        budget = _timing.budget_s(o.name, scale)
        budget_text = fmt(budget, ".0f") + (" (over)" if o.over_budget else "")
        report = f"[{o.name}/REPORT.md]({o.name}/REPORT.md)" if o.out_dir else "-"
        lines.append(
            f"| {o.name} | {o.status} | {sum(o.checks.values())}/{len(o.checks)} | "
            f"{o.wall_s:.1f} | {fmt(expected.get(o.name), '.0f')} | {budget_text} | "
            f"{fmt(o.cpu_s, '.1f')} | {fmt(o.other_cores, '.2f')} | {report} |"
        )
    lines += ["", _total_line(total, scale), ""]
    for o in outcomes:
        if o.error is None and o.failure is not None:
            lines.append(f"- {o.name}: {o.failure}")
        for check, spread in o.unresolved.items():
            lines.append(f"- {o.name}: {check}: {UNRESOLVED}, {spread}")
        if o.over_budget is not None:
            lines.append(f"- {o.over_budget}")
        if o.error:
            last = o.error.strip().splitlines()[-1]
            lines.append(f"- {o.name}: raised `{last}`")
    tmp = out_root / f".REPORT.md.tmp-{uuid.uuid4().hex[:8]}"
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, out_root / "REPORT.md")
    write_index(out_root, outcomes, scale=scale)


def _total_line(total: float, scale: str) -> str:
    """The total wall time against the scale's promise, and what "other load" is."""
    expected = sum(_timing.EXPECTED_S.get(scale, {}).values())
    if not expected:
        return f"Total wall time: {total:.1f} s."
    promise = (
        f" (at most {_timing.QUICK_TOTAL_S:.0f} s promised on an idle 2-core CPU)"
        if scale == "quick"
        else ""
    )
    return (
        f"Total wall time: {total:.1f} s against {expected:.0f} s expected{promise}. "
        "CPU time is the pipeline's own (all cores together); other load is the "
        "average number of cores other processes kept busy while it ran (from "
        "/proc/stat): wall times grow with it."
    )
