"""An output folder loses nothing: one writer at a time, outputs written as a set."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lbm_jax.cases import run_case
from lbm_jax.io import _files, _plot
from lbm_jax.io._outputs import LOCK_FILE, FolderInUseError, folder_lock, write_set

RUN = {"n": 8, "steps": 2}


def _contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _disk_full(write):
    """``write`` that stops half-way with a full disk, as a real one would."""

    def full(path, *args, **kwargs):
        written = Path(write(path, *args, **kwargs))
        written.write_bytes(written.read_bytes()[:100])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    return full


@pytest.mark.parametrize(
    ("module", "name"), [(_files, "write_vti"), (_plot, "save_figure")]
)
def test_overwrite_on_a_full_disk_keeps_the_previous_outputs(
    tmp_path, monkeypatch, module, name
):
    out = tmp_path / "out"
    first = run_case("taylor_green", out_dir=out, **RUN)
    before = _contents(out)
    assert (
        {p.name for p in first.files}
        == set(before)
        >= {
            "fields.npz",
            "fields.vti",
            "summary.json",
        }
    )
    monkeypatch.setattr(module, name, _disk_full(getattr(module, name)))
    with pytest.raises(OSError, match="No space left"):
        run_case("taylor_green", out_dir=out, overwrite=True, n=8, steps=4)
    # the previous set is whole, and nothing of the new one is left anywhere
    assert _contents(out) == before


def test_write_set_replaces_files_only_once_all_are_written(tmp_path):
    (tmp_path / "a.txt").write_text("old a")
    (tmp_path / "other.txt").write_text("not of the set")

    def write(staging, fail):
        (staging / "a.txt").write_text("new a")
        if fail:
            raise OSError(errno.ENOSPC, "disk full")
        (staging / "b.txt").write_text("new b")
        return [staging / "b.txt", staging / "a.txt"]

    with pytest.raises(OSError, match="disk full"):
        write_set(tmp_path, lambda d: write(d, fail=True))
    assert _contents(tmp_path) == {"a.txt": b"old a", "other.txt": b"not of the set"}
    files = write_set(tmp_path, lambda d: write(d, fail=False), last="a.txt")
    assert files == (tmp_path / "b.txt", tmp_path / "a.txt")
    assert _contents(tmp_path) == {
        "a.txt": b"new a",
        "b.txt": b"new b",
        "other.txt": b"not of the set",
    }


def test_a_second_writer_is_refused_at_once_naming_the_holder(tmp_path):
    out = tmp_path / "run"
    run_case("poiseuille", n=8, steps=200, out_dir=out, checkpoint_every=100)
    checkpoints = _contents(out / "checkpoints")
    with folder_lock(out) as lock:
        assert lock == out / LOCK_FILE
        # another process: a resume of the folder is refused, not run
        argv = [sys.executable, "-m", "lbm_jax", "run", "--resume", str(out)]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2, proc.stderr
        assert f"is in use by another run (pid {os.getpid()} on " in proc.stderr
        assert "Traceback" not in proc.stderr
        # this process, through the API: an overwriting run is refused too
        with pytest.raises(FolderInUseError, match=f"pid {os.getpid()}") as info:
            run_case("poiseuille", n=8, steps=200, out_dir=out, overwrite=True)
        assert info.value.holder["pid"] == os.getpid()
        assert info.value.holder["command"]
    assert _contents(out / "checkpoints") == checkpoints
    assert not (out / LOCK_FILE).exists()


def test_the_lock_is_released_when_its_holder_is_killed(tmp_path):
    hold = (
        "import sys, time\n"
        "from lbm_jax.io._outputs import folder_lock\n"
        "with folder_lock(sys.argv[1]):\n"
        "    print('held', flush=True)\n"
        "    time.sleep(600)\n"
    )
    argv = [sys.executable, "-c", hold, str(tmp_path)]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout.readline() == "held\n"
            with pytest.raises(FolderInUseError, match=f"pid {proc.pid} on "):
                with folder_lock(tmp_path):
                    pass
        finally:
            proc.kill()
    with folder_lock(tmp_path):  # the kernel dropped the killed holder's lock
        assert (tmp_path / LOCK_FILE).is_file()
    assert list(tmp_path.iterdir()) == []
