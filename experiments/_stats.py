"""Statistics of paired benchmark rounds: the median ratio and its interval.

Benchmarks on a shared machine compare two variants round by round (a paired
ratio per round) and summarise the ratios by their median and a distribution-free
confidence interval of it, so that a stated target is judged as met, missed or
unresolved by the measurement.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

__all__ = ["LEVEL", "median_interval", "spread_verdict", "verdict"]

#: Confidence level of the intervals of median ratios.
LEVEL = 0.95


def median_interval(
    values: Sequence[float], level: float = LEVEL
) -> tuple[float, float]:
    """Distribution-free confidence interval of the median of ``values``.

    The interval runs from the ``k``-th smallest to the ``k``-th largest value,
    with ``k`` the largest count for which ``P(Binomial(n, 1/2) < k)`` is at most
    ``(1 - level) / 2``; it covers the true median with probability at least
    ``level`` for any continuous distribution of independent values.

    >>> median_interval(range(1, 101))  # ranks 40 and 61 of 100
    (40, 61)

    Args:
        values: independent samples, e.g. per-round time ratios.
        level: confidence level in (0, 1).

    Returns:
        ``(low, high)``.

    Raises:
        ValueError: for a ``level`` outside (0, 1), or fewer values than the level
            needs (6 for 95 %).
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level!r}; e.g. 0.95.")
    x = sorted(values)
    n = len(x)
    tail = (1.0 - level) / 2.0
    k, below = 0, 0.0  # below = P(Binomial(n, 1/2) < k)
    while k < n and below + math.comb(n, k) / 2**n <= tail:
        below += math.comb(n, k) / 2**n
        k += 1
    if k == 0:
        needed = math.ceil(math.log2(1.0 / tail))
        raise ValueError(
            f"{n} values are too few for a {level:.0%} interval of the median; "
            f"give at least {needed} (more rounds)."
        )
    return x[k - 1], x[n - k]


def verdict(low: float, high: float, limit: float, *, at_most: bool) -> str:
    """Whether an interval meets ``value <= limit`` (or ``>=`` with ``at_most=False``).

    >>> verdict(0.98, 1.01, 1.05, at_most=True), verdict(1.0, 1.1, 1.05, at_most=True)
    ('met', 'unresolved')

    Returns:
        ``"met"`` when the whole interval meets the limit, ``"missed"`` when none
        of it does, ``"unresolved"`` when it straddles the limit (the measurement
        cannot tell).
    """
    if at_most:
        met, missed = high <= limit, low > limit
    else:
        met, missed = low >= limit, high < limit
    return "met" if met else "missed" if missed else "unresolved"


def spread_verdict(
    values: Sequence[float], low: float, high: float = math.inf
) -> tuple[bool, str | None]:
    """Judge a timing figure measured a few times against ``[low, high]``.

    The median decides a pass. A median outside the bounds is a real miss when
    the whole spread (smallest to largest value) misses too (:func:`verdict`
    ``"missed"``); when the spread straddles the bound the measurement cannot
    tell (a loaded machine spreads the values) and the check is unresolved.

    >>> spread_verdict([1.1, 1.2, 1.3], 1.0)
    (True, None)
    >>> spread_verdict([0.9, 0.94, 1.05], 1.0)
    (False, 'median 0.94, spread 0.9-1.05 straddles >= 1')
    >>> spread_verdict([0.5, 0.6, 0.7], 1.0)
    (False, None)

    Returns:
        ``(passed, unresolved)``: ``unresolved`` is the spread in words when the
        check failed only because the spread straddles its bound, else ``None``.
    """
    x = sorted(float(v) for v in values)
    if not x or not all(math.isfinite(v) for v in x):
        return False, None
    median = statistics.median(x)
    if low <= median <= high:
        return True, None
    at_most = median > high
    limit = high if at_most else low
    if verdict(x[0], x[-1], limit, at_most=at_most) == "missed":
        return False, None
    bound = f"<= {high:g}" if at_most else f">= {low:g}"
    return (
        False,
        f"median {median:.3g}, spread {x[0]:.3g}-{x[-1]:.3g} straddles {bound}",
    )
