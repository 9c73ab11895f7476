"""Training, timing and measurement for the AMP pipeline.

:data:`POLICIES` names the compared configurations, each a :class:`Recipe` (an
:mod:`mpjax` policy, the model conversion and the optimizer). :func:`train` runs one
task under one of them through :func:`mpjax.apply_policy` and
:func:`mpjax.make_train_step`, recording step times, XLA's compiled memory, the
device allocator's peak (where the backend reports one), losses, skipped steps and
the loss-scale trajectory. :func:`time_side_by_side` re-times finished runs
interleaved, and :func:`gradient_underflow` measures the float16 gradient underflow
that loss scaling removes.
"""

from __future__ import annotations

import collections
import dataclasses
import time
import types
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import mpjax
from experiments._amp_tasks import Task
from experiments._jaxpr import equations

__all__ = [
    "POLICIES",
    "AUTOCAST",
    "HAND_CAST",
    "REFERENCE",
    "Recipe",
    "RunRecord",
    "device_peak",
    "gradient_underflow",
    "product_dtypes",
    "products_match",
    "time_side_by_side",
    "train",
]


def _adam(learning_rate: float, steps: int) -> optax.GradientTransformationExtraArgs:
    del steps
    return mpjax.no_loss_scaling(optax.adam(learning_rate))


def _adam_dynamic_scaling(
    learning_rate: float, steps: int
) -> optax.GradientTransformationExtraArgs:
    # Grow the scale a few times per run instead of jmp's 2000-step period.
    return mpjax.dynamic_loss_scaling(
        optax.adam(learning_rate), period=max(25, steps // 10)
    )


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How the pipeline trains a task under one compared configuration.

    Attributes:
        policy: the :mod:`mpjax` policy string of the model and the train step.
        optimizer: ``optimizer(learning_rate, steps)`` -> the optimizer, loss
            scaling included.
        fp8: with a config, the matrix products run in fp8 with delayed scaling
            (:func:`mpjax.apply_policy` ``fp8=``): the fp8 state trains along
            with the parameters, the loss goes through :func:`mpjax.fp8_loss` and
            the optimizer is wrapped in :func:`mpjax.fp8_delayed_scaling`.
        autocast: the model is left in float32 and its loss runs under
            :func:`mpjax.autocast` with ``policy`` (products in the compute dtype,
            the float32 list in float32), in a float32 train step, instead of
            going through :func:`mpjax.apply_policy`.
    """

    policy: str
    optimizer: Callable[[float, int], optax.GradientTransformationExtraArgs]
    fp8: mpjax.Fp8Config | None = None
    autocast: bool = False

    @property
    def step_policy(self) -> str:
        """The policy of the model conversion, the train step and evaluation:
        ``float32`` under autocast (it casts inside the loss), else ``policy``."""
        return "float32" if self.autocast else self.policy


#: Configurations compared by the pipeline, by label; :data:`REFERENCE` is the
#: baseline the others must match. ``fp8``: bfloat16 compute with e4m3 operands
#: and e5m2 gradients in every Linear/LinearGeneral/Einsum product (emulated on
#: CPU), scales from a 16-step amax history. ``autocast_bfloat16``: the float32
#: model's loss under :func:`mpjax.autocast` (the hand-cast ``mixed_bfloat16``
#: program's products in bfloat16, found by rewriting the traced program).
POLICIES: Mapping[str, Recipe] = types.MappingProxyType(
    {
        "float32": Recipe("float32", _adam),
        "mixed_bfloat16": Recipe("mixed_bfloat16", _adam),
        "mixed_float16": Recipe("mixed_float16", _adam_dynamic_scaling),
        "fp8": Recipe("mixed_bfloat16", _adam, fp8=mpjax.Fp8Config(history_length=16)),
        "autocast_bfloat16": Recipe("mixed_bfloat16", _adam, autocast=True),
    }
)

#: Label of the reference configuration in :data:`POLICIES`.
REFERENCE = "float32"

#: The autocast configuration and the hand-cast one whose products it must match.
AUTOCAST, HAND_CAST = "autocast_bfloat16", "mixed_bfloat16"


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """The outcome of training one task under one configuration.

    Attributes:
        policy: the configuration's label in :data:`POLICIES`.
        losses: training loss per step (float32, as reported by the step).
        loss_scales: loss scale used at each step.
        skipped: number of steps skipped for non-finite gradients.
        step_time_s: median wall time of one compiled step after warm-up, over
            the training loop (the pipeline replaces it by a side-by-side timing).
        memory: XLA's compiled memory statistics of the step, in bytes
            (``argument``, ``temp``, ``output``).
        device_peak_bytes: the device allocator's peak during the run above what
            was in use before it, or ``None`` where the backend keeps no statistics
            (CPU); see :func:`device_peak`.
        device_peak_exact: whether ``device_peak_bytes`` is the run's own peak
            (``True``) or only an upper bound (``False``); ``None`` with it.
        eval_loss: held-out loss at the end, computed under the same policy.
        eval_metric: the task's held-out metric, or ``None`` if it has none.
        params: final float32 master parameters (an ``nnx.State``; for an
            Equinox model the list of its arrays, see ``_split``).
        time_step: runs one more compiled step from the final state (discarding
            the result) and returns its wall time in seconds.
    """

    policy: str
    losses: np.ndarray
    loss_scales: np.ndarray
    skipped: int
    step_time_s: float
    memory: dict[str, int]
    device_peak_bytes: int | None
    device_peak_exact: bool | None
    eval_loss: float
    eval_metric: float | None
    params: Any
    time_step: Callable[[], float] = dataclasses.field(repr=False, compare=False)


def _recipe(label: str) -> Recipe:
    if label not in POLICIES:
        raise ValueError(
            f"policy must be one of {list(POLICIES)}, got {label!r}; add a Recipe "
            "to experiments._amp_train.POLICIES for a new configuration."
        )
    return POLICIES[label]


def _split(model: Any, fp8: mpjax.Fp8Config | None) -> tuple[Any, Callable]:
    """``(params, merge)``: the trained part of a policy-applied model and the
    function rebuilding the model from it (the rest rides in the closure).

    A Flax NNX model splits into its parameters (and fp8 state) and the rest. Any
    other model (an Equinox one) into the list of its array leaves and fp8 states,
    in tree order; the rest (activation functions, the static policy) stays in the
    closure, so the parameters of one policy fit the model under another.
    """
    if isinstance(model, nnx.Module):
        trained = nnx.Param if fp8 is None else (nnx.Param, mpjax.Fp8Meta)
        graphdef, params, rest = nnx.split(model, trained, ...)
        return params, lambda p: nnx.merge(graphdef, p, rest)

    def is_state(x: Any) -> bool:
        return isinstance(x, mpjax.Fp8MetaValue)

    leaves, treedef = jax.tree.flatten(model, is_leaf=is_state)
    slots = [i for i, x in enumerate(leaves) if is_state(x) or isinstance(x, jax.Array)]

    def merge(p: list) -> Any:
        merged = list(leaves)
        for i, value in zip(slots, p, strict=True):
            merged[i] = value
        return jax.tree.unflatten(treedef, merged)

    return [leaves[i] for i in slots], merge


def _bind(
    task: Task,
    policy: mpjax.Policy,
    fp8: mpjax.Fp8Config | None = None,
) -> tuple[Callable, Any, Callable | None]:
    """``(loss_fn(params, batch), params, metric_fn(params, batch) or None)`` of
    the model under ``policy`` (with fp8, ``params`` hold the fp8 state too)."""
    model = mpjax.apply_policy(task.model, policy, fp8=fp8)
    params, merge = _split(model, fp8)

    def loss_fn(p: Any, batch: Any) -> jax.Array:
        return task.loss(merge(p), batch)

    if task.metric is None:
        return loss_fn, params, None
    metric = task.metric.fn

    def metric_fn(p: Any, batch: Any) -> jax.Array:
        return metric(merge(p), batch)

    return loss_fn, params, metric_fn


def build_step(
    task: Any, recipe: Recipe, learning_rate: float, steps: int
) -> tuple[Callable, mpjax.TrainState, Callable, Callable | None]:
    """The train step of ``task.model`` under ``recipe``, not jitted.

    The model goes through :func:`mpjax.apply_policy` (with the recipe's fp8; the
    loss then goes through :func:`mpjax.fp8_loss` and the optimizer through
    :func:`mpjax.fp8_delayed_scaling`, which reads the model's config) and the
    step is :func:`mpjax.make_train_step`. Under an autocast recipe the model
    stays float32 and the loss (and metric) run under :func:`mpjax.autocast`.

    Args:
        task: anything with ``model``, ``loss(model, batch)`` and ``metric``
            (a :class:`experiments._amp_tasks.Metric` or ``None``).
        recipe: the configuration.
        learning_rate: passed to ``recipe.optimizer``.
        steps: the run's length, passed to ``recipe.optimizer``.

    Returns:
        ``(step, initial state, loss_fn(params, batch), metric_fn or None)``.
    """
    policy = mpjax.get_policy(recipe.step_policy)
    loss_fn, params, metric_fn = _bind(task, policy, recipe.fp8)
    if recipe.autocast:
        loss_fn = mpjax.autocast(loss_fn, recipe.policy)
        if metric_fn is not None:
            metric_fn = mpjax.autocast(metric_fn, recipe.policy)
    optimizer = recipe.optimizer(learning_rate, steps)
    train_loss = loss_fn
    if recipe.fp8 is not None:
        optimizer = mpjax.fp8_delayed_scaling(optimizer)
        train_loss = mpjax.fp8_loss(loss_fn)
    step = mpjax.make_train_step(train_loss, optimizer, policy)
    return step, mpjax.TrainState.create(params, optimizer), loss_fn, metric_fn


def _evaluate(
    task: Task,
    policy: mpjax.Policy,
    loss_fn: Callable,
    metric_fn: Callable | None,
    params: Any,
) -> tuple[float, float | None]:
    """Held-out loss (and the task's metric, if any) under ``policy``."""
    batch = task.eval_batch

    @jax.jit
    def evaluate(p: Any) -> tuple[jax.Array, jax.Array]:
        p = policy.cast_to_compute(p)
        b = policy.cast_to_compute(batch)
        loss = loss_fn(p, b)
        if metric_fn is None:
            return loss, jnp.zeros((), jnp.float32)
        return loss, metric_fn(p, b).astype(jnp.float32)

    loss, metric = evaluate(params)
    return float(loss), (None if metric_fn is None else float(metric))


def device_peak(
    before: Mapping[str, int] | None, after: Mapping[str, int] | None
) -> tuple[int | None, bool | None]:
    """A run's peak device memory from allocator statistics taken around it.

    ``before`` and ``after`` are ``jax.Device.memory_stats()`` dictionaries taken
    just before and just after the run. The allocator keeps one high-water mark per
    process that cannot be reset, so the run's peak above what was in use before
    it is ``after["peak_bytes_in_use"] - before["bytes_in_use"]``; it is exact when
    the run raised the high-water mark and an upper bound otherwise.

    Args:
        before: statistics before the run, or ``None`` (no statistics: CPU).
        after: statistics after the run, or ``None``.

    Returns:
        ``(bytes, exact)``, or ``(None, None)`` when either dictionary is missing or
        lacks the counters (some backends report -1 for them).

    >>> device_peak({"bytes_in_use": 10, "peak_bytes_in_use": 50},
    ...             {"bytes_in_use": 30, "peak_bytes_in_use": 90})
    (80, True)
    >>> device_peak(None, None)
    (None, None)
    """
    keys = ("bytes_in_use", "peak_bytes_in_use")
    if before is None or after is None:
        return None, None
    if any(stats.get(k, -1) < 0 for stats in (before, after) for k in keys):
        return None, None
    peak = int(after["peak_bytes_in_use"])
    exact = peak > int(before["peak_bytes_in_use"])
    return peak - int(before["bytes_in_use"]), exact


def memory_stats() -> Mapping[str, int] | None:
    """Allocator statistics of the default device (``None`` on CPU)."""
    return jax.devices()[0].memory_stats()


def train(task: Task, policy: str, *, steps: int | None = None) -> RunRecord:
    """Trains ``task`` under one configuration of :data:`POLICIES`.

    The model goes through :func:`mpjax.apply_policy` (with the recipe's fp8) and
    is trained with :func:`mpjax.make_train_step` and the recipe's optimizer. The
    step is compiled once ahead of time (which also gives XLA's memory statistics),
    each batch is moved to the device before its step is timed, and the device
    allocator's statistics are read before and after the run.

    Args:
        task: a task from :func:`experiments.amp.make_tasks`.
        policy: a label of :data:`POLICIES`.
        steps: number of steps (default: all batches of the task).

    Returns:
        The :class:`RunRecord`.
    """
    recipe = _recipe(policy)
    total = len(task.batches[0])
    steps = total if steps is None else steps
    if not 1 <= steps <= total:
        raise ValueError(f"steps must be in [1, {total}], got {steps}.")
    stats_before = memory_stats()
    mp_policy = mpjax.get_policy(recipe.step_policy)
    step, state, loss_fn, metric_fn = build_step(
        task, recipe, task.learning_rate, steps
    )

    def batch_at(i: int) -> tuple[jax.Array, ...]:
        return jax.block_until_ready(tuple(jax.device_put(a[i]) for a in task.batches))

    batch = batch_at(0)
    # optax.adam promotes Python scalars against its int32 step counter, so the
    # step is traced under standard promotion even where a caller enabled strict
    # promotion (as the test-suite does).
    with jax.numpy_dtype_promotion("standard"):
        compiled = jax.jit(step).lower(state, batch).compile()
    stats = compiled.memory_analysis()
    memory = {
        "argument": int(stats.argument_size_in_bytes),
        "temp": int(stats.temp_size_in_bytes),
        "output": int(stats.output_size_in_bytes),
    }
    metrics, times = [], []
    for i in range(steps):
        batch = batch if i == 0 else batch_at(i)
        start = time.perf_counter()
        state, m = compiled(state, batch)
        jax.block_until_ready(state)
        times.append(time.perf_counter() - start)
        metrics.append(m)
    host = jax.device_get(metrics)
    peak_bytes, peak_exact = device_peak(stats_before, memory_stats())
    eval_loss, eval_metric = _evaluate(
        task, mp_policy, loss_fn, metric_fn, state.params
    )

    def time_step() -> float:
        start = time.perf_counter()
        jax.block_until_ready(compiled(state, batch))
        return time.perf_counter() - start

    return RunRecord(
        policy=policy,
        losses=np.array([m["loss"] for m in host], np.float32),
        loss_scales=np.array([m["loss_scale"] for m in host], np.float32),
        skipped=int(sum(bool(m["skipped"]) for m in host)),
        step_time_s=float(np.median(times[min(3, len(times) - 1) :])),
        memory=memory,
        device_peak_bytes=peak_bytes,
        device_peak_exact=peak_exact,
        eval_loss=eval_loss,
        eval_metric=eval_metric,
        params=state.params,
        time_step=time_step,
    )


def time_side_by_side(
    records: Mapping[str, RunRecord], *, repeats: int = 7
) -> dict[str, float]:
    """Median step times of several runs, measured interleaved in one loop.

    Each repeat times one step of every run in turn, so a load change on a shared
    machine affects all runs alike and their ratios stay meaningful.

    Args:
        records: runs by label, e.g. by policy.
        repeats: number of timed rounds (>= 5 recommended).

    Returns:
        ``{label: median seconds per step}``.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}.")
    for rec in records.values():  # warm-up
        rec.time_step()
    times: dict[str, list[float]] = {label: [] for label in records}
    for _ in range(repeats):
        for label, rec in records.items():
            times[label].append(rec.time_step())
    return {label: float(np.median(t)) for label, t in times.items()}


def gradient_underflow(
    task: Task,
    policy: str | mpjax.Policy,
    params: Any,
    scales: tuple[float, ...],
    *,
    batch: tuple | None = None,
) -> dict[float, float]:
    """Share of gradient entries that are non-zero in float32 but zero under ``policy``.

    Gradients of ``batch`` (default: the first training batch) at ``params`` are
    taken with :func:`mpjax.scaled_value_and_grad` through the policy-applied model,
    once per loss scale, and compared entry by entry with the float32 gradients.

    Args:
        task: the task.
        policy: the (reduced-precision) :mod:`mpjax` policy to measure.
        params: float32 master parameters to take the gradients at.
        scales: loss scales to try (1.0 means no loss scaling).
        batch: the batch to differentiate; the mean over a larger batch has
            smaller per-example terms and underflows more.

    Returns:
        ``{scale: fraction}`` with fractions in [0, 1].
    """
    if batch is None:
        batch = tuple(a[0] for a in task.batches)
    batch = tuple(jnp.asarray(a) for a in batch)

    def grads_under(p: mpjax.Policy) -> Callable:
        loss_fn, _, _ = _bind(task, p)
        value_and_grad = mpjax.scaled_value_and_grad(
            lambda q, b: p.cast_to_output(loss_fn(p.cast_to_compute(q), b))
        )
        return jax.jit(lambda q, s: value_and_grad(q, s, p.cast_to_compute(batch))[1])

    reference = jax.tree.leaves(grads_under(mpjax.get_policy("float32"))(params, 1.0))
    measure = grads_under(mpjax.get_policy(policy))
    live = sum(int(jnp.count_nonzero(g)) for g in reference)
    result = {}
    for scale in scales:
        grads = jax.tree.leaves(measure(params, jnp.float32(scale)))
        lost = sum(
            int(jnp.count_nonzero((g == 0) & (r != 0)))
            for g, r in zip(grads, reference, strict=True)
        )
        result[float(scale)] = lost / max(live, 1)
    return result


def product_dtypes(task: Task, policy: str) -> dict[str, int]:
    """Operand dtypes of every matrix product and convolution of one train step.

    The step of ``task`` under the configuration ``policy`` of :data:`POLICIES` is
    traced on the first batch (forward pass, backward pass and optimizer; the
    bodies of ``jit``, ``custom_vjp`` and loops included) and its ``dot_general``
    and ``conv_general_dilated`` equations are counted by operand dtypes.

    Returns:
        ``{"lhs x rhs": count}``, e.g. ``{"bfloat16 x bfloat16": 8}``.
    """
    recipe = _recipe(policy)
    step, state, _, _ = build_step(task, recipe, task.learning_rate, 1)
    batch = tuple(jnp.asarray(a[0]) for a in task.batches)
    with jax.numpy_dtype_promotion("standard"):
        jaxpr = jax.make_jaxpr(step)(state, batch)
    counts: collections.Counter[str] = collections.Counter()
    for eqn in equations(jaxpr):
        if eqn.primitive.name in ("dot_general", "conv_general_dilated"):
            lhs, rhs = (v.aval.dtype for v in eqn.invars[:2])
            counts[f"{lhs} x {rhs}"] += 1
    return dict(sorted(counts.items()))


def products_match(hand: Mapping[str, int], auto: Mapping[str, int], low: str) -> bool:
    """The CPU check of autocast against the hand-cast program: the same number of
    products, all of autocast's with ``low`` operands, and at least as many in
    ``low`` as the hand-cast program (which may keep some in float32).

    >>> products_match({"bfloat16 x bfloat16": 8}, {"bfloat16 x bfloat16": 8},
    ...                "bfloat16")
    True
    >>> products_match({"bfloat16 x bfloat16": 8},
    ...                {"bfloat16 x bfloat16": 7, "float32 x float32": 1},
    ...                "bfloat16")
    False
    """
    both = f"{low} x {low}"
    return sum(hand.values()) == sum(auto.values()) == auto.get(
        both, 0
    ) > 0 and auto.get(both, 0) >= hand.get(both, 0)
