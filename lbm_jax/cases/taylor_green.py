"""Taylor-Green vortices: 2-D periodic decaying flow, against the analytic solution.

On an ``n x n`` periodic box with ``k = 2 pi / n`` (nodes at ``x = i``):

    u = -U0 cos(k x) sin(k y) exp(-2 nu k^2 t)
    v =  U0 sin(k x) cos(k y) exp(-2 nu k^2 t)
    p = -(U0^2 / 4) (cos 2kx + cos 2ky) exp(-4 nu k^2 t)

with ``U0 = u_ref`` and ``re = u_ref n / nu``. The run starts from the equilibrium
of the analytic fields at ``t = 0`` (density ``1 + 3 p``) and, by default, lasts
until the amplitude has decayed by ``exp(-decay)``.

Metrics: ``decay_rate`` (fitted to the projected mode amplitude), ``decay_rate_exact``
(``2 nu k^2``), ``decay_rate_error`` (relative) and ``l2_error`` (relative L2 error of
the velocity field at the last step).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lbm_jax.cases import _common
from lbm_jax.cases._common import CaseSetup
from lbm_jax.core._units import check_tau, tau_from_re, viscosity
from lbm_jax.core._validation import check_int

__all__ = ["analytic_fields", "prepare"]

_DEFAULTS: dict[str, Any] = {
    "collision": "bgk",
    "magic": 3.0 / 16.0,
    "u_ref": 0.04,
    "decay": 0.5,
    "samples": 20,
}


def analytic_fields(
    n: int, u0: float, nu: float, t: float
) -> tuple[np.ndarray, np.ndarray]:
    """Exact density (``1 + 3 p``) ``(n, n)`` and velocity ``(2, n, n)`` at time t."""
    k = 2.0 * math.pi / n
    x = np.arange(n, dtype=np.float64)[:, None]
    y = np.arange(n, dtype=np.float64)[None, :]
    amp = u0 * math.exp(-2.0 * nu * k * k * t)
    u = np.stack(
        [
            -amp * np.cos(k * x) * np.sin(k * y),
            amp * np.sin(k * x) * np.cos(k * y),
        ]
    )
    p = -(amp**2) / 4.0 * (np.cos(2 * k * x) + np.cos(2 * k * y))
    return 1.0 + 3.0 * p, u


def prepare(
    case: str,
    *,
    n: int | None,
    re: float | None,
    storage: Any,
    steps: int | None,
    options: dict[str, Any],
) -> CaseSetup:
    """Validate and derive the Taylor-Green parameters (see the module docstring)."""
    opts = _common.merge_options(case, options, _DEFAULTS)
    n = check_int(64 if n is None else n, "n", 4)
    re = 100.0 if re is None else re
    u_ref = opts.pop("u_ref")
    _common.check_speed(u_ref, what="vortex velocity u_ref")
    tau = tau_from_re(re, u_ref=u_ref, length=n)
    check_tau(tau, context=f"re={re:g} with n={n}, u_ref={u_ref:g}")
    if opts["decay"] <= 0:
        raise ValueError(f"decay must be positive, got {opts['decay']}.")
    opts["samples"] = check_int(opts["samples"], "samples", 2)
    nu = viscosity(tau)
    k = 2.0 * math.pi / n
    if steps is None:
        steps = max(2, round(opts["decay"] / (2.0 * nu * k * k)))
    return CaseSetup(
        case=case,
        lattice="D2Q9",
        storage=storage,
        collision=opts.pop("collision"),
        magic=opts.pop("magic"),
        n=n,
        re=re,
        tau=tau,
        u_ref=u_ref,
        steps=steps,
        steps_given=True,
        options=opts,
        runner=_run,
        builder=build,
        figures=("velocity", "vorticity"),
        shape=(n, n),
    )


def build(setup: CaseSetup) -> tuple[Any, Any]:
    """The periodic box of a prepared case and its initial state.

    Returns:
        ``(sim, state)``: an ``n`` x ``n`` periodic box holding the analytic
        vortices at t = 0.
    """
    from lbm_jax.sim._simulation import Simulation

    sim = Simulation(
        setup.lattice,
        (setup.n, setup.n),
        tau=setup.tau,
        storage=setup.storage,
        collision=setup.collision,
        magic=setup.magic,
    )
    return sim, sim.init(*analytic_fields(setup.n, setup.u_ref, setup.nu, 0.0))


def _run(setup: CaseSetup, driver: dict[str, Any]) -> tuple[dict, dict, dict]:
    import jax.numpy as jnp

    from lbm_jax.runs._driver import run
    from lbm_jax.sim._observables import velocity

    n, nu, u0 = setup.n, setup.nu, setup.u_ref
    k = 2.0 * math.pi / n
    rate_exact = 2.0 * nu * k * k
    sim, start = build(setup)
    _, u_init = analytic_fields(n, u0, nu, 0.0)
    mode = u_init / u0
    weights = mode / float(np.sum(mode * mode))  # projection onto the mode
    projection = jnp.asarray(weights.astype(sim.storage.compute_dtype))

    def amplitude(state: Any) -> Any:
        return jnp.sum(velocity(sim, state) * projection)

    result = run(
        sim,
        start,
        setup.steps,
        observe=amplitude,
        sample_every=max(1, setup.steps // setup.options["samples"]),
        **driver,
    )
    times = np.concatenate([[0], result.samples.steps])
    amps = np.concatenate([[u0], np.asarray(result.samples.values, np.float64)])
    rho, u = (np.asarray(a, dtype=np.float64) for a in sim.fields(result.state))
    t_end = result.stats.total_steps
    _, u_exact = analytic_fields(n, u0, nu, float(t_end))
    tt = times[1:].astype(np.float64)
    la = np.log(np.abs(amps[1:]))
    if tt.size >= 2:
        rate = -float(np.polyfit(tt, la, 1)[0])
    else:
        rate = -math.log(abs(amps[-1]) / u0) / max(t_end, 1)
    metrics = {
        "steps": t_end,
        "mlups": result.stats.mlups,
        **_common.step_fields(sim),
        "decay_rate": rate,
        "decay_rate_exact": rate_exact,
        "decay_rate_error": abs(rate - rate_exact) / rate_exact,
        "l2_error": float(np.linalg.norm(u - u_exact) / np.linalg.norm(u_exact)),
        "amplitude_final": float(amps[-1]),
    }
    extras = {"t": times, "amplitude": amps}
    return metrics, {"rho": rho, "u": u}, extras
