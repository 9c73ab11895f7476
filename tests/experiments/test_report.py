"""Report helpers: tables, number formatting, figures."""

from __future__ import annotations

import math

import pytest

from experiments import lbm_performance
from experiments._report import fmt, markdown_table, new_figure, save_figure


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
