"""LBM accuracy figures are readable: words, units, distinct colours, clear legends."""

from __future__ import annotations

import math

import numpy as np
import pytest
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
    assert "1e-16" not in fig.axes[1].get_ylabel()
    assert "label suffix S: DDF-shifted" in fig.legends[0].get_title().get_text()
    # with the grid size known, the shared offset is explained in the panel
    fig = _lbm_figures.build_taylor_green_figure(_records(n=32))
    (note,) = fig.axes[1].texts
    assert "k^2/6 = 0.64% at n = 32" in note.get_text()


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


def _free_surface_records(runs, **summary):
    """Stable raindrop-like records, one per run, FP32 first, after comparison."""
    t = np.linspace(0.0, 3.0, 12)
    out = []
    for i, (storage, shift) in enumerate(runs):
        slices = np.stack([np.full((10, 6), 0.1 * i + k / 12) for k in range(len(t))])
        out.append(
            {
                "label": storage_label(storage, shift),
                "storage": get_storage(storage).name,
                "shift": shift,
                "stable": True,
                "summary": {
                    "amplitude": 1.0,
                    "damping_theory": 1e-3,
                    "ceiling_height": 2.25,
                    **summary,
                },
                "history": {
                    "t_impact": t,
                    "crown_radius": 8.0 * np.sqrt(1.0 + t) + i,
                    "crown_height": 4.0 * t,
                    "cavity_depth": 6.0 * t,
                    "slices": slices,
                    "t": 100.0 * t,
                    "amplitude": np.exp(-0.3 * t) * np.cos(t + 0.01 * i),
                },
                "l1_slices": None if i == 0 else 1e-3 * i * (1.0 + t),
                "l1_final": 0.0 if i == 0 else 2e-3 * i,
            }
        )
    return out


def _panels(fig):
    """The visible data axes of ``fig`` (no colour bars, no hidden panels)."""
    return [a for a in fig.axes if a.get_visible() and a.get_label() != "<colorbar>"]


def _line_colours(fig):
    return {
        line.get_label(): to_rgba(line.get_color())
        for ax in fig.axes
        for line in ax.lines
        if not line.get_label().startswith("_")
    }


def test_free_surface_figures_labelled_with_legends_and_one_colour_per_format():
    from experiments import _free_surface_figures as figures
    from experiments.lbm_raindrop import settings_for

    st, reference = settings_for("standard"), get_storage("fp32").name
    records = _free_surface_records(st.runs)
    wave = _free_surface_records(
        st.runs_2d, frequency_theory=1.0, frequency_error=0.02, damping_error=0.03
    )
    drops = {12.0: _free_surface_records(st.runs_2d, laplace_error=0.01)}
    for r in drops[12.0]:
        r["summary"]["spurious_velocity"] = 1e-5
    built = {
        "crown": figures.build_raindrop_crown_figure(records, st),
        "difference": figures.build_raindrop_difference_figure(
            records, st, 1e-3, reference=reference
        ),
        "slices": figures.build_raindrop_slices_figure(records, reference=reference),
        "2-D": figures.build_free_surface_2d_figure(drops, wave, st),
    }
    for name, fig in built.items():
        panels = _panels(fig)
        assert panels, name
        for ax in panels:
            assert ax.get_xlabel() and ax.get_ylabel(), (name, ax.get_title())
            assert ax.get_ylabel().endswith(")"), "units in the y label"
        assert fig.get_suptitle() or all(ax.get_title() for ax in panels), name
        assert "_" not in fig.get_suptitle(), name
    for name in ("crown", "difference", "2-D"):
        assert _legend_outside_axes(built[name]), name
        (legend,) = built[name].legends
        texts = [t.get_text() for t in legend.get_texts()]
        assert len(texts) == len(set(texts)), texts
        drawn = records[1:] if name == "difference" else records  # not FP32 - FP32
        assert {r["label"] for r in drawn} <= set(texts), (name, texts)
    # the crown height's reference: the box's ceiling, 2.25 D above the pool
    ceiling = [
        line
        for ax in built["crown"].axes
        for line in ax.lines
        if line.get_label().startswith("the box's ceiling")
    ]
    assert len(ceiling) == 1 and list(ceiling[0].get_ydata()) == [2.25, 2.25]
    # The slice images carry labelled colour bars in place of a legend.
    bars = [a for a in built["slices"].axes if a.get_label() == "<colorbar>"]
    assert len(bars) == 2 * len(records) - 1
    assert all(bar.get_ylabel() for bar in bars)
    # Every storage format has one colour, the same in every figure.
    crown, difference, two_d = (
        _line_colours(built[k]) for k in ("crown", "difference", "2-D")
    )
    labels = [r["label"] for r in records]
    assert len({crown[k] for k in labels}) == len(labels)
    for label in labels[1:]:
        assert difference[label] == crown[label], label
    for label in labels:
        assert two_d[label] == crown[label], label


def _cylinder_flow(nx=60, ny=40, d=8.0, phase=0.0):
    """A shedding-like velocity around a disc of diameter ``d`` and its mask."""
    x, y = np.meshgrid(np.arange(nx), np.arange(ny), indexing="ij")
    body = (x - 15.0) ** 2 + (y - ny / 2) ** 2 <= (d / 2) ** 2
    u = np.stack(
        [0.05 + 0.01 * np.sin(0.3 * x + phase), 0.01 * np.cos(0.2 * x - 0.1 * y)]
    )
    return u * ~body, body


def _outlines(ax):
    """Contour lines drawn on ``ax`` (the solid's outline)."""
    from matplotlib.contour import ContourSet

    return [c for c in ax.collections if isinstance(c, ContourSet)]


def _units_in_colour_bar(fig):
    bars = [a for a in fig.axes if a.get_label() == "<colorbar>"]
    return bars and all("1/time step" in bar.get_ylabel() for bar in bars)


def test_vorticity_figure_draws_the_cylinder_with_units():
    from lbm_jax.io import _plot

    u, body = _cylinder_flow()
    fig = _plot.vorticity_figure(u, solid=body)
    ax = _panels(fig)[0]
    assert len(_outlines(ax)) == 1, "the cylinder's outline"
    assert _units_in_colour_bar(fig)
    assert ax.get_xlabel() == "x (cells)" and ax.get_ylabel() == "y (cells)"
    # The colour range follows the fluid, not the zero velocity inside the body.
    low, high = ax.images[0].get_clim()
    assert low == -high and high > 0
    plain = _plot.vorticity_figure(u)
    assert not _outlines(_panels(plain)[0]) and _units_in_colour_bar(plain)
    with pytest.raises(ValueError, match="solid mask has shape"):
        _plot.vorticity_figure(u, solid=body[:-1])


def test_cylinder_vorticity_figure_one_scale_cylinder_in_every_panel():
    records = []
    for i, (storage, shift) in enumerate((("fp32", True), ("fp16s", True))):
        u, body = _cylinder_flow(phase=float(i))
        records.append(
            {
                "label": storage_label(storage, shift),
                "stable": True,
                "summary": {"steps": 1000},
                "fields": {"u": u},
                "history": {"body": body},
            }
        )
    records.append({"label": "FP32/FP16 -", "stable": False, "fields": None})
    fig = _lbm_figures.build_vorticity_figure(records, case="cylinder_unconfined")
    panels = _panels(fig)
    assert [ax.get_title().split(",")[0] for ax in panels] == [
        r["label"] for r in records[:2]
    ], "unstable runs are left out"
    for ax in panels:
        assert len(_outlines(ax)) == 1, ax.get_title()
        assert ax.get_xlabel() == "x (cells)" and ax.get_ylabel() == "y (cells)"
    assert len({ax.images[0].get_clim() for ax in panels}) == 1, "one colour scale"
    assert _units_in_colour_bar(fig)
    assert "Karman" in fig.get_suptitle()


def test_error_figure_legend_lists_unstable_only_when_a_run_was():
    records = _records(l2_error=1e-3)
    studies = {"poiseuille": records, "taylor_green": records}
    keys = {"poiseuille": "l2_error", "taylor_green": "l2_error"}
    labels = [
        t.get_text()
        for t in _lbm_figures.build_error_figure(studies, keys).legends[0].get_texts()
    ]
    assert labels == ["DDF-shifted", "unshifted", "unstable"]
    stable = [{**r, "stable": True} for r in records if r["shift"]]
    fig = _lbm_figures.build_error_figure(
        {"poiseuille": stable, "taylor_green": stable}, keys
    )
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["DDF-shifted"]


def _cavity_records(n=16):
    rng = np.random.default_rng(0)
    base = rng.normal(size=(2, n, n)) * 0.01
    out = []
    for i, (storage, shift) in enumerate(
        (("fp64", True), ("fp32", True), ("fp16", False), ("fp16s", True))
    ):
        u = base + 10.0 ** -(9 - 2 * i) * (i > 0)
        out.append(
            {
                "label": storage_label(storage, shift),
                "storage": get_storage(storage).name,
                "shift": shift,
                "stable": True,
                "re": 100,
                "n": n,
                "summary": {"u_ref": 0.1},
                "fields": {"u": u},
            }
        )
    return out


def test_cavity_figure_shows_the_difference_to_fp64_where_the_profiles_coincide():
    records = _cavity_records()
    records.append({**records[-1], "label": "X", "stable": False, "fields": None})
    fig = _lbm_figures.build_cavity_figure(records)
    ax_u, ax_v, dif_u, dif_v = fig.axes[:4]
    assert "16 x 16 cells" in ax_u.get_title() and "Re = 100" in ax_u.get_title()
    assert "unstable, not drawn: X" in ax_u.get_title()
    assert dif_u.get_xscale() == "log" and dif_v.get_yscale() == "log"
    assert "FP64" in dif_u.get_xlabel()
    # one difference curve per run besides the reference, each a different colour
    assert len(dif_u.lines) == len(dif_v.lines) == 3
    assert len({line.get_color() for line in dif_u.lines}) == 3
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == [r["label"] for r in records[:4]] + ["Ghia et al. 1982"]
