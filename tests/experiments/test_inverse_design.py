"""The inverse-design study at the tiny scale: it runs, writes its outputs, and its
checks can fail."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from experiments import inverse_design


@pytest.fixture(scope="module")
def study(notebook_run):
    return notebook_run("inverse_design")


@pytest.fixture(scope="module")
def results(study):
    return json.loads((study.out_dir / "results.json").read_text())


def test_artefacts_and_checks(study, results):
    out = study.out_dir
    for name in (
        "results.json",
        "REPORT.md",
        "inverse_loss.png",
        "inverse_force.png",
        "inverse_profile.png",
    ):
        assert (out / name).stat().st_size > 0, name
    failed = [k for k, ok in study.checks.items() if not ok]
    assert len(study.checks) == 4 and failed == [], failed
    report = (out / "REPORT.md").read_text()
    assert "![inverse_profile](inverse_profile.png)" in report
    st = inverse_design.settings_for("tiny")
    assert len(results["losses_fp16s"]) == st.iterations + 1
    assert results["checks"] == study.checks


def test_the_control_force_stays_in_its_region_and_bound(results):
    force = np.asarray(results["control_force"])
    bound = results["channel"]["force_bound"]
    assert np.max(np.abs(force)) <= bound
    assert (
        np.count_nonzero(np.any(force != 0.0, axis=0))
        <= (results["channel"]["control_cells"])
    )
    # the target has no net push: its flux is the undisturbed channel's
    flux = results["flux"]
    assert flux["target"] == pytest.approx(flux["initial"], rel=1e-2)


def test_checks_fail_on_a_missing_or_a_bad_result(results):
    assert all(inverse_design.evaluate_checks(results).values())
    assert not any(inverse_design.evaluate_checks(None).values())
    assert not any(inverse_design.evaluate_checks({}).values())
    last = results["losses_fp16s"][-1]
    for key, value, failing in (
        ("losses_fp16s", [5 * last, last], ("loss falls",)),
        ("losses_fp16s", [last], ("loss falls", "FP32 re-evaluation")),
        ("max_deviation", 0.2, ("within 5%",)),
        ("max_deviation", None, ("within 5%",)),
        ("loss_final_fp32", 10 * last, ("FP32 re-evaluation",)),
        ("loss_final_fp32", None, ("FP32 re-evaluation",)),
        ("mach_fp32", 0.3, ("Mach",)),
        ("mach_fp32", float("nan"), ("Mach",)),
    ):
        bad = copy.deepcopy(results)
        bad[key] = value
        checks = inverse_design.evaluate_checks(bad)
        failed = [name for name, ok in checks.items() if not ok]
        assert len(failed) == len(failing), (key, value, failed)
        assert all(any(f in name for name in failed) for f in failing), failed
