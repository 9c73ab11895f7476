"""Stop criteria for the run driver: when the observed values stop changing.

A ``stop(state, history) -> bool scalar`` is evaluated by :func:`lbm_jax.run` on
the device after every sample; :func:`steady` builds the usual one from
:func:`relative_change` between two samples of the ``history``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from lbm_jax.core._validation import check_int, renamed_keyword
from lbm_jax.runs._loop import History

__all__ = ["relative_change", "steady"]


def relative_change(new: Any, old: Any) -> jax.Array:
    """Relative L2 change ``||new - old|| / ||new||`` over all leaves of two pytrees.

    >>> float(relative_change({"a": jnp.array([3.0, 4.0])}, {"a": jnp.zeros(2)}))
    1.0
    """
    pairs = list(zip(jax.tree.leaves(new), jax.tree.leaves(old), strict=True))
    diff = sum(jnp.sum(jnp.square(jnp.asarray(a) - b)) for a, b in pairs)
    norm = sum(jnp.sum(jnp.square(jnp.asarray(a))) for a, _ in pairs)
    return jnp.sqrt(diff) / jnp.sqrt(norm)


def steady(
    tol: float,
    *,
    sample_every: int | None = None,
    lag: int = 1,
    interval: int | None = None,
) -> Callable[[Any, History], jax.Array]:
    """A ``stop`` that ends a run once the observed values stop changing.

    The run stops after a sample whose :func:`relative_change` against the sample
    ``lag`` samples earlier, divided by ``sample_every``, is below ``tol``: pass
    the run's ``sample_every`` for a change per step, or leave it out for a change
    per sample. A ``lag`` above 1 judges a slow approach (an exponential
    relaxation over many samples) on the change over ``lag`` samples; it must be
    below the driver's ``window``.

    Args:
        tol: The largest relative change (per step, or per sample) of a steady
            run.
        sample_every: Steps between two samples of the run (default 1: the
            change per sample).
        lag: Samples between the two compared.
        interval: Deprecated alias of ``sample_every`` (it warns; removed in the
            next release).

    Raises:
        ValueError: If ``tol`` is negative, ``sample_every``/``lag`` not positive,
            or ``sample_every`` given together with its alias ``interval``.
    """
    sample_every = renamed_keyword(
        sample_every,
        interval,
        name="sample_every",
        old_name="interval",
        caller="lbm_jax.steady",
        what="steps between two samples of the run",
    )
    if not tol >= 0:
        raise ValueError(f"tol must be non-negative, got {tol!r}.")
    sample_every = check_int(
        1 if sample_every is None else sample_every, "sample_every", 1
    )
    lag = check_int(lag, "lag", 1)

    def stop(state: Any, history: History) -> jax.Array:
        change = relative_change(history.latest(0), history.latest(lag))
        return (history.count > lag) & (change / sample_every < tol)

    return stop
