"""Tables, figure and report of :mod:`experiments.mixed_precision_bench`, and the
targets its checked ratios are held to."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from experiments._report import checks_section, markdown_table, new_figure, save_figure
from experiments._stats import LEVEL, verdict

__all__ = [
    "JMP_RATIO",
    "JMP_SPEEDUP_TARGET",
    "OVERHEAD",
    "OVERHEAD_TARGET",
    "overhead_summary",
    "ratio_table",
    "step_figure",
    "step_table",
    "unresolved",
    "verdicts",
    "write_report",
]

OVERHEAD_TARGET = 1.05  # dynamic scaling vs the same policy without scaling
JMP_SPEEDUP_TARGET = 1.4  # jmp pattern time / bf16+dynamic time
#: The checked ratios ("numerator / denominator"), each timed in its own pairs.
OVERHEAD = "bf16+dynamic / bf16"
JMP_RATIO = "jmp pattern / bf16+dynamic"
#: Checked ratios: check name -> (ratio, limit, whether the ratio must be <= it).
_TARGETS: dict[str, tuple[str, float, bool]] = {
    "dynamic_overhead_le_5pct": (OVERHEAD, OVERHEAD_TARGET, True),
    "jmp_pattern_ge_1.4x_slower": (JMP_RATIO, JMP_SPEEDUP_TARGET, False),
}


def verdicts(ratios: dict[str, Any]) -> dict[str, str]:
    """The `verdict` of every checked ratio's interval, by check name."""
    out = {}
    for check, (name, limit, at_most) in _TARGETS.items():
        r = ratios[name]
        out[check] = verdict(r["low"], r["high"], limit, at_most=at_most)
    return out


def unresolved(results: dict[str, Any]) -> dict[str, str]:
    """The timing checks whose interval straddles their target: check -> the
    interval in words (the machine's load, not the code, left them open)."""
    if not results["settings"]["timing_checks"]:
        return {}
    out = {}
    for check, result in verdicts(results["ratios"]).items():
        name, limit, at_most = _TARGETS[check]
        r = results["ratios"][name]
        if result == "unresolved":
            out[check] = (
                f"median {r['median']:.3g}, {LEVEL:.0%} interval "
                f"{r['low']:.3g}-{r['high']:.3g} straddles "
                f"{'<=' if at_most else '>='} {limit:g}"
            )
    return out


def ratio_table(results: dict[str, Any]) -> str:
    outcome = verdicts(results["ratios"])
    checked = {
        name: (f"{'<=' if at_most else '>='} {limit:g}", outcome[check])
        for check, (name, limit, at_most) in _TARGETS.items()
    }
    rows = [
        [
            name,
            f"{r['median']:.3f}",
            f"[{r['low']:.3f}, {r['high']:.3f}]",
            f"+-{100 * r['resolution']:.1f} %",
            r["rounds"],
            *checked.get(name, ("", "")),
        ]
        for name, r in results["ratios"].items()
    ]
    return markdown_table(
        [
            "ratio (paired)",
            "median",
            f"{LEVEL:.0%} interval",
            "resolution",
            "rounds",
            "target",
            "interval vs target",
        ],
        rows,
    )


def overhead_summary(results: dict[str, Any]) -> str:
    """One sentence: the overhead figure, its resolution and its verdict."""
    r = results["ratios"][OVERHEAD]
    result = verdicts(results["ratios"])["dynamic_overhead_le_5pct"]
    text = (
        f"Loss-scaling overhead {OVERHEAD} = {r['median']:.3f} (median of "
        f"{r['rounds']} paired rounds; {r['level']:.0%} interval "
        f"[{r['low']:.3f}, {r['high']:.3f}], resolution +-{100 * r['resolution']:.1f} "
        f"%, so a 2 % overhead {'is' if r['resolution'] < 0.02 else 'is not'} "
        f"resolved); target <= {OVERHEAD_TARGET:g}: "
    )
    if result == "unresolved":
        return text + (
            f"unresolved, the interval straddles {OVERHEAD_TARGET:g}: this "
            "measurement cannot tell (more pairs or a quieter machine)."
        )
    return text + f"{result}."


def step_table(results: dict[str, Any]) -> str:
    def mib(n: int | None) -> float | None:
        return None if n is None else n / 2**20

    return markdown_table(
        [
            "variant",
            "step ms",
            "vs float32",
            "matmul dtype",
            "temp MiB",
            "args MiB",
            "state MiB",
            "loss first",
            "loss last",
        ],
        [
            [
                r["variant"],
                r["step_ms"],
                r["vs_float32"],
                ",".join(r["matmul_dtypes"]),
                mib(r["memory"]["temp_size_in_bytes"]),
                mib(r["memory"]["argument_size_in_bytes"]),
                mib(r["memory"]["state_bytes"]),
                r["loss_first"],
                r["loss_last"],
            ]
            for r in results["rows"]
        ],
    )


def step_figure(results: dict[str, Any], out_dir: Path, *, caption: str = "") -> Path:
    """Median step time (with every sample) and XLA's temporary buffers per
    variant of the train step."""
    fig, axes = new_figure(1, 2, size=(5.0, 3.6))
    names = [r["variant"] for r in results["rows"]]
    x = np.arange(len(names))
    for i, r in enumerate(results["rows"]):
        axes[0, 0].scatter(
            np.full(len(r["samples_ms"]), i), r["samples_ms"], s=8, color="0.6"
        )
    axes[0, 0].bar(x, [r["step_ms"] for r in results["rows"]], alpha=0.7)
    axes[0, 0].set_ylabel("step time [ms] (median, samples)")
    temp = [(r["memory"]["temp_size_in_bytes"] or 0) / 2**20 for r in results["rows"]]
    axes[0, 1].bar(x, temp, alpha=0.7)
    axes[0, 1].set_ylabel("XLA temp buffers [MiB]")
    for ax in axes[0]:
        ax.set_xticks(x, names, rotation=30, ha="right")
    s = results["settings"]
    fig.suptitle(
        f"Train step of an MLP, {s['layers']} dense {s['width']} x {s['width']} "
        f"layers, batch {s['batch']}"
    )
    return save_figure(fig, out_dir / "step_time.png", caption=caption)


def write_report(
    out_dir: Path,
    scale: str,
    table: str,
    results: dict[str, Any],
    checks: dict,
    open_checks: dict[str, str] | None = None,
) -> None:
    s = results["settings"]
    lines = [
        "# Mixed-precision train-step benchmark",
        "",
        f"Scale **{scale}**: MLP of {s['layers']} dense {s['width']}x{s['width']} "
        f"layers, batch {s['batch']}, Adam; median of {s['repeats']} repeats of "
        f"{s['steps_per_repeat']} step(s) after warm-up, variants timed round-robin "
        "in one process, state donated; then, for the checked ratios, "
        f"{s['overhead_pairs']} paired rounds of {OVERHEAD} and {s['jmp_pairs']} of "
        f"{JMP_RATIO}, each pair alone and in alternating order.",
        "",
        table,
        "",
        "## Ratios",
        "",
        "Each ratio is the median of per-round ratios; the interval is the "
        f"distribution-free {LEVEL:.0%} interval of that median (order statistics), "
        "the resolution its larger half-width relative to the median. A target is "
        "met when the whole interval meets it, missed when none of it does, and "
        "unresolved otherwise.",
        "",
        ratio_table(results),
        "",
        overhead_summary(results),
        "",
        f"Targets: {OVERHEAD} <= {OVERHEAD_TARGET}; jmp pattern / "
        f"bf16+dynamic >= {JMP_SPEEDUP_TARGET} (checked from the quick scale up). On "
        "a CPU, XLA upcasts 16-bit matrix products to float32, so 16-bit policies "
        "are slower than float32 here; the matmul dtypes above are read from the "
        "traced program.",
        "",
        "![step time](step_time.png)",
        "",
        *checks_section(checks, open_checks),
    ]
    (out_dir / "REPORT.md").write_text("\n".join(lines) + "\n")
