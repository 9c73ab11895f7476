"""Figures of the inverse-design study (see :mod:`experiments.inverse_design`).

Each takes the study's results (and its channel) and the grid in words for its
title; :func:`experiments._report.save_figure` adds the run's caption.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

import lbm_jax
from experiments._report import new_figure
from lbm_jax.io._plot import signed_field_image

__all__ = ["force_figure", "loss_figure", "profile_figure"]

_LOSS_LABEL = "loss (dimensionless):\nmean (u_x - target)² / mean target²"


def loss_figure(results: dict[str, Any], words: str, drop: float) -> Figure:
    """The FP16S loss per adam iteration (log scale), the FP32 losses of the
    initial and the final design, and the loss the check asks for (``drop``
    times below the initial one)."""
    fig, axes = new_figure(size=(6.4, 4.2))
    ax = axes[0, 0]
    losses = np.asarray(results["losses_fp16s"])
    its = np.arange(losses.size)
    ax.semilogy(its, losses, marker=".", label="FP16S storage (gradients through it)")
    ax.semilogy(
        [0, its[-1]],
        [results["loss_initial_fp32"], results["loss_final_fp32"]],
        "s",
        color="tab:orange",
        label="FP32 storage: initial and final design re-run",
    )
    ax.axhline(
        losses[0] / drop,
        color="0.4",
        ls=":",
        label=f"check: {drop:g}x below the initial loss",
    )
    ax.set_xlabel("adam iteration")
    ax.set_ylabel(_LOSS_LABEL)
    ax.legend()
    ax.set_title(f"Loss per iteration\n({words}, FP16S storage)")
    return fig


def force_figure(channel: Any, results: dict[str, Any], words: str) -> Figure:
    """Both components of the optimised control force over the channel, the
    walls grey, the control region outlined and the probe column dashed."""
    force = np.asarray(results["control_force"])
    solid = channel.cell_type == int(lbm_jax.CellType.SOLID)
    nx, ny = channel.shape
    fig, axes = new_figure(2, 1, size=(1.5 + 5.5 * nx / (2 * ny), 3.0))
    xs = np.flatnonzero(channel.control.any(axis=1))
    ys = np.flatnonzero(channel.control.any(axis=0))
    for ax, component, name in zip(axes[:, 0], force, ("F_x", "F_y"), strict=True):
        image = signed_field_image(ax, component, solid=solid, limit=channel.scale)
        ax.add_patch(
            Rectangle(
                (xs[0] - 0.5, ys[0] - 0.5),
                xs.size,
                ys.size,
                fill=False,
                ec="black",
                lw=1.0,
                label="control region",
            )
        )
        ax.axvline(
            channel.probe_x, color="tab:green", ls="--", label="outflow read here"
        )
        fig.colorbar(image, ax=ax, label=f"control force {name} (lattice units)")
        ax.set_title(f"{name} (walls grey, bound ±{channel.scale:.2g})")
        ax.legend(loc="upper right", fontsize="small")
    fig.suptitle(f"Optimised control force ({words}, optimised in FP16S storage)")
    return fig


def profile_figure(results: dict[str, Any], words: str, probe_x: int) -> Figure:
    """The target outflow against the initial and the optimised ones, with the
    final design's FP32 re-run."""
    fig, axes = new_figure(size=(6.4, 4.6))
    ax = axes[0, 0]
    target = np.asarray(results["target"])
    rows = np.arange(1, target.size + 1)
    profiles = results["profiles"]
    ax.plot(target, rows, color="black", lw=2.5, label="target")
    ax.plot(
        profiles["initial FP16S"], rows, color="0.5", ls="--", label="initial (FP16S)"
    )
    ax.plot(
        profiles["final FP16S"],
        rows,
        color="tab:blue",
        marker="o",
        ms=3,
        label="optimised (FP16S)",
    )
    ax.plot(
        profiles["final FP32"],
        rows,
        color="tab:orange",
        ls=":",
        lw=2,
        label="optimised, re-run in FP32",
    )
    ax.set_xlabel(f"u_x at x = {probe_x} (cells per time step)")
    ax.set_ylabel("y (cells)")
    ax.legend()
    ax.set_title(
        f"Outflow profile ({words}),\noptimised in FP16S storage, re-run in FP32"
    )
    return fig
