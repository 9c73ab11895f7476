"""Every pipeline has a jupytext notebook that parses and runs at the tiny scale."""

from __future__ import annotations

import json
from pathlib import Path

import jupytext
import pytest

from experiments import _framework

NOTEBOOKS = Path(_framework.__file__).resolve().parent / "notebooks"


def test_one_notebook_per_pipeline():
    names = sorted(p.stem for p in NOTEBOOKS.glob("*.py"))
    assert names == sorted(_framework.PIPELINES)


@pytest.mark.parametrize("name", list(_framework.PIPELINES))
def test_notebook_is_percent_format_calling_its_pipeline(name):
    notebook = jupytext.read(NOTEBOOKS / f"{name}.py")
    kinds = [cell.cell_type for cell in notebook.cells]
    assert kinds[0] == "markdown" and "code" in kinds
    code = "\n".join(c.source for c in notebook.cells if c.cell_type == "code")
    assert f'run_for_notebook("{name}")' in code
    assert notebook.metadata["jupytext"]["text_representation"]["format_name"] == (
        "percent"
    )


# Tiny-scale wall times on a 2-core CPU decide what runs by default: the amp
# pipeline trains three networks under three policies even at its tiny scale.
# the pipelines whose tiny runs take longest (the main job runs them all)
_SLOW_AT_TINY = {
    "amp",
    "lbm_performance",
    "lbm_capsule",
    "lbm_gradients",
    "lbm_raindrop",
    "number_range",
}


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.slow) if n in _SLOW_AT_TINY else n
        for n in _framework.PIPELINES
    ],
)
def test_notebook_runs_tiny(name, notebook_run):
    outcome = notebook_run(name)
    assert outcome.out_dir is not None and outcome.out_dir.name == name
    env = json.loads((outcome.out_dir / "environment.json").read_text())
    assert env["scale"] == "tiny"
    assert (outcome.out_dir / "REPORT.md").stat().st_size > 0
    assert list(outcome.out_dir.glob("*.json"))
    assert list(outcome.out_dir.glob("*.png")), "the notebook shows the figures"
    assert outcome.checks and outcome.passed, outcome.checks
