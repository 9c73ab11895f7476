"""A simulation's step plan: the backend that runs and the functions it runs.

:func:`plan_step` asks :func:`lbm_jax.step.choose` which backend runs a
configuration and builds that backend's two-buffer step and, when streaming in
place, its in-place loop. Each backend module answers only whether it covers the
configuration and provides its makers; which one runs is decided here, for every
caller alike.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from lbm_jax.core._collision import CollisionModel
from lbm_jax.core._lattice import Lattice
from lbm_jax.core._storage import StoragePolicy
from lbm_jax.step import _gpu, _gpu_inplace, _native, _native_adjoint
from lbm_jax.step._backend import Backend, choose, parse_backend, with_derivative_of
from lbm_jax.step._reference import REFERENCE_SLAB, make_reference_step
from lbm_jax.step._xla import make_step_into
from lbm_jax.step._xla_inplace import Streaming, make_advance_inplace

__all__ = ["StepPlan", "plan_step"]


@dataclasses.dataclass(frozen=True, eq=False)
class StepPlan:
    """The step a simulation runs.

    Attributes:
        requested: The backend asked for (``Backend.AUTO`` unless named).
        backend: The backend of a step without a per-call force.
        backend_with_force: The backend of a step given a force per call
            (``Simulation.step(state, force)``): the native step runs the XLA step
            for such a call.
        backend_advance: The backend of ``Simulation.advance``: the native step
            streams with two buffers only, so in-place streaming runs the XLA
            step's in-place loop.
        backend_derivative: The backend whose derivative ``jax.grad`` and
            ``jax.vjp`` take: ``Backend.NATIVE`` where the native step's adjoint
            (``lbm_jax.step._native_adjoint``) covers the configuration (the
            native step then runs under differentiation, and ``jax.jvp`` takes
            the XLA step's derivative), else ``Backend.XLA`` (the XLA step runs
            under differentiation, primal and derivative).
        why_not_native_derivative: Why the derivative is not the native
            adjoint's, or ``None`` when it is.
        why_not_faster: Why no faster backend runs (every candidate's reason),
            or ``None`` when the fastest one for this machine runs.
        step_into: The two-buffer step ``step_into(aux, f, g[, halos])``; its
            derivative is that of ``reference_step_into``, transposed by the
            native adjoint where ``backend_derivative`` is ``Backend.NATIVE``.
        reference_step_into: The XLA step whose derivative every backend takes
            except where the native adjoint transposes it
            (``lbm_jax.step._reference.make_reference_step``): the same values
            to within rounding, a ``lax.scan`` over slabs of at most
            ``REFERENCE_SLAB`` x-planes whose body is ``jax.checkpoint``-ed, so
            its derivative holds one slab's float32 working set.
        differentiated_step_into: The step a checkpointed derivative runs:
            ``step_into`` with the native adjoint, else ``reference_step_into``.
        advance_inplace: The in-place multi-step loop, or ``None`` (streaming
            with two buffers).
    """

    requested: Backend
    backend: Backend
    backend_with_force: Backend
    backend_advance: Backend
    backend_derivative: Backend
    why_not_native_derivative: str | None
    why_not_faster: str | None
    step_into: Callable[..., Any]
    reference_step_into: Callable[..., Any]
    differentiated_step_into: Callable[..., Any]
    advance_inplace: Callable[..., Any] | None

    def lowering(self) -> contextlib.AbstractContextManager[None]:
        """The context a program with this step is lowered in: on the GPU
        backend, ``lbm_jax.step._gpu.quiet_lowering``."""
        return _gpu.lowering(self.backend)


def plan_step(
    backend: str | Backend,
    lattice: Lattice,
    storage: StoragePolicy,
    model: CollisionModel,
    shape: tuple[int, ...],
    local: tuple[int, ...],
    *,
    force: np.ndarray | None,
    boundaries: bool,
    split_yz: bool,
    slab: int,
    streaming: Streaming,
    gray: bool = False,
) -> StepPlan:
    """The step plan of a simulation.

    Args:
        backend: The backend asked for (see :class:`lbm_jax.step.Backend`).
        lattice, storage, model: The configuration.
        shape: The whole grid; ``local``: one device's sub-domain.
        force: The construction force, a ``(D,)`` vector (compiled into the
            step), a ``(D, *shape)`` field (passed with the step's arrays) or
            ``None``.
        boundaries: Whether the grid has non-fluid cells.
        split_yz: Whether the grid is split along y or z.
        slab: x-planes per slab of the XLA step.
        streaming: How ``advance`` keeps the populations.
        gray: Whether the step reads a solid fraction (gray cells, which the
            XLA step alone covers).

    Raises:
        ValueError: ``"gpu"`` or ``"native"`` where that step cannot run (saying
            why), or an unknown backend.
    """
    candidates = (
        _gpu.candidate(lattice, local, split_yz=split_yz, gray=gray),
        _native.candidate(
            lattice,
            storage,
            model,
            local,
            split_across=split_yz,
            force=force is not None,
            boundaries=boundaries,
            gray=gray,
        ),
    )
    if storage.emulate:
        emulated = "emulated storage runs on the XLA step"
        candidates = tuple(
            c._replace(why_not=c.why_not or emulated) for c in candidates
        )
    chosen = choose(backend, candidates, "simulation")
    constant = force is not None and force.ndim == 1
    kernel_force = (
        [np.asarray(v, storage.compute_dtype) for v in force] if constant else None
    )
    makers = {
        Backend.GPU: (_gpu.make_gpu_step_into, _gpu_inplace.make_gpu_advance_inplace),
        Backend.NATIVE: (_native.make_native_step_into, make_advance_inplace),
        Backend.XLA: (make_step_into, make_advance_inplace),
    }
    step_maker, inplace_maker = makers[chosen.backend]
    tiled = make_step_into(lattice, storage, model, local, slab, kernel_force)
    reference = make_reference_step(
        lattice, storage, model, local, REFERENCE_SLAB, kernel_force, tiled
    )
    fast = step_maker(lattice, storage, model, local, slab, kernel_force)
    native = chosen.backend is Backend.NATIVE
    why_not_adjoint = (
        _native_adjoint.why_not_adjoint(
            storage,
            split=tuple(local) != tuple(shape),
            force_field=force is not None and not constant,
        )
        if native
        else f"the native adjoint differentiates the native step only (the "
        f"{chosen.backend.value} step runs)"
    )
    adjoint = (
        _native_adjoint.make_native_adjoint(
            lattice, storage, model, local, kernel_force
        )
        if why_not_adjoint is None
        else None
    )
    step_into = with_derivative_of(fast, reference, adjoint)
    advance_inplace = (
        inplace_maker(lattice, storage, model, shape, slab, kernel_force)
        if streaming is Streaming.INPLACE
        else None
    )
    inplace = streaming is Streaming.INPLACE
    return StepPlan(
        requested=parse_backend(backend),
        backend=chosen.backend,
        backend_with_force=Backend.XLA if native else chosen.backend,
        backend_advance=Backend.XLA if native and inplace else chosen.backend,
        backend_derivative=Backend.XLA if adjoint is None else Backend.NATIVE,
        why_not_native_derivative=why_not_adjoint,
        why_not_faster=chosen.why_not_faster,
        step_into=step_into,
        reference_step_into=reference,
        differentiated_step_into=reference if adjoint is None else step_into,
        advance_inplace=advance_inplace,
    )
