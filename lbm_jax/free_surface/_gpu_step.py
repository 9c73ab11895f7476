"""The free-surface step on a GPU: the surface stage inside the fused kernel.

The XLA step (:mod:`lbm_jax.free_surface._xla_step`) streams and collides the
populations as whole arrays, several passes over them per step. Here the
populations pass through memory once per step, in one Pallas kernel built from
the fused GPU step's parts (:mod:`lbm_jax.step._gpu`, :mod:`lbm_jax.step._gpu_cells`),
the way FluidX3D puts the surface's link treatment inside its stream-collide
kernel. Each GPU thread owns one cell and

1. pulls its populations, reflecting links from solid cells and rebuilding links
   from gas cells from the gas equilibrium (anti-bounce-back);
2. exchanges mass over the links of an interface cell (the fill-weighted
   ``f_in - f_out`` of the XLA step); a fluid cell's exchange is the change of
   its density, ``rho_in - rho_0``, which sums the same link terms;
3. collides (BGK or TRT, the Smagorinsky model, gravity as a Guo force) and
   stores, or stores the rest populations in gas and solid cells;
4. writes its mass (with its TwoSum carry), density, velocity and whether it
   has gas and fluid neighbours.

Only interface cells and cells next to a wall read their own outgoing
populations (masked loads), so the step reads and writes each population about
once, plus one read for the density and velocity of the stored state. Scalar
fields (the fill level's curvature, the cell conversions, the excess mass)
stay whole-array XLA code, shared with the XLA step; a second kernel writes the
populations of converted cells only (masked stores).

The step agrees with the XLA step to within rounding: a fluid cell's mass sums
its link terms in another order, and the GPU's compiler may contract
multiply-adds differently. Pallas' interpret mode runs the same kernels on the
CPU, which is how the tests check them against the XLA step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lbm_jax.free_surface._state import (
    Flag,
    FreeSurfaceState,
    is_liquid,
    materialise,
    two_sum,
)
from lbm_jax.free_surface._xla_step import (
    convert,
    gas_state,
    new_interface_moments,
    redistribute,
)
from lbm_jax.sim._simulation import LBMState
from lbm_jax.step import _gpu
from lbm_jax.step._backend import Backend, Candidate
from lbm_jax.step._gpu_cells import (
    collide_cells,
    encode_in_kernel,
    equilibrium_cells,
    index,
    wrap,
)
from lbm_jax.step._layout import from_layout

__all__ = ["candidate", "covered", "gpu_step"]

#: What the fix-up kernel writes into a cell: nothing, the equilibrium of a new
#: interface cell, or the rest populations of a cell that turned to gas.
_KEEP, _NEW_INTERFACE, _TO_GAS = 0, 1, 2


def covered(fs: Any, *, interpret: bool = False) -> str | None:
    """Why the GPU free-surface step cannot run ``fs``, or ``None`` when it can.

    Covered: what the fused GPU step covers (:func:`lbm_jax.step._gpu.supported`:
    D2Q9/D3Q19/D3Q27, BGK or TRT, the Smagorinsky model, every storage) on one
    device, on a GPU (``interpret``: anywhere, for tests).
    """
    sim = fs.sim
    if sim.devices != 1:
        return "it runs on one device"
    if not _gpu.supported(
        sim.lattice, sim.storage, fs.collision, sim.shape, interpret=interpret
    ):
        return _gpu.unavailable_reason() or (
            "it covers D2Q9, D3Q19 and D3Q27 grids, BGK or TRT"
        )
    return None


def candidate(fs: Any) -> Candidate:
    """The GPU free-surface step's answer for ``fs`` (see
    :func:`lbm_jax.step.choose`): :func:`covered` as far as the configuration
    goes; off a GPU ``"auto"`` passes it over."""
    why = covered(fs, interpret=True)
    return Candidate(Backend.GPU, why, _gpu.unavailable_reason, None, _gpu.available())


def _rest(fs: Any) -> list[float]:
    """The rest populations (density 1, at rest) as the storage holds them,
    decoded: ``w_i``, or 0 when shifted."""
    w = fs.sim.lattice.w
    return [0.0 if fs.sim.storage.shift else float(v) for v in w]


def _load(ref: Any, at: tuple, mask: jax.Array, other: Any) -> jax.Array:
    _, plgpu = _gpu.pallas_modules()
    return plgpu.load(ref.at[at], mask=mask, other=other)


class _Cell:
    """One program's cells as the stream-collide kernel sees them: flags, the
    surface's fill level, velocity and gas equilibrium, and the loads."""

    def __init__(self, plan: Any, refs: dict[str, Any]) -> None:
        self.plan, self.refs = plan, refs
        st, lat = plan.storage, plan.lattice
        self.cells = _gpu.program_cells(plan)
        self.mask, self.coords = self.cells.mask, self.cells.coords
        self.at = tuple(self.coords)
        flag = _load(refs["flags"], self.at, self.mask, int(Flag.GAS))
        self.is_f = flag == Flag.FLUID
        self.is_i = flag == Flag.INTERFACE
        self.liquid = self.is_f | self.is_i
        self.surface = self.mask & self.is_i
        self.phi = _load(refs["phi"], self.at, self.surface, 0)
        u0 = [_load(r, self.at, self.surface, 0) for r in refs["u0"]]
        rho_gas = _load(refs["rho_gas"], self.at, self.surface, 1)
        self.feq_gas = equilibrium_cells(lat, rho_gas, u0, shift=st.shift)[0]

    def own(self, i: int, where: jax.Array) -> jax.Array:
        """The cell's stored population ``i`` (decoded) where ``where`` holds."""
        at = index(self.coords, i)
        return self.plan.storage.decode(_load(self.refs["f"], at, self.mask & where, 0))

    def pull(self) -> tuple[list[jax.Array], jax.Array, jax.Array, jax.Array]:
        """``(f_in, dm, has_gas, has_fluid)``: the incoming populations (wall
        links reflected, gas links rebuilt), an interface cell's mass exchange
        over its links, and which neighbours it has."""
        plan, refs = self.plan, self.refs
        st, lat = plan.storage, plan.lattice
        opp, nx = lat.opposite, plan.shape[0]
        f_in = [self.own(0, self.liquid)]
        dm = jnp.zeros_like(self.phi)
        has_gas = has_fluid = jnp.zeros_like(self.liquid)
        for i in range(1, lat.q):
            o = int(opp[i])
            src = self.cells.shifted(plan.dirs[i], -1)
            src[0] = wrap(src[0], nx)
            flag_up = _load(refs["flags"], tuple(src), self.mask, int(Flag.GAS))
            solid_up, gas_up = flag_up == Flag.SOLID, flag_up == Flag.GAS
            fluid_up = flag_up == Flag.FLUID
            at = index(src, i)
            f_up = st.decode(_load(refs["f"], at, self.mask & self.liquid, 0))
            f_rev = self.own(o, self.liquid & (self.is_i | solid_up))
            gas_link = self.feq_gas[i] + self.feq_gas[o] - f_rev
            f_in.append(jnp.where(gas_up, gas_link, jnp.where(solid_up, f_rev, f_up)))
            phi_up = _load(refs["phi"], tuple(src), self.surface, 0)
            shared = jnp.where(flag_up == Flag.INTERFACE, 0.5 * (self.phi + phi_up), 0)
            weight = jnp.where(fluid_up, jnp.ones_like(shared), shared)
            dm = dm + weight * (f_up - f_rev)
            has_gas = has_gas | gas_up
            has_fluid = has_fluid | fluid_up
        return f_in, dm, has_gas, has_fluid


#: The stream-collide kernel's refs, in :func:`gpu_step`'s order (``u0`` and
#: ``u`` hold one ref per axis).
_INPUTS = ("f", "flags", "phi", "rho_gas", "rho0", "mass", "carry", "u0")
_OUTPUTS = ("g", "mass_out", "carry_out", "rho_out", "u_out", "bits_out")


def _named_refs(refs: tuple, d: int) -> dict[str, Any]:
    """The kernel's refs by name."""
    named, k = {}, 0
    for name in (*_INPUTS, *_OUTPUTS):
        if name in ("u0", "u_out"):
            named[name], k = refs[k : k + d], k + d
        else:
            named[name], k = refs[k], k + 1
    return named


def _stream_collide_kernel(fs: Any, plan: Any) -> Callable[..., None]:
    """Pull, surface links, mass exchange, collision and store (see the module
    docstring)."""
    _, plgpu = _gpu.pallas_modules()
    lat, st = plan.lattice, plan.storage
    dtype = np.dtype(st.compute_dtype)
    gravity = [np.asarray(g, dtype) for g in fs.gravity] if any(fs.gravity) else None
    rest = [np.asarray(v, dtype) for v in _rest(fs)]

    def kernel(*refs):
        refs = _named_refs(refs, lat.d)
        cell = _Cell(plan, refs)
        mask, at, liquid = cell.mask, cell.at, cell.liquid
        f_in, dm, has_gas, has_fluid = cell.pull()
        rho_in = f_in[0]
        for i in range(1, lat.q):
            rho_in = rho_in + f_in[i]
        if st.shift:
            rho_in = rho_in + 1
        # a fluid cell's exchange sums all its link terms: its density change
        rho0 = _load(refs["rho0"], at, mask & cell.is_f, 1)
        dm = jnp.where(cell.is_f, rho_in - rho0, dm)
        rho_in = jnp.where(liquid, rho_in, np.asarray(1, dtype))
        force = None if gravity is None else [rho_in * g for g in gravity]
        out, rho, u = collide_cells(
            lat, plan.model, f_in, shift=st.shift, force=force, with_moments=True
        )
        for i in range(lat.q):
            value = jnp.where(liquid, out[i], jnp.full_like(out[i], rest[i]))
            at_i = index(cell.coords, i)
            plgpu.store(refs["g"].at[at_i], encode_in_kernel(st, value), mask=mask)
        mass = _load(refs["mass"], at, mask, 0)
        carry = _load(refs["carry"], at, mask, 0)
        mass, carry = two_sum(mass, carry, jnp.where(liquid, dm, 0))
        plgpu.store(refs["mass_out"].at[at], mass, mask=mask)
        plgpu.store(refs["carry_out"].at[at], carry, mask=mask)
        plgpu.store(refs["rho_out"].at[at], jnp.where(liquid, rho, 1), mask=mask)
        for ref, ua in zip(refs["u_out"], u, strict=True):
            plgpu.store(ref.at[at], jnp.where(liquid, ua, 0), mask=mask)
        bits = has_gas.astype(jnp.int8) + 2 * has_fluid.astype(jnp.int8)
        plgpu.store(refs["bits_out"].at[at], bits, mask=mask)

    return kernel


def _fix_up_kernel(fs: Any, plan: Any) -> Callable[..., None]:
    """Populations of converted cells: the equilibrium of a new interface cell's
    neighbours, the rest populations of a cell turned gas; others untouched."""
    _, plgpu = _gpu.pallas_modules()
    lat, st = plan.lattice, plan.storage
    d = lat.d
    rest = _rest(fs)

    def kernel(code_ref, rho_ref, *refs):
        u_refs, (_, g_ref) = refs[:d], refs[d:]
        cells = _gpu.program_cells(plan)
        mask, coords = cells.mask, cells.coords
        at = tuple(coords)
        code = _load(code_ref, at, mask, _KEEP)
        new = code == _NEW_INTERFACE
        rho = _load(rho_ref, at, mask & new, 1)
        u = [_load(r, at, mask & new, 0) for r in u_refs]
        feq, _ = equilibrium_cells(lat, rho, u, shift=st.shift)
        for i in range(lat.q):
            value = jnp.where(new, feq[i], jnp.full_like(feq[i], rest[i]))
            plgpu.store(
                g_ref.at[index(coords, i)],
                encode_in_kernel(st, value),
                mask=mask & (code != _KEEP),
            )

    return kernel


def _plan(fs: Any, interpret: bool) -> Any:
    sim = fs.sim
    return _gpu.Plan(sim.lattice, sim.storage, fs.collision, sim.shape, None, interpret)


def gpu_step(
    fs: Any, state: FreeSurfaceState, *, interpret: bool = False
) -> FreeSurfaceState:
    """One free-surface step of ``fs`` with the fused kernels (jit-able).

    ``interpret``: run the kernels in Pallas' interpret mode (any backend; slow,
    for tests).
    """
    lat, pol = fs.sim.lattice, fs.sim.storage
    plan = _plan(fs, interpret)
    live = state.fluid.t >= 0  # a traced "true" for the phase boundaries

    def keep(*arrays: Any) -> Any:
        return materialise(live, *arrays)

    stored, flags = state.fluid.f, state.flags
    f = pol.decode(from_layout(stored))  # read once, for the moments
    rho_gas, u0, phi, rho0 = gas_state(fs, f, flags, state.mass, keep)
    dtype = state.mass.dtype
    scalar = jax.ShapeDtypeStruct(flags.shape, dtype)
    out_shape = [
        _gpu.result_type(stored),
        scalar,
        scalar,
        scalar,
        *[scalar] * lat.d,
        jax.ShapeDtypeStruct(flags.shape, jnp.int8),
    ]
    inputs = [stored, flags, phi, rho_gas, rho0, state.mass, state.carry, *u0]
    name = f"free_surface_{lat.name.lower()}_{pol.short_name}"
    g, mass, carry, rho, *rest = _gpu.run_kernel(
        plan, _stream_collide_kernel(fs, plan), inputs, out_shape, name
    )
    u, bits = rest[: lat.d], rest[lat.d]
    has_gas, has_fluid = (bits & 1) != 0, (bits & 2) != 0
    to_fluid, to_gas, gas_to_i, new_flags = convert(
        lat, flags, mass, rho, has_gas, has_fluid, keep
    )
    src = is_liquid(flags) & ~to_gas
    rho_new, u_new = new_interface_moments(lat, src, rho, u, keep)
    mass, carry = redistribute(
        lat, flags, new_flags, to_fluid, to_gas, mass, carry, rho, keep
    )
    code = jnp.where(gas_to_i, _NEW_INTERFACE, jnp.where(to_gas, _TO_GAS, _KEEP))
    inputs = [code.astype(jnp.int8), rho_new, *u_new]
    g = _gpu.run_kernel(
        plan,
        _fix_up_kernel(fs, plan),
        [*inputs, g],
        _gpu.result_type(g),
        f"{name}_conversions",
        alias=True,
    )
    fluid = LBMState(f=g, t=state.fluid.t + 1)
    return FreeSurfaceState(fluid=fluid, mass=mass, flags=new_flags, carry=carry)
