"""The free-surface (volume-of-fluid) model, its observables and its cases.

Measured here (2-core CPU, FP32 unless noted), the values the tolerances rest on:

* curvature of exact circles/spheres, mean ``kappa R`` over the interface cells:
  -0.997 / -1.015 (2-D, R = 4, centred / off-grid), -0.964 / -0.994 (3-D, R = 4),
  within 0.6 % of -1 at R >= 10;
* 2-D static drop (box 2R + 16, default steps): Laplace error 3.6 %, 0.6 %, 1.3 %
  at R = 8, 12, 16; spurious currents 3.8e-5, 1.6e-5, 1.1e-5; FP16S/FP16C at R = 8
  3.7 %; 3-D R = 8 in 24^3 (400 steps) 2.0 %, spurious currents 1.0e-4; 3-D
  R = 12, 16 in 64^3 (1500 steps) 1.0 %, 1.1 %;
* capillary wave (n = 100): frequency 3.4 % and damping 3.6 % off Lamb's mode;
* drop impact, crown exponent 0.49 (2-D, D = 20) and 0.46 (3-D, D = 10);
* mass: the float64 sum of ``mass + carry`` drifts by 1e-13 (static drop) and
  2e-10 (2-D impact) relative; the cases' ``mass_drift`` (``total_mass`` in
  double-word arithmetic) reads 0 in every run here.
"""

from __future__ import annotations

import cmath
import json
import math
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lbm_jax
from lbm_jax import CellType, Collision, CollisionModel, LBMState
from lbm_jax.__main__ import main
from lbm_jax._collision import collide, equilibrium, moments, parse_collision
from lbm_jax.cases import prepare_case, run_case
from lbm_jax.cases.free_surface import RAINDROP, build, raindrop_units
from lbm_jax.free_surface import (
    Flag,
    FreeSurface,
    FreeSurfaceState,
    count_droplets,
    crown,
    curvature,
    damped_oscillation,
    lamb_mode,
    power_law,
    sphere_fill,
    surface_maps,
)

MASS_TOLERANCE = 1e-6  # relative mass drift allowed in FP32 (DESIGN section 6)
DROP_RADII = (8.0, 12.0, 16.0)
SIGMA = 0.005  # the static drop's default surface tension


def _box(radius: float) -> int:
    return int(2 * radius) + 16


def _near(lattice: lbm_jax.Lattice, mask: np.ndarray) -> np.ndarray:
    """Cells with a lattice neighbour in ``mask`` (periodic)."""
    out = np.zeros_like(mask)
    for c in lattice.c:
        if np.any(c):
            out |= np.roll(mask, tuple(int(v) for v in c), axis=tuple(range(mask.ndim)))
    return out


def _exact_mass(state) -> float:
    return float(
        np.asarray(state.mass, np.float64).sum()
        + np.asarray(state.carry, np.float64).sum()
    )


# -- module-scoped runs, shared by the tests below --------------------------------


@pytest.fixture(scope="module")
def drops2d(tmp_path_factory):
    """The 2-D static drop at R = 8, 12, 16 with the case's default step counts;
    the R = 8 run (2400 steps) writes its files and checkpoints every 800 steps."""
    out = tmp_path_factory.mktemp("static_drop")
    return {
        radius: run_case(
            "static_drop",
            n=_box(radius),
            radius=radius,
            **({"out_dir": out, "checkpoint_every": 800} if radius == 8.0 else {}),
        )
        for radius in DROP_RADII
    }, out


@pytest.fixture(scope="module")
def drop3d():
    # 24^3 and 400 steps (~20 s, most of it compiling): the drop starts at the
    # Laplace density, and the pressure settles within an acoustic time
    return run_case("static_drop", dims=3, n=24, radius=8.0, steps=400).summary


@pytest.fixture(scope="module")
def wave():
    return run_case("capillary_wave").summary


@pytest.fixture(scope="module")
def impact2d(tmp_path_factory):
    """The 2-D impact (D = 20), its final state saved as its only checkpoint."""
    out = tmp_path_factory.mktemp("drop_impact")
    return run_case("drop_impact", dims=2, out_dir=out, checkpoint_every=10**6), out


@pytest.fixture(scope="module")
def impact3d(tmp_path_factory):
    """The 3-D impact, D = 10 in a 40 x 40 x 44 box (~25 s)."""
    out = tmp_path_factory.mktemp("drop_impact_3d")
    return run_case("drop_impact", n=10, width=4.0, out_dir=out), out


@pytest.fixture(scope="module")
def impact_state(impact2d):
    """``(fs, initial state's flags, initial mass, final state)`` of that run."""
    _, out = impact2d
    fs, state0 = build(prepare_case("drop_impact", dims=2))
    (path,) = out.glob("checkpoints/step_*.npz")
    saved, _ = lbm_jax.load_state(path)
    state = FreeSurfaceState(
        fluid=LBMState(
            f=jnp.asarray(saved["state/fluid/f"]), t=jnp.asarray(saved["state/fluid/t"])
        ),
        mass=jnp.asarray(saved["state/mass"]),
        flags=jnp.asarray(saved["state/flags"]),
        carry=jnp.asarray(saved["state/carry"]),
    )
    return fs, np.asarray(state0.flags), _exact_mass(state0), state


# -- curvature --------------------------------------------------------------------


@pytest.mark.parametrize("offset", [0.0, 0.37], ids=["centred", "off-grid"])
@pytest.mark.parametrize(("radius", "tolerance"), [(4.0, 0.04), (10.0, 0.01)])
@pytest.mark.parametrize("dims", [2, 3])
def test_curvature_of_exact_circles_and_spheres(dims, radius, tolerance, offset):
    n = int(2 * radius) + 10
    centre = [n / 2 + offset * (a + 1) / dims for a in range(dims)]
    phi = sphere_fill((n,) * dims, centre, radius)
    kappa = np.asarray(curvature(phi.astype(np.float32)), np.float64)
    interface = (phi > 0) & (phi < 1)
    mean = float(np.mean(kappa[interface]) * radius)
    assert abs(mean + 1) < tolerance, mean


def test_curvature_of_a_large_circle_and_a_flat_surface():
    phi = sphere_fill((48, 48), (24.3, 23.8), 16.0)
    kappa = np.asarray(curvature(phi.astype(np.float32)), np.float64)
    interface = (phi > 0) & (phi < 1)
    assert abs(float(np.mean(kappa[interface])) * 16 + 1) < 0.01
    # a bubble (the outside filled) curves the other way
    bubble = np.asarray(curvature((1 - phi).astype(np.float32)), np.float64)
    assert abs(float(np.mean(bubble[interface])) * 16 - 1) < 0.01
    flat = np.zeros((16, 16), np.float32)
    flat[:, :8] = 1.0
    flat[:, 8] = 0.3
    # (only interface cells have a normal; elsewhere kappa is not meaningful)
    np.testing.assert_allclose(np.asarray(curvature(flat))[:, 8], 0.0, atol=1e-6)


# exact fill fields to 1/64 (2-D) and 1/16 (3-D) of a cell: the height function
# reads heights from column sums, so sampling noise of the fill (1/8 per axis by
# default) would show in its second differences. Measured mean kappa R (centred /
# off-grid), the README's table: height 2-D -1.027 / -1.009, -1.005 / -1.005,
# -1.003 / -1.002 at R = 4, 8, 16; 3-D -0.976 / -0.993, -0.990 / -0.994, -0.999 /
# -1.000; smoothed 2-D -0.999 / -1.001, -0.984 / -1.001, -0.996 / -1.000; 3-D
# -0.980 / -0.993, -0.989 / -0.997, -0.999 / -0.999.
CURVATURE_TOLERANCE = {
    ("height", 4.0): 0.03,
    ("height", 8.0): 0.01,
    ("height", 16.0): 0.005,
    ("smoothed", 4.0): 0.03,
    ("smoothed", 8.0): 0.02,
    ("smoothed", 16.0): 0.005,
}


@pytest.mark.parametrize("offset", [0.0, 0.37], ids=["centred", "off-grid"])
@pytest.mark.parametrize("radius", [4.0, 8.0, 16.0])
@pytest.mark.parametrize("method", ["height", "smoothed"])
@pytest.mark.parametrize("dims", [2, 3])
def test_curvature_methods_on_finely_sampled_drops(dims, method, radius, offset):
    n = int(2 * radius) + 10
    centre = [n / 2 + offset * (a + 1) / dims for a in range(dims)]
    phi = sphere_fill((n,) * dims, centre, radius, samples=64 if dims == 2 else 16)
    kappa = np.asarray(curvature(phi.astype(np.float32), method=method))
    interface = (phi > 0) & (phi < 1)
    mean = float(np.mean(kappa[interface], dtype=np.float64) * radius)
    assert abs(mean + 1) < CURVATURE_TOLERANCE[method, radius], mean


@pytest.fixture
def height_model(monkeypatch):
    """The free-surface model with the height-function curvature (compiled
    steps are traced afresh: JAX's caches are cleared before and after)."""
    import functools

    import lbm_jax.free_surface._model as model

    jax.clear_caches()
    monkeypatch.setattr(
        model, "curvature", functools.partial(curvature, method="height")
    )
    yield
    jax.clear_caches()


# ~3 min: the README's figures for the height function inside the model. It holds
# the Laplace law far better (measured: 0.2 % at R = 8, spurious currents 1.9e-7,
# against 3.6 % and 3.8e-5 smoothed) and the short wave's frequency (-3.9 % against
# -6.8 %), but the wave's damping falls further below Lamb's (-11 % against
# -8.3 %): the model's own deficit, which the smoothing partly hid.
@pytest.mark.slow
def test_height_function_in_the_model(height_model):
    drop = run_case("static_drop", n=32, radius=8.0).summary
    assert drop["laplace_error"] < 0.01, drop["laplace_pressure"]
    assert 0 < drop["spurious_velocity"] < 1e-6
    wave = run_case("capillary_wave", n=50).summary
    assert wave["frequency_error"] < 0.05, wave["frequency"]
    assert wave["frequency"] < wave["frequency_theory"]
    assert 0.08 < wave["damping_error"] < 0.14, wave["damping"]
    assert wave["damping"] < wave["damping_theory"]
    # wavelength 100 (the default): frequency -2.1 %, damping -6.3 %
    long = run_case("capillary_wave").summary
    assert long["frequency_error"] < 0.03, long["frequency"]
    assert 0.05 < long["damping_error"] < 0.08, long["damping"]


def _wave_fill(n: int, amplitude: float) -> np.ndarray:
    """Exact fill of ``z = n/2 + amplitude cos(2 pi x / n)`` (64 sub-columns)."""
    sub = (np.arange(64) + 0.5) / 64 - 0.5
    x = np.arange(n)[:, None] + sub[None, :]
    surface = 0.5 + n / 2 + amplitude * np.cos(2 * math.pi * x / n)
    z = np.arange(n + 2, dtype=np.float64)
    return np.clip(surface[:, :, None] - (z - 0.5), 0.0, 1.0).mean(axis=1)


def test_height_function_holds_on_a_gentle_wave_where_smoothing_falls_short():
    # wavelength 50, amplitude 0.5 (the short capillary wave): the curvature
    # amplitude projected on the cosine, against A k^2 (measured: height 0.997,
    # smoothed 0.937)
    n, amp = 50, 0.5
    phi = _wave_fill(n, amp)
    interface = (phi > 0) & (phi < 1)
    k = 2 * math.pi / n
    ratios = {}
    for method in ("height", "smoothed"):
        kappa = np.asarray(curvature(phi.astype(np.float32), method=method))
        column = np.array([kappa[i][interface[i]].mean() for i in range(n)])
        projected = 2 / n * np.sum(column * np.cos(k * np.arange(n)))
        ratios[method] = -projected / (amp * k * k)
    assert abs(ratios["height"] - 1) < 0.01, ratios
    assert ratios["smoothed"] < 0.95, ratios


def test_height_function_reads_a_flat_surface_and_rejects_unknown_methods():
    flat = np.zeros((16, 16, 16), np.float32)
    flat[:, :, :8] = 1.0
    flat[:, :, 8] = 0.3
    kappa = np.asarray(curvature(flat, method="height"))
    np.testing.assert_allclose(kappa[:, :, 8], 0.0, atol=1e-6)
    with pytest.raises(ValueError, match="Unknown curvature method 'plic'"):
        curvature(flat, method="plic")


def test_sphere_fill_volume_and_bounds():
    phi = sphere_fill((20, 20, 20), (10.2, 9.7, 10.0), 6.0)
    assert phi.min() >= 0 and phi.max() <= 1
    assert abs(phi.sum() / (4 / 3 * math.pi * 6.0**3) - 1) < 2e-3
    np.testing.assert_allclose(
        sphere_fill((8, 8), (4, 4), 2.0, inside=False).sum(),
        64 - sphere_fill((8, 8), (4, 4), 2.0).sum(),
    )


# -- static drop: Laplace's law ---------------------------------------------------


@pytest.mark.parametrize("radius", DROP_RADII)
def test_static_drop_2d_obeys_laplace_law(drops2d, radius):
    s = drops2d[0][radius].summary
    assert s["n"] == _box(radius) and s["radius"] == radius
    # the default step count: a few viscous times R^2 / nu
    assert s["steps"] >= 6 * radius**2 / s["nu"]
    assert s["radius_volume"] == pytest.approx(radius, rel=0.01)
    assert s["laplace_theory"] == pytest.approx(3 * SIGMA / radius, rel=0.01)
    assert s["laplace_error"] < 0.05, s["laplace_pressure"]
    # spurious currents exist (the curvature is not exact) and stay small
    assert 0 < s["spurious_velocity"] < 1e-3


@pytest.mark.parametrize("radius", DROP_RADII)
def test_static_drop_2d_conserves_mass(drops2d, radius):
    assert drops2d[0][radius].summary["mass_drift"] <= MASS_TOLERANCE


def test_static_drop_2d_builds_its_laplace_pressure_from_rest():
    # the case starts at the Laplace density; here the drop starts at rho = 1 and
    # surface tension must raise the inside pressure to 3 sigma / R (2-D)
    sim = lbm_jax.Simulation("D2Q9", (32, 32), tau=1.0)
    fs = FreeSurface(sim, sigma=SIGMA)
    state = fs.init(sphere_fill((32, 32), (16.0, 16.0), 8.0))
    mass0 = _exact_mass(state)
    state = lbm_jax.run(fs.step, state, 1200, healthy=fs.healthy).state
    rho, _ = fs.fields(state)
    fluid = np.asarray(state.flags) == Flag.FLUID
    radius = math.sqrt(float(np.asarray(fs.fill(state), np.float64).sum()) / math.pi)
    pressure = float(np.asarray(rho, np.float64)[fluid].mean() - 1)
    assert abs(pressure / (3 * SIGMA / radius) - 1) < 0.05, pressure
    assert abs(_exact_mass(state) / mass0 - 1) < MASS_TOLERANCE


def test_static_drop_3d_obeys_laplace_law(drop3d):
    s = drop3d
    assert s["lattice"] == "D3Q19"
    assert s["laplace_theory"] == pytest.approx(6 * SIGMA / 8.0, rel=0.01)
    assert s["laplace_error"] < 0.05, s["laplace_pressure"]
    assert 0 < s["spurious_velocity"] < 1e-3
    assert s["mass_drift"] <= MASS_TOLERANCE


@pytest.mark.slow
@pytest.mark.parametrize("radius", [12.0, 16.0])
def test_static_drop_3d_obeys_laplace_law_in_64_cubed(radius):
    # 1500 steps rather than the default 5200 / 9300 (~2 min each instead of
    # ~10): the drop starts at the Laplace density, the pressure settles
    # acoustically and the currents within a viscous time R^2 / nu (measured:
    # 1.0 % and 1.1 %, spurious currents 3.7e-5)
    s = run_case("static_drop", dims=3, n=64, radius=radius, steps=1500).summary
    assert s["laplace_theory"] == pytest.approx(6 * SIGMA / radius, rel=0.01)
    assert s["laplace_error"] < 0.05, s["laplace_pressure"]
    assert 0 < s["spurious_velocity"] < 1e-3
    assert s["mass_drift"] <= MASS_TOLERANCE


@pytest.mark.parametrize("storage", ["fp16s", "fp16c"])
def test_static_drop_2d_with_16_bit_storage(storage):
    s = run_case("static_drop", n=32, radius=8.0, storage=storage).summary
    assert s["storage"] == lbm_jax.get_storage(storage).name
    assert s["laplace_error"] < 0.05, s["laplace_pressure"]
    assert 0 < s["spurious_velocity"] < 1e-3
    assert s["mass_drift"] <= MASS_TOLERANCE


# -- mass bookkeeping ---------------------------------------------------------------


def test_total_mass_is_accurate_inside_compiled_code():
    # the cases check mass drifts of 1e-6 with total_mass sampled in the compiled
    # loop: its own error must stay well below that (DESIGN: sum diagnostics in
    # float64; here float32 round-off of the total, a few 1e-8)
    fs, state = build(prepare_case("static_drop", n=32, radius=8.0))
    exact = _exact_mass(state)
    eager = float(fs.total_mass(state))
    compiled = float(jax.jit(fs.total_mass)(state))
    assert abs(eager / exact - 1) < 2e-7, eager - exact
    assert abs(compiled / exact - 1) < 2e-7, compiled - exact


# -- capillary wave -----------------------------------------------------------------


def test_capillary_wave_matches_lambs_normal_mode(wave):
    s = wave
    assert s["n"] == 100 and s["depth"] == 50 and s["amplitude"] == 1.0
    k, nu = 2 * math.pi / 100, s["nu"]
    omega0 = math.sqrt(s["sigma"] * k**3 * math.tanh(k * s["depth"]))
    # the reference is a root of Lamb's dispersion relation (checked by inserting
    # it, not by solving again): (s + 2 nu k^2)^2 + w0^2 = 4 nu^2 k^3 sqrt(k^2 + s/nu)
    root = complex(-s["damping_theory"], s["frequency_theory"])
    residual = (root + 2 * nu * k * k) ** 2 + omega0**2
    residual -= 4 * nu * nu * k**3 * cmath.sqrt(k * k + root / nu)
    assert abs(residual) < 1e-9 * omega0**2, residual
    # and the weakly damped root, not another: damping near 2 nu k^2
    assert 0.8 < s["damping_theory"] / (2 * nu * k * k) < 1.0
    assert s["frequency_theory"] == pytest.approx(omega0, rel=0.01)
    assert s["frequency_error"] < 0.05, s["frequency"]
    assert s["damping_error"] < 0.05, s["damping"]
    assert s["mass_drift"] <= MASS_TOLERANCE


# -- drop impact --------------------------------------------------------------------


def _check_impact(summary: dict, series: dict) -> None:
    assert 0.4 <= summary["crown_exponent"] <= 0.6, summary["crown_exponent"]
    assert summary["crown_fit_samples"] >= 10
    assert isinstance(summary["droplets"], int) and summary["droplets"] >= 0
    assert summary["mass_drift"] <= MASS_TOLERANCE
    radius = series["crown_radius"]
    defined = np.isfinite(radius)
    assert defined.sum() >= 10 and np.all(radius[defined] >= 0)
    assert radius[defined][-1] > radius[defined][0]  # the crown spreads
    for key in ("crown_height", "cavity_depth", "t_impact", "mass"):
        assert np.all(np.isfinite(series[key])), key
    assert np.all(series["crown_height"] >= 0) and np.all(series["cavity_depth"] >= 0)
    assert series["cavity_depth"].max() > 0  # the drop digs a cavity


def test_drop_impact_2d_crown_grows_as_a_square_root(impact2d):
    result, out = impact2d
    s = result.summary
    assert s["lattice"] == "D2Q9" and s["n"] == 20
    with np.load(out / "fields.npz") as data:
        series = {k: data[k] for k in data.files}
    _check_impact(s, series)


# ~20 s: with the slow tests; the 2-D impact checks the same law by default.
@pytest.mark.slow
def test_drop_impact_3d_crown_grows_as_a_square_root(impact3d):
    result, out = impact3d
    assert result.summary["lattice"] == "D3Q19"
    with np.load(out / "fields.npz") as data:
        series = {k: data[k] for k in data.files}
    _check_impact(result.summary, series)
    flags = result.fields["flags"]
    fluid, gas = flags == Flag.FLUID, flags == Flag.GAS
    assert not np.any(fluid & _near(lbm_jax.get_lattice("D3Q19"), gas))


def test_a_short_impact_leaves_the_crown_exponent_unset_and_says_why():
    # 80 steps: contact at step 20, t U / D = 0.1 at step 60: two samples to fit
    s = run_case("drop_impact", dims=2, steps=80).summary
    assert s["crown_exponent"] is None and s["crown_prefactor"] is None
    (warning,) = s["warnings"]
    assert "too short for the crown exponent" in warning
    assert "needs 5 spanning a factor 2 in time" in warning
    needed = int(warning.split("Give steps=")[1].split()[0])
    assert 100 <= needed <= prepare_case("drop_impact", dims=2).steps


def test_drop_impact_sees_no_crown_on_the_undisturbed_pool(impact2d):
    # the first sample is taken at contact: outside the drop's radius the pool
    # is still flat, at the level the case sets (wall plane at z = 1/2, pool
    # depth 2 D), so the crown height must be ~0, not half a cell
    _, out = impact2d
    with np.load(out / "fields.npz") as data:
        t, height = data["t_impact"], data["crown_height"]
    assert t[0] == 0
    assert height[0] < 0.25, height[0]


def test_invariants_after_a_drop_impact(impact_state):
    fs, flags0, mass0, state = impact_state
    flags = np.asarray(state.flags)
    assert flags.dtype == np.int8
    assert set(np.unique(flags)) <= {int(f) for f in Flag}
    # fluid never touches gas, across any lattice link (periodic sides)
    fluid, gas = flags == Flag.FLUID, flags == Flag.GAS
    assert not np.any(fluid & _near(fs.sim.lattice, gas))
    assert np.all(np.unique(flags) == np.arange(4))  # all four kinds occur
    solid = flags == Flag.SOLID
    np.testing.assert_array_equal(solid, flags0 == Flag.SOLID)
    np.testing.assert_array_equal(solid, fs.solid)
    assert np.all(np.asarray(state.mass)[solid] == 0)
    phi = np.asarray(fs.fill(state))
    assert phi.min() >= 0 and phi.max() <= 1
    assert np.all(phi[fluid] == 1) and np.all(phi[gas | solid] == 0)
    assert bool(fs.healthy(state))
    exact = _exact_mass(state)
    assert abs(exact / mass0 - 1) < MASS_TOLERANCE
    for total in (fs.total_mass(state), jax.jit(fs.total_mass)(state)):
        assert float(total) == pytest.approx(exact, rel=2e-7)


# -- observables and theory ---------------------------------------------------------


def test_lamb_mode_limits():
    k = 2 * math.pi / 100
    for nu in (1e-4, 1e-3):
        mode = lamb_mode(k, nu, 0.02765, depth=50)
        assert mode["damping"] == pytest.approx(2 * nu * k * k, rel=0.2)
        assert mode["frequency"] == pytest.approx(mode["omega0"], rel=1e-3)
    inviscid = lamb_mode(k, 1e-12, 0.02765)
    assert inviscid["damping"] < 1e-13
    assert inviscid["frequency"] == pytest.approx(math.sqrt(0.02765 * k**3), rel=1e-9)
    gravity = lamb_mode(k, 1e-12, 0.0, gravity=1e-4, depth=10.0)
    assert gravity["omega0"] == pytest.approx(math.sqrt(1e-4 * k * math.tanh(10 * k)))
    # the doctest's wave (DESIGN section 6: omega ~ 7.38e-3)
    design = lamb_mode(2 * math.pi / 50, 1 / 54, 0.02765, depth=25)
    assert design["omega0"] == pytest.approx(7.38e-3, rel=2e-3)
    assert design["frequency"] < design["omega0"]  # viscosity slows the wave


def test_damped_oscillation_recovers_a_synthetic_signal():
    t = np.arange(0.0, 3000.0, 25.0)
    w, g = 2.6e-3, 1.3e-4
    fit = damped_oscillation(t, 0.3 + 1.5 * np.exp(-g * t) * np.cos(w * t + 0.4))
    assert fit["frequency"] == pytest.approx(w, rel=1e-6)
    assert fit["damping"] == pytest.approx(g, rel=1e-6)
    with pytest.raises(ValueError, match="at least 8 samples"):
        damped_oscillation(t[:5], t[:5])
    with pytest.raises(ValueError, match="evenly spaced"):
        damped_oscillation(t**1.01, np.cos(w * t))
    with pytest.raises(ValueError, match="does not oscillate"):
        damped_oscillation(t, 0.3 + np.exp(-g * t))


def test_damped_oscillation_refuses_a_pure_decay():
    # the Fourier amplitude of an overdamped wave decays to zero without
    # oscillating: a fit must not invent a frequency
    t = np.arange(0.0, 3000.0, 25.0)
    with pytest.raises(ValueError, match="does not oscillate"):
        damped_oscillation(t, np.exp(-1.3e-4 * t))


def test_power_law_recovers_an_exponent():
    x = np.linspace(0.1, 2.0, 30)
    p, c = power_law(x, 1.7 * x**0.5)
    assert p == pytest.approx(0.5, rel=1e-9) and c == pytest.approx(1.7, rel=1e-9)
    # non-positive points are left out; fewer than two left gives NaN
    p, _ = power_law(np.r_[0.0, x], np.r_[1.0, 3 * x**0.45])
    assert p == pytest.approx(0.45, rel=1e-9)
    assert all(math.isnan(v) for v in power_law([1.0, -1.0], [1.0, 2.0]))


def test_count_droplets_counts_bodies_apart_from_the_largest():
    liquid = np.zeros((20, 16), bool)
    assert count_droplets(liquid) == 0
    liquid[:, :4] = True  # a pool
    assert count_droplets(liquid) == 0
    liquid[5:7, 8:10] = True
    liquid[12, 12] = True
    assert count_droplets(liquid) == 2
    liquid[13, 13] = True  # touches the last one only at a corner: separate
    assert count_droplets(liquid) == 3
    # a body cut by the periodic border is one body
    liquid[0, 10] = liquid[19, 10] = True
    assert count_droplets(liquid) == 4
    blob = np.zeros((10, 10, 10), bool)
    blob[:2, :2, :2] = blob[-1, :2, :2] = True
    blob[5, 5, 5] = True
    assert count_droplets(blob) == 1


def _pool() -> np.ndarray:
    phi = np.zeros((9, 12), np.float32)
    phi[:, 1:5] = 1.0  # a pool four cells deep over a floor wall at z = 0
    phi[:, 5] = 0.5
    phi[4, 1:3] = 0.0  # a cavity at the centre, two cells deep
    phi[1, 8] = 0.75  # a drop or rim cell, high above the pool
    return phi


def test_surface_maps_on_a_synthetic_pool():
    phi = _pool()
    top, layer = (np.asarray(a) for a in surface_maps(phi))
    assert top.shape == layer.shape == (9,) and top.dtype == np.float32
    # heights on the vertical axis, cell z spanning [z - 1/2, z + 1/2]
    np.testing.assert_array_equal(top[[0, 4, 8]], 5.0)  # 4.5 + phi = 0.5
    assert top[1] == pytest.approx(8.25)  # 7.5 + 0.75
    np.testing.assert_array_equal(layer[[0, 1, 4]], [5.5, 5.5, 0.5])
    top3, layer3 = surface_maps(np.broadcast_to(phi[:, None, :], (9, 3, 12)))
    np.testing.assert_array_equal(np.asarray(top3), np.repeat(top[:, None], 3, 1))
    np.testing.assert_array_equal(np.asarray(layer3), np.repeat(layer[:, None], 3, 1))


def test_crown_on_synthetic_maps():
    top = np.full(9, 6.0)
    top[1] = 8.75  # the rim, 3 cells from the axis at x = 4
    layer = np.full(9, 6.0)
    layer[4] = 0.5  # the cavity reaches the floor
    level = 6.0
    c = crown(top, layer, centre=(4.0,), level=level, diameter=4.0)
    assert c["crown_height"] == pytest.approx(8.75 - level)
    assert c["crown_radius"] == pytest.approx(3.0)
    assert c["cavity_depth"] == pytest.approx(level - 0.5)
    flat = crown(np.full(9, 6.0), np.full(9, 6.0), (4.0,), level, 4.0)
    assert math.isnan(flat["crown_radius"]) and flat["crown_height"] == 0
    # 3-D maps: the rim is a ring; the radius is the rim's distance from the axis
    top3 = np.full((15, 15), 5.0)
    top3[10, 7] = 7.5
    c3 = crown(top3, np.full((15, 15), 4.0), (7.0, 7.0), 5.0, 4.0)
    assert c3["crown_radius"] == pytest.approx(3.0)
    assert c3["crown_height"] == pytest.approx(2.5)


def test_raindrop_units_follow_the_design_definitions():
    u = raindrop_units(84)
    assert round(u["tau"], 5) == 0.50045
    assert round(u["re"]) == 28132 and round(u["we"]) == 2959
    p = RAINDROP
    assert u["dx"] == pytest.approx(p["diameter"] / 84, rel=1e-12)
    assert u["dt"] == pytest.approx(0.05 * u["dx"] / p["speed"], rel=1e-12)
    # the similarity numbers are the same in lattice units (lattice density 1)
    assert 0.05 * 84 / u["nu"] == pytest.approx(u["re"], rel=1e-9)
    assert 0.05**2 * 84 / u["sigma"] == pytest.approx(u["we"], rel=1e-9)
    assert u["g"] * 84**2 / u["sigma"] == pytest.approx(u["bo"], rel=1e-9)
    assert 0.05 / math.sqrt(u["g"] * 84) == pytest.approx(u["fr"], rel=1e-9)
    assert u["tau"] == pytest.approx(0.5 + 3 * u["nu"], rel=1e-12)
    assert u["steps"] * u["dt"] == pytest.approx(p["duration"], rel=1e-12)
    # a finer lattice speed shortens the time step and the viscosity with it
    half = raindrop_units(84, 0.025)
    assert half["dt"] == pytest.approx(u["dt"] / 2) and half["nu"] == pytest.approx(
        u["nu"] / 2
    )


# -- Smagorinsky subgrid model ------------------------------------------------------


def _shear_populations(lat, eps: float, force: bool):
    rng = np.random.default_rng(3)
    shape = (6, 5)
    rho = jnp.asarray(1 + 0.01 * rng.standard_normal(shape), jnp.float32)
    u = [jnp.asarray(0.02 * rng.standard_normal(shape), jnp.float32) for _ in "xy"]
    feq = equilibrium(lat, rho, u, shift=True)
    w = lat.w.reshape(-1, 1, 1).astype(np.float32)
    cxcy = (lat.c[:, 0] * lat.c[:, 1]).reshape(-1, 1, 1).astype(np.float32)
    scale = jnp.asarray(eps * (1 + rng.random((1, *shape))), jnp.float32)
    f = feq + w * cxcy * scale  # a shear stress: no mass, no momentum
    g = [jnp.full(shape, 1e-5, jnp.float32), jnp.full(shape, -2e-5, jnp.float32)]
    return f, (g if force else None)


def _smagorinsky_reference(lat, f, kind, tau, magic, c_smag):
    """An independent float64 evaluation of one unforced, unshifted collision
    with the Smagorinsky model of Hou et al. (1996): every cell relaxes with
    tau_eff = (tau + sqrt(tau^2 + 18 sqrt(2) C^2 |Pi_neq| / rho)) / 2."""
    f = np.asarray(f, np.float64)
    c = np.asarray(lat.c, np.float64)
    w = np.asarray(lat.w, np.float64)[:, None, None]
    rho = f.sum(axis=0)
    u = np.einsum("qa,qxy->axy", c, f) / rho
    cu = np.einsum("qa,axy->qxy", c, u)
    feq = w * rho * (1 + 3 * cu + 4.5 * cu**2 - 1.5 * (u**2).sum(axis=0))
    neq = f - feq
    pi = np.einsum("qa,qb,qxy->abxy", c, c, neq)
    norm = np.sqrt((pi**2).sum(axis=(0, 1)))
    tau_eff = 0.5 * (tau + np.sqrt(tau**2 + 18 * math.sqrt(2) * c_smag**2 * norm / rho))
    if kind == "bgk":
        return f - neq / tau_eff, tau_eff
    opp = [int(np.flatnonzero((c == -ci).all(axis=1))[0]) for ci in c]
    tau_minus = magic / (tau_eff - 0.5) + 0.5
    sym, anti = 0.5 * (neq + neq[opp]), 0.5 * (neq - neq[opp])
    return f - sym / tau_eff - anti / tau_minus, tau_eff


@pytest.mark.parametrize("kind", ["bgk", "trt"])
def test_smagorinsky_collision_relaxes_with_its_eddy_viscosity(kind):
    lat = lbm_jax.get_lattice("D2Q9")
    f, _ = _shear_populations(lat, 1e-2, False)
    rho, j = moments(lat, f, shift=True)
    u = [ja * (1 / rho) for ja in j]
    f = equilibrium(lat, rho, u, shift=False) + (
        f - equilibrium(lat, rho, u, shift=True)
    )
    smag = CollisionModel(Collision(kind), 0.8, 3 / 16, smagorinsky=1.0)
    out = np.asarray(collide(lat, smag, f, shift=False)[0], np.float64)
    expect, tau_eff = _smagorinsky_reference(lat, f, kind, 0.8, 3 / 16, 1.0)
    assert tau_eff.min() > 0.8 + 5e-3  # the model raises tau in every cell
    np.testing.assert_allclose(out, expect, rtol=0, atol=2e-7)
    plain = np.asarray(
        collide(lat, parse_collision(kind, 0.8, 3 / 16), f, shift=False)[0]
    )
    assert np.abs(plain - expect).max() > 5e-6  # the plain collision differs


def test_smagorinsky_zero_is_the_bgk_formula():
    lat = lbm_jax.get_lattice("D2Q9")
    f, _ = _shear_populations(lat, 1e-3, False)
    zero = CollisionModel(Collision.BGK, 0.8, 3 / 16, smagorinsky=0.0)
    out = collide(lat, zero, f, shift=True)[0]
    rho, j = moments(lat, f, shift=True)
    feq = equilibrium(lat, rho, [ja * (1 / rho) for ja in j], shift=True)
    expect = f - np.float32(1 / 0.8) * (f - feq)  # f - (f - feq) / tau, bit for bit
    np.testing.assert_array_equal(np.asarray(out), np.asarray(expect))


@pytest.mark.parametrize("kind", ["bgk", "trt"])
def test_smagorinsky_leaves_equilibrium_unchanged(kind):
    lat = lbm_jax.get_lattice("D2Q9")
    f, _ = _shear_populations(lat, 0.0, False)
    plain = CollisionModel(Collision(kind), 0.8, 3 / 16)
    sgs = CollisionModel(Collision(kind), 0.8, 3 / 16, smagorinsky=0.2)
    a, _, _ = collide(lat, plain, f, shift=True)
    b, _, _ = collide(lat, sgs, f, shift=True)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("kind", ["bgk", "trt"])
def test_smagorinsky_slows_the_relaxation_of_shear(kind):
    lat = lbm_jax.get_lattice("D2Q9")
    tau = 0.5005  # a nearly inviscid flow, the model's use
    plain = CollisionModel(Collision(kind), tau, 3 / 16)
    moved = []
    for eps in (3e-3, 3e-2):
        f, _ = _shear_populations(lat, eps, False)
        a, _, _ = collide(lat, plain, f, shift=True)
        sgs = CollisionModel(Collision(kind), tau, 3 / 16, smagorinsky=0.2)
        b, _, _ = collide(lat, sgs, f, shift=True)
        da = np.abs(np.asarray(a - f, np.float64)).sum(axis=0)
        db = np.abs(np.asarray(b - f, np.float64)).sum(axis=0)
        assert np.all(db < da)  # closer to the input: a larger tau
        moved.append(float(np.mean(db / da)))
        # the collision invariants hold with the subgrid model too
        for x, y in zip(
            jax.tree.leaves(moments(lat, b, shift=True)),
            jax.tree.leaves(moments(lat, f, shift=True)),
            strict=True,
        ):
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=2e-7)
    assert moved[1] < moved[0] < 1  # more shear, more eddy viscosity


# -- invalid input ----------------------------------------------------------------


def _sim(cell: CellType | None = None, **kwargs) -> lbm_jax.Simulation:
    cell_type = np.zeros((16, 16), np.int32)
    if cell is not None:
        cell_type[:, 0] = cell
    return lbm_jax.Simulation("D2Q9", (16, 16), tau=0.8, cell_type=cell_type, **kwargs)


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: FreeSurface(_sim(CellType.WALL)), ValueError, r"SOLID.*\['WALL'\]"),
        (lambda: FreeSurface(_sim(CellType.EQUILIBRIUM)), ValueError, "EQUILIBRIUM"),
        (lambda: FreeSurface(_sim(force=(1e-5, 0.0))), ValueError, "gravity=..."),
        (lambda: FreeSurface(_sim(), sigma=-0.01), ValueError, ">= 0, got -0.01"),
        (lambda: FreeSurface(_sim(), sigma=math.nan), ValueError, "finite"),
        (lambda: FreeSurface(_sim(), sigma="0.1"), TypeError, "sigma"),
        (
            lambda: FreeSurface(_sim(), gravity=(0.0, -1e-5, 0.0)),
            ValueError,
            r"finite \(2,\) vector, got \(0.0, -1e-05, 0.0\)",
        ),
        (
            lambda: FreeSurface(_sim(), smagorinsky=1.5),
            ValueError,
            r"\[0, 1\], got 1.5",
        ),
        (lambda: FreeSurface(_sim(), smagorinsky=-0.1), ValueError, "smagorinsky"),
        (lambda: FreeSurface(_sim(), smoothing=-1), ValueError, "smoothing"),
        (lambda: FreeSurface(_sim(), smoothing=1.5), TypeError, "smoothing"),
        (lambda: FreeSurface("sim"), TypeError, "lbm_jax.Simulation"),
    ],
)
def test_free_surface_rejects_bad_arguments(make, error, message):
    with pytest.raises(error, match=message):
        make()


@pytest.mark.parametrize(
    ("phi", "message"),
    [
        (np.ones((16, 15)), r"shape \(16, 16\), got \(16, 15\)"),
        (np.full((16, 16), 1.5), r"in \[0, 1\]"),
        (np.full((16, 16), -0.1), r"in \[0, 1\]"),
        (np.where(np.eye(16) > 0, np.nan, 0.5), "finite"),
        (np.zeros((16, 16)), "no liquid"),
        (np.repeat(np.eye(1, 16), 16, axis=0), "no liquid"),  # only in solid cells
    ],
)
def test_init_rejects_bad_fill_fields(phi, message):
    fs = FreeSurface(_sim(CellType.SOLID), sigma=0.01)
    with pytest.raises(ValueError, match=message):
        fs.init(phi)


@pytest.mark.parametrize(
    ("case", "options", "message"),
    [
        ("static_drop", {"re": 100.0}, "takes no Reynolds number.*tau"),
        ("drop_impact", {"re": 100.0}, "Ohnesorge"),
        ("raindrop", {"re": 100.0}, "sea water"),
        ("static_drop", {"n": 32, "radius": 14.0}, r"\[2, 13\].*got 14.0"),
        ("static_drop", {"radius": 1.0}, "radius must be in"),
        ("static_drop", {"dims": 4}, "dims must be 2 or 3, got 4"),
        ("drop_impact", {"dims": 4}, "dims must be 2 or 3, got 4"),
        ("static_drop", {"sigma": -0.01}, "sigma must be positive"),
        ("capillary_wave", {"amplitude": 20.0}, r"amplitude must be in \(0, n/10\]"),
        ("capillary_wave", {"depth": 2.0}, "at least 4 amplitudes"),
        ("drop_impact", {"height": 3.0}, "room above the pool"),
        ("drop_impact", {"smagorinsky": 2.0}, r"smagorinsky must be in \[0, 1\]"),
        ("drop_impact", {"we": 0.0}, "we must be positive"),
        ("drop_impact", {"u_ref": 0.5}, "Mach"),
        # too short for the 8 samples the frequency fit needs
        ("capillary_wave", {"n": 32, "steps": 50}, "samples"),
        ("static_drop", {"bogus": 1}, r"Unknown option.*bogus.*options are"),
        ("capillary_wave", {"dims": 2}, "Unknown option"),
    ],
)
def test_cases_reject_bad_input_before_compiling(case, options, message, monkeypatch):
    def no_simulation(*args, **kwargs):
        raise AssertionError("a simulation was built before validation")

    monkeypatch.setattr(lbm_jax.Simulation, "__init__", no_simulation)
    with pytest.raises(ValueError, match=message):
        run_case(case, **options)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["static_drop", "--dims", "4"], "invalid choice: 4"),
        (["static_drop", "--n", "32", "--radius", "14"], "radius must be in"),
        (["capillary_wave", "--amplitude", "50"], "amplitude must be in"),
        (["drop_impact", "--sigma", "0.01"], "Unknown option"),
    ],
)
def test_cli_free_surface_bad_input_exits_2(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["run", *argv, "--out", str(tmp_path / "x")])
    assert info.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


# -- files, checkpoints -------------------------------------------------------------


def test_static_drop_writes_fields_summary_and_figures(drops2d):
    results, out = drops2d
    result = results[8.0]
    for name in (
        "fields.npz",
        "summary.json",
        "fields.vti",
        "velocity.png",
        "fill.png",
    ):
        assert (out / name).stat().st_size > 0, name
    assert {p.name for p in result.files} >= {"fields.npz", "fill.png"}
    with np.load(out / "fields.npz") as data:
        assert {"rho", "u", "phi", "flags", "t", "mass"} <= set(data.files)
        assert data["phi"].shape == data["flags"].shape == (32, 32)
        assert data["u"].shape == (2, 32, 32)
        assert set(np.unique(data["flags"])) <= {int(f) for f in Flag}
        assert 0 <= data["phi"].min() and data["phi"].max() <= 1
        np.testing.assert_array_equal(data["phi"], result.fields["phi"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary == result.summary
    assert summary["case"] == "static_drop" and summary["laplace_error"] < 0.05


def test_drop_impact_writes_its_figures(impact2d):
    result, out = impact2d
    for name in ("slices.png", "crown.png", "surface.png", "fields.vti"):
        assert (out / name).stat().st_size > 0, name
    with np.load(out / "fields.npz") as data:
        assert data["slices"].shape[1:] == result.fields["phi"].shape
        assert data["crown_radius"].shape == data["t"].shape


def test_free_surface_case_resumes_bit_for_bit(drops2d, tmp_path):
    straight, out = drops2d[0][8.0], drops2d[1]  # 2400 steps, uninterrupted
    cut = tmp_path / "cut"
    shutil.copytree(out, cut)
    # as if killed after step 1600: the last checkpoint and the outputs are gone
    kept = sorted(p.name for p in cut.glob("checkpoints/step_*.npz"))
    assert kept == ["step_0000001600.npz", "step_0000002400.npz"]
    (cut / "checkpoints" / kept[-1]).unlink()
    for name in ("fields.npz", "summary.json", "fields.vti", "velocity.png"):
        (cut / name).unlink()
    resumed = run_case("static_drop", n=32, radius=8.0, out_dir=cut, resume=True)
    assert (cut / "checkpoints" / kept[-1]).is_file()
    a = {k: v for k, v in resumed.summary.items() if k != "mlups"}
    b = {k: v for k, v in straight.summary.items() if k != "mlups"}
    assert a == b
    with np.load(cut / "fields.npz") as x, np.load(out / "fields.npz") as y:
        assert set(x.files) == set(y.files) >= {"phi", "flags", "mass", "t"}
        for key in x.files:
            np.testing.assert_array_equal(x[key], y[key], err_msg=key)


def _covered_by_legend(fig, ax) -> bool:
    """Whether a legend drawn inside ``ax`` overlaps any of its lines' points."""
    fig.canvas.draw()
    legend = ax.get_legend()
    if legend is None:
        return False
    box = legend.get_window_extent()
    for line in ax.lines:
        points = ax.transData.transform(line.get_xydata())
        if np.any(box.contains_points(points)):
            return True
    return False


def test_free_surface_and_capsule_figures_keep_legends_off_the_data():
    from lbm_jax import _plot

    x = np.arange(64)
    top = 2.0 + np.where(np.abs(x - 50) < 8, 0.8, 0.0)  # a crown on the right
    fig = _plot.surface_figure(top)
    assert not _covered_by_legend(fig, fig.axes[0])
    t = np.arange(0, 4000, 50.0)
    fig = _plot.deformation_figure(t, 0.07 * (1 - np.exp(-t / 600)), 0.0625, 1 / 900)
    assert not _covered_by_legend(fig, fig.axes[0]) and fig.legends
    # a 2-D slice's vertical axis is its y axis, a 3-D mid-plane's z
    slices = np.zeros((3, 16, 8))
    fig = _plot.fill_slices_figure(slices, np.arange(3.0), dims=2)
    assert fig.axes[0].get_ylabel().startswith("y (cells")
    fig = _plot.fill_slices_figure(slices, np.arange(3.0), dims=3)
    assert fig.axes[0].get_ylabel().startswith("z (cells")
