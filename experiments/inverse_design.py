"""Inverse design through the solver: a body force that shapes a channel's outflow.

A 2-D D2Q9 channel, solid walls at the top and bottom, periodic in x, is driven by
a uniform body force and starts from its Poiseuille profile. In a block of cells
in the middle of the channel (the *control region*) a further body force, the
design, acts; downstream of it, at a fixed x (the *probe*), the profile
``u_x(y)`` after ``steps`` steps is the channel's outflow. The study looks for the
control force whose outflow matches a target profile: the loss is the mean
squared difference of the two profiles relative to the target's mean square.

The design is a field ``theta`` of shape ``(2, X, Y)`` and the control force is
``F = scale * tanh(theta)`` inside the control region (zero elsewhere), so no
component ever exceeds ``scale`` (four times the driving force) and the flow stays
at a low Mach number. The target is the outflow of a known design (a force that
pushes forward in the upper half and back in the lower half, no net push), run in
FP32 storage: a skewed profile of nearly the same flux that the design space can
reach. The optimisation starts from no control force.

The gradients are taken through :meth:`lbm_jax.Simulation.advance` with the
populations stored in FP16S (the straight-through derivative of the 16-bit
rounding, see ``docs/lbm/gradients.md``): one compiled ``jax.value_and_grad``,
reused by every iteration of ``optax.adam``. The final design is then run again
with FP32 storage: does the design found in 16-bit storage transfer?

Checks: the loss falls at least :data:`LOSS_DROP_MIN` times from the initial
design; the achieved FP16S outflow lies within :data:`PROFILE_TOLERANCE` of the
target's peak speed at every y; the FP32 re-evaluation's loss is within a factor
:data:`TRANSFER_FACTOR` of the FP16S loss; the flow stays below Mach
:data:`MACH_MAX`. A missing result fails its check.

Scales: ``tiny`` (tests), ``quick`` (a 2-core CPU, under half a minute: a 48 x 24
channel, 200 steps, 30 iterations), ``standard`` (64 x 32, 400 steps, 60
iterations), ``full`` (a GPU: 192 x 96, 2400 steps, 200 iterations, nested
checkpoints). Outputs: ``results.json``, ``inverse_loss.png``,
``inverse_force.png``, ``inverse_profile.png`` and ``REPORT.md``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import lbm_jax
from experiments import _framework
from experiments._inverse_figures import force_figure, loss_figure, profile_figure
from experiments._report import (
    checks_section,
    fmt,
    markdown_table,
    progress,
    run_caption,
    save_figure,
)

__all__ = [
    "Channel",
    "LOSS_DROP_MIN",
    "MACH_MAX",
    "PROFILE_TOLERANCE",
    "Settings",
    "TRANSFER_FACTOR",
    "evaluate_checks",
    "run",
    "settings_for",
]

#: Least factor by which the optimised design's loss (FP16S) lies below the
#: initial design's.
LOSS_DROP_MIN = 10.0
#: Largest deviation of the achieved FP16S outflow from the target, at any y,
#: as a share of the target's peak speed.
PROFILE_TOLERANCE = 0.05
#: Largest factor between the FP32 re-evaluation's loss and the FP16S loss, either
#: way.
TRANSFER_FACTOR = 3.0
#: Largest Mach number |u| / c_s (c_s = 1/sqrt(3)) of the final FP32 run.
MACH_MAX = 0.1

_TAU = 0.8
_PEAK_SPEED = 0.04  # of the Poiseuille profile, cells per time step
_FORCE_SCALE = 4.0  # the control force's bound, in driving forces
_TARGET_SHARE = 0.8  # the target design's force, a share of the bound


@dataclasses.dataclass(frozen=True)
class Settings:
    """One scale: the grid ``(nx, ny)``, steps per run, adam iterations and rate,
    and the checkpoints of the reverse pass (``None``: the solver's nesting)."""

    nx: int
    ny: int
    steps: int
    iterations: int
    learning_rate: float = 0.1
    checkpoint_every: int | None = 1


_SETTINGS = {
    "tiny": Settings(32, 16, 100, 20),
    "quick": Settings(48, 24, 200, 30),
    "standard": Settings(64, 32, 400, 60),
    "full": Settings(192, 96, 2400, 200, learning_rate=0.05, checkpoint_every=None),
}


def settings_for(scale: str) -> Settings:
    """The settings of ``scale`` (one of :data:`experiments._framework.SCALES`)."""
    return _framework.settings_for(_SETTINGS, scale)


@dataclasses.dataclass(frozen=True)
class Channel:
    """The channel of one scale: its cells, driving force, initial flow, control
    region and probe.

    Attributes:
        cell_type: ``(X, Y)`` cell types, solid rows at y = 0 and y = Y - 1.
        drive: the uniform driving force (x component), lattice units.
        scale: the bound of each control-force component, lattice units.
        control: ``(X, Y)`` 1.0 in the control region's cells, else 0.0.
        probe_x: the column where the outflow is read.
        poiseuille: ``u_x(y)`` of the steady channel flow over every row.
    """

    cell_type: np.ndarray
    drive: float
    scale: float
    control: np.ndarray
    probe_x: int
    poiseuille: np.ndarray

    @classmethod
    def build(cls, st: Settings) -> Channel:
        """The channel of settings ``st``: Poiseuille flow of peak 0.04 cells per
        time step, the control region over x in [X/4, X/2) and every fluid row,
        the probe at x = X/2 + X/16."""
        nx, ny = st.nx, st.ny
        cells = np.zeros((nx, ny), np.int8)
        cells[:, [0, -1]] = int(lbm_jax.CellType.SOLID)
        height = ny - 2  # mid-link bounce-back: the walls lie half a cell out
        nu = (_TAU - 0.5) / 3.0
        drive = 8.0 * nu * _PEAK_SPEED / height**2
        y = np.arange(ny) - 0.5
        poiseuille = np.clip(4.0 * _PEAK_SPEED * y * (height - y) / height**2, 0, None)
        poiseuille[[0, -1]] = 0.0
        control = np.zeros((nx, ny), np.float32)
        control[nx // 4 : nx // 2, 1:-1] = 1.0
        return cls(
            cells, drive, _FORCE_SCALE * drive, control, nx // 2 + nx // 16, poiseuille
        )

    @property
    def shape(self) -> tuple[int, int]:
        """The grid ``(X, Y)``."""
        return self.cell_type.shape

    def control_force(self, theta: Any) -> Any:
        """The control force ``scale * tanh(theta)`` in the control region."""
        return self.scale * jnp.tanh(theta) * jnp.asarray(self.control)[None]

    def target_design(self) -> np.ndarray:
        """The design whose FP32 outflow is the target: ``F_x = 0.8 scale
        sin(pi eta)`` over the fluid rows (``eta`` from -1 to 1), ``F_y = 0``:
        forward in the upper half, back in the lower, no net push."""
        ny = self.shape[1]
        eta = (np.arange(ny) - (ny - 1) / 2) / ((ny - 2) / 2)
        row = np.arctanh(_TARGET_SHARE * np.sin(np.pi * np.clip(eta, -1, 1)))
        theta = np.zeros((2, *self.shape), np.float32)
        theta[0] = row[None, :] * self.control
        return theta


def outflow(
    channel: Channel, storage: str, st: Settings
) -> Callable[[Any], tuple[Any, Any]]:
    """``theta -> (u_x(y) at the probe over the fluid rows, max |u|)`` after
    ``st.steps`` steps from Poiseuille flow, stored in ``storage``."""
    sim = lbm_jax.Simulation(
        "D2Q9", channel.shape, tau=_TAU, storage=storage, cell_type=channel.cell_type
    )
    drive = np.zeros((2, *channel.shape), np.float32)
    drive[0] = channel.drive
    u0 = np.zeros((2, *channel.shape), np.float32)
    u0[0] = channel.poiseuille[None, :]

    def run_channel(theta: Any) -> tuple[Any, Any]:
        force = jnp.asarray(drive) + channel.control_force(theta)
        state = sim.init(u=jnp.asarray(u0), force=jnp.asarray(drive))
        state = sim.advance(
            state, st.steps, force, checkpoint_every=st.checkpoint_every
        )
        u = lbm_jax.velocity(sim, state, force)
        speed = jnp.sqrt(jnp.sum(u**2, axis=0))
        return u[0, channel.probe_x, 1:-1], jnp.max(speed)

    return run_channel


def relative_loss(profile: Any, target: Any) -> Any:
    """Mean squared difference of two profiles over the target's mean square."""
    return jnp.mean((profile - target) ** 2) / jnp.mean(target**2)


def optimise(
    channel: Channel, target: Any, st: Settings
) -> tuple[np.ndarray, list[float], list[np.ndarray]]:
    """Adam on ``theta`` from zero, gradients through FP16S storage.

    Returns:
        ``(theta, losses, profiles)``: the final design, the FP16S loss of each
        iteration's design (the last one that of the final design) and the
        FP16S outflow of the first and the final design.
    """
    run16 = outflow(channel, "fp16s", st)

    def loss(theta: Any) -> tuple[Any, Any]:
        profile, _ = run16(theta)
        return relative_loss(profile, target), profile

    value_and_grad = jax.jit(jax.value_and_grad(loss, has_aux=True))
    rate = optax.cosine_decay_schedule(st.learning_rate, st.iterations, alpha=0.1)
    adam = optax.adam(rate)

    def adam_step(theta: Any, grad: Any, opt_state: Any) -> tuple[Any, Any]:
        updates, opt_state = adam.update(grad, opt_state, theta)
        return optax.apply_updates(theta, updates), opt_state

    theta = jnp.zeros((2, *channel.shape), jnp.float32)
    opt_state = adam.init(theta)
    # optax.adam promotes Python scalars against its int32 step counter, so the
    # update is traced (once) under standard promotion
    with jax.numpy_dtype_promotion("standard"):
        update = jax.jit(adam_step).lower(theta, theta, opt_state).compile()
    losses, profiles = [], []
    for i in progress(range(st.iterations + 1), desc="inverse_design"):
        (value, profile), grad = value_and_grad(theta)
        losses.append(float(value))
        if i in (0, st.iterations):
            profiles.append(np.asarray(profile))
        if i < st.iterations:
            theta, opt_state = update(theta, grad, opt_state)
    return np.asarray(theta), losses, profiles


def study(st: Settings) -> tuple[Channel, dict[str, Any]]:
    """Run the study of settings ``st``: the target, the optimisation and the
    FP32 re-evaluation. Returns the channel and the results (JSON-ready)."""
    channel = Channel.build(st)
    run32 = jax.jit(outflow(channel, "fp32", st))
    target, _ = run32(jnp.asarray(channel.target_design()))
    theta, losses, (first16, final16) = optimise(channel, target, st)
    initial32, _ = run32(jnp.zeros_like(theta))
    final32, speed32 = run32(jnp.asarray(theta))
    target = np.asarray(target)
    force = np.asarray(channel.control_force(theta))
    return channel, {
        "target": target,
        "profiles": {
            "initial FP32": np.asarray(initial32),
            "initial FP16S": first16,
            "final FP16S": final16,
            "final FP32": np.asarray(final32),
        },
        "losses_fp16s": losses,
        "loss_initial_fp32": float(relative_loss(initial32, target)),
        "loss_final_fp32": float(relative_loss(final32, target)),
        "max_deviation": float(np.max(np.abs(final16 - target)) / np.max(target)),
        "max_deviation_initial": float(
            np.max(np.abs(first16 - target)) / np.max(target)
        ),
        "mach_fp32": float(speed32) * math.sqrt(3.0),
        "max_control_force": float(np.max(np.abs(force))),
        "flux": {"target": float(np.sum(target)), "initial": float(np.sum(first16))},
        "control_force": force,
    }


def evaluate_checks(results: dict[str, Any] | None) -> dict[str, bool]:
    """The study's claims held against its results (a missing value fails).

    >>> all(evaluate_checks(None).values())
    False
    """
    r = results or {}
    losses = r.get("losses_fp16s") or []
    first, last = (losses[0], losses[-1]) if len(losses) >= 2 else (None, None)
    final32, deviation = r.get("loss_final_fp32"), r.get("max_deviation")
    mach = r.get("mach_fp32")

    def finite(*values: Any) -> bool:
        return all(v is not None and math.isfinite(v) for v in values)

    return {
        f"FP16S loss falls >= {LOSS_DROP_MIN:g}x from the initial design": (
            finite(first, last) and last * LOSS_DROP_MIN <= first
        ),
        f"achieved FP16S outflow within {PROFILE_TOLERANCE:.0%} of the target's "
        "peak at every y": finite(deviation) and deviation <= PROFILE_TOLERANCE,
        f"FP32 re-evaluation's loss within {TRANSFER_FACTOR:g}x of the FP16S loss": (
            finite(final32, last)
            and last > 0
            and final32 > 0
            and 1 / TRANSFER_FACTOR <= final32 / last <= TRANSFER_FACTOR
        ),
        f"final FP32 flow below Mach {MACH_MAX:g}": finite(mach) and mach < MACH_MAX,
    }


def _table(results: dict[str, Any]) -> str:
    losses = results["losses_fp16s"]
    target = results["target"]
    rows = []
    for design, storage, loss in (
        ("initial", "FP16S", losses[0]),
        ("initial", "FP32", results["loss_initial_fp32"]),
        ("final", "FP16S", losses[-1]),
        ("final", "FP32", results["loss_final_fp32"]),
    ):
        profile = results["profiles"][f"{design} {storage}"]
        deviation = float(np.max(np.abs(profile - target)) / np.max(target))
        rows.append(
            [
                "no control force" if design == "initial" else "optimised",
                storage,
                fmt(loss, ".3g"),
                fmt(losses[0] / loss, ".3g"),
                f"{deviation:.2%}",
            ]
        )
    return markdown_table(
        [
            "design",
            "storage",
            "loss",
            "initial FP16S loss / loss",
            "max deviation / target peak",
        ],
        rows,
    )


def _grid_words(st: Settings) -> str:
    """The grid and run in words, for titles.

    >>> _grid_words(settings_for("quick"))
    'D2Q9 channel 48 x 24, 200 steps'
    """
    return f"D2Q9 channel {st.nx} x {st.ny}, {st.steps} steps"


def run(
    out_dir: Path, *, quick: bool = True, seed: int = 0, scale: str | None = None
) -> dict[str, Any]:
    """Run the study into ``out_dir``; returns the table and the checks.

    The study is deterministic (no random numbers); ``seed`` is recorded only.
    """
    scale = _framework.resolve_scale(quick, scale)
    st = settings_for(scale)
    channel, results = study(st)
    checks = evaluate_checks(results)
    env = _framework.capture_environment(seed=seed, scale=scale)
    caption = run_caption(env)
    words = _grid_words(st)
    figures = [
        loss_figure(results, words, LOSS_DROP_MIN),
        force_figure(channel, results, words),
        profile_figure(results, words, channel.probe_x),
    ]
    figures = [
        save_figure(fig, out_dir / f"inverse_{name}.png", caption=caption)
        for fig, name in zip(figures, ("loss", "force", "profile"), strict=True)
    ]
    table = _table(results)
    _framework.write_json(
        out_dir / "results.json",
        {
            "environment": env,
            "settings": dataclasses.asdict(st),
            "channel": {
                "tau": _TAU,
                "drive": channel.drive,
                "force_bound": channel.scale,
                "control_cells": int(channel.control.sum()),
                "probe_x": channel.probe_x,
            },
            **results,
            "checks": checks,
        },
    )
    _write_report(out_dir, scale, st, channel, table, figures, checks, results)
    return {"table": table, "checks": checks}


def _write_report(
    out_dir: Path,
    scale: str,
    st: Settings,
    channel: Channel,
    table: str,
    figures: list[Path],
    checks: dict[str, bool],
    results: dict[str, Any],
) -> None:
    losses = results["losses_fp16s"]
    x0, x1 = np.flatnonzero(channel.control.any(axis=1))[[0, -1]]
    lines = [
        "# Inverse design: a body force that shapes a channel's outflow",
        "",
        f"Scale **{scale}**; `python -m experiments inverse_design"
        f"{'' if scale == 'quick' else ' --' + scale}`. A {_grid_words(st)} "
        f"(tau = {_TAU}, walls at y = 0 and {st.ny - 1}, periodic in x), driven by "
        f"a uniform force {channel.drive:.3g} from Poiseuille flow. The control "
        f"force, bounded by {channel.scale:.3g} per component (lattice units), "
        f"acts on x = {x0}..{x1}; the outflow u_x(y) is read at x = "
        f"{channel.probe_x}. Optimised with optax.adam (rate {st.learning_rate}, "
        f"{st.iterations} iterations) with gradients through `advance` in FP16S "
        "storage; the final design then runs again in FP32 storage.",
        "",
        table,
        "",
        f"The FP16S loss fell from {losses[0]:.3g} to {losses[-1]:.3g} "
        f"({losses[0] / losses[-1]:.3g}x); the same design in FP32 storage has "
        f"loss {results['loss_final_fp32']:.3g}. Largest control force "
        f"{results['max_control_force']:.3g}, Mach {results['mach_fp32']:.3f}. "
        f"Flux (sum of u_x over the rows): target {results['flux']['target']:.4g}, "
        f"initial {results['flux']['initial']:.4g}.",
        "",
        *(f"![{p.stem}]({p.name})" for p in figures),
        "",
        *checks_section(checks),
    ]
    (out_dir / "REPORT.md").write_text("\n".join(lines) + "\n")
