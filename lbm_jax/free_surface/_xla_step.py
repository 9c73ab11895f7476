"""The free-surface step as whole-array XLA code: the reference of the native step.

:func:`xla_step` runs the phases of one step (see
:mod:`lbm_jax.free_surface._model` for the physics) as named functions, each a
whole-array operation. Phase boundaries are materialised
(:func:`~lbm_jax.free_surface._state.materialise`): fused across them, XLA
recomputes the whole producer chain for every neighbour a later phase reads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lbm_jax.core._collision import collide, equilibrium, moments, reverse
from lbm_jax.free_surface._curvature import curvature
from lbm_jax.free_surface._state import (
    FILL_MARGIN,
    Flag,
    FreeSurfaceState,
    fill_level,
    materialise,
    neighbour_sum,
    two_sum,
)
from lbm_jax.sim._simulation import LBMState
from lbm_jax.step._layout import from_layout, to_layout

__all__ = ["convert", "gas_state", "new_interface_moments", "redistribute", "xla_step"]

Keep = Callable[..., Any]


def _upstream(shape: tuple[int, ...], c: tuple[int, ...]) -> Callable:
    """``up(padded)``: ``a(x - c)`` from ``a`` padded by one periodic layer."""

    def up(padded: jax.Array) -> jax.Array:
        lead = padded.ndim - len(shape)
        index = [slice(None)] * lead + [
            slice(1 - ci, 1 - ci + n) for ci, n in zip(c, shape, strict=True)
        ]
        return padded[tuple(index)]

    return up


def _wrap(a: jax.Array, d: int) -> jax.Array:
    """``a`` with one periodic halo layer on each side of its last ``d`` axes."""
    return jnp.pad(a, [(0, 0)] * (a.ndim - d) + [(1, 1)] * d, mode="wrap")


def gas_state(
    fs: Any, f: jax.Array, flags: jax.Array, mass: jax.Array, keep: Keep
) -> tuple[jax.Array, list, jax.Array, jax.Array]:
    """``(rho_gas, u0, phi, rho0)``: the gas density ``1 - 3 (D - 1) sigma
    kappa``, the velocity and the fill level of the stored populations ``f``
    (decoded, ``(Q, *grid)``), and their density (1 outside the liquid)."""
    lat, shift = fs.sim.lattice, fs.sim.storage.shift
    liquid = (flags == Flag.FLUID) | (flags == Flag.INTERFACE)
    rho0, j0 = moments(lat, f, shift=shift)
    safe0 = jnp.where(liquid, rho0, jnp.ones((), f.dtype))
    u0 = [jnp.where(liquid, ji / safe0, 0) for ji in j0]
    phi, u0, safe0 = keep(fill_level(flags, mass, safe0), u0, safe0)
    kappa = curvature(phi, flags == Flag.SOLID, passes=fs.smoothing)
    rho_gas = 1 - (3 * (lat.d - 1) * fs.sigma) * kappa
    return rho_gas, u0, phi, safe0


def _gas_equilibrium(
    fs: Any, f: jax.Array, flags: jax.Array, mass: jax.Array, keep: Keep
) -> tuple[jax.Array, jax.Array]:
    """``(feq_gas, phi)``: the equilibrium at the gas density and the cell's
    velocity (:func:`gas_state`), and the fill level."""
    rho_gas, u0, phi, _ = gas_state(fs, f, flags, mass, keep)
    return equilibrium(fs.sim.lattice, rho_gas, u0, shift=fs.sim.storage.shift), phi


def _stream_and_exchange(
    fs: Any,
    f: jax.Array,
    flags: jax.Array,
    mass: jax.Array,
    carry: jax.Array,
    keep: Keep,
) -> tuple[jax.Array, ...]:
    """Pull streaming (bounce-back, gas reconstruction) and the mass exchange:
    ``(fin, mass, carry, has_gas, has_fluid)``."""
    lat, shape = fs.sim.lattice, fs.sim.shape
    feq_gas, phi = _gas_equilibrium(fs, f, flags, mass, keep)
    is_f = flags == Flag.FLUID
    liquid = is_f | (flags == Flag.INTERFACE)
    one = jnp.ones((), f.dtype)
    f_rev = reverse(lat, f)
    f_wrap, flags_wrap, phi_wrap = (_wrap(a, lat.d) for a in (f, flags, phi))
    streamed = []
    dm = jnp.zeros_like(mass)
    has_gas = has_fluid = jnp.zeros_like(liquid)
    for i in range(lat.q):
        if not np.any(lat.c[i]):  # the rest population stays
            streamed.append(f[i])
            continue
        o = int(lat.opposite[i])
        up = _upstream(shape, tuple(int(v) for v in lat.c[i]))
        f_up, flag_up = up(f_wrap[i]), up(flags_wrap)
        gas_up = flag_up == Flag.GAS
        fi = jnp.where(flag_up == Flag.SOLID, f_rev[i], f_up)
        streamed.append(jnp.where(gas_up, feq_gas[i] + feq_gas[o] - f_rev[i], fi))
        # the mass exchange along the link (f_rev[i] leaves x towards x - c_i)
        interface = jnp.where(is_f, one, 0.5 * (phi + up(phi_wrap)))
        weight = jnp.where(
            flag_up == Flag.FLUID,
            one,
            jnp.where(flag_up == Flag.INTERFACE, interface, 0),
        )
        dm = dm + weight * (f_up - f_rev[i])
        has_gas = has_gas | gas_up
        has_fluid = has_fluid | (flag_up == Flag.FLUID)
    mass, carry = two_sum(mass, carry, jnp.where(liquid, dm, 0))
    return keep(jnp.stack(streamed), mass, carry, has_gas, has_fluid)


def _collide(
    fs: Any, fin: jax.Array, liquid: jax.Array, keep: Keep
) -> tuple[jax.Array, jax.Array, list]:
    """Collision with gravity as a Guo force of density ``rho g``:
    ``(out, rho, u)`` (``rho`` 1 outside the liquid)."""
    sim = fs.sim
    lat, shift, model = sim.lattice, sim.storage.shift, fs.collision
    one = jnp.ones((), fin.dtype)
    rho_in, _ = moments(lat, fin, shift=shift)
    rho_in = jnp.where(liquid, rho_in, one)
    force = None
    if any(fs.gravity):
        force = [rho_in * np.asarray(g, fin.dtype) for g in fs.gravity]
    out, rho, u = collide(lat, model, fin, shift=shift, force=force)
    return keep(out, jnp.where(liquid, rho, one), u)


def convert(
    lat: Any,
    flags: jax.Array,
    mass: jax.Array,
    rho: jax.Array,
    has_gas: jax.Array,
    has_fluid: jax.Array,
    keep: Keep,
) -> tuple[jax.Array, ...]:
    """Mark, then apply, so that fluid never touches gas:
    ``(to_fluid, to_gas, gas_to_i, new_flags)``."""
    is_i = flags == Flag.INTERFACE

    def near(mask: jax.Array) -> jax.Array:
        return neighbour_sum(lat, mask.astype(jnp.float32)) > 0

    to_fluid = is_i & ((mass > (1 + FILL_MARGIN) * rho) | ~has_gas)
    to_gas = is_i & ~to_fluid & ((mass < 0) | ~has_fluid)
    to_fluid, to_gas = keep(to_fluid, to_gas)
    (to_gas,) = keep(to_gas & ~near(to_fluid))  # filling takes precedence
    gas_to_i = (flags == Flag.GAS) & near(to_fluid)
    fluid_to_i = (flags == Flag.FLUID) & near(to_gas)
    new_flags = jnp.where(to_fluid, Flag.FLUID, flags)
    new_flags = jnp.where(to_gas, Flag.GAS, new_flags)
    new_flags = jnp.where(gas_to_i | fluid_to_i, Flag.INTERFACE, new_flags)
    new_flags, gas_to_i = keep(new_flags.astype(flags.dtype), gas_to_i)
    return to_fluid, to_gas, gas_to_i, new_flags


def new_interface_moments(
    lat: Any, src: jax.Array, rho: jax.Array, u: list, keep: Keep
) -> tuple[jax.Array, list]:
    """Density and velocity of new interface cells: the means over their liquid
    neighbours ``src`` (density 1 where there are none)."""
    srcf = src.astype(rho.dtype)
    count = neighbour_sum(lat, srcf)
    inv = 1 / jnp.maximum(count, 1)
    rho_new = neighbour_sum(lat, jnp.where(src, rho, 0)) * inv
    u_new = [neighbour_sum(lat, jnp.where(src, ua, 0)) * inv for ua in u]
    rho_new = jnp.where(count > 0, rho_new, jnp.ones((), rho.dtype))
    return keep(rho_new, u_new)


def _new_interface(
    fs: Any, src: jax.Array, rho: jax.Array, u: list, keep: Keep
) -> jax.Array:
    """Populations of new interface cells: the equilibrium of
    :func:`new_interface_moments`."""
    lat = fs.sim.lattice
    rho_new, u_new = new_interface_moments(lat, src, rho, u, keep)
    return equilibrium(lat, rho_new, u_new, shift=fs.sim.storage.shift)


def redistribute(
    lat: Any,
    flags: jax.Array,
    new_flags: jax.Array,
    to_fluid: jax.Array,
    to_gas: jax.Array,
    mass: jax.Array,
    carry: jax.Array,
    rho: jax.Array,
    keep: Keep,
) -> tuple[jax.Array, jax.Array]:
    """The excess mass of filled, emptied and clamped interface cells, shared
    equally among the interface neighbours (kept where there are none)."""
    converted = to_fluid | to_gas
    excess = jnp.where(to_fluid, mass - rho, jnp.where(to_gas, mass, 0))
    excess = excess + jnp.where(converted, carry, 0)
    mass = jnp.where(to_fluid, rho, jnp.where(to_gas, 0, mass))
    carry = jnp.where(converted, 0, carry)
    stays = (flags == Flag.INTERFACE) & (new_flags == Flag.INTERFACE)
    clamp = jnp.where(stays, jnp.maximum(mass - rho, 0) + jnp.minimum(mass, 0), 0)
    excess = excess + clamp
    mass = mass - clamp
    target = new_flags == Flag.INTERFACE
    targets = neighbour_sum(lat, target.astype(mass.dtype))
    share = jnp.where(targets > 0, excess / jnp.maximum(targets, 1), 0)
    (share,) = keep(share)
    received = neighbour_sum(lat, share)
    gained = jnp.where(targets > 0, 0, excess) + jnp.where(target, received, 0)
    return two_sum(mass, carry, gained)


def xla_step(fs: Any, state: FreeSurfaceState) -> FreeSurfaceState:
    """One free-surface step of ``fs`` (a :class:`FreeSurface`), whole-array.

    Stream (with the mass exchange), collide, convert, initialise new interface
    cells, redistribute the excess mass, encode.
    """
    lat, pol = fs.sim.lattice, fs.sim.storage
    live = state.fluid.t >= 0  # a traced "true" for the phase boundaries

    def keep(*arrays: Any) -> Any:
        return materialise(live, *arrays)

    f = pol.decode(from_layout(state.fluid.f))  # (Q, *grid), post-collision
    flags = state.flags
    liquid = (flags == Flag.FLUID) | (flags == Flag.INTERFACE)
    fin, mass, carry, has_gas, has_fluid = _stream_and_exchange(
        fs, f, flags, state.mass, state.carry, keep
    )
    out, rho, u = _collide(fs, fin, liquid, keep)
    to_fluid, to_gas, gas_to_i, new_flags = convert(
        lat, flags, mass, rho, has_gas, has_fluid, keep
    )
    feq_new = _new_interface(fs, liquid & ~to_gas, rho, u, keep)
    mass, carry = redistribute(
        lat, flags, new_flags, to_fluid, to_gas, mass, carry, rho, keep
    )
    liquid_new = (new_flags == Flag.FLUID) | (new_flags == Flag.INTERFACE)
    zero = jnp.zeros((), f.dtype)
    rest = equilibrium(lat, jnp.ones((), f.dtype), [zero] * lat.d, shift=pol.shift)
    rest = jnp.broadcast_to(rest.reshape((lat.q,) + (1,) * lat.d), f.shape)
    f_new = jnp.where(gas_to_i[None], feq_new, out)
    f_new = jnp.where(liquid_new[None], f_new, rest)
    # encoded in the step's layout first: fused into the transpose to the
    # state's layout, the selections ran 10x slower
    (stored,) = keep(pol.encode(f_new))
    fluid = LBMState(f=to_layout(stored), t=state.fluid.t + 1)
    return FreeSurfaceState(fluid=fluid, mass=mass, flags=new_flags, carry=carry)
