"""The simulation factory: validated configuration plus pure, compiled step functions.

:class:`Simulation` validates every parameter on the host (``ValueError`` or
``TypeError`` before anything is traced or compiled), derives the boundary arrays,
and builds pure functions over an :class:`LBMState` pytree. It composes three
parts: its validated configuration and step arrays
(:mod:`lbm_jax.sim._config`), its compiled step functions (here) and its
read-outs (:mod:`lbm_jax.sim._readout` around :mod:`lbm_jax.sim._slabs`).

* ``sim.step(state, force=None) -> state``: one fused pull-streaming + collision
  step; pure and jit-able (use it inside your own ``jax.jit``/``lax.scan``, or in a
  coupled step);
* ``sim.advance(state, steps, force=None) -> state``: ``steps`` steps in one
  compiled loop; the state buffers are donated (the input state is consumed) and
  ``steps`` is a traced argument, so a new step count never recompiles; inside
  ``jax.grad``/``jax.jvp`` it is differentiated with checkpoints;
* :func:`lbm_jax.run` drives either (or any pure step over a pytree) with health
  checks, sampling, early stopping, callbacks and a progress bar.

``force`` is a body-force density (Guo forcing), a ``(D,)`` vector or a
``(D, *shape)`` field, passed as a traced argument: a new force every step (as an
immersed boundary produces) never recompiles. It replaces the force given at
construction for that call; read the velocity with the same force
(``lbm_jax.velocity(sim, state, force=...)``) to take off its Guo half-force.

A :class:`Simulation` is a pytree: its boundary and force arrays are its leaves
and its configuration is static, so ``jax.jit``-compiled functions take it as an
argument (its arrays travel as arguments, not as baked-in constants).

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

# long: the public class, each method with its documented parameters; the work
# is in _config, _loops, _readout and _slabs
from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec
from jax.typing import ArrayLike

from lbm_jax.core._collision import CollisionModel
from lbm_jax.core._lattice import Lattice
from lbm_jax.core._remat import checkpoint_levels
from lbm_jax.core._storage import StoragePolicy
from lbm_jax.core._units import viscosity
from lbm_jax.core._validation import check_steps, is_traced
from lbm_jax.sim import _loops, _slabs
from lbm_jax.sim._config import (
    SimulationConfig,
    StepArrays,
    configure,
    replaced_arrays,
)
from lbm_jax.sim._readout import (
    check_state,
    converted_populations,
    initial_populations,
    readout_force,
)
from lbm_jax.step._backend import Backend, resolve_alias
from lbm_jax.step._layout import from_layout
from lbm_jax.step._xla_inplace import Streaming

__all__ = ["LBMState", "Simulation"]


class LBMState(NamedTuple):
    """Simulation state (a pytree of arrays).

    Attributes:
        f: Post-collision populations in the storage format.
        t: Time step counter (int32 scalar).
    """

    f: jax.Array
    t: jax.Array

    @property
    def num_cells(self) -> int:
        """Number of grid cells the state holds."""
        return self.f.size // self.f.shape[1]


@jax.tree_util.register_pytree_node_class
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
            (Guo forcing); ``None`` for no force. ``step`` and ``advance`` take a
            force per call as well, which replaces this one for that call.
        cell_type: Integer grid of :class:`CellType` codes; ``None`` means all
            fluid (fully periodic).
        wall_velocity: Velocity of ``WALL`` cells, ``(D,)`` or ``(D, *shape)``.
        boundary_density: Density of ``EQUILIBRIUM`` cells, scalar or grid-shaped.
        boundary_velocity: Velocity of ``EQUILIBRIUM`` cells, ``(D,)`` or
            ``(D, *shape)``.
        solid_fraction: Gray cells: a grid-shaped array of solid fractions
            ``n_s`` in ``[0, 1]``, or ``None`` (default) for none. Each cell
            sends out ``(1 - n_s) f_i* + n_s f_opp(i)``, its collided
            populations blended with its own pre-collision populations
            reversed (the partial bounce-back of Walsh, Burwinkle & Saar 2009):
            ``n_s = 0`` is plain fluid, ``n_s = 1`` a solid cell whose walls lie
            half-way to its fluid neighbours (in a steady flow), values between
            a porous medium
            (uniform ``n_s`` under a force ``F``: pre-collision momentum
            ``(1 - n_s) F / (2 n_s)``). The blend conserves mass and is smooth in
            ``n_s``, so a shape can be optimised with ``jax.grad`` through
            :meth:`with_arrays`. :func:`lbm_jax.density` and
            :func:`lbm_jax.velocity` read the stored populations' moments as in
            fluid cells. Gray cells run on the XLA step (split grids
            included: the array is split like the grid).
        slab: Tuning knob: x-planes per cache tile of the compiled step; by
            default chosen from the plane size. Results do not depend on it.
        devices: Domain decomposition: ``None`` runs on one device; an int
            ``N`` splits x over the first ``N`` devices; a tuple gives the
            sub-domains per grid axis, e.g. ``(2, 2, 1)`` (x-major over
            ``jax.devices()``); a ``jax.sharding.Mesh`` whose axis names are
            among ``"x"``, ``"y"``, ``"z"`` splits each named grid axis over
            that mesh axis. Each device runs its own sub-domain; ghost layers
            travel by ``ppermute`` in the storage format, and results are
            bit-identical to one device. Under ``jax.distributed`` the devices
            of every process count. On a CPU, start Python with
            ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` to get ``N``
            host devices. Each split must divide its axis.
        streaming: How :meth:`advance` keeps the populations between steps:
            ``"inplace"`` updates a single population buffer slab by slab
            (about half the memory of a run; one device only), ``"two-buffer"``
            pulls from one buffer into a second; ``"auto"`` (default) picks the
            faster, at present two-buffer everywhere (in-place measured a few
            percent slower on CPUs). Results are bit-identical; :meth:`step`
            always uses the two-buffer step.
        backend: The step's implementation (:class:`lbm_jax.step.Backend`):
            ``"auto"`` (default) runs, on a CPU, the fused native C++ step
            (compiled on first use, called through ``jax.ffi``) where it covers
            the configuration (D2Q9, D3Q19, D3Q27 BGK with FP32/FP32, FP32/FP16S,
            FP32/FP16C or FP32/bfloat16 storage, DDF-shifted, at least 128 cells
            per x-plane, split along x at most, no gray cells), on a GPU the
            fused GPU step (one Pallas kernel per step, ``lbm_jax.step._gpu``:
            D2Q9/D3Q19/D3Q27, BGK or TRT with or without the Smagorinsky model,
            every storage, boundaries and forces, split along x at most, no gray
            cells), and the XLA step
            elsewhere; ``"native"`` and ``"gpu"`` require theirs (``ValueError``
            saying why not); ``"xla"`` runs the XLA step. The native step is
            bit-identical to the XLA step, the GPU step agrees to within
            rounding. :attr:`backend` says which runs, :attr:`backends` which
            runs each kind of call and :attr:`backend_reason` why no faster one.
        kernel: Deprecated alias of ``backend`` (a ``DeprecationWarning``).

    Raises:
        ValueError: Unknown lattice/storage/collision, ``tau`` too close to 1/2,
            velocities above the low-Mach limit, masks or fields whose shape does
            not match the grid, a solid fraction outside ``[0, 1]``, float64
            storage with x64 disabled.
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
        solid_fraction: ArrayLike | None = None,
        slab: int | None = None,
        devices: int | Sequence[int] | Mesh | None = None,
        streaming: str | Streaming = "auto",
        backend: str | Backend = "auto",
        kernel: str | None = None,
    ) -> None:
        backend = resolve_alias(backend, kernel)
        self._static, arrays = configure(
            lattice,
            shape,
            tau=tau,
            storage=storage,
            shift=shift,
            collision=collision,
            magic=magic,
            force=force,
            cell_type=cell_type,
            wall_velocity=wall_velocity,
            boundary_density=boundary_density,
            boundary_velocity=boundary_velocity,
            solid_fraction=solid_fraction,
            slab=slab,
            devices=devices,
            streaming=streaming,
            backend=backend,
        )
        self._aux = self._place(arrays)

    # -- pytree protocol: arrays are leaves, the configuration is static --------
    def tree_flatten(self) -> tuple[tuple[StepArrays], SimulationConfig]:
        """Children (the boundary and force arrays) and static configuration."""
        return (self._aux,), self._static

    @classmethod
    def tree_unflatten(
        cls, static: SimulationConfig, children: tuple[StepArrays]
    ) -> Simulation:
        """Rebuild a simulation from :meth:`tree_flatten`'s parts."""
        self = object.__new__(cls)
        self._static = static
        (self._aux,) = children
        return self

    # -- read-only configuration ------------------------------------------------
    @property
    def lattice(self) -> Lattice:
        """Velocity set."""
        return self._static.lattice

    @property
    def shape(self) -> tuple[int, ...]:
        """Grid size."""
        return self._static.shape

    @property
    def storage(self) -> StoragePolicy:
        """Storage policy of the populations."""
        return self._static.storage

    @property
    def collision(self) -> CollisionModel:
        """Collision operator and relaxation times."""
        return self._static.model

    @property
    def tau(self) -> float:
        """Relaxation time."""
        return self._static.model.tau

    @property
    def viscosity(self) -> float:
        """Kinematic viscosity in lattice units."""
        return viscosity(self.tau)

    @property
    def cell_type(self) -> np.ndarray:
        """Integer cell-type grid (read-only)."""
        return self._static.cell_type

    @property
    def force(self) -> np.ndarray | None:
        """Body-force density given at construction, ``(D,)`` or ``(D, *shape)``."""
        return self._static.force

    @property
    def wall_velocity(self) -> np.ndarray:
        """Velocity of the ``WALL`` cells, ``(D, *shape)`` float64 (read-only)."""
        return self._static.wall_velocity

    @property
    def solid_fraction(self) -> jax.Array | None:
        """The gray cells' solid fraction, grid-shaped in the compute dtype (a
        traced value inside a transformation where :meth:`with_arrays` was given
        one), or ``None`` without gray cells."""
        ns = self._aux.solid_fraction
        return None if ns is None else from_layout(ns)[0]

    @property
    def num_cells(self) -> int:
        """Number of grid cells."""
        return math.prod(self.shape)

    @property
    def devices(self) -> int:
        """Number of devices the grid is split over."""
        decomp = self._static.decomp
        return 1 if decomp is None else decomp.mesh.size

    @property
    def backend(self) -> str:
        """The backend of :meth:`step`: ``"native"``, ``"gpu"`` or ``"xla"``."""
        return self._static.plan.backend.value

    @property
    def backends(self) -> dict[str, str]:
        """The backend that runs each kind of call: ``"step"``, ``"step_force"``
        (a step given a force per call: the native step runs the XLA step for
        it), ``"advance"`` (in-place streaming on the native backend runs the
        XLA step's in-place loop) and ``"derivative"`` (whose derivative
        ``jax.grad`` takes: ``"native"`` where the native step's adjoint
        transposes it, else ``"xla"``, the XLA step running under the derivative;
        :attr:`derivative_reason` says why not the native adjoint)."""
        plan = self._static.plan
        return {
            "step": plan.backend.value,
            "step_force": plan.backend_with_force.value,
            "advance": plan.backend_advance.value,
            "derivative": plan.backend_derivative.value,
        }

    @property
    def backend_requested(self) -> str:
        """The backend this simulation was asked for (``"auto"`` unless named);
        a :class:`~lbm_jax.free_surface.FreeSurface` on it asks for the same."""
        return self._static.plan.requested.value

    @property
    def backend_reason(self) -> str | None:
        """Why no faster backend runs this simulation (each candidate's reason),
        or ``None`` when the fastest for this machine runs."""
        return self._static.plan.why_not_faster

    @property
    def derivative_reason(self) -> str | None:
        """Why reverse mode does not run the native step's adjoint (the XLA
        step's derivative runs instead), or ``None`` when it does (see
        :attr:`backends`, ``"derivative"``)."""
        return self._static.plan.why_not_native_derivative

    @property
    def kernel(self) -> str:
        """Deprecated alias of :attr:`backend`."""
        warnings.warn(
            "Simulation.kernel is deprecated; use Simulation.backend.",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.backend

    @property
    def streaming(self) -> Streaming:
        """How :meth:`advance` keeps the populations (see the constructor)."""
        return self._static.streaming

    @property
    def decomposition(self) -> tuple[int, ...]:
        """Sub-domains per grid axis (all 1 on one device)."""
        decomp = self._static.decomp
        return (1,) * len(self.shape) if decomp is None else decomp.splits

    @property
    def mesh(self) -> Mesh | None:
        """The device mesh (axes named ``"x"``, ``"y"``, ``"z"``), or ``None``."""
        decomp = self._static.decomp
        return None if decomp is None else decomp.mesh

    def __repr__(self) -> str:
        return (
            f"Simulation({self.lattice.name}, shape={self.shape}, tau={self.tau}, "
            f"storage={self.storage}, collision={self.collision.kind.value}, "
            f"backend={self.backend!r})"
        )

    def with_arrays(
        self,
        *,
        force: ArrayLike | None = None,
        wall_velocity: ArrayLike | None = None,
        boundary_density: ArrayLike | None = None,
        boundary_velocity: ArrayLike | None = None,
        solid_fraction: ArrayLike | None = None,
    ) -> Simulation:
        """This simulation with new force, boundary or solid-fraction values;
        the same configuration and compiled steps (no recompilation for new
        values).

        The values may be traced, so a derivative or a batch passes through
        them: ``jax.grad`` of a cavity's flow by its lid speed or of a channel's
        by the shape of a gray obstacle, ``jax.vmap`` over inflow densities.
        Host values are checked as the constructor checks them; traced ones for
        shape only (a traced solid fraction's values are not checked to lie in
        ``[0, 1]``). An argument left ``None`` keeps its value as it is.

        A simulation built without gray cells takes a solid fraction too, but
        then plans its step anew: the native and GPU steps do not cover gray
        cells, so the XLA step runs (``backend="native"`` or ``"gpu"`` raises
        ``ValueError``), and the new configuration compiles its own programs.
        To give a traced solid fraction to the same compiled steps again and
        again, build the simulation with one (``solid_fraction=np.zeros(shape)``).

        Args:
            force: Body force of every step, ``(D,)`` or ``(D, *shape)`` (as if
                passed to each call; a per-call force still replaces it).
            wall_velocity: Velocity of the ``WALL`` cells.
            boundary_density: Density of the ``EQUILIBRIUM`` cells.
            boundary_velocity: Velocity of the ``EQUILIBRIUM`` cells.
            solid_fraction: The gray cells' solid fraction, grid-shaped, in
                ``[0, 1]`` (see the constructor).

        Each value left ``None`` is kept as it is.

        Raises:
            ValueError, TypeError: As the constructor, for the values given.

        >>> import jax, jax.numpy as jnp, lbm_jax
        >>> sim = lbm_jax.Simulation("D2Q9", (16, 8), tau=0.8, force=(1e-5, 0.0))
        >>> def mean_u(fx):
        ...     pushed = sim.with_arrays(force=jnp.stack([fx, 0.0]))
        ...     state = pushed.advance(pushed.init(), 4)
        ...     return lbm_jax.velocity(pushed, state)[0].mean()
        >>> round(float(jax.grad(mean_u)(1e-5)), 3)  # steps / density
        4.0
        """
        static, aux = replaced_arrays(
            self._static,
            self._aux,
            force=force,
            wall_velocity=wall_velocity,
            boundary_density=boundary_density,
            boundary_velocity=boundary_velocity,
            solid_fraction=solid_fraction,
        )
        return Simulation.tree_unflatten(
            static, (aux if is_traced(aux) else self._place(aux),)
        )

    # -- state construction and read-out ----------------------------------------
    def init(
        self,
        rho: ArrayLike = 1.0,
        u: ArrayLike | None = None,
        force: ArrayLike | None = None,
    ) -> LBMState:
        """Equilibrium initial state at ``t = 0``.

        Args:
            rho: Density, scalar or grid-shaped (positive, finite).
            u: Velocity, ``(D,)`` vector or ``(D, *shape)`` field; zero if ``None``.
            force: The body force the first step will use, if it differs from the
                construction force. With a force, the populations carry the Guo
                half-force so that :func:`lbm_jax.velocity` (given the same
                force) returns ``u`` exactly.

        Raises:
            ValueError: Shapes that do not fit the grid, non-positive density or a
                velocity above the low-Mach limit.
        """
        f = initial_populations(self, self._aux, rho, u, force)
        return LBMState(f=f, t=jnp.zeros((), jnp.int32))

    def populations(self, state: LBMState, *, shifted: bool = False) -> jax.Array:
        """Decoded post-collision populations ``(Q, *shape)`` in the compute dtype.

        Args:
            state: The state.
            shifted: Return the values as stored, ``f_i - w_i`` under DDF-shifting
                (better conditioned for sums in low precision), rather than
                ``f_i``. Without shifting both are the same.
        """
        self.check_state(state)
        return _slabs.populations(self, state.f, shifted=shifted)

    def convert(self, state: LBMState, source: Simulation) -> LBMState:
        """``state``, a state of ``source``, in this simulation's storage.

        The populations are decoded by ``source``'s format and encoded by this
        one's, rounding once; the time step is kept. So a run continues in
        another format from the same state: e.g. to tell whether a 16-bit run's
        instability is the format's (the FP32 copy of its last healthy state
        runs on) or the flow's (the copy fails too).

        Args:
            state: A state of ``source``.
            source: A simulation of the same lattice and grid, any storage.

        Raises:
            TypeError: ``source`` is not a Simulation.
            ValueError: A state that is not ``source``'s, or simulations of
                different lattices or grids.
        """
        if not isinstance(source, Simulation):
            raise TypeError(f"source must be an lbm_jax.Simulation, got {source!r}.")
        source.check_state(state)
        f = converted_populations(self, source, state.f)
        # own buffers: a run donates its state, which must not delete the source
        return LBMState(f=self._place(f), t=jnp.array(state.t, copy=True))

    def fields(
        self, state: LBMState, force: ArrayLike | None = None, *, which: str = "both"
    ) -> tuple[jax.Array, jax.Array]:
        """Density ``(*shape)`` and velocity ``(D, *shape)`` at time ``state.t``.

        Computed slab by slab in one compiled loop: the call holds the state and
        the fields, never a decoded copy of the state.

        Args:
            state: The state.
            force: The body force of the step that produced ``state``, if it was
                not the construction force (see :meth:`step`); its Guo half-force
                is taken off the momentum.
            which: ``"both"``, or ``"density"`` / ``"velocity"`` to compute only
                that field (the other entry is then ``None``).

        Raises:
            ValueError: An unknown ``which``.
        """
        if which not in ("both", "density", "velocity"):
            raise ValueError(
                f"which must be 'both', 'density' or 'velocity', got {which!r}."
            )
        self.check_state(state)
        fv = readout_force(self, self._aux, force)
        return _slabs.fields(self, state.f, fv, which=which)

    def healthy(self, state: LBMState) -> jax.Array:
        """True when every density is finite and positive and every speed within
        the lattice's stability limit :data:`~lbm_jax.MAX_SPEED` (jit-able, no
        sync)."""
        self.check_state(state)
        return _slabs.healthy(self, state.f)

    # -- the compiled step ------------------------------------------------------
    def step(self, state: LBMState, force: ArrayLike | None = None) -> LBMState:
        """One fused streaming + collision step (pure, compiled, jit-able).

        Args:
            state: Current state.
            force: Body force of this step, ``(D,)`` or ``(D, *shape)`` (traced: a
                new value never recompiles); ``None`` uses the construction force.
        """
        self.check_state(state)
        with self._static.plan.lowering():
            return self._step_jit(self, state, force)

    def _step_impl(self, state: LBMState, force: ArrayLike | None) -> LBMState:
        aux = self._aux_with(force)

        def one(aux: StepArrays, f: jax.Array) -> jax.Array:
            return _loops.step(self._static, aux, f, jnp.zeros_like(f))

        f = self._sharded(one, aux)(aux, state.f)
        return LBMState(f=f, t=state.t + 1)

    # compiled once per simulation (its configuration is the static part of the
    # pytree); inside a traced function the call is inlined
    _step_jit = staticmethod(jax.jit(_step_impl))

    def advance(
        self,
        state: LBMState,
        steps: int | jax.Array,
        force: ArrayLike | None = None,
        *,
        checkpoint_every: int | Sequence[int] | None = None,
    ) -> LBMState:
        """Run ``steps`` steps in one compiled loop (donates ``state``'s buffers).

        With in-place streaming (see ``streaming``) the loop updates the donated
        population buffer itself; otherwise it holds a second one. Inside
        ``jax.grad`` or ``jax.jvp`` with a Python int ``steps``, reverse mode keeps
        a state every ``checkpoint_every`` steps in the storage format (16-bit
        storage halves the checkpoints' memory too) and recomputes the steps in
        between.

        Args:
            state: Current state; its buffers are reused for the result, so do not
                use ``state`` afterwards.
            steps: Number of steps (>= 0); a traced argument, so any value reuses
                the same compiled program. An int32 scalar array is accepted too
                (inside a traced function, e.g. a driver loop), but reverse-mode
                differentiation needs a Python int.
            force: Body force of every one of these steps, ``(D,)`` or
                ``(D, *shape)``; ``None`` uses the construction force.
            checkpoint_every: Reverse mode only: steps between two kept states
                (an int; ``1`` keeps every step), or nested segment lengths,
                outermost first (e.g. ``(100, 10)`` keeps about
                ``steps/100 + 10 + 10`` states and runs the steps three times);
                ``None`` (default) nests up to four levels, near the fewest
                kept states (1000 steps: ``(216, 36, 6)``).

        Raises:
            TypeError: A ``steps`` that is neither an int nor an integer scalar,
                or ``checkpoint_every`` with an array ``steps``.
            ValueError: Negative ``steps`` or a bad ``checkpoint_every``.
        """
        self.check_state(state)
        if isinstance(steps, jax.Array):
            if steps.shape != () or not jnp.issubdtype(steps.dtype, jnp.integer):
                raise TypeError(
                    f"steps must be an int or an integer scalar array, got "
                    f"{steps.dtype} {steps.shape}."
                )
            if checkpoint_every is not None:
                raise TypeError(
                    "checkpoint_every needs a Python int step count (the "
                    "checkpointed loop is split into segments of known length), "
                    f"got steps as a {steps.dtype} array."
                )
            steps = steps.astype(jnp.int32)
        else:
            count = check_steps(steps)
            levels = checkpoint_levels(count, checkpoint_every)
            steps = jnp.asarray(count, jnp.int32)
            if is_traced((self, state, force)):
                with self._static.plan.lowering():
                    return self._traced_advance(state, count, levels, force)
        with self._static.plan.lowering():
            return self._advance_jit(self, state, steps, force)

    def _advance_impl(
        self, state: LBMState, steps: jax.Array, force: ArrayLike | None
    ) -> LBMState:
        aux = self._aux_with(force)
        f = self._sharded(
            functools.partial(_loops.advance, self._static), aux, PartitionSpec()
        )(aux, state.f, steps)
        return LBMState(f=f, t=state.t + steps)

    def _traced_advance(
        self,
        state: LBMState,
        steps: int,
        levels: tuple[int, ...],
        force: ArrayLike | None,
    ) -> LBMState:
        """:meth:`advance` inside a trace: the fast loop, differentiated as the
        reference step's checkpointed loop."""
        aux = self._aux_with(force)
        local = functools.partial(
            _loops.differentiable_advance, self._static, steps=steps, levels=levels
        )
        return LBMState(self._sharded(local, aux)(aux, state.f), state.t + steps)

    _advance_jit = staticmethod(jax.jit(_advance_impl, donate_argnames=("state",)))

    def check_state(self, state: LBMState) -> None:
        """Raise ``TypeError``/``ValueError`` unless ``state`` holds populations of
        this simulation's shape, lattice and storage (host-side, also on traced
        states: a coupled step can check its fluid before tracing further)."""
        check_state(self, state)

    # -- internals -----------------------------------------------------------------
    def _aux_with(self, force: ArrayLike | None) -> StepArrays:
        """The step's arrays, with a per-call force (validated, compute dtype)."""
        return self._aux.with_force(force, self.shape, self.storage.compute_dtype)

    def _place(self, tree: Any) -> Any:
        """Put the state's or step's arrays on the mesh (no-op on one device)."""
        decomp = self._static.decomp
        if decomp is None:
            return tree
        if isinstance(tree, jax.Array):
            return decomp.place(tree, decomp.grid_spec())
        return decomp.place(tree, tree.specs(decomp))

    def _sharded(self, fn: Any, aux: StepArrays, *extra: PartitionSpec) -> Any:
        """``fn(aux, f, *rest)`` run per device on the mesh (as is on one device)."""
        decomp = self._static.decomp
        if decomp is None:
            return fn
        spec = decomp.grid_spec()
        return decomp.shard(fn, (aux.specs(decomp), spec, *extra), spec)
