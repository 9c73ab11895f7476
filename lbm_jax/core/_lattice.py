"""Lattice velocity sets, derived entirely from their velocities and weights.

A :class:`Lattice` is defined by its integer velocities ``c`` (shape ``(Q, D)``) and
weights ``w`` (shape ``(Q,)``). Everything else (the opposite directions, the speed
of sound) is derived once, in NumPy, when the lattice is built; the construction
checks the isotropy conditions that make the lattice a valid second-order velocity
set, so a typo in a table cannot go unnoticed.

>>> lat = get_lattice("D2Q9")
>>> lat.q, lat.d
(9, 2)
>>> east = lat.index((1, 0))
>>> int(lat.opposite[east]) == lat.index((-1, 0))
True
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import itertools
from collections.abc import Iterable
from fractions import Fraction

import numpy as np

from lbm_jax.core._units import CS2

__all__ = ["Lattice", "did_you_mean", "get_lattice", "list_lattices"]


@dataclasses.dataclass(frozen=True, eq=False)
class Lattice:
    """A DdQq velocity set.

    Attributes:
        name: Conventional name, e.g. ``"D3Q19"``.
        c: Integer velocities, shape ``(Q, D)``; ``c[0]`` is the rest velocity.
        w: Weights, shape ``(Q,)``, float64, summing to one.

    Lattices compare and hash by name and velocity table, so they can be used as
    static arguments and dictionary keys.
    """

    name: str
    c: np.ndarray
    w: np.ndarray

    def __post_init__(self) -> None:
        c = np.asarray(self.c)
        w = np.asarray(self.w, dtype=np.float64)
        if c.ndim != 2 or w.shape != (c.shape[0],):
            raise ValueError(
                f"Lattice {self.name!r}: c must have shape (Q, D) and w shape (Q,), "
                f"got c {c.shape} and w {w.shape}."
            )
        if not np.all(c == np.round(c)):
            raise ValueError(f"Lattice {self.name!r}: velocities must be integers.")
        c = c.astype(np.int64)
        if len({tuple(ci) for ci in c}) != len(c):
            raise ValueError(f"Lattice {self.name!r}: velocities must be distinct.")
        d = c.shape[1]
        checks = {
            "sum w = 1": (w.sum(), 1.0),
            "sum w c = 0": (w @ c, np.zeros(d)),
            "sum w c c = cs2 I": (np.einsum("q,qa,qb->ab", w, c, c), CS2 * np.eye(d)),
            "sum w c c c = 0": (np.einsum("q,qa,qb,qc->abc", w, c, c, c), 0.0),
        }
        for what, (got, want) in checks.items():
            if not np.allclose(got, want, rtol=0.0, atol=1e-14):
                raise ValueError(
                    f"Lattice {self.name!r} violates the isotropy condition {what}; "
                    "check the velocity and weight tables."
                )
        c.setflags(write=False)
        w.setflags(write=False)
        object.__setattr__(self, "c", c)
        object.__setattr__(self, "w", w)

    @property
    def q(self) -> int:
        """Number of discrete velocities Q."""
        return int(self.c.shape[0])

    @property
    def d(self) -> int:
        """Number of spatial dimensions D."""
        return int(self.c.shape[1])

    @property
    def cs2(self) -> float:
        """Squared speed of sound (1/3)."""
        return CS2

    @functools.cached_property
    def opposite(self) -> np.ndarray:
        """Index of the opposite velocity of each direction, shape ``(Q,)``."""
        lookup = {tuple(ci): i for i, ci in enumerate(self.c)}
        missing = [tuple(ci) for ci in self.c if tuple(-ci) not in lookup]
        if missing:
            raise ValueError(
                f"Lattice {self.name!r} is not symmetric: no opposite for {missing}."
            )
        opp = np.array([lookup[tuple(-ci)] for ci in self.c], dtype=np.int64)
        opp.setflags(write=False)
        return opp

    def index(self, velocity: tuple[int, ...]) -> int:
        """Return the direction index of an integer velocity vector.

        Raises:
            ValueError: If the velocity is not part of this lattice.
        """
        target = tuple(int(v) for v in velocity)
        for i, ci in enumerate(self.c):
            if tuple(int(v) for v in ci) == target:
                return i
        raise ValueError(
            f"Velocity {target} is not in lattice {self.name}; its velocities are "
            f"{[tuple(int(v) for v in ci) for ci in self.c]}."
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Lattice):
            return NotImplemented
        return (
            self.name == other.name
            and np.array_equal(self.c, other.c)
            and np.array_equal(self.w, other.w)
        )

    def __hash__(self) -> int:
        return hash((self.name, self.c.tobytes(), self.w.tobytes()))

    def __repr__(self) -> str:
        return f"Lattice({self.name!r}, q={self.q}, d={self.d})"


def _build(name: str, d: int, weights_by_norm: dict[int, Fraction]) -> Lattice:
    """Velocities with entries in {-1, 0, 1} whose squared norm has a weight.

    Velocities are ordered rest first, then by squared norm, each followed directly
    by its opposite.
    """
    vels = [
        v
        for v in itertools.product((0, 1, -1), repeat=d)
        if sum(x * x for x in v) in weights_by_norm
    ]
    ordered: list[tuple[int, ...]] = []
    for norm in sorted(weights_by_norm):
        for v in vels:
            if sum(x * x for x in v) != norm or v in ordered:
                continue
            ordered.append(v)
            neg = tuple(-x for x in v)
            if neg != v:
                ordered.append(neg)
    c = np.array(ordered, dtype=np.int64)
    w = np.array(
        [float(weights_by_norm[int((ci * ci).sum())]) for ci in c], dtype=np.float64
    )
    return Lattice(name, c, w)


_TABLES: dict[str, tuple[int, dict[int, Fraction]]] = {
    "D2Q9": (2, {0: Fraction(4, 9), 1: Fraction(1, 9), 2: Fraction(1, 36)}),
    "D3Q19": (3, {0: Fraction(1, 3), 1: Fraction(1, 18), 2: Fraction(1, 36)}),
    "D3Q27": (
        3,
        {
            0: Fraction(8, 27),
            1: Fraction(2, 27),
            2: Fraction(1, 54),
            3: Fraction(1, 216),
        },
    ),
}


def get_lattice(name: str | Lattice) -> Lattice:
    """Return a lattice by name (``"D2Q9"``, ``"D3Q19"``, ``"D3Q27"``).

    Args:
        name: Lattice name (case-insensitive) or a :class:`Lattice`, returned as is.

    Raises:
        ValueError: For an unknown name.
    """
    if isinstance(name, Lattice):
        return name
    if not isinstance(name, str):
        raise TypeError(
            f"Lattice name must be a str or Lattice, got {type(name).__name__}."
        )
    key = name.upper()
    if key not in _TABLES:
        raise ValueError(
            f"Unknown lattice {name!r}{did_you_mean(key, _TABLES)}; expected one "
            f"of {list_lattices()}."
        )
    return _named_lattice(key)


@functools.cache
def _named_lattice(key: str) -> Lattice:
    """The one shared instance of a tabulated lattice (built once per process)."""
    d, weights = _TABLES[key]
    return _build(key, d, weights)


def did_you_mean(given: str, names: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the names closest to ``given``, or ``""``.

    >>> did_you_mean("cavty", ["cavity", "cavity3d", "capsule"])
    " (did you mean 'cavity' or 'cavity3d'?)"
    >>> did_you_mean("xyz", ["cavity"])
    ''
    """
    close = difflib.get_close_matches(given, [str(n) for n in names], n=3)
    if not close:
        return ""
    return f" (did you mean {' or '.join(map(repr, close))}?)"


def list_lattices() -> tuple[str, ...]:
    """Names accepted by :func:`get_lattice`."""
    return tuple(_TABLES)
