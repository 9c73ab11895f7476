"""A simulation's validated configuration: checked parameters, the chosen step.

:func:`configure` checks every parameter of a :class:`~lbm_jax.Simulation` on the
host (``ValueError`` or ``TypeError`` before anything is traced or compiled),
chooses the step's implementation (the fused GPU step, the native CPU step or the
XLA step; two buffers or in place) and builds the arrays the step reads: the
boundary arrays in the population layout, a force field and the gray cells' solid
fraction. The configuration is the static part of a simulation's pytree
(:class:`SimulationConfig`), the arrays its leaves (:class:`StepArrays`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec
from jax.typing import ArrayLike

from lbm_jax.core._boundaries import BoundaryData, CellType, build_boundary
from lbm_jax.core._collision import CollisionModel, parse_collision
from lbm_jax.core._lattice import Lattice, get_lattice
from lbm_jax.core._storage import StoragePolicy, get_storage
from lbm_jax.core._validation import (
    check_cell_type,
    check_density,
    check_shape,
    check_slab,
    check_solid_fraction,
    check_speed,
    is_traced,
    traced_field,
    vector_field,
    vector_or_field,
)
from lbm_jax.sim._decomp import Decomposition, decompose
from lbm_jax.step._backend import Backend
from lbm_jax.step._layout import default_slab, to_layout
from lbm_jax.step._plan import StepPlan, plan_step
from lbm_jax.step._xla_inplace import Streaming, parse_streaming

__all__ = ["SimulationConfig", "StepArrays", "configure", "host_force"]


class StepArrays(NamedTuple):
    """Arrays passed to the compiled step as arguments (not baked-in constants).

    ``boundary`` arrays are in the population layout ``(X, Q, ...)``; ``force`` is a
    ``(D, *shape)`` field, a ``(D,)`` vector (a per-call force) or ``None``;
    ``solid_fraction`` is the gray cells' ``n_s`` in the population layout with
    one direction, ``(X, 1, ...)``, or ``None`` without gray cells.
    """

    boundary: BoundaryData
    force: jax.Array | None
    solid_fraction: jax.Array | None = None

    def with_force(
        self, force: ArrayLike | None, shape: tuple[int, ...], dtype: Any
    ) -> StepArrays:
        """These arrays with a per-call force (validated, cast to ``dtype``), or
        as they are when ``force`` is ``None``.

        Raises:
            ValueError: A force that is neither a ``(D,)`` vector nor a
                ``(D, *shape)`` field.
            TypeError: A force that is not floating point.
        """
        if force is None:
            return self
        force = jnp.asarray(force)
        d = len(shape)
        if force.shape not in ((d,), (d, *shape)):
            raise ValueError(
                f"force must be a vector of shape ({d},) or a field of shape "
                f"{(d, *shape)}, got shape {force.shape}."
            )
        if not jnp.issubdtype(force.dtype, jnp.floating):
            raise TypeError(f"force must be floating point, got {force.dtype}.")
        return self._replace(force=force.astype(dtype))

    def specs(self, decomp: Decomposition) -> StepArrays:
        """Partition specs of these arrays: every grid-shaped array split."""
        return StepArrays(
            boundary=jax.tree.map(lambda _: decomp.grid_spec(), self.boundary),
            force=None
            if self.force is None
            else PartitionSpec()
            if self.force.ndim == 1
            else decomp.grid_spec(lead=1, inner=0),
            solid_fraction=None if self.solid_fraction is None else decomp.grid_spec(),
        )


@dataclasses.dataclass(frozen=True, eq=False)
class SimulationConfig:
    """Validated configuration of a simulation (hashed by identity).

    Attributes:
        lattice: Velocity set.
        shape: Grid size.
        storage: Storage policy of the populations.
        model: Collision operator and relaxation times.
        cell_type: Integer cell-type grid (read-only).
        force: Construction body force, ``(D,)`` or ``(D, *shape)`` float64.
        wall_velocity: Velocity of the ``WALL`` cells, ``(D, *shape)`` float64.
        boundary_density: Density of the ``EQUILIBRIUM`` cells, grid-shaped
            float64.
        boundary_velocity: Velocity of the ``EQUILIBRIUM`` cells,
            ``(D, *shape)`` float64.
        decomp: The domain decomposition, or ``None`` on one device.
        slab: x-planes per cache tile of the compiled step.
        plan: The step's backend and functions (:class:`lbm_jax.step.StepPlan`).
        streaming: How ``advance`` keeps the populations.
    """

    lattice: Lattice
    shape: tuple[int, ...]
    storage: StoragePolicy
    model: CollisionModel
    cell_type: np.ndarray
    force: np.ndarray | None
    wall_velocity: np.ndarray
    boundary_density: np.ndarray
    boundary_velocity: np.ndarray
    decomp: Decomposition | None
    slab: int
    plan: StepPlan
    streaming: Streaming


def configure(
    lattice: str | Lattice,
    shape: Sequence[int],
    *,
    tau: float,
    storage: str | StoragePolicy,
    shift: bool | None,
    collision: str,
    magic: float,
    force: ArrayLike | None,
    cell_type: ArrayLike | None,
    wall_velocity: ArrayLike | None,
    boundary_density: ArrayLike,
    boundary_velocity: ArrayLike | None,
    solid_fraction: ArrayLike | None,
    slab: int | None,
    devices: int | Sequence[int] | Mesh | None,
    streaming: str | Streaming,
    backend: str | Backend,
) -> tuple[SimulationConfig, StepArrays]:
    """A simulation's configuration and step arrays (on the host, not yet placed
    on the device mesh) from its parameters, every one validated; the parameters
    are those of :class:`~lbm_jax.Simulation`.

    Raises:
        ValueError, TypeError: As listed by :class:`~lbm_jax.Simulation`.
    """
    lat = get_lattice(lattice)
    shape = check_shape(shape, lat)
    pol = get_storage(storage, shift=shift)
    pol.check_enabled()
    model = parse_collision(collision, tau, magic)

    ct = check_cell_type(cell_type, shape)
    ct.setflags(write=False)
    uw = vector_field("wall_velocity", wall_velocity, lat.d, shape)
    uw.setflags(write=False)
    ub = vector_field("boundary_velocity", boundary_velocity, lat.d, shape)
    rb = check_density("boundary_density", boundary_density, shape)
    check_speed("wall_velocity", uw, ct == CellType.WALL)
    check_speed("boundary_velocity", ub, ct == CellType.EQUILIBRIUM)
    fvec = None if force is None else host_force(force, lat.d, shape)
    ns = None if solid_fraction is None else check_solid_fraction(solid_fraction, shape)

    decomp = decompose(devices, shape)
    local = shape if decomp is None else decomp.local_shape
    if slab is None:
        slab = default_slab(lat, local, pol.compute_dtype.itemsize)
    slab = check_slab(slab, local[0])
    streaming = parse_streaming(streaming, 1 if decomp is None else decomp.mesh.size)
    plan = _plan(backend, lat, pol, model, shape, decomp, fvec, ct, slab, streaming, ns)
    config = SimulationConfig(
        lattice=lat,
        shape=shape,
        storage=pol,
        model=model,
        cell_type=ct,
        force=fvec,
        wall_velocity=uw,
        boundary_density=rb,
        boundary_velocity=ub,
        decomp=decomp,
        slab=slab,
        plan=plan,
        streaming=streaming,
    )
    arrays = StepArrays(
        boundary=_in_layout(build_boundary(lat, pol, ct, uw, rb, ub)),
        force=None
        if fvec is None or fvec.ndim == 1
        else jnp.asarray(fvec.astype(pol.compute_dtype)),
        solid_fraction=None if ns is None else _solid_in_layout(ns, pol),
    )
    return config, arrays


def _plan(
    backend: str | Backend,
    lat: Lattice,
    pol: StoragePolicy,
    model: CollisionModel,
    shape: tuple[int, ...],
    decomp: Decomposition | None,
    fvec: np.ndarray | None,
    ct: np.ndarray,
    slab: int,
    streaming: Streaming,
    solid_fraction: Any,
) -> StepPlan:
    """The step plan of a configuration (:func:`lbm_jax.step.plan_step`)."""
    return plan_step(
        backend,
        lat,
        pol,
        model,
        shape,
        shape if decomp is None else decomp.local_shape,
        force=fvec,
        boundaries=bool((ct != CellType.FLUID).any()),
        split_yz=decomp is not None and any(s > 1 for s in decomp.splits[1:]),
        slab=slab,
        streaming=streaming,
        gray=solid_fraction is not None,
    )


def _solid_in_layout(ns: ArrayLike, pol: StoragePolicy) -> jax.Array:
    """A grid-shaped solid fraction in the compute dtype, layout ``(X, 1, ...)``."""
    dtype = pol.compute_dtype
    # host values are cast on the host (float64 -> compute dtype, whatever x64 says)
    arr = (
        ns.astype(dtype)
        if isinstance(ns, np.ndarray)
        else jnp.asarray(ns).astype(dtype)
    )
    return to_layout(jnp.asarray(arr)[None])


def _in_layout(bnd: BoundaryData) -> BoundaryData:
    """Boundary arrays ``(Q, *shape)`` in the population layout ``(X, Q, ...)``."""
    return BoundaryData(*(None if a is None else to_layout(a) for a in bnd))


def replaced_arrays(
    config: SimulationConfig,
    arrays: StepArrays,
    *,
    force: ArrayLike | None,
    wall_velocity: ArrayLike | None,
    boundary_density: ArrayLike | None,
    boundary_velocity: ArrayLike | None,
    solid_fraction: ArrayLike | None = None,
) -> tuple[SimulationConfig, StepArrays]:
    """``config`` and ``arrays`` with the given values in place of the
    construction ones (``None`` keeps one), as
    :meth:`lbm_jax.Simulation.with_arrays` documents.

    Host values are checked as the constructor checks them and recorded in the
    configuration; traced values are checked for shape and dtype only. A solid
    fraction given to a configuration without gray cells plans its step anew
    (the native and GPU steps do not cover gray cells).

    Raises:
        ValueError, TypeError: As the constructor, for the values given.
    """
    lat, shape, ct = config.lattice, config.shape, config.cell_type
    given = {"wall_velocity": wall_velocity, "boundary_velocity": boundary_velocity}
    fields = {}
    for name, value in given.items():
        if value is None:
            fields[name] = getattr(config, name)
        elif is_traced(value):
            fields[name] = _traced_vector(name, value, lat.d, shape)
        else:
            fields[name] = vector_field(name, value, lat.d, shape)
            where = CellType.WALL if name == "wall_velocity" else CellType.EQUILIBRIUM
            check_speed(name, fields[name], ct == where)
    rb = config.boundary_density
    if is_traced(boundary_density):
        rb = traced_field(
            "boundary_density",
            boundary_density,
            ((), shape),
            f"a scalar or of shape {shape}",
        )
        rb = jnp.broadcast_to(rb, shape)
    elif boundary_density is not None:
        rb = check_density("boundary_density", boundary_density, shape)
    host = not any(is_traced(v) for v in (*fields.values(), rb))
    if host:
        config = dataclasses.replace(config, boundary_density=rb, **fields)
    if any(v is not None for v in (wall_velocity, boundary_density, boundary_velocity)):
        bnd = build_boundary(
            lat,
            config.storage,
            ct,
            fields["wall_velocity"],
            rb,
            fields["boundary_velocity"],
            moving_walls=None if host else bool((ct == CellType.WALL).any()),
        )
        arrays = arrays._replace(boundary=_in_layout(bnd))
    if solid_fraction is not None:
        config, arrays = _with_solid_fraction(config, arrays, solid_fraction)
    return config, arrays.with_force(force, shape, config.storage.compute_dtype)


def _with_solid_fraction(
    config: SimulationConfig, arrays: StepArrays, solid_fraction: ArrayLike
) -> tuple[SimulationConfig, StepArrays]:
    """``config`` and ``arrays`` with a new solid fraction (checked: host values
    as the constructor checks them, traced ones for shape and dtype), the step
    planned anew where the configuration had no gray cells."""
    shape = config.shape
    if is_traced(solid_fraction):
        ns = traced_field(
            "solid_fraction",
            solid_fraction,
            (shape,),
            f"of the grid's shape {shape} (one value per cell)",
        )
    else:
        ns = check_solid_fraction(solid_fraction, shape)
    if arrays.solid_fraction is None:
        plan = _plan(
            config.plan.requested,
            config.lattice,
            config.storage,
            config.model,
            shape,
            config.decomp,
            config.force,
            config.cell_type,
            config.slab,
            config.streaming,
            ns,
        )
        config = dataclasses.replace(config, plan=plan)
    return config, arrays._replace(solid_fraction=_solid_in_layout(ns, config.storage))


def _traced_vector(name: str, value: Any, d: int, shape: tuple[int, ...]) -> jax.Array:
    """A traced ``(D,)`` vector or ``(D, *shape)`` field as a ``(D, *shape)`` array."""
    arr = traced_field(name, value, ((d,), (d, *shape)), vector_or_field(d, shape))
    if arr.shape == (d,):
        return jnp.broadcast_to(arr.reshape((d,) + (1,) * len(shape)), (d, *shape))
    return arr


def host_force(force: ArrayLike, d: int, shape: tuple[int, ...]) -> np.ndarray:
    """A finite ``(D,)`` vector or ``(D, *shape)`` field as a float64 array.

    Raises:
        ValueError: A force of another shape, or with non-finite values.
    """
    arr = np.asarray(force, dtype=np.float64)
    if arr.shape != (d,):
        arr = vector_field("force", arr, d, shape)
    if not np.all(np.isfinite(arr)):
        raise ValueError("force contains non-finite values.")
    return arr
