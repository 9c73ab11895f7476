"""Poiseuille flow: a 2-D channel driven by a body force, against its analytic profile.

The channel has ``n`` fluid nodes across, at ``y_j = j + 1/2``, between half-way
bounce-back walls at ``y = 0`` and ``y = n``; it is periodic in x. A body force
``g`` along x (Guo forcing) drives the steady profile

    u(y) = g / (2 nu) * y (n - y),

with centre-line speed ``u_ref = g n^2 / (8 nu)`` and ``re = u_ref n / nu``. On the
lattice the half-way walls add a uniform slip

    u_slip = (2 g / (3 nu)) * (Lambda - 3/16),

with ``Lambda = (tau - 1/2)^2`` for BGK and the magic parameter for TRT; TRT with
``Lambda = 3/16`` reproduces the parabola to round-off.

Metrics: ``l2_error`` (relative L2 error of u_x against the parabola), ``slip``
(the measured mean offset), ``slip_predicted`` and ``residual`` (relative change
over the last check interval).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lbm_jax.cases import _common
from lbm_jax.cases._common import CaseSetup
from lbm_jax.core._units import check_tau, tau_from_re, viscosity
from lbm_jax.core._validation import check_int

__all__ = ["analytic_profile", "predicted_slip", "prepare"]

_DEFAULTS: dict[str, Any] = {
    "collision": "trt",
    "magic": 3.0 / 16.0,
    "u_ref": 0.05,
    "nx": 4,
    "tol": 1e-13,
}


def analytic_profile(n: int, g: float, nu: float) -> np.ndarray:
    """Exact u_x at the fluid nodes ``y_j = j + 1/2``, ``j = 0..n-1``."""
    y = np.arange(n, dtype=np.float64) + 0.5
    return g / (2.0 * nu) * y * (n - y)


def predicted_slip(g: float, nu: float, magic: float) -> float:
    """Uniform wall slip of half-way bounce-back: (2 g / 3 nu) (Lambda - 3/16)."""
    return 2.0 * g / (3.0 * nu) * (magic - 3.0 / 16.0)


def prepare(
    case: str,
    *,
    n: int | None,
    re: float | None,
    storage: Any,
    steps: int | None,
    options: dict[str, Any],
) -> CaseSetup:
    """Validate and derive the Poiseuille parameters (see the module docstring)."""
    opts = _common.merge_options(case, options, _DEFAULTS)
    n = check_int(32 if n is None else n, "n", 4)
    nx = check_int(opts["nx"], "nx", 1)
    opts["nx"] = nx
    re = 10.0 if re is None else re
    u_ref = opts.pop("u_ref")
    _common.check_speed(u_ref, what="centre-line velocity u_ref")
    tau = tau_from_re(re, u_ref=u_ref, length=n)
    check_tau(tau, context=f"re={re:g} with n={n}, u_ref={u_ref:g}")
    collision = opts.pop("collision")
    magic = opts.pop("magic")
    if magic <= 0:
        raise ValueError(f"magic must be positive, got {magic}.")
    nu = viscosity(tau)
    if steps is None:
        # The slowest transient decays like exp(-nu pi^2 t / n^2): 35 e-foldings.
        steps_max = math.ceil(35.0 * n * n / (math.pi**2 * nu))
    else:
        steps_max = steps
    return CaseSetup(
        case=case,
        lattice="D2Q9",
        storage=storage,
        collision=collision,
        magic=magic,
        n=n,
        re=re,
        tau=tau,
        u_ref=u_ref,
        steps=steps_max,
        steps_given=steps is not None,
        options=opts,
        runner=_run,
        builder=build,
        shape=(nx, n + 2),
    )


def _force(setup: CaseSetup) -> float:
    """The body force driving a centre-line speed ``u_ref``."""
    return 8.0 * setup.nu * setup.u_ref / (setup.n * setup.n)


def build(setup: CaseSetup) -> tuple[Any, Any]:
    """The channel of a prepared case and its initial state (fluid at rest).

    Returns:
        ``(sim, state)``: a periodic-in-x channel of ``nx`` x ``n + 2`` cells,
        solid wall layers at y index 0 and ``n + 1``, driven by a body force.
    """
    from lbm_jax.core._boundaries import CellType
    from lbm_jax.sim._simulation import Simulation

    n, nx = setup.n, setup.options["nx"]
    cell_type = np.zeros((nx, n + 2), dtype=np.int8)
    cell_type[:, 0] = cell_type[:, -1] = int(CellType.SOLID)
    sim = Simulation(
        setup.lattice,
        cell_type.shape,
        tau=setup.tau,
        storage=setup.storage,
        collision=setup.collision,
        magic=setup.magic,
        force=np.array([_force(setup), 0.0]),
        cell_type=cell_type,
    )
    return sim, sim.init()


def _run(setup: CaseSetup, driver: dict[str, Any]) -> tuple[dict, dict, dict]:
    from lbm_jax.runs._driver import run
    from lbm_jax.runs._stop import relative_change, steady
    from lbm_jax.sim._observables import velocity

    n, nu, g = setup.n, setup.nu, _force(setup)
    sim, start = build(setup)
    tol = setup.options["tol"]
    result = run(
        sim,
        start,
        setup.steps,
        observe=lambda state: velocity(sim, state)[0, :, 1:-1],
        sample_every=max(100, min(2000, setup.steps // 20)),
        stop=None if setup.steps_given else steady(tol),
        **driver,
    )
    ux = result.samples.values
    residual = float(relative_change(ux[-1], ux[-2])) if len(ux) >= 2 else math.inf
    rho, u = (np.asarray(a, dtype=np.float64) for a in sim.fields(result.state))
    rho, u = rho[:, 1:-1], u[:, :, 1:-1]
    exact = analytic_profile(n, g, nu)
    profile = u[0].mean(axis=0)
    magic = (setup.tau - 0.5) ** 2 if setup.collision == "bgk" else setup.magic
    metrics = {
        "steps": result.stats.total_steps,
        "mlups": result.stats.mlups,
        **_common.step_fields(sim),
        "force": g,
        "l2_error": float(
            np.linalg.norm(u[0] - exact[None])
            / np.linalg.norm(np.broadcast_to(exact, u[0].shape))
        ),
        "max_v": float(np.abs(u[1]).max()),
        "slip": float(np.mean(profile - exact)),
        "slip_predicted": predicted_slip(g, nu, magic),
        "residual": residual,
        "converged": residual < tol,
    }
    extras = {"y": np.arange(n) + 0.5, "u_exact": exact}
    return metrics, {"rho": rho, "u": u}, extras
