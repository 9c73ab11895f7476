"""Cells of the fused GPU step: a program's coordinates, collision and encoding.

A kernel holds one array per direction (Triton blocks have power-of-two shapes,
so the ``Q`` directions cannot be stacked into one array as the XLA step does);
these functions take and return such lists.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from lbm_jax.core._collision import (
    Collision,
    CollisionModel,
    force_factors,
    smagorinsky_rates_from,
)
from lbm_jax.core._lattice import Lattice
from lbm_jax.core._storage import StoragePolicy

__all__ = [
    "Cells",
    "collide_cells",
    "encode_in_kernel",
    "equilibrium_cells",
    "index",
    "wrap",
]


def wrap(i: jax.Array, n: int) -> jax.Array:
    """Periodic index for ``i`` in ``[-1, n]``."""
    return jnp.where(i < 0, i + n, jnp.where(i >= n, i - n, i))


class Cells:
    """Index helpers of one kernel program: a row segment of the grid.

    ``pl`` is the Pallas module (for the program ids); ``vma``: the mesh axes
    the data vary over when the kernel is interpreted inside ``shard_map``.

    ``coords`` are the program's cell coordinates: scalars for every axis but
    the last, a vector of ``block`` cells along the last; ``mask`` marks the
    cells inside the grid.
    """

    def __init__(
        self,
        pl: Any,
        shape: tuple[int, ...],
        block: int,
        *,
        interpret: bool = False,
        vma: tuple[str, ...] = (),
    ) -> None:
        d = len(shape)
        lead = [pl.program_id(a) for a in range(d - 1)]
        last = pl.program_id(d - 1) * block + jnp.arange(block, dtype=jnp.int32)
        self.shape = shape
        self.mask = last < shape[-1]
        # cells past the grid's end point far outside it, also once shifted
        # and wrapped (masked lanes never touch memory on a GPU; the
        # interpreter drops out-of-bounds stores)
        coords = [*lead, jnp.where(self.mask, last, 4 * shape[-1] + 8)]
        if vma and interpret:  # interpreted inside shard_map: per device
            coords = [lax.pcast(c, vma, to="varying") for c in coords]
        self.coords = coords

    def shifted(self, ci: tuple[int, ...], sign: int) -> list[jax.Array]:
        """Coordinates ``x + sign * c`` wrapped periodically (unwrapped along x)."""
        out = [self.coords[0] + sign * ci[0]]
        for a in range(1, len(self.shape)):
            v = self.coords[a] + sign * ci[a] if ci[a] else self.coords[a]
            out.append(wrap(v, self.shape[a]) if ci[a] else v)
        return out


def index(coords: list[jax.Array], i: int | jax.Array) -> tuple:
    """Index of direction ``i`` at ``coords`` in an ``(X, Q, *rest)`` array."""
    return (coords[0], i, *coords[1:])


def collide_cells(
    lattice: Lattice,
    model: CollisionModel,
    fs: list[jax.Array],
    *,
    shift: bool,
    force: list[Any] | None,
    with_moments: bool = False,
) -> list[jax.Array] | tuple[list[jax.Array], jax.Array, list[jax.Array]]:
    """Collision of one set of cells, one array per direction.

    The operations and their order are those of :func:`lbm_jax.core._collision.collide`
    (moments summed in direction order, ``1/rho`` then products, the shifted
    equilibrium ``w r poly + w (r - 1)``, the Smagorinsky model's per-cell rates),
    written per direction so a kernel keeps every value in registers.
    ``with_moments``: return ``(out, rho, u)`` as ``collide`` does.
    """
    dtype = fs[0].dtype
    q, d = lattice.q, lattice.d
    c = lattice.c
    w = [np.asarray(v, dtype) for v in lattice.w]
    rho = fs[0]
    for i in range(1, q):
        rho = rho + fs[i]
    if shift:
        rho = rho + 1
    j = []
    for a in range(d):
        acc = None
        for i in range(q):
            if c[i, a]:
                term = fs[i] if c[i, a] > 0 else -fs[i]
                acc = term if acc is None else acc + term
        j.append(acc)
    inv_rho = 1 / rho
    if force is None:
        u = [ja * inv_rho for ja in j]
    else:
        u = [(ja + 0.5 * fa) * inv_rho for ja, fa in zip(j, force, strict=True)]
    feq, cus = equilibrium_cells(lattice, rho, u, shift=shift)
    neq = [fs[i] - feq[i] for i in range(q)]
    wp = np.asarray(model.omega_plus, dtype)
    wm = np.asarray(model.omega_minus, dtype)
    if model.smagorinsky > 0:
        wp, wm = _smagorinsky_rates(lattice, model, neq, rho)
    opp = lattice.opposite
    if model.kind is Collision.BGK:
        out = [fs[i] - wp * neq[i] for i in range(q)]
    else:
        hp, hm = 0.5 * wp, 0.5 * wm
        out = [
            fs[i] - hp * (neq[i] + neq[opp[i]]) - hm * (neq[i] - neq[opp[i]])
            for i in range(q)
        ]
    if force is not None:
        cp, cm = force_factors(model, wp, wm, dtype)
        uf = u[0] * force[0]
        for a in range(1, d):
            uf = uf + u[a] * force[a]
        for i in range(q):
            cf = _dot(c[i], force)
            sym = w[i] * (9 * (cus[i] * cf) - 3 * uf)
            anti = w[i] * (3 * cf)
            out[i] = out[i] + cp * sym + cm * anti
    return (out, rho, u) if with_moments else out


def equilibrium_cells(
    lattice: Lattice, rho: jax.Array, u: list[jax.Array], *, shift: bool
) -> tuple[list[jax.Array], list[Any]]:
    """``(feq, cu)``: the equilibrium per direction (shifted: ``w r poly + w (r -
    1)``, else ``w r (1 + poly)``) and ``c_i . u``, in the XLA step's order."""
    dtype = rho.dtype
    usq = u[0] * u[0]
    for a in range(1, lattice.d):
        usq = usq + u[a] * u[a]
    cus = [_dot(ci, u) for ci in lattice.c]
    feq = []
    for wi, cu in zip(lattice.w, cus, strict=True):
        w = np.asarray(wi, dtype)
        poly = 3 * cu + 4.5 * (cu * cu) - 1.5 * usq
        feq.append(w * rho * poly + w * (rho - 1) if shift else w * rho * (1 + poly))
    return feq, cus


def _smagorinsky_rates(
    lattice: Lattice, model: CollisionModel, neq: list[jax.Array], rho: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Per-cell ``(omega+, omega-)`` of the Smagorinsky model, as
    :func:`lbm_jax.core._collision._smagorinsky_rates` computes them: the norm of the
    non-equilibrium momentum flux ``Pi_ab = sum_i c_ia c_ib neq_i`` sets an
    effective relaxation time."""
    c = lattice.c
    pi2 = None
    for a in range(lattice.d):
        for b in range(lattice.d):
            pab = None
            for i in range(lattice.q):
                cab = int(c[i, a] * c[i, b])
                if cab:
                    term = neq[i] if cab > 0 else -neq[i]
                    pab = term if pab is None else pab + term
            pi2 = pab * pab if pi2 is None else pi2 + pab * pab
    return smagorinsky_rates_from(model, pi2, rho)


#: Formats whose rounding is the GPU's own narrowing conversion (one
#: instruction: round to nearest, ties to even, IEEE overflow and subnormals).
_NATIVE_NARROWING = {"float16": jnp.float16, "bfloat16": jnp.bfloat16}


def encode_in_kernel(storage: StoragePolicy, v: jax.Array) -> jax.Array:
    """``storage.encode(v)`` inside a kernel.

    float16, bfloat16 and float16 scaled by a power of two (fp16s) round by the
    hardware conversion, which a kernel compiler keeps as written (the integer
    codec of :mod:`mpjax.formats` guards the XLA programs, whose compiler may
    drop a narrowing conversion; its bits are the same, NaN payloads aside);
    every other format takes the storage policy's codec.
    """
    fmt = storage.format
    scale = 0
    inner = fmt
    if getattr(fmt, "inner", None) is not None and hasattr(fmt, "exponent"):
        inner, scale = fmt.inner, int(fmt.exponent)
    native = _NATIVE_NARROWING.get(inner.name)
    if native is None or np.dtype(storage.compute_dtype) != np.dtype(np.float32):
        return storage.encode(v)
    if scale:  # exact: a power of two
        v = v * np.float32(2.0**scale)
    code = v.astype(native)
    if np.dtype(storage.storage_dtype) != np.dtype(native):  # bit patterns
        code = lax.bitcast_convert_type(code, storage.storage_dtype)
    return code


def _dot(ci: np.ndarray, v: list[Any]) -> Any:
    """``sum_a c_a v_a`` for an integer velocity (only its non-zero terms)."""
    acc = None
    for a, ca in enumerate(ci):
        if ca:
            term = v[a] if ca > 0 else -v[a]
            acc = term if acc is None else acc + term
    return 0.0 if acc is None else acc
