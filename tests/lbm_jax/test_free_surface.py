"""The free-surface model: its observables and theory, the Smagorinsky subgrid
collision it uses for impacts, and its input checks (the validation cases are in
test_free_surface_cases.py, the curvature in test_free_surface_curvature.py,
the native step against the XLA step in test_free_surface_native.py)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lbm_jax
from lbm_jax import CellType, Collision, CollisionModel
from lbm_jax.__main__ import main
from lbm_jax.cases import run_case
from lbm_jax.cases.free_surface import RAINDROP, raindrop_units
from lbm_jax.core._collision import collide, equilibrium, moments, parse_collision
from lbm_jax.free_surface import (
    FreeSurface,
    count_droplets,
    crown,
    damped_oscillation,
    lamb_mode,
    power_law,
    surface_maps,
)

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
    assert c3["at_ceiling"] == 0.0


# ceiling face at 11: the cell under it spans [10, 11] and counts as wet in the map
# from half full (top >= 10.5); top 10 is the cell below it full
@pytest.mark.parametrize(
    "top_of_rim, touches", [(10.0, False), (10.5, True), (11.0, True)]
)
def test_a_splash_at_the_ceiling_leaves_the_crown_radius_unmeasured(
    top_of_rim, touches
):
    top = np.full(9, 6.0)
    top[1] = top_of_rim
    c = crown(top, np.full(9, 6.0), (4.0,), 6.0, 4.0, ceiling=11.0)
    assert c["at_ceiling"] == float(touches)
    assert math.isnan(c["crown_radius"]) == touches
    assert c["crown_height"] == pytest.approx(top_of_rim - 6.0)
    assert c["cavity_depth"] == 0.0


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


def test_convert_continues_a_free_surface_run_in_another_format():
    from lbm_jax.free_surface import sphere_fill

    def model(storage: str) -> FreeSurface:
        sim = lbm_jax.Simulation("D2Q9", (32, 32), tau=0.8, storage=storage)
        return FreeSurface(sim, sigma=0.005, gravity=(0.0, -1e-4))

    fs16, fs32 = model("fp16s"), model("fp32")
    s16 = lbm_jax.run(fs16.step, fs16.init(sphere_fill((32, 32), (16, 18), 7.0)), 30)
    s16 = s16.state
    s32 = fs32.convert(s16, fs16)
    # FP16S values are FP32 values: the copy is exact
    np.testing.assert_array_equal(fs32.fill(s32), fs16.fill(s16))
    assert float(fs32.total_mass(s32)) == float(fs16.total_mass(s16))
    np.testing.assert_array_equal(s32.flags, s16.flags)
    a = lbm_jax.run(fs32.step, s32, 20, healthy=fs32.healthy).state
    b = lbm_jax.run(fs16.step, s16, 20, healthy=fs16.healthy).state
    assert int(a.fluid.t) == int(b.fluid.t) == 50
    np.testing.assert_allclose(fs32.fill(a), fs16.fill(b), atol=2e-3)
    with pytest.raises(TypeError, match="FreeSurface"):
        fs32.convert(s16, fs16.sim)
