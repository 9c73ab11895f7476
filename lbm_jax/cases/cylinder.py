"""Flow past a circular cylinder: Schaefer-Turek 2D-2 and the unconfined vortex street.

Both cases use D2Q9, a staircase cylinder of diameter ``n`` cells (half-way
bounce-back), equilibrium cells at the inlet (first x column) and outlet (last x
column, density 1), and the momentum-exchange force on the cylinder, sampled inside
the compiled loop. ``u_ref`` is the mean inflow speed and ``re = u_ref n / nu``.

``cylinder`` (Schaefer & Turek 1996, benchmark 2D-2, Re = 100): a channel of height
``4.1 D`` and length ``22 D`` between no-slip walls, the cylinder centred ``2 D``
from the inlet and ``2 D`` above the lower wall (the slight asymmetry starts the
shedding), a parabolic inflow with maximum ``1.5 u_ref``. The outlet holds the
inflow profile at density 1. Reference ranges: St 0.295-0.305, cd_max 3.22-3.24,
cl_max 0.99-1.01.

The default collision is BGK. TRT with Lambda = 3/16 or 1/4 has an antisymmetric
relaxation time 1/2 + Lambda / (tau - 1/2) of 7-13 at tau = 0.515-0.53, and then the
equilibrium inlet drives a growing, sign-alternating mode in the first fluid columns:
a linear stability analysis of the step (inlet and outlet of equilibrium cells,
uniform flow) gives growth for tau <= 0.53 with inflow >= 0.075, none for tau >= 0.55
or for small Lambda (e.g. 1/40); BGK is stable there. At the default D = 20,
u_ref = 0.05 (tau = 0.53) TRT happens to run stably; at D = 10 it does not.

``cylinder_unconfined``: a box ``length x width`` diameters (default 30 x 20),
periodic across the flow, uniform inflow ``u_ref``, the cylinder ``length_front``
diameters downstream of the inlet and ``offset`` diameters off the centre line.
Reference at Re = 100: St 0.164-0.169, mean drag 1.32-1.38 (the 5 % blockage of the
default box raises both slightly).

Coefficients use the mean inflow speed and the diameter: ``cd = 2 F_x / (u_ref^2
D)``, ``cl = 2 F_y / (u_ref^2 D)`` (their extremes and mean over the analysis
window, the last ``window`` fraction of the run); ``strouhal = f D / u_ref`` with
the shedding frequency ``f`` of the periodic end of the lift signal
(:func:`periodic_tail`): the start-up transient (pressure waves, the growing
wake) is detected and left out, not assumed to have passed. Metrics:
``strouhal``, ``cd_max``, ``cd_mean``, ``cl_max``, ``cl_amplitude``, ``periods``
(periodic shedding cycles after the transient). Fewer than :data:`MIN_PERIODS`
leave ``strouhal`` unset (NaN, ``None`` in JSON) and add a ``warnings`` entry
saying how many steps a run needs; without ``steps`` the run lasts ``run_times``
convective times ``D / u_ref`` (default 60 confined, 200 unconfined).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lbm_jax.cases import _common, _reference
from lbm_jax.cases._common import CaseSetup
from lbm_jax.core._units import check_mach, check_tau, tau_from_re
from lbm_jax.core._validation import check_int

__all__ = ["MIN_PERIODS", "periodic_tail", "prepare", "shedding_frequency"]

#: Periodic shedding cycles the lift must show after its start-up transient for a
#: Strouhal number; fewer add a warning to the summary.
MIN_PERIODS = 2

#: A cycle belongs to the periodic end of a signal when its period is within
#: ``PERIOD_TOLERANCE`` of the last cycle's and its peak-to-peak amplitude within
#: ``AMPLITUDE_TOLERANCE`` (below, above) of it: a wake still saturating (earlier
#: cycles smaller; its frequency settles first) counts, dying waves (earlier
#: cycles larger) do not.
PERIOD_TOLERANCE = 0.05
AMPLITUDE_TOLERANCE = (0.25, 0.05)

#: Samples a period needs for its crossings and amplitude to be resolved.
MIN_SAMPLES_PER_PERIOD = 8

_DEFAULTS: dict[str, dict[str, Any]] = {
    "cylinder": {
        "collision": "bgk",
        "magic": 3.0 / 16.0,
        "u_ref": 0.05,
        "run_times": 60.0,
        "window": 0.35,
        "samples_per_time": 25,
    },
    "cylinder_unconfined": {
        "collision": "bgk",
        "magic": 3.0 / 16.0,
        "u_ref": 0.05,
        "run_times": 200.0,
        "window": 0.25,
        "samples_per_time": 10,
        "length": 30.0,
        "width": 20.0,
        "length_front": 8.0,
        # Off the centre line by 0.13 D: the box is periodic across the flow, so a
        # cylinder centred on a cell centre or face (0.1 D at D = 10 or 20) leaves it
        # mirror-symmetric and shedding starts from round-off alone, thousands of
        # steps apart between number formats. At 0.13 D the staircase cylinder itself
        # breaks the symmetry and the street starts at once.
        "offset": 0.13,
    },
}


def shedding_frequency(signal: np.ndarray, dt: float) -> tuple[float, int]:
    """Frequency of a periodic signal from its upward crossings of its mean.

    Args:
        signal: Uniformly sampled values.
        dt: Sampling interval.

    Returns:
        ``(frequency, periods)``: ``nan`` and the number of full periods found when
        fewer than one full period is present.
    """
    s = np.asarray(signal, dtype=np.float64) - float(np.mean(signal))
    idx = np.nonzero((s[:-1] < 0) & (s[1:] >= 0))[0]
    crossings = idx + s[idx] / (s[idx] - s[idx + 1])  # linear interpolation
    periods = len(crossings) - 1
    if periods < 1:
        return math.nan, max(periods, 0)
    return periods / ((crossings[-1] - crossings[0]) * dt), periods


def periodic_tail(signal: np.ndarray, dt: float) -> tuple[float, int, int]:
    """Frequency of the periodic end of a signal, its start-up transient left out.

    The cycles run between upward crossings of the mean of the signal's second
    half. Walking back from the last cycle, a cycle is periodic while its period
    and peak-to-peak amplitude stay within :data:`PERIOD_TOLERANCE` and
    :data:`AMPLITUDE_TOLERANCE` of the last cycle's; the transient (growing,
    decaying or irregular cycles) ends where that stops. A last cycle shorter than
    :data:`MIN_SAMPLES_PER_PERIOD` samples is not resolved: no periodic cycles.

    >>> t = np.arange(4000) * 0.01
    >>> grow = np.minimum(1.0, t / 20.0)  # a transient: the amplitude grows
    >>> f, periods, start = periodic_tail(grow * np.sin(2 * np.pi * 0.5 * t), 0.01)
    >>> round(f, 4), periods, start  # from t = 14 on: 3/4 of the final amplitude
    (0.5, 12, 1400)

    Args:
        signal: Uniformly sampled values.
        dt: Sampling interval.

    Returns:
        ``(frequency, periods, start)``: the frequency over the periodic cycles
        (``nan`` when there are none), their number and the sample index where
        they begin (the signal's length when there are none).
    """
    s = np.asarray(signal, dtype=np.float64)
    s = s - float(np.mean(s[len(s) // 2 :])) if s.size else s
    idx = np.nonzero((s[:-1] < 0) & (s[1:] >= 0))[0]
    crossings = idx + s[idx] / (s[idx] - s[idx + 1])  # linear interpolation
    if len(crossings) < 2:
        return math.nan, 0, len(s)
    periods = np.diff(crossings)
    amplitudes = np.array(
        [np.ptp(s[a : b + 2]) for a, b in zip(idx[:-1], idx[1:], strict=True)]
    )
    if periods[-1] < MIN_SAMPLES_PER_PERIOD:
        return math.nan, 0, len(s)
    below, above = AMPLITUDE_TOLERANCE
    ratio = amplitudes / amplitudes[-1]
    same = (np.abs(periods / periods[-1] - 1.0) <= PERIOD_TOLERANCE) & (
        (ratio >= 1.0 - below) & (ratio <= 1.0 + above)
    )
    first = len(same)
    while first > 0 and same[first - 1]:
        first -= 1
    count = len(same) - first
    span = (crossings[-1] - crossings[first]) * dt
    return float(count / span), count, int(idx[first])


def prepare(
    case: str,
    *,
    n: int | None,
    re: float | None,
    storage: Any,
    steps: int | None,
    options: dict[str, Any],
) -> CaseSetup:
    """Validate and derive the cylinder parameters (see the module docstring)."""
    opts = _common.merge_options(case, options, _DEFAULTS[case])
    n = check_int(20 if n is None else n, "n", 4)
    re = 100.0 if re is None else re
    u_ref = opts.pop("u_ref")
    if not u_ref > 0:
        raise ValueError(
            f"u_ref (the mean inflow speed) must be positive, got {u_ref}."
        )
    if case == "cylinder":
        check_mach(1.5 * u_ref, what="the peak inflow speed 1.5 u_ref")
    else:
        check_mach(u_ref, what="the inflow speed u_ref")
    tau = tau_from_re(re, u_ref=u_ref, length=n)
    check_tau(tau, context=f"re={re:g} with n={n}, u_ref={u_ref:g}")
    if not 0 < opts["window"] <= 1:
        raise ValueError(f"window must be in (0, 1], got {opts['window']}.")
    if opts["run_times"] <= 0:
        raise ValueError(f"run_times must be positive, got {opts['run_times']}.")
    opts["samples_per_time"] = check_int(
        opts["samples_per_time"], "samples_per_time", 1
    )
    if case == "cylinder_unconfined":
        if not opts["length"] > opts["length_front"] + 1 > 1.5:
            raise ValueError(
                "The unconfined box must contain the cylinder: need length > "
                "length_front + 1 > 1.5 (in diameters), got "
                f"length={opts['length']}, length_front={opts['length_front']}."
            )
        least = 2 + 2 * abs(opts["offset"])
        if not opts["width"] > least:
            raise ValueError(
                f"width must be above 2 + 2 |offset| = {least:g} diameters for the "
                f"box to contain the cylinder, got width={opts['width']}."
            )
    steps_given = steps is not None
    if steps is None:
        steps = math.ceil(opts["run_times"] * n / u_ref)
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
        steps_given=steps_given,
        options=opts,
        runner=_run,
        builder=build,
        figures=("velocity", "vorticity"),
        shape=_shape(case, n, opts),
    )


def _shape(case: str, n: int, opts: dict[str, Any]) -> tuple[int, int]:
    """The grid: the channel with its wall rows, or the wide periodic box."""
    if case == "cylinder":
        return round(22 * n) + 2, round(4.1 * n) + 2
    return round(opts["length"] * n) + 2, round(opts["width"] * n)


def _geometry(setup: CaseSetup) -> dict[str, np.ndarray]:
    """Cell types, body mask, boundary and initial velocity of the case."""
    from lbm_jax.core._boundaries import CellType

    n, u0, opts = setup.n, setup.u_ref, setup.options
    confined = setup.case == "cylinder"
    shape = setup.shape
    if confined:
        ny = shape[1] - 2
        xc, yc = 2.0 * n, 2.0 * n
    else:
        ny = shape[1]
        xc = opts["length_front"] * n
        yc = ny / 2 + opts["offset"] * n
    # Cell centres: the inlet boundary (x = 0) lies between columns 0 and 1; in the
    # channel the lower wall (y = 0) between rows 0 and 1.
    x = np.arange(shape[0], dtype=np.float64)[:, None] - 0.5
    y = np.arange(shape[1], dtype=np.float64)[None, :] - (0.5 if confined else -0.5)
    cell_type = np.zeros(shape, dtype=np.int8)
    body = (x - xc) ** 2 + (y - yc) ** 2 <= (0.5 * n) ** 2
    cell_type[body] = int(CellType.SOLID)
    u = np.zeros((2, *shape))
    if confined:
        profile = 6.0 * u0 * y * (ny - y) / ny**2  # max 1.5 u0, mean u0
        u[0] = np.broadcast_to(np.clip(profile, 0.0, None), shape)
        cell_type[:, 0] = cell_type[:, -1] = int(CellType.SOLID)
    else:
        u[0] = u0
    cell_type[0, :] = np.where(
        cell_type[0, :] == int(CellType.SOLID),
        cell_type[0, :],
        int(CellType.EQUILIBRIUM),
    )
    cell_type[-1, :] = np.where(
        cell_type[-1, :] == int(CellType.SOLID),
        cell_type[-1, :],
        int(CellType.EQUILIBRIUM),
    )
    fluid_like = cell_type != int(CellType.SOLID)
    u = u * fluid_like
    return {"cell_type": cell_type, "body": body, "u": u}


def _shedding_warnings(setup: CaseSetup, steps: int, periods: int) -> list[str]:
    """Why the Strouhal number is missing, and the run that fixes it."""
    if periods >= MIN_PERIODS:
        return []
    t_conv = setup.n / setup.u_ref
    found = (
        f"the lift shows {periods} periodic shedding cycle(s) after its start-up "
        f"transient in {steps} steps (= {steps / t_conv:.3g} D / U), fewer than "
        f"the {MIN_PERIODS} the Strouhal number needs"
    )
    run_times = _DEFAULTS[setup.case]["run_times"]
    if steps < run_times * t_conv:
        needed = math.ceil(run_times * t_conv)
        return [
            f"run too short to measure the Strouhal number: {found}. Run at least "
            f"{needed} steps at n={setup.n} and u_ref={setup.u_ref:g}: give "
            f"steps={needed}, or run_times={run_times:g} (the default without a "
            "step count)."
        ]
    return [
        f"no Strouhal number measured: {found}. Below Re of about 47 the wake is "
        f"steady; otherwise run longer than run_times={steps / t_conv:.3g}."
    ]


def build(setup: CaseSetup) -> tuple[Any, Any]:
    """The channel or wide box of a prepared case and its initial state.

    Returns:
        ``(sim, state)``: the obstacle as solid cells, equilibrium cells at the
        inlet and outlet holding the inflow, and the inflow everywhere at t = 0.
    """
    from lbm_jax.sim._simulation import Simulation

    geo = _geometry(setup)
    sim = Simulation(
        setup.lattice,
        geo["cell_type"].shape,
        tau=setup.tau,
        storage=setup.storage,
        collision=setup.collision,
        magic=setup.magic,
        cell_type=geo["cell_type"],
        boundary_velocity=geo["u"],
    )
    return sim, sim.init(1.0, geo["u"])


def _run(setup: CaseSetup, driver: dict[str, Any]) -> tuple[dict, dict, dict]:
    from lbm_jax.runs._driver import run
    from lbm_jax.sim._observables import momentum_exchange_force

    geo = _geometry(setup)
    sim, start = build(setup)
    body = geo["body"]
    t_conv = setup.n / setup.u_ref  # one convective time D / U in steps
    every = max(1, round(t_conv / setup.options["samples_per_time"]))
    result = run(
        sim,
        start,
        setup.steps,
        observe=lambda state: momentum_exchange_force(sim, state, body),
        sample_every=every,
        **driver,
    )
    state = result.state
    f_hist = np.asarray(result.samples.values, dtype=np.float64)
    scale = 2.0 / (setup.u_ref**2 * setup.n)
    cd, cl = f_hist[:, 0] * scale, f_hist[:, 1] * scale
    start = int(len(cd) * (1.0 - setup.options["window"]))
    freq, periods, _ = periodic_tail(cl, float(every))
    rho, u = (np.asarray(a, dtype=np.float64) for a in sim.fields(state))
    u = u * (~body)
    metrics: dict[str, Any] = {
        "steps": result.stats.total_steps,
        "mlups": result.stats.mlups,
        **_common.step_fields(sim),
        "grid": list(sim.shape),
        "sample_every": every,
        # too few periods to measure (the warning says so): no figure
        "strouhal": freq * setup.n / setup.u_ref
        if periods >= MIN_PERIODS
        else math.nan,
        "cd_max": float(cd[start:].max()) if cd.size else math.nan,
        "cd_mean": float(cd[start:].mean()) if cd.size else math.nan,
        "cl_max": float(cl[start:].max()) if cl.size else math.nan,
        "cl_amplitude": float(0.5 * np.ptp(cl[start:])) if cl.size else math.nan,
        "periods": periods,
        "warnings": _shedding_warnings(setup, result.stats.total_steps, periods),
    }
    ref = (
        _reference.SCHAEFER_TUREK_2D2
        if setup.case == "cylinder"
        else _reference.UNCONFINED_RE100
    )
    if setup.re == 100:
        metrics["reference"] = {k: list(v) for k, v in ref.items()}
        for key, (lo, hi) in ref.items():
            value = metrics[key]
            mid = 0.5 * (lo + hi)
            metrics[f"{key}_deviation"] = (value - mid) / mid
    extras = {
        "t": result.samples.steps,
        "cd": cd,
        "cl": cl,
        "body": body,
    }
    return metrics, {"rho": rho, "u": u}, extras
