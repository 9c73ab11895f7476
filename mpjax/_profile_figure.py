"""The figure of a `ProfileReport`: records x binary exponent heat map."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from mpjax.formats import get_format

__all__ = ["ExponentCounts", "range_figure"]


class ExponentCounts(Protocol):
    """What the figure reads from a report such as a `ProfileReport`: records with
    a ``histogram`` of counts per exponent and a ``label``, and the exponents the
    histogram bins stand for."""

    @property
    def records(self) -> Sequence[Any]: ...

    def exponents(self) -> np.ndarray: ...


def _exponent_range(fmt: Any) -> tuple[int, int]:
    return math.floor(math.log2(fmt.min_subnormal)), math.floor(math.log2(fmt.max))


def range_figure(
    report: ExponentCounts,
    formats: tuple[str, ...],
    *,
    title: str | None = None,
    row_labels: tuple[str, ...] | None = None,
    row_axis: str | None = None,
) -> Any:
    """Heat map of log10 counts per record and exponent, with format ranges.

    Each format is drawn as a labelled band from floor(log2 min_subnormal) to
    floor(log2 max), with a dashed line at its smallest normal exponent.
    `title`, `row_labels` (one per record) and `row_axis` (the y-axis label)
    replace the defaults, which describe the records of a program profile.
    """
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    fmts = [get_format(name) for name in formats]
    counts = np.array([r.histogram for r in report.records], np.float64)
    exps = report.exponents()
    n = len(report.records)
    fig = Figure(figsize=(9.0, 2.0 + 0.18 * min(n, 60)), layout="constrained")
    ax = fig.add_subplot()
    logc = np.where(counts > 0, np.log10(np.maximum(counts, 1.0)), np.nan)
    image = ax.imshow(
        logc,
        aspect="auto",
        interpolation="nearest",
        cmap="viridis",
        extent=(exps[0] - 0.5, exps[-1] + 0.5, n - 0.5, -0.5),
    )
    fig.colorbar(image, ax=ax, label="log10 number of values")
    handles = []
    for j, fmt in enumerate(fmts):
        colour = f"C{j % 10}"
        low, high = _exponent_range(fmt)
        ax.axvspan(low - 0.5, high + 0.5, ymin=0, ymax=1, color=colour, alpha=0.06)
        for x in (low - 0.5, high + 0.5):
            ax.axvline(x, color=colour, linewidth=1.2)
        if fmt.min_normal is not None:
            ax.axvline(
                math.log2(fmt.min_normal) - 0.5, color=colour, linestyle="--", lw=1.0
            )
        ax.text(
            high + 0.4,
            0.97 - 0.06 * j,
            fmt.name,
            color=colour,
            fontsize=7,
            ha="right",
            va="top",
            transform=ax.get_xaxis_transform(),
            clip_on=True,
        )
        handles.append(
            Line2D([], [], color=colour, label=f"{fmt.name}: smallest to largest")
        )
    handles.append(
        Line2D([], [], color="grey", linestyle="--", label="smallest normal value")
    )
    used = np.flatnonzero(counts.sum(axis=0))
    ends = [exps[used[0]], exps[used[-1]]] if used.size else []
    ends += [e for fmt in fmts for e in _exponent_range(fmt)]
    if ends:
        ax.set_xlim(min(ends) - 2, max(ends) + 2)
    ax.set_yticks(range(n))
    if row_labels is None:
        row_labels = tuple(r.label[:40] for r in report.records)
    elif len(row_labels) != n:
        raise ValueError(
            f"row_labels has {len(row_labels)} entries for {n} records; pass one "
            "label per record"
        )
    ax.set_yticklabels(row_labels, fontsize=6)
    ax.set_xlabel("binary exponent floor(log2|x|)")
    ax.set_ylabel(row_axis or "recorded value (evaluation order)")
    ax.set_title(
        title or "Number range of every floating-point value, with format ranges"
    )
    ax.legend(handles=handles, fontsize=7, loc="lower right")
    return fig
