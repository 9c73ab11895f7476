"""Taylor-Green vortices: viscous decay rate and second-order convergence."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lbm_jax.cases import prepare_case, run_case
from lbm_jax.cases.taylor_green import analytic_fields


def test_taylor_green_decay_rate_within_one_percent_at_64():
    res = run_case("taylor_green", n=64)
    s = res.summary
    assert s["n"] == 64 and s["lattice"] == "D2Q9"
    assert s["decay_rate_error"] < 0.01
    nu = (s["tau"] - 0.5) / 3
    assert s["decay_rate_exact"] == pytest.approx(2 * nu * (2 * math.pi / 64) ** 2)
    assert res.fields["u"].shape == (2, 64, 64)
    assert np.all(np.isfinite(res.fields["u"]))


def test_taylor_green_second_order_convergence():
    # Diffusive scaling: fixed tau and Re, u_ref ~ 1/n, steps ~ n^2.
    errors = [
        run_case("taylor_green", n=n, re=12.8, u_ref=0.08 * 16 / n).summary["l2_error"]
        for n in (16, 32, 64)
    ]
    ratios = [errors[0] / errors[1], errors[1] / errors[2]]
    for r in ratios:
        assert 3.3 < r < 4.8, (errors, ratios)


def test_taylor_green_fp16s_storage_stays_accurate():
    s = run_case("taylor_green", n=32, storage="fp16s").summary
    assert s["storage"] == "FP32/FP16S"
    assert s["decay_rate_error"] < 0.02


def test_analytic_fields_decay_and_pressure():
    rho0, u0 = analytic_fields(16, 0.05, 0.1, 0.0)
    _, u1 = analytic_fields(16, 0.05, 0.1, 10.0)
    k = 2 * math.pi / 16
    assert np.abs(u0).max() == pytest.approx(0.05, rel=1e-12)
    np.testing.assert_allclose(u1, u0 * math.exp(-2 * 0.1 * k * k * 10.0), rtol=1e-12)
    # pressure minimum at the vortex centres, mean density 1
    assert rho0.mean() == pytest.approx(1.0, abs=1e-12)
    assert rho0[0, 0] < 1.0


def test_taylor_green_rejects_bad_decay():
    with pytest.raises(ValueError, match="decay"):
        run_case("taylor_green", n=16, decay=-1.0)


def test_the_amplitude_offset_every_format_shares_is_k2_over_6():
    # the Taylor-Green figure explains its constant deviation (FP64 too) so:
    # about -k^2/6 after the first steps, falling as 1/n^2, the rate unaffected
    offsets = {}
    for n in (32, 64):
        setup = prepare_case("taylor_green", n=n)
        metrics, _, extras = setup.run()
        amp = extras["amplitude"] / setup.u_ref
        exact = np.exp(-metrics["decay_rate_exact"] * extras["t"])
        offsets[n] = amp[1] / exact[1] - 1
        assert metrics["decay_rate_error"] < 2e-3
    k = 2 * math.pi / 32
    assert offsets[32] / (-k * k / 6) == pytest.approx(1.0, abs=0.1)
    assert 3.5 < offsets[32] / offsets[64] < 4.5
