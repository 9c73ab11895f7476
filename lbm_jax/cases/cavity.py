"""Lid-driven cavity in 2-D (D2Q9, against Ghia et al. 1982) and 3-D (D3Q19).

The cavity has ``n`` fluid nodes per side at ``(i + 1/2) / n`` (in units of the
side), enclosed by half-way bounce-back walls; the lid is the top y wall and moves
in +x with speed ``u_ref`` (Ladd's moving-wall rule), ``re = u_ref n / nu``. In 3-D
(``cavity3d``, or ``lattice="D3Q19"``) the cube is closed in z as well, unless the
option ``span`` gives a z thickness in cells: then the cavity is periodic in z, the
flow is the 2-D one, and a 3-D lattice is checked against Ghia et al. as well.

Without a step count the run continues until the flow is steady: the relative L2
change per step of the two centre-line profiles, measured over ``check_every``
steps, falls below ``tol`` (or ``max_lid_times`` lid-crossing times pass).

Metrics (2-D or spanwise-periodic 3-D, Re in 100/400/1000): ``ghia_u_max_error``
and ``ghia_v_max_error``, the largest deviation (in lid-speed units) from Ghia et
al. on the vertical and horizontal centre lines, and ``ghia_max_error``, the larger
of the two. Always:
``u_min_centre``, ``v_min_centre``, ``v_max_centre``, ``residual``, ``converged``
and ``mass_drift`` (relative change of the total mass).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lbm_jax.cases import _common, _reference
from lbm_jax.cases._common import CaseSetup
from lbm_jax.core._lattice import did_you_mean, list_lattices
from lbm_jax.core._units import check_tau, tau_from_re
from lbm_jax.core._validation import check_int

__all__ = ["centre_lines", "ghia_errors", "prepare"]

_DEFAULTS: dict[str, Any] = {
    "collision": "trt",
    "magic": 3.0 / 16.0,
    "u_ref": 0.1,
    "lattice": None,
    "tol": 1e-8,
    "check_every": 500,
    "max_lid_times": 150.0,
    "span": None,
}


def _mid_profiles(u: Any) -> tuple[Any, Any]:
    """u along y at x = 1/2 and v along x at y = 1/2 (z = 1/2 in 3-D).

    Averages the two middle nodes; plain indexing and arithmetic, so it works on
    NumPy arrays on the host and traced arrays inside the compiled loop.
    """
    n = u.shape[1]
    lo, hi = (n - 1) // 2, n // 2
    if u.ndim == 4:
        u = 0.5 * (u[..., (u.shape[3] - 1) // 2] + u[..., u.shape[3] // 2])
    return 0.5 * (u[0, lo] + u[0, hi]), 0.5 * (u[1, :, lo] + u[1, :, hi])


def centre_lines(u: np.ndarray, u_lid: float) -> dict[str, np.ndarray]:
    """Centre-line profiles in lid units, with the wall values appended.

    Args:
        u: Velocity ``(D, n, n[, n])`` at the fluid nodes (nodes at ``(i+1/2)/n``).
        u_lid: Lid speed.

    Returns:
        ``{"y", "u", "x", "v"}``: u along y on the vertical line x = 1/2 and v along
        x on the horizontal line y = 1/2 (in 3-D both on the mid-plane z = 1/2),
        including the wall points (0 and 1) where the no-slip values are known.
    """
    n = u.shape[1]
    u_mid, v_mid = _mid_profiles(np.asarray(u) / u_lid)
    pos = (np.arange(n) + 0.5) / n
    coord = np.concatenate([[0.0], pos, [1.0]])
    u_line = np.concatenate([[0.0], u_mid, [1.0]])
    v_line = np.concatenate([[0.0], v_mid, [0.0]])
    return {"y": coord, "u": u_line, "x": coord.copy(), "v": v_line}


def ghia_errors(lines: dict[str, np.ndarray], re: int) -> dict[str, float]:
    """Largest deviation from Ghia et al. on both centre lines (lid units)."""
    yg, ug = _reference.ghia_u(re)
    xg, vg = _reference.ghia_v(re)
    eu = float(np.max(np.abs(np.interp(yg, lines["y"], lines["u"]) - ug)))
    ev = float(np.max(np.abs(np.interp(xg, lines["x"], lines["v"]) - vg)))
    return {
        "ghia_u_max_error": eu,
        "ghia_v_max_error": ev,
        "ghia_max_error": max(eu, ev),
    }


def prepare(
    case: str,
    *,
    n: int | None,
    re: float | None,
    storage: Any,
    steps: int | None,
    options: dict[str, Any],
) -> CaseSetup:
    """Validate and derive the cavity parameters (see the module docstring)."""
    opts = _common.merge_options(case, options, _DEFAULTS)
    lattice = opts.pop("lattice")
    if lattice is None:
        lattice = "D3Q19" if case == "cavity3d" else "D2Q9"
    if not isinstance(lattice, str) or lattice.upper() not in list_lattices():
        raise ValueError(
            f"Unknown cavity lattice {lattice!r}"
            f"{did_you_mean(str(lattice).upper(), list_lattices())}; expected one of "
            f"{list_lattices()}."
        )
    lattice = lattice.upper()
    if case == "cavity3d" and lattice == "D2Q9":
        raise ValueError("cavity3d needs a 3-D lattice (D3Q19 or D3Q27), got D2Q9.")
    if opts["span"] is not None:
        if lattice == "D2Q9":
            raise ValueError(
                "span (the z thickness of a spanwise-periodic cavity) needs a 3-D "
                "lattice; pass lattice='D3Q19' or leave span unset."
            )
        opts["span"] = check_int(opts["span"], "span", 1)
    default_n = 128 if lattice == "D2Q9" else 32
    n = check_int(default_n if n is None else n, "n", 8)
    re = 100.0 if re is None else re
    u_ref = opts.pop("u_ref")
    _common.check_speed(u_ref, what="lid speed u_ref")
    tau = tau_from_re(re, u_ref=u_ref, length=n)
    check_tau(tau, context=f"re={re:g} with n={n}, u_ref={u_ref:g}")
    opts["check_every"] = check_int(opts["check_every"], "check_every", 1)
    if opts["max_lid_times"] <= 0 or opts["tol"] < 0:
        raise ValueError(
            "max_lid_times must be positive and tol non-negative, got "
            f"{opts['max_lid_times']} and {opts['tol']}."
        )
    steps_given = steps is not None
    if steps is None:
        steps = math.ceil(opts["max_lid_times"] * n / u_ref)
    return CaseSetup(
        case=case,
        lattice=lattice,
        storage=storage,
        collision=opts.pop("collision"),
        magic=opts.pop("magic"),
        n=n,
        re=re,
        tau=tau,
        u_ref=u_ref,
        steps=steps,
        steps_given=steps_given,
        options=opts,
        runner=_run,
        builder=build,
        figures=("velocity", "streamlines"),
        shape=_shape(2 if lattice == "D2Q9" else 3, n, opts["span"]),
    )


def _interior(d: int, span: int | None) -> tuple[slice, ...]:
    """Fluid-node slices of the cavity grid (every z layer when periodic in z)."""
    walls = (slice(1, -1),) * d
    return walls if span is None else walls[:2] + (slice(None),)


def _shape(d: int, n: int, span: int | None) -> tuple[int, ...]:
    """The grid: ``n`` fluid cells per side inside one layer of solid cells."""
    return (n + 2,) * d if span is None else (n + 2, n + 2, span)


def _geometry(
    d: int, n: int, u_lid: float, span: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    from lbm_jax.core._boundaries import CellType

    shape = _shape(d, n, span)
    cell_type = np.full(shape, int(CellType.SOLID), dtype=np.int8)
    interior = _interior(d, span)
    cell_type[interior] = int(CellType.FLUID)
    lid = (slice(1, -1), -1) + interior[2:]
    cell_type[lid] = int(CellType.WALL)
    wall_velocity = np.zeros((d, *shape))
    wall_velocity[0][lid] = u_lid
    return cell_type, wall_velocity


def build(setup: CaseSetup) -> tuple[Any, Any]:
    """The cavity of a prepared case and its initial state (fluid at rest).

    Returns:
        ``(sim, state)``: ``n`` fluid cells per side inside one layer of solid
        cells, the top y layer a wall moving at ``u_ref`` in +x (periodic in z
        with ``span``).
    """
    from lbm_jax.sim._simulation import Simulation

    d = 2 if setup.lattice == "D2Q9" else 3
    cell_type, wall_velocity = _geometry(d, setup.n, setup.u_ref, setup.options["span"])
    sim = Simulation(
        setup.lattice,
        cell_type.shape,
        tau=setup.tau,
        storage=setup.storage,
        collision=setup.collision,
        magic=setup.magic,
        cell_type=cell_type,
        wall_velocity=wall_velocity,
    )
    return sim, sim.init()


def _run(setup: CaseSetup, driver: dict[str, Any]) -> tuple[dict, dict, dict]:
    from lbm_jax.runs._driver import run
    from lbm_jax.runs._stop import relative_change, steady
    from lbm_jax.sim._observables import velocity

    d = 2 if setup.lattice == "D2Q9" else 3
    u_lid, span = setup.u_ref, setup.options["span"]
    sim, start = build(setup)
    interior = (slice(None), *_interior(d, span))
    every = setup.options["check_every"]
    tol = setup.options["tol"]
    result = run(
        sim,
        start,
        setup.steps,
        observe=lambda state: _mid_profiles(velocity(sim, state)[interior]),
        sample_every=every,
        stop=None if setup.steps_given else steady(tol, sample_every=every),
        **driver,
    )
    lines = result.samples.values
    residual = (
        float(relative_change([a[-1] for a in lines], [a[-2] for a in lines])) / every
        if len(lines[0]) >= 2
        else math.inf
    )
    rho, u = (np.asarray(a, dtype=np.float64) for a in sim.fields(result.state))
    rho, u = rho[interior[1:]], u[interior]
    # Spanwise-periodic: the flow is 2-D, so compare the z-averaged in-plane field.
    lines = centre_lines(u if span is None else u[:2].mean(axis=-1), u_lid)
    metrics: dict[str, Any] = {
        "steps": result.stats.total_steps,
        "mlups": result.stats.mlups,
        **_common.step_fields(sim),
        "u_min_centre": float(lines["u"].min()),
        "v_min_centre": float(lines["v"].min()),
        "v_max_centre": float(lines["v"].max()),
        "residual": residual,
        "converged": residual < tol,
        "mass_drift": float(rho.mean() - 1.0),
    }
    if (d == 2 or span is not None) and setup.re in _reference.GHIA_REYNOLDS:
        metrics.update(ghia_errors(lines, int(setup.re)))
    extras = {f"line_{k}": v for k, v in lines.items()}
    return metrics, {"rho": rho, "u": u}, extras
