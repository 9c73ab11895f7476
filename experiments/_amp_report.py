"""Tables, figures and REPORT.md of the AMP pipeline (:mod:`experiments.amp`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from experiments._amp_tasks import Task
from experiments._amp_train import (
    AUTOCAST,
    HAND_CAST,
    POLICIES,
    REFERENCE,
    RunRecord,
    products_match,
)
from experiments._report import fmt, markdown_table, new_figure, save_figure

__all__ = ["TITLES", "device_peak_cell", "figures", "report_text", "run_table"]

#: Figure titles of the networks, in words.
TITLES = {
    "mlp": "MLP, digit classification",
    "eqx_mlp": "Equinox MLP, digit classification",
    "unet": "U-Net, digit denoising",
    "bert": "BERT-style encoder, masked characters",
}

_HEADERS = [
    "network",
    "policy",
    "step ms",
    "time / f32",
    "args MiB",
    "temps MiB",
    "device peak MiB",
    "train loss",
    "held-out loss",
    "held-out acc.",
    "skipped",
    "final scale",
    "within tol.",
]


def device_peak_cell(record: RunRecord) -> str:
    """The device-peak table cell: MiB, ``<= MiB`` for an upper bound, or ``n/a``.

    >>> import dataclasses
    >>> fake = dataclasses.make_dataclass("R", ["device_peak_bytes",
    ...                                         "device_peak_exact"])
    >>> device_peak_cell(fake(3 * 2**20, True)), device_peak_cell(fake(None, None))
    ('3.0', 'n/a')
    >>> device_peak_cell(fake(2**21, False))
    '<= 2.0'
    """
    if record.device_peak_bytes is None:
        return "n/a"
    mib = f"{record.device_peak_bytes / 2**20:.1f}"
    return mib if record.device_peak_exact else f"<= {mib}"


def run_table(
    records: Mapping[str, Mapping[str, RunRecord]],
    verdicts: Mapping[tuple[str, str], bool],
) -> str:
    """The main table: one row per network and policy.

    Args:
        records: ``{network: {policy: RunRecord}}``.
        verdicts: ``{(network, policy): within tolerance}`` for the mixed runs.

    Returns:
        A markdown table.
    """
    rows = []
    for name, runs in records.items():
        reference = runs[REFERENCE]
        for policy, rec in runs.items():
            rows.append(
                [
                    name,
                    policy,
                    rec.step_time_s * 1e3,
                    rec.step_time_s / reference.step_time_s,
                    rec.memory["argument"] / 2**20,
                    rec.memory["temp"] / 2**20,
                    device_peak_cell(rec),
                    float(np.mean(rec.losses[-max(1, len(rec.losses) // 10) :])),
                    rec.eval_loss,
                    "n/a" if rec.eval_metric is None else f"{rec.eval_metric:.3f}",
                    rec.skipped,
                    float(rec.loss_scales[-1]),
                    "ref" if policy == REFERENCE else fmt(verdicts[name, policy]),
                ]
            )
    return markdown_table(_HEADERS, rows)


#: Line style and marker of the n-th policy in a figure (colours follow C0, C1...).
_SERIES_STYLES = ("-o", "--s", ":^", "-.D", "-v")


def figures(
    out_dir: Path,
    records: Mapping[str, Mapping[str, RunRecord]],
    *,
    caption: str = "",
) -> list[str]:
    """Writes the loss curves and the loss-scale trajectories; returns file names.

    The policies' loss curves nearly coincide, so each has its own line style and
    marker (every series stays visible where they overlap), and the second row
    shows each policy's difference to the float32 loss.
    """
    fig, axes = new_figure(2, len(records), size=(4.2, 3.0))
    for col, (name, runs) in enumerate(records.items()):
        top, bottom = axes[0, col], axes[1, col]
        reference = runs[REFERENCE].losses
        for i, (policy, rec) in enumerate(runs.items()):
            style = _SERIES_STYLES[i % len(_SERIES_STYLES)]
            every = max(1, len(rec.losses) // 8)
            start = i * every // len(runs)  # markers side by side, not stacked
            kw = {"label": policy, "lw": 1.0, "markevery": (start, every), "ms": 4}
            top.plot(rec.losses, style, color=f"C{i}", alpha=0.85, **kw)
            if policy != REFERENCE:
                bottom.plot(rec.losses - reference, style, color=f"C{i}", **kw)
        top.set_yscale("log")
        top.set_title(TITLES.get(name, name))
        top.set_ylabel("training loss")
        bottom.axhline(0.0, color="0.6", linewidth=0.8)
        bottom.set_xlabel("step")
        bottom.set_ylabel(f"loss - {REFERENCE} loss")
    fig.legend(
        *axes[0, 0].get_legend_handles_labels(),
        loc="outside lower center",
        # two and a half entries per network column: one column (the quick
        # scale's MLP alone) is too narrow for five in a row
        ncols=min(len(next(iter(records.values()))), 5 * len(records) // 2),
        fontsize="small",
    )
    fig.suptitle("Training loss per policy (top) and its difference to float32")
    save_figure(fig, out_dir / "loss_curves.png", caption=caption)
    fig, axes = new_figure(size=(5.6, 3.6))
    ax = axes[0, 0]
    series = 0
    for name, runs in records.items():
        for policy, rec in runs.items():
            if np.any(rec.loss_scales != 1.0):  # a loss-scaled configuration
                steps = np.arange(len(rec.loss_scales))
                style = _SERIES_STYLES[series % len(_SERIES_STYLES)][:-1]
                ax.step(
                    steps,
                    rec.loss_scales,
                    style,
                    color=f"C{series}",
                    lw=max(0.8, 2.5 - 0.7 * series),  # the first stays visible
                    label=f"{name} {policy}",
                )
                series += 1
    ax.set_yscale("log", base=2)
    ax.set_xlabel("step")
    ax.set_ylabel("loss scale")
    ax.set_title("Dynamic loss scale during training")
    if series:  # nothing in a legend that is not drawn
        ax.legend(fontsize=7)
    save_figure(fig, out_dir / "loss_scale.png", caption=caption)
    return ["loss_curves.png", "loss_scale.png"]


_AUTOCAST_TEXT = (
    "`autocast_bfloat16` leaves the model in float32 and runs its loss under "
    '`mpjax.autocast(loss, "mixed_bfloat16")`, which rewrites the traced '
    "program; `mixed_bfloat16` is the same model converted by hand with "
    "`mpjax.apply_policy`. Below, the matrix products and convolutions of "
    "one train step (forward, backward and optimizer) by operand dtypes. "
    "The check: the same products, every autocast one in bfloat16. "
    "The hand-cast encoder keeps two products with a float32 operand: "
    "`jax.nn.dot_product_attention` multiplies its float32 attention "
    "weights with the bfloat16 values (forward and backward)."
)


def report_text(
    *,
    scale: str,
    seed: int,
    backend: str,
    table: str,
    statements: list[str],
    under_table: str,
    autocast_table: str,
    tasks: Mapping[str, Task],
    figure_names: list[str],
) -> str:
    """The REPORT.md text around the tables and statements."""
    bert = tasks.get("bert")
    bert_line = []
    if bert is not None:
        _, targets, mask = bert.eval_batch
        commonest = np.bincount(targets[mask]).max() / mask.sum()
        bert_line = [
            "The BERT-style encoder predicts 15 % of the characters of each "
            f"{bert.batches[0].shape[-1]}-character window (80 % of them replaced by "
            "[MASK], 10 % by a random character, 10 % kept); its loss and accuracy "
            "count only those positions. Always guessing the commonest held-out "
            f"target character would score an accuracy of {commonest:.3f}.",
            "",
        ]
    return "\n".join(
        [
            f"# AMP: {len(tasks)} networks under {len(POLICIES)} precision "
            "configurations",
            "",
            f"Scale `{scale}`, seed {seed}, backend `{backend}`. Each model is "
            "converted with `mpjax.apply_policy` (LayerNorm/GroupNorm and attention "
            "softmax in float32) and trained with `mpjax.make_train_step` and Adam; "
            "`mixed_float16` wraps Adam in `mpjax.dynamic_loss_scaling`; `fp8` "
            "computes in bfloat16 with every dense, attention and convolution "
            "product in fp8 (e4m3 operands, e5m2 gradients, delayed scaling from a "
            "16-step amax history, `mpjax.fp8_delayed_scaling`), emulated by "
            "quantise-dequantise where the backend has no fp8 units (CPU). Step time "
            "is the median of 9 rounds in which the compiled steps of the policies "
            "are timed in turn after warm-up (ratios stay fair on a shared "
            "machine). Args and temps are XLA's compiled memory analysis of the "
            "step. Device peak is the device allocator's high-water mark during the "
            "run above what was in use before it (`jax.devices()[0].memory_stats()`:"
            " master weights, optimizer state, a batch, activations and compile "
            "scratch); `n/a` where the backend keeps no allocator statistics (CPU), "
            "`<=` where the run did not raise the process-wide mark, which cannot "
            "be reset (an upper bound).",
            "",
            *bert_line,
            table,
            "",
            "## Mixed runs against float32",
            "",
            *statements,
            "",
            "## Gradient underflow in float16",
            "",
            "Share of gradient entries that are non-zero in float32 but exactly "
            "zero when the backward pass runs in float16, on the held-out set at "
            "the final parameters of the float16 run, without loss scaling (scale "
            "1) and with the dynamic scale the run ended on. bfloat16 has "
            "float32's exponent range and needs no loss scaling.",
            "",
            under_table,
            "",
            "## autocast against the hand-cast program",
            "",
            _AUTOCAST_TEXT,
            "",
            autocast_table,
            "",
            "## Notes",
            "",
            "On CPU, XLA upcasts bfloat16/float16 matrix products and convolutions "
            "to float32 (with conversions around them), so mixed precision costs "
            "time there and its temporaries barely shrink: the step-time and "
            "memory columns describe XLA:CPU, not GPUs. Argument memory is equal "
            "across policies because the master weights and Adam state stay "
            "float32. What carries over to accelerators is the accuracy "
            "comparison; speed and activation-memory savings are GPU (tensor core) "
            "facts, measured with `--full` on a GPU.",
            "",
            *[f"![{f}]({f})" for f in figure_names],
            "",
        ]
    )


def products_table(products: Mapping[str, Mapping[str, Mapping[str, int]]], low: str):
    """Markdown table of the products of the hand-cast and the autocast step.

    Args:
        products: ``{network: {configuration: {"lhs x rhs": count}}}`` as
            :func:`experiments._amp_train.product_dtypes` returns.
        low: the compute dtype, e.g. ``"bfloat16"``.
    """
    both = f"{low} x {low}"
    rows = []
    for name, counts in products.items():
        hand, auto = counts[HAND_CAST], counts[AUTOCAST]
        rows.append(
            [
                name,
                sum(hand.values()),
                hand.get(both, 0),
                sum(auto.values()),
                auto.get(both, 0),
                fmt(products_match(hand, auto, low)),
            ]
        )
    return markdown_table(
        [
            "network",
            f"{HAND_CAST} products",
            f"in {low}",
            f"{AUTOCAST} products",
            f"in {low}",
            "match",
        ],
        rows,
    )
