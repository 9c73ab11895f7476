"""An interrupted accuracy study reuses its finished simulations on a re-run."""

from __future__ import annotations

import json

import pytest

import lbm_jax
import lbm_jax.cases
from experiments import _framework


def _run_dirs(work):
    return sorted(p.name for p in work.iterdir() if p.is_dir())


@pytest.mark.slow
def test_interrupted_study_reuses_finished_runs_of_the_same_code(tmp_path, monkeypatch):
    monkeypatch.setenv(_framework.SCALE_ENV_VAR, "tiny")
    real = lbm_jax.cases.run_case
    calls: list[str] = []

    def counting(case, **kwargs):
        calls.append(case)
        if interrupt_at and len(calls) == interrupt_at:
            raise KeyboardInterrupt
        return real(case, **kwargs)

    monkeypatch.setattr(lbm_jax.cases, "run_case", counting)
    interrupt_at = 4
    with pytest.raises(KeyboardInterrupt):
        _framework.run_pipeline("lbm_accuracy", out_root=tmp_path, catch=False)
    work = tmp_path / ".lbm_accuracy.partial"
    assert len(_run_dirs(work)) == 3  # three runs finished before the interrupt
    assert not (tmp_path / "lbm_accuracy").exists()

    calls.clear()
    interrupt_at = 0
    outcome = _framework.run_pipeline("lbm_accuracy", out_root=tmp_path, catch=False)
    assert outcome.passed, outcome.checks
    results = json.loads((outcome.out_dir / "results.json").read_text())
    # a run appears in more than one study (the widths reuse the main sweep's)
    records = {
        json.dumps(r, sort_keys=True): r
        for study in results["records"].values()
        for r in study
    }.values()
    assert sum(r["reused"] for r in records) == 3
    assert len(calls) == len(records) - 3
    assert not work.exists()  # completed: nothing left to reuse


def test_work_of_another_code_version_is_discarded(tmp_path, monkeypatch):
    work = _framework.work_directory(tmp_path, "lbm_accuracy")
    (work / "0123456789abcdef0123").mkdir()
    again = _framework.work_directory(tmp_path, "lbm_accuracy")
    assert _run_dirs(again) == ["0123456789abcdef0123"]
    monkeypatch.setattr(lbm_jax, "code_version", lambda: "9.9.9+ffffffffffff")
    assert _run_dirs(_framework.work_directory(tmp_path, "lbm_accuracy")) == []
