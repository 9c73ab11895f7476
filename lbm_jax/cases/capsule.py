"""A microcapsule in linear shear flow (immersed boundary), against linear theory.

The benchmark of Krueger, Varnik & Raabe (2011) after Barthes-Biesel & Rallison
(1981): a spherical capsule of radius ``r`` (an icosphere, elastic membrane without
bending) in the shear flow ``u = gamma_dot (z - H/2) e_x`` between two walls at
``z = 0`` and ``z = H`` that move at ``-/+ gamma_dot H / 2`` (half-way bounce-back
with Ladd's moving-wall term), periodic in x and y. D3Q19, the fluid starts from
the linear shear profile (no spin-up); the capsule starts as a sphere at the
centre of the box.

Parameters: ``radius`` (default 12 cells on a GPU, :data:`DEFAULT_RADIUS`, and 5
on a CPU, :data:`CPU_RADIUS`), ``n`` the
channel height ``H`` in cells (default ``10 r``; the box
is ``width x width x H`` fluid cells, ``width`` default ``H``),
``re = gamma_dot r^2 / nu`` (default 0.02), ``tau`` (default 1), the capillary
number ``ca = mu gamma_dot r / G_s`` (default 0.03) which sets the membrane's
shear modulus ``G_s``, the law (``skalak`` with ``skalak_c``, or
``neo-hookean``), the immersed boundary's delta width (``delta``: 2, 3 or 4
points) and the mesh (``nodes``, default by radius: :func:`mesh_nodes`).

Small-deformation theory: ``D_inf = (5/4) (2 + 3C) / (1 + 2C) Ca`` (Skalak;
``25/12 Ca`` for C = 1 and for neo-Hookean), reached as
``D(t) = D_inf (1 - exp(-s t G_s / (mu r)))`` with ``s = 0.2484`` for C = 1 and
neo-Hookean (which has the same small-strain moduli); ``theta -> 45 degrees`` as
``Ca -> 0``.

Without a step count the run lasts until ``D`` is steady: its relative change over
one relaxation time ``mu r / (s G_s)`` falls below ``tol`` (or ``max_times``
relaxation times pass).

Metrics: ``taylor_deformation`` (the last sample of ``D = (L - B)/(L + B)`` in the
shear plane x-z, from the inertia tensor of the enclosed volume),
``deformation_theory``, ``deformation_error`` (relative), ``deformation_fit`` and
``relaxation_rate`` (a fit of the relaxation law to ``D(t)``, per step),
``relaxation_rate_theory`` and ``relaxation_rate_error`` (C = 1 and neo-Hookean
only), ``inclination_deg``, ``volume_drift`` and ``area_drift`` (largest relative
change over the run), ``shear_rate``, ``shear_modulus``, ``relaxation_time``.

A run too short to judge leaves figures unset (``None`` in JSON) with a
``warnings`` entry naming the steps needed: ``deformation_error`` and
``deformation_fit`` need :data:`MIN_RELAXATION_TIMES` relaxation times (or a run
that stopped once steady), the relaxation rate a fit over
:data:`MIN_FIT_SAMPLES` samples spanning one relaxation time.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from lbm_jax.cases import _common
from lbm_jax.cases._common import CaseSetup
from lbm_jax.core._units import check_tau, viscosity
from lbm_jax.core._validation import check_int

__all__ = [
    "CPU_RADIUS",
    "DEFAULT_DELTA",
    "DEFAULT_RADIUS",
    "DEVICE_DEFAULTS",
    "deformation_theory",
    "fit_relaxation",
    "mesh_nodes",
    "prepare",
    "build",
    "relaxation_rate",
]

#: Relaxation rate of the linear theory, in units of ``G_s / (mu r)``, for C = 1.
RELAXATION_S = 0.2484

#: Default capsule radius (cells). The IBM's effective-radius error falls as
#: about 1/r (measured on a CPU, Ca = 0.03: D 10.4 % above theory at r = 4 and
#: 6.5 % at r = 5 with the 2-point delta function, 15.7 % and 12.2 % with the
#: 4-point one, so about 3 % expected at r = 12 with 2 points and 5.2 % with
#: 4); the full-scale convergence study (``python -m experiments lbm_capsule
#: --full``) checks r = 12 against the 5 % target. A 120^3 box: the default on a
#: GPU; on a CPU the default is :data:`CPU_RADIUS` (:data:`DEVICE_DEFAULTS`).
DEFAULT_RADIUS = 12.0

#: Default capsule radius on a CPU backend (cells): a 50^3 box, minutes on two
#: cores, with D about 6.5 % above theory (2-point delta function).
CPU_RADIUS = 5.0

#: The defaults that depend on the device: option -> (on a CPU, on a GPU).
DEVICE_DEFAULTS = {"capsule": {"radius": (CPU_RADIUS, DEFAULT_RADIUS)}}

#: Default width of the delta function (points). The 2-point kernel's narrower
#: support about halves the effective-radius error of the 4-point one (measured
#: at r = 5: D 6.5 % and the rate 1.1 % off theory, against 12.2 % and 8.8 %).
DEFAULT_DELTA = 2

#: Relaxation times before ``D`` counts as steady (``exp(-5)``: 0.7 % left).
MIN_RELAXATION_TIMES = 5.0

#: Samples, over at least one relaxation time, a fit of the relaxation rate needs.
MIN_FIT_SAMPLES = 8

#: Largest node speed (cells per step) the explicit coupling accepts.
MAX_NODE_SPEED = 1.0 / 3.0

_DEFAULTS: dict[str, Any] = {
    "collision": "bgk",
    "magic": 3.0 / 16.0,
    "radius": DEFAULT_RADIUS,
    "ca": 0.03,
    "law": "skalak",
    "skalak_c": 1.0,
    "delta": DEFAULT_DELTA,
    "nodes": None,
    "tau": 1.0,
    "width": None,
    "tol": 1e-3,
    "max_times": 12.0,
    "samples_per_time": 16,
}


def mesh_nodes(radius: float) -> int:
    """Default icosphere nodes for ``radius``: mean edge 0.6-0.9 cells up to r = 12.

    642 nodes up to r = 6 (edge 0.75 cells at r = 5), 2562 up to r = 12, 10242
    above (an edge much longer than a cell lets fluid leak through the mesh).

    >>> mesh_nodes(5.0), mesh_nodes(8.0), mesh_nodes(16.0)
    (642, 2562, 10242)
    """
    return 642 if radius <= 6.0 else 2562 if radius <= 12.0 else 10242


def deformation_theory(ca: float, law: str, skalak_c: float = 1.0) -> float:
    """Steady Taylor deformation of small-deformation theory.

    >>> round(deformation_theory(0.03, "skalak", 1.0), 4)
    0.0625
    """
    if law == "neo-hookean":
        return 25.0 / 12.0 * ca
    return 1.25 * (2.0 + 3.0 * skalak_c) / (1.0 + 2.0 * skalak_c) * ca


def relaxation_rate(
    shear_rate: float, ca: float, law: str, skalak_c: float = 1.0
) -> float | None:
    """Linear-theory relaxation rate of ``D`` per time unit, ``s G_s / (mu r)``.

    Known for C = 1 and the neo-Hookean law (``None`` otherwise); with
    ``G_s = mu gamma_dot r / Ca`` it is ``s gamma_dot / Ca``.
    """
    if law == "neo-hookean" or skalak_c == 1.0:
        return RELAXATION_S * shear_rate / ca
    return None


def fit_relaxation(t: np.ndarray, d: np.ndarray) -> tuple[float, float]:
    """Least-squares fit of ``D(t) = D_inf (1 - exp(-k t))``: ``(D_inf, k)``.

    For each rate ``k`` the best ``D_inf`` is linear; the rate minimising the
    residual is found on a logarithmic grid and refined by golden-section search.

    >>> t = np.arange(0.0, 50.0)
    >>> d_inf, k = fit_relaxation(t, 0.06 * (1 - np.exp(-0.1 * t)))
    >>> round(d_inf, 6), round(k, 6)
    (0.06, 0.1)
    """
    t = np.asarray(t, np.float64)
    d = np.asarray(d, np.float64)

    def solve(k: float) -> tuple[float, float]:
        basis = 1.0 - np.exp(-k * t)
        amp = float(basis @ d / max(basis @ basis, 1e-300))
        return float(np.sum((amp * basis - d) ** 2)), amp

    span = max(float(t.max() - t.min()), 1e-12)
    grid = np.geomspace(0.01 / span, 100.0 / span, 400)
    best = int(np.argmin([solve(k)[0] for k in grid]))
    lo, hi = grid[max(best - 1, 0)], grid[min(best + 1, grid.size - 1)]
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    for _ in range(100):
        a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        if solve(a)[0] < solve(b)[0]:
            hi = b
        else:
            lo = a
    k = float(0.5 * (lo + hi))
    return solve(k)[1], k


def prepare(
    case: str,
    *,
    n: int | None,
    re: float | None,
    storage: Any,
    steps: int | None,
    options: dict[str, Any],
) -> CaseSetup:
    """Validate and derive the capsule parameters (see the module docstring)."""
    from lbm_jax.ibm import LAWS, icosphere, kernel_support

    opts = _common.merge_options(case, options, _DEFAULTS)
    radius = opts["radius"] = float(opts["radius"])
    if not radius >= 2.0:
        raise ValueError(
            f"radius must be at least 2 cells (a capsule smaller than the kernel "
            f"cannot be resolved), got {radius}."
        )
    if not opts["ca"] > 0:
        raise ValueError(f"ca (capillary number) must be positive, got {opts['ca']}.")
    if not isinstance(opts["law"], str) or opts["law"] not in LAWS:
        raise ValueError(f"Unknown law {opts['law']!r}; expected one of {LAWS}.")
    if not opts["skalak_c"] >= 0:
        raise ValueError(f"skalak_c must be non-negative, got {opts['skalak_c']}.")
    opts["delta"] = points = kernel_support(opts["delta"])
    if opts["nodes"] is None:
        opts["nodes"] = mesh_nodes(radius)
    opts["nodes"] = check_int(opts["nodes"], "nodes", 12)
    icosphere(radius, nodes=opts["nodes"])  # rejects a node count it cannot build
    tau = check_tau(opts["tau"], context="tau")
    height = check_int(round(10 * radius) if n is None else n, "n", 4)
    width = height if opts["width"] is None else opts["width"]
    if isinstance(width, float) and width.is_integer():  # as --width parses it
        width = int(width)
    opts["width"] = width = check_int(width, "width", 4)
    gap = 2.0 * radius + points + 2
    if height < gap or width < gap:
        raise ValueError(
            f"the box ({width} x {width} x {height} cells) is too small for a "
            f"capsule of radius {radius} with the {points}-point kernel: "
            f"every side needs at least 2 r + {points + 2} = {gap:g} cells; "
            "raise n (the height) or width, or lower radius."
        )
    re = 0.02 if re is None else re
    shear_rate, wall_speed = _shear(re, opts["ca"], tau, radius, height)
    opts["tol"] = float(opts["tol"])
    if opts["max_times"] <= 0 or opts["tol"] < 0:
        raise ValueError(
            "max_times must be positive and tol non-negative, got "
            f"{opts['max_times']} and {opts['tol']}."
        )
    opts["samples_per_time"] = check_int(
        opts["samples_per_time"], "samples_per_time", 2
    )
    opts["shear_rate"] = shear_rate
    rate = RELAXATION_S * shear_rate / opts["ca"]
    opts["relaxation_time"] = 1.0 / rate
    steps_given = steps is not None
    if steps is None:
        steps = math.ceil(opts["max_times"] / rate)
    return CaseSetup(
        case=case,
        lattice="D3Q19",
        storage=storage,
        collision=opts.pop("collision"),
        magic=opts.pop("magic"),
        n=height,
        re=re,
        tau=tau,
        u_ref=wall_speed,
        steps=steps,
        steps_given=steps_given,
        options=opts,
        runner=_run,
        builder=build,
        figures=(),
        write_files=_write_files,
        shape=(width, width, height + 2),
    )


def _shear(
    re: float, ca: float, tau: float, radius: float, height: int
) -> tuple[float, float]:
    """The shear rate ``gamma_dot = Re nu / r^2`` and the wall speed
    ``gamma_dot H / 2``, both checked: the wall below the Mach limit, the
    membrane's velocity scale ``gamma_dot r / Ca`` below :data:`MAX_NODE_SPEED`.

    Raises:
        ValueError: A speed above its limit.
    """
    nu = viscosity(tau)
    shear_rate = re * nu / radius**2
    wall_speed = shear_rate * height / 2.0
    _common.check_speed(wall_speed, what=f"wall speed gamma_dot H / 2 (re={re:g})")
    elastic_speed = shear_rate * radius / ca
    if elastic_speed > MAX_NODE_SPEED:
        raise ValueError(
            f"ca={ca:g} with re={re:g} gives a membrane velocity scale "
            f"G_s / mu = gamma_dot r / Ca = {elastic_speed:.3g} cells per step, above "
            f"{MAX_NODE_SPEED:.3g}: nodes would move too far per step. Raise ca or "
            "lower re."
        )
    return shear_rate, wall_speed


def _shear_cell(setup: CaseSetup) -> tuple[Any, np.ndarray]:
    """The sheared channel of a prepared capsule case and its initial velocity.

    Returns:
        ``(simulation, u)``: the D3Q19 simulation (wall layers at z index 0 and
        ``H + 1``, moving at ``-/+ gamma_dot H / 2``) and the linear shear profile
        ``(3, *shape)`` (the wall cells hold their wall velocity).
    """
    from lbm_jax.core._boundaries import CellType
    from lbm_jax.sim._simulation import Simulation

    opts = setup.options
    h = setup.n
    shape = setup.shape
    cell_type = np.zeros(shape, np.int32)
    cell_type[..., 0] = cell_type[..., -1] = CellType.WALL
    z = np.arange(h + 2, dtype=np.float64) - 0.5  # wall planes at z = 0 and H
    profile = opts["shear_rate"] * (np.clip(z, 0.0, h) - h / 2.0)
    u = np.zeros((3, *shape))
    u[0] = profile
    sim = Simulation(
        setup.lattice,
        shape,
        tau=setup.tau,
        storage=setup.storage,
        collision=setup.collision,
        magic=setup.magic,
        cell_type=cell_type,
        wall_velocity=u * (cell_type == CellType.WALL),
    )
    return sim, u


def build(setup: CaseSetup) -> tuple[Any, Any]:
    """The coupled capsule of a prepared case and its initial state.

    Returns:
        ``(ib, state)``: the :class:`lbm_jax.ibm.ImmersedBoundary` (the sheared
        D3Q19 channel, wall layers at z index 0 and ``H + 1`` moving at
        ``-/+ gamma_dot H / 2``, and a spherical membrane at the box centre with
        ``G_s = mu gamma_dot r / Ca``) and its state: the linear shear profile
        and the sphere at rest.
    """
    from lbm_jax.ibm import ImmersedBoundary, Membrane, icosphere

    opts = setup.options
    radius = opts["radius"]
    sim, u0 = _shear_cell(setup)
    centre = tuple((s - 1) / 2.0 for s in sim.shape)
    mesh = icosphere(radius, nodes=opts["nodes"], center=centre)
    shear_modulus = setup.nu * opts["shear_rate"] * radius / opts["ca"]  # rho = 1
    membrane = Membrane(
        mesh, law=opts["law"], shear_modulus=shear_modulus, skalak_c=opts["skalak_c"]
    )
    ib = ImmersedBoundary(sim, membrane, delta=opts["delta"])
    return ib, ib.init(sim.init(1.0, u0))


def _drive(setup: CaseSetup, ib: Any, state: Any, driver: dict[str, Any]) -> Any:
    """Run the coupled capsule with the driver's options, sampling its deformation,
    inclination, volume and area; a run of the default length stops once the
    deformation is steady."""
    import jax.numpy as jnp

    from lbm_jax.ibm import area, shear_plane_deformation, volume
    from lbm_jax.runs._driver import run
    from lbm_jax.runs._stop import steady

    opts = setup.options
    gamma, ca = opts["shear_rate"], opts["ca"]
    faces = jnp.asarray(ib.membrane.faces)

    def observe(state: Any) -> dict[str, Any]:
        d, theta = shear_plane_deformation(state.nodes, faces)
        return {
            "D": d,
            "theta": theta,
            "volume": volume(state.nodes, faces),
            "area": area(state.nodes, faces),
        }

    rate = RELAXATION_S * gamma / ca
    sample_every = max(1, round(1.0 / (rate * opts["samples_per_time"])))
    stop = None
    if not setup.steps_given:
        on_d = steady(opts["tol"], lag=opts["samples_per_time"])

        def stop(state: Any, history: Any) -> Any:
            return on_d(state, history._replace(values=history.values["D"]))

    return run(
        ib.step,
        state,
        setup.steps,
        healthy=ib.healthy,
        observe=observe,
        sample_every=sample_every,
        stop=stop,
        **driver,
    )


def _run(setup: CaseSetup, driver: dict[str, Any]) -> tuple[dict, dict, dict]:
    """Run a prepared capsule case; its metrics against the theory, its sampled
    time series and final fields."""
    opts = setup.options
    ca, law, c = opts["ca"], opts["law"], opts["skalak_c"]
    gamma = opts["shear_rate"]
    ib, state = build(setup)
    membrane, sim = ib.membrane, ib.sim
    result = _drive(setup, ib, state, driver)
    samples = {k: np.asarray(v, np.float64) for k, v in result.samples.values.items()}
    t = np.asarray(result.samples.steps, np.float64)
    x0 = membrane.reference_nodes
    v0, a0 = membrane.reference_volume, membrane.reference_area
    d_theory = deformation_theory(ca, law, c)
    d_last = float(samples["D"][-1]) if t.size else math.nan
    k_theory = relaxation_rate(gamma, ca, law, c)
    steady_d, fitted, warnings = _trusted(setup, t, result.stats.stopped)
    d_fit, k_fit = fit_relaxation(t, samples["D"]) if fitted else (math.nan,) * 2
    if not steady_d:
        d_fit = math.nan
    rho, u = (
        np.asarray(a, np.float64)[..., 1:-1] for a in sim.fields(result.state.fluid)
    )
    metrics = {
        "steps": result.stats.total_steps,
        "mlups": result.stats.mlups,
        # the membrane force is passed per call (ImmersedBoundary.step)
        **_common.step_fields(sim, per_call_force=True),
        "taylor_deformation": d_last,
        "deformation_theory": d_theory,
        "deformation_error": abs(d_last - d_theory) / d_theory if steady_d else None,
        "deformation_fit": d_fit,
        "relaxation_rate": k_fit,
        "relaxation_rate_theory": k_theory,
        "relaxation_rate_error": None
        if k_theory is None or not fitted
        else abs(k_fit - k_theory) / k_theory,
        "inclination_deg": math.degrees(float(samples["theta"][-1]))
        if t.size
        else math.nan,
        # a run shorter than one sampling interval has no samples
        "volume_drift": float(np.max(np.abs(samples["volume"] / v0 - 1.0)))
        if t.size
        else math.nan,
        "area_drift": float(np.max(np.abs(samples["area"] / a0 - 1.0)))
        if t.size
        else math.nan,
        "shear_rate": gamma,
        "shear_modulus": membrane.shear_modulus,
        "stopped_early": result.stats.stopped,
        "warnings": warnings,
    }
    nodes = np.asarray(result.state.nodes, np.float64)
    extras = {
        "t": t,
        **samples,
        "nodes": nodes,
        "faces": np.asarray(membrane.faces),
        "reference_nodes": x0,
        "node_forces": np.asarray(membrane.forces(result.state.nodes), np.float64),
    }
    return metrics, {"rho": rho, "u": u}, extras


def _trusted(
    setup: CaseSetup, t: np.ndarray, stopped: bool
) -> tuple[bool, bool, list[str]]:
    """``(steady, fitted, warnings)``: whether the run is long enough for the
    steady deformation and for a fit of the relaxation rate, and why not."""
    tau_r = setup.options["relaxation_time"]
    ran = float(t[-1]) if t.size else 0.0
    steady_d = stopped or ran >= MIN_RELAXATION_TIMES * tau_r
    fitted = t.size >= MIN_FIT_SAMPLES and ran >= tau_r
    warnings = []
    if not steady_d:
        need = math.ceil(MIN_RELAXATION_TIMES * tau_r)
        warnings.append(
            f"run too short for the steady deformation: {ran:.0f} steps are "
            f"{ran / tau_r:.2g} relaxation times (mu r / (s G_s) = {tau_r:.0f} "
            f"steps), D needs {MIN_RELAXATION_TIMES:g}; deformation_error and "
            f"deformation_fit are left unset. Give steps={need}, or leave steps "
            "unset to run until D is steady."
        )
    if not fitted:
        every = float(t[1] - t[0]) if t.size > 1 else float(ran)
        need = math.ceil(max(tau_r, MIN_FIT_SAMPLES * every))
        warnings.append(
            f"run too short to fit the relaxation rate: {t.size} sample(s) over "
            f"{ran:.0f} steps, the fit needs {MIN_FIT_SAMPLES} over one relaxation "
            f"time ({tau_r:.0f} steps); relaxation_rate and relaxation_rate_error "
            f"are left unset. Give steps={need} or more."
        )
    return steady_d, fitted, warnings


def _write_files(
    out: Path, summary: dict[str, Any], fields: dict, extras: dict
) -> list[Path]:
    """``membrane.npz``, ``membrane.vtp`` and the figures D(t) and a snapshot."""
    from lbm_jax.io import _files, _plot

    files = []
    npz = out / "membrane.npz"
    np.savez_compressed(
        npz,
        nodes=extras["nodes"],
        faces=extras["faces"],
        reference_nodes=extras["reference_nodes"],
        forces=extras["node_forces"],
    )
    files.append(npz)
    files.append(
        _files.write_vtp(
            out / "membrane.vtp",
            extras["nodes"],
            extras["faces"],
            point_data={
                "force": extras["node_forces"],
                "displacement": extras["nodes"] - extras["reference_nodes"],
            },
        )
    )
    title = f"capsule, Ca = {summary['ca']:g} ({summary['storage']})"
    files.append(
        _plot.save_figure(
            _plot.deformation_figure(
                extras["t"],
                extras["D"],
                summary["deformation_theory"],
                summary["relaxation_rate_theory"],
                title=f"Taylor deformation: {title}",
            ),
            out / "deformation.png",
        )
    )
    files.append(
        _plot.save_figure(
            _plot.capsule_snapshot_figure(
                fields["u"],
                extras["nodes"] - np.array([0.0, 0.0, 1.0]),  # fields skip the wall
                extras["faces"],
                title=f"x-z section, Ca = {summary['ca']:g}\n{summary['storage']}",
            ),
            out / "snapshot.png",
        )
    )
    return files
