"""Results go to ./results for the command line and the notebooks alike, never into
the installed package."""

from __future__ import annotations

from pathlib import Path

import experiments
from experiments import _framework, _notebook
from experiments.__main__ import main

PACKAGE = Path(experiments.__file__).resolve().parent


def _pipeline(out_dir: Path, *, quick: bool = True, seed: int = 0) -> dict:
    (out_dir / "REPORT.md").write_text("# stand-in\n")
    return {"table": "| a |\n|---|\n| 1 |", "checks": {"ok": True}}


def test_default_results_directory_is_under_the_working_directory(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    resolved = _framework.DEFAULT_RESULTS_DIR.resolve()
    assert resolved == tmp_path.resolve() / "results"
    assert not resolved.is_relative_to(PACKAGE)


def test_command_line_writes_to_results_in_the_working_directory(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    assert main(["stand_in"], pipelines={"stand_in": _pipeline}) == 0
    assert (tmp_path / "results" / "stand_in" / "REPORT.md").is_file()
    assert "results/stand_in" in capsys.readouterr().out


def test_notebooks_use_the_command_line_default(tmp_path, monkeypatch):
    seen = {}

    def run_pipeline(name, *, out_root, **kwargs):
        seen[name] = Path(out_root)

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(_notebook.OUT_ENV_VAR, raising=False)
    monkeypatch.delenv(_notebook.FULL_ENV_VAR, raising=False)
    monkeypatch.setattr(_framework, "run_pipeline", run_pipeline)
    _notebook.run_for_notebook("formats")
    assert seen["formats"] == _framework.DEFAULT_RESULTS_DIR
    assert seen["formats"].resolve() == tmp_path.resolve() / "results"
    monkeypatch.setenv(_notebook.OUT_ENV_VAR, str(tmp_path / "elsewhere"))
    _notebook.run_for_notebook("formats")
    assert seen["formats"] == tmp_path / "elsewhere"
