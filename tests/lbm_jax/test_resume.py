"""Killed command-line runs resume from their checkpoints, bit for bit."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import lbm_jax
from lbm_jax.__main__ import main
from lbm_jax.cases import RUN_FILE, run_case

# the cylinder samples its force every 2 steps: a time series that must join up
CYLINDER = ["cylinder", "--n", "6", "--u-ref", "0.1", "--steps", "20000"]


def _cli(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", "lbm_jax", "run", *map(str, args)]


def _fields(path: Path) -> dict[str, np.ndarray]:
    with np.load(path / "fields.npz") as data:
        return {k: data[k] for k in data.files}


def _kill_after_two_checkpoints(argv: list[str], out: Path) -> None:
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    try:
        while len(list(out.glob("checkpoints/step_*.npz"))) < 2:
            assert proc.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "no second checkpoint in 300 s"
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not (out / "fields.npz").exists()


# The 16-bit storage is the harder case (its codec must round-trip through the
# checkpoint); FP32 runs with the slow tests to keep the default run short.
@pytest.mark.slow
@pytest.mark.parametrize(
    "storage", [pytest.param("fp32", marks=pytest.mark.slow), "fp16s"]
)
def test_killed_cli_run_resumes_bit_identically(storage, tmp_path):
    argv = [*CYLINDER, "--storage", storage, "--checkpoint-every", "1000"]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    subprocess.run(_cli(*argv, "--out", straight), check=True, capture_output=True)
    _kill_after_two_checkpoints(_cli(*argv, "--out", killed), killed)
    if storage == "fp16s":  # a checkpoint cut short while being copied, say
        newest = sorted(killed.glob("checkpoints/step_*.npz"))[-1]
        newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    resumed = subprocess.run(
        _cli("--resume", killed), capture_output=True, text=True, check=False
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stderr
    if storage == "fp16s":
        assert f"Skipping checkpoint {newest.name}" in resumed.stderr
    a, b = _fields(killed), _fields(straight)
    assert set(a) == set(b) >= {"rho", "u", "t", "cd", "cl"}
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    summary = json.loads((killed / "summary.json").read_text())
    assert summary["steps"] == 20000 and summary["storage"] == (
        lbm_jax.get_storage(storage).name
    )


def test_resume_with_other_options_or_nothing_to_resume_exits_2(tmp_path, capsys):
    out = tmp_path / "run"
    run_case("poiseuille", n=8, steps=300, out_dir=out, checkpoint_every=100)
    with pytest.raises(SystemExit) as info:
        main(["run", "--resume", str(out), "--n", "12"])
    assert info.value.code == 2
    assert "belongs to another run: case.n was 8, now 12" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["run", "cavity", "--resume", str(out)])
    assert info.value.code == 2
    assert "holds a 'poiseuille' run, not 'cavity'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["run", "--resume", str(tmp_path / "nothing")])
    assert info.value.code == 2
    assert f"no readable {RUN_FILE}" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["run", "poiseuille"])
    assert "needs a case and --out DIR" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(
            [
                "run",
                "poiseuille",
                "--out",
                str(tmp_path / "x"),
                "--checkpoint-every",
                "0",
            ]
        )
    assert info.value.code == 2
    assert "--checkpoint-every must be at least 1" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    with pytest.raises(SystemExit) as info:  # finished: its outputs stay as they are
        main(["run", "--resume", str(out)])
    assert info.value.code == 2
    assert "finished run" in capsys.readouterr().err


def test_resume_refuses_another_code_version(tmp_path):
    out = tmp_path / "run"
    run_case("poiseuille", n=8, steps=200, out_dir=out, checkpoint_every=100)
    record = json.loads((out / RUN_FILE).read_text())
    record["identity"]["code_version"] = "0.0.1+000000000000"
    (out / RUN_FILE).write_text(json.dumps(record))
    with pytest.raises(lbm_jax.ResumeError, match="code_version was '0.0.1"):
        run_case("poiseuille", n=8, steps=200, out_dir=out, resume=True)


def test_case_api_resume_of_a_finished_run_is_refused_unless_overwrite(tmp_path):
    out = tmp_path / "tg"
    kwargs = dict(n=16, steps=120, storage="fp16c", checkpoint_every=40)
    first = run_case("taylor_green", out_dir=out, **kwargs)
    written = {p.name: p.stat().st_mtime_ns for p in first.files}
    # a finished run is not analysed and written again unless asked
    with pytest.raises(lbm_jax.ResumeError, match="finished run.*overwrite=True"):
        run_case("taylor_green", out_dir=out, resume=True, **kwargs)
    assert {p.name: p.stat().st_mtime_ns for p in first.files} == written
    again = run_case("taylor_green", out_dir=out, resume=True, overwrite=True, **kwargs)
    assert again.summary["steps"] == first.summary["steps"] == 120
    np.testing.assert_array_equal(again.fields["u"], first.fields["u"])
    with pytest.raises(ValueError, match="need out_dir"):
        run_case("taylor_green", n=16, steps=10, checkpoint_every=5)
    with pytest.raises(ValueError, match="not empty"):
        run_case("taylor_green", out_dir=out, **kwargs)
