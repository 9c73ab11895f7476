"""LBM accuracy figures are readable: words, units, distinct colours, clear legends."""

from __future__ import annotations

import math

import numpy as np
from matplotlib.colors import to_rgba

from experiments import _lbm_figures
from experiments.lbm_accuracy import RUNS_ALL, storage_label
from lbm_jax import get_storage


def _records(**summary):
    t = np.arange(0.0, 200.0, 10.0)
    out = []
    for i, (storage, shift) in enumerate(RUNS_ALL):
        out.append(
            {
                "label": storage_label(storage, shift),
                "storage": get_storage(storage).name,
                "shift": shift,
                "stable": storage != "bf16" or shift,
                "summary": {"u_ref": 0.04, "decay_rate_exact": 1e-3, **summary},
                "err_vs_fp64": 0.0 if i == 0 else 10.0 ** -(8 - i % 5),
                "history": {
                    "t": t,
                    "amplitude": 0.04 * np.exp(-1e-3 * t) * (1 + 1e-6 * i),
                    "cl": np.sin(0.1 * t + i),
                },
            }
        )
    return out


def _legend_outside_axes(fig):
    return not any(ax.get_legend() for ax in fig.axes) and fig.legends


def test_taylor_green_one_colour_per_storage_and_legend_off_the_data():
    records = _records()
    fig = _lbm_figures.build_taylor_green_figure(records)
    ax = fig.axes[0]
    colour = {}
    for line in ax.lines:
        label = line.get_label()
        if label.startswith("exact"):
            continue
        storage = label.rsplit(" ", 1)[0] if label.endswith((" S", " -")) else label
        colour.setdefault(storage, set()).add(to_rgba(line.get_color()))
    assert all(len(c) == 1 for c in colour.values()), "shifted/unshifted share one"
    distinct = {next(iter(c)) for c in colour.values()}
    assert len(distinct) == len(colour) == len({s for s, _ in RUNS_ALL})
    assert _legend_outside_axes(fig)
    assert all(a.get_xlabel() and a.get_ylabel() for a in fig.axes[:2])


def test_error_figure_titles_in_words_labelled_axes_and_zero_marked():
    records = _records(l2_error=1e-3)
    fig = _lbm_figures.build_error_figure(
        {"poiseuille": records, "taylor_green": records},
        {"poiseuille": "l2_error", "taylor_green": "l2_error"},
    )
    for ax in fig.axes:
        assert "_" not in ax.get_title(), ax.get_title()
        assert ax.get_ylabel() and "_" not in ax.get_ylabel()
    vs_fp64 = fig.axes[1]
    assert any(t.get_text() == "0" for t in vs_fp64.texts), "zero bar is marked"
    assert any(bar.get_hatch() == "//" for bar in vs_fp64.patches), "unstable run"
    assert _legend_outside_axes(fig) and not fig.get_suptitle()


def test_cylinder_strouhal_zoomed_to_show_a_few_percent_gap():
    records = _records()
    for i, r in enumerate(records):
        r["summary"]["strouhal"] = 0.29 + 0.001 * i if i != 3 else None
    fig = _lbm_figures.build_cylinder_figure(records, case="cylinder")
    ax_st = fig.axes[1]
    low, high = ax_st.get_ylim()
    assert low > 0.2 and high < 0.4, "a bar axis from zero hides the gap"
    assert any(t.get_text() == "n/a" for t in ax_st.texts)
    assert "Schaefer-Turek" in fig.axes[0].get_title()
    assert "Karman" not in fig.axes[0].get_title()
    assert _legend_outside_axes(fig)
    unconfined = _lbm_figures.build_cylinder_figure(records, case="cylinder_unconfined")
    assert "Karman" in unconfined.axes[0].get_title()
    assert math.isfinite(low)
