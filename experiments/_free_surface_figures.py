"""Figures of the free-surface study (see :mod:`experiments.lbm_raindrop`).

Every builder takes the study's run records (dicts with ``label``, ``storage``,
``stable``, ``summary`` and ``history``; raindrop records after
:func:`experiments.lbm_raindrop.compare_raindrop`) and the scale's settings, and
returns a figure for the pipeline to save. Each storage format keeps one colour in
every figure: the study's formats in run order, coloured by
:func:`experiments._lbm_figures.distinct_colours`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from experiments._lbm_figures import LABEL_KEY, distinct_colours, metric
from experiments._report import new_figure
from experiments.lbm_accuracy import storage_label
from lbm_jax.cases.free_surface import RAINDROP
from lbm_jax.io._plot import ceiling_line, vertical_label

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from experiments._raindrop_settings import Settings

__all__ = [
    "build_free_surface_2d_figure",
    "build_raindrop_crown_figure",
    "build_raindrop_difference_figure",
    "build_raindrop_slices_figure",
]

Records = list[dict[str, Any]]

_TIME = "time after contact t U / D (-)"


def _format_colours(st: Settings) -> dict[str, Any]:
    """One colour per storage label of the study, in run order (raindrop first)."""
    labels = dict.fromkeys(storage_label(s, sh) for s, sh in (*st.runs, *st.runs_2d))
    return dict(zip(labels, distinct_colours(len(labels)), strict=True))


def _drawn(records: Records, key: str) -> Records:
    """The stable records whose history holds ``key``."""
    return [r for r in records if r["stable"] and key in r.get("history", {})]


def _legend_below(fig: Figure, axes: Iterable[Any], ncol: int = 4) -> None:
    """One legend under the panels, clear of the data: each label once."""
    entries: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    if entries:
        fig.legend(
            list(entries.values()),
            list(entries),
            loc="outside lower center",
            ncol=min(ncol, len(entries)),
            fontsize="small",
            title=LABEL_KEY,
            title_fontsize="x-small",
        )


def _ms_axis(ax: Any) -> None:
    """A top axis in milliseconds after contact for a t U / D axis."""
    k = 1e3 * RAINDROP["diameter"] / RAINDROP["speed"]
    top = ax.secondary_xaxis("top", functions=(lambda x: x * k, lambda x: x / k))
    top.set_xlabel("time after contact (ms)")


def build_raindrop_crown_figure(records: Records, st: Settings) -> Figure:
    """Crown radius, crown height and cavity depth over time, per storage format."""
    fig, axes = new_figure(1, 3, size=(4.6, 4.0))
    colour = _format_colours(st)
    panels = (
        ("crown_radius", "crown radius / D (-)"),
        ("crown_height", "crown height above the pool / D (-)"),
        ("cavity_depth", "cavity depth below the pool / D (-)"),
    )
    for ax, (key, label) in zip(axes[0], panels, strict=True):
        drawn = _drawn(records, key)
        for r in drawn:
            h = r["history"]
            y = np.asarray(h[key], np.float64) / st.raindrop_n
            ax.plot(h["t_impact"], y, color=colour[r["label"]], label=r["label"])
        if key == "crown_height" and drawn:
            # the highest a crown can stand (heights in D)
            ceiling_line(ax, drawn[0]["summary"]["ceiling_height"])
        ax.set_xlabel(_TIME)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        _ms_axis(ax)
    _legend_below(fig, axes.flat)
    fig.suptitle(
        f"Raindrop splash per storage format: crown and cavity over time "
        f"(D = {st.raindrop_n} cells)"
    )
    return fig


def build_raindrop_difference_figure(
    records: Records, st: Settings, motion: float, *, reference: str
) -> Figure:
    """Mid-plane L1 difference of the fill level to the ``reference`` run over time.

    The final 3-D field's difference is a point at the last sample; the bounds and
    the reference run's own change per sample interval (``motion``, when finite)
    are horizontal lines.
    """
    fig, axes = new_figure(1, 1, size=(7.0, 4.4))
    ax = axes[0, 0]
    colour = _format_colours(st)
    floor = 1e-9
    for r in records:
        if r["storage"] == reference or r["l1_slices"] is None:
            continue
        t = np.asarray(r["history"]["t_impact"], np.float64)
        c = colour[r["label"]]
        ax.semilogy(t, np.maximum(r["l1_slices"], floor), color=c, label=r["label"])
        if math.isfinite(r["l1_final"]):
            ax.semilogy(
                t[-1],
                max(r["l1_final"], floor),
                "o",
                color=c,
                label=f"{r['label']}, final 3-D field",
            )
    ax.axhline(
        st.l1_slice_bound, color="tab:red", linestyle=":", label="bound, mid-plane"
    )
    ax.axhline(
        st.l1_final_bound, color="tab:red", linestyle="-.", label="bound, final field"
    )
    if math.isfinite(motion):
        ax.axhline(
            motion,
            color="tab:gray",
            linestyle="--",
            label="FP32's own change per sample interval (median)",
        )
    ax.set_xlabel(_TIME)
    ax.set_ylabel(f"mean |phi - phi(FP32)| (-; floored at {floor:g})")
    ax.set_title("Raindrop: fill-level difference to FP32 (mid-plane, over time)")
    ax.grid(alpha=0.3, which="both")
    _ms_axis(ax)
    _legend_below(fig, [ax], ncol=2)
    return fig


def build_raindrop_slices_figure(records: Records, *, reference: str) -> Figure:
    """Final mid-plane fill level per format (top) and its difference (bottom)."""
    shown = _drawn(records, "slices")
    ref = next((r for r in shown if r["storage"] == reference), None)
    fig, axes = new_figure(2, max(len(shown), 1), size=(4.0, 3.6))
    for ax in axes.flat:
        ax.set_visible(False)
    last = {
        r["label"]: np.asarray(r["history"]["slices"][-1], np.float64) for r in shown
    }
    diffs = [
        last[r["label"]] - last[ref["label"]]
        for r in shown
        if ref is not None and r is not ref
    ]
    vmax = max([float(np.abs(d).max()) for d in diffs] + [1e-6])
    for col, r in enumerate(shown):
        final = last[r["label"]]
        t = float(r["history"]["t_impact"][-1])
        panels = [(axes[0, col], final, f"{r['label']}, t U / D = {t:.2f}")]
        if ref is not None and r is not ref:
            diff = final - last[ref["label"]]
            panels.append((axes[1, col], diff, f"{r['label']} minus {reference}"))
        for ax, image, title in panels:
            ax.set_visible(True)
            top = image is final
            im = ax.imshow(
                image.T,
                origin="lower",
                cmap="Blues" if top else "RdBu_r",
                vmin=0 if top else -vmax,
                vmax=1 if top else vmax,
            )
            ax.set_title(title, fontsize="small")
            dims = r.get("summary", {}).get("dims", 3)
            ax.set(xlabel="x (cells)", ylabel=vertical_label(dims))
            name = "fill level phi (-)" if top else "phi - phi(FP32) (-)"
            fig.colorbar(im, ax=ax, label=name, shrink=0.8)
    fig.suptitle("Raindrop: final mid-plane fill level per format, and its difference")
    return fig


def _values(
    records: Records, labels: Sequence[str], key: str, factor: float = 1.0
) -> list[float]:
    """``factor * metric`` per storage label (NaN for a missing run)."""
    by_label = {r["label"]: r for r in records}
    return [
        factor * metric(by_label[k], key) if k in by_label else math.nan for k in labels
    ]


def _per_format(
    ax: Any,
    labels: Sequence[str],
    colour: Mapping[str, Any],
    series: dict[str, list[float]],
    bound: float | None,
    markers: str,
    **text: str,
) -> None:
    """Points per storage format in its colour, a marker per series, the bound.

    The series' markers (black in the legend) and the bound are labelled for the
    figure's legend.
    """
    for i, (name, values) in enumerate(series.items()):
        marker = markers[i % len(markers)]
        x = np.arange(len(labels)) + 0.1 * (i - (len(series) - 1) / 2)
        for xi, label, value in zip(x, labels, values, strict=True):
            ax.plot(xi, value, marker, color=colour[label])
        ax.plot([], [], marker, color="k", label=name)
    if bound is not None:
        ax.axhline(bound, color="tab:red", linestyle=":", label="bound")
        ax.set_ylim(bottom=0)
    else:
        ax.set_yscale("log")
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right")
    for tick, label in zip(ax.get_xticklabels(), labels, strict=True):
        tick.set_color(colour[label])
    ax.set_xlim(-0.5, len(labels) - 0.5)
    ax.set(xlabel="storage format", **text)
    ax.grid(axis="y", alpha=0.3)


def build_free_surface_2d_figure(
    drops: Mapping[float, Records], wave: Records, st: Settings
) -> Figure:
    """Static drops (Laplace error, spurious currents) and the capillary wave.

    One legend under the panels: the formats' colours, the series' markers (drop
    radii, frequency and damping), Lamb's mode and the bounds.
    """
    fig, axes = new_figure(1, 4, size=(4.4, 4.0))
    colour = _format_colours(st)
    labels = [storage_label(s, sh) for s, sh in st.runs_2d]
    radii = {f"R = {radius:g} cells": records for radius, records in drops.items()}
    _per_format(
        axes[0, 0],
        labels,
        colour,
        {k: _values(v, labels, "laplace_error", 100) for k, v in radii.items()},
        100 * st.laplace_tol,
        "osD",
        ylabel="Laplace pressure error (%)",
        title=f"Static {st.drop_dims}-D drop: Laplace law",
    )
    _per_format(
        axes[0, 1],
        labels,
        colour,
        {k: _values(v, labels, "spurious_velocity") for k, v in radii.items()},
        None,
        "osD",
        ylabel="largest |u| (lattice units)",
        title="Static drop: spurious currents",
    )
    ax = axes[0, 2]
    drawn = _drawn(wave, "amplitude")
    for r in drawn:
        h = r["history"]
        ax.plot(h["t"], h["amplitude"], color=colour[r["label"]], label=r["label"])
    if drawn:
        s = drawn[0]["summary"]
        t = np.linspace(0.0, float(drawn[0]["history"]["t"][-1]), 400)
        a = s["amplitude"] * np.exp(-s["damping_theory"] * t)
        ax.plot(t, a * np.cos(s["frequency_theory"] * t), "k--", lw=1, label="Lamb")
    ax.set(
        xlabel="time step",
        ylabel="amplitude of the surface mode (cells)",
        title=f"Capillary wave, wavelength {st.wave_n} cells",
    )
    ax.grid(alpha=0.3)
    _per_format(
        axes[0, 3],
        labels,
        colour,
        {
            "frequency": _values(wave, labels, "frequency_error", 100),
            "damping rate": _values(wave, labels, "damping_error", 100),
        },
        100 * st.wave_tol,
        "^v",
        ylabel="error against Lamb's normal mode (%)",
        title="Capillary wave: frequency and damping",
    )
    _legend_below(fig, axes.flat, ncol=5)
    fig.suptitle("Static drop and capillary wave per storage format")
    return fig
