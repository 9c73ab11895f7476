"""The number-range study at the tiny scale: artefacts, exact counts, its checks."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

import lbm_jax
from experiments import number_range
from lbm_jax.cases import prepare_case
from mpjax import ProfileReport

# the study's tiny run takes over a minute; the main job runs it at quick scale
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def study(notebook_run):
    return notebook_run("number_range")


@pytest.fixture(scope="module")
def summaries(study):
    return json.loads((study.out_dir / "results.json").read_text())["summaries"]


def test_artefacts_and_checks(study):
    out = study.out_dir
    cases = [s.case for s in number_range.settings_for("tiny").cases]
    assert set(cases) == {
        "poiseuille",
        "taylor_green",
        "cavity",
        "cylinder",
        "capsule",
        "raindrop",
    }
    for name in ("results.json", "REPORT.md", "number_range.png"):
        assert (out / name).stat().st_size > 0, name
    for case in cases:
        assert (out / f"range_{case}.png").stat().st_size > 0, case
    failed = [k for k, ok in study.checks.items() if not ok]
    assert study.checks and failed == [], failed
    assert "![number_range](number_range.png)" in (out / "REPORT.md").read_text()


def test_records_count_exactly_the_fluid_populations(study):
    st = number_range.settings_for("tiny")
    spec = st.cases[0]
    report = ProfileReport.from_json(
        (study.out_dir / "profiles" / f"{spec.case}.json").read_text()
    )
    sim, _ = prepare_case(spec.case, steps=spec.steps, **spec.options).build()
    fluid = int(np.sum(sim.cell_type == int(lbm_jax.CellType.FLUID)))
    assert {r.count for r in report.records} == {9 * fluid}
    labels = [r.location for r in report.records if r.source == "shifted"]
    assert labels[0] == "step 0" and len(labels) == st.samples + 1


def test_shifting_moves_populations_down_many_binades(summaries):
    for case, s in summaries.items():
        # f_i ~ w_i in [1/36, 4/9]: binades -6 to -2; f_i - w_i far below
        assert -6 <= s["unshifted"]["p50"] <= -2, case
        assert s["shifted"]["p50"] <= s["unshifted"]["p50"] - 4, case
        assert s["unshifted"]["below_normal"]["float16"] == 0.0, case


def test_checks_fail_on_a_missing_case_or_a_broken_claim(summaries):
    cases = tuple(summaries)
    assert all(number_range.evaluate_checks(summaries, cases).values())
    partial = {k: v for k, v in summaries.items() if k != "cavity"}
    failed = number_range.evaluate_checks(partial, cases)
    assert not failed["cavity: ran, populations finite"]
    assert not failed[next(k for k in failed if k.startswith("posit16s scale"))]
    broken = copy.deepcopy(summaries)
    broken["poiseuille"]["shifted"]["below_normal"]["fp16s"] = 0.5
    broken["taylor_green"]["shifted"]["span"] = number_range.MAX_SHIFTED_SPAN + 1
    checks = number_range.evaluate_checks(broken, cases)
    assert [k for k, ok in checks.items() if not ok] == [
        next(k for k in checks if k.startswith("poiseuille: >=")),
        next(k for k in checks if k.startswith("taylor_green: shifted")),
    ]
