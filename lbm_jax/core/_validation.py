"""Host-side validation of simulation inputs (runs before anything is traced).

Every check raises ``ValueError`` or ``TypeError`` with a message that says what was
given, what is expected and how to fix it.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from lbm_jax.core._boundaries import CellType
from lbm_jax.core._lattice import Lattice
from lbm_jax.core._units import check_mach

__all__ = [
    "GRID_AXES",
    "check_cell_type",
    "check_density",
    "check_devices",
    "check_int",
    "check_real",
    "check_shape",
    "check_slab",
    "check_solid_fraction",
    "check_speed",
    "check_steps",
    "is_traced",
    "renamed_keyword",
    "traced_field",
    "vector_field",
    "vector_or_field",
]

_T = TypeVar("_T")


def renamed_keyword(
    value: _T | None,
    old_value: _T | None,
    *,
    name: str,
    old_name: str,
    caller: str,
    what: str,
) -> _T | None:
    """The value of a renamed keyword argument, given by its new or old name.

    The old name is a deprecated alias kept for one release: given alone, it
    warns (``DeprecationWarning`` naming the spelling to use) and its value is
    taken; given together with the new name, it is an error.

    Args:
        value: The value given by the new name (``None``: not given).
        old_value: The value given by the old name (``None``: not given).
        name: The new name.
        old_name: The deprecated name.
        caller: The function or class that takes them (quoted in the messages).
        what: What the argument means, in a few words.

    Raises:
        ValueError: If both names are given.

    >>> renamed_keyword(10, None, name="callback_every", old_name="every",
    ...                 caller="run", what="steps between callback calls")
    10
    """
    if old_value is None:
        return value
    if value is not None:
        raise ValueError(
            f"{caller} got both {name}={value!r} and its deprecated alias "
            f"{old_name}={old_value!r}; give {name}= once ({what})."
        )
    warnings.warn(
        f"{caller}({old_name}=...) is deprecated; use {name}=... ({what}).",
        DeprecationWarning,
        stacklevel=3,
    )
    return old_value


def check_int(
    value: object, name: str, minimum: int, maximum: int | None = None
) -> int:
    """Return ``value`` as an int, or raise if it is not an integer in range.

    Args:
        value: The value to check (bools are rejected).
        name: Its name, quoted in the message.
        minimum: Smallest accepted value.
        maximum: Largest accepted value, or ``None`` for no bound.

    Raises:
        TypeError: If ``value`` is not an integer.
        ValueError: If it lies outside ``[minimum, maximum]``.
    """
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(
            f"{name} must be an integer, got {value!r} of type {type(value).__name__}."
        )
    if value < minimum or (maximum is not None and value > maximum):
        bound = (
            f"at least {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        )
        raise ValueError(f"{name} must be {bound}, got {value}.")
    return int(value)


def check_real(value: object, name: str) -> float:
    """Return ``value`` as a finite float, or raise.

    Raises:
        TypeError: If ``value`` is not a real number (bools are rejected).
        ValueError: If it is not finite.
    """
    if isinstance(value, bool) or not isinstance(
        value, int | float | np.integer | np.floating
    ):
        raise TypeError(
            f"{name} must be a real number, got {value!r} of type "
            f"{type(value).__name__}."
        )
    value = float(value)
    if not np.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}.")
    return value


def check_shape(shape: Sequence[int], lattice: Lattice) -> tuple[int, ...]:
    """Validate a grid size against the lattice dimension."""
    if not isinstance(shape, Sequence | np.ndarray) or not all(
        isinstance(n, int | np.integer) and not isinstance(n, bool) for n in shape
    ):
        raise TypeError(
            f"shape must be a sequence of ints ({lattice.d} for {lattice.name}), "
            f"got {shape!r}; pass e.g. shape={(16,) * lattice.d}."
        )
    shape = tuple(int(n) for n in shape)
    if len(shape) != lattice.d or min(shape) < 1:
        raise ValueError(
            f"shape {shape} does not fit lattice {lattice.name}: expected "
            f"{lattice.d} positive sizes."
        )
    return shape


def is_traced(tree: Any) -> bool:
    """Whether any leaf of ``tree`` is a tracer: the call is inside a
    transformation (``jax.jit``, ``jax.grad``, ``jax.vmap``, ...), where values
    are not known on the host."""
    return any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(tree))


def vector_or_field(d: int, shape: tuple[int, ...]) -> str:
    """How an error names the two accepted shapes of a vector input.

    >>> vector_or_field(2, (4, 3))
    'a vector of shape (2,) or a field of shape (2, 4, 3)'
    """
    return f"a vector of shape ({d},) or a field of shape {(d, *shape)}"


def traced_field(
    name: str, value: ArrayLike, shapes: Sequence[tuple[int, ...]], wanted: str
) -> jax.Array:
    """A traced input as a real JAX array of one of ``shapes``: its dtype and
    shape checked, its values not (they are not known on the host).

    Raises:
        TypeError: Not a real number or array of them.
        ValueError: Another shape; the message says ``name must be <wanted>``.
    """
    try:
        arr = jnp.asarray(value)
    except TypeError as err:
        raise TypeError(f"{name} must be a real number or array: {err}") from None
    if not jnp.issubdtype(arr.dtype, jnp.number) or jnp.iscomplexobj(arr):
        raise TypeError(f"{name} must be real, got dtype {arr.dtype}.")
    if arr.shape not in tuple(shapes):
        raise ValueError(f"{name} must be {wanted}, got shape {arr.shape}.")
    return arr


def check_density(name: str, value: ArrayLike, shape: tuple[int, ...]) -> np.ndarray:
    """A positive, finite scalar or grid-shaped density as a float64 grid."""
    rho = np.asarray(value)
    if rho.dtype.kind not in "iuf":
        raise TypeError(
            f"{name} must be a positive real number or an array of them, got "
            f"{value!r} (dtype {rho.dtype}); pass e.g. {name}=1.0."
        )
    rho = rho.astype(np.float64)
    if rho.shape not in ((), shape):
        raise ValueError(
            f"{name} must be a scalar or of shape {shape}, got shape {rho.shape}."
        )
    if not np.all(np.isfinite(rho) & (rho > 0)):
        raise ValueError(f"{name} must be finite and positive everywhere.")
    return np.broadcast_to(rho, shape)


def check_solid_fraction(value: ArrayLike, shape: tuple[int, ...]) -> np.ndarray:
    """A gray cells' solid fraction: one finite value in ``[0, 1]`` per grid
    cell (bools mean 0 and 1), as a read-only float64 grid.

    Raises:
        TypeError: Values that are not real numbers.
        ValueError: Another shape, or values that are not finite or lie
            outside ``[0, 1]``.

    >>> check_solid_fraction([[0.0, 0.5], [1.0, 0.25]], (2, 2)).dtype
    dtype('float64')
    """
    ns = np.asarray(value)
    if ns.dtype.kind not in "biuf":
        raise TypeError(
            f"solid_fraction must hold real numbers in [0, 1], got dtype "
            f"{ns.dtype}; pass e.g. np.zeros({shape})."
        )
    if ns.shape != shape:
        raise ValueError(
            f"solid_fraction has shape {ns.shape} but the grid is {shape}; pass "
            "one value in [0, 1] per grid cell."
        )
    ns = np.array(ns, dtype=np.float64)
    if not np.all(np.isfinite(ns)):
        raise ValueError("solid_fraction contains non-finite values.")
    if ns.size and (ns.min() < 0 or ns.max() > 1):
        raise ValueError(
            f"solid_fraction must lie in [0, 1] (0 fluid, 1 solid), got values "
            f"from {ns.min():g} to {ns.max():g}; clip it, e.g. "
            "np.clip(solid_fraction, 0, 1)."
        )
    ns.setflags(write=False)
    return ns


def check_slab(slab: int, nx: int) -> int:
    """Validate the x-planes per slab (at most the x size per device)."""
    return check_int(slab, "slab", 1, nx)


def vector_field(
    name: str, value: ArrayLike | None, d: int, shape: tuple[int, ...]
) -> np.ndarray:
    """A ``(D,)`` vector or ``(D, *shape)`` field as a float64 ``(D, *shape)`` array.

    A vector (or ``None``, zero) comes back as a read-only broadcast view, which
    holds ``D`` numbers rather than a grid; a field comes back as a copy.
    """
    if value is None:
        value = np.zeros(d)
    arr = np.asarray(value, dtype=np.float64)
    if arr.shape == (d,):
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{name} contains non-finite values.")
        return np.broadcast_to(arr.reshape((d,) + (1,) * len(shape)), (d, *shape))
    if arr.shape != (d, *shape):
        raise ValueError(
            f"{name} must be {vector_or_field(d, shape)}, got shape {arr.shape}."
        )
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains non-finite values.")
    return np.array(arr)


def check_speed(name: str, u: np.ndarray, mask: np.ndarray | None = None) -> None:
    """Reject a velocity field whose largest speed (where ``mask``) is too high."""
    if u.ndim > 1 and u.size and not any(u.strides[1:]):  # a uniform broadcast view
        if mask is not None and not np.any(mask):
            return
        u = u.reshape(u.shape[0], -1)[:, :1]
        mask = None
    speed = np.sqrt(np.sum(u * u, axis=0))
    if mask is not None:
        speed = np.where(mask, speed, 0.0)
    check_mach(float(speed.max()) if speed.size else 0.0, what=name)


def check_cell_type(cell_type: ArrayLike | None, shape: tuple[int, ...]) -> np.ndarray:
    """Validate a cell-type grid (bools mean SOLID); return it as int8."""
    if cell_type is None:
        return np.zeros(shape, dtype=np.int8)
    ct = np.asarray(cell_type)
    if ct.shape != shape:
        raise ValueError(
            f"cell_type has shape {ct.shape} but the grid is {shape}; pass "
            "one cell-type code per grid cell."
        )
    if ct.dtype == np.bool_:
        ct = ct.astype(np.int8)  # True -> SOLID
    if not np.issubdtype(ct.dtype, np.integer):
        raise TypeError(
            f"cell_type must hold integer CellType codes (or bools for "
            f"solid), got dtype {ct.dtype}."
        )
    codes = {int(c) for c in CellType}
    bad = sorted(set(np.unique(ct).tolist()) - codes)
    if bad:
        raise ValueError(
            f"cell_type contains unknown codes {bad}; valid codes are "
            f"{ {c.name: int(c) for c in CellType} }."
        )
    ct = ct.astype(np.int8)
    if not np.any(ct == CellType.FLUID):
        raise ValueError("cell_type has no FLUID cell.")
    return ct


#: Names of the grid axes, as mesh axis names of a domain decomposition.
GRID_AXES = ("x", "y", "z")


def check_devices(devices: object, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Validate a domain decomposition; return the sub-domains per grid axis.

    Args:
        devices: ``None`` (one device), an int (split x over that many devices),
            a tuple with one sub-domain count per grid axis, or a
            ``jax.sharding.Mesh`` whose axis names are among ``"x"``, ``"y"``,
            ``"z"`` (a grid axis not named in the mesh is not split).
        shape: Grid size.

    Raises:
        TypeError: For anything else.
        ValueError: A count below 1, a tuple of the wrong length, more
            sub-domains than devices, or a count that does not divide its axis.
    """
    from jax.sharding import Mesh

    names = GRID_AXES[: len(shape)]
    if devices is None:
        return (1,) * len(shape)
    if isinstance(devices, Mesh):
        unknown = [a for a in devices.axis_names if a not in names]
        if unknown:
            raise ValueError(
                f"the mesh's axis names {tuple(devices.axis_names)} must be among "
                f"{names} (one per grid axis it splits), got {unknown}; build it "
                f"as e.g. Mesh(devices.reshape(2, 1), {names[:2]})."
            )
        splits = tuple(int(devices.shape.get(a, 1)) for a in names)
        source = f"the mesh {dict(devices.shape)}"
    elif isinstance(devices, tuple | list):
        if len(devices) != len(shape):
            raise ValueError(
                f"devices={tuple(devices)!r} must give one sub-domain count per "
                f"grid axis ({len(shape)} for shape {shape}), e.g. "
                f"devices={(2,) + (1,) * (len(shape) - 1)}."
            )
        splits = tuple(check_int(n, f"devices[{a}]", 1) for a, n in enumerate(devices))
        source = f"devices={splits}"
    elif isinstance(devices, int | np.integer) and not isinstance(devices, bool):
        splits = (check_int(devices, "devices", 1),) + (1,) * (len(shape) - 1)
        source = f"devices={int(devices)}"
    else:
        raise TypeError(
            f"devices must be an int, a tuple of ints (sub-domains per grid axis) "
            f"or a jax.sharding.Mesh, got {devices!r} of type "
            f"{type(devices).__name__}."
        )
    total = int(np.prod(splits))
    available = len(jax.devices())
    if total > available:
        raise ValueError(
            f"{source} requests {total} sub-domains but {available} device(s) are "
            "available; on a CPU start Python with "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={total}."
        )
    for name, n, size in zip(names, splits, shape, strict=True):
        if size % n:
            raise ValueError(
                f"the grid's {name} size {size} is not divisible by {source} "
                f"({n} sub-domains along {name}); choose sizes that split evenly."
            )
    return splits


def check_steps(steps: int) -> int:
    """Validate a number of time steps (a non-negative int32)."""
    return check_int(steps, "steps", 0, 2**31 - 2)
