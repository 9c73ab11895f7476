"""Free-surface cases: their runs (through the one run driver) and their files.

:mod:`lbm_jax.cases.free_surface` prepares and builds the four cases; the
functions here run a prepared case and measure it (``run_static_drop``,
``run_capillary_wave``, ``run_impact``) and write its figures (``write_*``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from lbm_jax.cases import _common
from lbm_jax.cases._common import CaseSetup

__all__ = [
    "CROWN_START",
    "MIN_CROWN_SAMPLES",
    "impact_geometry",
    "run_capillary_wave",
    "run_impact",
    "run_static_drop",
    "write_capillary_wave",
    "write_impact",
    "write_static_drop",
]


def impact_geometry(setup: CaseSetup, shape: tuple[int, ...]) -> dict[str, Any]:
    """Pool level, drop centre, ceiling and impact time of an impact case (cells,
    steps)."""
    n = setup.n
    level = 0.5 + setup.options["depth"] * n  # wall plane at z = 1/2
    centre = tuple((s - 1) / 2.0 for s in shape[:-1])
    drop_z = level + 0.5 * n + 1.0  # one cell above the surface
    return {
        "level": level,
        "centre": centre,
        "drop": (*centre, drop_z),
        "ceiling": shape[-1] - 1.5,  # the face of the ceiling wall (the last layer)
        "contact_step": 1.0 / setup.u_ref,
    }


def _fields(fs: Any, state: Any) -> dict[str, np.ndarray]:
    rho, u = fs.fields(state)
    return {
        "rho": np.asarray(rho, np.float64),
        "u": np.asarray(u, np.float64),
        "phi": np.asarray(fs.fill(state), np.float64),
        "flags": np.asarray(state.flags),
    }


def _mass_drift(mass: np.ndarray) -> float:
    mass = np.asarray(mass, np.float64)
    return float(np.max(np.abs(mass / mass[0] - 1.0)))


def _drive(
    fs: Any, state: Any, setup: CaseSetup, observe: Any, every: int, driver: dict
) -> Any:
    """The case's run through the one run driver: ``setup.steps`` steps of the
    free surface, checked by its health test, ``observe`` sampled ``every`` steps."""
    from lbm_jax.runs._driver import run

    return run(
        fs.step,
        state,
        setup.steps,
        healthy=fs.healthy,
        observe=observe,
        sample_every=every,
        **driver,
    )


def run_static_drop(setup: CaseSetup, driver: dict[str, Any]) -> tuple:
    from lbm_jax.free_surface import Flag

    fs, state = setup.build()
    opts = setup.options
    start = float(fs.total_mass(state))
    every = max(1, setup.steps // opts["samples"])
    result = _drive(fs, state, setup, fs.total_mass, every, driver)
    fields = _fields(fs, result.state)
    d = fields["phi"].ndim
    volume = float(fields["phi"].sum())
    radius = (
        math.sqrt(volume / math.pi)
        if d == 2
        else (3 * volume / (4 * math.pi)) ** (1 / 3)
    )
    fluid = fields["flags"] == Flag.FLUID
    pressure = float(fields["rho"][fluid].mean() - 1.0)
    theory = 3.0 * (d - 1) * opts["sigma"] / radius
    mass = np.concatenate([[start], result.samples.values])
    speed = np.sqrt(np.sum(fields["u"] ** 2, axis=0))
    metrics = {
        "steps": result.stats.total_steps,
        "mlups": result.stats.mlups,
        **_common.step_fields(fs),
        "radius_volume": radius,
        "laplace_pressure": pressure,
        "laplace_theory": theory,
        "laplace_error": abs(pressure - theory) / theory,
        "spurious_velocity": float(speed.max()),
        "mass_drift": _mass_drift(mass),
    }
    extras = {"t": np.asarray(result.samples.steps), "mass": mass[1:]}
    return metrics, fields, extras


def run_capillary_wave(setup: CaseSetup, driver: dict[str, Any]) -> tuple:
    import jax.numpy as jnp

    from lbm_jax.free_surface import damped_oscillation

    fs, state = setup.build()
    opts = setup.options
    n = setup.n
    cosine = jnp.asarray(np.cos(2 * math.pi * np.arange(n) / n), jnp.float32)

    def observe(s: Any) -> dict[str, Any]:
        column = jnp.sum(fs.fill(s), axis=1)
        return {
            "amplitude": 2.0 / n * jnp.sum(column * cosine),
            "mass": fs.total_mass(s),
        }

    start = observe(state)
    result = _drive(fs, state, setup, observe, opts["sample_every"], driver)
    t = np.concatenate([[0], np.asarray(result.samples.steps)]).astype(np.float64)
    amp = np.concatenate(
        [[float(start["amplitude"])], result.samples.values["amplitude"]]
    )
    mass = np.concatenate([[float(start["mass"])], result.samples.values["mass"]])
    fit = damped_oscillation(t, amp)
    w, g = opts["frequency_theory"], opts["damping_theory"]
    metrics = {
        "steps": result.stats.total_steps,
        "mlups": result.stats.mlups,
        **_common.step_fields(fs),
        "frequency": fit["frequency"],
        "frequency_error": abs(fit["frequency"] - w) / w,
        "damping": fit["damping"],
        "damping_error": abs(fit["damping"] - g) / g,
        "mass_drift": _mass_drift(mass),
    }
    return metrics, _fields(fs, result.state), {"t": t, "amplitude": amp, "mass": mass}


#: Impact time ``t U / D`` from which the crown radius is fitted by a power law.
CROWN_START = 0.1

#: Crown-radius samples a power-law fit needs; they must span a factor 2 in time.
MIN_CROWN_SAMPLES = 5


def _crown_warnings(setup: CaseSetup, contact: float, fitted: np.ndarray) -> list:
    """Why the crown exponent cannot be trusted from the samples ``fitted`` (impact
    times ``t U / D``), with the steps that give enough; empty when it can."""
    if fitted.size >= MIN_CROWN_SAMPLES and fitted.max() >= 2 * fitted.min():
        return []
    t_unit = setup.n / setup.u_ref  # steps per D / U
    start = contact + CROWN_START * t_unit
    share = 1.0 - (MIN_CROWN_SAMPLES + 1) / setup.options["samples"]
    need = math.ceil(max(contact + 2 * CROWN_START * t_unit, start / max(share, 0.1)))
    return [
        f"run too short for the crown exponent: {fitted.size} crown-radius "
        f"sample(s) after t U / D = {CROWN_START:g}, the power-law fit needs "
        f"{MIN_CROWN_SAMPLES} spanning a factor 2 in time; crown_exponent and "
        f"crown_prefactor are left unset. Give steps={need} or more (or leave steps "
        "unset for the default duration)."
    ]


def run_impact(setup: CaseSetup, driver: dict[str, Any]) -> tuple:
    from lbm_jax.free_surface import count_droplets, crown, power_law, surface_maps

    fs, state = setup.build()
    opts = setup.options
    shape = opts["shape"]
    geo = impact_geometry(setup, shape)
    mid = shape[1] // 2 if len(shape) == 3 else None

    def observe(s: Any) -> dict[str, Any]:
        phi = fs.fill(s)
        top, layer = surface_maps(phi)
        plane = phi if mid is None else phi[:, mid, :]
        return {"top": top, "layer": layer, "slice": plane, "mass": fs.total_mass(s)}

    start = float(fs.total_mass(state))
    result = _drive(fs, state, setup, observe, opts["sample_every"], driver)
    values = {k: np.asarray(v) for k, v in result.samples.values.items()}
    t = np.asarray(result.samples.steps, np.float64)
    rows = [
        crown(top, layer, geo["centre"], geo["level"], setup.n, geo["ceiling"])
        for top, layer in zip(values["top"], values["layer"], strict=True)
    ]
    series = {k: np.array([r[k] for r in rows]) for k in rows[0]}
    tau = (t - geo["contact_step"]) * setup.u_ref / setup.n
    radius = series["crown_radius"]
    window = (tau >= CROWN_START) & np.isfinite(radius)
    exponent, prefactor = power_law(tau[window], radius[window] / setup.n)
    warnings = _crown_warnings(setup, geo["contact_step"], tau[window])
    if warnings:
        exponent = prefactor = math.nan
    touched = np.flatnonzero(series["at_ceiling"])
    ceiling_contact = float(tau[touched[0]]) if touched.size else math.nan
    if touched.size:
        warnings.append(
            f"the splash reached the box's ceiling at t U / D = {ceiling_contact:.2f} "
            f"(step {int(t[touched[0]])}): from there the highest liquid is where it "
            "meets the ceiling, so the crown radius is left unmeasured (NaN) and the "
            "crown height stands at the box's top; a taller box (run_case's height, "
            "in drop diameters) keeps the crown measurable."
        )
    measured = np.flatnonzero(np.isfinite(radius))
    fields = _fields(fs, result.state)
    mass = np.concatenate([[start], values["mass"]])
    metrics = {
        "steps": result.stats.total_steps,
        "mlups": result.stats.mlups,
        **_common.step_fields(fs),
        "crown_exponent": exponent,
        "crown_prefactor": prefactor,
        "crown_fit_samples": int(window.sum()),
        "crown_radius_final": (
            float(radius[measured[-1]] / setup.n) if measured.size else math.nan
        ),
        "ceiling_contact": ceiling_contact,
        "ceiling_height": (geo["ceiling"] - geo["level"]) / setup.n,
        "crown_height_max": float(series["crown_height"].max() / setup.n),
        "cavity_depth_max": float(series["cavity_depth"].max() / setup.n),
        "droplets": count_droplets(fields["phi"] >= 0.5),
        "mass_drift": _mass_drift(mass),
        "warnings": warnings,
    }
    if setup.case == "raindrop":
        metrics["time_ms"] = float(t[-1] * opts["units"]["dt"] * 1e3)
    extras = {
        "t": t,
        "t_impact": tau,
        **series,
        "mass": values["mass"],
        "slices": values["slice"],
        "top": values["top"][-1],
    }
    return metrics, fields, extras


# -- files -----------------------------------------------------------------------


def write_static_drop(out: Path, summary: dict, fields: dict, extras: dict) -> list:
    from lbm_jax.io import _plot

    phi = fields["phi"]
    plane = phi if phi.ndim == 2 else phi[:, :, phi.shape[2] // 2]
    title = (
        f"static drop, R = {summary['radius']:g}, sigma = {summary['sigma']:g} "
        f"({summary['storage']})"
    )
    return [
        _plot.save_figure(
            _plot.fill_figure(plane, title=f"fill level: {title}"), out / "fill.png"
        )
    ]


def write_capillary_wave(out: Path, summary: dict, fields: dict, extras: dict) -> list:
    from lbm_jax.io import _plot

    return [
        _plot.save_figure(
            _plot.oscillation_figure(
                extras["t"],
                extras["amplitude"],
                summary["amplitude"],
                summary["frequency_theory"],
                summary["damping_theory"],
                title=f"capillary wave, wavelength {summary['n']} cells "
                f"({summary['storage']})",
            ),
            out / "amplitude.png",
        )
    ]


def write_impact(out: Path, summary: dict, fields: dict, extras: dict) -> list:
    from lbm_jax.io import _plot

    name = "raindrop" if summary["case"] == "raindrop" else "drop impact"
    title = f"{name}, D = {summary['n']} cells ({summary['storage']})"
    n = summary["n"]
    files = [
        _plot.save_figure(
            _plot.fill_slices_figure(
                extras["slices"],
                extras["t_impact"],
                title=f"mid-plane fill: {title}",
                dims=summary["dims"],
            ),
            out / "slices.png",
        ),
        _plot.save_figure(
            _plot.crown_figure(
                extras["t_impact"],
                extras["crown_radius"] / n,
                extras["crown_height"] / n,
                extras["cavity_depth"] / n,
                summary["crown_exponent"],
                summary["crown_prefactor"],
                ceiling=summary["ceiling_height"],
                title=f"crown and cavity: {title}",
            ),
            out / "crown.png",
        ),
        _plot.save_figure(
            _plot.surface_figure(extras["top"] / n, title=f"liquid surface: {title}"),
            out / "surface.png",
        ),
    ]
    return files
