"""The gradient study: its checks fail on bad or missing input, its outputs, one real
gradient against central differences, and (slow) the tiny run of its notebook."""

from __future__ import annotations

import copy
import dataclasses
import doctest
import json
import math

import pytest
from matplotlib.collections import PolyCollection

from experiments import _framework, _gradient_report, _gradient_runs, lbm_gradients
from experiments._accuracy_runs import storage_label
from experiments._gradient_runs import gradient_run

_ERRORS = {"FP32/FP32": 1e-6, "FP32/FP16S S": 1e-3, "FP32/FP16C S": 2e-4}


def _record(problem, storage, shift, error, n=16, steps=100):
    """A run record as problem_sweep returns it (hand-made)."""
    import lbm_jax

    policy = lbm_jax.get_storage(storage, shift=shift)
    fp64 = policy.name == "FP64/FP64"
    record = {
        "problem": problem,
        "storage": policy.name,
        "shift": shift,
        "label": storage_label(storage, shift),
        "emulated": policy.name not in lbm_jax.differentiable_storages(),
        "n": n,
        "steps": steps,
        "theta": 0.04,
        "loss": 0.06,
        "grad": 3.0 * (1.0 + error),
        "rel_error": error,
        "wall_s": 1.0,
    }
    if fp64:
        record.update(central_difference=3.0, fd_rel_diff=1e-11)
    return record


def _studies(settings):
    """Records for every planned run of ``settings``, each within its target."""
    return {
        p.name: [
            _record(
                p.name,
                storage,
                shift,
                0.0
                if storage == "fp64"
                else _ERRORS.get(storage_label(storage, shift), 1e-2),
                p.n,
                p.steps,
            )
            for storage, shift in p.runs
        ]
        for p in settings.problems
    }


def _failed(checks):
    return sorted(k for k, ok in checks.items() if not ok)


@pytest.fixture
def quick():
    """The quick scale's Taylor-Green runs with the standard scale's other two
    problems (the quick scale runs Taylor-Green only)."""
    quick, standard = map(lbm_gradients.settings_for, ("quick", "standard"))
    return dataclasses.replace(
        quick, problems=(quick.problems[0], *standard.problems[1:])
    )


def test_checks_pass_on_good_records(quick):
    checks = lbm_gradients.evaluate_checks(_studies(quick), quick)
    assert len(checks) == 2 * len(quick.problems) + len(lbm_gradients.TARGETS)
    assert _failed(checks) == []


def test_a_gradient_off_its_target_fails_its_check(quick):
    studies = _studies(quick)
    bf16 = next(r for r in studies["taylor_green"] if r["label"].startswith("FP32/bf"))
    bf16["rel_error"] = 0.2  # beyond bfloat16's 10 %
    assert _failed(lbm_gradients.evaluate_checks(studies, quick)) == [
        "Taylor-Green vortices: FP32/bfloat16 S dL/dtheta within 0.1 of FP64/FP64 "
        "(relative)"
    ]


def test_a_reference_off_central_differences_fails(quick):
    studies = _studies(quick)
    studies["cavity"][0]["fd_rel_diff"] = 1e-5
    assert _failed(lbm_gradients.evaluate_checks(studies, quick)) == [
        "Lid-driven cavity: FP64/FP64 adjoint within 1e-06 of float64 central "
        "differences"
    ]


def test_missing_or_non_finite_input_fails_never_passes(quick):
    studies = _studies(quick)
    studies["taylor_green"] = [
        r for r in studies["taylor_green"] if r["label"] != "FP32/FP16C S"
    ]
    studies["poiseuille"][1]["grad"] = math.nan
    del studies["cavity"]
    failed = _failed(lbm_gradients.evaluate_checks(studies, quick))
    assert failed == [
        "Lid-driven cavity: FP64/FP64 adjoint within 1e-06 of float64 central "
        "differences",
        "Lid-driven cavity: every planned gradient ran and is finite",
        "Poiseuille channel: every planned gradient ran and is finite",
        "Taylor-Green vortices: FP32/FP16C S dL/dtheta within 0.01 of FP64/FP64 "
        "(relative)",
        "Taylor-Green vortices: every planned gradient ran and is finite",
    ]
    nothing = lbm_gradients.evaluate_checks({}, quick)
    assert not any(nothing.values())


def _stand_in(studies):
    """problem_sweep replaced by the records of ``studies`` (nothing compiles)."""

    def sweep(problem, runs, n, steps, *, checkpoint_every=None):
        return copy.deepcopy(studies[problem])

    return sweep


def test_pipeline_writes_table_figure_report_and_results(tmp_path, monkeypatch):
    st = lbm_gradients.settings_for("quick")
    monkeypatch.setattr(lbm_gradients, "problem_sweep", _stand_in(_studies(st)))
    outcome = _framework.run_pipeline(
        "lbm_gradients", out_root=tmp_path, scale="quick", catch=False
    )
    assert outcome.passed, outcome.checks
    out = outcome.out_dir
    for name in ("results.json", "REPORT.md", "gradient_errors.png", "summary.json"):
        assert (out / name).stat().st_size > 0, name
    report = (out / "REPORT.md").read_text()
    assert "![gradient_errors](gradient_errors.png)" in report
    assert "FP32/FP16S S 1.0e-03 meets its target 0.01" in report
    assert "| FP32/FP16C S | float32 (format emulated) | 2.00e-04 |" in (outcome.table)
    results = json.loads((out / "results.json").read_text())
    assert set(results["records"]) == {p.name for p in st.problems}
    assert results["checks"] == outcome.checks


def test_pipeline_fails_on_a_gradient_off_target(tmp_path, monkeypatch):
    st = lbm_gradients.settings_for("quick")
    studies = _studies(st)
    studies["taylor_green"][1]["rel_error"] = 1e-3  # FP32, target 1e-4
    monkeypatch.setattr(lbm_gradients, "problem_sweep", _stand_in(studies))
    outcome = _framework.run_pipeline(
        "lbm_gradients", out_root=tmp_path, scale="quick", catch=False
    )
    assert not outcome.passed
    assert "FP32/FP32 1.0e-03 MISSES its target 0.0001" in (
        (outcome.out_dir / "REPORT.md").read_text()
    )


def test_figure_has_words_units_a_log_axis_and_the_target_bands():
    st = lbm_gradients.settings_for("standard")
    studies = _studies(st)
    studies["cavity"][1]["rel_error"] = 0.0  # drawn on the bottom edge
    studies["cavity"][2]["rel_error"] = math.nan  # not finite: a red cross
    fig = _gradient_report.build_gradient_figure(studies, lbm_gradients.TARGETS)
    (ax,) = fig.axes
    assert ax.get_yscale() == "log"
    assert "dimensionless" in ax.get_ylabel() and ax.get_xlabel()
    assert "32 x 32 cells, 1000 steps" in fig.get_suptitle()
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == len(lbm_gradients.TARGETS)  # one band each
    assert any(t.get_text() == "0" for t in ax.texts)
    (legend,) = fig.legends
    assert len(legend.get_texts()) == len(st.problems) + 1  # problems, band


@pytest.mark.parametrize("module", [_gradient_runs, _gradient_report])
def test_docstring_examples(module):
    result = doctest.testmod(module)
    assert result.attempted and not result.failed


def test_float64_adjoint_matches_central_differences():
    r = gradient_run("taylor_green", "fp64", True, 8, 20, checkpoint_every=1)
    assert r["loss"] > 0 and r["grad"] > 0
    assert abs(r["grad"] / r["central_difference"] - 1.0) < 1e-8


@pytest.mark.slow
def test_tiny_run_of_the_notebook(notebook_run):
    outcome = notebook_run("lbm_gradients")
    assert outcome.checks and outcome.passed, outcome.checks
    results = json.loads((outcome.out_dir / "results.json").read_text())
    tg = {r["label"]: r for r in results["records"]["taylor_green"]}
    (planned,) = (
        p.runs
        for p in lbm_gradients.settings_for("tiny").problems
        if p.name == "taylor_green"
    )
    assert set(tg) == {storage_label(*run) for run in planned}
    assert 0.0 < tg["FP32/FP32"]["rel_error"] < tg["FP32/FP16S S"]["rel_error"]
    assert results["environment"]["scale"] == "tiny"
