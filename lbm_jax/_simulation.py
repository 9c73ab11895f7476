"""The simulation factory: validated configuration plus pure, compiled step functions.

:class:`Simulation` validates every parameter on the host (``ValueError`` or
``TypeError`` before anything is traced or compiled), derives the boundary arrays,
and builds pure functions over an :class:`LBMState` pytree:

* ``sim.step(state) -> state``: one fused pull-streaming + collision step; pure and
  jit-able (use it inside your own ``jax.jit``/``lax.scan``);
* ``sim.advance(state, steps) -> state``: ``steps`` steps in one compiled
  ``lax.fori_loop``; the state buffers are donated (the input state is consumed)
  and ``steps`` is a traced argument, so a new step count never recompiles;
* :func:`lbm_jax.run` adds health checks, callbacks and a progress bar on top.

The state holds the post-collision populations of time step ``t`` in the storage
format (DDF-shifted unless the storage policy says otherwise) and the step counter.
Its array layout is an implementation detail: read populations through
:meth:`Simulation.populations` and fields through :func:`lbm_jax.density` and
:func:`lbm_jax.velocity`. Saving ``state`` (any pytree checkpointer) and loading it
back continues bit-identically.

>>> import lbm_jax
>>> sim = lbm_jax.Simulation("D2Q9", (16, 8), tau=0.8)
>>> state = sim.advance(sim.init(), 10)
>>> int(state.t)
10
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from jax.typing import ArrayLike

from lbm_jax._boundaries import BoundaryData, CellType, build_boundary
from lbm_jax._collision import (
    CollisionModel,
    direction_constants,
    equilibrium,
    moments,
    parse_collision,
)
from lbm_jax._kernel import default_slab, from_layout, make_step_into, to_layout
from lbm_jax._lattice import Lattice, get_lattice
from lbm_jax._storage import StoragePolicy, get_storage
from lbm_jax._validation import (
    check_cell_type,
    check_density,
    check_devices,
    check_shape,
    check_slab,
    check_speed,
    check_steps,
    vector_field,
)

__all__ = ["LBMState", "Simulation"]


class _Aux(NamedTuple):
    """Arrays passed to the compiled step as arguments (not baked-in constants)."""

    boundary: BoundaryData
    force: jax.Array | None


class LBMState(NamedTuple):
    """Simulation state (a pytree of arrays).

    Attributes:
        f: Post-collision populations in the storage format.
        t: Time step counter (int32 scalar).
    """

    f: jax.Array
    t: jax.Array


class Simulation:
    """A lattice Boltzmann simulation on a regular grid.

    Args:
        lattice: ``"D2Q9"``, ``"D3Q19"``, ``"D3Q27"`` or a :class:`Lattice`.
        shape: Grid size ``(X, Y)`` or ``(X, Y, Z)``, matching the lattice dimension.
        tau: Relaxation time (> 1/2); kinematic viscosity ``(tau - 1/2)/3``.
        storage: Storage policy name (``"fp32"``, ``"FP32/FP16S"``, ...) or a
            :class:`StoragePolicy`.
        shift: DDF-shifting of stored populations; overrides the policy's own flag
            when given.
        collision: ``"bgk"`` or ``"trt"``.
        magic: TRT magic parameter (3/16 puts bounce-back walls mid-link).
        force: Body-force density, a ``(D,)`` vector or ``(D, *shape)`` field
            (Guo forcing); ``None`` for no force.
        cell_type: Integer grid of :class:`CellType` codes; ``None`` means all
            fluid (fully periodic).
        wall_velocity: Velocity of ``WALL`` cells, ``(D,)`` or ``(D, *shape)``.
        boundary_density: Density of ``EQUILIBRIUM`` cells, scalar or grid-shaped.
        boundary_velocity: Velocity of ``EQUILIBRIUM`` cells, ``(D,)`` or
            ``(D, *shape)``.
        slab: Tuning knob: x-planes per cache tile of the compiled step; by
            default chosen from the plane size. Results do not depend on it.
        devices: Split the grid along x over this many local devices (each runs
            its own sub-domain, halo planes travel by ``ppermute``); ``None`` uses
            one device. On a CPU, start Python with
            ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` to get ``N``
            host devices. ``X`` must be divisible by ``devices``.

    Raises:
        ValueError: Unknown lattice/storage/collision, ``tau <= 1/2``, velocities
            above the low-Mach limit, masks or fields whose shape does not match
            the grid, float64 storage with x64 disabled.
        TypeError: Arguments of the wrong type.
    """

    def __init__(
        self,
        lattice: str | Lattice,
        shape: Sequence[int],
        *,
        tau: float,
        storage: str | StoragePolicy = "fp32",
        shift: bool | None = None,
        collision: str = "bgk",
        magic: float = 3.0 / 16.0,
        force: ArrayLike | None = None,
        cell_type: ArrayLike | None = None,
        wall_velocity: ArrayLike | None = None,
        boundary_density: ArrayLike = 1.0,
        boundary_velocity: ArrayLike | None = None,
        slab: int | None = None,
        devices: int | None = None,
    ) -> None:
        lat = get_lattice(lattice)
        shape = check_shape(shape, lat)
        if shift is None and isinstance(storage, StoragePolicy):
            pol = storage
        else:
            pol = get_storage(storage, shift=True if shift is None else shift)
        pol.check_enabled()
        model = parse_collision(collision, tau, magic)

        ct = check_cell_type(cell_type, shape)
        uw = vector_field("wall_velocity", wall_velocity, lat.d, shape)
        ub = vector_field("boundary_velocity", boundary_velocity, lat.d, shape)
        rb = check_density("boundary_density", boundary_density, shape)
        check_speed("wall_velocity", uw, ct == CellType.WALL)
        check_speed("boundary_velocity", ub, ct == CellType.EQUILIBRIUM)
        fvec = None
        if force is not None:
            farr = np.asarray(force, dtype=np.float64)
            if farr.shape == (lat.d,):
                fvec = farr
            else:
                fvec = vector_field("force", farr, lat.d, shape)
            if not np.all(np.isfinite(fvec)):
                raise ValueError("force contains non-finite values.")

        self._lattice = lat
        self._shape = shape
        self._storage = pol
        self._model = model
        self._cell_type = ct
        self._cell_type.setflags(write=False)
        self._force = fvec
        self._wall_velocity = uw
        ndev = check_devices(devices, shape[0])
        local = (shape[0] // ndev, *shape[1:])
        if slab is None:
            slab = default_slab(lat, local, pol.compute_dtype.itemsize)
        slab = check_slab(slab, local[0])
        self._mesh = Mesh(np.array(jax.devices()[:ndev]), ("x",)) if ndev > 1 else None
        bnd = build_boundary(lat, pol, ct, uw, rb, ub)
        self._aux = self._place(
            _Aux(
                boundary=BoundaryData(
                    *(None if a is None else to_layout(a) for a in bnd)
                ),
                force=None
                if fvec is None or fvec.ndim == 1
                else to_layout(jnp.asarray(fvec.astype(pol.compute_dtype))),
            )
        )
        self._slab = int(slab)
        self._step_into = make_step_into(
            lat,
            pol,
            model,
            local,
            self._slab,
            None
            if fvec is None or fvec.ndim != 1
            else [np.asarray(v, pol.compute_dtype) for v in fvec],
        )
        self._advance = jax.jit(self._advance_impl, donate_argnums=(1,))
        self._runners: dict[int, Any] = {}

    # -- read-only configuration ------------------------------------------------
    @property
    def lattice(self) -> Lattice:
        """Velocity set."""
        return self._lattice

    @property
    def shape(self) -> tuple[int, ...]:
        """Grid size."""
        return self._shape

    @property
    def storage(self) -> StoragePolicy:
        """Storage policy of the populations."""
        return self._storage

    @property
    def collision(self) -> CollisionModel:
        """Collision operator and relaxation times."""
        return self._model

    @property
    def tau(self) -> float:
        """Relaxation time."""
        return self._model.tau

    @property
    def viscosity(self) -> float:
        """Kinematic viscosity in lattice units."""
        return self._model.viscosity

    @property
    def cell_type(self) -> np.ndarray:
        """Integer cell-type grid (read-only)."""
        return self._cell_type

    @property
    def force(self) -> np.ndarray | None:
        """Body-force density, ``(D,)`` or ``(D, *shape)``, or ``None``."""
        return self._force

    @property
    def num_cells(self) -> int:
        """Number of grid cells."""
        return math.prod(self._shape)

    def __repr__(self) -> str:
        return (
            f"Simulation({self._lattice.name}, shape={self._shape}, tau={self.tau}, "
            f"storage={self._storage}, collision={self._model.kind.value})"
        )

    # -- state construction and read-out ----------------------------------------
    def init(self, rho: ArrayLike = 1.0, u: ArrayLike | None = None) -> LBMState:
        """Equilibrium initial state at ``t = 0``.

        Args:
            rho: Density, scalar or grid-shaped (positive, finite).
            u: Velocity, ``(D,)`` vector or ``(D, *shape)`` field; zero if ``None``.
                With a body force, the populations carry the Guo half-force so that
                :func:`lbm_jax.velocity` returns ``u`` exactly.

        Raises:
            ValueError: Shapes that do not fit the grid, non-positive density or a
                velocity above the low-Mach limit.
        """
        r = check_density("rho", rho, self._shape)
        uu = vector_field("u", u, self._lattice.d, self._shape)
        check_speed("initial velocity u", uu)
        dtype = self._storage.compute_dtype
        feq = equilibrium(
            self._lattice,
            jnp.asarray(r.astype(dtype)),
            [jnp.asarray(ua.astype(dtype)) for ua in uu],
            shift=self._storage.shift,
        )
        if self._force is not None:
            # post-collision momentum is rho u + F/2 (Guo)
            w, cs = direction_constants(self._lattice, dtype, len(self._shape))
            fc = [np.asarray(fa, dtype) for fa in self._force]
            fc = [fa[None] if fa.ndim else fa for fa in fc]
            feq = feq + 1.5 * w * sum(c * fa for c, fa in zip(cs, fc, strict=True))
        f = to_layout(self._storage.encode(feq))
        bnd = self._aux.boundary
        if bnd.fixed is not None:
            f = jnp.where(bnd.fixed_mask, bnd.fixed, f)
        return LBMState(f=self._place(f), t=jnp.zeros((), jnp.int32))

    def _place(self, tree: Any) -> Any:
        """Put x-leading arrays on the mesh, split along x (no-op on one device)."""
        if self._mesh is None:
            return tree
        return jax.device_put(tree, NamedSharding(self._mesh, PartitionSpec("x")))

    @property
    def devices(self) -> int:
        """Number of devices the grid is split over."""
        return 1 if self._mesh is None else self._mesh.size

    def _from_layout(self, f: jax.Array) -> jax.Array:
        return from_layout(f)

    def populations(self, state: LBMState) -> jax.Array:
        """Decoded, unshifted post-collision populations ``(Q, *shape)``."""
        f = self._storage.decode(self._from_layout(state.f))
        if self._storage.shift:
            w, _ = direction_constants(
                self._lattice, self._storage.compute_dtype, len(self._shape)
            )
            f = f + w
        return f

    def fields(self, state: LBMState) -> tuple[jax.Array, jax.Array]:
        """Density ``(*shape)`` and velocity ``(D, *shape)`` at time ``state.t``."""
        f = self._storage.decode(state.f)
        rho, j = moments(self._lattice, f, shift=self._storage.shift, axis=1)
        if self._force is not None:
            fc = (
                [np.asarray(v, f.dtype) for v in self._force]
                if self._aux.force is None
                else [self._aux.force[:, a] for a in range(self._lattice.d)]
            )
            j = [ji - 0.5 * fa for ji, fa in zip(j, fc, strict=True)]
        return rho, jnp.stack([ji / rho for ji in j])

    # -- the compiled step ------------------------------------------------------
    def _local_step(self, aux: _Aux, f: jax.Array, g: jax.Array) -> jax.Array:
        """One step on this device's sub-domain (exchanging halos when split)."""
        if self._mesh is None:
            return self._step_into(aux, f, g)
        n = self._mesh.size
        left = jax.lax.ppermute(f[-1:], "x", [(i, (i + 1) % n) for i in range(n)])
        right = jax.lax.ppermute(f[:1], "x", [(i, (i - 1) % n) for i in range(n)])
        return self._step_into(aux, f, g, (left, right))

    def _local_advance(self, aux: _Aux, f: jax.Array, steps: jax.Array) -> jax.Array:
        g = jnp.zeros_like(f)

        def pair(_: jax.Array, fg: tuple[jax.Array, jax.Array]):
            f, g = fg
            g = self._local_step(aux, f, g)
            return self._local_step(aux, g, f), g

        f, g = jax.lax.fori_loop(0, steps // 2, pair, (f, g))
        return jax.lax.cond(
            steps % 2 == 1, lambda: self._local_step(aux, f, g), lambda: f
        )

    def _sharded(self, fn: Any) -> Any:
        if self._mesh is None:
            return fn
        x = PartitionSpec("x")
        aux_spec = jax.tree.map(lambda _: x, self._aux)
        return jax.shard_map(
            fn,
            mesh=self._mesh,
            in_specs=(aux_spec, x, PartitionSpec()),
            out_specs=x,
        )

    def step(self, state: LBMState) -> LBMState:
        """One fused streaming + collision step (pure, jit-able)."""

        def one(aux: _Aux, f: jax.Array, _: jax.Array) -> jax.Array:
            return self._local_step(aux, f, jnp.zeros_like(f))

        f = self._sharded(one)(self._aux, state.f, jnp.zeros((), jnp.int32))
        return LBMState(f=f, t=state.t + 1)

    def _advance_f(self, aux: _Aux, f: jax.Array, steps: jax.Array) -> jax.Array:
        """``steps`` steps, two per loop iteration (f -> g -> f, no buffer swap)."""
        return self._sharded(self._local_advance)(aux, f, steps)

    def _advance_impl(self, aux: _Aux, state: LBMState, steps: jax.Array) -> LBMState:
        return LBMState(f=self._advance_f(aux, state.f, steps), t=state.t + steps)

    def advance(self, state: LBMState, steps: int) -> LBMState:
        """Run ``steps`` steps in one compiled loop (donates ``state``'s buffers).

        Args:
            state: Current state; its buffers are reused for the result, so do not
                use ``state`` afterwards.
            steps: Number of steps (>= 0); a traced argument, so any value reuses
                the same compiled program.
        """
        steps = check_steps(steps)
        return self._advance(self._aux, state, jnp.asarray(steps, jnp.int32))

    def healthy(self, state: LBMState) -> jax.Array:
        """True when every density is finite and positive (jit-able, no sync)."""
        rho, _ = moments(
            self._lattice,
            self._storage.decode(state.f),
            shift=self._storage.shift,
            axis=1,
        )
        return jnp.all(jnp.isfinite(rho) & (rho > 0))
