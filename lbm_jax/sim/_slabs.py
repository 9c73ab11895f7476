"""Slab-wise, compiled construction and read-out of population states.

A D3Q19 state is 19 values per cell; its decoded (float32) copy is twice a 16-bit
state, and a ``moveaxis`` of it another full copy. Every function here therefore
walks over the grid in slabs of a few x-planes inside one compiled
``lax.fori_loop``: it decodes one slab of the stored populations (population layout
``(X, Q, *rest)``), computes what it needs from it, and writes the slab's part of
the output in place (or adds it to a running sum). A call holds the state, its
output and one slab, never a decoded or transposed full-size copy:

* :func:`init_state`: the (DDF-shifted, encoded) equilibrium written directly in
  the population layout, slab by slab, so no float32 full-size temporary exists;
* :func:`fields`: density and velocity; :func:`populations`: the decoded
  populations ``(Q, *shape)``; :func:`healthy`: the density and speed test;
* :func:`link_sums`: the momentum-exchange sums over fluid-to-body links;
* :func:`curl`: central-difference vorticity of a velocity field.

On a split simulation (``sim.mesh``) each function runs per block inside
``jax.shard_map``: per-cell outputs stay split like the state (nothing is gathered
to one device) and sums are combined by ``psum``. Neighbour values that cross a
block border (vorticity, momentum-exchange links) arrive as ghost layers by
``ppermute``, one slab at a time.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from lbm_jax.core._boundaries import CellType
from lbm_jax.core._collision import (
    direction_constants,
    equilibrium,
    healthy_cells,
    moments,
)
from lbm_jax.core._lattice import Lattice
from lbm_jax.core._storage import StoragePolicy
from lbm_jax.sim._decomp import Decomposition
from lbm_jax.step._layout import planes_per_slab

__all__ = [
    "Grid",
    "curl",
    "fields",
    "healthy",
    "init_state",
    "link_sums",
    "mesh_of",
    "populations",
]


class Grid(Protocol):
    """What the functions here read from a simulation."""

    @property
    def lattice(self) -> Lattice: ...

    @property
    def storage(self) -> StoragePolicy: ...

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def mesh(self) -> Mesh | None: ...


def _for_slabs(
    split: Decomposition, nx: int, b: int, body: Callable[[Any, Any], Any], carry: Any
) -> Any:
    """``carry = body(x0, carry)`` for ``x0 = 0, b, 2b, ...`` in a compiled loop
    (per block inside :meth:`Decomposition.shard`, where the carry varies by
    block)."""
    if nx == b:
        return body(jnp.asarray(0, jnp.int32), carry)
    if split.mesh is not None:
        axes = tuple(split.mesh.axis_names)
        carry = jax.tree.map(lambda x: lax.pcast(x, axes, to="varying"), carry)
    return lax.fori_loop(0, nx // b, lambda k, c: body(k * b, c), carry)


def _decomposition(sim: Grid) -> Decomposition:
    return Decomposition.from_mesh(sim.mesh, sim.shape)


def _slab_of(a: jax.Array, x0: jax.Array, b: int, axis: int = 0) -> jax.Array:
    return lax.dynamic_slice_in_dim(a, x0, b, axis)


def _put(out: jax.Array, piece: jax.Array, x0: jax.Array, axis: int = 0) -> jax.Array:
    return lax.dynamic_update_slice_in_dim(out, piece, x0, axis)


def _slab_planes(sim: Grid, local: tuple[int, ...]) -> int:
    """x-planes per slab of a block: a divisor of its x size, so that slabs tile
    it exactly (sums count each plane once)."""
    itemsize = np.dtype(sim.storage.compute_dtype).itemsize
    plane = sim.lattice.q * math.prod(local[1:]) * itemsize
    return planes_per_slab(local[0], plane, divisor=True)


# -- construction ---------------------------------------------------------------
@jax.jit
def init_state(
    sim: Grid,
    rho: jax.Array,
    u: jax.Array,
    force: jax.Array | None,
    fixed_mask: jax.Array | None,
    fixed: jax.Array | None,
) -> jax.Array:
    """Stored equilibrium populations ``(X, Q, *rest)``, written slab by slab.

    Args:
        sim: The simulation.
        rho: Density, a scalar or grid-shaped, compute dtype.
        u: Velocity, ``(D,)`` or ``(D, *shape)``, compute dtype.
        force: ``None``, ``(D,)`` or ``(D, *shape)``: the Guo half-force
            ``1.5 w_i c_i . F`` is added (post-collision momentum ``rho u + F/2``).
        fixed_mask, fixed: Non-fluid cells and their stored populations (kernel
            layout), or ``None``.
    """
    lat, pol = sim.lattice, sim.storage
    dtype = pol.compute_dtype
    split = _decomposition(sim)
    local = split.local_shape
    b = _slab_planes(sim, local)
    w, cs = direction_constants(lat, dtype, len(local), axis=1)
    kernel = split.grid_spec()

    def field_spec(a: jax.Array | None, lead: int) -> PartitionSpec | None:
        if a is None:
            return None
        return split.grid_spec(lead=lead, inner=0) if a.ndim > lead else PartitionSpec()

    def slab_of_field(a: jax.Array, x0: jax.Array, lead: int) -> jax.Array:
        if a.ndim == lead:  # uniform value: broadcast over the slab
            return jnp.broadcast_to(
                a.reshape(a.shape + (1,) * len(local)), (*a.shape, b, *local[1:])
            )
        return _slab_of(a, x0, b, lead)

    def block(rho, u, force, fixed_mask, fixed):
        def body(x0, f):
            r = slab_of_field(rho, x0, 0)
            us = slab_of_field(u, x0, 1)
            feq = equilibrium(
                lat, r, [us[a] for a in range(lat.d)], shift=pol.shift, axis=1
            )
            if force is not None:
                fs = slab_of_field(force, x0, 1)
                fc = [jnp.expand_dims(fs[a], 1) for a in range(lat.d)]
                feq = feq + 1.5 * w * sum(c * fa for c, fa in zip(cs, fc, strict=True))
            stored = pol.encode(feq)
            if fixed is not None:
                stored = jnp.where(
                    _slab_of(fixed_mask, x0, b), _slab_of(fixed, x0, b), stored
                )
            return _put(f, stored, x0)

        f = jnp.zeros((local[0], lat.q, *local[1:]), pol.storage_dtype)
        return _for_slabs(split, local[0], b, body, f)

    specs = (
        field_spec(rho, 0),
        field_spec(u, 1),
        field_spec(force, 1),
        None if fixed_mask is None else kernel,
        None if fixed is None else kernel,
    )
    return split.shard(block, specs, kernel)(rho, u, force, fixed_mask, fixed)


# -- read-out ---------------------------------------------------------------------
@functools.partial(jax.jit, static_argnames=("which",))
def fields(
    sim: Grid,
    f: jax.Array,
    force: jax.Array | None,
    *,
    which: str = "both",
) -> tuple[jax.Array | None, jax.Array | None]:
    """Density ``(*shape)`` and velocity ``(D, *shape)`` of stored populations.

    ``force`` (``None``, ``(D,)`` or ``(D, *shape)``, compute dtype): its Guo
    half-force is taken off the momentum before dividing by the density.
    ``which`` (``"both"``, ``"density"`` or ``"velocity"``): the field(s) to
    compute; the other is ``None`` (never allocated).
    """
    lat, pol = sim.lattice, sim.storage
    dtype = pol.compute_dtype
    split = _decomposition(sim)
    local = split.local_shape
    b = _slab_planes(sim, local)
    want_rho, want_u = which in ("both", "density"), which in ("both", "velocity")

    def block(f, force):
        def body(x0, out):
            rho, u = out
            r, j = moments(lat, pol.decode(_slab_of(f, x0, b)), shift=pol.shift, axis=1)
            if want_rho:
                rho = _put(rho, r, x0)
            if want_u:
                if force is not None:
                    fs = force if force.ndim == 1 else _slab_of(force, x0, b, 1)
                    j = [ji - 0.5 * fs[a] for a, ji in enumerate(j)]
                u = _put(u, jnp.stack([ji / r for ji in j]), x0, 1)
            return rho, u

        out = (
            jnp.zeros(local, dtype) if want_rho else None,
            jnp.zeros((lat.d, *local), dtype) if want_u else None,
        )
        return _for_slabs(split, local[0], b, body, out)

    if force is None or not want_u:
        force, force_spec = None, None
    else:
        force_spec = (
            PartitionSpec() if force.ndim == 1 else split.grid_spec(lead=1, inner=0)
        )
    return split.shard(
        block,
        (split.grid_spec(), force_spec),
        (
            split.grid_spec(inner=0) if want_rho else None,
            split.grid_spec(lead=1, inner=0) if want_u else None,
        ),
    )(f, force)


@functools.partial(jax.jit, static_argnames=("shifted",))
def populations(sim: Grid, f: jax.Array, *, shifted: bool) -> jax.Array:
    """Decoded populations ``(Q, *shape)`` (``f_i - w_i`` if ``shifted``)."""
    lat, pol = sim.lattice, sim.storage
    dtype = pol.compute_dtype
    split = _decomposition(sim)
    local = split.local_shape
    b = _slab_planes(sim, local)
    w, _ = direction_constants(lat, dtype, len(local))

    def block(f):
        def body(x0, out):
            fs = jnp.moveaxis(pol.decode(_slab_of(f, x0, b)), 1, 0)
            if pol.shift and not shifted:
                fs = fs + w
            return _put(out, fs, x0, 1)

        return _for_slabs(split, local[0], b, body, jnp.zeros((lat.q, *local), dtype))

    return split.shard(block, (split.grid_spec(),), split.grid_spec(lead=1, inner=0))(f)


@jax.jit
def healthy(sim: Grid, f: jax.Array) -> jax.Array:
    """True when every density is finite and positive and every speed within the
    lattice's stability limit (:func:`~lbm_jax.core._collision.healthy_cells`)."""
    lat, pol = sim.lattice, sim.storage
    split = _decomposition(sim)
    local = split.local_shape
    b = _slab_planes(sim, local)

    def block(f):
        def body(x0, bad):
            r, j = moments(lat, pol.decode(_slab_of(f, x0, b)), shift=pol.shift, axis=1)
            ok = healthy_cells(r, j)
            return bad + jnp.sum(~ok, dtype=jnp.int32)

        return split.total(_for_slabs(split, local[0], b, body, jnp.int32(0)))

    return split.shard(block, (split.grid_spec(),), PartitionSpec())(f) == 0


@jax.jit
def link_sums(
    sim: Grid, f: jax.Array, cell_type: jax.Array, mask: jax.Array | None
) -> jax.Array:
    """Sums over the links from a fluid cell ``x`` to a body cell ``x + c_i``.

    Args:
        sim: The simulation.
        f: Stored populations, population layout.
        cell_type: The ``int8`` cell-type grid.
        mask: Boolean grid of the body, or ``None`` for every ``SOLID`` and
            ``WALL`` cell.

    Returns:
        Per direction ``i``, ``sum 2 f_i(x)`` over its links (``f`` decoded, as
        stored: shifted if shifting), ``(Q,)`` in the compute dtype.
    """
    lat, pol = sim.lattice, sim.storage
    dtype = pol.compute_dtype
    split = _decomposition(sim)
    local = split.local_shape
    b = _slab_planes(sim, local)
    ndim = len(local)
    dirs = [tuple(int(v) for v in ci) for ci in lat.c]
    axes = (0, *range(2, ndim + 1))

    def block(f, ct, mask):
        source = ct if mask is None else mask
        halos = _x_halos(split, source)

        def body(x0, acc):
            near = _haloed_slab(split, source, halos, x0, b)  # (b+2, *rest+2)
            if mask is None:
                near = (near == CellType.SOLID) | (near == CellType.WALL)
            fluid = _slab_of(ct, x0, b) == CellType.FLUID
            links = []
            for ci in dirs:
                start = tuple(1 + v for v in ci)
                limit = tuple(
                    s + n for s, n in zip(start, (b, *local[1:]), strict=True)
                )
                links.append(fluid & lax.slice(near, start, limit))
            link = jnp.stack(links, axis=1)
            fs = pol.decode(_slab_of(f, x0, b))
            return acc + jnp.sum(jnp.where(link, 2 * fs, 0), axis=axes)

        acc = jnp.zeros((lat.q,), dtype)
        return split.total(_for_slabs(split, local[0], b, body, acc))

    grid = split.grid_spec(inner=0)
    return split.shard(
        block,
        (split.grid_spec(), grid, None if mask is None else grid),
        PartitionSpec(),
    )(f, cell_type, mask)


def _x_halos(
    split: Decomposition, a: jax.Array, axis: int = 0
) -> tuple[jax.Array, ...]:
    """The x-planes just below and above this block (neighbours' or wrapped)."""
    ghosted = split.ghost(
        jnp.concatenate(
            [
                lax.slice_in_dim(a, 0, 1, axis=axis),
                lax.slice_in_dim(a, -1, None, axis=axis),
            ],
            axis=axis,
        ),
        axis,
        0,
    )
    # ghosted = [below, first, last, above]
    return (
        lax.slice_in_dim(ghosted, 0, 1, axis=axis),
        lax.slice_in_dim(ghosted, 3, 4, axis=axis),
    )


def _haloed_slab(
    split: Decomposition,
    a: jax.Array,
    halos: tuple[jax.Array, jax.Array],
    x0: jax.Array,
    b: int,
    axis: int = 0,
) -> jax.Array:
    """Planes ``x0 - 1 .. x0 + b`` of a grid array with one ghost layer in every
    other grid axis (x is at array axis ``axis``, the others follow it)."""
    nx = a.shape[axis]
    left = _slab_of(a, jnp.maximum(x0 - 1, 0), 1, axis)
    right = _slab_of(a, jnp.minimum(x0 + b, nx - 1), 1, axis)
    left = jnp.where(x0 == 0, halos[0], left)
    right = jnp.where(x0 + b == nx, halos[1], right)
    slab = jnp.concatenate([left, _slab_of(a, x0, b, axis), right], axis=axis)
    for g in range(1, len(split.splits)):
        slab = split.ghost(slab, axis + g, g)
    return slab


@functools.partial(jax.jit, static_argnames=("mesh",))
def curl(u: jax.Array, mesh: Mesh | None = None) -> jax.Array:
    """Central-difference vorticity of ``(2, X, Y)`` or ``(3, X, Y, Z)`` velocity
    (periodic wrap), slab by slab; per block when ``mesh`` splits ``u``."""
    d = u.shape[0]
    split = Decomposition.from_mesh(mesh, u.shape[1:])
    local = split.local_shape
    plane = u.dtype.itemsize * d * math.prod(local[1:])
    b = planes_per_slab(local[0], plane, divisor=True)

    def block(u):
        halos = _x_halos(split, u, axis=1)

        def body(x0, out):
            h = _haloed_slab(split, u, halos, x0, b, axis=1)  # (D, b+2, *rest+2)

            def ddx(k: int, axis: int) -> jax.Array:
                """0.5 (u_k(x + e_axis) - u_k(x - e_axis)) on the slab's cells."""
                inner = [slice(1, -1)] * d
                hi, lo = list(inner), list(inner)
                hi[axis], lo[axis] = slice(2, None), slice(0, -2)
                return 0.5 * (h[k][tuple(hi)] - h[k][tuple(lo)])

            if d == 2:
                return _put(out, ddx(1, 0) - ddx(0, 1), x0)
            w = jnp.stack(
                [ddx(2, 1) - ddx(1, 2), ddx(0, 2) - ddx(2, 0), ddx(1, 0) - ddx(0, 1)]
            )
            return _put(out, w, x0, 1)

        shape = tuple(local) if d == 2 else (3, *local)
        return _for_slabs(split, local[0], b, body, jnp.zeros(shape, u.dtype))

    out_spec = split.grid_spec(inner=0) if d == 2 else split.grid_spec(lead=1, inner=0)
    return split.shard(block, (split.grid_spec(lead=1, inner=0),), out_spec)(u)


def mesh_of(a: Any) -> Mesh | None:
    """The mesh a concrete array is split over, or ``None`` (one device, traced)."""
    sharding = getattr(a, "sharding", None)
    if isinstance(sharding, NamedSharding) and sharding.mesh.size > 1:
        return sharding.mesh
    return None
