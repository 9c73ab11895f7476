"""The native CPU step's adjoint: reverse mode through the native step.

``lbm_jax/step/_native/lbm_adjoint.cc`` computes the vector-Jacobian product of
one native step with respect to its input populations (the step's input ``f``
is the linearisation point; the collision is recomputed from it cell by cell,
its transposed Jacobian applied in registers, and the transposed pull streaming
done as a gather). It is built into the native step's library
(:mod:`lbm_jax.step._native_build`) and reaches ``jax.grad`` through
:func:`lbm_jax.step._backend.with_derivative_of`:
forward mode keeps the XLA step's exact derivative; the transpose runs here.

It covers what the native step covers on a grid that is not split (BGK; D2Q9,
D3Q19, D3Q27; bounce-back, moving walls, fixed cells; a constant force) with
populations held in a floating-point dtype, FP32/FP32 and FP32/FP16S (bit-pattern
storage is differentiated emulated, on the XLA step). A call given a force
(a field or a per-call vector), or whose step arrays are themselves
differentiated, takes the XLA step's derivative: the kernel computes no
cotangent for them.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lbm_jax.core._collision import CollisionModel
from lbm_jax.core._lattice import Lattice
from lbm_jax.core._storage import StoragePolicy
from lbm_jax.step._backend import Adjoint
from lbm_jax.step._native import (
    ADJOINT_STORAGES,
    adjoint_target,
    default_threads,
    unavailable_reason,
)

__all__ = [
    "make_native_adjoint",
    "why_not_adjoint",
]


def why_not_adjoint(
    storage: StoragePolicy, *, split: bool, force_field: bool
) -> str | None:
    """Why the native adjoint does not differentiate a configuration the native
    step runs, or ``None`` when it does.

    Args:
        storage: The storage policy.
        split: Whether the grid is split over devices.
        force_field: Whether the construction force is a field.

    >>> from lbm_jax import get_storage
    >>> why_not_adjoint(get_storage("fp16s"), split=True, force_field=False)
    'the native adjoint needs a grid on one device'
    """
    missing = [
        need
        for met, need in (
            (
                storage.short_name in ADJOINT_STORAGES and not storage.emulate,
                f"FP32/FP32 or FP32/FP16S storage (got {storage.name})",
            ),
            (not split, "a grid on one device"),
            (not force_field, "no force field"),
        )
        if not met
    ]
    return "the native adjoint needs " + ", ".join(missing) if missing else None


def make_native_adjoint(
    lattice: Lattice,
    storage: StoragePolicy,
    model: CollisionModel,
    shape: tuple[int, ...],
    constant_force: list[np.ndarray] | None = None,
    *,
    threads: int | None = None,
) -> Adjoint:
    """The adjoint of :func:`lbm_jax.step._native.make_native_step_into`'s step.

    Args:
        lattice, storage, model: The configuration (BGK; see
            :func:`why_not_adjoint` for the storage).
        shape: Grid size ``(X, *rest)``, the whole grid.
        constant_force: Force components as scalars, or ``None``.
        threads: Threads per call; ``None``: every core the process may use.

    Returns:
        An :class:`lbm_jax.step._backend.Adjoint` whose ``vjp(aux, f, ct)`` is the
        cotangent of ``f`` (``f``'s dtype) given that of the step's result, and
        which covers calls without a force (``aux.force``) or halos.

    Raises:
        ValueError: The library is unavailable, or the storage has no adjoint.
    """
    why = unavailable_reason() or why_not_adjoint(
        storage, split=False, force_field=False
    )
    if why is not None:
        raise ValueError(why)
    full = (int(shape[0]), lattice.q, *(int(s) for s in shape[1:]))
    dtype = storage.storage_dtype
    force = np.zeros(lattice.d, np.float32)
    if constant_force is not None:
        force = np.array([np.float32(v) for v in constant_force], np.float32)
    call = jax.ffi.ffi_call(
        adjoint_target(lattice.name, storage.short_name),
        jax.ShapeDtypeStruct(full, dtype),
    )
    attrs = {
        "omega": np.float32(model.omega_plus),
        "forced": np.int64(constant_force is not None),
        "force": force,
        "cp": np.float32(1 - 0.5 * model.omega_plus),
        "threads": np.int64(threads or default_threads()),
    }

    def covers(aux: Any, f: jax.Array, g: jax.Array, halos: Any = None) -> bool:
        return aux.force is None and halos is None and f.shape == full

    def vjp(aux: Any, f: jax.Array, ct: jax.Array) -> jax.Array:
        if f.dtype != dtype or ct.dtype != dtype:
            raise ValueError(
                f"the native adjoint takes populations and cotangents of dtype "
                f"{dtype}, got {f.dtype} and {ct.dtype}."
            )
        bnd = aux.boundary
        arrays = [
            jnp.zeros((0,), d) if a is None else a
            for a, d in zip(
                (bnd.bounce, bnd.wall_term, bnd.fixed_mask),
                (np.bool_, np.float32, np.bool_),
                strict=True,
            )
        ]
        return call(f, ct, *arrays, **attrs)

    return Adjoint(covers=covers, vjp=vjp)
