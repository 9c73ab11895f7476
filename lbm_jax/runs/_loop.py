"""The compiled chunk of the run driver: a ``while_loop`` of steps, checks, samples.

The program of :data:`run_chunk` advances a state from one step to another inside
one ``lax.while_loop``: it runs the step up to the next event (a health check every
``check_every`` steps, a sample every ``sample_every`` steps, the chunk's end),
checks, samples ``observe`` into a ring buffer and evaluates ``stop``. The step,
health, observe and stop callables reach the compiled program split in two: their
array leaves (a simulation's boundary arrays, ``jax.tree_util.Partial``
arguments) as arguments, everything else as a hashable static plan, so one program
serves every call with the same functions.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = ["History", "Plan", "run_chunk", "split"]


class History(NamedTuple):
    """The most recent samples of a run, as ``stop(state, history)`` sees them.

    Attributes:
        values: The sampled pytree; every leaf has a leading axis of ``window``
            slots, filled in turn (sample ``k`` lives in slot ``k % window``).
            ``None`` when the run observes nothing.
        count: Number of samples taken so far in this run (int32 scalar).
    """

    values: Any
    count: jax.Array

    def latest(self, k: int = 0) -> Any:
        """The ``k``-th most recent sample (``0``: the newest).

        Meaningful only when ``count > k``; check ``count`` before relying on it.
        """
        leaves = jax.tree.leaves(self.values)
        if not leaves:
            return self.values
        slot = (self.count - 1 - k) % leaves[0].shape[0]
        return jax.tree.map(lambda v: v[slot], self.values)


@dataclasses.dataclass(frozen=True)
class _Frozen:
    """A callable with its array leaves taken out (hashable, a static argument)."""

    treedef: Any
    leaves: tuple[Any, ...]
    dynamic: tuple[int, ...]
    method: bool


def split(fn: Any) -> tuple[list[Any], _Frozen | None]:
    """Split a callable into its array leaves and a hashable remainder."""
    if fn is None:
        return [], None
    method = inspect.ismethod(fn)
    leaves, treedef = jax.tree.flatten((fn.__func__, fn.__self__) if method else fn)
    dynamic = tuple(
        i for i, x in enumerate(leaves) if isinstance(x, jax.Array | np.ndarray)
    )
    static = tuple(None if i in dynamic else x for i, x in enumerate(leaves))
    return [leaves[i] for i in dynamic], _Frozen(treedef, static, dynamic, method)


def _join(frozen: _Frozen | None, dynamic: list[Any]) -> Any:
    """Rebuild a callable split by :func:`_split` (with traced arrays)."""
    if frozen is None:
        return None
    leaves = list(frozen.leaves)
    for i, x in zip(frozen.dynamic, dynamic, strict=True):
        leaves[i] = x
    tree = jax.tree.unflatten(frozen.treedef, leaves)
    return functools.partial(tree[0], tree[1]) if frozen.method else tree


@dataclasses.dataclass(frozen=True)
class Plan:
    """Static description of a compiled chunk (hashable)."""

    step: _Frozen
    simulation: bool
    healthy: _Frozen
    observe: _Frozen | None
    stop: _Frozen | None
    check_every: int
    sample_every: int
    window: int


def _chunk_impl(
    dynamic: tuple[list[Any], ...],
    state: Any,
    buffer: Any,
    count: jax.Array,
    start: jax.Array,
    end: jax.Array,
    plan: Plan,
) -> tuple[Any, ...]:
    """Advance from step ``start`` to ``end`` (counted from the run's start)."""
    step, healthy, observe, stop = (
        _join(f, d)
        for f, d in zip(
            (plan.step, plan.healthy, plan.observe, plan.stop), dynamic, strict=True
        )
    )
    check, every = plan.check_every, plan.sample_every

    def advance(state: Any, k: jax.Array) -> Any:
        if plan.simulation:
            return step.advance(state, k)
        return lax.fori_loop(0, k, lambda _, s: step(s), state)

    def is_healthy(state: Any) -> jax.Array:
        ok = jnp.asarray(healthy(state))
        if ok.shape != () or ok.dtype != jnp.bool_:
            raise TypeError(
                f"healthy(state) must return a bool scalar, got {ok.dtype} {ok.shape}."
            )
        return ok

    def sample(state: Any, buffer: Any, count: jax.Array) -> tuple[Any, ...]:
        if observe is not None:
            value = observe(state)
            buffer = jax.tree.map(
                lambda b, v: lax.dynamic_update_index_in_dim(
                    b, jnp.asarray(v).astype(b.dtype), count % plan.window, 0
                ),
                buffer,
                value,
            )
        count = count + 1
        stopped = jnp.asarray(False)
        if stop is not None:
            stopped = jnp.asarray(stop(state, History(buffer, count)))
            if stopped.shape != () or stopped.dtype != jnp.bool_:
                raise TypeError(
                    "stop(state, history) must return a bool scalar, got "
                    f"{stopped.dtype} {stopped.shape}."
                )
        return buffer, count, stopped

    def cond(carry: tuple[Any, ...]) -> jax.Array:
        _, _, _, t, bad, _, stopped = carry
        return (t < end) & (bad < 0) & ~stopped

    def body(carry: tuple[Any, ...]) -> tuple[Any, ...]:
        state, buffer, count, t, bad, last_good, stopped = carry
        target = (t // check + 1) * check
        if every:
            target = jnp.minimum(target, (t // every + 1) * every)
        target = jnp.minimum(target, end)
        state = advance(state, target - t)
        t = target
        at_check = (t % check == 0) | (t == end)
        ok = lax.cond(at_check, is_healthy, lambda _: jnp.asarray(True), state)
        bad = jnp.where(ok, bad, t)
        last_good = jnp.where(at_check & ok, t, last_good)
        if every:
            buffer, count, stopped = lax.cond(
                ok & (t % every == 0),
                sample,
                lambda _, b, c: (b, c, jnp.asarray(False)),
                state,
                buffer,
                count,
            )
        return state, buffer, count, t, bad, last_good, stopped

    carry = (state, buffer, count, start, jnp.int32(-1), start, jnp.asarray(False))
    return lax.while_loop(cond, body, carry)


run_chunk = jax.jit(
    _chunk_impl, static_argnames=("plan",), donate_argnames=("state", "buffer")
)
