"""The one run driver: any pure step over any pytree state, in compiled chunks.

:func:`run` advances a state by calling a pure ``step(state) -> state`` many times
inside one compiled ``lax.while_loop`` per chunk. The state is any pytree: a
:class:`~lbm_jax.LBMState`, or a coupled state holding one next to other arrays
(membrane nodes, tracer positions, fill levels). Inside the loop it

* checks the state's health every ``check_every`` steps (and at every chunk end),
  stopping at the first failed check;
* samples ``observe(state)`` every ``sample_every`` steps into a device buffer (no
  host transfer per sample);
* evaluates ``stop(state, history)`` after every sample, which ends the run early on
  the device (e.g. once a steady state is reached).

The host looks at the loop's flags once per chunk. Chunks end at every multiple
of ``callback_every`` (where ``callback(state)`` runs on the host), about a
hundred times per run with ``progress=True``, and after at most ``window``
samples. A failed health
check raises :class:`InstabilityError` naming the step. Chunk lengths are traced
arguments, and the compiled chunk is cached per step function (and per
``healthy``/``observe``/``stop`` function and interval), so repeated calls reuse
one program. Compilation is timed separately from the run, so the returned
MLUPs exclude it.

A :class:`~lbm_jax.Simulation` (or its ``step`` method) runs with its own compiled
multi-step loop, two steps per iteration, and is checked with
:meth:`~lbm_jax.Simulation.healthy`. Any other step is iterated with
``lax.fori_loop`` and checked by default for non-finite floating-point values.
Arrays that the step holds as pytree leaves (a simulation's boundary arrays,
``jax.tree_util.Partial`` arguments, a registered dataclass) are passed to the
compiled program as arguments; arrays a plain closure captures are compiled in as
constants, which is fine for small ones.

A coupled step is a pure function of a coupled pytree state. A force that follows a
marker carried by the fluid:

>>> from typing import NamedTuple
>>> import jax.numpy as jnp
>>> import lbm_jax
>>> sim = lbm_jax.Simulation("D2Q9", (32, 16), tau=0.8)
>>> class Coupled(NamedTuple):
...     fluid: lbm_jax.LBMState
...     marker: jax.Array  # (2,) position in lattice units
>>> def coupled_step(s):
...     cell = jnp.round(s.marker).astype(jnp.int32) % jnp.array(sim.shape)
...     force = jnp.zeros((2, *sim.shape)).at[0, cell[0], cell[1]].set(1e-5)
...     fluid = sim.step(s.fluid, force=force)
...     u = lbm_jax.velocity(sim, fluid, force=force)
...     return Coupled(fluid, s.marker + u[:, cell[0], cell[1]])
>>> start = Coupled(sim.init(u=(0.02, 0.0)), jnp.array([8.0, 8.0]))
>>> result = lbm_jax.run(
...     coupled_step, start, 100, observe=lambda s: s.marker, sample_every=10,
...     healthy=lambda s: sim.healthy(s.fluid),
... )
>>> result.samples.values.shape, result.samples.steps[-1]
((10, 2), np.int64(100))
>>> 9.9 < float(result.state.marker[0]) < 10.2  # carried along at about 0.02
True
"""

# long: the driver, its resume from checkpoints and its length estimate share one
# host loop
from __future__ import annotations

import dataclasses
import inspect
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from lbm_jax.core._units import CS, MAX_SPEED
from lbm_jax.core._validation import (
    check_int,
    check_steps,
    is_traced,
    renamed_keyword,
)
from lbm_jax.runs._checkpoint import Checkpoint, ResumeError
from lbm_jax.runs._loop import History, Plan, run_chunk, split
from lbm_jax.sim._simulation import LBMState, Simulation

__all__ = [
    "History",
    "InstabilityError",
    "RunResult",
    "RunStats",
    "Samples",
    "run",
]


#: What a fluid's failed health check means (:meth:`lbm_jax.Simulation.healthy`).
_FLUID_FAILURE = (
    "the density is non-finite or non-positive, or a speed exceeds the lattice's "
    f"stability limit |u| = {MAX_SPEED:.3g} (Mach {MAX_SPEED / CS:.3g})"
)


class InstabilityError(RuntimeError):
    """A run failed its health check (for a fluid: a non-finite or non-positive
    density, or a speed beyond the lattice's stability limit).

    Attributes:
        step: Time step at which the failed health check ran.
        last_good_step: Time step of the last passing check (the instability arose
            in between).
        state: The state at ``step``, for inspection.
    """

    def __init__(
        self,
        step: int,
        last_good_step: int,
        state: Any,
        reason: str = _FLUID_FAILURE,
    ) -> None:
        self.step = step
        self.last_good_step = last_good_step
        self.state = state
        super().__init__(
            f"Simulation became unstable at step {step}: {reason} (last healthy "
            f"check at step {last_good_step}). Increase tau or the resolution, or "
            "lower the velocity."
        )


class Samples(NamedTuple):
    """The samples of a run, on the host.

    Attributes:
        steps: Time step of every sample, ``(n,)`` int64.
        values: ``observe``'s pytree with a leading axis of ``n`` samples (NumPy).
    """

    steps: np.ndarray
    values: Any


class RunStats(NamedTuple):
    """What a run did and how fast.

    Attributes:
        steps: Steps run by this call (fewer than asked for when ``stop`` ended
            the run; those before a resume not included, see ``total_steps``).
        seconds: Wall time of the run, compilation excluded.
        compile_seconds: Time spent compiling (or fetching the cached program).
        mlups: Million lattice-cell updates per second over ``seconds``, counting
            the cells of every :class:`~lbm_jax.LBMState` in the state; ``None``
            when the state holds none or nothing ran.
        stopped: Whether ``stop`` ended the run (possibly before a resume).
        resumed_from: The step (counted from the run's start) of the checkpoint
            this call resumed from, or ``None``.
    """

    steps: int
    seconds: float
    compile_seconds: float
    mlups: float | None
    stopped: bool
    resumed_from: int | None = None

    @property
    def total_steps(self) -> int:
        """Steps since the run's start, those before a resume included."""
        return self.steps + (self.resumed_from or 0)


class RunResult(NamedTuple):
    """Outcome of :func:`run`: final state, samples (``None`` without ``observe``)
    and statistics."""

    state: Any
    samples: Samples | None
    stats: RunStats


def _all_finite(state: Any) -> jax.Array:
    """Default health check: every floating-point value of the state is finite."""
    flags = [
        jnp.all(jnp.isfinite(x))
        for x in jax.tree.leaves(state)
        if jnp.issubdtype(jnp.result_type(x), jnp.inexact)
    ]
    return jnp.all(jnp.stack(flags)) if flags else jnp.asarray(True)


def _fluid_states(state: Any) -> list[LBMState]:
    def is_fluid(x: Any) -> bool:
        return isinstance(x, LBMState)

    return [x for x in jax.tree.leaves(state, is_leaf=is_fluid) if is_fluid(x)]


def _as_simulation(step: Any) -> Simulation | None:
    """The simulation behind ``step`` when it is one, or its ``step`` method."""
    if isinstance(step, Simulation):
        return step
    if inspect.ismethod(step) and isinstance(step.__self__, Simulation):
        if step.__func__ is Simulation.step:
            return step.__self__
    return None


def run(
    step: Simulation | Callable[[Any], Any],
    state: Any,
    steps: int,
    *,
    check_every: int = 100,
    healthy: Callable[[Any], jax.Array] | None = None,
    observe: Callable[[Any], Any] | None = None,
    sample_every: int | None = None,
    stop: Callable[[Any, History], jax.Array] | None = None,
    callback: Callable[[Any], None] | None = None,
    callback_every: int | None = None,
    progress: bool = False,
    window: int = 64,
    checkpoint: Checkpoint | None = None,
    every: int | None = None,
    estimate: Callable[[float, int], None] | None = None,
) -> RunResult:
    """Advance ``state`` by ``steps`` steps of ``step``, checked, sampled, timed.

    Args:
        step: A pure ``step(state) -> state`` over any pytree, or a
            :class:`~lbm_jax.Simulation` (its compiled multi-step loop is used).
        state: Initial state; its buffers are donated (do not use it afterwards).
        steps: Number of steps to run (>= 0).
        check_every: Steps between two health checks inside the compiled loop.
        healthy: ``healthy(state) -> bool scalar``; default
            :meth:`Simulation.healthy <lbm_jax.Simulation.healthy>` for a
            simulation, else "every floating-point value is finite" (pass e.g.
            ``lambda s: sim.healthy(s.fluid)`` for a coupled state).
        observe: ``observe(state) -> pytree of arrays`` sampled every
            ``sample_every`` steps inside the loop; returned in
            ``result.samples``. Keep its output small (a few numbers, a profile).
        sample_every: Steps between two samples (and ``stop`` evaluations),
            counted from the start of this call; needed with ``observe``/``stop``.
        stop: ``stop(state, history) -> bool scalar``, evaluated after every
            sample on the device; ``True`` ends the run (see :func:`steady`).
            Needs ``observe`` (``history`` holds its samples).
        callback: Called on the host as ``callback(state)`` after every
            ``callback_every`` steps. The state's buffers are donated to the next
            chunk: copy what you keep (e.g. ``jax.device_get``).
        callback_every: Steps between two ``callback`` calls, counted from the
            start of this call; required with ``callback``.
        progress: Show a tqdm progress bar.
        window: Samples the device keeps for ``stop`` (``history``); a chunk holds
            at most this many samples.
        checkpoint: A :class:`~lbm_jax.Checkpoint`: save the state, the samples
            and the step counter every ``checkpoint.every`` steps (and at the
            end), and resume from the newest readable checkpoint. A resumed run
            continues bit for bit; ``steps`` still counts from the original start
            (a checkpoint past it is refused: a run never returns a later state
            than asked for).
        every: Deprecated alias of ``callback_every`` (it warns; removed in the
            next release).
        estimate: Called once on the host as ``estimate(seconds_per_step,
            steps_left)`` after two chunks of a hundredth of the steps each, the
            first a warm-up and the second timed (compilation excluded), before
            the bulk of the run: what a caller needs to say how long the rest
            will take (at most: ``stop`` may end it sooner).

    Returns:
        A :class:`RunResult` ``(state, samples, stats)``. Step numbers (in
        ``samples.steps`` and errors) are the state's time step ``t`` when it holds
        an :class:`~lbm_jax.LBMState`, else counted from the start of this call.

    Raises:
        InstabilityError: If a health check fails; ``err.step`` names the step.
        lbm_jax.ResumeError: If ``checkpoint`` resumes a run that is past
            ``steps`` already, or from checkpoints of another run.
        ValueError, TypeError: Invalid arguments (raised before compiling), among
            them ``callback_every`` given together with its alias ``every``, and
            a traced state (a run inside ``jax.jit``/``jax.grad``/``jax.vmap``).
    """
    if is_traced(state):
        raise TypeError(
            "lbm_jax.run drives a run from the host (health checks, samples, "
            "callbacks, timing between compiled chunks) and cannot run inside "
            "jax.jit, jax.grad or jax.vmap; inside them, call Simulation.advance "
            "(differentiable, with checkpoints) or loop over a step with lax.scan."
        )
    callback_every = renamed_keyword(
        callback_every,
        every,
        name="callback_every",
        old_name="every",
        caller="lbm_jax.run",
        what="steps between two callback calls",
    )
    plan, dynamic, reason = _plan(
        step,
        state,
        check_every=check_every,
        healthy=healthy,
        observe=observe,
        sample_every=sample_every,
        stop=stop,
        window=window,
    )
    steps = check_steps(steps)
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable, got {callback!r}.")
    if callback is not None and callback_every is None:
        raise ValueError("callback needs callback_every=<steps between calls>.")
    if callback_every is not None:
        callback_every = check_int(callback_every, "callback_every", 1)
    if estimate is not None and not callable(estimate):
        raise TypeError(f"estimate must be callable, got {estimate!r}.")
    if checkpoint is not None and not isinstance(checkpoint, Checkpoint):
        raise TypeError(
            f"checkpoint must be a lbm_jax.Checkpoint, got {type(checkpoint).__name__}."
        )

    cells = sum(s.num_cells for s in _fluid_states(state)) or None
    now = _Progress.start(state, observe, plan.window)
    if checkpoint is not None and checkpoint.resume:
        now.resume(checkpoint, plan, steps)
    if now.done >= steps or now.stopped:
        return now.result(plan, cells, 0.0, 0.0)

    tic = time.perf_counter()  # compile (or fetch) the program: a zero-step call
    now.state, now.buffer, *_ = jax.block_until_ready(
        _call(plan, dynamic, now, now.done)
    )
    compile_seconds = time.perf_counter() - tic
    seconds = _chunks(
        now,
        plan,
        dynamic,
        steps,
        reason=reason,
        callback=callback,
        callback_every=callback_every,
        progress=progress,
        checkpoint=checkpoint,
        estimate=estimate,
    )
    return now.result(plan, cells, seconds, compile_seconds)


def _plan(
    step: Any,
    state: Any,
    *,
    check_every: int,
    healthy: Callable[[Any], jax.Array] | None,
    observe: Callable[[Any], Any] | None,
    sample_every: int | None,
    stop: Callable[[Any, History], jax.Array] | None,
    window: int,
) -> tuple[Plan, tuple[Any, ...], str]:
    """The compiled chunk's static plan, the array leaves of its callables and
    what a failed health check means, from validated arguments of :func:`run`."""
    sim = _as_simulation(step)
    if sim is None and not callable(step):
        raise TypeError(
            "step must be a pure function step(state) -> state or a "
            f"lbm_jax.Simulation, got {type(step).__name__}."
        )
    if sim is not None and not isinstance(state, LBMState):
        raise TypeError(
            f"state must be an LBMState (from sim.init()), got {type(state).__name__}."
        )
    check_every = check_int(check_every, "check_every", 1)
    window = check_int(window, "window", 1)
    for name, fn in (("healthy", healthy), ("observe", observe), ("stop", stop)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{name} must be callable, got {fn!r}.")
    if stop is not None and observe is None:
        raise ValueError(
            "stop needs observe=: stop(state, history) is evaluated after every "
            "sample and judges the sampled values (steady() compares them), so "
            "without observe it has nothing to judge; pass observe=<what to "
            "sample> and sample_every=<steps>."
        )
    if observe is not None and sample_every is None:
        raise ValueError("observe and stop need sample_every=<steps between samples>.")
    if sample_every is not None:
        if observe is None:
            raise ValueError("sample_every needs observe (and optionally stop).")
        sample_every = check_int(sample_every, "sample_every", 1)

    if sim is not None:
        step = sim
        reason = _FLUID_FAILURE
    else:
        reason = "a floating-point value of the state is non-finite"
    if healthy is None:
        healthy = _all_finite if sim is None else sim.healthy
    else:
        reason = "healthy(state) returned False"
    parts = [split(fn) for fn in (step, healthy, observe, stop)]
    plan = Plan(
        step=parts[0][1],
        simulation=sim is not None,
        healthy=parts[1][1],
        observe=parts[2][1],
        stop=parts[3][1],
        check_every=check_every,
        sample_every=sample_every or 0,
        window=window,
    )
    try:
        hash(plan)
    except TypeError as err:
        raise TypeError(
            "step, healthy, observe and stop must be hashable apart from their "
            f"array leaves ({err}); use functions, bound methods or pytrees."
        ) from None
    return plan, tuple(dyn for dyn, _ in parts), reason


@dataclasses.dataclass
class _Progress:
    """Where a run stands on the host between two chunks.

    Attributes:
        state: The current state.
        buffer: The device ring buffer of samples (``None`` without ``observe``).
        t0: The time step at which the run started.
        kept: The samples on the host, one block per chunk.
        done: Steps since the run's start.
        count: Samples taken since the run's start.
        stopped: Whether ``stop`` ended the run.
        resumed_from: ``done`` at the checkpoint this call resumed from.
    """

    state: Any
    buffer: Any
    t0: int
    kept: list[Any] = dataclasses.field(default_factory=list)
    done: int = 0
    count: int = 0
    stopped: bool = False
    resumed_from: int | None = None

    @classmethod
    def start(cls, state: Any, observe: Callable | None, window: int) -> _Progress:
        """A run at its start: an empty sample buffer of ``window`` slots."""
        fluids = _fluid_states(state)
        buffer = None
        if observe is not None:
            buffer = jax.tree.map(
                lambda a: jnp.zeros((window, *a.shape), a.dtype),
                jax.eval_shape(observe, state),
            )
        return cls(state, buffer, int(fluids[0].t) if fluids else 0)

    def resume(self, checkpoint: Checkpoint, plan: Plan, steps: int) -> None:
        """Continue from the newest readable checkpoint, if there is one.

        Raises:
            ResumeError: If that checkpoint is past ``steps``, the run's length.
        """
        restored = checkpoint.restore(
            lambda record: _saved_tree(self.state, self.buffer, [], record["count"]),
            expect={"sample_every": plan.sample_every},
        )
        if restored is None:
            return
        tree, record = restored
        if record["done"] > steps:
            raise ResumeError(
                f"The checkpoints in {str(checkpoint.directory)!r} are of a run at "
                f"step {record['done']}, past the {steps} steps asked for; ask for "
                f"at least {record['done']} steps, or start afresh in another "
                "directory (or with Checkpoint(..., resume=False))."
            )
        self.state = tree["state"]
        self.done, self.count, self.t0 = record["done"], record["count"], record["t0"]
        self.stopped, self.resumed_from = record["stopped"], self.done
        if self.count and self.buffer is not None:
            self.kept.append(jax.device_get(tree["samples"]))
            self.buffer = _refill(self.buffer, self.kept[0], plan.window)

    def save(self, checkpoint: Checkpoint, plan: Plan) -> None:
        """Write the run so far to a checkpoint."""
        record = {
            "done": self.done,
            "count": self.count,
            "t0": self.t0,
            "stopped": self.stopped,
            "sample_every": plan.sample_every,
        }
        tree = _saved_tree(self.state, self.buffer, self.kept, self.count)
        checkpoint.save(self.t0 + self.done, tree, record)

    def result(
        self, plan: Plan, cells: int | None, seconds: float, compile_seconds: float
    ) -> RunResult:
        """The run's outcome, with ``cells`` lattice cells in its state."""
        ran = self.done - (self.resumed_from or 0)
        mlups = cells * ran / seconds / 1e6 if cells and seconds > 0 else None
        samples = None
        if self.buffer is not None:
            samples = _samples(self.kept, self.buffer, plan.sample_every, self.t0)
        stats = RunStats(
            ran, seconds, compile_seconds, mlups, self.stopped, self.resumed_from
        )
        return RunResult(self.state, samples, stats)


def _call(plan: Plan, dynamic: tuple[Any, ...], now: _Progress, end: int) -> Any:
    """The compiled chunk from step ``now.done`` to step ``end``."""
    return run_chunk(
        dynamic,
        now.state,
        now.buffer,
        jnp.int32(now.count),
        jnp.int32(now.done),
        jnp.int32(end),
        plan=plan,
    )


def _chunks(
    now: _Progress,
    plan: Plan,
    dynamic: tuple[Any, ...],
    steps: int,
    *,
    reason: str,
    callback: Callable[[Any], None] | None,
    callback_every: int | None,
    progress: bool,
    checkpoint: Checkpoint | None,
    estimate: Callable[[float, int], None] | None,
) -> float:
    """Run compiled chunks until ``steps`` are done or ``stop`` ends the run;
    the seconds they took. Chunks end at every multiple of ``callback_every`` and
    of the checkpoint interval, every hundredth of the run with ``progress``, and
    after at most ``window`` samples; with ``estimate``, the first two chunks are
    a hundredth of the steps left each, and ``estimate`` is given the second's
    rate."""
    chunk = callback_every if callback_every is not None else steps
    if progress:
        chunk = min(chunk, max(1, -(-steps // 100)))
    if plan.sample_every:
        chunk = min(chunk, plan.window * plan.sample_every)
    boundaries = [n for n in (callback_every, checkpoint and checkpoint.every) if n]
    seconds = 0.0
    # with ``estimate``: two chunks of a hundredth each, the first warms up
    hundredth = -(-(steps - now.done) // 100)
    short = 2 if estimate is not None else 0
    with tqdm(total=steps, initial=now.done, disable=not progress, unit="step") as bar:
        while now.done < steps and not now.stopped:
            done = now.done
            end = min(
                [done + (hundredth if short else chunk), done + chunk, steps]
                + [(done // n + 1) * n for n in boundaries]
            )
            tic = time.perf_counter()
            now.state, now.buffer, count, t, bad, last_good, stop_flag = _call(
                plan, dynamic, now, end
            )
            t = int(t)  # waits for the chunk
            took = time.perf_counter() - tic
            seconds += took
            count = int(count)
            if now.buffer is not None and count > now.count:
                host = jax.device_get(now.buffer)
                slots = [j % plan.window for j in range(now.count, count)]
                now.kept.append(jax.tree.map(lambda v, s=slots: v[s], host))
            now.count = count
            if int(bad) >= 0:
                raise InstabilityError(
                    now.t0 + int(bad), now.t0 + int(last_good), now.state, reason
                )
            bar.update(t - done)
            now.done, now.stopped = t, bool(stop_flag)
            if checkpoint is not None and (
                t % checkpoint.every == 0 or t == steps or now.stopped
            ):
                now.save(checkpoint, plan)
            if callback is not None and t % callback_every == 0:
                callback(now.state)
            short -= short > 0
            if estimate is not None and short == 0 and t > done:
                if t < steps and not now.stopped:
                    estimate(took / (t - done), steps - t)
                estimate = None
    return seconds


def _saved_tree(state: Any, buffer: Any, kept: list[Any], count: int) -> Any:
    """What a checkpoint holds: the state and the ``count`` samples so far."""
    if buffer is None:
        return {"state": state, "samples": None}
    if kept:
        samples = jax.tree.map(lambda *v: np.concatenate(v), *kept)
    else:  # a template for ``count`` samples
        samples = jax.tree.map(
            lambda b: np.zeros((count, *b.shape[1:]), b.dtype), buffer
        )
    return {"state": state, "samples": samples}


def _refill(buffer: Any, samples: Any, window: int) -> Any:
    """The device ring buffer holding the last ``window`` of the given samples."""

    def fill(b: jax.Array, v: np.ndarray) -> jax.Array:
        ring = np.zeros(b.shape, b.dtype)
        for j in range(max(0, len(v) - window), len(v)):
            ring[j % window] = v[j]
        return jnp.asarray(ring)

    return jax.tree.map(fill, buffer, samples)


def _samples(kept: list[Any], buffer: Any, every: int, t0: int) -> Samples:
    """Concatenate the samples collected per chunk (empty ones shaped like the
    buffer)."""
    if kept:
        values = jax.tree.map(lambda *v: np.concatenate(v), *kept)
    else:
        values = jax.tree.map(lambda b: np.zeros((0, *b.shape[1:]), b.dtype), buffer)
    n = len(jax.tree.leaves(values)[0]) if jax.tree.leaves(values) else 0
    return Samples(t0 + every * (1 + np.arange(n, dtype=np.int64)), values)
