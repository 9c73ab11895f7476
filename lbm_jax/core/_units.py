"""Lattice units and the limits of the method: the one home of these constants.

Every lattice here has the squared speed of sound ``c_s^2 = 1/3``; the kinematic
viscosity of a relaxation time ``tau`` is ``nu = c_s^2 (tau - 1/2)``. Two limits
bound the parameters the solver accepts, and every check (the simulation, the
validation cases, the command line) applies the same values:

* :data:`MAX_MACH`: the largest Mach number ``|u| / c_s`` of a prescribed or
  characteristic velocity. The equilibrium is a low-Mach expansion whose error grows
  like ``Ma^2``; above Mach 0.35 (``|u| = 0.202``) it exceeds 12 % and the
  collision operators here lose stability.
* :data:`MIN_TAU`: the smallest relaxation time. ``tau = 1/2`` means zero viscosity;
  within ``1e-4`` of it, float32 arithmetic no longer resolves the viscosity (the
  relaxation rate ``1/tau`` lies within ``4e-4`` of 2).

A third bounds what a running state may reach: :data:`MAX_SPEED`, the lattice's
stability limit, which the health check of a run applies to every cell.

>>> viscosity(0.8)
0.1
>>> round(tau_from_re(100.0, u_ref=0.1, length=128), 6)
0.884
>>> mach(0.1) < MAX_MACH
True
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "CS",
    "CS2",
    "MAX_MACH",
    "MAX_SPEED",
    "MIN_TAU",
    "check_mach",
    "check_tau",
    "mach",
    "tau_from_re",
    "tau_from_viscosity",
    "viscosity",
]

#: Squared lattice speed of sound, shared by every lattice here.
CS2 = 1.0 / 3.0

#: Lattice speed of sound.
CS = math.sqrt(CS2)

#: Largest Mach number ``|u| / c_s`` accepted for a prescribed velocity.
MAX_MACH = 0.35

#: Smallest relaxation time accepted (``tau - 1/2 >= 1e-4``).
MIN_TAU = 0.5 + 1e-4

#: Largest speed ``|u|`` (lattice units) of a healthy state: ``sqrt(2) c_s``
#: (0.816, Mach 1.41). Beyond it the rest population of the equilibrium,
#: ``w_0 rho (1 - |u|^2 / (2 c_s^2))``, is negative: the collision relaxes towards
#: no distribution at all, and the run has left the lattice's stability range.
MAX_SPEED = math.sqrt(2.0 * CS2)


def viscosity(tau: float) -> float:
    """Kinematic viscosity of a relaxation time: ``c_s^2 (tau - 1/2)``."""
    return CS2 * (float(tau) - 0.5)


def tau_from_viscosity(nu: float) -> float:
    """Relaxation time of a kinematic viscosity: ``nu / c_s^2 + 1/2``."""
    return float(nu) / CS2 + 0.5


def tau_from_re(re: float, *, u_ref: float, length: float) -> float:
    """Relaxation time giving the Reynolds number ``re = u_ref * length / nu``.

    Raises:
        ValueError: If ``re`` is not a positive finite number.
    """
    if not (isinstance(re, int | float) and math.isfinite(re) and re > 0):
        raise ValueError(
            f"Reynolds number must be a positive finite number, got {re!r}; "
            "pass e.g. re=100."
        )
    return tau_from_viscosity(u_ref * length / re)


def mach(speed: float) -> float:
    """Mach number ``|u| / c_s`` of a lattice speed."""
    return abs(float(speed)) / CS


def check_mach(speed: float, *, what: str) -> None:
    """Reject a speed (lattice units) above the low-Mach limit :data:`MAX_MACH`.

    Args:
        speed: The largest speed of the velocity in question.
        what: Its name, quoted in the message (e.g. ``"lid speed u_ref"``).

    Raises:
        ValueError: If ``speed`` is not finite or its Mach number exceeds
            :data:`MAX_MACH`.
    """
    if not math.isfinite(speed):
        raise ValueError(f"{what} must be finite, got {speed!r}.")
    if mach(speed) > MAX_MACH:
        raise ValueError(
            f"{what} reaches |u| = {abs(speed):.4g} lattice units (Mach "
            f"{mach(speed):.3f}), above the low-Mach limit {MAX_MACH * CS:.4g} "
            f"(Mach {MAX_MACH}); lower the velocity and raise the resolution or "
            "tau to keep the Reynolds number."
        )


def check_tau(tau: float, *, context: str = "") -> float:
    """Return ``tau`` as a float, or raise if it is at or too close to 1/2.

    Args:
        tau: Relaxation time.
        context: What produced it (e.g. ``"re=1e6 with n=32, u_ref=0.1"``), quoted
            in the message.

    Raises:
        TypeError: If ``tau`` is not a real number.
        ValueError: If ``tau`` is not finite or below :data:`MIN_TAU`.
    """
    if isinstance(tau, bool) or not isinstance(
        tau, int | float | np.integer | np.floating
    ):
        raise TypeError(f"tau must be a real number, got {tau!r}.")
    tau = float(tau)
    if not (math.isfinite(tau) and tau >= MIN_TAU):
        source = (
            f"{context} gives relaxation time tau = {tau:.6g}"
            if context
            else f"tau = {tau!r}"
        )
        raise ValueError(
            f"{source}, but tau must be finite and at least {MIN_TAU} (tau = 1/2 "
            "means zero viscosity, nu = (tau - 1/2)/3); lower the Reynolds number "
            "or raise the resolution."
        )
    return tau
