"""The run driver: many steps per compiled call, health checks, callbacks, progress.

:func:`run` advances a :class:`~lbm_jax.Simulation` in compiled chunks. Inside each
chunk a ``lax.while_loop`` runs blocks of ``check_every`` steps and checks the
density (finite and positive everywhere) after each block, stopping at the first
failure; the host looks at the flag once per chunk, never per step. A failed check
raises :class:`InstabilityError` naming the step. Chunks end at every multiple of
``every`` (where ``callback`` is called with the state) and, with ``progress=True``,
about a hundred times per run to update the progress bar. The step count of a chunk
is a traced argument, so chunks of different lengths share one compiled program.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from tqdm.auto import tqdm

from lbm_jax._simulation import LBMState, Simulation
from lbm_jax._validation import check_steps

__all__ = ["InstabilityError", "run"]


class InstabilityError(RuntimeError):
    """A simulation produced a non-finite or non-positive density.

    Attributes:
        step: Time step at which the failed health check ran.
        last_good_step: Time step of the last passing check (the instability arose
            in between).
        state: The state at ``step``, for inspection.
    """

    def __init__(self, step: int, last_good_step: int, state: LBMState) -> None:
        self.step = step
        self.last_good_step = last_good_step
        self.state = state
        super().__init__(
            f"Simulation became unstable at step {step}: the density is non-finite "
            f"or non-positive (last healthy check at step {last_good_step}). "
            "Increase tau or the resolution, or lower the velocity."
        )


def _make_runner(sim: Simulation, check_every: int) -> Callable[..., Any]:
    advance = sim._advance_f  # noqa: SLF001 - the driver is part of the core

    def chunk(aux: Any, state: LBMState, steps: jax.Array):
        t_end = state.t + steps

        def cond(carry):
            s, bad, _ = carry
            return (s.t < t_end) & (bad < 0)

        def body(carry):
            s, _, _ = carry
            k = jnp.minimum(check_every, t_end - s.t)
            f = advance(aux, s.f, k)
            s = LBMState(f=f, t=s.t + k)
            ok = sim.healthy(s)
            return s, jnp.where(ok, -1, s.t), s.t - k

        init = (state, jnp.asarray(-1, jnp.int32), state.t)
        return jax.lax.while_loop(cond, body, init)

    return jax.jit(chunk, donate_argnums=(1,))


def run(
    sim: Simulation,
    state: LBMState,
    steps: int,
    *,
    check_every: int = 100,
    callback: Callable[[LBMState], None] | None = None,
    every: int | None = None,
    progress: bool = False,
) -> LBMState:
    """Advance ``state`` by ``steps`` steps with health checks and callbacks.

    Args:
        sim: The simulation.
        state: Initial state; its buffers are donated (do not use it afterwards).
        steps: Number of steps to run (>= 0).
        check_every: Steps between two health checks inside the compiled loop.
        callback: Called on the host as ``callback(state)`` after every ``every``
            steps (``state.t`` tells which). The state's buffers are donated to the
            next chunk: copy what you keep (e.g. ``jax.device_get``).
        every: Interval of ``callback`` calls in steps, counted from the start of
            this run; required with ``callback``.
        progress: Show a tqdm progress bar.

    Returns:
        The state after ``steps`` steps.

    Raises:
        InstabilityError: If a health check fails; ``err.step`` names the step.
        ValueError, TypeError: Invalid arguments (raised before compiling).
    """
    if not isinstance(sim, Simulation):
        raise TypeError(f"sim must be a lbm_jax.Simulation, got {type(sim).__name__}.")
    if not isinstance(state, LBMState):
        raise TypeError(
            f"state must be an LBMState (from sim.init()), got {type(state).__name__}."
        )
    steps = check_steps(steps)
    check_every = _positive("check_every", check_every)
    if callback is not None and every is None:
        raise ValueError("callback needs every=<steps between calls>.")
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable, got {callback!r}.")
    if every is not None:
        every = _positive("every", every)
    chunk = every if every is not None else max(steps, 1)
    if progress:
        chunk = min(chunk, max(1, -(-steps // 100)))
    runners = sim._runners  # noqa: SLF001 - per-simulation cache of compiled chunks
    if check_every not in runners:
        runners[check_every] = _make_runner(sim, check_every)
    runner = runners[check_every]
    done = 0
    with tqdm(total=steps, disable=not progress, unit="step") as bar:
        while done < steps:
            n = min(chunk, steps - done)
            if every is not None:
                n = min(n, every - done % every)
            state, bad, last_good = runner(
                sim._aux,
                state,
                jnp.asarray(n, jnp.int32),  # noqa: SLF001
            )
            bad = int(bad)
            if bad >= 0:
                raise InstabilityError(bad, int(last_good), state)
            done += n
            bar.update(n)
            if callback is not None and done % every == 0:
                callback(state)
    return state


def _positive(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}.")
    return value
