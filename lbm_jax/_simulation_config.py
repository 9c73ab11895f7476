"""A simulation's validated configuration: checked parameters, the chosen step.

:func:`configure` checks every parameter of a :class:`~lbm_jax.Simulation` on the
host (``ValueError`` or ``TypeError`` before anything is traced or compiled),
chooses the step's implementation (the fused GPU step, the native CPU step or the
XLA step; two buffers or in place) and builds the arrays the step reads: the
boundary arrays in the kernel layout and a force field. The configuration is the
static part of a simulation's pytree (:class:`SimulationConfig`), the arrays its
leaves (:class:`StepArrays`).
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

from lbm_jax import _gpu, _native
from lbm_jax._boundaries import BoundaryData, CellType, build_boundary
from lbm_jax._collision import CollisionModel, parse_collision
from lbm_jax._decomp import Decomposition, decompose
from lbm_jax._kernel import default_slab, make_step_into, to_layout
from lbm_jax._kernel_inplace import Streaming, make_advance_inplace, parse_streaming
from lbm_jax._lattice import Lattice, get_lattice
from lbm_jax._storage import StoragePolicy, get_storage
from lbm_jax._validation import (
    check_cell_type,
    check_density,
    check_shape,
    check_slab,
    check_speed,
    vector_field,
)

__all__ = ["SimulationConfig", "StepArrays", "configure", "host_force"]


class StepArrays(NamedTuple):
    """Arrays passed to the compiled step as arguments (not baked-in constants).

    ``boundary`` arrays are in the kernel layout ``(X, Q, ...)``; ``force`` is a
    ``(D, *shape)`` field, a ``(D,)`` vector (a per-call force) or ``None``.
    """

    boundary: BoundaryData
    force: jax.Array | None

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
        decomp: The domain decomposition, or ``None`` on one device.
        slab: x-planes per cache tile of the compiled step.
        step_into: The two-buffer step ``step_into(aux, f, g[, halos])``.
        kernel: Its implementation: ``"gpu"``, ``"native"`` or ``"xla"``.
        kernel_reason: Why the backend's fused step does not run, or ``None``.
        streaming: How ``advance`` keeps the populations.
        advance_inplace: The in-place multi-step loop, or ``None``.
    """

    lattice: Lattice
    shape: tuple[int, ...]
    storage: StoragePolicy
    model: CollisionModel
    cell_type: np.ndarray
    force: np.ndarray | None
    wall_velocity: np.ndarray
    decomp: Decomposition | None
    slab: int
    step_into: Any
    kernel: str
    kernel_reason: str | None
    streaming: Streaming
    advance_inplace: Any


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
    slab: int | None,
    devices: int | Sequence[int] | Mesh | None,
    streaming: str | Streaming,
    kernel: str,
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

    decomp = decompose(devices, shape)
    local = shape if decomp is None else decomp.local_shape
    if slab is None:
        slab = default_slab(lat, local, pol.compute_dtype.itemsize)
    slab = check_slab(slab, local[0])
    streaming = parse_streaming(streaming, 1 if decomp is None else decomp.mesh.size)
    name, reason, step_into, advance_inplace = _step_functions(
        kernel, lat, pol, model, shape, ct, fvec, decomp, slab, streaming
    )
    config = SimulationConfig(
        lattice=lat,
        shape=shape,
        storage=pol,
        model=model,
        cell_type=ct,
        force=fvec,
        wall_velocity=uw,
        decomp=decomp,
        slab=slab,
        step_into=step_into,
        kernel=name,
        kernel_reason=reason,
        streaming=streaming,
        advance_inplace=advance_inplace,
    )
    bnd = build_boundary(lat, pol, ct, uw, rb, ub)
    arrays = StepArrays(
        boundary=BoundaryData(*(None if a is None else to_layout(a) for a in bnd)),
        force=None
        if fvec is None or fvec.ndim == 1
        else jnp.asarray(fvec.astype(pol.compute_dtype)),
    )
    return config, arrays


def _step_functions(
    kernel: str,
    lattice: Lattice,
    storage: StoragePolicy,
    model: CollisionModel,
    shape: tuple[int, ...],
    cell_type: np.ndarray,
    force: np.ndarray | None,
    decomp: Decomposition | None,
    slab: int,
    streaming: Streaming,
) -> tuple[str, str | None, Any, Any]:
    """The step's implementation (``"gpu"``, ``"native"`` or ``"xla"``), why
    the backend's fused step does not run (or ``None``), its two-buffer step
    and its in-place loop (``None`` unless streaming in place).

    A constant ``(D,)`` force is compiled into the step; a field travels in
    :class:`StepArrays`.
    """
    local = shape if decomp is None else decomp.local_shape
    constant = force is not None and force.ndim == 1
    kernel_force = (
        [np.asarray(v, storage.compute_dtype) for v in force] if constant else None
    )
    kernel = _native.parse_kernel(kernel)  # any case, before either choice
    split_yz = decomp is not None and any(s > 1 for s in decomp.splits[1:])
    gpu = _select_gpu(kernel, lattice, storage, model, local, split_yz)
    config = {
        "split_across": split_yz,
        "force": force is not None,
        "boundaries": bool((cell_type != CellType.FLUID).any()),
    }
    native = not gpu and _native.select(
        kernel, lattice, storage, model, local, **config
    )
    reason = None
    if kernel == "xla":
        reason = "kernel='xla' was asked for"
    elif jax.default_backend() == "cpu" and not native:
        reason = _native.why_not_native(lattice, storage, model, local, **config)
    elif jax.default_backend() != "cpu" and not gpu:
        reason = _gpu.unavailable_reason() or _GPU_COVERS
    if gpu:
        step_factory = _gpu.make_gpu_step_into
    else:
        step_factory = _native.make_native_step_into if native else make_step_into
    inplace_factory = _gpu.make_gpu_advance_inplace if gpu else make_advance_inplace
    step_into = step_factory(lattice, storage, model, local, slab, kernel_force)
    advance_inplace = (
        inplace_factory(lattice, storage, model, shape, slab, kernel_force)
        if streaming is Streaming.INPLACE
        else None
    )
    name = "gpu" if gpu else "native" if native else "xla"
    return name, reason, step_into, advance_inplace


#: What the fused GPU step covers, where a configuration falls outside it.
_GPU_COVERS = (
    "the fused GPU step covers D2Q9/D3Q19/D3Q27 BGK or TRT on grids split along x "
    "at most"
)


def _select_gpu(
    kernel: str,
    lattice: Lattice,
    storage: StoragePolicy,
    model: CollisionModel,
    local: tuple[int, ...],
    split_yz: bool,
) -> bool:
    """Whether a simulation runs the fused GPU step (``kernel`` "auto" or "gpu").

    Raises:
        ValueError: ``kernel="gpu"`` where the fused GPU step cannot run.
    """
    if kernel not in ("auto", "gpu"):
        return False
    ok = _gpu.supported(lattice, storage, model, local, split_yz=split_yz)
    if kernel == "gpu" and not ok:
        why = _gpu.unavailable_reason() or _GPU_COVERS
        raise ValueError(
            f"kernel='gpu' is not available for this simulation: {why}; use "
            "kernel='auto' to fall back to the XLA step."
        )
    return ok


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
