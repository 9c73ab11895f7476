"""The main job, end to end: ``python -m experiments reproduce --quick`` (slow).

These run the real quick scale in a subprocess, exactly as a user would, and check
its promise of five minutes on an idle 2-core CPU
(:data:`experiments._timing.QUICK_TOTAL_S`; on a loaded machine the wall time grows
with the load, which the report states). Run them with ``pytest -m slow``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import _framework, _timing

ROOT = Path(_framework.__file__).resolve().parent.parent
QUICK_BUDGET_S = _timing.QUICK_TOTAL_S


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != _framework.SCALE_ENV_VAR}
    return subprocess.run(
        [sys.executable, "-m", "experiments", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=2 * QUICK_BUDGET_S,
    )


@pytest.mark.slow
def test_reproduce_quick_within_budget(tmp_path):
    proc = _cli("reproduce", "--quick", "--out", str(tmp_path), cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert list(summary["pipelines"]) == list(_framework.PIPELINES)
    assert summary["passed"] is True
    assert summary["total_wall_s"] < QUICK_BUDGET_S, summary["total_wall_s"]
    for name in _framework.PIPELINES:
        out = tmp_path / name
        assert (out / "REPORT.md").is_file() and list(out.glob("*.png")), name
        env = json.loads((out / "environment.json").read_text())
        assert env["scale"] == "quick" and env["seed"] == 0
    assert "| total |" in proc.stdout and "index.html" in proc.stdout
    page = (tmp_path / "index.html").read_text()
    assert page.count("data:image/png;base64,") == len(list(tmp_path.glob("*/*.png")))
    assert (tmp_path / "REPORT.md").read_text().count("| pass |") == len(
        _framework.PIPELINES
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", ["lbm_accuracy", "lbm_performance"])
def test_lbm_pipeline_quick_alone(name, tmp_path):
    proc = _cli(name, "--quick", "--out", str(tmp_path), "--seed", "3", cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    summary = json.loads((tmp_path / name / "summary.json").read_text())
    assert summary["passed"] and summary["environment"]["seed"] == 3
    assert not (tmp_path / "summary.json").exists()
