"""The command-line contract: outputs of ``run``, validation with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from lbm_jax.__main__ import main

SUMMARY_KEYS = {"case", "lattice", "storage", "shift", "steps", "u_ref", "mlups"}


@pytest.mark.parametrize(
    ("argv", "rho_shape", "u_shape", "metrics"),
    [
        (
            ["poiseuille", "--n", "8", "--steps", "50"],
            (4, 8),
            (2, 4, 8),
            {"l2_error", "slip"},
        ),
        (
            ["taylor_green", "--n", "16", "--steps", "20", "--storage", "fp16s"],
            (16, 16),
            (2, 16, 16),
            {"l2_error", "decay_rate_error"},
        ),
        (
            ["cavity", "--n", "16", "--steps", "50", "--no-shift"],
            (16, 16),
            (2, 16, 16),
            {"ghia_max_error", "u_min_centre"},
        ),
        (
            ["cylinder", "--n", "4", "--steps", "40", "--u-ref", "0.1"],
            (90, 18),
            (2, 90, 18),
            {"strouhal", "cd_max", "cl_max"},
        ),
    ],
)
def test_cli_run_writes_fields_summary_and_png(
    tmp_path, capsys, argv, rho_shape, u_shape, metrics
):
    out = tmp_path / "out"
    assert main(["run", *argv, "--out", str(out)]) == 0
    with np.load(out / "fields.npz") as data:
        assert data["rho"].shape == rho_shape
        assert data["u"].shape == u_shape
        assert np.all(np.isfinite(data["u"]))
    summary = json.loads((out / "summary.json").read_text())
    assert SUMMARY_KEYS | metrics <= set(summary)
    assert summary["case"] == argv[0]
    assert summary["steps"] == int(argv[argv.index("--steps") + 1])
    assert list(out.glob("*.png"))
    assert (out / "fields.vti").stat().st_size > 0
    assert '"case"' in capsys.readouterr().out


def test_cli_no_shift_and_storage_are_recorded(tmp_path):
    out = tmp_path / "o"
    main(["run", "cavity", "--n", "8", "--steps", "5", "--no-shift", "--out", str(out)])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["shift"] is False
    assert summary["storage"] == "FP32/FP32"
    assert summary["u_ref"] == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "nosuchcase", "--out", "X"], "invalid choice"),
        (["run", "cavity", "--storage", "fp7", "--out", "X"], "Unknown storage"),
        (["run", "cavity", "--n", "3", "--out", "X"], "at least 8"),
        (["run", "cavity", "--re", "1e7", "--n", "16", "--out", "X"], "tau"),
        (["run", "cavity", "--re", "-5", "--out", "X"], "positive"),
        (["run", "cavity", "--u-ref", "0.4", "--out", "X"], "Mach"),
        (["run", "poiseuille", "--lattice", "D3Q19", "--out", "X"], "Unknown option"),
        (["run", "cavity", "--steps", "0", "--out", "X"], "steps"),
        (["run", "cavity"], "--out"),
        (["bench", "--storage", "fp7"], "Unknown storage"),
        (["bench", "--lattice", "D4Q1"], "lattice"),
        (["bench", "--n", "2"], "at least 4"),
        (["bench", "--n", "33", "--devices", "2"], "dividing"),
    ],
)
def test_cli_bad_input_exits_2_with_message(tmp_path, capsys, argv, message):
    argv = [str(tmp_path / a) if a == "X" else a for a in argv]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "X").exists()


def test_cli_refuses_non_empty_out_dir_unless_overwrite(tmp_path, capsys):
    out = tmp_path / "prev"
    out.mkdir()
    (out / "keep.txt").write_text("previous results")
    argv = ["run", "taylor_green", "--n", "8", "--steps", "2", "--out", str(out)]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "--overwrite" in capsys.readouterr().err
    assert not (out / "summary.json").exists()
    assert main([*argv, "--overwrite"]) == 0
    assert (out / "summary.json").exists()
    assert (out / "keep.txt").read_text() == "previous results"


def test_cli_as_module_subprocess(tmp_path):
    out = tmp_path / "sub"
    cmd = [sys.executable, "-m", "lbm_jax", "run", "taylor_green", "--n", "8"]
    proc = subprocess.run(
        [*cmd, "--steps", "3", "--out", str(out)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "summary.json").read_text())["steps"] == 3
