"""Parameter derivation shared by the cases: Reynolds number, relaxation, Mach limit.

Everything here is plain Python on floats so that a bad combination of parameters is
rejected with a :class:`ValueError` before any array is allocated or anything is
compiled. Lattice units throughout: c_s^2 = 1/3, nu = c_s^2 (tau - 1/2).

>>> round(tau_from_re(100.0, u_ref=0.1, length=128), 6)
0.884
>>> mach(0.1) < MAX_MACH
True
"""

from __future__ import annotations

import math

__all__ = [
    "MAX_MACH",
    "MIN_TAU",
    "check_positive_int",
    "check_tau",
    "check_velocity",
    "mach",
    "nu_from_tau",
    "tau_from_nu",
    "tau_from_re",
]

#: Largest Mach number u / c_s accepted for a characteristic velocity. The lattice
#: Boltzmann equilibrium is a low-Mach expansion; its error grows like Ma^2 and the
#: solver becomes unstable well below Ma = 1.
MAX_MACH = 0.35

#: Smallest relaxation time accepted. tau = 1/2 is the stability limit (zero
#: viscosity); below 0.5 + 1e-3 no collision operator here is usable.
MIN_TAU = 0.5 + 1e-3

_CS = 1.0 / math.sqrt(3.0)


def tau_from_nu(nu: float) -> float:
    """Relaxation time for a kinematic viscosity in lattice units: 3 nu + 1/2."""
    return 3.0 * float(nu) + 0.5


def nu_from_tau(tau: float) -> float:
    """Kinematic viscosity in lattice units for a relaxation time: (tau - 1/2) / 3."""
    return (float(tau) - 0.5) / 3.0


def tau_from_re(re: float, *, u_ref: float, length: float) -> float:
    """Relaxation time giving Reynolds number ``re = u_ref * length / nu``.

    Raises:
        ValueError: If ``re`` is not a positive finite number.
    """
    if not (isinstance(re, int | float) and math.isfinite(re) and re > 0):
        raise ValueError(
            f"Reynolds number must be a positive finite number, got {re!r}; "
            "pass e.g. re=100."
        )
    return tau_from_nu(u_ref * length / re)


def mach(u: float) -> float:
    """Mach number |u| / c_s of a lattice velocity."""
    return abs(float(u)) / _CS


def check_velocity(u: float, *, what: str) -> None:
    """Reject a characteristic velocity outside the low-Mach regime.

    Raises:
        ValueError: If ``u`` is not positive or its Mach number exceeds
            :data:`MAX_MACH`.
    """
    if not (math.isfinite(u) and u > 0):
        raise ValueError(f"{what} must be positive and finite, got {u!r}.")
    if mach(u) > MAX_MACH:
        raise ValueError(
            f"{what} = {u:.4g} is Mach {mach(u):.3f} in lattice units, above the "
            f"low-Mach limit {MAX_MACH}; lower the velocity (u_ref) or the "
            "Reynolds number, or raise the resolution n."
        )


def check_tau(tau: float, *, context: str) -> None:
    """Reject a relaxation time at or below the stability limit 1/2.

    Args:
        tau: Relaxation time.
        context: What produced it (e.g. ``"re=1e6 with n=32, u_ref=0.1"``), quoted
            in the message.

    Raises:
        ValueError: If ``tau`` is not above :data:`MIN_TAU`.
    """
    if not (math.isfinite(tau) and tau >= MIN_TAU):
        raise ValueError(
            f"{context} gives relaxation time tau = {tau:.6g}, but tau must be at "
            f"least {MIN_TAU} (tau = 1/2 means zero viscosity); lower the Reynolds "
            "number or raise the resolution n."
        )


def check_positive_int(value: object, *, name: str, minimum: int) -> int:
    """Return ``value`` as an int, or raise if it is not an integer >= ``minimum``.

    Raises:
        TypeError: If ``value`` is not an integer (bools are rejected).
        ValueError: If it is smaller than ``minimum``.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{name} must be an integer, got {value!r} of type {type(value).__name__}."
        )
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}.")
    return int(value)
