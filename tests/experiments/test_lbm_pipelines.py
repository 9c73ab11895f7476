"""The LBM pipelines at the hidden "tiny" scale: artefacts, sanity checks, analysis.

Each pipeline runs once, by executing its notebook (which calls the framework as the
command line does) under strict dtype promotion; the tests inspect what it wrote.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import lbm_jax
from experiments import _lbm_figures, lbm_accuracy, lbm_performance


@pytest.fixture(scope="module")
def accuracy(notebook_run):
    return notebook_run("lbm_accuracy")


@pytest.fixture(scope="module")
def performance(notebook_run):
    return notebook_run("lbm_performance")


def test_lbm_accuracy_tiny_artefacts_and_checks(accuracy):
    out = accuracy.out_dir
    for name in (
        "results.json",
        "REPORT.md",
        "environment.json",
        "summary.json",
        "errors.png",
        "poiseuille_width.png",
        "cavity_centrelines.png",
    ):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    assert accuracy.checks, "the pipeline must report sanity checks"
    failed = [k for k, ok in accuracy.checks.items() if not ok]
    assert failed == [], failed
    results = json.loads((out / "results.json").read_text())
    assert results["environment"]["scale"] == "tiny"
    assert "FP32/FP16S S" in accuracy.table and "Taylor-Green" in accuracy.table
    report = (out / "REPORT.md").read_text()
    assert "![errors](errors.png)" in report
    assert "- Poiseuille: unshifted FP16 deviates" in report


def test_lbm_accuracy_tiny_error_ordering(accuracy):
    records = json.loads((accuracy.out_dir / "results.json").read_text())["records"]
    for case in ("poiseuille", "taylor_green"):
        by_label = {r["label"]: r for r in records[case]}
        fp64 = by_label["FP64/FP64"]
        assert fp64["err_vs_fp64"] == 0.0
        fp32 = by_label["FP32/FP32"]["err_vs_fp64"]
        fp16s = by_label["FP32/FP16S S"]["err_vs_fp64"]
        fp16 = by_label["FP32/FP16 -"]["err_vs_fp64"]
        # FP32 sits far below 16-bit storage; unshifted FP16 is worst.
        assert 0.0 < fp32 < fp16s < fp16, (case, fp32, fp16s, fp16)
        assert math.isfinite(fp16s)


def test_lbm_accuracy_checks_detect_wrong_ordering():
    def rec(storage, shift, err, l2=1e-3):
        label = lbm_accuracy.storage_label(storage, shift)
        return {
            "storage": lbm_jax.get_storage(storage).name,
            "shift": shift,
            "label": label,
            "stable": True,
            "summary": {"l2_error": l2},
            "err_vs_fp64": err,
        }

    good = [rec("fp64", True, 0.0), rec("fp32", True, 1e-7), rec("fp16s", True, 1e-3)]
    bad = [*good, rec("fp16", False, 1e-4)]  # unshifted FP16 "better": must fail
    settings = lbm_accuracy.settings_for("tiny")
    checks = lbm_accuracy.evaluate_checks(
        bad, good + [rec("fp16", False, 1.0)], [], [], settings
    )
    assert checks["poiseuille_fp16_unshifted_worse_than_fp16s"] is False
    assert checks["taylor_green_fp16_unshifted_worse_than_fp16s"] is True
    unstable = [*good[:2], {**rec("fp16s", True, math.inf), "stable": False}]
    checks = lbm_accuracy.evaluate_checks(unstable, good, [], [], settings)
    assert checks["poiseuille_shifted_16bit_finite"] is False


def test_ghia_table_is_read_by_column():
    y, u = _lbm_figures.ghia("u", 100)
    assert y[0] == 0.0 and y[-1] == 1.0 and u[-1] == 1.0
    assert np.isclose(u[1], -0.03717)
    x, v = _lbm_figures.ghia("v", 1000)
    assert x.shape == v.shape and np.isclose(v[1], 0.27485)


def test_lbm_performance_tiny_artefacts_and_checks(performance):
    out = performance.out_dir
    for name in ("results.json", "REPORT.md", "mlups.png", "environment.json"):
        assert (out / name).is_file(), name
    failed = [k for k, ok in performance.checks.items() if not ok]
    assert failed == [], failed
    results = json.loads((out / "results.json").read_text())
    rows = results["rows"]
    settings = lbm_performance.settings_for("tiny")
    assert len(rows) == len(settings.grids) * len(settings.storages)
    assert results["bandwidth_gbs"] > 0
    for r in rows:
        assert r["mlups"] > 0
        roofline = results["bandwidth_gbs"] * 1e3 / r["bytes_per_cell"]
        assert np.isclose(r["roofline_mlups"], roofline)
    fp32 = [r for r in rows if r["storage"] == "FP32/FP32"]
    assert all(r["speedup_vs_fp32"] == 1.0 for r in fp32)


def test_lbm_performance_checks_catch_inconsistent_bytes():
    rows = [
        {
            "lattice": "D3Q19",
            "n": 8,
            "storage": "FP32/FP32",
            "mlups": 10.0,
            "bytes_per_cell": 152.0,
        },
        {
            "lattice": "D3Q19",
            "n": 8,
            "storage": "FP32/FP16S",
            "mlups": 12.0,
            "bytes_per_cell": 152.0,
        },
    ]
    lbm_performance.analyse_rows(rows, 20.0)
    checks = lbm_performance.evaluate_checks(rows, [20.0, 21.0])
    assert checks["bytes_per_cell_consistent"] is False
    assert checks["mlups_positive_finite"] is True
    assert np.isclose(rows[1]["speedup_vs_fp32"], 1.2)
    assert np.isclose(rows[0]["roofline_mlups"], 20e3 / 152)


@pytest.fixture(scope="module")
def capsule_study(notebook_run):
    return notebook_run("lbm_capsule")


def test_lbm_capsule_tiny_artefacts_checks_and_ordering(capsule_study):
    out = capsule_study.out_dir
    for name in ("results.json", "REPORT.md", "deformation.png"):
        assert (out / name).stat().st_size > 0, name
    failed = [k for k, ok in capsule_study.checks.items() if not ok]
    assert capsule_study.checks and failed == [], failed
    results = json.loads((out / "results.json").read_text())
    (records,) = results["records"].values()
    by_label = {r["label"]: r for r in records}
    assert by_label["FP64/FP64"]["deviation_vs_fp64"] == 0.0
    fp32 = by_label["FP32/FP32"]["deviation_vs_fp64"]
    fp16c = by_label["FP32/FP16C S"]["deviation_vs_fp64"]
    assert 0.0 < fp32 < fp16c < 1e-3
    assert "closest to FP64 is" in (out / "REPORT.md").read_text()


def test_lbm_capsule_checks_fail_when_a_run_is_missing():
    from experiments import lbm_capsule

    st = lbm_capsule.settings_for("tiny")
    checks = lbm_capsule.evaluate_checks({0.05: []}, st, None)
    assert checks and not any(checks.values())
