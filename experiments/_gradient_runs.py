"""The problems and runs of the gradient study (part of
:mod:`experiments.lbm_gradients`).

Each problem is one of the accuracy study's cases (:func:`lbm_jax.cases.prepare_case`:
the same grid, relaxation time, boundaries and start), with a parameter ``theta`` that
enters the run through a traced value and a scalar ``L`` read from the final state:

* ``taylor_green``: ``theta`` is the vortices' initial amplitude (the start is the
  analytic state of amplitude ``theta``, its pressure ``~ theta**2`` included);
  ``L`` is the kinetic energy ``sum(rho |u|^2) / 2`` after the run;
* ``poiseuille``: ``theta`` is the body force driving the channel
  (``Simulation.with_arrays(force=...)``); ``L`` is the flux per unit width, the mean
  x-velocity of the fluid cells;
* ``cavity``: ``theta`` is the lid speed (``with_arrays(wall_velocity=...)``); ``L``
  is the clockwise circulation of the primary vortex, the line integral of the
  velocity around the square through the cavity's quarter points (lattice units).

``dL/dtheta`` is the adjoint (``jax.value_and_grad``) through
:meth:`lbm_jax.Simulation.advance`, whose reverse mode keeps checkpoints in the
storage format. Storages held as bit patterns (FP16C, bfloat16, the posits) run
emulated (``lbm_jax.get_storage(name, emulate=True)``: the same rounding, the values
held in float32). FP64 runs get x64 enabled, as the accuracy study's do.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import lbm_jax
from experiments._accuracy_runs import storage_label
from experiments._report import progress
from lbm_jax.cases import prepare_case
from lbm_jax.cases.taylor_green import analytic_fields

__all__ = [
    "FD_STEP",
    "PROBLEMS",
    "differentiable_policy",
    "gradient_run",
    "loss_function",
    "problem_sweep",
    "relative_error",
]

#: What each problem differentiates, in words: (theta, L).
PROBLEMS: dict[str, tuple[str, str]] = {
    "taylor_green": ("initial amplitude", "kinetic energy after the run"),
    "poiseuille": ("driving body force", "flux (mean x-velocity) after the run"),
    "cavity": ("lid speed", "circulation of the primary vortex after the run"),
}

#: Step of the float64 central differences, relative to theta.
FD_STEP = 1e-4

Loss = Callable[[jax.Array], jax.Array]


def differentiable_policy(storage: str, shift: bool) -> lbm_jax.StoragePolicy:
    """The storage policy a derivative passes through: the policy itself when its
    populations are held in a floating-point dtype, else its emulated twin.

    >>> str(differentiable_policy("fp16c", True))
    'FP32/FP16C (emulated)'
    """
    policy = lbm_jax.get_storage(storage, shift=shift)
    if policy.name in lbm_jax.differentiable_storages():
        return policy
    return lbm_jax.get_storage(policy, emulate=True)


def _taylor_green(
    sim: lbm_jax.Simulation, setup: Any, every: int | None
) -> tuple[Loss, float]:
    rho1, u1 = analytic_fields(setup.n, 1.0, setup.nu, 0.0)  # amplitude 1
    dtype = sim.storage.compute_dtype
    drho, shape = jnp.asarray(rho1 - 1.0, dtype), jnp.asarray(u1, dtype)

    def energy(theta: jax.Array) -> jax.Array:
        state = sim.init(rho=1.0 + theta**2 * drho, u=theta * shape)
        state = sim.advance(state, setup.steps, checkpoint_every=every)
        rho, u = sim.fields(state)
        return 0.5 * jnp.sum(rho * jnp.sum(u * u, axis=0))

    return energy, setup.u_ref


def _poiseuille(
    sim: lbm_jax.Simulation, setup: Any, every: int | None
) -> tuple[Loss, float]:
    def flux(theta: jax.Array) -> jax.Array:
        pushed = sim.with_arrays(force=jnp.stack([theta, jnp.zeros_like(theta)]))
        state = pushed.advance(pushed.init(), setup.steps, checkpoint_every=every)
        return jnp.mean(lbm_jax.velocity(pushed, state)[0][:, 1:-1])

    return flux, float(np.asarray(sim.force)[0])


def _cavity(
    sim: lbm_jax.Simulation, setup: Any, every: int | None
) -> tuple[Loss, float]:
    n = setup.n
    unit = jnp.asarray(np.asarray(sim.wall_velocity) / setup.u_ref)
    unit = unit.astype(sim.storage.compute_dtype)
    lo, hi = n // 4, n - 1 - n // 4  # the loop, in fluid-cell indices

    def circulation(theta: jax.Array) -> jax.Array:
        moved = sim.with_arrays(wall_velocity=theta * unit)
        state = moved.advance(moved.init(), setup.steps, checkpoint_every=every)
        u = lbm_jax.velocity(moved, state)[:, 1:-1, 1:-1]  # the fluid cells
        side = slice(lo, hi)
        # clockwise: +x along the top, -y down the right, -x along the bottom
        return (
            jnp.sum(u[0, side, hi])
            - jnp.sum(u[1, hi, side])
            - jnp.sum(u[0, side, lo])
            + jnp.sum(u[1, lo, side])
        )

    return circulation, setup.u_ref


_BUILDERS = {
    "taylor_green": _taylor_green,
    "poiseuille": _poiseuille,
    "cavity": _cavity,
}


def loss_function(
    problem: str,
    policy: lbm_jax.StoragePolicy,
    n: int,
    steps: int,
    *,
    checkpoint_every: int | None = None,
) -> tuple[Loss, float]:
    """``(L, theta0)``: the problem's ``L(theta)`` in ``policy``'s storage on the
    case's grid of size ``n`` run for ``steps`` steps, and the case's own theta.

    Call (and differentiate) ``L`` inside ``jax.enable_x64(policy.needs_x64)``.
    """
    if problem not in _BUILDERS:
        raise ValueError(f"unknown problem {problem!r}; expected one of {PROBLEMS}.")
    case = prepare_case(problem, storage=policy, n=n, steps=steps)
    sim, _ = case.build()
    return _BUILDERS[problem](sim, case, checkpoint_every)


def relative_error(value: float, reference: float) -> float:
    """``|value - reference| / |reference|``; NaN when either is not finite.

    >>> relative_error(1.01, 1.0) < 0.0101
    True
    """
    if not (math.isfinite(value) and math.isfinite(reference)) or reference == 0:
        return math.nan
    return abs(value - reference) / abs(reference)


def gradient_run(
    problem: str,
    storage: str,
    shift: bool,
    n: int,
    steps: int,
    *,
    checkpoint_every: int | None = None,
) -> dict[str, Any]:
    """``L`` and ``dL/dtheta`` at the case's theta in one storage: a run record.

    FP64 runs also evaluate ``L`` at ``theta (1 +- FD_STEP)`` with the same
    compiled program and record the central difference (``central_difference``).
    ``wall_s`` is the record's time, compilation included (which dominates).
    """
    start = time.perf_counter()
    policy = differentiable_policy(storage, shift)
    record: dict[str, Any] = {
        "problem": problem,
        "storage": policy.name,
        "shift": shift,
        "label": storage_label(storage, shift),
        "emulated": policy.emulate,
        "n": n,
        "steps": steps,
    }
    with jax.enable_x64(policy.needs_x64):
        loss, theta0 = loss_function(
            problem, policy, n, steps, checkpoint_every=checkpoint_every
        )
        value_and_grad = jax.jit(jax.value_and_grad(loss))
        theta = jnp.asarray(theta0, policy.compute_dtype)
        value, grad = (float(v) for v in value_and_grad(theta))
        record.update(theta=theta0, loss=value, grad=grad)
        if policy.needs_x64:
            h = FD_STEP * theta0
            up, down = (float(value_and_grad(theta + d)[0]) for d in (h, -h))
            record["central_difference"] = (up - down) / (2.0 * h)
    record["wall_s"] = time.perf_counter() - start
    return record


def problem_sweep(
    problem: str,
    runs: Sequence[tuple[str, bool]],
    n: int,
    steps: int,
    *,
    checkpoint_every: int | None = None,
) -> list[dict[str, Any]]:
    """:func:`gradient_run` for each ``(storage, shift)``, compared with the FP64
    run: each record gains ``rel_error`` (NaN without an FP64 run), and the FP64
    record ``fd_rel_diff``, its adjoint against its central difference."""
    records = [
        gradient_run(
            problem, storage, shift, n, steps, checkpoint_every=checkpoint_every
        )
        for storage, shift in progress(runs, desc=problem, total=len(runs))
    ]
    reference = next((r for r in records if r["storage"] == "FP64/FP64"), None)
    for r in records:
        ref = math.nan if reference is None else reference["grad"]
        r["rel_error"] = relative_error(r["grad"], ref)
        if "central_difference" in r:
            r["fd_rel_diff"] = relative_error(r["grad"], r["central_difference"])
    return records
