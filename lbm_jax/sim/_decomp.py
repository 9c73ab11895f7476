"""Domain decomposition: the grid split into blocks over a device mesh.

A :class:`Decomposition` splits the grid into ``nx x ny [x nz]`` equal blocks, one
per device of a ``jax.sharding.Mesh`` whose axes are named after the grid axes
(``"x"``, ``"y"``, ``"z"``). Each device runs the step on its own block inside
``jax.shard_map``; before every step the blocks swap one-cell ghost layers with
their neighbours by ``jax.lax.ppermute``, in the storage format (never decoded),
axis by axis so that edge and corner values arrive too (see :func:`exchange`).
Per-cell arrays (boundary masks, force fields) are split the same way, so walls,
moving walls, fixed cells and forces that cross a block border need nothing else.

The mesh may span several processes (``jax.distributed.initialize``): arrays
placed by :meth:`Decomposition.place` are global arrays whose blocks live on the
processes that own them, and :func:`to_host` fetches any global array to NumPy on
every process.

The slab-wise read-outs (:mod:`lbm_jax.sim._slabs`) build a decomposition from the
mesh an array or a simulation lives on (:meth:`Decomposition.from_mesh`); there
``mesh`` may be ``None`` (one device: :meth:`Decomposition.shard` runs a function
as is and :meth:`Decomposition.ghost` wraps around periodically).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from lbm_jax.core._validation import GRID_AXES, check_devices
from lbm_jax.step._layout import Halos

__all__ = ["Decomposition", "decompose", "exchange", "halo_bytes", "to_host"]


@dataclasses.dataclass(frozen=True, eq=False)
class Decomposition:
    """A grid split into blocks over a device mesh.

    Attributes:
        mesh: The device mesh; its axis names are among ``"x"``, ``"y"``, ``"z"``
            (``None``: one device, see :meth:`from_mesh`).
        splits: Blocks per grid axis (1 where an axis is not split).
        shape: Global grid size.
    """

    mesh: Mesh | None
    splits: tuple[int, ...]
    shape: tuple[int, ...]

    @classmethod
    def from_mesh(cls, mesh: Mesh | None, shape: tuple[int, ...]) -> Decomposition:
        """The decomposition of a grid laid out over ``mesh`` (``None``: one device).

        Grid axes the mesh does not name are not split.
        """
        names = GRID_AXES[: len(shape)]
        if mesh is None:
            splits = (1,) * len(shape)
        else:
            splits = tuple(mesh.shape.get(a, 1) for a in names)
        return cls(mesh=mesh, splits=splits, shape=tuple(shape))

    @property
    def axis_names(self) -> tuple[str | None, ...]:
        """The mesh axis of each grid axis, ``None`` where the mesh has none."""
        names = GRID_AXES[: len(self.shape)]
        if self.mesh is None:
            return (None,) * len(names)
        return tuple(a if a in self.mesh.axis_names else None for a in names)

    @property
    def local_shape(self) -> tuple[int, ...]:
        """Grid size of one block."""
        return tuple(n // s for n, s in zip(self.shape, self.splits, strict=True))

    def grid_spec(self, lead: int = 0, inner: int = 1) -> PartitionSpec:
        """Spec of an array ``(*lead, X, *inner, *rest)``: split along the grid.

        The population layout ``(X, Q, *rest)`` is ``lead=0, inner=1``; a
        ``(D, *shape)`` field is ``lead=1, inner=0``.
        """
        names = self.axis_names
        return PartitionSpec(*[None] * lead, names[0], *[None] * inner, *names[1:])

    def place(self, tree: Any, specs: Any) -> Any:
        """Put a tree of arrays on the mesh, each leaf split by its spec.

        Works for meshes that span several processes: every process passes the
        same (global) values and keeps only its own blocks.
        """

        def put(x: Any, spec: PartitionSpec) -> jax.Array:
            sharding = NamedSharding(self.mesh, spec)
            if sharding.is_fully_addressable:
                return jax.device_put(x, sharding)
            host = np.asarray(x)
            return jax.make_array_from_callback(host.shape, sharding, host.__getitem__)

        return jax.tree.map(put, tree, specs)

    def shard(
        self, fn: Callable[..., Any], in_specs: tuple[Any, ...], out_specs: Any
    ) -> Callable[..., Any]:
        """``fn`` run per block on the mesh (``jax.shard_map``); as is on one device."""
        if self.mesh is None:
            return fn
        return jax.shard_map(fn, mesh=self.mesh, in_specs=in_specs, out_specs=out_specs)

    def total(self, x: jax.Array) -> jax.Array:
        """Sum of a per-block value over all blocks (inside :meth:`shard`)."""
        axes = tuple(a for a in self.axis_names if a is not None)
        return lax.psum(x, axes) if axes else x

    def ghost(self, a: jax.Array, axis: int, grid_axis: int) -> jax.Array:
        """``a`` with one ghost layer on each side of array axis ``axis`` (inside
        :meth:`shard`): the neighbouring blocks' edge layers along grid axis
        ``grid_axis``, or the periodic wrap when that axis is not split."""
        size = a.shape[axis]
        hi = lax.slice_in_dim(a, size - 1, size, axis=axis)
        lo = lax.slice_in_dim(a, 0, 1, axis=axis)
        n = self.splits[grid_axis]
        if n > 1:
            up, down = _ring(n)
            hi = lax.ppermute(hi, GRID_AXES[grid_axis], up)
            lo = lax.ppermute(lo, GRID_AXES[grid_axis], down)
        return jnp.concatenate([hi, a, lo], axis=axis)

    def halo_bytes(self, q: int, itemsize: int) -> int:
        """Bytes one block sends per step (see :func:`halo_bytes`)."""
        return halo_bytes(self.local_shape, self.splits, q, itemsize)


def halo_bytes(
    local_shape: tuple[int, ...], splits: tuple[int, ...], q: int, itemsize: int
) -> int:
    """Bytes one block sends per step: whole ghost layers of ``q`` values.

    Each split axis sends two layers (one to each neighbour), extended by one cell
    at both ends along the axes exchanged before it (see :func:`exchange`); an
    axis that is not split sends nothing.

    Args:
        local_shape: Grid size of one block.
        splits: Blocks per grid axis.
        q: Values per cell (the lattice's directions).
        itemsize: Bytes per stored value.

    >>> halo_bytes((64, 128, 128), (2, 1, 1), 19, 4)  # 2 x-planes, 128^2 x 19 x 4 B
    2490368
    """
    ext = list(local_shape)
    total = 0
    for a, n in enumerate(splits):
        if n > 1:
            total += 2 * q * math.prod(ext[:a] + [1] + ext[a + 1 :])
        if n > 1 or (a == 0 and any(s > 1 for s in splits[1:])):
            ext[a] += 2
    return total * itemsize


def decompose(devices: object, shape: tuple[int, ...]) -> Decomposition | None:
    """The decomposition ``devices`` asks for, or ``None`` for one device.

    Args:
        devices: ``None``; an int (split x); a tuple of blocks per grid axis, such
            as ``(2, 2, 1)``; or a ``jax.sharding.Mesh`` with axes named ``"x"``,
            ``"y"``, ``"z"`` (see :func:`lbm_jax.core._validation.check_devices`).
            Ints and tuples use the first devices of ``jax.devices()`` (every
            process's, under ``jax.distributed``), x-major.
        shape: Global grid size.

    Raises:
        ValueError, TypeError: As :func:`~lbm_jax.core._validation.check_devices`.
    """
    splits = check_devices(devices, shape)
    if math.prod(splits) == 1:
        return None
    if isinstance(devices, Mesh):
        mesh = devices
    else:
        grid = np.array(jax.devices()[: math.prod(splits)]).reshape(splits)
        mesh = Mesh(grid, GRID_AXES[: len(shape)])
    return Decomposition(mesh=mesh, splits=splits, shape=tuple(shape))


def exchange(f: jax.Array, decomp: Decomposition) -> Halos:
    """Ghost layers of this block from its neighbours (inside ``shard_map``).

    Axis by axis (x, then y, then z), each block sends its two edge layers along
    that axis, extended by the ghost layers it already received along the
    earlier axes (or by its periodic wrap in x), so that edge and corner cells
    travel with the faces. Layers are sent in the storage format.

    Args:
        f: This block's populations, population layout ``(X, Q, *rest)``.
        decomp: The decomposition.

    Returns:
        One entry per grid axis, ``None`` for an axis that is not split, else the
        ``(low, high)`` layers :func:`lbm_jax.step._xla.make_step_into` takes.
    """
    d = len(decomp.splits)
    array_axis = (0, *range(2, d + 1))
    halos: list[tuple[jax.Array, jax.Array] | None] = []
    for a, n in enumerate(decomp.splits):
        if n == 1:
            halos.append(None)
            continue
        k = array_axis[a]
        size = f.shape[k]
        faces = []
        for lo in (size - 1, 0):  # the edge sent up, the edge sent down
            face = lax.slice_in_dim(f, lo, lo + 1, axis=k)
            for b in range(a):
                kb = array_axis[b]
                if halos[b] is not None:
                    ends = [lax.slice_in_dim(g, lo, lo + 1, axis=k) for g in halos[b]]
                elif b == 0:  # x not split: its periodic wrap
                    nb = face.shape[0]
                    ends = [face[nb - 1 :], face[:1]]
                else:  # not split: rolled inside the block
                    continue
                face = jnp.concatenate([ends[0], face, ends[1]], axis=kb)
            faces.append(face)
        name = GRID_AXES[a]
        up, down = _ring(n)
        halos.append(
            (lax.ppermute(faces[0], name, up), lax.ppermute(faces[1], name, down))
        )
    return tuple(halos)


def _ring(n: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """``ppermute`` pairs of ``n`` blocks in a periodic ring: each block to the next
    (up) and each block to the previous (down)."""
    return [(i, (i + 1) % n) for i in range(n)], [(i, (i - 1) % n) for i in range(n)]


def to_host(tree: Any) -> Any:
    """Fetch arrays to NumPy on every process, whole (global arrays gathered).

    On one process this is ``jax.device_get``; when an array's blocks live on
    other processes, every process must call it (a collective).

    >>> import jax.numpy as jnp
    >>> to_host(jnp.arange(3)).tolist()
    [0, 1, 2]
    """

    def fetch(x: Any) -> Any:
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            from jax.experimental import multihost_utils

            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return jax.device_get(x)

    return jax.tree.map(fetch, tree)
