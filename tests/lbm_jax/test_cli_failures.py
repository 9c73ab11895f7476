"""The command line says what happened: one message and an exit status, no
traceback unless ``--debug`` (1 for a failed run, 2 for anything else)."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import lbm_jax
from lbm_jax.__main__ import main
from lbm_jax.cases import RUN_FILE, run_case
from lbm_jax.io import _files

# a lid at Mach 0.35 over a nearly inviscid cavity: unstable within 100 steps
UNSTABLE = ["cavity", "--n", "16", "--re", "5000", "--u-ref", "0.2", "--steps", "3000"]


def _cli(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", "lbm_jax", *map(str, args)]


def _messages(stderr: str) -> list[str]:
    """The lines of ``stderr`` but the run's length estimate (printed before the
    bulk of a run, see test_cli.py)."""
    return [x for x in stderr.strip().splitlines() if not x.startswith("estimate: ")]


def test_an_instability_is_one_message_and_exit_1(tmp_path, capsys):
    proc = subprocess.run(
        _cli("run", *UNSTABLE, "--out", tmp_path / "a"), capture_output=True, text=True
    )
    assert proc.returncode == 1
    lines = _messages(proc.stderr)
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: Simulation became unstable at step ")
    assert "Increase tau or the resolution, or lower the velocity." in lines[0]
    # with --debug, the traceback comes first (the same status and message)
    assert main(["--debug", "run", *UNSTABLE, "--out", str(tmp_path / "b")]) == 1
    err = "\n".join(_messages(capsys.readouterr().err))
    assert err.startswith("Traceback (most recent call last):")
    assert "lbm_jax.runs._driver.InstabilityError" in err
    assert err.strip().splitlines()[-1] == lines[0]


def test_a_full_disk_is_one_message_and_exit_2(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    argv = ["run", "taylor_green", "--n", "8", "--steps", "2", "--out", str(out)]
    assert main(argv) == 0
    before = (out / "summary.json").read_bytes()
    capsys.readouterr()

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(_files, "write_vti", full)
    assert main([*argv, "--steps", "4", "--overwrite"]) == 2
    err = "\n".join(_messages(capsys.readouterr().err))
    assert err.startswith("error: No space left on device. No file was left")
    assert len(err.splitlines()) == 1
    assert (out / "summary.json").read_bytes() == before


#: run.json files a resume cannot use, by what is wrong with them
DAMAGED = {
    "empty record": json.dumps({}),
    "missing keys": json.dumps({"case": "poiseuille", "checkpoint_every": 100}),
    "unknown case": json.dumps(
        {"case": "nosuchcase", "arguments": {}, "checkpoint_every": 1, "identity": {}}
    ),
    "not a record": "[1, 2]",
    "cut short": '{"case": "poi',
}


@pytest.mark.parametrize("damage", DAMAGED)
def test_a_damaged_run_file_is_one_message_and_exit_2(tmp_path, capsys, damage):
    out = tmp_path / "run"
    out.mkdir()
    (out / RUN_FILE).write_text(DAMAGED[damage])
    with pytest.raises(SystemExit) as info:
        main(["run", "--resume", str(out)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "damaged" in err or f"no readable {RUN_FILE}" in err
    # the Python API says the same
    with pytest.raises(lbm_jax.ResumeError, match=f"damaged|no readable {RUN_FILE}"):
        run_case("poiseuille", n=8, steps=200, out_dir=out, resume=True)


@pytest.mark.slow
def test_an_interrupt_is_one_message_and_exit_2(tmp_path):
    out = tmp_path / "run"
    argv = _cli(
        "run", "cylinder", "--n", "6", "--u-ref", "0.1", "--steps", "20000",
        "--checkpoint-every", "500", "--out", out,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    with subprocess.Popen(argv, stderr=subprocess.PIPE, text=True) as proc:
        try:
            while not list(out.glob("checkpoints/step_*.npz")):
                assert proc.poll() is None, "the run ended before it was interrupted"
                assert time.monotonic() < deadline, "no checkpoint in 300 s"
                time.sleep(0.01)
            proc.send_signal(signal.SIGINT)  # Ctrl-C
            _, stderr = proc.communicate(timeout=300)
        finally:
            proc.kill()
    assert proc.returncode == 2, stderr
    assert _messages(stderr) == [
        "error: interrupted. The run continues from its newest checkpoint with: "
        f"python -m lbm_jax run --resume {out}"
    ]
    assert not (out / "fields.npz").exists()
