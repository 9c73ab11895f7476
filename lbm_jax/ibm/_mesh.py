"""Closed triangulated surfaces: validation, icospheres and shape measures.

A :class:`TriangleMesh` is a closed, consistently oriented 2-manifold with outward
normals (faces listed counter-clockwise seen from outside). The construction checks
all of this on the host, so the membrane code never meets an open or inside-out
surface.

The shape measures are pure functions of the node positions ``x`` (``(N, 3)``) and
the faces, usable inside ``jit`` and computed in the dtype of ``x``:

* :func:`volume` and :func:`area` of the surface;
* :func:`ellipsoid_axes`: the ellipsoid with the same second-moment tensor of the
  enclosed volume (for semi-axes ``a, b, c``, ``S = V/5 diag(a^2, b^2, c^2)``);
* :func:`shear_plane_deformation`: the Taylor deformation ``D = (L - B)/(L + B)`` and
  inclination of that ellipsoid in the x-z (shear) plane.

Positions are taken relative to their mean before any product, so a capsule far
from the origin loses no precision in float32.

>>> mesh = icosphere(2.0, nodes=162)
>>> mesh.num_nodes, mesh.num_faces, mesh.edges.shape
(162, 320, (480, 2))
>>> d, theta = shear_plane_deformation(mesh.nodes * [1.2, 1.0, 1.0], mesh.faces)
>>> round(float(d), 4)
0.0909
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from lbm_jax.core._validation import check_int, check_real

__all__ = [
    "ICOSPHERE_NODES",
    "TriangleMesh",
    "area",
    "ellipsoid_axes",
    "icosphere",
    "shear_plane_deformation",
    "signed_volume",
    "triangle_cross",
    "volume",
]

#: Node counts :func:`icosphere` can build: ``10 * 4**k + 2`` for ``k = 0..5``.
ICOSPHERE_NODES = tuple(10 * 4**k + 2 for k in range(6))


def triangle_cross(x: Any, faces: Any, xp: Any = jnp) -> Any:
    """Per face, ``(x1 - x0) x (x2 - x0)``: twice the area times the unit normal.

    ``xp`` is the array module (``jax.numpy`` or ``numpy`` for host-side reference
    geometry).
    """
    p = x[faces]
    return xp.cross(p[:, 1] - p[:, 0], p[:, 2] - p[:, 0])


def signed_volume(x: Any, faces: Any, xp: Any = jnp) -> Any:
    """Enclosed volume, positive for outward-oriented faces (see :func:`volume`)."""
    p = (x - xp.mean(x, axis=0, keepdims=True))[faces]
    return xp.sum(p[:, 0] * xp.cross(p[:, 1], p[:, 2])) / 6


@dataclasses.dataclass(frozen=True, eq=False)
class TriangleMesh:
    """A closed, oriented triangulated surface.

    Attributes:
        nodes: Node positions, ``(N, 3)`` float64 (read-only copy).
        faces: Node indices of each triangle, ``(F, 3)`` int32, counter-clockwise
            seen from outside (read-only copy).
        edges: The unique undirected edges ``(E, 2)`` int32, each as
            ``(smaller, larger)`` index, sorted (derived).

    Raises:
        ValueError: Wrong shapes, non-finite nodes, indices out of range, unused
            nodes, degenerate faces, an open or non-manifold surface, inconsistent
            orientation or inward normals; the message names the offending item.
        TypeError: Non-integer face indices.

    >>> faces = [[0, 1, 2], [0, 3, 1], [0, 2, 3], [1, 3, 2]]
    >>> tet = TriangleMesh(np.eye(4, 3), faces)
    >>> tet.num_edges, round(float(volume(tet.nodes, tet.faces)), 6)
    (6, 0.166667)
    >>> TriangleMesh(np.eye(4, 3), np.flip(faces, axis=1))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: the faces enclose a negative volume (-0.166667): ... reverse ...
    """

    nodes: np.ndarray
    faces: np.ndarray
    edges: np.ndarray = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        nodes = np.array(self.nodes, dtype=np.float64)
        if nodes.ndim != 2 or nodes.shape[1] != 3 or nodes.shape[0] < 4:
            raise ValueError(
                f"nodes must have shape (N, 3) with N >= 4, got shape {nodes.shape}; "
                "pass one row of (x, y, z) per node."
            )
        if not np.all(np.isfinite(nodes)):
            raise ValueError("nodes contain non-finite coordinates.")
        faces = np.array(self.faces)
        if faces.size and not np.issubdtype(faces.dtype, np.integer):
            raise TypeError(f"faces must hold integer node indices, got {faces.dtype}.")
        if faces.ndim != 2 or faces.shape[1] != 3 or faces.shape[0] < 4:
            raise ValueError(
                f"faces must have shape (F, 3) with F >= 4 (a closed surface), got "
                f"shape {faces.shape}; pass three node indices per triangle."
            )
        n = nodes.shape[0]
        bad = np.flatnonzero(np.any((faces < 0) | (faces >= n), axis=1))
        if bad.size:
            k = int(bad[0])
            raise ValueError(
                f"face {k} {faces[k].tolist()} refers to a node outside 0..{n - 1} "
                f"(there are {n} nodes); fix the indices or add the missing nodes."
            )
        faces = faces.astype(np.int32)
        unused = np.setdiff1d(np.arange(n), faces)
        if unused.size:
            raise ValueError(
                f"nodes {unused[:5].tolist()} belong to no face; remove unused nodes."
            )
        _check_faces(nodes, faces)
        vol = float(signed_volume(nodes, faces, np))
        if vol <= 0:
            raise ValueError(
                f"the faces enclose a negative volume ({vol:.6g}): their normals "
                "point inwards; reverse the face order (faces[:, ::-1])."
            )
        edges = np.unique(np.sort(faces[:, [0, 1, 1, 2, 2, 0]].reshape(-1, 2)), axis=0)
        for name, value in (("nodes", nodes), ("faces", faces), ("edges", edges)):
            value.setflags(write=False)
            object.__setattr__(self, name, value)

    @property
    def num_nodes(self) -> int:
        """Number of nodes N."""
        return int(self.nodes.shape[0])

    @property
    def num_faces(self) -> int:
        """Number of triangles F."""
        return int(self.faces.shape[0])

    @property
    def num_edges(self) -> int:
        """Number of edges E (``3 F / 2`` on a closed surface)."""
        return int(self.edges.shape[0])

    def __repr__(self) -> str:
        return f"TriangleMesh(num_nodes={self.num_nodes}, num_faces={self.num_faces})"


def _check_faces(nodes: np.ndarray, faces: np.ndarray) -> None:
    """Reject degenerate faces, open or non-manifold edges and flipped faces."""
    twice_area = np.linalg.norm(triangle_cross(nodes, faces, np), axis=1)
    scale = float(np.ptp(nodes, axis=0).max())
    flat = np.flatnonzero(twice_area <= 1e-12 * scale**2)
    if flat.size:
        k = int(flat[0])
        raise ValueError(
            f"face {k} {faces[k].tolist()} is degenerate (repeated or collinear "
            "nodes, zero area); remove it or fix its nodes."
        )
    directed = faces[:, [0, 1, 1, 2, 2, 0]].reshape(-1, 2)
    undirected, counts = np.unique(np.sort(directed), axis=0, return_counts=True)
    if np.any(counts != 2):
        k = int(np.flatnonzero(counts != 2)[0])
        what = (
            "only one face: the surface is open"
            if counts[k] == 1
            else f"{counts[k]} faces: the surface is not a 2-manifold"
        )
        raise ValueError(
            f"edge {undirected[k].tolist()} belongs to {what}; every edge must be "
            "shared by exactly two faces (close the surface)."
        )
    twice, counts = np.unique(directed, axis=0, return_counts=True)
    if np.any(counts != 1):
        edge = twice[np.flatnonzero(counts != 1)[0]]
        both = np.flatnonzero(np.all(directed == edge, axis=1)) // 3
        raise ValueError(
            f"faces {both.tolist()} both traverse edge {edge.tolist()} in the same "
            "direction: the orientation is inconsistent; reverse the node order of "
            "the flipped face (swap two of its indices)."
        )


_ICOSAHEDRON_FACES = [
    (0, 11, 5), (0, 5, 1), (0, 1, 7), (0, 7, 10), (0, 10, 11),
    (1, 5, 9), (5, 11, 4), (11, 10, 2), (10, 7, 6), (7, 1, 8),
    (3, 9, 4), (3, 4, 2), (3, 2, 6), (3, 6, 8), (3, 8, 9),
    (4, 9, 5), (2, 4, 11), (6, 2, 10), (8, 6, 7), (9, 8, 1),
]  # fmt: skip


def icosphere(
    radius: float = 1.0,
    *,
    nodes: int = 642,
    center: ArrayLike = (0.0, 0.0, 0.0),
) -> TriangleMesh:
    """A sphere triangulated by recursive subdivision of an icosahedron.

    Each refinement splits every triangle into four at its edge midpoints and
    projects the new nodes onto the sphere, so ``nodes = 10 * 4**k + 2`` with
    ``2 * nodes - 4`` faces. Every node lies on the sphere; faces point outwards.

    Args:
        radius: Sphere radius (> 0).
        nodes: Number of nodes, one of :data:`ICOSPHERE_NODES`
            (12, 42, 162, 642, 2562, 10242).
        center: Centre ``(x, y, z)``.

    Raises:
        ValueError: A non-positive radius, a node count not in the list or a
            centre that is not three finite numbers.

    >>> mesh = icosphere(5.0, nodes=642, center=(10.0, 10.0, 10.0))
    >>> mesh.num_faces, round(float(np.linalg.norm(mesh.nodes[0] - 10.0)), 12)
    (1280, 5.0)
    """
    radius = check_real(radius, "radius")
    if radius <= 0:
        raise ValueError(f"radius must be positive, got {radius}.")
    count = check_int(nodes, "nodes", 12)
    if count not in ICOSPHERE_NODES:
        raise ValueError(
            f"an icosphere has 10 * 4**k + 2 nodes, one of {ICOSPHERE_NODES}; "
            f"got nodes={count}."
        )
    centre = np.asarray(center, dtype=np.float64)
    if centre.shape != (3,) or not np.all(np.isfinite(centre)):
        raise ValueError(f"center must be three finite numbers, got {center!r}.")
    t = (1.0 + np.sqrt(5.0)) / 2.0
    x = np.array(
        [(-1, t, 0), (1, t, 0), (-1, -t, 0), (1, -t, 0), (0, -1, t), (0, 1, t),
         (0, -1, -t), (0, 1, -t), (t, 0, -1), (t, 0, 1), (-t, 0, -1), (-t, 0, 1)]
    )  # fmt: skip
    faces = np.array(_ICOSAHEDRON_FACES, dtype=np.int64)
    while len(x) < count:
        x, faces = _subdivide(x, faces)
    x = radius * x / np.linalg.norm(x, axis=1, keepdims=True) + centre
    return TriangleMesh(x, faces)


def _subdivide(x: np.ndarray, faces: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Split each triangle into four; new nodes at the edge midpoints."""
    pairs = faces[:, [0, 1, 1, 2, 2, 0]].reshape(-1, 2)
    edges, inverse = np.unique(np.sort(pairs), axis=0, return_inverse=True)
    mid = (len(x) + inverse.reshape(-1, 3)).T  # midpoints of 01, 12, 20
    a, b, c = faces.T
    new = np.stack(
        [
            np.stack([a, mid[0], mid[2]], 1),
            np.stack([b, mid[1], mid[0]], 1),
            np.stack([c, mid[2], mid[1]], 1),
            mid.T,
        ],
        axis=1,
    ).reshape(-1, 3)
    midpoints = 0.5 * (x[edges[:, 0]] + x[edges[:, 1]])
    midpoints *= np.linalg.norm(x[0]) / np.linalg.norm(midpoints, axis=1, keepdims=True)
    return np.concatenate([x, midpoints]), new


def _positions(x: ArrayLike, faces: ArrayLike) -> tuple[jax.Array, jax.Array]:
    """``x`` as a floating ``(N, 3)`` array and ``faces`` as ``(F, 3)`` integers."""
    x, faces = jnp.asarray(x), jnp.asarray(faces)
    if x.ndim != 2 or x.shape[1] != 3:
        raise ValueError(f"x must have shape (N, 3), got {x.shape}.")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"x must be a floating-point array, got {x.dtype}.")
    if faces.ndim != 2 or faces.shape[1] != 3:
        raise ValueError(f"faces must have shape (F, 3), got {faces.shape}.")
    if not jnp.issubdtype(faces.dtype, jnp.integer):
        raise TypeError(f"faces must hold integer node indices, got {faces.dtype}.")
    return x, faces


def volume(x: ArrayLike, faces: ArrayLike) -> jax.Array:
    """Volume enclosed by the surface, ``sum_f dot(x0, cross(x1, x2)) / 6`` (jit-able).

    >>> mesh = icosphere(1.0, nodes=2562)
    >>> round(float(volume(mesh.nodes, mesh.faces)) / (4 / 3 * np.pi), 3)
    0.998
    """
    x, faces = _positions(x, faces)
    return signed_volume(x, faces)


def area(x: ArrayLike, faces: ArrayLike) -> jax.Array:
    """Total area of the surface (jit-able).

    >>> mesh = icosphere(1.0, nodes=2562)
    >>> round(float(area(mesh.nodes, mesh.faces)) / (4 * np.pi), 3)
    0.999
    """
    x, faces = _positions(x, faces)
    return jnp.sum(jnp.linalg.norm(triangle_cross(x, faces), axis=1)) / 2


def _second_moment(x: jax.Array, faces: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Volume and second-moment tensor ``int (x - c)(x - c)^T dV`` about the centroid.

    Exact for a polyhedron: a sum over the tetrahedra spanned by each face and a
    reference point ``p`` (signed volumes ``v``); one with vertices ``0, a, b, c``
    relative to ``p`` has ``int x x^T dV = v/20 (a a^T + b b^T + c c^T + s s^T)``,
    ``s = a + b + c``, and first moment ``v s / 4``.
    """
    p = (x - jnp.mean(x, axis=0, keepdims=True))[faces]
    a, b, c = p[:, 0], p[:, 1], p[:, 2]
    v = jnp.sum(a * jnp.cross(b, c), axis=1) / 6
    s = a + b + c
    outer = sum(jnp.einsum("fi,fj->fij", e, e) for e in (a, b, c, s))
    vol = jnp.sum(v)
    centroid = jnp.einsum("f,fi->i", v, s) / (4 * vol)
    moment = jnp.einsum("f,fij->ij", v, outer) / 20
    return vol, moment - vol * jnp.outer(centroid, centroid)


def ellipsoid_axes(x: ArrayLike, faces: ArrayLike) -> tuple[jax.Array, jax.Array]:
    """The ellipsoid with the same volume second moments as the enclosed body.

    Returns:
        ``(semi_axes, axes)``: the semi-axes ``(3,)`` in decreasing order and the
        unit axis directions as the columns of ``axes`` ``(3, 3)``. For an
        ellipsoid with semi-axes ``a, b, c`` the second-moment tensor is
        ``S = V/5 diag(a^2, b^2, c^2)``, so each semi-axis is ``sqrt(5 s / V)``
        for an eigenvalue ``s`` of ``S``.

    >>> mesh = icosphere(1.0, nodes=642)
    >>> semi, _ = ellipsoid_axes(mesh.nodes * [3.0, 2.0, 1.0], mesh.faces)
    >>> [round(float(v / semi[2]), 4) for v in semi]  # 2.99, 1.99, 0.99 (discrete)
    [3.0, 2.0, 1.0]
    """
    x, faces = _positions(x, faces)
    vol, moment = _second_moment(x, faces)
    eigenvalues, vectors = jnp.linalg.eigh(moment)
    return jnp.sqrt(5 * eigenvalues[::-1] / vol), vectors[:, ::-1]


def shear_plane_deformation(
    x: ArrayLike, faces: ArrayLike
) -> tuple[jax.Array, jax.Array]:
    """Taylor deformation and inclination in the x-z plane (jit-able).

    From the x-z block of the second-moment tensor of the enclosed volume (see
    :func:`ellipsoid_axes`): its eigenvalues give the largest and smallest
    semi-axes ``L`` and ``B`` in that plane.

    Returns:
        ``(D, theta)``: ``D = (L - B) / (L + B)`` and the angle ``theta`` (radians,
        in ``(-pi/2, pi/2]``) from ``e_x`` to the long axis, positive when the long
        axis points towards ``+z`` for ``+x``; 0 for a circular section.

    >>> mesh = icosphere(1.0, nodes=642)
    >>> c, s = np.cos(0.3), np.sin(0.3)
    >>> turn = np.array([[c, 0.0, -s], [0.0, 1.0, 0.0], [s, 0.0, c]])
    >>> d, theta = shear_plane_deformation(mesh.nodes * [1.5, 1.0, 0.5] @ turn.T,
    ...                                    mesh.faces)
    >>> round(float(d), 4), round(float(theta), 4)
    (0.5, 0.3)
    """
    x, faces = _positions(x, faces)
    vol, moment = _second_moment(x, faces)
    sxx, sxz, szz = moment[0, 0], moment[0, 2], moment[2, 2]
    mean = (sxx + szz) / 2
    radius = jnp.sqrt(((sxx - szz) / 2) ** 2 + sxz**2)
    long_axis = jnp.sqrt(5 * (mean + radius) / vol)
    short_axis = jnp.sqrt(5 * (mean - radius) / vol)
    theta = jnp.arctan2(2 * sxz, sxx - szz) / 2
    return (long_axis - short_axis) / (long_axis + short_axis), theta
