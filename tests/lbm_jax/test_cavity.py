"""Lid-driven cavity vs Ghia et al. (D2Q9, spanwise-periodic D3Q19); D3Q19 cube."""

from __future__ import annotations

import numpy as np
import pytest

from lbm_jax.cases import prepare_case, run_case
from lbm_jax.cases._reference import ghia_u, ghia_v
from lbm_jax.cases.cavity import centre_lines, ghia_errors


def test_ghia_tables_load_with_wall_values():
    y, u = ghia_u(100)
    x, v = ghia_v(400)
    assert y.shape == u.shape == (17,)
    assert x.shape == v.shape == (17,)
    assert (y[0], u[0], y[-1], u[-1]) == (0.0, 0.0, 1.0, 1.0)
    assert v[0] == 0.0 and v[-1] == 0.0
    assert u.min() == pytest.approx(-0.21090)  # Ghia Table I, Re = 100
    with pytest.raises(ValueError, match="100, 400, 1000"):
        ghia_u(200)


def test_centre_lines_average_the_two_middle_nodes():
    n = 4
    u = np.zeros((2, n, n))
    u[0, 1, :] = 1.0  # column left of x = 1/2
    u[0, 2, :] = 3.0  # column right of x = 1/2
    lines = centre_lines(u, 2.0)
    np.testing.assert_allclose(lines["y"], [0, 0.125, 0.375, 0.625, 0.875, 1])
    np.testing.assert_allclose(lines["u"], [0, 1, 1, 1, 1, 1])
    np.testing.assert_allclose(lines["v"], 0.0)


def test_ghia_errors_of_the_reference_itself_are_zero():
    y, u = ghia_u(100)
    x, v = ghia_v(100)
    errs = ghia_errors({"y": y, "u": u, "x": x, "v": v}, 100)
    assert errs["ghia_max_error"] == 0.0
    errs = ghia_errors({"y": y, "u": u + 0.03, "x": x, "v": v}, 100)
    assert errs["ghia_u_max_error"] == pytest.approx(0.03)


# About 27k steps (steady-state stop) on 130^2 cells: ~25 s on 2 cores, with the
# slow tests; the default run checks the same at n = 32 (the D2Q9 run of
# test_cavity_d3q19_spanwise_periodic_matches_ghia_and_d2q9).
@pytest.mark.slow
def test_cavity_re100_at_128_matches_ghia_within_002():
    res = run_case("cavity", n=128, re=100)
    s = res.summary
    assert s["converged"]
    assert s["ghia_u_max_error"] < 0.02
    assert s["ghia_v_max_error"] < 0.02
    assert abs(s["mass_drift"]) < 1e-4
    assert res.fields["u"].shape == (2, 128, 128)
    # lid at the top y boundary moving in +x: fast +x flow under it
    assert res.fields["u"][0, :, -1].mean() > 0.3 * s["u_ref"]


@pytest.mark.slow
def test_cavity3d_d3q19_smoke():
    res = run_case("cavity3d", n=24, steps=800, check_every=400)
    s = res.summary
    assert s["lattice"] == "D3Q19"
    u = res.fields["u"]
    assert u.shape == (3, 24, 24, 24)
    assert res.fields["rho"].shape == (24, 24, 24)
    assert np.all(np.isfinite(u))
    # the lid drags the top layer in +x, the return flow runs in -x below
    assert u[0, :, -1, :].mean() > 0.2 * s["u_ref"]
    assert s["u_min_centre"] < -0.05
    # the flow is symmetric about the mid-plane z = 1/2
    np.testing.assert_allclose(u[0], u[0][:, :, ::-1], atol=1e-5)


def test_cavity_lattice_option_selects_3d():
    setup = prepare_case("cavity", n=16, lattice="d3q19")
    assert setup.lattice == "D3Q19"
    with pytest.raises(ValueError, match="lattice"):
        prepare_case("cavity", lattice="D1Q3")
    with pytest.raises(ValueError, match="3-D lattice"):
        prepare_case("cavity3d", lattice="D2Q9")


@pytest.mark.slow
def test_cavity_d3q19_spanwise_periodic_matches_ghia_and_d2q9():
    # One periodic z layer: the D3Q19 lattice (moving wall, bounce-back) must give
    # the 2-D flow, so Ghia et al. apply to it too (~8500 steps on 34^2 cells).
    res3 = run_case("cavity", n=32, re=100, lattice="D3Q19", span=1)
    res2 = run_case("cavity", n=32, re=100)
    # the D2Q9 run: what the n = 128 run checks (a slow test), at n = 32
    s2 = res2.summary
    assert s2["converged"]
    assert s2["ghia_u_max_error"] < 0.02
    assert s2["ghia_v_max_error"] < 0.02
    assert abs(s2["mass_drift"]) < 1e-4
    assert res2.fields["u"].shape == (2, 32, 32)
    # lid at the top y boundary moving in +x: fast +x flow under it
    assert res2.fields["u"][0, :, -1].mean() > 0.3 * s2["u_ref"]
    s3 = res3.summary
    assert s3["lattice"] == "D3Q19" and s3["converged"]
    assert res3.fields["u"].shape == (3, 32, 32, 1)
    assert s3["ghia_max_error"] < 0.02
    np.testing.assert_allclose(
        res3.fields["u"][:2, ..., 0], res2.fields["u"], rtol=0, atol=1e-5 * s3["u_ref"]
    )
    np.testing.assert_allclose(res3.fields["u"][2], 0.0, atol=1e-7)


def test_cavity_span_needs_a_3d_lattice():
    with pytest.raises(ValueError, match="3-D lattice"):
        prepare_case("cavity", span=2)
    with pytest.raises(ValueError, match="span must be at least 1"):
        prepare_case("cavity", lattice="D3Q19", span=0)
