"""Regularised delta kernels of the immersed-boundary method: interpolation, spreading.

A Lagrangian point ``X`` (lattice units; the fluid node of index ``i`` sits at
``x = i``) couples to the grid through the tensor-product weight
``delta(x - X) = phi(x_1 - X_1) ... phi(x_d - X_d)`` of a 1-D kernel ``phi`` of
finite support, with periodic wrap-around in every axis:

* :func:`interpolate` reads a field at the points, ``U(X) = sum_x u(x) delta(x - X)``;
* :func:`spread` distributes point values onto the grid,
  ``f(x) = sum_X F_X delta(x - X)`` (a density per cell; the cell volume is one).

The two are exact adjoints of each other, ``<spread(F), u> = <F, interpolate(u)>``,
and conserve the zeroth and first moments: every kernel here sums to one and has zero
first moment on the integer lattice, so spreading keeps the total force and torque.

Implementation (both fully vectorised; measured on XLA:CPU for a (3, 50, 50, 50)
field and 642 to 2562 points with the 4-point kernel): each point touches an ``S^d``
block of nodes from a wrapped corner index. Interpolation gathers these blocks from a
copy of the field padded periodically by ``S - 1`` nodes and contracts them with the
1-D weights of each axis (twice as fast as gathering single nodes by flat index).
Spreading scatter-adds ``N S^d`` weighted values over flattened node indices (as fast
as, and simpler than, adding whole blocks into a padded grid and folding the padding
back).

Dtypes: the weights are computed in the dtype of ``points`` and cast to the dtype of
the field (interpolation) or of the values (spreading), which is also the dtype of
the result.

>>> import jax.numpy as jnp
>>> u = jnp.ones((3, 8, 8, 8))
>>> U = interpolate(u, jnp.array([[3.3, 0.2, 7.9]]), "peskin")
>>> U.shape, U.dtype, jnp.round(U, 5).tolist()
((1, 3), dtype('float32'), [[1.0, 1.0, 1.0]])
>>> f = spread(jnp.array([[1.0]]), jnp.array([[0.5, 7.75]]), (8, 8), 4)
>>> f.shape, round(float(f.sum()), 6)
((1, 8, 8), 1.0)
"""

from __future__ import annotations

import enum
import math
import numbers
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax
from jax.typing import ArrayLike

from lbm_jax.core._validation import check_int

__all__ = [
    "DeltaKernel",
    "KernelLike",
    "delta_1d",
    "get_kernel",
    "interpolate",
    "kernel_support",
    "spread",
]


class DeltaKernel(enum.Enum):
    """The 1-D regularised delta kernels, by name.

    ``LINEAR`` (2-point, ``1 - |r|``), ``ROMA`` (3-point, Roma, Praprotnik & Ricci
    1999) and ``PESKIN`` (4-point, Peskin 2002). Also accepted as their support
    widths 2, 3 and 4 by every function of this module.
    """

    LINEAR = "linear"
    ROMA = "roma"
    PESKIN = "peskin"


KernelLike = DeltaKernel | str | int
_SUPPORT = {DeltaKernel.LINEAR: 2, DeltaKernel.ROMA: 3, DeltaKernel.PESKIN: 4}


def get_kernel(kernel: KernelLike) -> DeltaKernel:
    """The :class:`DeltaKernel` named by ``kernel`` (a member, name or support width).

    >>> get_kernel(4), get_kernel("Roma")
    (<DeltaKernel.PESKIN: 'peskin'>, <DeltaKernel.ROMA: 'roma'>)

    Raises:
        ValueError: If ``kernel`` names no kernel.
    """
    if isinstance(kernel, DeltaKernel):
        return kernel
    for member, width in _SUPPORT.items():
        if isinstance(kernel, str) and kernel.lower() == member.value:
            return member
        integral = isinstance(kernel, numbers.Integral) and not isinstance(kernel, bool)
        if integral and kernel == width:
            return member
    valid = [f"{m.value!r} or {w}" for m, w in _SUPPORT.items()]
    raise ValueError(
        f"Unknown delta kernel {kernel!r}; expected a DeltaKernel, one of "
        f"{', '.join(valid)} (a name or the support width in nodes)."
    )


def kernel_support(kernel: KernelLike) -> int:
    """The number of nodes per axis that one point touches (2, 3 or 4).

    >>> kernel_support("peskin")
    4
    """
    return _SUPPORT[get_kernel(kernel)]


def _branches(a: jax.Array, inner, outer, split: float, edge: float) -> jax.Array:
    # Each branch is evaluated at |r| clipped to its own interval, so no square root
    # sees a negative argument and the unused branch has a finite (zero) gradient.
    ai = jnp.minimum(a, split)
    ao = jnp.clip(a, split, edge)
    return jnp.where(a <= split, inner(ai), jnp.where(a < edge, outer(ao), 0.0))


def delta_1d(kernel: KernelLike, r: ArrayLike) -> jax.Array:
    """The 1-D kernel weight ``phi(r)``, elementwise, in the dtype of ``r``.

    Args:
        kernel: Which kernel (see :class:`DeltaKernel`).
        r: Distances in lattice units (floating point, any shape).

    Raises:
        ValueError: If ``kernel`` names no kernel.
        TypeError: If ``r`` is not floating point.

    >>> delta_1d("linear", jnp.array([0.0, 0.25, 1.5])).tolist()
    [1.0, 0.75, 0.0]
    >>> delta_1d(3, jnp.array([0.0, 0.5])).tolist()
    [0.6666666865348816, 0.5]
    """
    kind = get_kernel(kernel)
    r = jnp.asarray(r)
    if not jnp.issubdtype(r.dtype, jnp.floating):
        raise TypeError(f"delta_1d needs floating-point distances, got {r.dtype}.")
    a = jnp.abs(r)
    if kind is DeltaKernel.LINEAR:
        return jnp.maximum(1.0 - a, 0.0)
    if kind is DeltaKernel.ROMA:
        return _branches(
            a,
            lambda s: (1.0 + jnp.sqrt(1.0 - 3.0 * s * s)) / 3.0,
            lambda s: (5.0 - 3.0 * s - jnp.sqrt(1.0 - 3.0 * (1.0 - s) ** 2)) / 6.0,
            0.5,
            1.5,
        )
    return _branches(
        a,
        lambda s: (3.0 - 2.0 * s + jnp.sqrt(1.0 + 4.0 * s - 4.0 * s * s)) / 8.0,
        lambda s: (5.0 - 2.0 * s - jnp.sqrt(-7.0 + 12.0 * s - 4.0 * s * s)) / 8.0,
        1.0,
        2.0,
    )


def _check_array(
    a: ArrayLike, name: str, ndim: tuple[int, ...], form: str
) -> jax.Array:
    a = jnp.asarray(a)
    if a.ndim not in ndim:
        raise ValueError(f"{name} must have shape {form}, got {a.shape}.")
    if not jnp.issubdtype(a.dtype, jnp.floating):
        raise TypeError(f"{name} must be floating point, got dtype {a.dtype}.")
    return a


def _check_grid(shape: Sequence[int], kind: DeltaKernel) -> tuple[int, ...]:
    shape = tuple(check_int(n, f"grid size {i}", 1) for i, n in enumerate(shape))
    if min(shape) < _SUPPORT[kind]:
        raise ValueError(
            f"Every grid axis needs at least {_SUPPORT[kind]} nodes (the support of "
            f"the {kind.value} kernel), got the grid {shape}."
        )
    return shape


def _stencil(
    points: jax.Array, shape: tuple[int, ...], kind: DeltaKernel
) -> tuple[jax.Array, list[jax.Array]]:
    """Wrapped block corners ``(N, d)`` int32 and per-axis weights ``(N, S)``."""
    s = _SUPPORT[kind]
    base = jnp.floor(points - 0.5 * s) + 1.0
    # Exact: base is an integer within s/2 of the point.
    offsets = points - base
    k = jnp.arange(s, dtype=points.dtype)[None, :]
    weights = [delta_1d(kind, offsets[:, i : i + 1] - k) for i in range(len(shape))]
    sizes = jnp.asarray(shape, dtype=jnp.int32)
    corner = jnp.remainder(base.astype(jnp.int32), sizes[None, :])
    return corner, weights


def _contract_spec(d: int) -> str:
    axes = "xyz"[:d]
    return f"nc{axes}," + ",".join(f"n{a}" for a in axes) + "->nc"


def interpolate(field: ArrayLike, points: ArrayLike, kernel: KernelLike) -> jax.Array:
    """Read a periodic grid field at points: ``U(X) = sum_x u(x) delta(x - X)``.

    Args:
        field: ``(C, *shape)``, floating point, with ``len(shape)`` 2 or 3 and every
            axis at least the kernel's support; node ``i`` of an axis sits at
            ``x = i``.
        points: ``(N, d)`` positions in lattice units, ``d = len(shape)``; taken
            modulo the grid size.
        kernel: The delta kernel (static under ``jit``).

    Returns:
        ``(N, C)`` in the dtype of ``field``.

    Raises:
        ValueError: On inconsistent shapes or a grid axis shorter than the support.
        TypeError: On non-floating inputs.
    """
    kind = get_kernel(kernel)
    s = _SUPPORT[kind]
    field = _check_array(field, "field", (3, 4), "(C, X, Y) or (C, X, Y, Z)")
    points = _check_array(points, "points", (2,), "(N, d)")
    d = field.ndim - 1
    if points.shape[1] != d:
        raise ValueError(
            f"points have shape {points.shape} but the field {field.shape} has {d} "
            f"grid axes; pass points of shape (N, {d})."
        )
    shape = _check_grid(field.shape[1:], kind)
    corner, weights = _stencil(points, shape, kind)
    padded = jnp.pad(field, ((0, 0),) + ((0, s - 1),) * d, mode="wrap")
    dnums = lax.GatherDimensionNumbers(
        offset_dims=tuple(range(1, d + 2)),
        collapsed_slice_dims=(),
        start_index_map=tuple(range(1, d + 1)),
    )
    blocks = lax.gather(
        padded,
        corner,
        dnums,
        slice_sizes=(field.shape[0],) + (s,) * d,
        mode=lax.GatherScatterMode.PROMISE_IN_BOUNDS,
    )
    weights = [w.astype(field.dtype) for w in weights]
    return jnp.einsum(_contract_spec(d), blocks, *weights)


def spread(
    values: ArrayLike,
    points: ArrayLike,
    shape: Sequence[int],
    kernel: KernelLike,
) -> jax.Array:
    """Spread point values onto a periodic grid: ``f(x) = sum_X F_X delta(x - X)``.

    Args:
        values: ``(N, C)`` floating point (e.g. forces, ``C = d``).
        points: ``(N, d)`` positions in lattice units; taken modulo the grid size.
        shape: The grid, ``d`` sizes (static under ``jit``), each at least the
            kernel's support.
        kernel: The delta kernel (static under ``jit``).

    Returns:
        ``(C, *shape)`` in the dtype of ``values``. Contributions to one node are
        summed in a fixed order on CPUs; GPU scatters may add them in a varying
        order, so results there can differ in the last bits from run to run.

    Raises:
        ValueError: On inconsistent shapes or a grid axis shorter than the support.
        TypeError: On non-floating inputs.

    >>> step = jax.jit(spread, static_argnames=("shape", "kernel"))
    >>> f = step(jnp.ones((5, 3)), jnp.full((5, 3), 2.5), (8, 8, 8), "roma")
    >>> f.shape, f[0, 2:4, 2:4, 2:4].tolist() == [[[0.625] * 2] * 2] * 2
    ((3, 8, 8, 8), True)
    """
    kind = get_kernel(kernel)
    s = _SUPPORT[kind]
    values = _check_array(values, "values", (2,), "(N, C)")
    points = _check_array(points, "points", (2,), "(N, d)")
    if values.shape[0] != points.shape[0]:
        raise ValueError(
            f"values {values.shape} and points {points.shape} must have one row per "
            "point each."
        )
    if isinstance(shape, int) or len(shape) not in (2, 3):
        raise ValueError(f"shape must list 2 or 3 grid sizes, got {shape!r}.")
    if len(shape) != points.shape[1]:
        raise ValueError(
            f"points have shape {points.shape} but the grid {tuple(shape)} has "
            f"{len(shape)} axes; pass points of shape (N, {len(shape)})."
        )
    shape = _check_grid(shape, kind)
    if math.prod(shape) >= 2**31:
        raise ValueError(f"The grid {shape} has too many nodes for int32 indices.")
    corner, weights = _stencil(points, shape, kind)
    n_points, c = values.shape
    k = jnp.arange(s, dtype=jnp.int32)[None, :]
    index = jnp.zeros((n_points, 1), jnp.int32)  # flat node index, (N, S^d)
    weight = jnp.ones((n_points, 1), values.dtype)  # outer weight product, (N, S^d)
    for axis, (n, w) in enumerate(zip(shape, weights, strict=True)):
        block = (n_points, s ** (axis + 1))
        nodes = jnp.remainder(corner[:, axis : axis + 1] + k, n)
        index = (index[:, :, None] * n + nodes[:, None, :]).reshape(block)
        w = w.astype(values.dtype)
        weight = (weight[:, :, None] * w[:, None, :]).reshape(block)
    contrib = values.T[:, :, None] * weight[None, :, :]
    grid = jnp.zeros((c, math.prod(shape)), values.dtype)
    grid = grid.at[:, index.reshape(-1)].add(contrib.reshape(c, index.size))
    return grid.reshape(c, *shape)
