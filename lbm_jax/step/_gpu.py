"""The fused GPU step: one Pallas kernel per time step (pull, decode, collide, encode).

On a GPU the XLA step of :mod:`lbm_jax.step._xla` moves about a fifth of the memory
bandwidth a lattice Boltzmann step needs (its slab tiling is a CPU cache design,
and XLA splits the step into several fusions that each pass over the grid). This
module writes the step as one kernel, the way FluidX3D's ``stream_collide`` is
written: every GPU thread owns one cell, loads its ``Q`` incoming populations
from the neighbours (pull), decodes them, collides in registers, encodes and
stores. Each population is read once and written once per step, so the step is
bound by memory traffic: 16-bit storage halves it.

The kernel is a Pallas kernel (lowered through Triton on NVIDIA and AMD GPUs):
no toolchain beyond JAX itself, and the same kernel body runs on the CPU in
Pallas' interpret mode, which is how the tests check it against the XLA step.

Layout: the populations keep the solver's layout ``(X, Q, *rest)``; for one
direction a grid row along the last axis is contiguous, so the threads of a
program read and write consecutive addresses (coalesced). A program handles one
row segment of :data:`BLOCK` cells along the last axis; programs tile the other
axes. Offsets are computed in 64 bits when an array passes 4 GiB.

Streaming:

* two buffers (``make_gpu_step_into``): pull from ``f`` into ``g``;
* in place (:mod:`lbm_jax.step._gpu_inplace`): the esoteric-pull scheme.

Both give the same per-cell arithmetic, in the XLA step's order of operations;
the GPU's compiler may contract multiply-adds differently, so results agree with
the XLA step to within rounding (tested to a few ulp per population and step,
with equal sums of mass and momentum), and bit for bit between the two
streaming modes.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lbm_jax.core._collision import CollisionModel
from lbm_jax.core._lattice import Lattice, get_lattice
from lbm_jax.core._storage import StoragePolicy
from lbm_jax.step._backend import Backend, Candidate, without_derivative
from lbm_jax.step._gpu_cells import Cells, collide_cells, encode_in_kernel, index, wrap
from lbm_jax.step._layout import x_ghost_planes

__all__ = [
    "BLOCK",
    "Plan",
    "available",
    "candidate",
    "lowering",
    "quiet_lowering",
    "make_gpu_step_into",
    "pallas_modules",
    "program_cells",
    "result_type",
    "call_kernel",
    "kernel_operands",
    "run_kernel",
    "supported",
    "unavailable_reason",
    "why_not",
]

#: Most cells one program handles along the last grid axis (a power of two).
BLOCK = 512
_LATTICES = ("D2Q9", "D3Q19", "D3Q27")


@functools.cache
def pallas_modules() -> tuple[Any, Any] | str:
    """``(pallas, pallas.triton)`` or the reason they cannot be imported."""
    try:
        from jax.experimental import pallas as pl
        from jax.experimental.pallas import triton as plgpu
    except ImportError as err:  # pragma: no cover - depends on the jax build
        return f"Pallas is not available in this jax installation ({err})"
    return pl, plgpu


def unavailable_reason() -> str | None:
    """Why the fused GPU step cannot run here, or ``None`` when it can."""
    mods = pallas_modules()
    if isinstance(mods, str):
        return mods
    if jax.default_backend() not in ("gpu", "cuda", "rocm"):
        return f"the default JAX backend is {jax.default_backend()!r}, not a GPU"
    return None


def available() -> bool:
    """Whether the fused GPU step can run on the default backend."""
    return unavailable_reason() is None


def why_not(
    lattice: Lattice,
    shape: tuple[int, ...],
    *,
    split_yz: bool = False,
    gray: bool = False,
) -> str | None:
    """Why the fused GPU step does not cover a configuration, or ``None`` when it
    does (the device aside: see :func:`unavailable_reason`).

    Covered: D2Q9, D3Q19 and D3Q27 with BGK or TRT collision (with or without
    the Smagorinsky model), every storage policy (shifted or not), bounce-back,
    moving walls, equilibrium cells, constant, per-call and field forces, grids
    split along x (ghost planes exchanged as for the XLA step). Not covered:
    grids split along y or z, gray cells (``gray``: a solid fraction).

    >>> from lbm_jax import get_lattice
    >>> why_not(get_lattice("D2Q9"), (8, 8, 8))
    'the fused GPU step needs a 2-D grid (got 3-D)'
    """
    if lattice.name not in _LATTICES or lattice != get_lattice(lattice.name):
        return f"the fused GPU step covers {', '.join(_LATTICES[:-1])} and " + (
            f"{_LATTICES[-1]} (got {lattice.name})"
        )
    if len(shape) != lattice.d:
        return f"the fused GPU step needs a {lattice.d}-D grid (got {len(shape)}-D)"
    if split_yz:
        return "the fused GPU step takes grids split along x only"
    if gray:
        return (
            "the fused GPU step does not cover gray cells (solid_fraction: the "
            "XLA step runs them)"
        )
    return None


def supported(
    lattice: Lattice,
    storage: StoragePolicy,
    model: CollisionModel,
    shape: tuple[int, ...],
    *,
    split_yz: bool = False,
    interpret: bool = False,
) -> bool:
    """Whether the fused GPU step covers a configuration (:func:`why_not`) and
    can run here.

    Args:
        lattice, storage, model: The configuration.
        shape: Grid size of one device's sub-domain.
        split_yz: Whether the grid is split along y or z.
        interpret: Check coverage only, for Pallas' interpret mode (tests).
    """
    if why_not(lattice, shape, split_yz=split_yz) is not None:
        return False
    return not isinstance(pallas_modules(), str) if interpret else available()


def candidate(
    lattice: Lattice,
    shape: tuple[int, ...],
    *,
    split_yz: bool = False,
    gray: bool = False,
) -> Candidate:
    """The fused GPU step's answer for a simulation (see
    :func:`lbm_jax.step.choose`): :func:`why_not`; off a GPU ``"auto"`` passes
    it over."""
    why = why_not(lattice, shape, split_yz=split_yz, gray=gray)
    return Candidate(Backend.GPU, why, unavailable_reason, None, available())


#: jax 0.11 deprecates Pallas' Triton backend (in favour of Mosaic GPU, Hopper
#: and newer only) with a warning each time a kernel is lowered.
TRITON_DEPRECATION = r".*Pallas Triton backend is deprecated"


@contextlib.contextmanager
def quiet_lowering() -> Iterator[None]:
    """Ignore :data:`TRITON_DEPRECATION` (only that warning) while a program with
    these kernels is lowered: it is the backend this step is written for, and
    the warning says nothing its users can act on. The filter is restored on
    exit, so a user's warning settings stay theirs."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=TRITON_DEPRECATION, category=DeprecationWarning
        )
        yield


def lowering(backend: Backend | str) -> contextlib.AbstractContextManager[None]:
    """The context a program of a step on ``backend`` is lowered in:
    :func:`quiet_lowering` for the GPU backend, nothing for the others."""
    gpu = Backend(backend) is Backend.GPU
    return quiet_lowering() if gpu else contextlib.nullcontext()


def _block(n: int) -> int:
    """Power-of-two row segment for a last axis of ``n`` cells."""
    return int(min(BLOCK, max(16, 1 << (int(n) - 1).bit_length())))


class Plan:
    """What one kernel instance needs: the configuration and which optional
    operands (boundaries, force, x ghost planes) it reads."""

    def __init__(
        self,
        lattice: Lattice,
        storage: StoragePolicy,
        model: CollisionModel,
        shape: tuple[int, ...],
        constant_force: list[np.ndarray] | None,
        interpret: bool,
    ) -> None:
        self.lattice = lattice
        self.storage = storage
        self.model = model
        self.shape = tuple(int(s) for s in shape)
        self.constant_force = constant_force
        self.interpret = interpret
        self.block = _block(self.shape[-1])
        self.dirs = [tuple(int(v) for v in ci) for ci in lattice.c]
        self.full = (self.shape[0], lattice.q, *self.shape[1:])

    @property
    def grid(self) -> tuple[int, ...]:
        return (*self.shape[:-1], -(-self.shape[-1] // self.block))

    def force_at(self, refs: dict[str, Any], cells: Cells) -> list[Any] | None:
        """The force components of the program's cells (or scalars)."""
        if "force" not in refs:
            if self.constant_force is None:
                return None
            dtype = self.storage.compute_dtype
            return [np.asarray(v, dtype) for v in self.constant_force]
        ref = refs["force"]
        if len(ref.shape) == 1:  # a per-call (D,) vector
            return [ref[a] for a in range(self.lattice.d)]
        _, plgpu = pallas_modules()
        return [
            plgpu.load(ref.at[(a, *cells.coords)], mask=cells.mask, other=0)
            for a in range(self.lattice.d)
        ]

    def finish(
        self,
        refs: dict[str, Any],
        cells: Cells,
        fs: list[jax.Array],
        own: Callable[[int], jax.Array] | None,
    ) -> list[jax.Array]:
        """Bounce-back (``own(i)``: the cell's stored post-collision population
        ``i`` of the previous step), collision and encoding of pulled ``fs``."""
        _, plgpu = pallas_modules()
        st = self.storage
        mask = cells.mask
        if "bounce" in refs:
            opp = self.lattice.opposite
            for i in range(self.lattice.q):
                if not any(self.dirs[i]):
                    continue
                at = index(cells.coords, i)
                hit = plgpu.load(refs["bounce"].at[at], mask=mask, other=False)
                reflected = st.decode(own(int(opp[i])))
                if "wall_term" in refs:
                    reflected = reflected + plgpu.load(
                        refs["wall_term"].at[at], mask=mask, other=0
                    )
                fs[i] = jnp.where(hit, reflected, fs[i])
        out = collide_cells(
            self.lattice,
            self.model,
            fs,
            shift=st.shift,
            force=self.force_at(refs, cells),
        )
        return [encode_in_kernel(st, v) for v in out]

    def fixed_at(self, refs: dict[str, Any], cells: Cells) -> jax.Array | None:
        """Whether each of the program's cells is non-fluid (``None``: none is)."""
        if "fixed_mask" not in refs:
            return None
        _, plgpu = pallas_modules()
        return plgpu.load(
            refs["fixed_mask"].at[index(cells.coords, 0)],
            mask=cells.mask,
            other=False,
        )


def program_cells(plan: Plan, vma: tuple[str, ...] = ()) -> Cells:
    """The index helpers of the running program."""
    pl, _ = pallas_modules()
    return Cells(pl, plan.shape, plan.block, interpret=plan.interpret, vma=vma)


def kernel_operands(aux: Any, halos: Any) -> dict[str, jax.Array]:
    """The optional operands of a call, by name (absent ones left out)."""
    ops = {}
    bnd = aux.boundary
    for name in ("bounce", "wall_term", "fixed_mask", "fixed"):
        value = getattr(bnd, name)
        if value is not None:
            ops[name] = value
    if aux.force is not None:
        ops["force"] = aux.force
    if halos is not None:
        left, right = halos
        ops["left"], ops["right"] = left, right
    return ops


def make_gpu_step_into(
    lattice: Lattice,
    storage: StoragePolicy,
    model: CollisionModel,
    shape: tuple[int, ...],
    slab: int | None = None,
    constant_force: list[np.ndarray] | None = None,
    *,
    interpret: bool = False,
) -> Callable[..., jax.Array]:
    """Build ``step_into(aux, f, g, halos=None) -> g'``, the fused twin of
    :func:`lbm_jax.step._xla.make_step_into` (same arguments and contract).

    Args:
        lattice: Velocity set.
        storage: Storage policy.
        model: Collision operator (BGK or TRT).
        shape: Grid size ``(X, *rest)`` of the populations passed in.
        slab: Ignored (the kernel covers the grid); accepted for the common
            signature.
        constant_force: Force components as scalars, or ``None``; used when
            ``aux.force`` is ``None``.
        interpret: Run the kernel in Pallas' interpret mode (any backend; slow,
            for tests).

    ``g`` is overwritten (it is aliased to the result, so a donated ``g`` costs
    no allocation). ``halos``: ``None``, or the x ghost planes of a grid split
    along x (a ``(low, high)`` pair or one entry per grid axis with ``None`` for
    y and z).

    Raises:
        ValueError: A configuration :func:`supported` rejects.
    """
    del slab
    shape = tuple(int(s) for s in shape)
    if not supported(lattice, storage, model, shape, interpret=True):
        raise ValueError(
            f"the fused GPU step does not cover {lattice.name} on {shape} with "
            f"{storage}, {model.kind.value}"
            + (" (Smagorinsky)" if model.smagorinsky else "")
            + "; use make_step_into."
        )
    plan = Plan(lattice, storage, model, shape, constant_force, interpret)

    def step_into(aux: Any, f: jax.Array, g: jax.Array, halos: Any = None):
        if f.shape != plan.full or f.dtype != storage.storage_dtype:
            raise ValueError(
                f"populations have shape {f.shape} and dtype {f.dtype}, expected "
                f"{plan.full} and {storage.storage_dtype}."
            )
        ops = kernel_operands(aux, x_ghost_planes(halos, lattice.d, "fused GPU step"))
        vma = _varying_axes(f)
        kernel = _pull_kernel(plan, tuple(ops), vma)
        return call_kernel(plan, kernel, [f, *ops.values()], g)

    return step_into


def call_kernel(
    plan: Plan,
    kernel: Callable[..., None],
    inputs: list[jax.Array],
    out: jax.Array,
) -> jax.Array:
    """Run ``kernel(*inputs, out, out)`` over the grid, the result aliased to
    ``out`` (the kernel gets the refs of the inputs, of ``out`` as it comes in,
    and of the result; on a GPU the last two are the same memory)."""
    name = f"lbm_{plan.lattice.name.lower()}_{plan.storage.short_name}"
    return run_kernel(plan, kernel, [*inputs, out], result_type(out), name, alias=True)


def run_kernel(
    plan: Plan,
    kernel: Callable[..., None],
    inputs: list[jax.Array],
    out_shape: Any,
    name: str,
    *,
    alias: bool = False,
) -> Any:
    """Run ``kernel`` over ``plan``'s grid: the refs of ``inputs``, then of the
    results ``out_shape`` (one type or a list). ``alias``: the first result
    updates the last input in place (the kernel writes only what it changes);
    otherwise every result is a new buffer the kernel writes in full."""
    pl, plgpu = pallas_modules()
    params = {}
    if not plan.interpret:
        params["compiler_params"] = plgpu.CompilerParams(num_warps=4, num_stages=1)
    call = pl.pallas_call(
        kernel,
        out_shape=out_shape,
        grid=plan.grid,
        input_output_aliases={len(inputs) - 1: 0} if alias else {},
        interpret=plan.interpret,
        name=name,
        **params,
    )
    return without_derivative(call, f"the fused GPU step ({name})")(*inputs)


def _varying_axes(a: jax.Array) -> tuple[str, ...]:
    """The mesh axes ``a`` varies over inside ``shard_map`` (empty outside)."""
    aval = jax.typeof(a)
    mat = getattr(aval, "mat", None)
    axes = getattr(mat, "varying", None)
    if axes is None:
        axes = getattr(aval, "vma", None) or ()
    return tuple(sorted(axes))


def result_type(out: jax.Array) -> jax.ShapeDtypeStruct:
    """The result type of ``out`` (inside ``shard_map``: varying like ``out``)."""
    mat = getattr(jax.typeof(out), "mat", None)
    if mat is not None:
        try:
            return jax.ShapeDtypeStruct(out.shape, out.dtype, manual_axis_type=mat)
        except TypeError:  # a jax without this argument
            pass
    return jax.ShapeDtypeStruct(out.shape, out.dtype)


def _pull_kernel(
    plan: Plan, names: tuple[str, ...], vma: tuple[str, ...] = ()
) -> Callable[..., None]:
    """The two-buffer kernel: pull from ``f`` (and the x ghost planes); ``vma``:
    the mesh axes ``f`` varies over (inside ``shard_map``)."""
    _, plgpu = pallas_modules()
    nx = plan.shape[0]
    st = plan.storage

    def kernel(f_ref, *refs):
        *op_refs, _, g_ref = refs
        refs = dict(zip(names, op_refs, strict=True))
        cells = program_cells(plan, vma)
        mask = cells.mask

        def load_pulled(i: int) -> jax.Array:
            src = cells.shifted(plan.dirs[i], -1)
            x = src[0]
            if "left" not in refs:
                src[0] = wrap(x, nx)
                return plgpu.load(f_ref.at[index(src, i)], mask=mask, other=0)
            inside = (x >= 0) & (x < nx)
            value = plgpu.load(
                f_ref.at[index([jnp.clip(x, 0, nx - 1), *src[1:]], i)],
                mask=mask & inside,
                other=0,
            )
            plane = jnp.zeros_like(x)  # the ghost arrays hold one x-plane
            for name, hit in (("left", x < 0), ("right", x >= nx)):
                ghost = plgpu.load(
                    refs[name].at[index([plane, *src[1:]], i)],
                    mask=mask & hit,
                    other=0,
                )
                value = jnp.where(hit, ghost, value)
            return value

        fs = [st.decode(load_pulled(i)) for i in range(plan.lattice.q)]

        def own(i: int) -> jax.Array:
            return plgpu.load(f_ref.at[index(cells.coords, i)], mask=mask, other=0)

        out = plan.finish(refs, cells, fs, own)
        fixed = plan.fixed_at(refs, cells)
        for i, v in enumerate(out):
            at = index(cells.coords, i)
            if fixed is not None:
                v = jnp.where(
                    fixed, plgpu.load(refs["fixed"].at[at], mask=mask, other=0), v
                )
            plgpu.store(g_ref.at[at], v, mask=mask)

    return kernel
