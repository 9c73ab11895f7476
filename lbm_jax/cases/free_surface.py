"""Free-surface cases (volume of fluid): static drop, capillary wave, drop impact
and the paper's raindrop.

All four run :class:`lbm_jax.free_surface.FreeSurface` through the one run driver;
the vertical axis is the last one (y in 2-D, z in 3-D), with wall layers at its two
ends and periodic side boundaries.

``static_drop``
    A drop of radius ``radius`` at rest in a box of side ``n`` (``dims`` 2 or 3,
    defaults 128^2 and 64^3, ``sigma = 0.005``, ``tau = 1``), no gravity. Metrics:
    the Laplace pressure ``rho_in - 1`` (mean over the fluid cells) against
    ``3 (D - 1) sigma / R`` with ``R`` from the drop's volume, its relative
    error, the spurious currents (largest ``|u|``) and the mass drift.
``capillary_wave``
    2-D standing wave of wavelength ``n`` (default 100) on a layer of ``depth``
    (default ``n/2``), amplitude ``amplitude`` (default ``n/100``),
    ``sigma = 0.02765``, ``nu = 1/54``. Metrics: angular frequency and damping
    rate of the wave's Fourier amplitude (Prony's method) against the normal mode
    of Lamb's viscous dispersion relation, and their relative errors.
``drop_impact``
    A drop of diameter ``n`` cells (default 20) falling at ``u_ref`` (0.05) into a
    pool of ``depth`` diameters, in a box ``width x width x height`` diameters,
    set by the Weber, Ohnesorge and Bond numbers (``we`` 2010, ``oh`` 0.0384,
    ``bo`` 3.18): ``sigma = U^2 D / We``, ``nu = Oh sqrt(sigma D)``,
    ``g = Bo sigma / D^2``. ``duration`` in units of ``D / U`` (default 2).
``raindrop``
    The paper's case in physical units: sea water, D = 4.1 mm, U = 7.21 m/s, 3 ms,
    box 5 D x 5 D x 4.25 D, pool 2 D deep; ``n`` is the drop diameter in cells
    (default 20; the paper's resolution is 84). ``dx = D / n``,
    ``dt = u_ref dx / U``, ``nu = nu_phys dt / dx^2``,
    ``sigma = sigma_phys dt^2 / (rho dx^3)``, ``g = g_phys dt^2 / dx``.

Impacts: a TRT collision with a Smagorinsky subgrid model (``smagorinsky`` 0.1;
0 switches it off) keeps ``tau`` near 1/2 stable. When the physical viscosity
needs ``tau`` below :data:`lbm_jax.MIN_TAU` (float32 cannot resolve it), ``tau``
is raised to it and the summary says so (``tau_physical``, ``tau_raised``).
Metrics: crown radius and height and cavity depth over time (from the surface
maps of :func:`lbm_jax.free_surface.surface_maps`), the exponent of a power-law
fit ``r_crown ~ (t U / D)^p`` after contact, the number of detached droplets at
the end, and the mass drift.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lbm_jax.cases import _common
from lbm_jax.cases._common import CaseSetup
from lbm_jax.cases._free_surface_runs import (
    impact_geometry,
    run_capillary_wave,
    run_impact,
    run_static_drop,
    write_capillary_wave,
    write_impact,
    write_static_drop,
)
from lbm_jax.core._units import MIN_TAU, check_tau, tau_from_viscosity, viscosity
from lbm_jax.core._validation import check_int

__all__ = ["RAINDROP", "floor_and_ceiling", "prepare", "raindrop_units"]

#: The paper's raindrop: sea water, SI units.
RAINDROP: dict[str, float] = {
    "diameter": 4.1e-3,
    "speed": 7.21,
    "density": 1024.81,
    "viscosity": 1.0508e-6,
    "surface_tension": 73.81e-3,
    "gravity": 9.81,
    "duration": 3.0e-3,
}

_IMPACT = {
    "dims": 3,
    "depth": 2.0,
    "width": 5.0,
    "height": 4.25,
    "u_ref": 0.05,
    "collision": "trt",
    "magic": 3.0 / 16.0,
    "smagorinsky": 0.1,
    "samples": 40,
}

_DEFAULTS: dict[str, dict[str, Any]] = {
    "static_drop": {
        "dims": 2,
        "radius": 12.0,
        "sigma": 0.005,
        "tau": 1.0,
        "collision": "bgk",
        "magic": 3.0 / 16.0,
        "samples": 20,
    },
    "capillary_wave": {
        "depth": None,
        "amplitude": None,
        "sigma": 0.02765,
        "tau": 0.5 + 3.0 / 54.0,
        "collision": "bgk",
        "magic": 3.0 / 16.0,
        "periods": 3.0,
        "samples": 40,
    },
    "drop_impact": {
        **_IMPACT,
        "we": 2010.0,
        "oh": 0.0384,
        "bo": 3.18,
        "duration": 2.0,
    },
    "raindrop": {**_IMPACT, "duration": RAINDROP["duration"] * 1e3},
}
_N = {"static_drop": None, "capillary_wave": 100, "drop_impact": 20, "raindrop": 20}


def raindrop_units(cells: int, u_lattice: float = 0.05) -> dict[str, float]:
    """Lattice units of the paper's raindrop with ``cells`` per drop diameter.

    >>> units = raindrop_units(84)
    >>> round(units["tau"], 5), round(units["re"]), round(units["we"])
    (0.50045, 28132, 2959)
    """
    p = RAINDROP
    dx = p["diameter"] / cells
    dt = u_lattice * dx / p["speed"]
    nu = p["viscosity"] * dt / dx**2
    return {
        "dx": dx,
        "dt": dt,
        "nu": nu,
        "tau": tau_from_viscosity(nu),
        "sigma": p["surface_tension"] * dt**2 / (p["density"] * dx**3),
        "g": p["gravity"] * dt**2 / dx,
        "re": p["speed"] * p["diameter"] / p["viscosity"],
        "we": p["density"] * p["speed"] ** 2 * p["diameter"] / p["surface_tension"],
        "fr": p["speed"] / math.sqrt(p["gravity"] * p["diameter"]),
        "bo": p["density"] * p["gravity"] * p["diameter"] ** 2 / p["surface_tension"],
        "steps": p["duration"] / dt,
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
    """Validate and derive a free-surface case (see the module docstring)."""
    if re is not None:
        raise ValueError(
            f"case {case!r} takes no Reynolds number: its viscosity comes from "
            + (
                "tau"
                if case in ("static_drop", "capillary_wave")
                else "the Ohnesorge number oh"
                if case == "drop_impact"
                else "sea water's physical viscosity"
            )
            + "."
        )
    opts = _common.merge_options(case, options, _DEFAULTS[case])
    opts["samples"] = check_int(opts["samples"], "samples", 4)
    derive = {
        "static_drop": _static_drop,
        "capillary_wave": _capillary_wave,
        "drop_impact": _impact,
        "raindrop": _impact,
    }[case]
    n = _N[case] if n is None else n
    return derive(case, n, storage, steps, opts)


def _dims(opts: dict[str, Any]) -> int:
    dims = opts["dims"]
    if dims not in (2, 3):
        raise ValueError(f"dims must be 2 or 3, got {dims!r}.")
    return int(dims)


def _setup(
    case: str,
    opts: dict[str, Any],
    *,
    re: float = 0.0,
    u_ref: float = 0.0,
    figures: tuple[str, ...] = ("velocity",),
    **fields: Any,
) -> CaseSetup:
    """The case's setup; the drop at rest and the wave have no Reynolds number
    or characteristic speed (0) and show their velocity field."""
    return CaseSetup(
        case=case,
        collision=opts.pop("collision"),
        magic=opts.pop("magic"),
        options=opts,
        re=re,
        u_ref=u_ref,
        figures=figures,
        builder=build,
        **fields,
    )


def _static_drop(
    case: str, n: int | None, storage: Any, steps: int | None, opts: dict
) -> CaseSetup:
    dims = opts["dims"] = _dims(opts)
    n = check_int(128 if dims == 2 and n is None else 64 if n is None else n, "n", 8)
    radius = opts["radius"] = float(opts["radius"])
    if not 2.0 <= radius <= (n - 6) / 2:
        raise ValueError(
            f"radius must be in [2, (n - 6) / 2] = [2, {(n - 6) / 2:g}] so that the "
            f"drop fits the box of side {n} with room for its interface, got {radius}."
        )
    if not opts["sigma"] > 0:
        raise ValueError(f"sigma must be positive, got {opts['sigma']}.")
    tau = check_tau(opts.pop("tau"), context="tau")
    steps_given = steps is not None
    if steps is None:  # a few viscous times R^2 / nu
        steps = max(500, math.ceil(6.0 * radius**2 / viscosity(tau) / 100) * 100)
    return _setup(
        case,
        opts,
        lattice="D2Q9" if dims == 2 else "D3Q19",
        storage=storage,
        n=n,
        tau=tau,
        steps=steps,
        steps_given=steps_given,
        runner=run_static_drop,
        write_files=write_static_drop,
        shape=(n,) * dims,
    )


def _capillary_wave(
    case: str, n: int, storage: Any, steps: int | None, opts: dict
) -> CaseSetup:
    from lbm_jax.free_surface import lamb_mode

    n = check_int(n, "n", 16)
    depth = opts["depth"] = float(n / 2 if opts["depth"] is None else opts["depth"])
    amp = float(n / 100 if opts["amplitude"] is None else opts["amplitude"])
    opts["amplitude"] = amp
    if not 0 < amp <= 0.1 * n:
        raise ValueError(
            f"amplitude must be in (0, n/10] = (0, {0.1 * n:g}] for a linear wave, "
            f"got {amp}."
        )
    if not 4 * amp <= depth:
        raise ValueError(f"depth must be at least 4 amplitudes, got {depth}.")
    if not opts["sigma"] > 0:
        raise ValueError(f"sigma must be positive, got {opts['sigma']}.")
    tau = check_tau(opts.pop("tau"), context="tau")
    opts["height"] = math.ceil(depth + max(n / 2, 4 * amp + 4))
    mode = lamb_mode(2 * math.pi / n, viscosity(tau), opts["sigma"], depth=depth)
    opts["frequency_theory"] = mode["frequency"]
    opts["damping_theory"] = mode["damping"]
    period = 2 * math.pi / mode["frequency"]
    steps_given = steps is not None
    if steps is None:
        if not opts["periods"] > 0:
            raise ValueError(f"periods must be positive, got {opts['periods']}.")
        steps = math.ceil(opts["periods"] * period)
    opts["sample_every"] = every = max(1, round(period / opts["samples"]))
    if steps // every + 1 < 8:
        raise ValueError(
            f"steps={steps} gives {steps // every + 1} samples of the wave (one every "
            f"{every} steps); the frequency fit needs at least 8: give steps >= "
            f"{7 * every}, or leave steps unset for the default length."
        )
    return _setup(
        case,
        opts,
        lattice="D2Q9",
        storage=storage,
        n=n,
        tau=tau,
        steps=steps,
        steps_given=steps_given,
        runner=run_capillary_wave,
        write_files=write_capillary_wave,
        shape=(n, opts["height"] + 2),
    )


def _impact(
    case: str, n: int, storage: Any, steps: int | None, opts: dict
) -> CaseSetup:
    dims = opts["dims"] = _dims(opts)
    n = check_int(n, "n", 4)
    u = opts["u_ref"] = float(opts["u_ref"])
    _common.check_speed(u, what="u_ref (the impact speed)")
    for key in ("depth", "width", "height"):
        if not opts[key] > 0:
            raise ValueError(
                f"{key} must be positive (in drop diameters), got {opts[key]}."
            )
    if not opts["depth"] + 1.5 + 2.0 / n <= opts["height"]:
        raise ValueError(
            f"height ({opts['height']} diameters) must leave room above the pool "
            f"(depth {opts['depth']}) for the drop and its splash: at least "
            "depth + 1.5."
        )
    if not opts["width"] >= 1.5:
        raise ValueError(f"width must be at least 1.5 diameters, got {opts['width']}.")
    if not 0 <= opts["smagorinsky"] <= 1:
        raise ValueError(f"smagorinsky must be in [0, 1], got {opts['smagorinsky']}.")
    if case == "raindrop":
        units = raindrop_units(n, u)
        nu, sigma, g = units["nu"], units["sigma"], units["g"]
        opts.update(
            units={k: units[k] for k in ("dx", "dt", "nu", "sigma", "g")},
            we=units["we"],
            re_physical=units["re"],
            fr=units["fr"],
            bo=units["bo"],
        )
        duration = opts["duration"] * 1e-3 / units["dt"]
    else:
        for key in ("we", "oh", "bo"):
            if not opts[key] >= 0 or (key != "bo" and not opts[key] > 0):
                raise ValueError(f"{key} must be positive, got {opts[key]}.")
        sigma = u * u * n / opts["we"]
        nu = opts["oh"] * math.sqrt(sigma * n)
        g = opts["bo"] * sigma / n**2
        opts["fr"] = u / math.sqrt(g * n) if g > 0 else math.inf
        duration = opts["duration"] * n / u
    if not opts["duration"] > 0:
        raise ValueError(f"duration must be positive, got {opts['duration']}.")
    tau_phys = 0.5 + 3.0 * nu
    tau = max(tau_phys, MIN_TAU)
    opts.update(
        sigma=sigma,
        gravity=g,
        nu_physical=nu,
        tau_physical=tau_phys,
        tau_raised=tau > tau_phys,
    )
    opts["shape"] = _impact_shape(dims, n, opts)
    steps_given = steps is not None
    if steps is None:
        steps = math.ceil(duration)
    opts["sample_every"] = max(1, steps // opts["samples"])
    return _setup(
        case,
        opts,
        lattice="D2Q9" if dims == 2 else "D3Q19",
        storage=storage,
        n=n,
        re=u * n / nu,
        tau=tau,
        u_ref=u,
        steps=steps,
        steps_given=steps_given,
        runner=run_impact,
        figures=(),
        write_files=write_impact,
        shape=opts["shape"],
    )


def _impact_shape(dims: int, n: int, opts: dict[str, Any]) -> tuple[int, ...]:
    width = max(round(opts["width"] * n), n + 4)
    height = round(opts["height"] * n) + 2
    return (width,) * (dims - 1) + (height,)


# -- builders --------------------------------------------------------------------


def floor_and_ceiling(shape: tuple[int, ...]) -> np.ndarray:
    """Cell types of a box whose first and last layers along the last (vertical)
    axis are solid walls, the impact and wave cases' container."""
    from lbm_jax.core._boundaries import CellType

    cell_type = np.zeros(shape, np.int32)
    cell_type[..., 0] = cell_type[..., -1] = CellType.SOLID
    return cell_type


def build(setup: CaseSetup) -> tuple[Any, Any]:
    """The free surface of a prepared case and its initial state: ``(fs, state)``."""
    from lbm_jax.free_surface import FreeSurface, sphere_fill
    from lbm_jax.sim._simulation import Simulation

    opts = setup.options
    d = 2 if setup.lattice == "D2Q9" else 3
    rho: Any = 1.0
    u = None
    gravity = None
    shape = setup.shape
    if setup.case == "static_drop":
        cell_type = None
        r = opts["radius"]
        phi = sphere_fill(shape, [setup.n / 2.0] * d, r)
        rho = 1.0 + 3.0 * (d - 1) * opts["sigma"] / r
    elif setup.case == "capillary_wave":
        cell_type = floor_and_ceiling(shape)
        k = 2 * math.pi / setup.n
        sub = (np.arange(16) + 0.5) / 16 - 0.5
        x = np.arange(setup.n)[:, None] + sub[None, :]
        surface = 0.5 + opts["depth"] + opts["amplitude"] * np.cos(k * x)
        z = np.arange(shape[1], dtype=np.float64)
        phi = np.clip(surface[:, :, None] - (z - 0.5), 0.0, 1.0).mean(axis=1)
    else:
        cell_type = floor_and_ceiling(shape)
        phi, rho, u = _impact_initial(setup, shape)
        gravity = (0.0,) * (d - 1) + (-opts["gravity"],)
    sim = Simulation(
        setup.lattice,
        shape,
        tau=setup.tau,
        storage=setup.storage,
        collision=setup.collision,
        magic=setup.magic,
        cell_type=cell_type,
    )
    fs = FreeSurface(
        sim,
        sigma=opts["sigma"],
        gravity=gravity,
        smagorinsky=opts.get("smagorinsky", 0.0),
    )
    return fs, fs.init(phi, rho=rho, u=u)


def _impact_initial(setup: CaseSetup, shape: tuple[int, ...]) -> tuple:
    from lbm_jax.free_surface import sphere_fill

    opts = setup.options
    geo = impact_geometry(setup, shape)
    z = np.arange(shape[-1], dtype=np.float64)
    pool = np.clip(geo["level"] - (z - 0.5), 0.0, 1.0)
    pool = np.broadcast_to(pool, shape)
    drop = sphere_fill(shape, geo["drop"], 0.5 * setup.n, samples=4)
    phi = np.maximum(pool, drop)
    phi[..., 0] = phi[..., -1] = 0.0
    hydro = 1.0 + 3.0 * opts["gravity"] * np.clip(geo["level"] - z, 0.0, None)
    rho = np.where(drop > 0, 1.0 + 6.0 * opts["sigma"] / setup.n, hydro)
    rho = np.broadcast_to(rho, shape)
    u = np.zeros((len(shape), *shape))
    u[-1] = np.where(drop > 0, -setup.u_ref, 0.0)
    return phi, rho, u
