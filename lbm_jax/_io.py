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
import os
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from xml.sax.saxutils import quoteattr

import jax
import ml_dtypes  # noqa: F401  (registers bfloat16 & co. as NumPy dtype names)
import numpy as np

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
    """A checkpoint file cannot be read (truncated, or its bytes damaged)."""


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


def _bits(a: np.ndarray) -> np.ndarray:
    """View an array as unsigned integers of the same width (a lossless carrier)."""
    if a.dtype == np.bool_:
        return a.astype(np.uint8)
    return a.view(np.dtype(f"u{a.dtype.itemsize}"))


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
    arrays: dict[str, np.ndarray] = {}
    leaves_info = []
    for i, (key_path, leaf) in enumerate(leaves_with_paths):
        a = np.asarray(jax.device_get(leaf))
        arrays[f"leaf_{i}"] = _bits(a)
        leaves_info.append(
            {
                "path": _key_name(key_path),
                "dtype": a.dtype.name,
                "shape": list(a.shape),
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
    arrays["header"] = np.frombuffer(header.encode("utf-8"), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        np.savez(fh, **arrays)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_directory(path.parent)


def _fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable (where the platform allows it)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. directories cannot be opened on Windows
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
                raise ValueError(
                    f"{str(path)!r} is not an lbm_jax checkpoint (no header); write "
                    "checkpoints with lbm_jax.save_state."
                )
            header = json.loads(data["header"].tobytes().decode("utf-8"))
    except (OSError, EOFError, zipfile.BadZipFile, json.JSONDecodeError) as err:
        raise CorruptCheckpointError(
            f"{str(path)!r} is not a readable checkpoint ({type(err).__name__}: "
            f"{err}); it may have been truncated."
        ) from err
    if header.get("format") != _FORMAT:
        raise ValueError(
            f"{str(path)!r} has checkpoint format {header.get('format')!r}, "
            f"expected {_FORMAT!r}."
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
    try:
        with open(path, "rb") as fh, np.load(fh, allow_pickle=False) as data:
            leaves = []
            for i, info in enumerate(header["leaves"]):
                dtype = np.dtype(info["dtype"])
                raw = data[f"leaf_{i}"]
                a = raw.astype(np.bool_) if dtype == np.bool_ else raw.view(dtype)
                leaves.append(a.reshape(info["shape"]))
    except (OSError, EOFError, KeyError, zipfile.BadZipFile) as err:
        raise CorruptCheckpointError(
            f"{str(path)!r} is not a readable checkpoint ({type(err).__name__}: "
            f"{err}); it may have been truncated."
        ) from err
    metadata = header["metadata"]
    if like is None:
        state = {
            info["path"]: a for info, a in zip(header["leaves"], leaves, strict=True)
        }
        return state, metadata
    like_leaves, treedef = jax.tree_util.tree_flatten(like)
    if len(like_leaves) != len(leaves) or str(treedef) != header["treedef"]:
        raise ValueError(
            f"Checkpoint {str(path)!r} holds a pytree {header['treedef']} that does "
            f"not match the template {treedef}; load it with the state type it was "
            "saved from."
        )
    for info, want, got in zip(header["leaves"], like_leaves, leaves, strict=True):
        want_shape = tuple(np.shape(want))
        want_dtype = np.dtype(jax.numpy.asarray(want).dtype)
        if want_shape != got.shape or want_dtype != got.dtype:
            raise ValueError(
                f"Checkpoint leaf {info['path']} has shape {got.shape} and dtype "
                f"{got.dtype}, but the template expects {want_shape} and "
                f"{want_dtype}; was it saved for another grid or storage policy?"
            )
    return jax.tree_util.tree_unflatten(
        treedef, [jax.numpy.asarray(a) for a in leaves]
    ), metadata


def _vtk_type(a: np.ndarray) -> str:
    table = {
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
    return table[a.dtype]


def _storable(a: np.ndarray) -> np.ndarray:
    """``a`` in a type VTK reads: other floats as float32, bools as uint8."""
    if a.dtype.kind == "f" and a.dtype not in (np.float32, np.float64):
        return a.astype(np.float32)
    if a.dtype == np.bool_:
        return a.astype(np.uint8)
    return a


def _encode(a: np.ndarray) -> str:
    payload = np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes()
    header = np.array([len(payload)], dtype="<u8").tobytes()
    return base64.b64encode(header + payload).decode("ascii")


def _data_array(flat: np.ndarray, ncomp: int, name: str | None, indent: str) -> str:
    """One binary ``<DataArray>`` element (``flat`` in VTK's component order)."""
    named = "" if name is None else f" Name={quoteattr(name)}"
    return (
        f'{indent}<DataArray type="{_vtk_type(flat)}"{named} '
        f'NumberOfComponents="{ncomp}" format="binary">\n'
        f"{indent}  {_encode(flat)}\n"
        f"{indent}</DataArray>\n"
    )


def write_vti(
    path: str | os.PathLike[str],
    point_data: Mapping[str, Any],
    *,
    spacing: float = 1.0,
    origin: tuple[float, ...] | None = None,
) -> Path:
    """Write fields as a VTK XML ImageData file (``.vti``).

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
    arrays = {name: np.asarray(jax.device_get(a)) for name, a in point_data.items()}
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
    if len(grid) not in (2, 3):
        raise ValueError(
            "Fields must share one 2-D or 3-D grid: scalars of shape (X, Y[, Z]) "
            "and vectors of shape (D, X, Y[, Z]); got shapes "
            f"{ {name: a.shape for name, a in arrays.items()} }."
        )
    dims = tuple(grid) + (1,) * (3 - len(grid))
    if origin is None:
        origin = (0.0,) * 3
    origin = tuple(float(o) for o in origin) + (0.0,) * (3 - len(origin))
    pieces = []
    for name, a in arrays.items():
        a = _storable(a)
        if a.shape == tuple(grid):
            flat = a.reshape(dims).ravel(order="F")
            ncomp = 1
        elif a.shape == (len(grid), *grid):
            comps = [a[k].reshape(dims).ravel(order="F") for k in range(len(grid))]
            comps += [np.zeros_like(comps[0])] * (3 - len(grid))
            flat = np.stack(comps, axis=-1).ravel()
            ncomp = 3
        else:
            raise ValueError(
                f"Field {name!r} has shape {a.shape}; on the grid {tuple(grid)} a "
                f"scalar must have shape {tuple(grid)} and a vector "
                f"{(len(grid), *grid)}."
            )
        pieces.append(_data_array(flat, ncomp, name, " " * 8))
    extent = " ".join(f"0 {n - 1}" for n in dims)
    text = (
        '<?xml version="1.0"?>\n'
        '<VTKFile type="ImageData" version="1.0" byte_order="LittleEndian" '
        'header_type="UInt64">\n'
        f'  <ImageData WholeExtent="{extent}" '
        f'Origin="{" ".join(repr(o) for o in origin)}" '
        f'Spacing="{spacing!r} {spacing!r} {spacing!r}">\n'
        f'    <Piece Extent="{extent}">\n'
        "      <PointData>\n" + "".join(pieces) + "      </PointData>\n"
        "    </Piece>\n"
        "  </ImageData>\n"
        "</VTKFile>\n"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="ascii")
    return path


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
        pieces.append(_data_array(a.ravel(), a.size // count, name, " " * 8))
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
        + _data_array(xyz.ravel(), 3, None, " " * 8)
        + "      </Points>\n"
        "      <Polys>\n"
        + _data_array(connectivity, 1, "connectivity", " " * 8)
        + _data_array(offsets, 1, "offsets", " " * 8)
        + "      </Polys>\n"
        "    </Piece>\n"
        "  </PolyData>\n"
        "</VTKFile>\n"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="ascii")
    return path
