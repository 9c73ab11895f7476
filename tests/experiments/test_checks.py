"""Pipeline checks must fail when what they compare is missing or absent."""

from __future__ import annotations

import dataclasses
import math

import pytest

from experiments import _framework, amp, lbm_accuracy
from experiments.__main__ import main


def _record(storage: str, shift: bool, err: float, *, stable: bool = True) -> dict:
    """A hand-made run record as :func:`lbm_accuracy.sweep` returns it."""
    import lbm_jax

    return {
        "storage": lbm_jax.get_storage(storage).name,
        "shift": shift,
        "label": lbm_accuracy.storage_label(storage, shift),
        "stable": stable,
        "summary": {"l2_error": 1e-3},
        "err_vs_fp64": err if stable else math.inf,
    }


_PLANNED = (("fp64", True), ("fp32", True), ("fp16", False), ("fp16s", True))
_NAME = "poiseuille_fp16_unshifted_worse_than_fp16s"


def _accuracy_checks(records: list[dict], runs=_PLANNED) -> dict[str, bool]:
    settings = dataclasses.replace(lbm_accuracy.settings_for("tiny"), runs=runs)
    return lbm_accuracy.evaluate_checks(records, records, [], [], settings)


def _complete(fp16_err: float = 1e-2) -> list[dict]:
    return [
        _record("fp64", True, 0.0),
        _record("fp32", True, 1e-7),
        _record("fp16", False, fp16_err),
        _record("fp16s", True, 1e-4),
    ]


def test_ordered_worse_passes_when_both_runs_present():
    assert _accuracy_checks(_complete())[_NAME]
    assert not _accuracy_checks(_complete(fp16_err=1e-5))[_NAME]


def test_ordered_worse_fails_when_planned_run_missing():
    missing = lbm_accuracy.storage_label("fp16", False)
    records = [r for r in _complete() if r["label"] != missing]
    assert _accuracy_checks(records)[_NAME] is False


@pytest.mark.parametrize("unstable", [("fp16", False), ("fp16s", True)])
def test_ordered_worse_fails_when_planned_run_unstable(unstable):
    label = lbm_accuracy.storage_label(*unstable)
    records = [
        _record(*unstable, 0.0, stable=False) if r["label"] == label else r
        for r in _complete()
    ]
    assert _accuracy_checks(records)[_NAME] is False


def test_ordered_worse_not_created_when_not_planned():
    runs = (("fp64", True), ("fp32", True), ("fp16s", True))
    missing = lbm_accuracy.storage_label("fp16", False)
    records = [r for r in _complete() if r["label"] != missing]
    assert _NAME not in _accuracy_checks(records, runs=runs)


@pytest.mark.parametrize(
    ("no_scale", "dynamic", "expected"),
    [
        (0.2, 0.0, True),  # underflow present and removed
        (0.2, 0.05, True),  # underflow present and reduced
        (0.0, 0.0, False),  # nothing to remove: the check says nothing
        (0.2, 0.2, False),  # scaling did not help
        (0.1, 0.3, False),
        (math.nan, 0.0, False),
    ],
)
def test_amp_underflow_check_needs_underflow_to_remove(no_scale, dynamic, expected):
    assert amp.underflow_removed(no_scale, dynamic) is expected


def test_amp_underflow_check_name_states_both_conditions():
    assert "underflow" in amp.UNDERFLOW_CHECK and "scaling" in amp.UNDERFLOW_CHECK
    assert "without" in amp.UNDERFLOW_CHECK


def _no_checks(out_dir, *, quick: bool = True, seed: int = 0) -> dict:
    (out_dir / "REPORT.md").write_text("# nothing checked\n")
    return {"table": "| a |\n|---|\n| 1 |", "checks": {}}


def test_pipeline_without_checks_fails(tmp_path, capsys):
    outcome = _framework.run_pipeline(
        "empty", out_root=tmp_path, pipelines={"empty": _no_checks}
    )
    assert outcome.passed is False
    assert "no checks" in outcome.failure
    summary = (tmp_path / "empty" / "summary.json").read_text()
    assert '"passed": false' in summary
    code = main(
        ["reproduce", "--out", str(tmp_path / "cli")], pipelines={"empty": _no_checks}
    )
    assert code == 1
    assert "no checks" in capsys.readouterr().out
    assert "no checks" in (tmp_path / "cli" / "REPORT.md").read_text()


@pytest.mark.parametrize("only", ["", " ", ",", " , ,"])
def test_main_reproduce_empty_only_exits_2(only, tmp_path, capsys):
    registry = {"empty": _no_checks, "other": _no_checks}
    with pytest.raises(SystemExit) as info:
        main(["reproduce", "--only", only, "--out", str(tmp_path)], pipelines=registry)
    assert info.value.code == 2
    assert "empty, other" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_main_reproduce_unknown_only_exits_2(tmp_path, capsys):
    argv = ["reproduce", "--only", "nope", "--out", str(tmp_path)]
    with pytest.raises(SystemExit) as info:
        main(argv, pipelines={"empty": _no_checks})
    assert info.value.code == 2
    assert "empty" in capsys.readouterr().err
