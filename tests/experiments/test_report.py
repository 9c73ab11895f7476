"""Report helpers: tables, number formatting, figures."""

from __future__ import annotations

import math
import types

import numpy as np
import pytest

from experiments import _amp_report, _lbm_performance_report, lbm_performance
from experiments._report import (
    fmt,
    markdown_table,
    new_figure,
    run_caption,
    save_figure,
)


def test_fmt_special_values():
    assert fmt(None) == "n/a" and fmt(math.nan) == "n/a"
    assert fmt(math.inf) == "inf" and fmt(-math.inf) == "-inf"
    assert fmt(True) == "yes" and fmt(3) == "3" and fmt(1234.5678) == "1.23e+03"


def test_markdown_table_alignment_and_row_check():
    table = markdown_table(["name", "value"], [["a", 1.0], ["b", None]])
    assert table.splitlines()[1] == "|---|---:|"
    assert table.splitlines()[3] == "| b | n/a |"
    with pytest.raises(ValueError, match="has 1 cells; expected 2"):
        markdown_table(["name", "value"], [["a"]])


def test_save_figure_writes_png(tmp_path):
    fig, axes = new_figure(1, 2)
    assert axes.shape == (1, 2)
    axes[0, 0].plot([0, 1], [1, 0])
    path = save_figure(fig, tmp_path / "f.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_save_figure_caption_goes_under_the_title(tmp_path):
    env = {"scale": "quick", "backend": "cpu", "cpu_model": "X", "cpu_count": 2}
    caption = run_caption(env)
    assert caption == "quick scale, CPU: X (2 logical CPUs)"
    fig, _ = new_figure()
    fig.suptitle("Case, 32 x 32 cells")
    save_figure(fig, tmp_path / "a.png", caption=caption)
    assert fig.get_suptitle() == f"Case, 32 x 32 cells\n{caption}"
    bare, _ = new_figure()
    save_figure(bare, tmp_path / "b.png", caption=caption)
    assert bare.get_suptitle() == caption


def _capture(monkeypatch, module):
    saved = {}

    def save(fig, path, **kw):
        saved[path.name] = fig
        return path

    monkeypatch.setattr(module, "save_figure", save)
    return saved


def test_mlups_figure_linear_from_zero_legend_in_bar_order(monkeypatch, tmp_path):
    storages = ["FP64/FP64", "FP32/FP32", "FP32/FP16S"]
    rows = [
        {
            "lattice": lattice,
            "n": n,
            "storage": s,
            "mlups": mlups * (1 + j),
            "roofline_mlups": 2 * mlups * (1 + j),
            "roofline_fraction": 0.5,
        }
        for lattice, n, mlups in (("D2Q9", 2048, 300.0), ("D3Q19", 128, 40.0))
        for j, s in enumerate(storages)
    ]
    saved = _capture(monkeypatch, _lbm_performance_report)
    _lbm_performance_report.figure(rows, tmp_path)
    fig = saved["mlups.png"]
    for ax in fig.axes:
        assert ax.get_yscale() == "linear" and ax.get_ylim()[0] == 0
    d3q19 = fig.axes[1]
    assert d3q19.get_title() == "D3Q19, 128^3 cells"
    assert [t.get_text() for t in d3q19.get_xticklabels()] == storages
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == [*storages, "bandwidth roofline"]
    colours = [p.get_facecolor() for p in d3q19.patches]
    assert [h.get_facecolor() for h in fig.legends[0].legend_handles[:3]] == colours


def test_amp_loss_curves_draw_every_policy_in_its_own_style(monkeypatch, tmp_path):
    steps = np.arange(40.0)
    policies = ["float32", "mixed_bfloat16", "mixed_float16", "fp8"]
    runs = {
        p: types.SimpleNamespace(
            losses=np.exp(-steps / 10) + 1e-4 * i, loss_scales=np.ones(40)
        )
        for i, p in enumerate(policies)
    }
    saved = _capture(monkeypatch, _amp_report)
    _amp_report.figures(tmp_path, {"mlp": runs})
    top = saved["loss_curves.png"].axes[0]
    styles = {(line.get_linestyle(), line.get_marker()) for line in top.lines}
    assert len(top.lines) == len(styles) == len(policies)
    legend = saved["loss_curves.png"].legends[0].get_texts()
    assert [t.get_text() for t in legend] == policies


def test_fluidx3d_comparison_uses_largest_d3q19_grid():
    rows = [
        {"lattice": "D3Q19", "n": 64, "storage": "FP32/FP32", "mlups": 1.0},
        {"lattice": "D3Q19", "n": 256, "storage": "FP32/FP32", "mlups": 11528.0},
        {"lattice": "D3Q19", "n": 256, "storage": "FP32/FP16S", "mlups": 36610.0},
        {"lattice": "D2Q9", "n": 4096, "storage": "FP32/FP32", "mlups": 9e9},
    ]
    table = {r[0]: r for r in lbm_performance.fluidx3d_rows(rows)}
    assert set(table) == set(lbm_performance.FLUIDX3D_H200_MLUPS)
    assert table["FP32/FP32"][2] == 11528.0 and table["FP32/FP32"][3] == 0.5
    assert table["FP32/FP16S"][3] == 1.0
    assert table["FP32/FP16C"][2] is None and math.isnan(table["FP32/FP16C"][3])


def test_settings_reject_unknown_scale():
    with pytest.raises(ValueError, match="'huge'"):
        lbm_performance.settings_for("huge")
    assert lbm_performance.settings_for("quick").steps("D3Q19", 64) >= 4
