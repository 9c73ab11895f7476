"""Why the capillary wave's damping falls short of Lamb's: the reference and the fit
checked against exact solutions, and the measured deficit's scaling (the guide,
docs/lbm/free_surface.md).

* The case's reference (``lamb_mode``: Lamb's exact relation for deep water, depth only
  in ``w0``) against the exact finite-depth mode (no-slip bottom): the bottom's Stokes
  layer adds 1.1 % (wavelength 50) and 1.2 % (100) to the damping; with a free-slip
  bottom the two agree within 0.1 %.
* The fit (Prony, from rest, 3 periods, 40 samples a period) on Prosperetti's exact
  initial-value solution (a free surface released from rest) returns the normal mode's
  damping +0.5 % (wavelength 50) and +0.4 % (100), its frequency within 0.01 %.
* The deficit (slow test): see ``DEFICIT``.
"""

from __future__ import annotations

import cmath
import contextlib
import math

import numpy as np
import pytest

from lbm_jax.cases import prepare_case, run_case
from lbm_jax.free_surface import damped_oscillation, lamb_mode
from tests.lbm_jax._height_curvature import height_curvature

SIGMA, NU = 0.02765, 1 / 54  # the case's defaults (tau = 0.5 + 3/54)


def exact_mode(
    k: float,
    nu: float,
    sigma: float,
    depth: float,
    bottom: str,
    normal_stress: float = 1.0,
) -> complex:
    """Growth rate ``s`` (amplitude ~ exp(s t)) of the linear viscous capillary wave on
    a layer of ``depth`` with a free surface above and a ``"noslip"`` or ``"freeslip"``
    bottom: the root, near Lamb's, of the 4x4 determinant of the stream function
    ``A cosh kz + B sinh kz + C exp(mz) + D exp(-m(z + h))``, ``m^2 = k^2 + s/nu``;
    ``normal_stress`` scales the viscous normal stress in the surface's stress balance
    (1: the physical condition)."""

    def det(s: complex) -> complex:
        m = cmath.sqrt(k * k + s / nu)

        def rows(z: float) -> np.ndarray:  # d^0..d^3 of each basis function at z
            ck, sk = cmath.cosh(k * z), cmath.sinh(k * z)
            e1, e2 = cmath.exp(m * z), cmath.exp(-m * (z + depth))
            return np.array(
                [
                    [ck, k * sk, k * k * ck, k**3 * sk],
                    [sk, k * ck, k * k * sk, k**3 * ck],
                    [e1, m * e1, m * m * e1, m**3 * e1],
                    [e2, -m * e2, m * m * e2, -(m**3) * e2],
                ]
            ).T

        b, t = rows(-depth), rows(0.0)
        pressure = (1j / k) * (s * t[1] - nu * (t[3] - k * k * t[1]))
        height = -1j * k * t[0] / s  # surface elevation per unit stream function
        normal = (
            pressure
            - 2 * normal_stress * nu * (-1j * k * t[1])
            - sigma * k * k * height
        )
        tangential = t[2] + k * k * t[0]
        wall = b[1] if bottom == "noslip" else b[2]
        return np.linalg.det(np.array([b[0], wall, tangential, normal]))

    mode = lamb_mode(k, nu, sigma, depth=depth)
    s0 = complex(-mode["damping"], mode["frequency"])
    s1 = s0 * (1 + 1e-4)
    f0, f1 = det(s0), det(s1)
    for _ in range(100):  # secant
        s0, f0, s1 = s1, f1, s1 - f1 * (s1 - s0) / (f1 - f0)
        f1 = det(s1)
        if abs(s1 - s0) < 1e-13 * abs(s1):
            break
    return s1


def prosperetti(t: np.ndarray, k: float, nu: float, sigma: float) -> np.ndarray:
    """Amplitude ``a(t)/a(0)`` of a small capillary wave on deep liquid released from
    rest (Prosperetti 1981, Phys. Fluids 24:1217, one fluid: beta = 0)."""
    special = pytest.importorskip("scipy.special")
    w02, e = sigma * k**3, nu * k * k
    roots = np.roots([1.0, 0.0, 2 * e, 4 * e**1.5, e * e + w02])
    a = 4 * e * e / (8 * e * e + w02) * special.erfc(np.sqrt(e * t))
    for i, z in enumerate(roots):
        zz = np.prod([roots[j] - z for j in range(4) if j != i])
        # exp((z^2 - e) t) erfc(z sqrt(t)) = exp(-e t) w(i z sqrt(t))
        a = a + z / zz * w02 / (z * z - e) * np.exp(-e * t) * special.wofz(
            1j * z * np.sqrt(t)
        )
    return a.real


@pytest.mark.parametrize("n, rise", [(50, 0.011), (100, 0.012)])
def test_a_no_slip_bottom_adds_about_one_percent_to_lambs_damping(n, rise):
    k, depth = 2 * math.pi / n, n / 2
    lamb = lamb_mode(k, NU, SIGMA, depth=depth)
    noslip = exact_mode(k, NU, SIGMA, depth, "noslip")
    freeslip = exact_mode(k, NU, SIGMA, depth, "freeslip")
    assert -noslip.real / lamb["damping"] - 1 == pytest.approx(rise, abs=1e-3)
    assert abs(noslip.imag / lamb["frequency"] - 1) < 1e-3
    assert abs(-freeslip.real / lamb["damping"] - 1) < 1e-3
    # deep water: the determinant's root is Lamb's
    deep = exact_mode(k, NU, SIGMA, 4 * n, "noslip")
    assert -deep.real == pytest.approx(lamb_mode(k, NU, SIGMA)["damping"], rel=1e-6)
    # and Lamb's relation itself is 14 % below the weak-damping 2 nu k^2 at n = 50
    if n == 50:
        assert lamb["damping"] / (2 * NU * k * k) == pytest.approx(0.857, abs=1e-3)


def test_a_missing_viscous_normal_stress_would_matter_less_at_higher_viscosity():
    # half of the viscous normal stress left out of the surface's stress balance:
    # the damping falls 21 % below Lamb's at tau = 0.556, 10 % at tau = 0.8 (the
    # measured deficit grows instead: the guide)
    k = 2 * math.pi / 50
    for tau, drop in ((0.5 + 3 / 54, -0.207), (0.8, -0.096)):
        nu = (tau - 0.5) / 3
        full = exact_mode(k, nu, SIGMA, 25, "noslip")
        half = exact_mode(k, nu, SIGMA, 25, "noslip", normal_stress=0.5)
        assert half.real / full.real - 1 == pytest.approx(drop, abs=2e-3)


@pytest.mark.parametrize("n, bias", [(50, 0.0048), (100, 0.0035)])
def test_the_fit_of_a_wave_released_from_rest_returns_lambs_mode(n, bias):
    setup = prepare_case("capillary_wave", n=n)
    o = setup.options
    t = np.arange(setup.steps // o["sample_every"] + 1) * float(o["sample_every"])
    k = 2 * math.pi / n
    assert abs(prosperetti(np.zeros(1), k, NU, SIGMA)[0] - 1) < 1e-9
    fit = damped_oscillation(t, prosperetti(t, k, NU, SIGMA))
    deep = lamb_mode(k, NU, SIGMA)
    assert fit["damping"] / deep["damping"] - 1 == pytest.approx(bias, abs=5e-4)
    assert fit["frequency"] == pytest.approx(deep["frequency"], rel=1e-4)
    # from the fourth period on, the initial transient has gone
    late = t + 3 * 2 * math.pi / deep["frequency"]
    fit = damped_oscillation(late, prosperetti(late, k, NU, SIGMA))
    assert fit["damping"] == pytest.approx(deep["damping"], rel=1e-4)


#: The wavelength-50 wave kept in one row of cells (fill 0.9, no cell converts).
ONE_ROW = (("amplitude", 0.1), ("depth", 25.9))

#: Measured (guide): ``(curvature, n, options) -> (frequency error, damping error)``
#: against the case's reference, in per cent (signed).
DEFICIT = {
    ("smoothed", 50, ()): (-6.8, -8.3),
    ("height", 50, ()): (-3.9, -11.0),
    ("smoothed", 50, (("tau", 0.6),)): (-6.3, -10.0),
    ("height", 50, (("tau", 0.6),)): (-3.6, -12.3),
    ("smoothed", 50, (("tau", 0.7),)): (-5.1, -12.8),
    ("height", 50, (("tau", 0.7),)): (-2.3, -14.8),
    ("smoothed", 50, (("tau", 0.8),)): (-3.2, -12.9),
    ("height", 50, (("tau", 0.8),)): (-0.5, -15.7),
    ("smoothed", 50, (("amplitude", 0.25),)): (-6.1, -7.6),
    ("height", 50, (("amplitude", 0.25),)): (-3.9, -12.3),
    ("smoothed", 50, (("amplitude", 2.0),)): (-7.2, -7.8),
    ("height", 50, (("amplitude", 2.0),)): (-4.9, -6.8),
    # nu k^2 / w = 0.040 as at n = 50 (nu x sqrt 2), amplitude n/100 as at n = 50
    ("smoothed", 100, (("tau", 0.5 + math.sqrt(2) / 18),)): (-3.3, -4.3),
    ("height", 100, (("tau", 0.5 + math.sqrt(2) / 18),)): (-2.1, -7.0),
    ("height", 100, (("amplitude", 0.5),)): (-2.1, -8.7),
    ("height", 100, (("amplitude", 2.0),)): (-2.4, -1.6),
    # the mean surface inside a cell (depth n/2 puts it on a cell face, so that the
    # wave crosses it)
    ("smoothed", 50, (("depth", 25.25),)): (-3.9, -15.2),
    ("smoothed", 50, (("depth", 25.5),)): (-3.4, -14.7),
    ("smoothed", 50, (("depth", 25.75),)): (-5.1, -7.6),
    ("height", 50, (("depth", 25.5),)): (-3.7, -14.3),
    ("smoothed", 100, (("depth", 50.25),)): (-1.9, -1.2),
    ("smoothed", 100, (("depth", 50.5),)): (-1.6, -0.4),
    ("smoothed", 100, (("depth", 50.75),)): (-2.5, 1.6),
    # amplitudes that keep the surface in one row of cells (no cell converts)
    ("smoothed", 50, (("amplitude", 0.1), ("depth", 25.1))): (-5.3, -18.4),
    ("smoothed", 50, (("amplitude", 0.1), ("depth", 25.5))): (-4.1, -14.5),
    ("smoothed", 50, ONE_ROW): (-3.0, -10.7),
    ("smoothed", 100, (("amplitude", 0.2), ("depth", 50.2))): (-2.3, -10.5),
    ("smoothed", 100, (("amplitude", 0.2), ("depth", 50.5))): (-1.9, -8.5),
    ("smoothed", 100, (("amplitude", 0.2), ("depth", 50.8))): (-1.3, -6.7),
    # the same wave in one row of cells with a quarter and twice the surface tension,
    # and with TRT at Lambda = 1/4: the deficit is neither the curvature nor the
    # collision's boundary closure
    ("smoothed", 50, (*ONE_ROW, ("sigma", SIGMA / 4))): (-2.3, -9.7),
    ("smoothed", 50, (*ONE_ROW, ("sigma", 2 * SIGMA))): (-3.4, -11.4),
    ("smoothed", 50, (*ONE_ROW, ("collision", "trt"), ("magic", 0.25))): (-2.9, -11.3),
}


def _run(method: str, n: int, options: tuple) -> dict:
    swap = height_curvature() if method == "height" else contextlib.nullcontext()
    with swap:
        return run_case("capillary_wave", n=n, **dict(options)).summary


# ~3 min: the guide's table of the wave's deficit against viscosity, amplitude, the
# surface's position in its cell and resolution (height: the model with
# curvature(phi, method="height")).
@pytest.mark.slow
def test_the_wave_deficit_table():
    got = {key: _run(*key) for key in DEFICIT}
    for key, (freq, damp) in DEFICIT.items():
        s = got[key]
        f = 100 * (s["frequency"] / s["frequency_theory"] - 1)
        d = 100 * (s["damping"] / s["damping_theory"] - 1)
        assert f == pytest.approx(freq, abs=0.1), (key, f)
        assert d == pytest.approx(damp, abs=0.1), (key, d)
    # the frequency shortfall explains under 1 point of the damping deficit: Lamb's
    # damping at the sigma that gives the measured frequency
    s = got["smoothed", 50, ()]
    k = 2 * math.pi / 50
    lo, hi = 0.5 * SIGMA, SIGMA
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if lamb_mode(k, NU, mid, depth=25)["frequency"] < s["frequency"]:
            lo = mid
        else:
            hi = mid
    shifted = lamb_mode(k, NU, lo, depth=25)["damping"]
    assert 100 * (s["damping"] / shifted - 1) == pytest.approx(-7.7, abs=0.1)
