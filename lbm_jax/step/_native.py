"""Native CPU steps through ``jax.ffi``: the fused plain step (stream, collide,
encode in one pass) and the free-surface step.

The XLA path of :mod:`lbm_jax.step._xla` is the reference and the fallback. This
module builds a small C++ library from three sources,
``lbm_jax/step/_native/lbm_step.cc`` (the plain step: the same step as the XLA
path bit for bit, in one pass over memory), ``lbm_jax/step/_native/lbm_adjoint.cc``
(its adjoint, which ``lbm_jax.step._native_adjoint`` calls) and
``lbm_jax/step/_native/lbm_free_surface.cc`` (the step of
:class:`lbm_jax.free_surface.FreeSurface`, equal to its XLA step to round-off; see
:func:`make_native_free_surface_step`), sharing the codecs of
``lbm_jax/step/_native/lbm_codecs.h``, and calls them from compiled JAX code as XLA FFI
custom calls. The plain step covers the configurations for which bit identity
with the XLA path is established and tested (:func:`supported`), the
free-surface step those of :func:`covered_free_surface`; every other
configuration keeps the XLA path.

The plain step is bit-identical because ``lbm_step.cc`` performs the XLA path's
operations in XLA's order and spells out a fused multiply-add exactly where
XLA:CPU's LLVM backend contracts one (it contracts ``a * b + c`` on its own; see
``collide_cells`` in the source). Those choices depend on how XLA emits the loops:
they are the same for every grid with at least :data:`MIN_PLANE_CELLS` cells per
x-plane, and the tests compare both paths bit for bit, so a JAX upgrade that
changes them fails the tests rather than the results.

The library is compiled on first use with the system C++ compiler (``$CXX``, else
``c++``/``g++``/``clang++``) into a private per-user cache directory, or ahead of
time with ``python -m lbm_jax build-native`` (see :mod:`lbm_jax.step._native_build`). It
needs an x86-64 CPU with AVX2, FMA and F16C. Any failure (no compiler, a failing
build, an unusable cache, another CPU, a library that does not load) leaves
:func:`available` ``False`` with :func:`unavailable_reason` saying why; a
simulation with ``backend="auto"`` then runs the XLA step and warns once
(:class:`NativeStepWarning`).

>>> from lbm_jax import get_lattice, get_storage
>>> from lbm_jax.core._collision import parse_collision
>>> model = parse_collision("bgk", 0.8, 3 / 16)
>>> supported(get_lattice("D3Q19"), get_storage("posit16"), model, (64, 64, 64))
False
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lbm_jax.core._collision import Collision, CollisionModel
from lbm_jax.core._lattice import Lattice, get_lattice
from lbm_jax.core._storage import StoragePolicy
from lbm_jax.step import _native_build
from lbm_jax.step._backend import Backend, Candidate, without_derivative
from lbm_jax.step._layout import default_slab, x_ghost_planes
from lbm_jax.step._native_build import LATTICES, NativeStepWarning, warn_fallback
from lbm_jax.step._xla import make_step_into

__all__ = [
    "ADJOINT_STORAGES",
    "MIN_PLANE_CELLS",
    "NativeStepWarning",
    "adjoint_target",
    "available",
    "candidate",
    "covered_free_surface",
    "default_threads",
    "free_surface_candidate",
    "library_path",
    "make_native_free_surface_step",
    "make_native_step_into",
    "supported",
    "unavailable_reason",
    "why_not_step",
]

#: storage short name -> suffix of the FFI target
_STORAGES = {"fp32": "fp32", "fp16s": "fp16s", "bf16": "bf16", "fp16c": "fp16c"}


#: Storages (short names) with an adjoint step (``_native/lbm_adjoint.cc``, called
#: by ``lbm_jax.step._native_adjoint``): those held in a floating-point dtype, the
#: others carry no derivative (:mod:`lbm_jax.core._storage`).
ADJOINT_STORAGES = ("fp32", "fp16s")


def adjoint_target(lattice: str, storage: str) -> str:
    """The adjoint step's FFI target (``_native/lbm_adjoint.cc``)."""
    return f"lbm_adjoint_{lattice}_{storage}"


def _build() -> tuple[Path | None, str]:
    """Build (or find in the cache) the library: ``(path, "")`` or ``(None, why)``."""
    return _native_build.build()


@functools.cache
def _register(path: Path) -> str | None:
    """Load the library and register its FFI targets; why that failed, or None."""
    try:
        lib = ctypes.CDLL(str(path))
        for lat in LATTICES:
            for suffix in _STORAGES.values():
                names = [_target(lat, suffix), _fs_target(lat, suffix)]
                if suffix in ADJOINT_STORAGES:
                    names.append(adjoint_target(lat, suffix))
                for name in names:
                    jax.ffi.register_ffi_target(
                        name, jax.ffi.pycapsule(getattr(lib, name)), platform="cpu"
                    )
    except (OSError, AttributeError, ValueError, RuntimeError) as err:
        return f"loading {path} failed ({err}); delete {path.parent} to rebuild it"
    return None


def _target(lattice: str, storage: str) -> str:
    return f"lbm_step_{lattice}_{storage}"


def _fs_target(lattice: str, storage: str) -> str:
    """The free-surface step's FFI target (``_native/lbm_free_surface.cc``)."""
    return f"lbm_free_surface_{lattice}_{storage}"


def default_threads() -> int:
    """Threads of one native call: every core the process may use."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
    return cores or os.cpu_count() or 1


def available() -> bool:
    """Whether the native library is built and loaded (building it if needed)."""
    return unavailable_reason() is None


def unavailable_reason() -> str | None:
    """Why the native step is unavailable (what failed and how to fix it), or
    ``None`` when it is available. Builds and loads the library if needed."""
    path, why = _build()
    return why if path is None else _register(path)


def library_path() -> Path | None:
    """Path of the built library (``None`` when unavailable)."""
    return _build()[0]


#: Fewest cells per x-plane the native step takes: on smaller planes XLA unrolls
#: a plane's loop completely and its LLVM backend contracts other multiply-adds.
MIN_PLANE_CELLS = 128


def supported(
    lattice: Lattice,
    storage: StoragePolicy,
    model: CollisionModel,
    shape: tuple[int, ...],
    *,
    force: bool = False,
    boundaries: bool = False,
) -> bool:
    """Whether the native step computes this configuration bit for bit.

    Covered: D2Q9, D3Q19 and D3Q27 BGK, with or without boundaries (bounce-back,
    moving walls, fixed cells) and a constant body force (Guo), on a grid split
    along x or not at all, FP32/FP32, FP32/FP16S, FP32/FP16C and FP32/bfloat16
    storage with DDF-shifting, at least :data:`MIN_PLANE_CELLS` cells per x-plane,
    on CPU.
    (A step given a force field or a per-call force runs the XLA step; see
    :func:`make_native_step_into`.) Not covered: 2D grids with both a force and
    boundaries whose rows (Y) are not a multiple of 8 (XLA contracts the last
    cells of such rows differently).

    Args:
        lattice: Velocity set.
        storage: Storage policy.
        model: Collision operator.
        shape: Grid size ``(X, *rest)`` the step works on (a device's
            sub-domain on a split grid).
        force: Whether a constant body force acts.
        boundaries: Whether the grid has non-fluid cells.

    Returns:
        ``True`` when the native step covers the configuration and the library
        is available (building it on first use); use the XLA step otherwise.
    """
    why = why_not_step(
        lattice, storage, model, shape, force=force, boundaries=boundaries
    )
    return why is None and available()


def _needs(
    lattice: Lattice, storage: StoragePolicy, shape: tuple
) -> tuple[tuple[bool, str], ...]:
    """What both native steps need of a configuration: ``(met, what)`` pairs
    (the plain step also needs BGK without a Smagorinsky model; the
    free-surface step takes BGK or TRT, with or without one)."""
    return (
        (
            lattice.name in LATTICES and lattice == get_lattice(lattice.name),
            "D2Q9, D3Q19 or D3Q27",
        ),
        (
            storage.short_name in _STORAGES and storage.shift,
            "FP32/FP32, FP32/FP16S, FP32/FP16C or FP32/bfloat16 storage, DDF-shifted",
        ),
        (len(shape) == lattice.d, "a grid of the lattice's dimension"),
        (_on_cpu(), "a CPU backend"),
    )


def _missing(what: str, checks: tuple[tuple[bool, str], ...]) -> str | None:
    """``"<what> needs a, b"`` for the unmet needs of ``(met, need)`` pairs, or
    ``None`` when every one is met."""
    missing = [need for met, need in checks if not met]
    return f"{what} needs " + ", ".join(missing) if missing else None


def why_not_step(
    lattice: Lattice,
    storage: StoragePolicy,
    model: CollisionModel,
    shape: tuple[int, ...],
    *,
    split_across: bool = False,
    force: bool = False,
    boundaries: bool = False,
    gray: bool = False,
) -> str | None:
    """Why the native step does not cover a configuration (every unmet need,
    with what was given), or ``None`` when it does (the library aside: see
    :func:`unavailable_reason`). Arguments as for :func:`supported`;
    ``split_across``: whether the grid is split along y or z; ``gray``: whether
    it has gray cells (a solid fraction), which only the XLA step runs.

    >>> from lbm_jax import get_lattice, get_storage
    >>> from lbm_jax.core._collision import parse_collision
    >>> trt = parse_collision("trt", 0.8, 3 / 16)
    >>> why = why_not_step(get_lattice("D2Q9"), get_storage("fp32"), trt, (32, 32))
    >>> for part in why.split(", "):
    ...     print(part)
    the native step needs BGK collision (got TRT)
    at least 128 cells per x-plane (got 32)
    """
    plane = math.prod(shape[1:])
    kind = model.kind.value.upper()
    return _missing(
        "the native step",
        (
            *_needs(lattice, storage, shape),
            (model.kind is Collision.BGK, f"BGK collision (got {kind})"),
            (model.smagorinsky == 0, "no Smagorinsky model"),
            (
                plane >= MIN_PLANE_CELLS,
                f"at least {MIN_PLANE_CELLS} cells per x-plane (got {plane})",
            ),
            (not split_across, "a grid split along x only"),
            (
                not (lattice.d == 2 and force and boundaries and shape[-1] % 8),
                "rows of a multiple of 8 cells with both a force and boundaries",
            ),
            (not gray, "no gray cells (solid_fraction: the XLA step runs them)"),
        ),
    )


def _on_cpu() -> bool:
    return jax.default_backend() == "cpu"


def candidate(
    lattice: Lattice,
    storage: StoragePolicy,
    model: CollisionModel,
    shape: tuple[int, ...],
    *,
    split_across: bool,
    force: bool,
    boundaries: bool,
    gray: bool = False,
) -> Candidate:
    """The native step's answer for a simulation (see :func:`lbm_jax.step.choose`):
    :func:`why_not_step`; where the library cannot be built ``"auto"`` warns once
    (:class:`NativeStepWarning`) and runs the XLA step.

    Args:
        lattice, storage, model: The configuration.
        shape: A device's sub-domain.
        split_across: Whether the grid is split along y or z (the native step
            exchanges x ghost planes only).
        force, boundaries: As for :func:`supported`.
        gray: Whether the grid has gray cells (a solid fraction).
    """
    why = why_not_step(
        lattice,
        storage,
        model,
        shape,
        split_across=split_across,
        force=force,
        boundaries=boundaries,
        gray=gray,
    )
    return Candidate(Backend.NATIVE, why, unavailable_reason, warn_fallback, _on_cpu())


def make_native_step_into(
    lattice: Lattice,
    storage: StoragePolicy,
    model: CollisionModel,
    shape: tuple[int, ...],
    slab: int | None = None,
    constant_force: list[np.ndarray] | None = None,
    *,
    threads: int | None = None,
) -> Callable[..., jax.Array]:
    """Build ``step_into(aux, f, g, halos=None) -> g'``, the native twin of
    :func:`lbm_jax.step._xla.make_step_into`: same arguments, same contract, same
    bits, for the configurations :func:`supported` accepts.

    Args:
        lattice: Velocity set.
        storage: Storage policy.
        model: Collision operator.
        shape: Grid size ``(X, *rest)`` of the populations passed in.
        slab: x-planes per slab of the XLA step that runs instead when a call
            passes a force (``aux.force``); ``None``: :func:`default_slab`.
        constant_force: Force components as scalars, or ``None``.
        threads: Threads per call; ``None``: every core the process may use,
            divided among the devices when the grid is split along x.

    ``aux.boundary`` holds the boundary arrays in the population layout (any of
    them ``None``); a call whose ``aux.force`` is not ``None`` (a force field or a
    per-call vector, which the native step does not cover) runs the XLA step.
    ``halos`` is ``None`` or,
    on a grid split along x, the x ghost planes: a ``(low, high)`` pair or one
    entry per grid axis with ``None`` for y and z.

    Raises:
        ValueError: If :func:`supported` is false for the configuration (with
            the reason when the library is unavailable).
    """
    shape = tuple(int(s) for s in shape)
    if not supported(lattice, storage, model, shape):
        why = unavailable_reason()
        raise ValueError(
            f"the native step does not cover {lattice.name} on {shape} with "
            f"{storage}, {model.kind.value}"
            + (f": {why}" if why else "; check supported() and use make_step_into")
        )
    # a force given per call (aux.force) takes the XLA step
    xla_step = make_step_into(
        lattice,
        storage,
        model,
        shape,
        default_slab(lattice, shape, 4) if slab is None else slab,
        constant_force,
    )
    forced = constant_force is not None
    force = np.zeros(lattice.d, np.float32)
    if forced:
        force = np.array([np.float32(v) for v in constant_force], np.float32)
    # Guo's coefficients, rounded as lbm_jax.core._collision rounds them
    cp = np.float32(1 - 0.5 * model.omega_plus)
    cm = np.float32(1 - 0.5 * model.omega_minus)
    full = (shape[0], lattice.q, *shape[1:])
    dtype = storage.storage_dtype
    omega = np.float32(model.omega_plus)  # as the XLA path rounds it
    target = _target(lattice.name, _STORAGES[storage.short_name])
    cores = default_threads()

    def step_into(
        aux: Any,
        f: jax.Array,
        g: jax.Array,
        halos: Any = None,
    ) -> jax.Array:
        if aux.force is not None:
            return xla_step(aux, f, g, halos)
        if f.shape != full or f.dtype != dtype:
            raise ValueError(
                f"populations have shape {f.shape} and dtype {f.dtype}, expected "
                f"{full} and {dtype}."
            )
        x_halos = x_ghost_planes(halos, lattice.d, "native step")
        if x_halos is None:
            left = right = _empty(dtype, f)
            n = threads or cores
        else:
            left, right = x_halos
            n = threads or max(1, cores // jax.device_count())
        bnd = aux.boundary
        arrays = [
            _empty(d, f) if a is None else a
            for a, d in zip(
                (bnd.bounce, bnd.wall_term, bnd.fixed_mask, bnd.fixed),
                (np.bool_, np.float32, np.bool_, dtype),
                strict=True,
            )
        ]
        # the result has g's type (inside shard_map: varying over the mesh axes)
        call = jax.ffi.ffi_call(target, jax.typeof(g), input_output_aliases={7: 0})
        return without_derivative(
            lambda f, *rest: call(
                f,
                *rest,
                omega=omega,
                forced=np.int64(forced),
                force=force,
                cp=cp,
                cm=cm,
                threads=np.int64(n),
            ),
            "the native CPU step",
        )(f, left, right, *arrays, g)

    return step_into


def _empty(dtype: Any, like: jax.Array) -> jax.Array:
    """A zero-size placeholder for an absent array, typed like ``like`` (inside
    ``shard_map``, varying over the same mesh axes)."""
    empty = jnp.zeros((0,), dtype)
    vma = tuple(getattr(jax.typeof(like), "vma", ()))
    return jax.lax.pcast(empty, vma, to="varying") if vma else empty


# -- the free-surface step (lbm_jax.free_surface) -------------------------------------

#: Float32 scratch arrays of one free-surface call, one value per cell each
#: (``kFloats`` in ``_native/lbm_free_surface.cc``).
FREE_SURFACE_SCRATCH = 12
#: Int32 scratch arrays of one free-surface call, one value per row (x, y) each
#: (the z ranges and offsets of ``_native/lbm_free_surface.h``: ``4 + 3 kRanges``).
FREE_SURFACE_ROW_INTS = 19


def covered_free_surface(
    lattice: Lattice,
    storage: StoragePolicy,
    shape: tuple[int, ...],
    devices: int,
) -> str | None:
    """Why the native free-surface step does not cover a configuration, or
    ``None`` when it does (the library aside: see :func:`free_surface_candidate`).

    Covered: D2Q9, D3Q19 and D3Q27 (any collision: BGK or TRT, with or without
    a Smagorinsky model), FP32/FP32, FP32/FP16S, FP32/FP16C and FP32/bfloat16
    storage with DDF-shifting, a grid on one device with at least 3 cells along
    every axis and fewer than 2^31 cells, on a CPU.
    """
    checks = (
        *_needs(lattice, storage, shape),
        (devices == 1, "a grid on one device"),
        (min(shape) >= 3, "at least 3 cells per axis"),
        (math.prod(shape) < 2**31, "fewer than 2^31 cells"),
    )
    return _missing("the native free-surface step", checks)


def free_surface_candidate(
    lattice: Lattice,
    storage: StoragePolicy,
    shape: tuple[int, ...],
    devices: int,
) -> Candidate:
    """The native free-surface step's answer (see :func:`lbm_jax.step.choose`):
    :func:`covered_free_surface`; an unavailable library warns once under
    ``"auto"`` (:class:`NativeStepWarning`)."""
    why = covered_free_surface(lattice, storage, shape, devices)
    return Candidate(Backend.NATIVE, why, unavailable_reason, warn_fallback, _on_cpu())


def make_native_free_surface_step(
    lattice: Lattice,
    storage: StoragePolicy,
    model: CollisionModel,
    shape: tuple[int, ...],
    *,
    sigma: float,
    gravity: tuple[float, ...],
    smoothing: int,
    fill_limit: float,
    threads: int | None = None,
    poison: bool = False,
) -> Callable[..., tuple[jax.Array, jax.Array, jax.Array, jax.Array]]:
    """Build ``step(f, flags, mass, carry) -> (g, flags, mass, carry)``: one
    free-surface step (``_native/lbm_free_surface.cc``) on populations in the
    population layout and grid-shaped ``int8`` flags and float32 mass and carry.

    The step runs in place: every input aliases its result (XLA copies an
    input first where it is still needed afterwards, so inside a loop nothing
    is copied). Gas and solid cells are neither read nor written: they keep
    their populations, the rest equilibrium from
    :meth:`lbm_jax.free_surface.FreeSurface.init` on (which the XLA step writes
    every step).

    Args:
        lattice, storage, model, shape: The liquid's simulation (``model``
            with the free surface's Smagorinsky constant, if any).
        sigma: Surface tension; the gas density is ``1 - 3 (D - 1) sigma kappa``.
        gravity: Acceleration, ``(D,)``; the force density is ``rho g``.
        smoothing: Smoothing passes of the fill field for the curvature.
        fill_limit: ``1 + FILL_MARGIN``: an interface cell fills above
            ``fill_limit rho``.
        threads: Threads per call; ``None``: :func:`default_threads`.
        poison: Fill the scratch arrays with NaN before every step (a check for
            tests: a value read before the step computes it spreads NaN).

    Raises:
        ValueError: If :func:`covered_free_surface` says no (with why).
    """
    shape = tuple(int(s) for s in shape)
    why = covered_free_surface(lattice, storage, shape, 1)
    if why is not None:
        raise ValueError(why)
    cells = math.prod(shape)
    rows = shape[0] * (shape[1] if lattice.d == 3 else 1)
    full = (shape[0], lattice.q, *shape[1:])
    target = _fs_target(lattice.name, _STORAGES[storage.short_name])
    grid = jax.ShapeDtypeStruct(shape, jnp.float32)
    out_types = (
        jax.ShapeDtypeStruct(full, storage.storage_dtype),
        jax.ShapeDtypeStruct(shape, jnp.int8),
        grid,
        grid,
        jax.ShapeDtypeStruct((FREE_SURFACE_SCRATCH * cells,), jnp.float32),
        jax.ShapeDtypeStruct((cells + 2 * rows,), jnp.uint8),
        jax.ShapeDtypeStruct((FREE_SURFACE_ROW_INTS * rows,), jnp.int32),
    )
    n = threads or default_threads()
    # per run of x-planes (``chunks`` in the source), four copies of a plane's
    # slices of the directions that leave it upwards (as many leave downwards)
    chunks = max(1, min(n, shape[0]))
    crossing = int(np.sum(lattice.c[:, 0] == 1))
    saved = 4 * chunks * crossing * math.prod(shape[1:])
    out_types += (jax.ShapeDtypeStruct((saved,), storage.storage_dtype),)
    call = jax.ffi.ffi_call(
        target, out_types, input_output_aliases={0: 0, 1: 1, 2: 2, 3: 3}
    )
    attrs = {
        "omega": np.float32(model.omega_plus),
        "cp": np.float32(1 - 0.5 * model.omega_plus),
        "cm": np.float32(1 - 0.5 * model.omega_minus),
        "fill_limit": np.float32(fill_limit),
        "gas_factor": np.float32(3 * (lattice.d - 1) * sigma),
        "gravity": np.array(gravity, np.float32),
        "omega_minus": np.float32(model.omega_minus),
        "tau": np.float32(model.tau),
        "magic": np.float32(model.magic),
        # as lbm_jax.core._collision rounds it (0: no Smagorinsky model)
        "smagorinsky_c2": np.float32(model.smagorinsky_c2),
        "trt": np.int64(model.kind is Collision.TRT),
        "passes": np.int64(smoothing),
        "threads": np.int64(n),
        "poison": np.int64(poison),
    }

    def step(
        f: jax.Array, flags: jax.Array, mass: jax.Array, carry: jax.Array
    ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
        g, flags, mass, carry, *_ = call(f, flags, mass, carry, **attrs)
        return g, flags, mass, carry

    return step
