"""Host transfer, slab by slab: device arrays to and from files in pieces.

A checkpoint or an export holds the state (or fields) once, on the device; the
functions here move it through the host a few MiB at a time:

* :func:`host_chunks` yields consecutive host pieces of any array (NumPy, single
  device or split over a mesh), viewing CPU-resident memory without copies;
* :func:`from_host_rows` builds a device array (split like a given sharding)
  from consecutive host pieces, writing each into place on its device;
* :func:`write_npy` / :func:`read_npy` stream one ``.npy`` member of a zip
  (the layout of ``numpy.savez``), with leaves stored as their raw bits
  (:func:`bits`), so 16-bit formats round-trip exactly.
"""

from __future__ import annotations

import functools
import math
import zipfile
from collections.abc import Iterable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = [
    "HOST_CHUNK_BYTES",
    "bits",
    "bits_dtype",
    "from_host_rows",
    "host_chunks",
    "read_npy",
    "read_to_device",
    "read_to_host",
    "write_npy",
]

#: Bytes of one host-side piece when arrays stream to or from files.
HOST_CHUNK_BYTES = 2**20


@functools.partial(jax.jit, static_argnames=("size", "axis"))
def _device_rows(a: jax.Array, start: jax.Array, *, size: int, axis: int) -> jax.Array:
    return lax.dynamic_slice_in_dim(a, start, size, axis)


def _local_rows(a: jax.Array, lo: int, hi: int, axis: int) -> np.ndarray:
    """Rows ``lo:hi`` along ``axis`` of a single-device array, on the host: a view
    without a copy where the device is the host's memory, else a sliced copy."""
    if next(iter(a.devices())).platform == "cpu":
        return np.asarray(a)[(slice(None),) * axis + (slice(lo, hi),)]
    return np.asarray(_device_rows(a, jnp.int32(lo), size=hi - lo, axis=axis))


def host_chunks(a: Any, axis: int = 0) -> Iterator[np.ndarray]:
    """Consecutive host pieces of an array along ``axis``, each about
    :data:`HOST_CHUNK_BYTES`: together they are the whole array, never held at once.

    NumPy arrays and arrays on CPU devices are viewed without copies; other
    device arrays are sliced on their device. A sharded array is read block by
    block (pieces that span several blocks are assembled on the host).
    """
    if not isinstance(a, jax.Array) or not a.is_fully_addressable:
        a = np.asarray(jax.device_get(a))
    n = a.shape[axis] if a.ndim else 1
    rows = max(1, HOST_CHUNK_BYTES // max(1, a.nbytes // max(n, 1)))
    if not isinstance(a, jax.Array) or a.ndim == 0:
        host = np.asarray(a)
        if host.ndim == 0:
            yield host
            return
        for lo in range(0, n, rows):
            yield host[(slice(None),) * axis + (slice(lo, min(n, lo + rows)),)]
        return
    blocks: dict[tuple, Any] = {}
    for shard in a.addressable_shards:  # one per distinct block (no replicas)
        key = tuple((s.start or 0, s.stop) for s in shard.index)
        blocks.setdefault(key, shard.data)
    spans = sorted({(k[axis][0], k[axis][1] or n) for k in blocks})
    for lo_block, hi_block in spans:
        group = {k: v for k, v in blocks.items() if k[axis][0] == lo_block}
        for lo in range(lo_block, hi_block, rows):
            hi = min(hi_block, lo + rows)
            if len(group) == 1 and len(blocks) == len(spans):
                yield _local_rows(
                    next(iter(group.values())), lo - lo_block, hi - lo_block, axis
                )
                continue
            shape = list(a.shape)
            shape[axis] = hi - lo
            piece = np.empty(shape, a.dtype)
            for key, data in group.items():
                where = [slice(start, stop) for start, stop in key]
                where[axis] = slice(None)
                piece[tuple(where)] = _local_rows(
                    data, lo - lo_block, hi - lo_block, axis
                )
            yield piece


@functools.partial(jax.jit, donate_argnums=0)
def _write_rows(buf: jax.Array, piece: jax.Array, start: tuple) -> jax.Array:
    return lax.dynamic_update_slice(buf, piece, start)


def from_host_rows(
    rows: Iterator[np.ndarray],
    shape: tuple[int, ...],
    dtype: np.dtype,
    sharding: jax.sharding.Sharding | None = None,
) -> jax.Array:
    """A device array filled from consecutive host pieces along axis 0 (e.g. read
    from a file), each written into place on its device(s), so the whole array is
    never on the host. ``sharding``: where the result lives (default device when
    ``None`` or a single device)."""
    zero = (jnp.int32(0),) * (len(shape) - 1)
    if sharding is None or len(sharding.device_set) == 1:
        targets = {None: (0, shape[0], tuple(slice(None) for _ in shape[1:]))}
    else:
        targets = {}
        for device, index in sharding.addressable_devices_indices_map(shape).items():
            rng = index[0].indices(shape[0])
            targets[device] = (rng[0], rng[1], index[1:])
    bufs = {}
    for device, (lo, hi, rest) in targets.items():
        local = (
            hi - lo,
            *(len(range(*r.indices(n))) for r, n in zip(rest, shape[1:], strict=True)),
        )
        bufs[device] = jnp.zeros(local, dtype, device=device)
    x = 0
    for piece in rows:
        n = piece.shape[0]
        for device, (lo, hi, rest) in targets.items():
            a, b = max(lo, x), min(hi, x + n)
            if a < b:
                part = np.ascontiguousarray(piece[(slice(a - x, b - x), *rest)])
                bufs[device] = _write_rows(
                    bufs[device],
                    jax.device_put(part, device),
                    (jnp.int32(a - lo), *zero),
                )
        x += n
    if None in bufs:
        return bufs[None]
    return jax.make_array_from_single_device_arrays(
        shape, sharding, list(bufs.values())
    )


def bits(a: np.ndarray) -> np.ndarray:
    """View an array as unsigned integers of the same width (a lossless carrier)."""
    if a.dtype == np.bool_:
        return a.astype(np.uint8)
    return a.view(np.dtype(f"u{a.dtype.itemsize}"))


def bits_dtype(dtype: Any) -> np.dtype:
    """The dtype :func:`bits` stores a dtype as."""
    dtype = np.dtype(dtype)
    return np.dtype(np.uint8) if dtype == np.bool_ else np.dtype(f"u{dtype.itemsize}")


def write_npy(
    zf: zipfile.ZipFile,
    name: str,
    dtype: np.dtype,
    shape: tuple[int, ...],
    pieces: Iterable[np.ndarray],
) -> None:
    """One ``name.npy`` member: the header, then the C-order pieces in turn."""
    with zf.open(name + ".npy", "w", force_zip64=True) as out:
        np.lib.format.write_array_header_1_0(
            out,
            {
                "descr": np.lib.format.dtype_to_descr(dtype),
                "fortran_order": False,
                "shape": tuple(shape),
            },
        )
        for piece in pieces:
            out.write(np.ascontiguousarray(piece).data)


def read_npy(src: Any, dtype: np.dtype, shape: tuple[int, ...]) -> Iterator[np.ndarray]:
    """The C-order pieces (along axis 0) of a ``.npy`` stream of :func:`bits`."""
    version = np.lib.format.read_magic(src)
    read_header = (
        np.lib.format.read_array_header_1_0
        if version == (1, 0)
        else np.lib.format.read_array_header_2_0
    )
    stored_shape, fortran, stored = read_header(src)
    if tuple(stored_shape) != shape or fortran or stored != bits_dtype(dtype):
        raise ValueError(
            f"leaf holds {stored} {tuple(stored_shape)}, the header says {dtype} "
            f"{shape}"
        )

    def carried(raw: bytes, count: tuple[int, ...]) -> np.ndarray:
        if len(raw) != stored.itemsize * math.prod(count):
            raise EOFError("the leaf's data ends early")
        bits = np.frombuffer(raw, stored).reshape(count)
        return bits.astype(np.bool_) if dtype == np.bool_ else bits.view(dtype)

    if not shape:
        yield carried(src.read(stored.itemsize), ())
        return
    row = stored.itemsize * math.prod(shape[1:])
    rows = max(1, HOST_CHUNK_BYTES // max(row, 1))
    for lo in range(0, shape[0], rows):
        n = min(rows, shape[0] - lo)
        yield carried(src.read(n * row), (n, *shape[1:]))


def read_to_host(
    pieces: Iterator[np.ndarray], shape: tuple[int, ...], dtype: np.dtype
) -> np.ndarray:
    """A leaf read piece by piece into one NumPy array."""
    out = np.empty(shape, dtype)
    if not shape:
        return next(pieces).reshape(())
    x = 0
    for piece in pieces:
        out[x : x + len(piece)] = piece
        x += len(piece)
    return out


def read_to_device(
    pieces: Iterator[np.ndarray],
    shape: tuple[int, ...],
    dtype: np.dtype,
    sharding: Any,
) -> jax.Array:
    """A leaf read piece by piece into a device array: split like ``sharding``
    when that spans several devices, else on the default device (uncommitted,
    as a freshly built state)."""
    if sharding is not None and len(sharding.device_set) == 1:
        sharding = None
    if not shape:
        value = jax.numpy.asarray(next(pieces))
        return value if sharding is None else jax.device_put(value, sharding)
    return from_host_rows(pieces, shape, dtype, sharding)
