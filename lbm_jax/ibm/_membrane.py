"""Membrane mechanics of a capsule: strain-energy laws, bending, penalties, forces.

The membrane energy is a function of the node positions ``x`` of a
:class:`~lbm_jax.ibm.TriangleMesh` whose nodes are the stress-free reference shape;
the node forces are ``F = -dE/dx`` by automatic differentiation.

**In-plane elasticity.** Each triangle maps affinely from its reference to its
current shape. With reference edge vectors ``u, v`` and current ones ``e1, e2`` the
metric tensors ``G0 = [[u.u, u.v], [u.v, v.v]]`` and ``G = [[e1.e1, e1.e2],
[e1.e2, e2.e2]]`` give the right Cauchy-Green tensor in any orthonormal frame
``E0`` of the reference plane, ``C = E0^-T G E0^-1``, whose invariants need no
frame and no eigenvalues: ``I1 = tr C - 2 = tr(G0^-1 G) - 2`` and
``I2 = det C - 1 = |e1 x e2|^2 / |u x v|^2 - 1`` (``= lambda1^2 + lambda2^2 - 2``
and ``lambda1^2 lambda2^2 - 1`` for the principal stretches). The energy per
reference area ``w`` (:data:`LAWS`):

* ``"skalak"``: ``w = G_s/4 (I1^2 + 2 I1 - 2 I2 + C I2^2)``, area-dilation modulus
  ``G_s (1 + 2C)`` (valid for ``C > -1/2``);
* ``"neo-hookean"``: ``w = G_s/2 (I1 - 1 + 1/(I2 + 1))``, area-dilation modulus
  ``3 G_s``.

``E_s = sum_f A0_f w(I1_f, I2_f)`` over the faces' reference areas ``A0_f``.

**Isotropic tension.** The tension (force per current length) along a principal
direction is ``T1 = (1/lambda2) dw/dlambda1``. With ``dI1/dlambda1 = 2 lambda1``
and ``dI2/dlambda1 = 2 lambda1 lambda2^2``:

* Skalak: ``dw/dlambda1 = G_s lambda1 (lambda1^2 - 1 + C lambda2^2 (lambda1^2
  lambda2^2 - 1))``;
* neo-Hookean: ``dw/dlambda1 = G_s (lambda1 - lambda1^-3 lambda2^-2)``.

A sphere of radius ``R`` inflated uniformly (``lambda1 = lambda2 = lambda``) then
carries the tension ``T = w'(lambda) / (2 lambda)``, ``w(lambda) = w(lambda,
lambda)``:

* Skalak: ``T = G_s (lambda^2 - 1)(1 + C lambda^2 (lambda^2 + 1))``,
  ``~ 2 G_s (1 + 2C) eps`` for ``lambda = 1 + eps``;
* neo-Hookean: ``T = G_s (1 - lambda^-6)``, ``~ 6 G_s eps``;

balanced by the pressure ``p = 2 T / (lambda R)`` (Laplace). On the mesh every face
of a scaled icosphere stretches by ``lambda`` in all directions, so
``E(lambda) = A0 w(lambda, lambda)`` exactly (``A0`` the mesh's area) and the virial
of the node forces is ``sum_i F_i . x_i = -lambda dE/dlambda = -2 lambda^2 A0 T``:

>>> import jax.numpy as jnp
>>> from lbm_jax.ibm._mesh import icosphere
>>> mesh = icosphere(1.0, nodes=162)
>>> membrane = Membrane(mesh, law="skalak", shear_modulus=1.0, skalak_c=1.0)
>>> lam = 1.1
>>> x = jnp.asarray(mesh.nodes * lam, jnp.float32)
>>> f = membrane.forces(x)
>>> f.shape, f.dtype
((162, 3), dtype('float32'))
>>> tension = (lam**2 - 1) * (1 + lam**2 * (lam**2 + 1))
>>> virial = float(jnp.sum(f * x))
>>> round(-virial / (2 * lam**2 * membrane.reference_area * tension), 4)
1.0

**Bending** (optional, ``bending_modulus = k_b``, zero in the reference shape):

* ``"dihedral"``: ``E_b = k_b sum_e (1 - cos(theta_e - theta0_e))`` over the edges,
  ``theta_e`` the signed angle between the normals of the two faces of edge ``e``
  (positive where the surface is convex);
* ``"helfrich"``: ``E_b = k_b/2 sum_i A_i (2 H_i - 2 H0_i)^2`` with the discrete
  mean curvature ``2 H_i = K_i . n_i`` of the cotangent Laplacian,
  ``K_i = 1/(2 A_i) sum_j (cot a_ij + cot b_ij)(x_i - x_j)``, ``A_i`` the mixed
  Voronoi area of node ``i`` (Meyer et al. 2003) and ``n_i`` its area-weighted
  normal. A sphere has ``2 H = 2 / R`` and ``sum_i A_i (2 H_i)^2 -> 16 pi``.

**Global penalties** (optional): ``E_A = k_a/2 (A - A0)^2 / A0`` on the total area
and ``E_V = k_v/2 (V - V0)^2 / V0`` on the enclosed volume.

**Dtypes.** Everything is computed in the dtype of ``x`` (the fluid's compute
dtype). The reference geometry is computed once in float64 NumPy and cast to that
dtype inside.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from lbm_jax.core._pytree import pytree_attributes
from lbm_jax.core._validation import check_real
from lbm_jax.ibm._mesh import TriangleMesh, signed_volume

__all__ = ["BENDING_MODELS", "LAWS", "Membrane"]


def _skalak(i1: jax.Array, i2: jax.Array, c: float) -> jax.Array:
    """Skalak energy per reference area in units of ``G_s``."""
    return (i1 * i1 + 2 * i1 - 2 * i2 + c * i2 * i2) / 4


def _neo_hookean(i1: jax.Array, i2: jax.Array, c: float) -> jax.Array:
    """Neo-Hookean energy per reference area in units of ``G_s`` (``c`` unused)."""
    del c
    return (i1 - 1 + 1 / (i2 + 1)) / 2


_LAW_FUNCTIONS: dict[str, Callable[[jax.Array, jax.Array, float], jax.Array]] = {
    "skalak": _skalak,
    "neo-hookean": _neo_hookean,
}

#: Names of the in-plane strain-energy laws.
LAWS: tuple[str, ...] = tuple(_LAW_FUNCTIONS)

#: Names of the bending models.
BENDING_MODELS: tuple[str, ...] = ("dihedral", "helfrich")


def _hinges(faces: np.ndarray) -> np.ndarray:
    """Per edge ``(a, b, c, d)``: the faces ``(a, b, c)`` and ``(b, a, d)`` meet."""
    directed = faces[:, [0, 1, 1, 2, 2, 0]].reshape(-1, 2).astype(np.int64)
    opposite = faces[:, [2, 0, 1]].reshape(-1)
    n = int(faces.max()) + 1
    keys = directed[:, 0] * n + directed[:, 1]
    order = np.argsort(keys)
    first = np.flatnonzero(directed[:, 0] < directed[:, 1])
    reverse = directed[first, 1] * n + directed[first, 0]
    partner = order[np.searchsorted(keys[order], reverse)]
    a, b = directed[first].T
    return np.stack([a, b, opposite[first], opposite[partner]], 1).astype(np.int32)


def _hinge_angles(x: Any, hinges: Any, xp: Any = jnp) -> tuple[Any, Any]:
    """Cosine and sine of the signed dihedral angle of each hinge."""
    p = x[hinges]
    xa, xb, xc, xd = p[:, 0], p[:, 1], p[:, 2], p[:, 3]
    edge = xb - xa
    n1 = xp.cross(edge, xc - xa)
    n2 = xp.cross(-edge, xd - xb)
    norm = xp.sqrt(xp.sum(n1 * n1, axis=1) * xp.sum(n2 * n2, axis=1))
    cos = xp.sum(n1 * n2, axis=1) / norm
    sin = xp.sum(xp.cross(n1, n2) * edge, axis=1) / (
        norm * xp.sqrt(xp.sum(edge * edge, axis=1))
    )
    return cos, sin


def _node_sum(values: Any, index: Any, n: int, xp: Any = jnp) -> Any:
    """Add the rows of ``values`` into ``n`` nodes at ``index``."""
    if xp is np:
        out = np.zeros((n, *values.shape[1:]))
        np.add.at(out, index, values)
        return out
    return jnp.zeros((n, *values.shape[1:]), values.dtype).at[index].add(values)


def _mean_curvature(x: Any, faces: Any, xp: Any = jnp) -> tuple[Any, Any]:
    """Twice the mean curvature ``2 H_i`` and the mixed area ``A_i`` of each node.

    ``A_i`` is the mixed Voronoi area of Meyer, Desbrun, Schroeder & Barr (2003):
    each face gives its corners their Voronoi share, or, if the face is obtuse,
    half its area to the obtuse corner and a quarter to the others.
    """
    p = x[faces]
    side = [p[:, (m + 1) % 3] - p[:, m] for m in range(3)]  # corner m to m + 1
    cross = xp.cross(side[0], -side[2])
    twice_area = xp.sqrt(xp.sum(cross * cross, axis=1))
    dots = [-xp.sum(side[m] * side[(m + 2) % 3], axis=1) for m in range(3)]
    cot = [d / twice_area for d in dots]
    obtuse = (dots[0] < 0) | (dots[1] < 0) | (dots[2] < 0)
    rows = []
    for m in range(3):
        j, k = (m + 1) % 3, (m + 2) % 3
        # edges m-j (opposite corner k) and m-k (opposite corner j)
        laplace = cot[k][:, None] * -side[m] + cot[j][:, None] * side[k]
        voronoi = (
            cot[k] * xp.sum(side[m] ** 2, axis=1)
            + cot[j] * xp.sum(side[k] ** 2, axis=1)
        ) / 8
        share = xp.where(dots[m] < 0, twice_area / 4, twice_area / 8)
        area = xp.where(obtuse, share, voronoi)
        rows.append(xp.concatenate([laplace, cross, area[:, None]], axis=1))
    sums = _node_sum(xp.concatenate(rows), faces.T.reshape(-1), x.shape[0], xp)
    laplace, normal, node_area = sums[:, :3], sums[:, 3:6], sums[:, 6]
    unit = normal / xp.sqrt(xp.sum(normal * normal, axis=1))[:, None]
    return xp.sum(laplace * unit, axis=1) / (2 * node_area), node_area


class _Reference(NamedTuple):
    """Reference geometry (float64 NumPy, cast to the dtype of ``x`` in use)."""

    nodes: np.ndarray  # (N, 3)
    faces: np.ndarray  # (F, 3) int32
    hinges: np.ndarray  # (E, 4) int32, see _hinges
    face_area: np.ndarray  # (F,)
    inverse_metric: np.ndarray  # (F, 3): entries 00, 01, 11 of G0^-1
    hinge_angle: np.ndarray  # (E, 2): cos and sin of theta0
    curvature: np.ndarray  # (N,): 2 H0
    area: np.ndarray  # ()
    volume: np.ndarray  # ()


@dataclasses.dataclass(frozen=True)
class _Params:
    """Static configuration of a membrane (hashed by value)."""

    law: str
    shear_modulus: float
    skalak_c: float
    bending: str
    bending_modulus: float
    area_modulus: float
    volume_modulus: float


def _reference(mesh: TriangleMesh) -> _Reference:
    x, faces = mesh.nodes, mesh.faces
    u = x[faces[:, 1]] - x[faces[:, 0]]
    v = x[faces[:, 2]] - x[faces[:, 0]]
    g00, g01, g11 = (np.sum(p * q, axis=1) for p, q in ((u, u), (u, v), (v, v)))
    det = g00 * g11 - g01 * g01
    face_area = np.linalg.norm(np.cross(u, v), axis=1) / 2
    hinges = _hinges(faces)
    curvature, _ = _mean_curvature(x, faces, np)
    arrays = _Reference(
        nodes=x,
        faces=faces,
        hinges=hinges,
        face_area=face_area,
        inverse_metric=np.stack([g11, -g01, g00], axis=1) / det[:, None],
        hinge_angle=np.stack(_hinge_angles(x, hinges, np), axis=1),
        curvature=curvature,
        area=np.asarray(face_area.sum()),
        volume=np.asarray(signed_volume(x, faces, np)),
    )
    for a in arrays:
        a.setflags(write=False)
    return arrays


def _modulus(value: object, name: str) -> float:
    value = check_real(value, name)
    if value < 0:
        raise ValueError(
            f"{name} must be non-negative (0 switches it off), got {value}."
        )
    return value


@pytree_attributes(data=("_ref",), meta=("_params",))
class Membrane:
    """The elastic membrane of a capsule, stress-free in the shape of ``mesh``.

    A pytree: the reference geometry is its leaves, the law and moduli are static
    (changing them makes a new membrane and a new compilation), so it can be passed
    to jitted functions as an argument.

    Args:
        mesh: The reference (stress-free) shape.
        law: In-plane law, one of :data:`LAWS`.
        shear_modulus: Surface shear modulus ``G_s`` (> 0).
        skalak_c: Skalak's area-dilation parameter ``C`` (> -1/2, so that the area
            modulus ``G_s (1 + 2C)`` is positive); ignored by ``"neo-hookean"``.
        bending_modulus: Bending modulus ``k_b`` (>= 0; 0 for none).
        bending: Bending model, one of :data:`BENDING_MODELS`.
        area_modulus: ``k_a`` of the total-area penalty (>= 0; 0 for none).
        volume_modulus: ``k_v`` of the volume penalty (>= 0; 0 for none).

    Raises:
        ValueError: Unknown law or bending model, or a modulus out of range.
        TypeError: ``mesh`` not a :class:`TriangleMesh`, moduli not real numbers.

    >>> from lbm_jax.ibm._mesh import icosphere
    >>> membrane = Membrane(icosphere(nodes=42), law="neo-hookean", shear_modulus=1.0)
    >>> x = jnp.asarray(membrane.reference_nodes, jnp.float32)
    >>> energy, forces = membrane.energy(x), membrane.forces(x)
    >>> abs(float(energy)) < 1e-5, float(jnp.abs(forces).max()) < 1e-5
    (True, True)
    """

    def __init__(
        self,
        mesh: TriangleMesh,
        *,
        law: str = "skalak",
        shear_modulus: float,
        skalak_c: float = 1.0,
        bending_modulus: float = 0.0,
        bending: str = "dihedral",
        area_modulus: float = 0.0,
        volume_modulus: float = 0.0,
    ) -> None:
        if not isinstance(mesh, TriangleMesh):
            raise TypeError(f"mesh must be a TriangleMesh, got {type(mesh).__name__}.")
        if law not in LAWS:
            raise ValueError(f"unknown membrane law {law!r}; expected one of {LAWS}.")
        if bending not in BENDING_MODELS:
            raise ValueError(
                f"unknown bending model {bending!r}; expected one of {BENDING_MODELS}."
            )
        shear_modulus = check_real(shear_modulus, "shear_modulus")
        if shear_modulus <= 0:
            raise ValueError(f"shear_modulus must be positive, got {shear_modulus}.")
        skalak_c = check_real(skalak_c, "skalak_c")
        if skalak_c <= -0.5:
            raise ValueError(
                f"skalak_c must exceed -1/2 (area modulus G_s (1 + 2C) > 0), got "
                f"{skalak_c}; C = 1 is the usual choice for capsules."
            )
        self._params = _Params(
            law=law,
            shear_modulus=shear_modulus,
            skalak_c=skalak_c,
            bending=bending,
            bending_modulus=_modulus(bending_modulus, "bending_modulus"),
            area_modulus=_modulus(area_modulus, "area_modulus"),
            volume_modulus=_modulus(volume_modulus, "volume_modulus"),
        )
        self._ref = _reference(mesh)

    # -- read-only configuration ------------------------------------------------
    @property
    def law(self) -> str:
        """In-plane law, one of :data:`LAWS`."""
        return self._params.law

    @property
    def shear_modulus(self) -> float:
        """Surface shear modulus ``G_s``."""
        return self._params.shear_modulus

    @property
    def skalak_c(self) -> float:
        """Skalak's area-dilation parameter ``C``."""
        return self._params.skalak_c

    @property
    def bending(self) -> str:
        """Bending model, one of :data:`BENDING_MODELS`."""
        return self._params.bending

    @property
    def bending_modulus(self) -> float:
        """Bending modulus ``k_b`` (0: no bending)."""
        return self._params.bending_modulus

    @property
    def area_modulus(self) -> float:
        """Modulus ``k_a`` of the total-area penalty."""
        return self._params.area_modulus

    @property
    def volume_modulus(self) -> float:
        """Modulus ``k_v`` of the volume penalty."""
        return self._params.volume_modulus

    @property
    def reference_nodes(self) -> np.ndarray:
        """Stress-free node positions ``(N, 3)``, float64 (read-only)."""
        return self._ref.nodes

    @property
    def faces(self) -> np.ndarray:
        """Triangles ``(F, 3)`` int32, outward oriented (read-only)."""
        return self._ref.faces

    @property
    def reference_area(self) -> float:
        """Total area ``A0`` of the reference shape."""
        return float(self._ref.area)

    @property
    def reference_volume(self) -> float:
        """Volume ``V0`` enclosed by the reference shape."""
        return float(self._ref.volume)

    @property
    def num_nodes(self) -> int:
        """Number of nodes N."""
        return int(self._ref.nodes.shape[0])

    def __repr__(self) -> str:
        p = self._params
        return (
            f"Membrane(num_nodes={self.num_nodes}, law={p.law!r}, "
            f"shear_modulus={p.shear_modulus}, skalak_c={p.skalak_c}, "
            f"bending={p.bending!r}, bending_modulus={p.bending_modulus}, "
            f"area_modulus={p.area_modulus}, volume_modulus={p.volume_modulus})"
        )

    # -- mechanics ----------------------------------------------------------------
    def energy(self, x: ArrayLike) -> jax.Array:
        """Total membrane energy at node positions ``x`` ``(N, 3)`` (jit-able).

        Raises:
            ValueError: ``x`` not of shape ``(N, 3)``.
            TypeError: ``x`` not floating point.
        """
        x = jnp.asarray(x)
        if x.shape != (self.num_nodes, 3):
            raise ValueError(
                f"x must have shape ({self.num_nodes}, 3), one row per membrane "
                f"node, got {x.shape}."
            )
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(f"x must be a floating-point array, got {x.dtype}.")
        p, ref = self._params, self._ref
        dtype = x.dtype
        faces = ref.faces
        corners = x[faces]
        e1 = corners[:, 1] - corners[:, 0]
        e2 = corners[:, 2] - corners[:, 0]
        g = jnp.asarray(ref.inverse_metric, dtype)
        i1 = (
            g[:, 0] * jnp.sum(e1 * e1, axis=1)
            + 2 * g[:, 1] * jnp.sum(e1 * e2, axis=1)
            + g[:, 2] * jnp.sum(e2 * e2, axis=1)
            - 2
        )
        cross = jnp.cross(e1, e2)
        twice_area2 = jnp.sum(cross * cross, axis=1)
        area0 = jnp.asarray(ref.face_area, dtype)
        i2 = twice_area2 / (2 * area0) ** 2 - 1
        w = _LAW_FUNCTIONS[p.law](i1, i2, p.skalak_c)
        total = p.shear_modulus * jnp.sum(area0 * w)
        if p.bending_modulus and p.bending == "dihedral":
            cos, sin = _hinge_angles(x, ref.hinges)
            angle0 = jnp.asarray(ref.hinge_angle, dtype)
            misfit = 1 - cos * angle0[:, 0] - sin * angle0[:, 1]
            total = total + p.bending_modulus * jnp.sum(misfit)
        elif p.bending_modulus:
            twice_h, node_area = _mean_curvature(x, faces)
            misfit = twice_h - jnp.asarray(ref.curvature, dtype)
            total = total + p.bending_modulus / 2 * jnp.sum(node_area * misfit**2)
        if p.area_modulus:
            a0 = jnp.asarray(ref.area, dtype)
            a = jnp.sum(jnp.sqrt(twice_area2)) / 2
            total = total + p.area_modulus / 2 * (a - a0) ** 2 / a0
        if p.volume_modulus:
            v0 = jnp.asarray(ref.volume, dtype)
            v = signed_volume(x, faces)
            total = total + p.volume_modulus / 2 * (v - v0) ** 2 / v0
        return total

    def forces(self, x: ArrayLike) -> jax.Array:
        """Node forces ``-dE/dx`` ``(N, 3)`` in the dtype of ``x`` (jit-able)."""
        return -jax.grad(self.energy)(jnp.asarray(x))
