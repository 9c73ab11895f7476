"""Poiseuille channel: analytic profile, TRT exactness, BGK wall slip, validation."""

from __future__ import annotations

import numpy as np
import pytest

from lbm_jax.cases import prepare_case, run_case
from lbm_jax.cases.poiseuille import analytic_profile, predicted_slip


@pytest.mark.slow
def test_poiseuille_trt_magic_fp64_matches_parabola_to_roundoff(x64):
    res = run_case("poiseuille", n=16, storage="fp64", collision="trt")
    s = res.summary
    assert s["converged"]
    assert s["l2_error"] <= 1e-10
    assert abs(s["slip"]) <= 1e-12
    assert res.fields["u"].shape == (2, 4, 16)
    assert res.fields["rho"].shape == (4, 16)
    np.testing.assert_allclose(
        res.fields["u"][0, 0], analytic_profile(16, s["force"], s["nu"]), rtol=1e-10
    )


def test_poiseuille_bgk_shows_predicted_slip(x64):
    s = run_case("poiseuille", n=16, storage="fp64", collision="bgk").summary
    # BGK at tau = 0.74: Lambda = 0.0576 < 3/16, so the walls slip backwards.
    assert s["slip_predicted"] < 0
    np.testing.assert_allclose(s["slip"], s["slip_predicted"], rtol=1e-6)
    assert s["l2_error"] > 1e-3


def test_poiseuille_fp32_close_to_parabola():
    s = run_case("poiseuille", n=16, storage="fp32").summary
    assert s["l2_error"] < 1e-4
    assert s["storage"] == "FP32/FP32"


def test_predicted_slip_vanishes_at_magic_three_sixteenths():
    assert predicted_slip(1e-5, 0.1, 3.0 / 16.0) == 0.0
    assert predicted_slip(1e-5, 0.1, 0.25) > 0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"re": 1e7}, "tau"),
        ({"u_ref": 0.9}, "Mach"),
        ({"n": 2}, "at least 4"),
        ({"collision": "mrt"}, "collision"),
        ({"colision": "bgk"}, "Unknown option"),
        ({"storage": "fp12"}, "storage"),
        ({"steps": 0}, "steps"),
    ],
)
def test_poiseuille_bad_arguments_raise_before_running(kwargs, match):
    with pytest.raises(ValueError, match=match):
        prepare_case("poiseuille", **kwargs)


def test_fp64_without_x64_is_refused():
    with pytest.raises(ValueError, match="x64|64-bit"):
        prepare_case("poiseuille", storage="fp64")


def test_non_integer_resolution_is_a_type_error():
    with pytest.raises(TypeError, match="integer"):
        prepare_case("poiseuille", n=16.5)
