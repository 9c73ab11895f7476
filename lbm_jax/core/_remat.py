"""Checkpointed loops: reverse mode through many steps in bounded memory.

Reverse-mode differentiation of ``n`` steps needs, for each step, the state it
started from. Storing all of them (the tape) costs ``n`` states; recomputing
everything from the start costs ``n^2 / 2`` steps. :func:`checkpointed_loop`
sits in between with nested checkpoints: with segment lengths ``(k1, k2, ...)``
it keeps the state at the start of every ``k1``-step segment, and while a
segment is differentiated, the state at the start of each of its ``k2``-step
sub-segments, and so on down to single steps. It keeps about
``n/k1 + k1/k2 + ... + k_L`` states and runs the forward steps ``L + 1``
times (once, then once more per level while the gradient flows back).

The states kept are the loop's carry as it is: a simulation's populations in
their storage format, so 16-bit storage halves the memory of the checkpoints
too. The loop is ``lax.scan`` over ``jax.checkpoint``-ed segments, so
``jax.grad``, ``jax.jvp`` and ``jax.vmap`` all pass through it.

>>> import jax, jax.numpy as jnp
>>> def loss(x):
...     return checkpointed_loop(lambda s: 0.5 * s + 1.0, x, 6, (3,)).sum()
>>> jax.grad(loss)(jnp.ones(2)).tolist()  # 0.5**6 each
[0.015625, 0.015625]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax import lax
from jax.custom_derivatives import SymbolicZero

__all__ = [
    "MAX_LEVELS",
    "checkpoint_levels",
    "checkpointed_loop",
    "differentiable_loop",
    "jvp_of_perturbed",
]

#: At most this many nested levels by default: each costs one more forward pass
#: while the gradient flows back.
MAX_LEVELS = 4


def default_levels(steps: int) -> tuple[int, ...]:
    """Segment lengths near the memory optimum for ``steps`` steps.

    Of the nestings with at most :data:`MAX_LEVELS` levels of equal ratio ``k``
    (segments of ``k^(L-1), ..., k`` steps), the one that keeps the fewest states,
    ``L`` times ``k``; the fewer levels (less recomputation) on a tie.

    >>> default_levels(4), default_levels(100), default_levels(1000)
    ((), (25, 5), (216, 36, 6))
    """
    best: tuple[int, tuple[int, ...]] = (steps, ())
    for levels in range(2, MAX_LEVELS + 1):
        k = max(2, math.ceil(steps ** (1.0 / levels) - 1e-9))
        kept = levels * k
        if kept < best[0]:
            best = (kept, tuple(k**j for j in range(levels - 1, 0, -1)))
    return best[1]


def checkpoint_levels(steps: int, every: int | Sequence[int] | None) -> tuple[int, ...]:
    """The segment lengths, outermost first, of ``checkpoint_every=every``.

    Args:
        steps: Steps of the loop (a Python int).
        every: ``None`` for :func:`default_levels`; an int ``k`` to keep a state
            every ``k`` steps and differentiate each segment from its stored
            steps (``1``: keep every step, the tape); a decreasing sequence of
            ints for nested segments, e.g. ``(100, 10)``.

    Raises:
        TypeError: ``every`` is neither ``None``, an int nor a sequence of ints.
        ValueError: A length below 1, or lengths that do not decrease.

    >>> checkpoint_levels(1000, 50), checkpoint_levels(1000, (100, 10))
    ((50,), (100, 10))
    """
    if every is None:
        return default_levels(steps)
    levels = (every,) if isinstance(every, int) else every
    if isinstance(levels, (str, bytes)) or not isinstance(levels, Sequence):
        raise TypeError(
            f"checkpoint_every must be an int or a sequence of ints, got {every!r}."
        )
    for k in levels:
        if isinstance(k, bool) or not isinstance(k, int):
            raise TypeError(f"checkpoint_every must hold ints, got {k!r} in {every!r}.")
        if k < 1:
            raise ValueError(f"checkpoint_every must be >= 1, got {every!r}.")
    if any(a <= b for a, b in zip(levels, levels[1:], strict=False)):
        raise ValueError(
            f"nested checkpoint_every lengths must decrease (outermost first), "
            f"got {every!r}."
        )
    return tuple(k for k in levels if k > 1)


def checkpointed_loop(
    step: Callable[[Any], Any], state: Any, steps: int, levels: Sequence[int]
) -> Any:
    """``steps`` applications of ``step`` to ``state``, with nested checkpoints.

    Args:
        step: A pure ``step(state) -> state`` (any pytree).
        state: The initial state.
        steps: Number of steps (a Python int >= 0).
        levels: Segment lengths, outermost first (see :func:`checkpoint_levels`);
            empty: every step's state is kept.
    """
    if steps == 0:
        return state
    if not levels:
        one = jax.checkpoint(step, prevent_cse=False)
        return lax.scan(lambda s, _: (one(s), None), state, length=steps)[0]
    k, inner = levels[0], tuple(levels[1:])
    segments, rest = divmod(steps, k)

    @jax.checkpoint
    def segment(s: Any) -> Any:
        return checkpointed_loop(step, s, k, inner)

    if segments:
        state = lax.scan(lambda s, _: (segment(s), None), state, length=segments)[0]
    return checkpointed_loop(step, state, rest, inner)


def differentiable_loop(
    fast: Callable[[Any, Any], Any],
    step: Callable[[Any, Any], Any],
    args: tuple[Any, Any],
    steps: int,
    levels: Sequence[int],
) -> Any:
    """``fast(params, state)`` when nothing is differentiated; its derivative is
    that of ``steps`` applications of ``step(params, state)`` in a
    :func:`checkpointed_loop`.

    ``fast`` is any loop that computes the same ``steps`` steps (a backend's own
    multi-step loop, a traced step count); ``step`` is the differentiable
    reference step. Both take ``args = (params, state)``: everything a
    derivative may flow from is an argument, never a closure.

    >>> import jax
    >>> def halve(p, s):
    ...     return p * s
    >>> fast = lambda p, s: p**3 * s
    >>> jax.grad(lambda p: differentiable_loop(fast, halve, (p, 1.0), 3, ()))(0.5)
    Array(0.75, dtype=float32, weak_type=True)
    """

    @jax.custom_jvp
    def loop(params: Any, state: Any) -> Any:
        return fast(params, state)

    def _checkpointed(primals: tuple, tangents: tuple) -> tuple:
        def reference(params: Any, state: Any) -> Any:
            return checkpointed_loop(lambda s: step(params, s), state, steps, levels)

        return jvp_of_perturbed(reference, primals, tangents)

    loop.defjvp(_checkpointed, symbolic_zeros=True)
    return loop(*args)


def jvp_of_perturbed(fun: Callable[..., Any], primals: tuple, tangents: tuple) -> tuple:
    """``jax.jvp(fun, primals, tangents)`` in a ``custom_jvp`` rule defined with
    ``symbolic_zeros=True``: the leaves whose tangent is a symbolic zero are held
    constant (closed over) instead of given zero tangents, so the derivative
    rules inside ``fun`` see them as not differentiated too.

    >>> import jax
    >>> f = jax.custom_jvp(lambda a, b: a * b)
    >>> rule = f.defjvp(
    ...     lambda p, t: jvp_of_perturbed(lambda a, b: a * b, p, t),
    ...     symbolic_zeros=True,
    ... )
    >>> float(jax.grad(f)(2.0, 3.0))
    3.0
    """
    leaves, tree = jax.tree.flatten(primals)
    dots = jax.tree.leaves(tangents, is_leaf=_is_zero)
    moving = [k for k, t in enumerate(dots) if not _is_zero(t)]

    def of_moving(*values: Any) -> Any:
        full = list(leaves)
        for k, v in zip(moving, values, strict=True):
            full[k] = v
        return fun(*jax.tree.unflatten(tree, full))

    return jax.jvp(
        of_moving, tuple(leaves[k] for k in moving), tuple(dots[k] for k in moving)
    )


def _is_zero(t: Any) -> bool:
    return isinstance(t, SymbolicZero)
