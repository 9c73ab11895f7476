"""GPU-sized mixed-precision benchmark: three networks, six precision set-ups.

Networks (``gpu`` scale): an MLP of four dense 8192 x 8192 layers at batch 8192
(:class:`experiments._models.MLP`, MSE regression to random targets); a BERT-style
encoder (:class:`experiments._models.BertMLM`, d 1024, 8 layers, 16 heads, length
512, batch 32, masked-language-model loss); a U-Net at 256 x 256 with 64 base channels
(:class:`experiments._models.UNet`, 3 levels, batch 16, denoising loss). Each is
trained with :func:`mpjax.make_train_step` (Adam, jit, donated state) under the
configurations of :data:`experiments._amp_train.POLICIES` plus float32 at
``highest`` matmul precision:

* ``float32``: float32 at XLA's default precision (TF32 tensor cores on Ampere
  and later);
* ``float32 highest``: float32 under ``jax.default_matmul_precision("highest")``;
* ``mixed_bfloat16``, ``mixed_float16`` (+ dynamic loss scaling) and ``fp8``
  (bfloat16 compute, e4m3 x e4m3 forward and e5m2 x e4m3 gradient products with
  delayed scaling);
* ``autocast_bfloat16``: the float32 model's loss under :func:`mpjax.autocast`
  (the hand-cast ``mixed_bfloat16`` program found by rewriting the traced one).

Per run: the step time (median of ``steps`` single steps after ``warmup`` ones, each
ended by ``block_until_ready``), the model's TFLOP/s (matrix-product and
convolution FLOPs of the float32 step's traced program, the same work for every
configuration), the fraction of the device's dense bfloat16 peak (a table of known
devices) and of a bfloat16 matmul measured in the same run, the allocator's peak
memory (``device.memory_stats()``, exact when the run raised the high-water mark,
otherwise an upper bound) and XLA's compiled estimate, and the speed-up over
``float32`` and over ``float32 highest``, next to the seed's "mixed precision is
50-60 % faster". The fp8 step's optimised HLO is searched for cuBLASLt's fp8 GEMM
(``__cublas$lt$matmul$f8``): the MLP's four layers need twelve, four e4m3 x e4m3
(forward) and eight with an e5m2 operand (the two gradients).

Checks (exit status 1 when one fails): every loss finite; the fp8 MLP's last loss
within 10 % of mixed_bfloat16's; on a GPU, the fp8 GEMMs above; on a device with
fp8 tensor cores (table), fp8 >= 1.4x mixed_bfloat16 on the MLP; on a GPU,
autocast_bfloat16 within 5 % of mixed_bfloat16's step time on every network; on
an H100/H200, the encoder in mixed_bfloat16 <= 30 ms per step; every run inside
the time budget.
On a CPU the timings are reported, not checked: XLA:CPU computes bfloat16 and
float16 products in float32 and emulates fp8 by quantising, so mixed policies are
*slower* there.

Run ``python -m experiments.amp_gpu --scale gpu --out DIR`` (``--scale tiny`` on a
CPU). Writes ``DIR/results.json``, ``DIR/REPORT.md`` and ``DIR/log.txt``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import statistics
import sys
import time
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from experiments import _amp_gpu_report, _framework, _models
from experiments._amp_train import POLICIES, build_step, device_peak, memory_stats
from experiments._jaxpr import matmul_flops

__all__ = ["CONFIGS", "Settings", "main", "measure", "settings_for"]

#: Compared configurations: label -> (label in ``POLICIES``, matmul precision).
CONFIGS: dict[str, tuple[str, str | None]] = {
    "float32": ("float32", None),
    "float32 highest": ("float32", "highest"),
    "mixed_bfloat16": ("mixed_bfloat16", None),
    "mixed_float16": ("mixed_float16", None),
    "fp8": ("fp8", None),
    "autocast_bfloat16": ("autocast_bfloat16", None),
}
NETWORKS = ("mlp", "encoder", "unet")
FP8_GEMM = "__cublas$lt$matmul$f8"


@dataclasses.dataclass(frozen=True)
class Settings:
    """Sizes and repeats of one scale (see the module docstring).

    ``budget_s``: no network or run starts after this many seconds (those left
    out fail a check); ``compile_workers``: compilations of one network's steps
    run at the same time, to fit the budget.
    """

    mlp_width: int
    mlp_layers: int
    mlp_batch: int
    encoder_dim: int
    encoder_layers: int
    encoder_heads: int
    encoder_length: int
    encoder_batch: int
    vocab: int
    unet_size: int
    unet_channels: int
    unet_levels: int
    unet_batch: int
    warmup: int
    steps: int
    matmul_n: int
    budget_s: float
    compile_workers: int
    learning_rate: float = 1e-4


_SETTINGS = {
    "gpu": Settings(8192, 4, 8192, 1024, 8, 16, 512, 32, 128, 256, 64, 3, 16,
                    warmup=2, steps=20, matmul_n=8192, budget_s=210.0,
                    compile_workers=3),
    "tiny": Settings(64, 4, 64, 32, 2, 2, 16, 4, 32, 16, 8, 2, 2,
                     warmup=1, steps=3, matmul_n=256, budget_s=3600.0,
                     compile_workers=2),
}  # fmt: skip


def settings_for(scale: str) -> Settings:
    """The settings of ``scale`` (``"gpu"`` or ``"tiny"``)."""
    if scale not in _SETTINGS:
        raise ValueError(
            f"scale is {scale!r}; expected one of {tuple(_SETTINGS)} ('tiny' to try "
            "the command on a CPU)."
        )
    return _SETTINGS[scale]


def _networks(s: Settings, seed: int) -> dict[str, tuple[nnx.Module, Callable, Any]]:
    """``name -> (model, loss(model, batch), batch)``, batches on the device."""
    rngs = nnx.Rngs(seed)
    keys = jax.random.split(jax.random.key(seed), 6)
    mlp = _models.MLP(
        s.mlp_width, s.mlp_width, s.mlp_width, depth=s.mlp_layers - 1, rngs=rngs
    )
    x = jax.random.normal(keys[0], (s.mlp_batch, s.mlp_width))
    y = 0.5 * jax.random.normal(keys[1], (s.mlp_batch, s.mlp_width))

    encoder = _models.BertMLM(
        s.vocab,
        s.encoder_dim,
        heads=s.encoder_heads,
        layers=s.encoder_layers,
        max_length=s.encoder_length,
        rngs=rngs,
    )
    shape = (s.encoder_batch, s.encoder_length)
    tokens = jax.random.randint(keys[2], shape, 0, s.vocab - 1)
    masked = jax.random.bernoulli(keys[3], 0.15, shape)
    inputs = jnp.where(masked, s.vocab - 1, tokens)  # the last token is [MASK]
    unet = _models.UNet(s.unet_channels, levels=s.unet_levels, rngs=rngs)
    clean = jax.random.normal(keys[4], (s.unet_batch, s.unet_size, s.unet_size, 1))
    noisy = clean + 0.3 * jax.random.normal(keys[5], clean.shape)
    return {
        "mlp": (mlp, _models.denoising_loss, (x, y)),  # the MSE
        "encoder": (encoder, _models.masked_lm_loss, (inputs, tokens, masked)),
        "unet": (unet, _models.denoising_loss, (noisy, clean)),
    }


def _step(model: nnx.Module, loss: Callable, config: str, s: Settings):
    """``(step(state, batch), state)`` of ``model`` under ``config``, not jitted."""
    task = types.SimpleNamespace(model=model, loss=loss, metric=None)
    recipe = POLICIES[CONFIGS[config][0]]
    step, state, _, _ = build_step(task, recipe, s.learning_rate, s.warmup + s.steps)
    # a copy: the step donates its state, which shares buffers with the model
    return step, jax.tree.map(jnp.copy, state)


def fp8_gemms(hlo: str) -> dict[str, int]:
    """Counts cuBLASLt fp8 GEMMs in optimised HLO text by operand formats.

    >>> fp8_gemms('%g = (bf16[16,16]) custom-call(f8e5m2[16,16] %a, '
    ...           'f8e4m3fn[16,16] %b, f32[] %s), '
    ...           'custom_call_target="__cublas$lt$matmul$f8"')
    {'e4m3 x e4m3': 0, 'with e5m2': 1}
    """
    counts = {"e4m3 x e4m3": 0, "with e5m2": 0}
    for line in hlo.splitlines():
        if f'custom_call_target="{FP8_GEMM}"' not in line:
            continue
        operands = line.split("custom-call(", 1)[1].split(")", 1)[0]
        key = "with e5m2" if "f8e5m2" in operands else "e4m3 x e4m3"
        counts[key] += 1
    return counts


def _lower(net: tuple, config: str, s: Settings) -> tuple[Any, int]:
    """``(lowered step, FLOPs of its products)``; the state it traced is dropped."""
    model, loss, batch = net
    precision = CONFIGS[config][1]
    # optax.adam promotes Python scalars against its int32 counter internally
    with (
        jax.numpy_dtype_promotion("standard"),
        jax.default_matmul_precision(precision or "default"),
    ):
        step, state = _step(model, loss, config, s)
        traced = jax.jit(step, donate_argnums=0).trace(state, batch)
        return traced.lower(), matmul_flops(traced.jaxpr)


def _compile(lowered: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    compiled = lowered.compile()
    return compiled, time.perf_counter() - start


def _compile_all(lowered: dict[str, Any], workers: int) -> dict[str, Any]:
    """``config -> (compiled, seconds)``, ``workers`` compilations at a time (XLA
    compiles outside the GIL; GPU autotuning then shares the device)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {c: pool.submit(_compile, low) for c, low in lowered.items()}
        return {c: f.result() for c, f in futures.items()}


def _run(net: tuple, config: str, compiled: Any, s: Settings) -> dict[str, Any]:
    """Times one compiled step from a fresh state."""
    model, loss, batch = net
    before = memory_stats()
    with jax.numpy_dtype_promotion("standard"):
        _, state = _step(model, loss, config, s)
    analysis = compiled.memory_analysis()
    losses, times = [], []
    for i in range(s.warmup + s.steps):
        start = time.perf_counter()
        state, metrics = compiled(state, batch)
        jax.block_until_ready((state, metrics))
        if i >= s.warmup:
            times.append(time.perf_counter() - start)
        losses.append(float(metrics["loss"]))
    peak, exact = device_peak(before, memory_stats())
    del state
    return {
        "step_ms": 1e3 * statistics.median(times),
        "samples_ms": [1e3 * t for t in times],
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "device_peak_bytes": peak,
        "device_peak_exact": exact,
        "xla_peak_bytes": getattr(analysis, "peak_memory_in_bytes", None),
        "fp8_gemms": fp8_gemms(compiled.as_text()) if config == "fp8" else None,
    }


def measured_matmul_tflops(n: int, dtype: Any = jnp.bfloat16, repeats: int = 10):
    """TFLOP/s of an ``n x n x n`` matmul in ``dtype`` (median of ``repeats``)."""
    a = jnp.ones((n, n), dtype)
    matmul = jax.jit(jnp.matmul)
    jax.block_until_ready(matmul(a, a))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(matmul(a, a))
        times.append(time.perf_counter() - start)
    return 2 * n**3 / statistics.median(times) / 1e12


def measure(
    settings: Settings, *, seed: int = 0, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Runs every network under every configuration, inside the time budget.

    Returns:
        ``{"device", "backend", "matmul_tflops", "runs": {network: {config:
        row or None}}, "skipped": [...], "settings": {...}, "wall_s"}``; the row of
        a run left out for the budget is ``None``.
    """
    start = time.monotonic()
    device = jax.devices()[0]
    matmul = measured_matmul_tflops(settings.matmul_n)
    log(f"{device.device_kind}: bf16 {settings.matmul_n}^3 matmul {matmul:.3g} TFLOP/s")
    runs: dict[str, dict[str, Any]] = {}
    skipped = []
    for name, net in _networks(settings, seed).items():
        runs[name] = dict.fromkeys(CONFIGS)
        if time.monotonic() - start > settings.budget_s:
            skipped += [f"{name}/{config}" for config in CONFIGS]
            log(f"{name}: skipped (time budget)")
            continue
        lowered = {config: _lower(net, config, settings) for config in CONFIGS}
        begin = time.monotonic()
        compiled = _compile_all(
            {c: low for c, (low, _) in lowered.items()}, settings.compile_workers
        )
        seconds = time.monotonic() - begin
        log(f"{name}: compiled {len(compiled)} steps in {seconds:.1f} s")
        for config, (executable, compile_s) in compiled.items():
            if time.monotonic() - start > settings.budget_s:
                skipped.append(f"{name}/{config}")
                log(f"{name} / {config}: skipped (time budget)")
                continue
            row = _run(net, config, executable, settings)
            row.update(traced_flops=lowered[config][1], compile_s=compile_s)
            runs[name][config] = row
            log(
                f"{name} / {config}: {row['step_ms']:.2f} ms/step, compile "
                f"{compile_s:.1f} s, loss {row['loss_first']:.4g} -> "
                f"{row['loss_last']:.4g}, fp8 GEMMs {row['fp8_gemms']}"
            )
        del compiled
    return {
        "device": device.device_kind,
        "backend": jax.default_backend(),
        "matmul_tflops": matmul,
        "runs": runs,
        "skipped": skipped,
        "settings": dataclasses.asdict(settings),
        "wall_s": time.monotonic() - start,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Command line; returns 0 when every check passed, 1 otherwise."""
    parser = argparse.ArgumentParser(
        prog="python -m experiments.amp_gpu",
        description="Time mixed-precision train steps of GPU-sized networks.",
    )
    parser.add_argument("--scale", default="gpu", choices=tuple(_SETTINGS))
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    settings = settings_for(args.scale)
    with open(args.out / "log.txt", "w") as log_file:

        def log(line: str) -> None:
            print(line, flush=True)
            log_file.write(line + "\n")
            log_file.flush()

        results = measure(settings, seed=args.seed, log=log)
        rows = _amp_gpu_report.rows(results)
        checks = _amp_gpu_report.checks(results, rows)
        report = _amp_gpu_report.report(results, rows, checks, args.scale)
        log(report)
    env = _framework.capture_environment(seed=args.seed, scale=args.scale)
    _framework.write_json(
        args.out / "results.json",
        {**results, "rows": rows, "checks": checks, "environment": env},
    )
    (args.out / "REPORT.md").write_text(report)
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
