"""AMP pipeline: four network archetypes trained under each precision policy.

Networks (Flax NNX, :mod:`experiments._models`, and one Equinox model), offline
data (:mod:`experiments._data`) and tolerances (:mod:`experiments._amp_tasks`):

* ``mlp`` - a feed-forward classifier on scikit-learn's 8x8 digits;
* ``eqx_mlp`` - the same classifier as an Equinox ``eqx.nn.MLP`` (one example at
  a time, mapped over the batch), through mpjax's Equinox route;
* ``unet`` - a U-Net denoising the same digits (seeded Gaussian noise);
* ``bert`` - a BERT-style bidirectional encoder trained by masked language modelling
  on the source text of standard-library modules (15 % of the characters, BERT's
  80/10/10 rule, loss on the masked positions only).

Policies (:data:`POLICIES`, :mod:`experiments._amp_train`): ``float32`` and
``mixed_bfloat16`` (Adam, no loss scaling), ``mixed_float16`` with
:func:`mpjax.dynamic_loss_scaling`, ``fp8``: bfloat16 compute with every dense and
attention product in fp8 (e4m3 operands, e5m2 gradients, delayed scaling from a
16-step amax history; emulated on CPU), and ``autocast_bfloat16``: the float32
model's loss under :func:`mpjax.autocast`. Every other model goes through
:func:`mpjax.apply_policy` (normalisation layers and attention softmax in float32)
and all through :func:`mpjax.make_train_step`. Per network, the operand dtypes of
every product of the autocast train step (forward, backward, optimizer) are compared
with the hand-cast ``mixed_bfloat16`` step's. Per network and policy the pipeline
records the median step time, XLA's compiled memory (arguments, temporaries,
outputs), the device allocator's peak memory (``n/a`` on CPU), final training and
held-out loss (and held-out accuracy for the classifier and the encoder), skipped
steps and the loss-scale trajectory, and compares each mixed run with float32 within
the task's stated tolerances. It also measures the gradient underflow that loss
scaling fixes: the share of gradient entries that are non-zero in float32 but flush
to zero in float16 with a loss scale of 1, and with the dynamic scale the float16
run ended on.

The quick scale (the main job) trains the MLP; the standard and full scales train
all four.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import numpy as np

import mpjax
from experiments import _amp_report
from experiments._amp_tasks import Metric, Task, make_tasks
from experiments._amp_train import (
    AUTOCAST,
    HAND_CAST,
    POLICIES,
    REFERENCE,
    Recipe,
    RunRecord,
    gradient_underflow,
    product_dtypes,
    products_match,
    time_side_by_side,
    train,
)
from experiments._framework import capture_environment, resolve_scale, write_json
from experiments._report import fmt, markdown_table, run_caption

__all__ = [
    "AUTOCAST",
    "HAND_CAST",
    "POLICIES",
    "REFERENCE",
    "UNDERFLOW_CHECK",
    "Metric",
    "Recipe",
    "RunRecord",
    "Task",
    "gradient_underflow",
    "make_tasks",
    "metric_within",
    "product_dtypes",
    "products_match",
    "run",
    "time_side_by_side",
    "train",
    "underflow_removed",
    "within",
]

#: Name of the underflow check over all networks: at least one network must show
#: float16 gradient underflow without loss scaling, and dynamic scaling must reduce
#: it there (a network without underflow shows nothing either way).
UNDERFLOW_CHECK = (
    "float16 gradients underflow without loss scaling in some network and dynamic "
    "scaling reduces it there"
)


def underflow_removed(no_scale: float, dynamic: float) -> bool:
    """The underflow check: float16 without loss scaling loses some gradient entries
    (``no_scale > 0``) and the dynamic scale the run ended on loses fewer.

    Without underflow to remove the check fails: it would show nothing.

    Args:
        no_scale: fraction of gradient entries lost at loss scale 1.
        dynamic: fraction lost at the final dynamic loss scale.

    >>> underflow_removed(0.2, 0.0), underflow_removed(0.0, 0.0)
    (True, False)
    """
    return bool(no_scale > 0.0 and dynamic < no_scale)


def within(record: RunRecord, reference: RunRecord, task: Task) -> bool:
    """Whether ``record``'s held-out loss is finite and within
    ``task.atol + task.rtol * |reference loss|`` of the reference's."""
    gap = abs(record.eval_loss - reference.eval_loss)
    return bool(
        np.isfinite(record.eval_loss)
        and gap <= task.atol + task.rtol * abs(reference.eval_loss)
    )


def metric_within(record: RunRecord, reference: RunRecord, task: Task) -> bool:
    """Whether ``record``'s held-out metric is within ``task.metric.atol`` of the
    reference's (``True`` for a task without a metric)."""
    if task.metric is None:
        return True
    gap = abs(record.eval_metric - reference.eval_metric)
    return bool(np.isfinite(gap) and gap <= task.metric.atol)


def _statement(
    name: str, policy: str, rec: RunRecord, ref: RunRecord, task: Task
) -> str:
    ok = within(rec, ref, task)
    text = (
        f"- **{name} / {policy}**: held-out loss {rec.eval_loss:.4g} vs "
        f"{REFERENCE} {ref.eval_loss:.4g} (|diff| "
        f"{abs(rec.eval_loss - ref.eval_loss):.3g}, tolerance {task.atol:g} + "
        f"{task.rtol:g} x {REFERENCE}): {'matches' if ok else 'does NOT match'}"
    )
    if task.metric is not None:
        m_ok = metric_within(rec, ref, task)
        text += (
            f"; held-out {task.metric.name} {rec.eval_metric:.3f} vs "
            f"{ref.eval_metric:.3f} (tolerance {task.metric.atol:g}): "
            f"{'matches' if m_ok else 'does NOT match'}"
        )
    return f"{text}; {rec.skipped} skipped steps."


def _record_json(rec: RunRecord, task: Task, ok: bool) -> dict:
    return {
        "step_time_s": rec.step_time_s,
        "memory_bytes": rec.memory,
        "device_peak_bytes": rec.device_peak_bytes,
        "device_peak_exact": rec.device_peak_exact,
        "final_train_loss": float(rec.losses[-1]),
        "eval_loss": rec.eval_loss,
        "eval_metric": rec.eval_metric,
        "metric_name": None if task.metric is None else task.metric.name,
        "skipped_steps": rec.skipped,
        "losses": rec.losses.tolist(),
        "loss_scales": rec.loss_scales.tolist(),
        "within_tolerance": ok,
    }


def _compare_products(tasks: dict[str, Task], checks: dict, results: dict) -> str:
    """Per network, the product dtypes of the autocast step against the hand-cast
    one's: adds a check and the counts to ``results``; returns the table."""
    low = str(mpjax.get_policy(POLICIES[AUTOCAST].policy).compute_dtype)
    products = {}
    for name, task in tasks.items():
        counts = {p: product_dtypes(task, p) for p in (HAND_CAST, AUTOCAST)}
        checks[
            f"{name}/{AUTOCAST} runs every product in {low} where {HAND_CAST} does"
        ] = products_match(counts[HAND_CAST], counts[AUTOCAST], low)
        results[name]["product_operand_dtypes"] = products[name] = counts
    return _amp_report.products_table(products, low)


def run(
    out_dir: Path, *, quick: bool = True, seed: int = 0, scale: str | None = None
) -> dict:
    """Runs the AMP pipeline and writes results.json, figures and REPORT.md.

    Args:
        out_dir: an existing, empty directory.
        quick: CPU-sized settings (``MPJAX_EXPERIMENTS_SCALE=tiny`` shrinks them
            further for tests); ``False`` selects GPU-sized models and step counts.
        seed: seed of data splits, batch order, masks and initial parameters.
        scale: override the scale; see :func:`experiments._framework.resolve_scale`.

    Returns:
        ``{"table": markdown, "checks": {name: bool}, "scale": str}``.
    """
    out_dir = Path(out_dir)
    scale = resolve_scale(quick, scale)
    tasks = make_tasks(scale, seed=seed)
    records: dict[str, dict[str, RunRecord]] = {}
    underflow: dict[str, dict[float, float]] = {}
    final_scales: dict[str, float] = {}
    for name, task in tasks.items():
        runs = {p: train(task, p) for p in POLICIES}
        timed = time_side_by_side(runs, repeats=9)
        records[name] = {
            p: dataclasses.replace(r, step_time_s=timed[p]) for p, r in runs.items()
        }
        fp16 = records[name]["mixed_float16"]
        final_scales[name] = float(fp16.loss_scales[-1])
        underflow[name] = gradient_underflow(
            task,
            "mixed_float16",
            fp16.params,
            (1.0, final_scales[name]),
            batch=task.eval_batch,
        )

    checks, statements, results, verdicts = {}, [], {}, {}
    for name, runs in records.items():
        task, reference = tasks[name], runs[REFERENCE]
        results[name] = {
            "tolerance": {
                "rtol": task.rtol,
                "atol": task.atol,
                "metric_atol": None if task.metric is None else task.metric.atol,
            }
        }
        for policy, rec in runs.items():
            loss_ok = within(rec, reference, task)
            metric_ok = metric_within(rec, reference, task)
            if policy != REFERENCE:
                checks[f"{name}/{policy} held-out loss within tolerance"] = loss_ok
                if task.metric is not None:
                    checks[
                        f"{name}/{policy} held-out {task.metric.name} within tolerance"
                    ] = metric_ok
                statements.append(_statement(name, policy, rec, reference, task))
                verdicts[name, policy] = loss_ok and metric_ok
            results[name][policy] = _record_json(rec, task, loss_ok and metric_ok)
        u = underflow[name]
        results[name]["gradient_underflow_float16"] = {str(k): v for k, v in u.items()}
        checks[
            f"{name}/dynamic scaling loses no more gradient entries than scale 1"
        ] = u[final_scales[name]] <= u[1.0]
    autocast_table = _compare_products(tasks, checks, results)
    checks[UNDERFLOW_CHECK] = any(
        underflow_removed(u[1.0], u[final_scales[name]])
        for name, u in underflow.items()
    )
    table = _amp_report.run_table(records, verdicts)
    under_table = markdown_table(
        ["network", "zero grads, scale 1", "zero grads, dynamic scale", "scale"],
        [
            [n, f"{u[1.0]:.3%}", f"{u[final_scales[n]]:.3%}", fmt(final_scales[n])]
            for n, u in underflow.items()
        ],
    )
    env = capture_environment(seed=seed, scale=scale)
    figure_names = _amp_report.figures(out_dir, records, caption=run_caption(env))
    write_json(out_dir / "results.json", {"scale": scale, "seed": seed, **results})
    report = _amp_report.report_text(
        scale=scale,
        seed=seed,
        backend=jax.default_backend(),
        table=table,
        statements=statements,
        under_table=under_table,
        autocast_table=autocast_table,
        tasks=tasks,
        figure_names=figure_names,
    )
    (out_dir / "REPORT.md").write_text(report)
    return {"table": table, "checks": checks, "scale": scale}
