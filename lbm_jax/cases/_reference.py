"""Published reference data and ranges used to validate the cases.

The lid-driven cavity tables of Ghia, Ghia & Shin (J. Comput. Phys. 48, 1982,
387-411, Tables I and II) ship with the package in ``data/`` (see its README for the
provenance). Coordinates are normalised by the cavity side, velocities by the lid
speed; the lid moves in +x at y = 1.

>>> y, u = ghia_u(100)
>>> float(y[0]), float(y[-1]), float(u[-1])
(0.0, 1.0, 1.0)
"""

from __future__ import annotations

import csv
import functools
from importlib import resources

import numpy as np

__all__ = [
    "GHIA_REYNOLDS",
    "SCHAEFER_TUREK_2D2",
    "UNCONFINED_RE100",
    "ghia_u",
    "ghia_v",
    "williamson_strouhal",
]

#: Reynolds numbers tabulated by Ghia et al.
GHIA_REYNOLDS = (100, 400, 1000)

#: Schaefer & Turek (1996) benchmark 2D-2 (Re = 100, confined channel): reference
#: ranges of the Strouhal number and the maximum drag and lift coefficients.
SCHAEFER_TUREK_2D2 = {
    "strouhal": (0.295, 0.305),
    "cd_max": (3.22, 3.24),
    "cl_max": (0.99, 1.01),
}

#: Unconfined cylinder at Re = 100: Strouhal number and mean drag ranges.
UNCONFINED_RE100 = {"strouhal": (0.164, 0.169), "cd_mean": (1.32, 1.38)}


@functools.cache
def _table(name: str) -> tuple[tuple[str, ...], np.ndarray]:
    path = resources.files(__package__).joinpath("data", name)
    with path.open("r", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    header = tuple(rows[0])
    values = np.array([[float(v) for v in row] for row in rows[1:]], dtype=np.float64)
    values.setflags(write=False)
    return header, values


def _column(name: str, re: int) -> tuple[np.ndarray, np.ndarray]:
    if re not in GHIA_REYNOLDS:
        raise ValueError(
            f"Ghia et al. tabulate Re in {GHIA_REYNOLDS}, got re={re!r}; pick one of "
            "those for a reference comparison."
        )
    header, values = _table(name)
    col = header.index(f"{header[1][0]}_Re{re}")
    return values[:, 0].copy(), values[:, col].copy()


def ghia_u(re: int) -> tuple[np.ndarray, np.ndarray]:
    """u / U_lid on the vertical centre line x = 1/2: returns ``(y, u)``.

    Raises:
        ValueError: If ``re`` is not one of :data:`GHIA_REYNOLDS`.
    """
    return _column("ghia1982_u.csv", re)


def ghia_v(re: int) -> tuple[np.ndarray, np.ndarray]:
    """v / U_lid on the horizontal centre line y = 1/2: returns ``(x, v)``.

    Raises:
        ValueError: If ``re`` is not one of :data:`GHIA_REYNOLDS`.
    """
    return _column("ghia1982_v.csv", re)


def williamson_strouhal(re: float) -> float:
    """Williamson's fit St = -3.3265/Re + 0.1816 + 1.6e-4 Re (valid for Re 50-180)."""
    return -3.3265 / re + 0.1816 + 1.6e-4 * re
