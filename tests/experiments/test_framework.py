"""The pipeline framework and CLI, exercised with small stand-in pipelines."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from experiments import _framework, _timing
from experiments.__main__ import main
from experiments._report import new_figure, save_figure


def _good(out_dir: Path, *, quick: bool = True, seed: int = 0) -> dict:
    assert out_dir.is_dir() and not any(
        p.name != "environment.json" for p in out_dir.iterdir()
    ), "pipelines must receive an empty directory (plus environment.json)"
    (out_dir / "results.json").write_text(json.dumps({"seed": seed, "quick": quick}))
    (out_dir / "REPORT.md").write_text("# good\n")
    return {"table": "| a |\n|---|\n| 1 |", "checks": {"ok": True}}


def _failing_check(out_dir: Path, *, quick: bool = True, seed: int = 0) -> dict:
    (out_dir / "REPORT.md").write_text("# bad\n")
    return {"table": "| a |", "checks": {"ok": True, "accuracy": False}}


def _raises(out_dir: Path, *, quick: bool = True, seed: int = 0) -> dict:
    (out_dir / "partial.txt").write_text("half-written")
    raise RuntimeError("pipeline blew up")


def _bad_return(out_dir: Path, *, quick: bool = True, seed: int = 0) -> dict:
    return {"checks": {"ok": True}}


REGISTRY = {
    "good": _good,
    "failing": _failing_check,
    "raises": _raises,
    "bad_return": _bad_return,
}


def test_resolve_scale_defaults_and_env(monkeypatch):
    monkeypatch.delenv(_framework.SCALE_ENV_VAR, raising=False)
    assert _framework.resolve_scale(True) == "quick"
    assert _framework.resolve_scale(False) == "full"
    monkeypatch.setenv(_framework.SCALE_ENV_VAR, "tiny")
    assert _framework.resolve_scale(True) == "tiny"
    assert _framework.resolve_scale(False) == "full"  # --full is never shrunk
    assert _framework.resolve_scale(True, "full") == "full"


def test_resolve_scale_rejects_unknown(monkeypatch):
    monkeypatch.setenv(_framework.SCALE_ENV_VAR, "huge")
    with pytest.raises(ValueError, match="MPJAX_EXPERIMENTS_SCALE.*'huge'"):
        _framework.resolve_scale(True)
    with pytest.raises(ValueError, match="argument scale"):
        _framework.resolve_scale(True, "medium")


def test_capture_environment_fields():
    env = _framework.capture_environment(seed=3, scale="quick")
    for key in ("jax", "jaxlib", "flax", "optax", "numpy"):
        assert env["packages"][key] != "not installed"
    assert env["backend"] == "cpu"
    assert isinstance(env["device_kind"], str) and env["device_kind"]
    assert env["seed"] == 3 and env["quick"] is True
    commit = env["git_commit"]
    assert commit == "unknown" or len(commit.split("+")[0]) == 40
    json.dumps(env)  # JSON-ready


def test_git_commit_unknown_outside_repository(tmp_path):
    assert _framework.git_commit(tmp_path) == "unknown"


def test_to_jsonable_converts_numpy_and_nonfinite():
    data = {"a": np.float32(1.5), "b": np.arange(3), "c": float("nan"), "d": (1, 2)}
    assert _framework.to_jsonable(data) == {
        "a": 1.5,
        "b": [0, 1, 2],
        "c": None,
        "d": [1, 2],
    }
    with pytest.raises(TypeError, match="object"):
        _framework.to_jsonable({"x": object()})


def test_run_pipeline_fresh_directory_keeps_previous(tmp_path):
    first = _framework.run_pipeline(
        "good", out_root=tmp_path, seed=1, pipelines=REGISTRY
    )
    assert first.passed and first.out_dir == tmp_path / "good"
    summary = json.loads((tmp_path / "good" / "summary.json").read_text())
    assert summary["environment"]["seed"] == 1 and summary["passed"] is True
    assert (tmp_path / "good" / "environment.json").is_file()
    (tmp_path / "good" / "stale.txt").write_text("from an older run")

    second = _framework.run_pipeline(
        "good", out_root=tmp_path, seed=2, pipelines=REGISTRY
    )
    assert second.passed
    assert not (tmp_path / "good" / "stale.txt").exists()
    assert (tmp_path / "good.prev" / "stale.txt").exists()
    seeds = json.loads((tmp_path / "good" / "results.json").read_text())["seed"]
    assert seeds == 2
    leftovers = [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name]
    assert leftovers == []


def test_run_pipeline_error_leaves_previous_results(tmp_path):
    final = tmp_path / "raises"
    final.mkdir()
    (final / "REPORT.md").write_text("previous")
    outcome = _framework.run_pipeline("raises", out_root=tmp_path, pipelines=REGISTRY)
    assert not outcome.passed and "pipeline blew up" in outcome.error
    assert (final / "REPORT.md").read_text() == "previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raises"]
    with pytest.raises(RuntimeError, match="blew up"):
        _framework.run_pipeline(
            "raises", out_root=tmp_path, pipelines=REGISTRY, catch=False
        )


def test_run_pipeline_validates_return_and_args(tmp_path):
    outcome = _framework.run_pipeline(
        "bad_return", out_root=tmp_path, pipelines=REGISTRY
    )
    assert outcome.error is not None and "'table'" in outcome.error
    with pytest.raises(ValueError, match="unknown pipeline 'nope'"):
        _framework.run_pipeline("nope", out_root=tmp_path, pipelines=REGISTRY)
    with pytest.raises(ValueError, match="seed"):
        _framework.run_pipeline("good", out_root=tmp_path, seed=-1, pipelines=REGISTRY)


def test_main_reproduce_writes_summary_and_fails_on_check(tmp_path, capsys):
    status = main(
        ["reproduce", "--out", str(tmp_path), "--only", "good,failing"],
        pipelines=REGISTRY,
    )
    assert status == 1
    out = capsys.readouterr().out
    assert "FAILED: accuracy" in out and "| total |" in out
    assert (tmp_path / "failing" / "REPORT.md").read_text() == "# bad\n"
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert list(summary["pipelines"]) == ["good", "failing"]
    assert summary["pipelines"]["good"]["passed"] is True
    assert summary["pipelines"]["failing"]["checks"]["accuracy"] is False
    assert summary["passed"] is False
    report = (tmp_path / "REPORT.md").read_text()
    assert "| failing | FAIL | 1/2 |" in report


def _slow_timing(out_dir: Path, *, quick: bool = True, seed: int = 0) -> dict:
    checks = {"ok": True, "speedup >= 1": False, "accuracy": False}
    spread = {"speedup >= 1": "median 0.94, spread 0.9-1.05 straddles >= 1"}
    return {"table": "| a |", "checks": checks, "unresolved": spread}


def test_unresolved_timing_checks_do_not_fail_a_run_but_a_real_miss_does(
    tmp_path, capsys, monkeypatch
):
    fixed = {"ok": True, "speedup >= 1": False}
    registry = {
        "timing": lambda out_dir, **kw: {**_slow_timing(out_dir), "checks": fixed},
        "broken": _slow_timing,  # the same, plus a failed accuracy check
    }
    monkeypatch.setitem(_timing.EXPECTED_S["quick"], "timing", 0.0)  # overrun it
    status = main(
        ["reproduce", "--out", str(tmp_path), "--only", "timing"], pipelines=registry
    )
    assert status == 0
    out = capsys.readouterr().out
    assert "speedup >= 1: unresolved, median 0.94, spread 0.9-1.05" in out
    assert "timing: over budget" in out and "(quick scale, expected ~0 s)" in out
    report = (tmp_path / "REPORT.md").read_text()
    assert "| timing | pass (1 unresolved) | 1/2 |" in report
    assert "- timing: speedup >= 1: unresolved, median 0.94" in report
    assert "- timing: over budget" in report and "| 0 (over) |" in report
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["passed"] and summary["pipelines"]["timing"]["over_budget"]
    assert main(["broken", "--out", str(tmp_path)], pipelines=registry) == 1
    assert "FAILED: accuracy" in capsys.readouterr().out
    # only a failed check can be unresolved
    wrong = {
        "t": lambda out_dir, **kw: {
            **_slow_timing(out_dir),
            "checks": {"speedup >= 1": True},
        }
    }
    outcome = _framework.run_pipeline("t", out_root=tmp_path, pipelines=wrong)
    assert "not failed checks" in outcome.error


def test_main_single_pipeline_success(tmp_path, capsys):
    assert (
        main(["good", "--out", str(tmp_path), "--seed", "5"], pipelines=REGISTRY) == 0
    )
    assert "all checks passed" in capsys.readouterr().out
    assert not (tmp_path / "summary.json").exists()  # only 'reproduce' writes it
    env = json.loads((tmp_path / "good" / "environment.json").read_text())
    assert env["seed"] == 5


@pytest.mark.parametrize(
    "argv",
    [
        ["nope"],
        ["good", "--only", "good"],
        ["reproduce", "--only", "good,nope"],
        ["reproduce", "--quick", "--full"],
        ["good", "--seed", "-1"],
    ],
)
def test_main_usage_errors_exit_2(argv, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main([*argv, "--out", str(tmp_path)], pipelines=REGISTRY)
    assert info.value.code == 2
    assert "python -m experiments" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("target", ["reproduce", "good"])
def test_main_refuses_an_out_that_is_a_file_before_running(target, tmp_path, capsys):
    blocker = tmp_path / "existing_file"
    blocker.write_text("keep")
    for out, message in (
        (blocker, "is a file"),
        (blocker / "sub", "cannot be created"),
    ):
        with pytest.raises(SystemExit) as info:
            main([target, "--out", str(out)], pipelines=REGISTRY)
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert message in err and "usage: python -m experiments" in err
    assert blocker.read_text() == "keep"


def _scaled(out_dir: Path, *, quick: bool = True, seed: int = 0, scale=None) -> dict:
    (out_dir / "REPORT.md").write_text(f"# scaled\n\nscale {scale}\n\n![f](f.png)\n")
    fig, ax = new_figure()
    ax[0, 0].plot([0, 1], [1, 0])
    save_figure(fig, out_dir / "f.png")
    save_figure(fig, out_dir / "unlisted.png")
    return {"table": "| a |", "checks": {"ok": scale == "standard" and quick}}


def test_main_standard_scale_reaches_the_pipeline_and_the_page(tmp_path, capsys):
    registry = {"scaled": _scaled}
    argv = ["reproduce", "--standard", "--out", str(tmp_path)]
    assert main(argv, pipelines=registry) == 0
    out = capsys.readouterr().out
    assert "## scaled  (standard scale, no estimate)" in out
    assert str(tmp_path / "index.html") in out and "REPORT.md" in out
    env = json.loads((tmp_path / "scaled" / "environment.json").read_text())
    assert env["scale"] == "standard" and env["quick"] is True
    page = (tmp_path / "index.html").read_text()
    assert page.count("data:image/png;base64,") == 2  # the listed and the other
    assert 'href="#scaled"' in page and "scale standard" in page
    assert "<td>pass</td>" in page
    assert main(["reproduce", "--out", str(tmp_path)], pipelines=registry) == 1


def test_main_list(capsys):
    assert main(["list"]) == 0
    assert capsys.readouterr().out.split() == list(_framework.PIPELINES)


def test_fresh_directory_interrupt_keeps_final(tmp_path):
    final = tmp_path / "out"
    final.mkdir()
    (final / "old.txt").write_text("old")
    with pytest.raises(KeyboardInterrupt):
        with _framework.fresh_directory(final) as tmp:
            (tmp / "new.txt").write_text("new")
            raise KeyboardInterrupt
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert (final / "old.txt").read_text() == "old"
    with _framework.fresh_directory(final) as tmp:
        assert list(tmp.iterdir()) == []
        (tmp / "new.txt").write_text("new")
    assert (final / "new.txt").exists() and (tmp_path / "out.prev/old.txt").exists()
