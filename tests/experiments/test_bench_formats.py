"""The format benchmark's command line: JSON path checked first, exit status."""

from __future__ import annotations

import json

import pytest

from experiments import bench_formats

TINY = ["--log2n", "4", "--repeats", "1", "--formats", "float16"]


def test_json_under_a_file_is_refused_before_measuring(tmp_path, monkeypatch):
    def no_bench(*args, **kwargs):
        raise AssertionError("measured before the JSON path was checked")

    monkeypatch.setattr(bench_formats, "bench", no_bench)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SystemExit) as exc:
        bench_formats.main([*TINY, "--json", str(blocker / "x.json")])
    assert exc.value.code == 2


def test_json_parent_directories_are_created(tmp_path, monkeypatch):
    monkeypatch.setitem(bench_formats.TARGETS, "float16", 1e9)
    path = tmp_path / "missing_dir" / "x.json"
    assert bench_formats.main([*TINY, "--json", str(path)]) == 0
    assert json.loads(path.read_text())["rows"][0]["name"] == "float16"


def test_missed_target_exits_non_zero(monkeypatch, capsys):
    monkeypatch.setitem(bench_formats.TARGETS, "float16", 1e-9)
    assert bench_formats.main(TINY) == 1
    assert "float16" in capsys.readouterr().err
