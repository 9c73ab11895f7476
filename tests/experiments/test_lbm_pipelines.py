"""The LBM pipelines at the hidden "tiny" scale: artefacts, sanity checks, analysis.

Each pipeline runs once, by executing its notebook (which calls the framework as the
command line does) under strict dtype promotion; the tests inspect what it wrote.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

import lbm_jax
from experiments import _lbm_figures, lbm_accuracy, lbm_performance, lbm_raindrop


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


def _shedding_record(storage, shift, *, phase=0.0, stable=True, **summary):
    """An unconfined-cylinder run: shedding statistics and a velocity field whose
    street is shifted by ``phase`` (a phase drift, not an error)."""
    x = np.arange(32.0)[:, None] * np.ones((1, 16))
    u = np.stack([0.1 + 0.02 * np.sin(0.5 * x + phase), 0.02 * np.cos(0.5 * x + phase)])
    stats = {"strouhal": 0.165, "cd_mean": 1.35, "cl_amplitude": 0.33, **summary}
    return {
        "storage": lbm_jax.get_storage(storage).name,
        "shift": shift,
        "label": lbm_accuracy.storage_label(storage, shift),
        "stable": stable,
        "summary": stats if stable else {},
        "fields": {"u": u, "rho": np.ones((32, 16))} if stable else None,
    }


def test_an_unstable_run_records_the_step_its_table_row_names(monkeypatch):
    from experiments import _accuracy_runs

    def blow_up(case, **kwargs):
        raise lbm_jax.InstabilityError(step=2800, last_good_step=2700, state=None)

    monkeypatch.setattr(lbm_jax.cases, "run_case", blow_up)
    replays = []

    def replay(*args):
        replays.append(args[:3])
        return None  # what a case without convert gives

    monkeypatch.setattr(_accuracy_runs, "replay_in_reference", replay)
    record = _accuracy_runs.run_one("poiseuille", "fp16s", True, n=8)
    assert not record["stable"] and record["unstable_step"] == 2800
    assert replays == [("poiseuille", "fp16s", True)]
    assert _accuracy_runs.run_status(record) == "UNSTABLE at step 2800"
    assert _accuracy_runs.run_status({"stable": True}) == "stable"


def test_lbm_accuracy_cylinder_compared_by_shedding_statistics_with_fp32():
    case = "cylinder_unconfined"
    fp32 = _shedding_record("fp32", True)
    fp16s = _shedding_record("fp16s", True, phase=2.0, strouhal=0.1667, cd_mean=1.35)
    records = [fp32, fp16s]
    lbm_accuracy.compare_runs(case, records)
    assert [r["reference"] for r in records] == ["FP32/FP32"] * 2
    assert not any("err_vs_fp64" in r for r in records), "no field L2 for a street"
    assert fp32["strouhal_vs_ref"] == 0.0
    assert np.isclose(fp16s["strouhal_vs_ref"], 0.1667 / 0.165 - 1.0)
    assert fp16s["cd_mean_vs_ref"] == 0.0 and fp16s["cl_amplitude_vs_ref"] == 0.0
    header = lbm_accuracy.shedding_table(case, records).splitlines()[0]
    for column in ("St", "c_d mean", "c_l amplitude"):
        assert f"| {column} vs FP32/FP32 |" in header, header
    assert "L2" not in header and "FP64" not in header
    # With an FP64 run, that run is the reference, and the headers say so.
    with_fp64 = [_shedding_record("fp64", True), *records]
    lbm_accuracy.compare_runs(case, with_fp64)
    assert "St vs FP64/FP64" in lbm_accuracy.shedding_table(case, with_fp64)


def test_lbm_accuracy_shedding_checks_use_the_statistics():
    settings = dataclasses.replace(
        lbm_accuracy.settings_for("standard"), runs=(("fp32", True), ("fp16s", True))
    )
    assert ("fp16s", True) in settings.unconfined_runs
    name = "unconfined_shifted_16bit_shedding_matches_reference"
    field = [_shedding_record("fp32", True), _shedding_record("fp16s", True)]
    for r in field:
        r["summary"]["l2_error"] = 1e-3
    lbm_accuracy.compare_runs("poiseuille", field)

    def checks(*fp16s):
        records = [_shedding_record("fp32", True), *fp16s]
        lbm_accuracy.compare_runs("cylinder_unconfined", records)
        return lbm_accuracy.evaluate_checks(
            field, field, [], [], settings, unconfined=records
        )

    phase_shifted = _shedding_record("fp16s", True, phase=3.0, cd_mean=1.36)
    assert checks(phase_shifted)[name], "a phase drift alone passes"
    assert checks(phase_shifted)["unconfined_fp32_strouhal_within_10pct"]
    assert not checks(_shedding_record("fp16s", True, strouhal=0.175))[name]
    assert not checks(_shedding_record("fp16s", True, cl_amplitude=0.0))[name]
    assert not checks(_shedding_record("fp16s", True, stable=False))[name]
    assert not checks()[name], "a planned run that is missing fails"


@pytest.mark.slow
def test_lbm_accuracy_report_compares_the_street_by_its_statistics(
    tmp_path, monkeypatch
):
    runs = (("fp32", True), ("fp16s", True))
    small = lbm_accuracy.Settings(
        poiseuille_n=8,
        poiseuille_steps=100,
        widths=(8,),
        width_runs=runs[:1],
        taylor_green_n=8,
        taylor_green_steps=50,
        cavity_n=8,
        cavity_re=(),
        cavity_steps=None,
        cavity_runs=(),
        cylinder_n=None,
        cylinder_steps=None,
        cylinder_runs=(),
        unconfined_n=6,
        unconfined_runs=runs,
        unconfined_options=(
            ("u_ref", 0.1),
            ("run_times", 30.0),
            ("length", 12.0),
            ("width", 8.0),
            ("length_front", 3.0),
            ("offset", 0.13),
        ),
        runs=runs,
    )
    monkeypatch.setattr(lbm_accuracy, "settings_for", lambda scale: small)
    result = lbm_accuracy.run(tmp_path, scale="tiny")
    report = (tmp_path / "REPORT.md").read_text()
    assert " ".join(lbm_accuracy.SHEDDING_NOTE.split()) in " ".join(report.split())
    assert "| St vs FP32/FP32 | c_d mean vs FP32/FP32 |" in report
    assert "L2 vs FP64" not in report
    assert "![cylinder_unconfined_vorticity](cylinder_unconfined_vorticity.png)" in (
        report
    )
    assert (tmp_path / "cylinder_unconfined_vorticity.png").stat().st_size > 0
    assert result["checks"]["unconfined_shifted_16bit_shedding_matches_reference"]
    fp16s = result["records"]["cylinder_unconfined"][1]
    assert fp16s["reference"] == "FP32/FP32" and "err_vs_fp64" not in fp16s


def test_ghia_table_is_read_by_column():
    y, u = _lbm_figures.ghia("u", 100)
    assert y[0] == 0.0 and y[-1] == 1.0 and u[-1] == 1.0
    assert np.isclose(u[1], -0.03717)
    x, v = _lbm_figures.ghia("v", 1000)
    assert x.shape == v.shape and np.isclose(v[1], 0.27485)


@pytest.mark.slow
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
    # the figures a D3Q19 step moves: 2 x 19 populations of 8, 4 or 2 bytes
    for storage, nbytes in (("FP64/FP64", 304.0), ("FP32/FP16S", 76.0)):
        rows[1].update(storage=storage, bytes_per_cell=nbytes)
        checks = lbm_performance.evaluate_checks(rows, [20.0, 21.0])
        assert checks["bytes_per_cell_consistent"] is True, storage


@pytest.fixture(scope="module")
def capsule_study(notebook_run):
    return notebook_run("lbm_capsule")


@pytest.mark.slow
def test_lbm_capsule_tiny_artefacts_checks_and_ordering(capsule_study):
    out = capsule_study.out_dir
    for name in ("results.json", "REPORT.md", "deformation.png", "convergence.png"):
        assert (out / name).stat().st_size > 0, name
    failed = [k for k, ok in capsule_study.checks.items() if not ok]
    assert capsule_study.checks and failed == [], failed
    assert (
        "convergence skalak Ca=0.05 2-point: every radius ran stably"
        in capsule_study.checks
    )
    results = json.loads((out / "results.json").read_text())
    conv = results["convergence"]
    assert [r["radius"] for r in conv] == [3.0, 4.0]
    assert all(r["stable"] and r["label"] == "FP32/FP32" for r in conv)
    (records,) = results["records"].values()
    by_label = {r["label"]: r for r in records}
    assert by_label["FP64/FP64"]["deviation_vs_reference"] == 0.0
    fp32 = by_label["FP32/FP32"]["deviation_vs_reference"]
    fp16c = by_label["FP32/FP16C S"]["deviation_vs_reference"]
    assert 0.0 < fp32 < fp16c < 1e-3
    assert "closest to FP64/FP64 is" in (out / "REPORT.md").read_text()


def test_lbm_capsule_checks_fail_when_a_run_is_missing():
    from experiments import lbm_capsule

    st = lbm_capsule.settings_for("tiny")
    checks = lbm_capsule.evaluate_checks({0.05: []}, st, None)
    assert checks and not any(checks.values())


def _capsule_record(radius: float, error: float, rate: float) -> dict:
    summary = {"deformation_error": error, "relaxation_rate_error": rate}
    return {
        "law": "skalak",
        "ca": 0.03,
        "delta": 2,
        "radius": radius,
        "stable": True,
        "summary": summary,
    }


def test_capsule_convergence_checks_fail_when_the_error_misses_or_rises():
    from experiments._capsule_convergence import Convergence, convergence_checks

    conv = Convergence(
        radii=(4.0, 8.0),
        cas=(0.03,),
        laws=("skalak",),
        target_radius=8.0,
        target_error=0.05,
    )
    good = [_capsule_record(4.0, 0.12, 0.10), _capsule_record(8.0, 0.04, 0.03)]
    checks = convergence_checks(good, conv)
    assert len(checks) == 5 and all(checks.values()), checks
    missed = convergence_checks([good[0], _capsule_record(8.0, 0.06, 0.03)], conv)
    assert [k for k, ok in missed.items() if not ok] == [
        "convergence skalak Ca=0.03 2-point: D error <= 5% at r = 8"
    ]
    rising = convergence_checks([good[0], _capsule_record(8.0, 0.04, 0.11)], conv)
    failed = [k for k, ok in rising.items() if not ok]
    assert failed == [
        "convergence skalak Ca=0.03 2-point: rate error falls from r = 4 to r = 8",
        "convergence skalak Ca=0.03 2-point: rate error <= 5% at r = 8",
    ]
    unstable = dict(good[1], stable=False, summary={})
    assert not any(
        v
        for k, v in convergence_checks([good[0], unstable], conv).items()
        if "falls" in k or "<=" in k or "stably" in k
    )
    assert not convergence_checks([good[0]], conv)[
        "convergence skalak Ca=0.03 2-point: every radius ran stably"
    ]
    smoke = dataclasses.replace(conv, converged=False)
    assert list(convergence_checks([good[0], unstable], smoke).values()) == [False]


@pytest.fixture(scope="module")
def raindrop_study(notebook_run):
    return notebook_run("lbm_raindrop")


@pytest.mark.slow
def test_lbm_raindrop_tiny_artefacts_checks_and_comparison(raindrop_study):
    out = raindrop_study.out_dir
    for name in (
        "results.json",
        "REPORT.md",
        "raindrop_crown.png",
        "raindrop_fill_difference.png",
        "raindrop_slices.png",
        "static_drop_capillary_wave.png",
    ):
        assert (out / name).stat().st_size > 0, name
    failed = [k for k, ok in raindrop_study.checks.items() if not ok]
    assert raindrop_study.checks and failed == [], failed
    results = json.loads((out / "results.json").read_text())
    by_label = {r["label"]: r for r in results["records"]["raindrop"]}
    fp32, fp16s = by_label["FP32/FP32"], by_label["FP32/FP16S S"]
    assert fp32["l1_final"] == 0.0 and fp32["crown_deviation"] == 0.0
    # 16-bit storage changes the splash, but within the stated bound.
    assert 0.0 < fp16s["l1_final"] <= results["settings"]["l1_final_bound"]
    assert len(fp16s["l1_slices"]) == results["settings"]["raindrop_samples"]
    assert fp16s["crown_compared"] > 0
    (drops,) = results["records"]["static_drop"].values()
    assert all(r["summary"]["laplace_error"] < 0.05 for r in drops)
    report = (out / "REPORT.md").read_text()
    assert "closest to FP32 is FP32/FP16S S" in report
    assert "16-bit storage survives" in report


def _raindrop_studies(st, *, steps=100):
    """Raindrop, static-drop and capillary-wave records that pass every check."""

    def rec(storage, **values):
        sixteen = storage != "fp32"
        return {
            "storage": lbm_jax.get_storage(storage).name,
            "label": lbm_accuracy.storage_label(storage, True),
            "stable": True,
            "summary": {"steps": steps, "mass_drift": 1e-8, **values},
            "l1_final": 1e-4 if sixteen else 0.0,
            "l1_slices_max": 1e-4 if sixteen else 0.0,
            "crown_deviation": 0.0,
        }

    names, names_2d = ([s for s, _ in runs] for runs in (st.runs, st.runs_2d))
    return {
        "raindrop": [rec(s) for s in names],
        "static_drop": {
            r: [rec(s, laplace_error=0.01) for s in names_2d] for r in st.drop_radii
        },
        "capillary_wave": [
            rec(s, frequency_error=0.01, damping_error=0.01) for s in names_2d
        ],
    }


def test_lbm_raindrop_checks_fail_when_a_run_is_missing():
    st = lbm_raindrop.settings_for("standard")
    studies = _raindrop_studies(st)
    assert all(lbm_raindrop.evaluate_checks(studies, st, 100).values())
    empty = {"raindrop": [], "static_drop": {}, "capillary_wave": []}
    checks = lbm_raindrop.evaluate_checks(empty, st, 100)
    assert checks and not any(checks.values())
    # Dropping one 16-bit run of a case fails exactly that case's checks.
    for case in ("raindrop", "capillary_wave"):
        partial = {**studies, case: studies[case][:-1]}
        checks = lbm_raindrop.evaluate_checks(partial, st, 100)
        failed = {k for k, ok in checks.items() if not ok}
        mine = {k for k in checks if k.startswith(case.replace("_", " "))}
        assert failed == mine and mine, (case, failed)


@pytest.mark.parametrize(
    ("words", "change"),
    [
        ("finished stably", {"stable": False, "summary": {}}),
        ("finished stably", {"summary": {"steps": 50, "mass_drift": 1e-8}}),
        ("mass drift", {"summary": {"steps": 100, "mass_drift": 2e-6}}),
        ("L1 difference", {"l1_slices_max": math.nan}),
        ("L1 difference", {"l1_final": 1.0}),
        ("crown radius", {"crown_deviation": math.nan}),
    ],
)
def test_lbm_raindrop_checks_fail_for_a_bad_16bit_run(words, change):
    st = lbm_raindrop.settings_for("standard")
    studies = _raindrop_studies(st)
    fp32, fp16s, fp16c = studies["raindrop"]
    studies["raindrop"] = [fp32, {**fp16s, **change}, fp16c]
    checks = lbm_raindrop.evaluate_checks(studies, st, 100)
    failed = [k for k, ok in checks.items() if not ok]
    assert failed and all(k.startswith("raindrop") for k in failed), failed
    assert any(words in k for k in failed), failed


def test_lbm_raindrop_compare_measures_fill_and_crown_against_fp32():
    def rec(storage, phi, crown, stable=True):
        slices = np.stack([phi[:, 0, :]] * len(crown))
        return {
            "storage": storage,
            "stable": stable,
            "fields": {"phi": phi},
            "history": {"slices": slices, "crown_radius": np.array(crown)},
        }

    phi = np.zeros((4, 4, 4))
    moved = phi.copy()
    moved[0, 0, 0] = 1.0  # one cell of 64 differs; 1 of the 16 mid-plane cells
    nan = math.nan
    ref = rec("FP32/FP32", phi, [nan, 8.0, 9.0, 10.0])
    close = rec("FP32/FP16S", moved, [nan, 8.0, 10.0, 10.0])
    late = rec("FP32/FP16C", phi, [nan, nan, nan, 10.0])  # shares 1 of 3 crowns
    broken = rec("FP32/FP16", phi, [nan] * 4, stable=False)
    motion = lbm_raindrop.compare_raindrop([ref, close, late, broken], n=8)
    assert motion == 0.0  # the synthetic slices never change
    assert close["l1_final"] == 1 / 64 and close["l1_slices_max"] == 1 / 16
    assert close["crown_deviation"] == 1 / 8 and close["crown_compared"] == 3
    assert math.isnan(late["crown_deviation"]) and late["crown_compared"] == 1
    assert broken["l1_final"] == math.inf and broken["crown_deviation"] == math.inf


def test_lbm_raindrop_full_scale_runs_the_raindrop_with_its_subgrid_constant(
    tmp_path, monkeypatch
):
    # the full scale's C = 0.15 reaches the case; the other scales keep its default
    seen = []

    class Stop(Exception):
        pass

    def prepare(case, **options):
        seen.append((case, options.get("smagorinsky")))
        raise Stop

    monkeypatch.setattr(lbm_jax.cases, "prepare_case", prepare)
    for scale in ("full", "quick"):
        with pytest.raises(Stop):
            lbm_raindrop.run(tmp_path, scale=scale)
    assert seen == [("raindrop", 0.15), ("raindrop", None)]
