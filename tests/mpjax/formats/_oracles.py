"""Reference roundings computed independently of the codecs under test."""

from __future__ import annotations

import numpy as np


def round_to_odd_float32(x: np.ndarray) -> np.ndarray:
    """`x` (float64) truncated to float32 with the last bit set when inexact.

    Rounding this to a format with at most 22 significand bits gives the same
    result as rounding `x` directly (round to odd makes double rounding
    innocuous), an oracle independent of how a library converts float64.
    """
    with np.errstate(all="ignore"):
        y = x.astype(np.float32)
        over = np.abs(y.astype(np.float64)) > np.abs(x)
        y = np.where(over, np.nextafter(y, np.float32(0)), y)
        inexact = (y.astype(np.float64) != x).astype(np.uint32)
    return (y.view(np.uint32) | inexact).view(np.float32)
