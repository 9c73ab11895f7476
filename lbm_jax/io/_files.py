"""Persistence and export: simulation-state checkpoints and VTK image data.

Checkpoints (:func:`save_state` / :func:`load_state`) store any pytree of arrays
(the solver state, whatever its structure) in one ``.npz`` file together with a
JSON metadata record. Every leaf is stored as its raw bits, so 16-bit storage
formats (float16, bfloat16, posit codes in uint16) come back bit-identical and a
run continued from a checkpoint reproduces an uninterrupted run exactly.

:func:`write_vti` writes fields as VTK XML ``ImageData`` (``.vti``), readable by
ParaView and VisIt: point data on a uniform grid with unit spacing, x the fastest
axis, binary payloads base64-encoded inline. :func:`write_vtp` writes a triangle
mesh (e.g. an immersed-boundary membrane) as VTK XML ``PolyData`` (``.vtp``) in the
same encoding, with optional per-node and per-triangle data.

>>> import tempfile, numpy as np, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> save_state(d / "s.npz", {"f": np.arange(3.0)}, metadata={"step": 7})
>>> state, meta = load_state(d / "s.npz")
>>> state["f"].tolist(), meta["step"]
([0.0, 1.0, 2.0], 7)
"""

from __future__ import annotations

import base64
import json
import math
import os
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any
from xml.sax.saxutils import quoteattr

import jax
import ml_dtypes  # noqa: F401  (registers bfloat16 & co. as NumPy dtype names)
import numpy as np

from lbm_jax.io._outputs import fsync_directory
from lbm_jax.io._transfer import (
    bits,
    bits_dtype,
    host_chunks,
    read_npy,
    read_to_device,
    read_to_host,
    write_npy,
)

__all__ = [
    "CorruptCheckpointError",
    "load_state",
    "read_metadata",
    "save_state",
    "write_vti",
    "write_vtp",
]

_FORMAT = "lbm_jax.checkpoint/1"


class CorruptCheckpointError(ValueError):
    """A checkpoint file cannot be read (truncated, its bytes damaged, or written
    in another checkpoint format)."""


def _key_name(key_path: tuple[Any, ...]) -> str:
    """A readable leaf name: dict keys, attribute names and indices joined by '/'."""
    parts = []
    for k in key_path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:
            parts.append(str(k))
    return "/".join(parts) or "leaf"


def save_state(
    path: str | os.PathLike[str],
    state: Any,
    *,
    metadata: Mapping[str, Any] | None = None,
) -> None:
    """Write a pytree of arrays and a JSON metadata record to ``path`` (``.npz``).

    Args:
        path: Destination file; written atomically (a temporary file, flushed to
            disk with ``fsync``, then renamed over ``path``), so a process killed
            while saving leaves either the old file or the new one.
        state: Any pytree whose leaves are arrays or scalars (e.g. the solver
            state); leaves are fetched to the host.
        metadata: JSON-serialisable extra information (step count, parameters).

    Raises:
        TypeError: If ``metadata`` is not JSON-serialisable.
    """
    path = Path(path)
    leaves_with_paths, treedef = jax.tree_util.tree_flatten_with_path(state)
    leaves = []
    leaves_info = []
    for key_path, leaf in leaves_with_paths:
        if not isinstance(leaf, jax.Array):
            leaf = np.asarray(leaf)
        leaves.append(leaf)
        leaves_info.append(
            {
                "path": _key_name(key_path),
                "dtype": np.dtype(leaf.dtype).name,
                "shape": list(leaf.shape),
            }
        )
    try:
        header = json.dumps(
            {
                "format": _FORMAT,
                "treedef": str(treedef),
                "leaves": leaves_info,
                "metadata": dict(metadata or {}),
            }
        )
    except TypeError as err:
        raise TypeError(
            f"Checkpoint metadata must be JSON-serialisable: {err}. Convert arrays "
            "to lists or floats before saving."
        ) from err
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        _write_leaves(tmp, leaves, header)
        os.replace(tmp, path)
    finally:  # a failed save (a full disk, say) leaves no partial file behind
        tmp.unlink(missing_ok=True)
    fsync_directory(path.parent)


def _write_leaves(path: Path, leaves: list[Any], header: str) -> None:
    """The checkpoint file: the layout of ``numpy.savez`` (an uncompressed zip of
    ``.npy`` files), written one slab at a time, so that no leaf is ever copied
    to the host whole; flushed to disk before it returns."""
    with open(path, "wb") as fh:
        with zipfile.ZipFile(fh, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
            for i, leaf in enumerate(leaves):
                write_npy(
                    zf,
                    f"leaf_{i}",
                    bits_dtype(leaf.dtype),
                    leaf.shape,
                    (bits(c) for c in host_chunks(leaf)),
                )
            raw = np.frombuffer(header.encode("utf-8"), dtype=np.uint8)
            write_npy(zf, "header", raw.dtype, raw.shape, [raw])
        fh.flush()
        os.fsync(fh.fileno())


def read_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The metadata record of a checkpoint, without reading its arrays.

    Raises:
        FileNotFoundError: If ``path`` does not exist.
        ValueError: If the file is not a readable checkpoint (e.g. truncated).
    """
    return _header(path)["metadata"]


def _header(path: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No checkpoint at {str(path)!r}.")
    with open(path, "rb") as fh:
        if fh.read(4) != b"PK\x03\x04":  # every .npz is a zip archive
            raise CorruptCheckpointError(
                f"{str(path)!r} is not a readable checkpoint (not an .npz archive); "
                "it may have been truncated or overwritten."
            )
    try:
        with open(path, "rb") as fh, np.load(fh, allow_pickle=False) as data:
            if "header" not in data.files:
                raise CorruptCheckpointError(
                    f"{str(path)!r} is not an lbm_jax checkpoint (no header); write "
                    "checkpoints with lbm_jax.save_state."
                )
            header = json.loads(data["header"].tobytes().decode("utf-8"))
    except (OSError, EOFError, zipfile.BadZipFile, UnicodeDecodeError) as err:
        raise CorruptCheckpointError(
            f"{str(path)!r} is not a readable checkpoint ({type(err).__name__}: "
            f"{err}); it may have been truncated."
        ) from err
    if not isinstance(header, dict) or header.get("format") != _FORMAT:
        found = header.get("format") if isinstance(header, dict) else None
        raise CorruptCheckpointError(
            f"{str(path)!r} has checkpoint format {found!r}, expected "
            f"{_FORMAT!r}; it was written by another version of lbm_jax."
        )
    missing = sorted({"treedef", "leaves", "metadata"} - set(header))
    if missing:
        raise CorruptCheckpointError(
            f"{str(path)!r} is not a readable checkpoint: its header lacks "
            f"{', '.join(missing)}; it may have been damaged."
        )
    return header


def load_state(
    path: str | os.PathLike[str], like: Any = None
) -> tuple[Any, dict[str, Any]]:
    """Read a checkpoint written by :func:`save_state`.

    Args:
        path: The ``.npz`` file.
        like: Optional template pytree (e.g. a freshly initialised state). When
            given, the loaded leaves are put back into its structure (NamedTuples and
            dataclasses included) and each leaf's shape and dtype must match; the
            result holds ``jax.Array`` leaves. Without it, a dict from leaf name
            (dict keys, attribute names and indices joined by ``/``, e.g. ``"f"``
            for an ``LBMState``'s populations) to NumPy array is returned.

    Returns:
        ``(state, metadata)``.

    Raises:
        FileNotFoundError: If ``path`` does not exist.
        ValueError: If the file is not a (readable) checkpoint or does not match
            ``like``.
    """
    header = _header(path)
    infos = header["leaves"]
    metadata = header["metadata"]
    if like is not None:
        like_leaves, treedef = jax.tree_util.tree_flatten(like)
        if len(like_leaves) != len(infos) or str(treedef) != header["treedef"]:
            raise ValueError(
                f"Checkpoint {str(path)!r} holds a pytree {header['treedef']} that "
                f"does not match the template {treedef}; load it with the state "
                "type it was saved from."
            )
        for info, want in zip(infos, like_leaves, strict=True):
            want_shape = tuple(
                np.shape(want) if not hasattr(want, "shape") else want.shape
            )
            want_dtype = np.dtype(
                want.dtype if hasattr(want, "dtype") else jax.numpy.asarray(want).dtype
            )
            got_shape, got_dtype = tuple(info["shape"]), np.dtype(info["dtype"])
            if want_shape != got_shape or want_dtype != got_dtype:
                raise ValueError(
                    f"Checkpoint leaf {info['path']} has shape {got_shape} and dtype "
                    f"{got_dtype}, but the template expects {want_shape} and "
                    f"{want_dtype}; was it saved for another grid or storage policy?"
                )
    leaves = []
    try:
        with open(path, "rb") as fh, zipfile.ZipFile(fh) as zf:
            for i, info in enumerate(infos):
                dtype = np.dtype(info["dtype"])
                shape = tuple(info["shape"])
                with zf.open(f"leaf_{i}.npy") as src:
                    pieces = read_npy(src, dtype, shape)
                    if like is None:
                        leaves.append(read_to_host(pieces, shape, dtype))
                    else:
                        sharding = getattr(like_leaves[i], "sharding", None)
                        leaves.append(read_to_device(pieces, shape, dtype, sharding))
    except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile) as err:
        raise CorruptCheckpointError(
            f"{str(path)!r} is not a readable checkpoint ({type(err).__name__}: "
            f"{err}); it may have been truncated."
        ) from err
    if like is None:
        return {
            info["path"]: a for info, a in zip(infos, leaves, strict=True)
        }, metadata
    return jax.tree_util.tree_unflatten(treedef, leaves), metadata


_VTK_TYPES = {
    np.dtype(np.float32): "Float32",
    np.dtype(np.float64): "Float64",
    np.dtype(np.int32): "Int32",
    np.dtype(np.int64): "Int64",
    np.dtype(np.uint8): "UInt8",
    np.dtype(np.int8): "Int8",
    np.dtype(np.uint16): "UInt16",
    np.dtype(np.int16): "Int16",
    np.dtype(np.uint32): "UInt32",
    np.dtype(np.uint64): "UInt64",
}


def _storable_dtype(dtype: Any) -> np.dtype:
    """A type VTK reads: other floats as float32, bools as uint8."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f" and dtype not in (np.float32, np.float64):
        return np.dtype(np.float32)
    if dtype == np.bool_:
        return np.dtype(np.uint8)
    return dtype


def _storable(a: np.ndarray) -> np.ndarray:
    """``a`` in a type VTK reads, little-endian (a copy only where needed)."""
    return a.astype(_storable_dtype(a.dtype).newbyteorder("<"), copy=False)


def _data_array(
    pieces: Iterable[np.ndarray],
    nbytes: int,
    dtype: np.dtype,
    ncomp: int,
    name: str | None,
    indent: str,
) -> Iterator[str]:
    """One binary ``<DataArray>`` element, as consecutive text pieces.

    ``pieces`` are the payload in VTK's order (x fastest, components
    innermost), ``nbytes`` long in all; the payload is base64-encoded after its
    UInt64 length, three bytes at a time, so the pieces of text join to exactly
    the encoding of the whole.
    """
    named = "" if name is None else f" Name={quoteattr(name)}"
    yield (
        f'{indent}<DataArray type="{_VTK_TYPES[np.dtype(dtype)]}"{named} '
        f'NumberOfComponents="{ncomp}" format="binary">\n{indent}  '
    )
    carry = np.array([nbytes], dtype="<u8").tobytes()
    for piece in pieces:
        data = carry + np.ascontiguousarray(_storable(piece)).tobytes()
        cut = len(data) - len(data) % 3
        yield base64.b64encode(data[:cut]).decode("ascii")
        carry = data[cut:]
    yield base64.b64encode(carry).decode("ascii") + f"\n{indent}</DataArray>\n"


def _data_text(flat: np.ndarray, ncomp: int, name: str | None, indent: str) -> str:
    """:func:`_data_array` of one in-memory array, as one string."""
    flat = _storable(flat)
    return "".join(_data_array([flat], flat.nbytes, flat.dtype, ncomp, name, indent))


def write_vti(
    path: str | os.PathLike[str],
    point_data: Mapping[str, Any],
    *,
    spacing: float = 1.0,
    origin: tuple[float, ...] | None = None,
) -> Path:
    """Write fields as a VTK XML ImageData file (``.vti``).

    Fields are written slab by slab (along the last grid axis): device arrays
    are never copied to the host whole, and no full-size reordered copy is made.

    Args:
        path: Destination; ``.vti`` is appended if missing.
        point_data: Name -> array. A scalar field has the grid shape ``(X, Y[, Z])``;
            a vector field has shape ``(D, X, Y[, Z])`` with ``D`` equal to the
            number of grid dimensions (2-D vectors get a zero z component, as
            ParaView expects three). All fields must share one grid. Floating
            fields other than float32/float64 (e.g. float16) are written as float32.
        spacing: Grid spacing (same on all axes).
        origin: Grid origin, default all zeros.

    Returns:
        The path written.

    Raises:
        ValueError: If there are no fields, or shapes disagree or are not 2-D/3-D.
    """
    if not point_data:
        raise ValueError("write_vti needs at least one field, got an empty mapping.")
    path = Path(path)
    if path.suffix != ".vti":
        path = path.with_name(path.name + ".vti")
    arrays = {
        name: a if isinstance(a, jax.Array) else np.asarray(a)
        for name, a in point_data.items()
    }
    ndims = {a.ndim for a in arrays.values()}
    if len(ndims) == 2 and max(ndims) == min(ndims) + 1:
        # Scalars and vectors together: the scalars give the grid.
        grid = next(a.shape for a in arrays.values() if a.ndim == min(ndims))
    elif len(ndims) == 1:
        # Only one kind: vectors have D = ndim - 1 leading components.
        first = next(iter(arrays.values()))
        is_vector = first.ndim in (3, 4) and first.shape[0] == first.ndim - 1
        grid = first.shape[1:] if is_vector else first.shape
    else:
        grid = ()
    grid = tuple(grid)
    if len(grid) not in (2, 3):
        raise ValueError(
            "Fields must share one 2-D or 3-D grid: scalars of shape (X, Y[, Z]) "
            "and vectors of shape (D, X, Y[, Z]); got shapes "
            f"{ {name: a.shape for name, a in arrays.items()} }."
        )
    for name, a in arrays.items():
        if a.shape not in (grid, (len(grid), *grid)):
            raise ValueError(
                f"Field {name!r} has shape {a.shape}; on the grid {grid} a "
                f"scalar must have shape {grid} and a vector {(len(grid), *grid)}."
            )
    dims = grid + (1,) * (3 - len(grid))
    if origin is None:
        origin = (0.0,) * 3
    origin = tuple(float(o) for o in origin) + (0.0,) * (3 - len(origin))
    extent = " ".join(f"0 {n - 1}" for n in dims)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="ascii") as fh:
        fh.write(
            '<?xml version="1.0"?>\n'
            '<VTKFile type="ImageData" version="1.0" byte_order="LittleEndian" '
            'header_type="UInt64">\n'
            f'  <ImageData WholeExtent="{extent}" '
            f'Origin="{" ".join(repr(o) for o in origin)}" '
            f'Spacing="{spacing!r} {spacing!r} {spacing!r}">\n'
            f'    <Piece Extent="{extent}">\n'
            "      <PointData>\n"
        )
        for name, a in arrays.items():
            dtype = _storable_dtype(a.dtype)
            ncomp = 1 if a.shape == grid else 3
            nbytes = math.prod(dims) * ncomp * dtype.itemsize
            pieces = _vtk_order(a, len(grid), ncomp > 1)
            fh.writelines(_data_array(pieces, nbytes, dtype, ncomp, name, " " * 8))
        fh.write("      </PointData>\n    </Piece>\n  </ImageData>\n</VTKFile>\n")
    return path


def _vtk_order(a: Any, ndim: int, vector: bool) -> Iterator[np.ndarray]:
    """Pieces of a field in VTK's point order (x fastest), slab by slab along the
    last grid axis; vectors with their (three) components innermost."""
    for piece in host_chunks(a, axis=a.ndim - 1):
        if not vector:
            yield piece.transpose()
            continue
        out = piece.transpose((*range(ndim, 0, -1), 0))
        if ndim == 2:  # ParaView expects three components
            out = np.concatenate([out, np.zeros_like(out[..., :1])], axis=-1)
        yield out


def _mesh_data(
    data: Mapping[str, Any] | None, count: int, where: str
) -> tuple[str, ...]:
    """``<DataArray>`` elements of per-point or per-cell arrays, ``(n,)``/``(n, 3)``."""
    pieces = []
    for name, a in (data or {}).items():
        a = _storable(np.asarray(jax.device_get(a)))
        if a.shape not in ((count,), (count, 3)):
            raise ValueError(
                f"{where} array {name!r} has shape {a.shape}; with {count} "
                f"entries a scalar must have shape ({count},) and a vector "
                f"({count}, 3)."
            )
        pieces.append(_data_text(a.ravel(), a.size // count, name, " " * 8))
    return tuple(pieces)


def write_vtp(
    path: str | os.PathLike[str],
    points: Any,
    faces: Any,
    point_data: Mapping[str, Any] | None = None,
    cell_data: Mapping[str, Any] | None = None,
) -> Path:
    """Write a triangle mesh as a VTK XML PolyData file (``.vtp``).

    Args:
        path: Destination; ``.vtp`` is appended if missing.
        points: Node positions, shape ``(N, 3)``. Floating types other than
            float32/float64 (and integers) are written as float32.
        faces: Triangles as node indices, shape ``(F, 3)``, integers in
            ``[0, N)``; written as ``Int64`` connectivity with offsets
            ``3, 6, ..., 3F``.
        point_data: Name -> per-node array, scalar ``(N,)`` or vector ``(N, 3)``.
        cell_data: Name -> per-triangle array, scalar ``(F,)`` or vector
            ``(F, 3)``. In both, bools are written as UInt8 and floats other than
            float32/float64 as float32.

    Returns:
        The path written.

    Raises:
        ValueError: If a shape is wrong or a face refers to a missing node.
        TypeError: If ``faces`` does not hold integers.

    >>> import tempfile, numpy as np, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> tet = np.array([[0.0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]])
    >>> faces = [[0, 2, 1], [0, 1, 3], [0, 3, 2], [1, 2, 3]]
    >>> write_vtp(d / "tet", tet, faces, point_data={"z": tet[:, 2]}).name
    'tet.vtp'
    """
    path = Path(path)
    if path.suffix != ".vtp":
        path = path.with_name(path.name + ".vtp")
    xyz = np.asarray(jax.device_get(points))
    tri = np.asarray(jax.device_get(faces))
    if xyz.ndim != 2 or xyz.shape[1] != 3:
        raise ValueError(f"points must have shape (N, 3), got {xyz.shape}.")
    if tri.ndim != 2 or tri.shape[1] != 3:
        raise ValueError(f"faces must have shape (F, 3) (triangles), got {tri.shape}.")
    if tri.size and not np.issubdtype(tri.dtype, np.integer):
        raise TypeError(f"faces must hold integer node indices, got {tri.dtype}.")
    if tri.size and (tri.min() < 0 or tri.max() >= len(xyz)):
        raise ValueError(
            f"faces refer to nodes {tri.min()}..{tri.max()}, but there are "
            f"{len(xyz)} points (indices 0..{len(xyz) - 1})."
        )
    if xyz.dtype not in (np.float32, np.float64):
        xyz = xyz.astype(np.float32)
    n_faces = len(tri)
    connectivity = tri.astype(np.int64).ravel()
    offsets = 3 * np.arange(1, n_faces + 1, dtype=np.int64)
    point_pieces = _mesh_data(point_data, len(xyz), "point_data")
    cell_pieces = _mesh_data(cell_data, n_faces, "cell_data")
    text = (
        '<?xml version="1.0"?>\n'
        '<VTKFile type="PolyData" version="1.0" byte_order="LittleEndian" '
        'header_type="UInt64">\n'
        "  <PolyData>\n"
        f'    <Piece NumberOfPoints="{len(xyz)}" NumberOfVerts="0" '
        f'NumberOfLines="0" NumberOfStrips="0" NumberOfPolys="{n_faces}">\n'
        "      <PointData>\n" + "".join(point_pieces) + "      </PointData>\n"
        "      <CellData>\n" + "".join(cell_pieces) + "      </CellData>\n"
        "      <Points>\n"
        + _data_text(xyz.ravel(), 3, None, " " * 8)
        + "      </Points>\n"
        "      <Polys>\n"
        + _data_text(connectivity, 1, "connectivity", " " * 8)
        + _data_text(offsets, 1, "offsets", " " * 8)
        + "      </Polys>\n"
        "    </Piece>\n"
        "  </PolyData>\n"
        "</VTKFile>\n"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="ascii")
    return path
