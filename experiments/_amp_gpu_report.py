"""Rows, checks and report of :mod:`experiments.amp_gpu`."""

from __future__ import annotations

import math
from typing import Any

from experiments._report import checks_section, markdown_table

__all__ = ["PEAKS", "checks", "device_peaks", "report", "rows"]

#: Dense (no sparsity) peak TFLOP/s by device, from NVIDIA's data sheets (SXM
#: parts): float32 without tensor cores, TF32, bfloat16/float16 and fp8 tensor
#: cores. Matched as a substring of ``jax.Device.device_kind``, first match wins.
PEAKS: dict[str, dict[str, float | None]] = {
    "H200": {"float32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp8": 1978.9},
    "H100": {"float32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp8": 1978.9},
    "A100": {"float32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp8": None},
}
#: The devices on which the encoder target (mixed_bfloat16 <= 30 ms) is checked.
ENCODER_TARGET_DEVICES = ("H200", "H100")
ENCODER_TARGET_MS = 30.0
FP8_SPEEDUP_TARGET = 1.4  # fp8 vs mixed_bfloat16 on the MLP
FP8_LOSS_TOLERANCE = 0.10  # fp8 MLP last loss vs mixed_bfloat16's, relative
#: autocast's step time over the hand-cast program's, per network, on a GPU.
AUTOCAST_TIME_TOLERANCE = 0.05
SEED_CLAIM = "50-60 % faster (1.5-1.6x)"


def device_peaks(kind: str) -> tuple[str | None, dict[str, float | None]]:
    """``(table key, peaks)`` of the device named ``kind``, or ``(None, {})``.

    >>> device_peaks("NVIDIA H200")[0], device_peaks("cpu")
    ('H200', (None, {}))
    """
    for key, peaks in PEAKS.items():
        if key in kind:
            return key, peaks
    return None, {}


def _gib(n: int | None) -> float | None:
    return None if n is None else n / 2**30


def _speedup(reference: dict[str, Any] | None, run: dict[str, Any]) -> float | None:
    return None if reference is None else reference["step_ms"] / run["step_ms"]


def rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per network and configuration that ran, with the derived figures."""
    _, peaks = device_peaks(results["device"])
    out = []
    for network, runs in results["runs"].items():
        base, highest = runs.get("float32"), runs.get("float32 highest")
        for config, run in runs.items():
            if run is None:
                continue
            # the float32 step's products: the model's work, the same for every
            # configuration (fp8's traced backward also replays its forward
            # product, which XLA removes)
            work = (base or run)["traced_flops"]
            tflops = work / (run["step_ms"] * 1e-3) / 1e12
            peak = peaks.get("bf16")
            out.append(
                {
                    "network": network,
                    "config": config,
                    "step_ms": run["step_ms"],
                    "tflops": tflops,
                    "of_bf16_peak": None if peak is None else tflops / peak,
                    "of_measured_matmul": tflops / results["matmul_tflops"],
                    "vs_float32": None
                    if base is None
                    else base["step_ms"] / run["step_ms"],
                    "vs_highest": (
                        None if highest is None else highest["step_ms"] / run["step_ms"]
                    ),
                    "peak_gib": _gib(run["device_peak_bytes"]),
                    "peak_exact": run["device_peak_exact"],
                    "xla_peak_gib": _gib(run["xla_peak_bytes"]),
                    "loss_first": run["loss_first"],
                    "loss_last": run["loss_last"],
                    "fp8_gemms": run["fp8_gemms"],
                }
            )
    return out


def checks(results: dict[str, Any], table: list[dict[str, Any]]) -> dict[str, bool]:
    """The benchmark's pass/fail checks (those that apply on this device)."""
    by = {(r["network"], r["config"]): r for r in table}
    key, peaks = device_peaks(results["device"])
    out = {
        "every run inside the time budget": not results["skipped"],
        "every loss finite": all(
            math.isfinite(r["loss_first"]) and math.isfinite(r["loss_last"])
            for r in table
        ),
    }
    fp8, bf16 = by.get(("mlp", "fp8")), by.get(("mlp", "mixed_bfloat16"))
    if fp8 and bf16:
        gap = abs(fp8["loss_last"] - bf16["loss_last"]) / abs(bf16["loss_last"])
        out[f"mlp fp8 loss within {FP8_LOSS_TOLERANCE:.0%} of mixed_bfloat16"] = (
            gap <= FP8_LOSS_TOLERANCE
        )
    if results["backend"] == "gpu":
        layers = results["settings"]["mlp_layers"]
        gemms = (fp8 or {}).get("fp8_gemms") or {}
        name = f"mlp fp8 step has {layers} e4m3 x e4m3 and {2 * layers} e5m2 GEMMs"
        out[name] = (
            gemms.get("e4m3 x e4m3", 0) >= layers
            and gemms.get("with e5m2", 0) >= 2 * layers
        )
    if peaks.get("fp8") and fp8 and bf16:
        speedup = bf16["step_ms"] / fp8["step_ms"]
        out[f"mlp fp8 >= {FP8_SPEEDUP_TARGET}x mixed_bfloat16"] = (
            speedup >= FP8_SPEEDUP_TARGET
        )
    if results["backend"] == "gpu":
        for network in sorted({r["network"] for r in table}):
            auto = by.get((network, "autocast_bfloat16"))
            hand = by.get((network, "mixed_bfloat16"))
            name = (
                f"{network} autocast_bfloat16 within "
                f"{AUTOCAST_TIME_TOLERANCE:.0%} of mixed_bfloat16's step time"
            )
            out[name] = bool(
                auto
                and hand
                and auto["step_ms"] <= (1 + AUTOCAST_TIME_TOLERANCE) * hand["step_ms"]
            )
    encoder = by.get(("encoder", "mixed_bfloat16"))
    if key in ENCODER_TARGET_DEVICES and encoder:
        out[f"encoder mixed_bfloat16 <= {ENCODER_TARGET_MS:g} ms/step"] = (
            encoder["step_ms"] <= ENCODER_TARGET_MS
        )
    return out


def _table(table: list[dict[str, Any]]) -> str:
    def peak(r: dict[str, Any]) -> str:
        if r["peak_gib"] is None:
            return "n/a"
        return f"{'' if r['peak_exact'] else '<= '}{r['peak_gib']:.2f}"

    return markdown_table(
        [
            "network",
            "configuration",
            "ms/step",
            "TFLOP/s",
            "of bf16 peak",
            "of bf16 matmul",
            "vs float32",
            "vs highest",
            "peak GiB",
            "XLA peak GiB",
            "loss first -> last",
        ],
        [
            [
                r["network"],
                r["config"],
                r["step_ms"],
                r["tflops"],
                "n/a" if r["of_bf16_peak"] is None else f"{r['of_bf16_peak']:.0%}",
                f"{r['of_measured_matmul']:.0%}",
                "n/a" if r["vs_float32"] is None else f"{r['vs_float32']:.2f}x",
                "n/a" if r["vs_highest"] is None else f"{r['vs_highest']:.2f}x",
                peak(r),
                "n/a" if r["xla_peak_gib"] is None else f"{r['xla_peak_gib']:.2f}",
                f"{r['loss_first']:.4g} -> {r['loss_last']:.4g}",
            ]
            for r in table
        ],
    )


def report(
    results: dict[str, Any],
    table: list[dict[str, Any]],
    outcome: dict[str, bool],
    scale: str,
) -> str:
    """The markdown report: settings, the table, what it means, the checks."""
    s = results["settings"]
    key, peaks = device_peaks(results["device"])
    gemms = {r["network"]: r["fp8_gemms"] for r in table if r["config"] == "fp8"}
    lines = [
        "# GPU-sized mixed-precision benchmark",
        "",
        f"Device **{results['device']}** ({results['backend']}), scale **{scale}**: "
        f"MLP {s['mlp_layers']} x {s['mlp_width']} batch {s['mlp_batch']}; encoder d "
        f"{s['encoder_dim']}, {s['encoder_layers']} layers, {s['encoder_heads']} "
        f"heads, length {s['encoder_length']}, batch {s['encoder_batch']}; U-Net "
        f"{s['unet_size']}^2, {s['unet_channels']} base channels, "
        f"{s['unet_levels']} levels, batch {s['unet_batch']}. Median of "
        f"{s['steps']} steps after {s['warmup']} warm-up steps; TFLOP/s from the "
        "matrix-product and convolution FLOPs of the traced float32 step. bf16 "
        + (
            f"peak {peaks['bf16']:g} TFLOP/s (data sheet, {key}); "
            if key
            else "peak: device not in the table; "
        )
        + f"a bf16 {s['matmul_n']}^3 matmul measured {results['matmul_tflops']:.3g} "
        f"TFLOP/s in this run. Whole run {results['wall_s']:.0f} s.",
        "",
        _table(table),
        "",
        f"The seed's claim for mixed precision: {SEED_CLAIM} than float32; "
        "compare the `vs float32` (TF32 products) and `vs highest` (full float32 "
        "products) columns.",
        "",
        f"cuBLASLt fp8 GEMMs in the optimised HLO of the fp8 steps: {gemms}.",
    ]
    if results["backend"] == "cpu":
        lines += [
            "",
            "On a CPU the mixed policies are slower than float32 (the `amp` "
            "pipeline measures it at its quick scale): XLA:CPU has no 16-bit matrix "
            "units and computes bfloat16 and float16 products in float32 (the "
            "casts are extra work), and fp8 is emulated by quantising and "
            "dequantising. The speed-ups are a tensor-core GPU effect. At the tiny "
            "scale a step is a few milliseconds of dispatch and scheduling noise, "
            "so the timings above only show that the command runs.",
        ]
    if results["skipped"]:
        lines += ["", f"Left out for the time budget: {', '.join(results['skipped'])}."]
    lines += ["", *checks_section(outcome)]
    return "\n".join(lines) + "\n"
