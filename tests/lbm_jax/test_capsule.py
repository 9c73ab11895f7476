"""The immersed-boundary coupling and the capsule in shear flow, against theory."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lbm_jax
from lbm_jax.cases import prepare_case, run_case
from lbm_jax.cases.capsule import deformation_theory, fit_relaxation
from lbm_jax.ibm import (
    IBMState,
    ImmersedBoundary,
    Membrane,
    get_kernel,
    icosphere,
    volume,
)

# A CPU-sized shear cell: r = 5 and Ca = 0.03 as in the benchmark, a narrower box
# (24 cells across, 8 r high) and Re = 0.05 so the capsule relaxes within ~2600
# steps (the default box, 50^3 at Re = 0.02, takes ~7600). Measured here: D 5.5 %
# above theory, relaxation rate 7 % below. The close periodic images (24 cells
# apart) lower D: the default box gives 12 % above theory (a slow test).
CI_CAPSULE = {"radius": 5.0, "n": 40, "width": 24, "re": 0.05, "ca": 0.03, "delta": 4}


# A short run in a small box, for what a run writes (seconds, not minutes).
SMALL_CAPSULE = {"radius": 3.0, "n": 16, "width": 14, "re": 0.1, "steps": 60}


@pytest.fixture(scope="module")
def capsule(tmp_path_factory):
    out = tmp_path_factory.mktemp("capsule")
    return run_case("capsule", out_dir=out, **CI_CAPSULE), out


@pytest.fixture(scope="module")
def small_capsule(tmp_path_factory):
    out = tmp_path_factory.mktemp("small_capsule")
    return run_case("capsule", out_dir=out, **SMALL_CAPSULE), out


def _box(shape=(16, 16, 16), storage="fp32"):
    sim = lbm_jax.Simulation("D3Q19", shape, tau=1.0, storage=storage)
    centre = tuple((s - 1) / 2 for s in shape)
    mesh = icosphere(3.0, nodes=162, center=centre)
    return ImmersedBoundary(sim, Membrane(mesh, shear_modulus=1e-2), delta=4)


def test_membrane_at_rest_in_fluid_at_rest_stays_at_rest():
    ib = _box()
    state = ib.init(ib.sim.init())
    nodes0 = np.asarray(state.nodes)
    state = jax.jit(lambda s: jax.lax.fori_loop(0, 20, lambda i, s: ib.step(s), s))(
        state
    )
    np.testing.assert_allclose(np.asarray(state.nodes), nodes0, atol=1e-6)
    _, u = ib.sim.fields(state.fluid)
    assert float(jnp.max(jnp.abs(u))) < 1e-7


@pytest.mark.slow
def test_deformed_capsule_relaxes_with_zero_net_momentum():
    ib = _box()
    ref = ib.membrane.reference_nodes
    centre = ref.mean(axis=0)
    stretched = centre + (ref - centre) * np.array([1.15, 1.0, 1 / 1.15])
    state = ib.init(ib.sim.init(), stretched)
    assert np.all(np.isfinite(np.asarray(ib.force_field(state.nodes))))
    # spreading conserves the total force, and the membrane's forces sum to zero
    total = jnp.sum(ib.force_field(state.nodes), axis=(1, 2, 3))
    np.testing.assert_allclose(np.asarray(total), 0.0, atol=1e-6)
    result = lbm_jax.run(ib.step, state, 300, healthy=ib.healthy)
    nodes = np.asarray(result.state.nodes)
    spread0 = np.ptp(stretched, axis=0)
    spread1 = np.ptp(nodes, axis=0)
    # the long axis shortens and the short one lengthens, towards the sphere
    assert spread1[0] < spread0[0] and spread1[2] > spread0[2]
    rho, u = ib.sim.fields(result.state.fluid)
    momentum = np.asarray(jnp.sum(rho[None] * u, axis=(1, 2, 3)))
    np.testing.assert_allclose(momentum, 0.0, atol=1e-5)
    faces = ib.membrane.faces
    v0, v1 = (float(volume(jnp.asarray(x), faces)) for x in (stretched, nodes))
    assert abs(v1 / v0 - 1) < 2e-3


def test_immersed_boundary_is_a_pytree_and_checks_its_input():
    ib = _box()
    leaves, tree = jax.tree.flatten(ib)
    again = jax.tree.unflatten(tree, leaves)
    assert again.delta == ib.delta and again.sim.shape == ib.sim.shape
    state = ib.init(ib.sim.init())
    assert isinstance(state, IBMState) and state.nodes.dtype == jnp.float32
    with pytest.raises(ValueError, match="shape"):
        ib.init(ib.sim.init(), np.zeros((5, 3)))
    with pytest.raises(ValueError, match="3-D"):
        ImmersedBoundary(
            lbm_jax.Simulation("D2Q9", (8, 8), tau=1.0), ib.membrane, delta=4
        )
    with pytest.raises(ValueError, match="delta kernel 5"):
        ImmersedBoundary(ib.sim, ib.membrane, delta=5)


def test_immersed_boundary_kernel_is_a_deprecated_alias_of_delta():
    ib = _box()
    with pytest.warns(DeprecationWarning, match=r"delta=\.\.\."):
        old = ImmersedBoundary(ib.sim, ib.membrane, kernel=2)
    assert old.delta is get_kernel(2) and ib.delta is get_kernel(4)
    with pytest.warns(DeprecationWarning, match=r"\.delta"):
        assert old.kernel is old.delta
    with pytest.raises(ValueError, match="once"):
        ImmersedBoundary(ib.sim, ib.membrane, delta=2, kernel=2)


# ~35 s on a 2-core CPU: with the slow tests. The same claim (FP32 deformation
# within 15 % of theory, relaxation rate within 15 %) is a check of
# `python -m experiments lbm_capsule --quick`, which `reproduce` runs.
@pytest.mark.slow
def test_capsule_deformation_matches_small_deformation_theory(capsule):
    result, _ = capsule
    s = result.summary
    assert s["deformation_theory"] == pytest.approx(0.0625)
    assert s["stopped_early"], "the run must reach a steady deformation"
    assert s["deformation_error"] < 0.10, s["taylor_deformation"]
    assert s["relaxation_rate_error"] < 0.15, s["relaxation_rate"]
    assert 35.0 < s["inclination_deg"] < 45.0
    assert s["volume_drift"] < 1e-3
    assert s["area_drift"] < 1e-2


def test_capsule_writes_membrane_fields_and_figures(small_capsule):
    result, out = small_capsule
    for name in ("membrane.npz", "membrane.vtp", "deformation.png", "snapshot.png"):
        assert (out / name).stat().st_size > 0, name
    membrane = np.load(out / "membrane.npz")
    assert membrane["nodes"].shape == (642, 3) and membrane["faces"].shape == (1280, 3)
    fields = np.load(out / "fields.npz")
    w, h = SMALL_CAPSULE["width"], SMALL_CAPSULE["n"]
    assert fields["u"].shape == (3, w, w, h)  # the wall layers are left out
    assert fields["D"].shape == fields["t"].shape
    summary = json.loads((out / "summary.json").read_text())
    assert summary["taylor_deformation"] == pytest.approx(float(fields["D"][-1]))


def test_a_short_capsule_run_leaves_steady_figures_unset_and_says_why(small_capsule):
    # 60 steps are 0.9 relaxation times: neither D_inf nor the rate is known yet
    summary = small_capsule[0].summary
    tau_r = summary["relaxation_time"]
    assert 60 < tau_r < 5 * 60
    for key in ("deformation_error", "deformation_fit", "relaxation_rate"):
        assert summary[key] is None, key
    assert summary["relaxation_rate_error"] is None
    assert summary["taylor_deformation"] is not None  # measured, not fitted
    steady, rate = summary["warnings"]
    assert "too short for the steady deformation" in steady
    assert f"steps={math.ceil(5 * tau_r)}" in steady
    assert "too short to fit the relaxation rate" in rate


def test_fit_relaxation_recovers_a_noisy_law():
    t = np.arange(0.0, 2000.0, 25.0)
    noise = np.random.default_rng(0).normal(0.0, 1e-4, t.size)
    d_inf, k = fit_relaxation(t, 0.0625 * (1 - np.exp(-2e-3 * t)) + noise)
    assert d_inf == pytest.approx(0.0625, rel=1e-2) and k == pytest.approx(2e-3, 0.03)


def test_deformation_theory_for_each_law():
    assert deformation_theory(0.03, "neo-hookean") == pytest.approx(0.0625)
    # C -> infinity: area-incompressible limit (5/4)(3/2) Ca
    assert deformation_theory(0.1, "skalak", 1e9) == pytest.approx(0.1875, rel=1e-6)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"radius": 1.5}, "radius must be at least 2"),
        ({"ca": 0.0}, "ca .* must be positive"),
        ({"ca": -1.0}, "ca .* must be positive"),
        ({"ca": 1e-4, "re": 1.0}, "nodes would move too far"),
        ({"radius": 5.0, "n": 13}, "too small for a capsule"),
        ({"width": 10}, "too small for a capsule"),
        ({"law": "mooney"}, "Unknown law"),
        ({"delta": 5}, "delta"),
        ({"nodes": 600}, "642"),
        ({"re": 1e4}, "Mach"),
    ],
)
def test_capsule_rejects_bad_input_before_compiling(options, message):
    with pytest.raises(ValueError, match=message):
        prepare_case("capsule", **options)


def test_cli_capsule_bad_input_exits_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "lbm_jax", "run", "capsule", "--radius", "1"]
        + ["--out", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "radius must be at least 2" in proc.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kernel", "tolerance"),
    # measured: 12.2 % with the default 4-point kernel (its wider support makes
    # the capsule hydrodynamically larger, rate 8.8 % slow), 6.5 % with 2 points
    [(4, 0.13), (2, 0.10)],
)
def test_capsule_benchmark_case_against_theory(kernel, tolerance):
    # Krueger's r = 5 in 50^3 (the default radius, 12, is a GPU run)
    s = run_case("capsule", radius=5.0, delta=kernel).summary
    assert s["radius"] == 5.0 and s["n"] == 50 and s["width"] == 50
    assert s["deformation_error"] < tolerance
    assert s["relaxation_rate_error"] < 0.15
    assert s["volume_drift"] < 1e-3


@pytest.mark.slow
def test_capsule_error_falls_with_radius():
    errors = []
    for radius in (4, 6, 8):
        s = run_case(
            "capsule",
            radius=float(radius),
            n=8 * radius,
            width=6 * radius,
            re=0.1,
            ca=0.03,
            nodes=642 if radius < 8 else 2562,
        ).summary
        errors.append(s["deformation_error"])
    assert errors[0] > errors[1] > errors[2], errors
    assert math.isfinite(errors[2]) and errors[2] < 0.06


@pytest.mark.slow
def test_capsule_resumes_from_a_checkpoint_bit_for_bit(small_capsule, tmp_path):
    # The uninterrupted run is the shared small capsule (one compilation fewer).
    full, full_dir = small_capsule
    out = tmp_path / "b"
    run_case("capsule", out_dir=out, checkpoint_every=25, **SMALL_CAPSULE)
    newest = sorted((out / "checkpoints").glob("step_*.npz"))
    assert len(newest) >= 2
    newest[-1].unlink()  # as if killed before the last save
    resumed = run_case("capsule", out_dir=out, resume=True, **SMALL_CAPSULE)
    for key in ("rho", "u"):
        np.testing.assert_array_equal(resumed.fields[key], full.fields[key])
    a, b = (np.load(d / "fields.npz") for d in (full_dir, out))
    for key in ("t", "D", "nodes"):
        np.testing.assert_array_equal(a[key], b[key])
