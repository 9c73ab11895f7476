"""The free-surface lattice Boltzmann model (volume of fluid): one pure step.

Only the liquid is simulated (Koerner et al. 2005; Thuerey 2007; the variant of
FluidX3D described by Lehmann & Gekle 2022). Every cell carries a :class:`Flag`
(gas, interface, fluid or solid) and a mass ``m``; its fill level is
``phi = m / rho`` (1 in fluid cells, 0 in gas). One step:

1. **stream** (pull): populations arrive from the upstream neighbour; links from
   solid cells bounce back; links from gas cells (only interface cells have them)
   are reconstructed from the gas equilibrium,
   ``f_i = f_eq,i(rho_G, u) + f_eq,opp(i)(rho_G, u) - f_out,opp(i)``, with
   ``rho_G = 1 - 3 (D - 1) sigma kappa`` (``6 sigma kappa`` in 3-D,
   ``3 sigma kappa`` in 2-D; ``kappa`` the mean curvature of the fill field,
   negative on a drop: :func:`curvature`);
2. **exchange mass** over every link of fluid and interface cells,
   ``dm_i = s (f_in,i - f_out,opp(i))`` with ``s = 1`` on links touching a fluid
   cell, ``s = (phi_x + phi_nb) / 2`` between two interface cells and 0 towards
   gas and solid; the exchange is antisymmetric, so the total mass changes only
   by round-off;
3. **collide** fluid and interface cells (BGK or TRT of the simulation) with
   gravity as a Guo body force ``rho g``;
4. **convert** in mark-then-apply phases: an interface cell fills (to fluid)
   when ``m > (1 + FILL_MARGIN) rho`` (a margin of 1e-3, Thuerey's, keeps a full
   cell from flickering between the types; the clamp of step 5 moves its
   ``m - rho`` on meanwhile) or it has no gas neighbour, and empties (to gas) when
   ``m < 0`` or it has no fluid neighbour, unless a neighbour fills; gas next to a
   filled cell becomes interface (populations from the equilibrium of its liquid
   neighbours' mean density and velocity), fluid next to an emptied cell becomes
   interface. So fluid never touches gas;
5. **redistribute** the excess mass (``m - rho`` of a filled cell, ``m`` of an
   emptied one, and what clamping an interface cell into ``[0, rho]`` removes)
   equally among the cell's interface neighbours after the conversions, or keep
   it in place when there are none. The total mass, ``sum(m)``, is conserved to
   round-off.

The populations are held in the simulation's storage format (DDF-shifted 16-bit
formats work unchanged); mass and flags stay in the compute dtype and ``int8``.

Three implementations compute the step: the whole-array XLA step
(:mod:`lbm_jax.free_surface._xla_step`, the reference and the fallback), a
native C++ CPU step (``lbm_jax/step/_native/lbm_free_surface.cc`` through
``jax.ffi``: stream-collide and surface passes over memory, the curvature only
near the interface) and a GPU step (``lbm_jax.free_surface._gpu_step``:
Pallas kernels built from the fused GPU step's parts), which ``backend="auto"``
picks where they cover the configuration (:func:`lbm_jax.step._native.
covered_free_surface`, :func:`lbm_jax.free_surface._gpu_step.covered`). They
agree to round-off: their sums run in different orders.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from lbm_jax.core._boundaries import CellType
from lbm_jax.core._collision import CollisionModel, healthy_cells, moments
from lbm_jax.core._pytree import pytree_attributes
from lbm_jax.core._validation import check_real
from lbm_jax.free_surface import _gpu_step
from lbm_jax.free_surface._state import (
    FILL_MARGIN,
    Flag,
    FreeSurfaceState,
    double_add,
    fill_level,
    is_liquid,
    neighbour_sum,
)
from lbm_jax.free_surface._xla_step import xla_step
from lbm_jax.sim._simulation import LBMState, Simulation
from lbm_jax.step import _native
from lbm_jax.step._backend import Backend, Choice, choose, resolve_alias
from lbm_jax.step._gpu import lowering

__all__ = ["FreeSurface"]


@pytree_attributes(
    data=("sim",),
    meta=("sigma", "gravity", "smoothing", "smagorinsky", "backend", "backend_reason"),
)
class FreeSurface:
    """A liquid with a free surface (volume of fluid) in a lattice Boltzmann flow.

    Args:
        sim: The liquid's simulation: lattice, grid, relaxation, storage policy.
            Its ``SOLID`` cells are walls (bounce-back); other non-fluid cell
            types and a construction force are not supported (give gravity here).
        sigma: Surface tension in lattice units (>= 0).
        gravity: Gravitational acceleration, a ``(D,)`` vector in lattice units;
            the body force density is ``rho g``. ``None`` for none.
        smoothing: Smoothing passes of the fill field for the curvature.
        smagorinsky: Smagorinsky constant of a subgrid model (0: none), for
            flows whose ``tau`` is very close to 1/2 (e.g. a physical raindrop
            at CPU resolutions); see :class:`lbm_jax.CollisionModel`.
        backend: The step's implementation (:class:`lbm_jax.step.Backend`):
            ``"auto"`` (default) runs, on a GPU, the fused GPU step (Pallas
            kernels, ``lbm_jax.free_surface._gpu_step``: D2Q9/D3Q19/D3Q27, BGK
            or TRT, with or without the subgrid model, every storage, one
            device), on a CPU the native C++ step where it covers the
            configuration (the same lattices and collisions, FP32 or 16-bit
            DDF-shifted storage, one device), and the XLA step elsewhere, warning
            (:class:`lbm_jax.NativeStepWarning`) when the native library cannot
            be built; ``"gpu"`` and ``"native"`` require theirs; ``"xla"`` runs
            the XLA step; ``None`` (default): the backend ``sim`` was asked for
            (so ``Simulation(..., backend="xla")`` keeps its free surface on the
            XLA step too). The choice is the simulation's rule
            (:func:`lbm_jax.step.choose`), asked for the free surface's own step.
            ``fs.backend`` says which runs, ``fs.backend_reason`` why no
            faster one.
        kernel: Deprecated alias of ``backend`` (a ``DeprecationWarning``).

    Raises:
        ValueError: A simulation with moving walls, equilibrium cells or a force,
            a negative or non-finite ``sigma``, a gravity of the wrong length,
            an unknown ``backend``, or ``"gpu"`` or ``"native"`` where it does
            not cover the configuration.
        TypeError: Arguments of the wrong type.

    >>> import lbm_jax
    >>> from lbm_jax.free_surface import FreeSurface, sphere_fill
    >>> sim = lbm_jax.Simulation("D2Q9", (32, 32), tau=0.8)
    >>> fs = FreeSurface(sim, sigma=0.01)
    >>> state = fs.init(sphere_fill((32, 32), (16, 16), 8.0))
    >>> state = lbm_jax.run(fs.step, state, 20, healthy=fs.healthy).state
    >>> bool(abs(float(fs.total_mass(state)) / (3.14159 * 64) - 1) < 0.01)
    True
    """

    def __init__(
        self,
        sim: Simulation,
        *,
        sigma: float = 0.0,
        gravity: Sequence[float] | None = None,
        smoothing: int = 2,
        smagorinsky: float = 0.0,
        backend: str | Backend | None = None,
        kernel: str | None = None,
    ) -> None:
        if not isinstance(sim, Simulation):
            raise TypeError(f"sim must be an lbm_jax.Simulation, got {sim!r}.")
        if backend is None:
            backend = sim.backend_requested if kernel is None else "auto"
        backend = resolve_alias(backend, kernel)
        other = set(np.unique(sim.cell_type)) - {CellType.FLUID, CellType.SOLID}
        if other:
            names = sorted(CellType(int(c)).name for c in other)
            raise ValueError(
                f"a free-surface simulation supports FLUID and SOLID cells only, "
                f"the simulation has {names}; mark walls SOLID."
            )
        if sim.solid_fraction is not None:
            raise ValueError(
                "a free-surface simulation does not support gray cells; build "
                "the simulation without solid_fraction and mark solid cells SOLID."
            )
        if sim.force is not None:
            raise ValueError(
                "the simulation has a construction force; give the free surface "
                "its gravity instead (FreeSurface(sim, gravity=...))."
            )
        sigma = check_real(sigma, "sigma")
        if not sigma >= 0:
            raise ValueError(f"sigma (surface tension) must be >= 0, got {sigma}.")
        d = sim.lattice.d
        if gravity is None:
            g = (0.0,) * d
        else:
            g = tuple(float(v) for v in np.asarray(gravity, np.float64).reshape(-1))
            if len(g) != d or not all(np.isfinite(g)):
                raise ValueError(
                    f"gravity must be a finite ({d},) vector, got {gravity!r}."
                )
        if isinstance(smoothing, bool) or not isinstance(smoothing, int):
            raise TypeError(f"smoothing must be an int, got {smoothing!r}.")
        if smoothing < 0:
            raise ValueError(f"smoothing must be >= 0, got {smoothing}.")
        smagorinsky = check_real(smagorinsky, "smagorinsky")
        if not 0 <= smagorinsky <= 1:
            raise ValueError(
                f"smagorinsky (the Smagorinsky constant) must be in [0, 1], got "
                f"{smagorinsky}; 0.1 to 0.2 is usual."
            )
        self.sim = sim
        self.smagorinsky = smagorinsky
        choice = self._choose_backend(backend)
        self.backend = choice.backend.value
        self.backend_reason = choice.why_not_faster
        self.sigma = sigma
        self.gravity = g
        self.smoothing = smoothing

    def _choose_backend(self, backend: Backend) -> Choice:
        """The backend of the free-surface step (the one rule, :func:`choose`)."""
        sim = self.sim
        candidates = (
            _gpu_step.candidate(self),
            _native.free_surface_candidate(
                sim.lattice, sim.storage, sim.shape, sim.devices
            ),
        )
        return choose(backend, candidates, "free surface")

    @property
    def kernel(self) -> str:
        """Deprecated alias of ``backend``."""
        warnings.warn(
            "FreeSurface.kernel is deprecated; use FreeSurface.backend.",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.backend

    @property
    def collision(self) -> CollisionModel:
        """The liquid's collision model, the Smagorinsky constant included."""
        model = self.sim.collision
        if self.smagorinsky:
            model = dataclasses.replace(model, smagorinsky=self.smagorinsky)
        return model

    def __repr__(self) -> str:
        return (
            f"FreeSurface({self.sim!r}, sigma={self.sigma}, gravity={self.gravity}, "
            f"backend={self.backend!r})"
        )

    @property
    def solid(self) -> np.ndarray:
        """Boolean grid of the solid cells."""
        return self.sim.cell_type == CellType.SOLID

    # -- state construction and read-out ------------------------------------------
    def init(
        self, phi: ArrayLike, rho: ArrayLike = 1.0, u: ArrayLike | None = None
    ) -> FreeSurfaceState:
        """A state from a fill field.

        Cells with ``phi = 1`` are fluid, ``0`` gas, in between interface; fluid
        cells next to gas become interface cells (full), so that fluid never
        touches gas. Solid cells are solid whatever ``phi`` says. The mass is
        ``phi rho``. Gas and solid cells hold the rest equilibrium (``rho = 1``,
        ``u = 0``), as every step leaves them.

        Args:
            phi: Fill level in ``[0, 1]``, grid-shaped.
            rho: Density, scalar or grid-shaped (e.g. hydrostatic).
            u: Velocity, ``(D,)`` or ``(D, *shape)`` (e.g. a falling drop).

        Raises:
            ValueError: A fill field of the wrong shape, outside ``[0, 1]`` or
                non-finite, or no liquid at all.
        """
        shape = self.sim.shape
        p = np.asarray(phi, np.float64)
        if p.shape != shape:
            raise ValueError(f"phi must have the grid's shape {shape}, got {p.shape}.")
        if not np.all(np.isfinite(p)) or p.min() < 0 or p.max() > 1:
            raise ValueError("phi (the fill level) must be finite and in [0, 1].")
        solid = self.solid
        p = np.where(solid, 0.0, p)
        if not np.any(p > 0):
            raise ValueError("phi holds no liquid (every cell is empty or solid).")
        fluid = self.sim.init(rho, u)
        rest = self.sim.init()
        flags = np.where(p > 0, Flag.INTERFACE, Flag.GAS)
        flags = np.where(p >= 1.0, Flag.FLUID, flags)
        gas = jnp.asarray(flags == Flag.GAS, jnp.float32)
        gas_near = np.asarray(neighbour_sum(self.sim.lattice, gas)) > 0
        flags = np.where((flags == Flag.FLUID) & gas_near, Flag.INTERFACE, flags)
        flags = np.where(solid, Flag.SOLID, flags).astype(np.int8)
        liquid = (flags == Flag.FLUID) | (flags == Flag.INTERFACE)
        # populations in the population layout (X, Q, ...)
        f = jnp.where(jnp.asarray(liquid)[:, None], fluid.f, rest.f)
        fluid = LBMState(f=f, t=fluid.t)
        rho_arr = np.broadcast_to(np.asarray(rho, np.float64), shape)
        dtype = self.sim.storage.compute_dtype
        return FreeSurfaceState(
            fluid=fluid,
            mass=jnp.asarray((p * rho_arr).astype(dtype)),
            flags=jnp.asarray(flags),
            carry=jnp.zeros(shape, dtype),
        )

    def convert(self, state: FreeSurfaceState, source: FreeSurface) -> FreeSurfaceState:
        """``state``, a state of ``source``, in this free surface's storage: the
        populations re-encoded (:meth:`lbm_jax.Simulation.convert`), flags kept,
        mass and its carry in this compute dtype (copies: running the one state
        does not consume the other).

        Raises:
            TypeError: ``source`` is not a FreeSurface.
            ValueError: As :meth:`lbm_jax.Simulation.convert` raises it.
        """
        if not isinstance(source, FreeSurface):
            raise TypeError(f"source must be a FreeSurface, got {source!r}.")
        dtype = self.sim.storage.compute_dtype
        return FreeSurfaceState(
            fluid=self.sim.convert(state.fluid, source.sim),
            mass=jnp.array(state.mass, dtype, copy=True),
            flags=jnp.array(state.flags, copy=True),
            carry=jnp.array(state.carry, dtype, copy=True),
        )

    def fields(self, state: FreeSurfaceState) -> tuple[jax.Array, jax.Array]:
        """Density ``(*shape)`` and velocity ``(D, *shape)``; zero outside the liquid.

        The velocity includes gravity's Guo half-force correction.
        """
        rho, j = self._moments(state)
        liquid = is_liquid(state.flags)
        safe = jnp.where(liquid, rho, 1)
        u = [
            jnp.where(liquid, (ji - 0.5 * ga * safe) / safe, 0)
            for ji, ga in zip(j, self.gravity, strict=True)
        ]
        return jnp.where(liquid, rho, 0), jnp.stack(u)

    def fill(self, state: FreeSurfaceState) -> jax.Array:
        """Fill level ``phi`` in ``[0, 1]`` (1 fluid, 0 gas and solid)."""
        return fill_level(state.flags, state.mass, self._moments(state)[0])

    def _moments(self, state: FreeSurfaceState) -> tuple[jax.Array, list]:
        """Density and momentum of the stored populations (every cell)."""
        f = self.sim.populations(state.fluid, shifted=True)
        return moments(self.sim.lattice, f, shift=self.sim.storage.shift)

    def total_mass(self, state: FreeSurfaceState) -> jax.Array:
        """Total liquid mass ``sum(mass + carry)``, summed in double-word
        arithmetic (pairs of compute-dtype numbers combined by TwoSum), so the
        result is the exact total rounded once: a float32 drift diagnostic
        resolves 1e-7 on any grid (a plain float32 sum scatters by 1e-6)."""
        hi, lo = jax.lax.reduce(
            (state.mass.reshape(-1), state.carry.reshape(-1)),
            (jnp.zeros((), state.mass.dtype), jnp.zeros((), state.mass.dtype)),
            double_add,
            (0,),
        )
        return hi + lo

    def healthy(self, state: FreeSurfaceState) -> jax.Array:
        """Every liquid density finite and positive and speed within the
        lattice's stability limit, every mass finite."""
        rho, j = self._moments(state)
        liquid = is_liquid(state.flags)
        ok = jnp.where(liquid, healthy_cells(rho, j), True)
        return jnp.all(ok) & jnp.all(jnp.isfinite(state.mass))

    # -- the step -------------------------------------------------------------------
    def step(self, state: FreeSurfaceState) -> FreeSurfaceState:
        """One free-surface step (pure, jit-able): stream, exchange mass, collide,
        convert cells and redistribute the excess mass."""
        self.sim.check_state(state.fluid)
        with lowering(self.backend):
            return self._step_jit(self, state)

    def _step_impl(self, state: FreeSurfaceState) -> FreeSurfaceState:
        if self.backend == "xla":
            return xla_step(self, state)
        if self.backend == "gpu":
            return _gpu_step.gpu_step(self, state)
        step = _native.make_native_free_surface_step(
            self.sim.lattice,
            self.sim.storage,
            self.collision,
            self.sim.shape,
            sigma=self.sigma,
            gravity=self.gravity,
            smoothing=self.smoothing,
            fill_limit=1 + FILL_MARGIN,
        )
        g, flags, mass, carry = step(
            state.fluid.f, state.flags, state.mass, state.carry
        )
        fluid = LBMState(f=g, t=state.fluid.t + 1)
        return FreeSurfaceState(fluid=fluid, mass=mass, flags=flags, carry=carry)

    # compiled once per free-surface configuration (static part of the pytree)
    _step_jit = staticmethod(jax.jit(_step_impl))
