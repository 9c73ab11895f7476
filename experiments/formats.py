"""Number formats: facts, exhaustive round trips, rounding error and throughput.

For every registered format of `mpjax.formats` this pipeline

* tabulates the facts (max, smallest normal and subnormal, epsilon, decimal digits;
  `facts.json`);
* decodes every code of each <= 16-bit format and encodes the values again, which
  must give back every non-NaN code (`round_trip.json`);
* measures the relative rounding error `|round(x) - x| / |x|` per binade of
  log-uniform random inputs (`rounding_error.json`, `rounding_error.png`): the
  minifloats must stay within the unit roundoff `epsilon / 2` over their normal
  range; the posits show their tapered precision;
* times encode + decode, each writing into a donated buffer, against the
  bandwidth-bound STREAM copy of `lbm_jax.bench` measured in the same rounds
  (`experiments.bench_formats`, `bench.json`, `throughput.png`) with the targets of
  `experiments.bench_formats.TARGETS`. The speed checks only apply from the "quick"
  scale up (the tiny test scale is dominated by dispatch overhead).

Scales: tiny (tests) 2**14 values, quick and standard 2**24, full 2**26 (the issue's
size).
Run ``python -m experiments formats`` (``--full`` for 2**26).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import jax
import numpy as np

from experiments import _framework, bench_formats
from experiments._report import markdown_table, new_figure, run_caption, save_figure
from mpjax import formats

__all__ = ["SIXTEEN_BIT_FORMATS", "Settings", "rounding_error", "run", "settings_for"]


@dataclasses.dataclass(frozen=True)
class Settings:
    """Sizes for one scale.

    Attributes:
        bench_log2n: the benchmark array has 2**bench_log2n float32 values.
        repeats: timed benchmark rounds (median reported).
        error_samples: random inputs for the rounding-error sweep.
        speed_checks: whether the throughput targets count as checks.
    """

    bench_log2n: int
    repeats: int
    error_samples: int
    speed_checks: bool


# A few seconds on a 2-core CPU: the main job runs it as it is.
_STANDARD = Settings(bench_log2n=24, repeats=7, error_samples=2**18, speed_checks=True)

_SETTINGS = {
    "tiny": Settings(
        bench_log2n=14, repeats=3, error_samples=2**14, speed_checks=False
    ),
    "quick": _STANDARD,
    "standard": _STANDARD,
    "full": Settings(bench_log2n=26, repeats=7, error_samples=2**20, speed_checks=True),
}

#: The 16-bit formats, in the registry's order.
SIXTEEN_BIT_FORMATS = tuple(
    n for n in formats.list_formats() if formats.get_format(n).bits == 16
)


def settings_for(scale: str) -> Settings:
    """The `Settings` of a scale ("tiny", "quick", "standard" or "full")."""
    return _framework.settings_for(_SETTINGS, scale)


def _names() -> list[str]:
    x64 = jax.dtypes.canonicalize_dtype(np.float64) == np.dtype(np.float64)
    return [n for n in formats.list_formats() if n != "float64" or x64]


def _facts() -> list[dict[str, Any]]:
    rows = []
    for name in formats.list_formats():
        f = formats.get_format(name)
        rows.append(
            {
                "name": name,
                "bits": f.bits,
                "storage": str(f.storage_dtype),
                "max": f.max,
                "min_normal": f.min_normal,
                "min_subnormal": f.min_subnormal,
                "epsilon": f.epsilon,
                "decimal_digits": f.decimal_digits,
                "has_inf": f.has_inf,
                "has_nan": f.has_nan,
            }
        )
    return rows


def _round_trip() -> dict[str, dict[str, int]]:
    """Per <= 16-bit format: codes checked and codes that failed to round-trip."""
    out = {}
    for name in formats.list_formats():
        f = formats.get_format(name)
        if f.bits > 16:
            continue
        raw = np.arange(2**f.bits, dtype=np.uint32)
        uint = np.uint16 if f.bits == 16 else np.uint8
        codes = raw.astype(uint).view(f.storage_dtype)
        vals = np.asarray(jax.jit(f.decode)(codes))
        back = np.asarray(jax.jit(f.encode)(vals)).view(uint)
        real = ~np.isnan(vals)
        out[name] = {
            "codes": int(real.sum()),
            "failures": int((back[real] != codes.view(uint)[real]).sum()),
        }
    return out


def rounding_error(
    samples: int,
    seed: int,
    names: tuple[str, ...] = SIXTEEN_BIT_FORMATS,
    binades: tuple[int, int] = (-64, 64),
) -> dict[str, Any]:
    """Max and median relative error per binade of |x| in [2**lo, 2**hi).

    ``samples`` log-uniform random float32 inputs of both signs are rounded to
    each format of ``names``; ``binades`` are ``(lo, hi)``.
    """
    rng = np.random.default_rng(seed)
    lo, hi = binades
    exps = rng.uniform(lo, hi, samples)
    x = (np.exp2(exps) * rng.choice([-1.0, 1.0], samples)).astype(np.float32)
    binade = np.floor(np.log2(np.abs(x).astype(np.float64))).astype(int)
    edges = list(range(lo, hi))
    result: dict[str, Any] = {"binades": edges, "formats": {}}
    for name in names:
        f = formats.get_format(name)
        r = np.asarray(jax.jit(f.round)(x)).astype(np.float64)
        xd = x.astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            rel = np.abs(r - xd) / np.abs(xd)
        max_err, med_err = [], []
        for b in edges:
            sel = rel[binade == b]
            max_err.append(float(sel.max()) if sel.size else math.nan)
            med_err.append(float(np.median(sel)) if sel.size else math.nan)
        normal_lo = f.min_normal if f.min_normal is not None else 1.0
        normal_hi = f.max if f.min_normal is not None else 2.0
        in_normal = (np.abs(xd) >= normal_lo) & (np.abs(xd) <= normal_hi)
        result["formats"][name] = {
            "max": max_err,
            "median": med_err,
            "max_in_normal_range": float(rel[in_normal].max()),
            "unit_roundoff": f.epsilon / 2,
        }
    return result


def _error_figure(err: dict[str, Any], path: Path, caption: str) -> None:
    fig, axes = new_figure(size=(7.5, 4.5))
    ax = axes[0, 0]
    mids = np.asarray(err["binades"]) + 0.5
    for name, data in err["formats"].items():
        # Overflow to Inf counts as losing the value (relative error 1).
        lost = np.nan_to_num(np.asarray(data["max"], float), posinf=1.0)
        ax.plot(mids, np.minimum(lost, 1.0), label=name, lw=1.3)
    ax.set_yscale("log")
    ax.set_ylim(1e-5, 2.0)
    ax.set_xlabel("log2 |x|")
    ax.set_ylabel("max relative rounding error per binade")
    ax.set_title("Rounding error over magnitude (1 = value lost)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    save_figure(fig, path, caption=caption)


def _bench_figure(bench: dict[str, Any], path: Path, caption: str) -> None:
    fig, axes = new_figure(size=(7.5, 4.0))
    ax = axes[0, 0]
    rows = bench["rows"]
    names = [r["name"] for r in rows]
    ax.bar(
        names,
        [r["ratio_paired"] for r in rows],
        color="tab:blue",
        label="measured (median of paired rounds)",
    )
    limit = "upper limit: a format meets its target at or below this ratio"
    floor = "memory-bound floor 1 + bytes / 4"
    for i, r in enumerate(rows):
        ax.plot([i - 0.4, i + 0.4], [r["floor"]] * 2, "k--", lw=1, zorder=3)
        ax.plot([], [], "k--", lw=1, label=floor)
        floor = None
        if r["target"] is not None:
            ax.plot([i - 0.4, i + 0.4], [r["target"]] * 2, color="tab:red", lw=2)
            ax.plot([], [], color="tab:red", lw=2, label=limit)
            limit = None
    ax.axhline(1.0, color="black", lw=0.8, label="as fast as a STREAM copy")
    ax.set_ylabel("(encode + decode) / copy time")
    ax.set_title(
        f"Encode + decode time relative to a copy, n = 2^{int(math.log2(bench['n']))}"
        f" values, copy at {bench['baseline_gbs']:.1f} GB/s"
    )
    handles, labels = ax.get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda i: not labels[i].startswith("meas"))
    fig.legend(  # the measured bars first, as drawn
        [handles[i] for i in order],
        [labels[i] for i in order],
        loc="outside lower center",
        fontsize="small",
    )
    ax.tick_params(axis="x", rotation=45)
    save_figure(fig, path, caption=caption)


def run(
    out_dir: Path, *, quick: bool = True, seed: int = 0, scale: str | None = None
) -> dict[str, Any]:
    """Runs the pipeline and writes its JSON, figures and REPORT.md into `out_dir`.

    Args:
        out_dir: an existing, empty directory.
        quick: CPU-sized benchmark (2**24 values) or the issue's 2**26.
        seed: seed of the random inputs.
        scale: override the scale ("tiny" for tests); see
            `experiments._framework.resolve_scale`.

    Returns:
        ``{"table", "checks", "facts", "round_trip", "bench", "scale"}``.
    """
    scale = _framework.resolve_scale(quick, scale)
    settings = settings_for(scale)
    out_dir = Path(out_dir)

    facts = _facts()
    round_trip = _round_trip()
    err = rounding_error(settings.error_samples, seed)
    bench = bench_formats.bench(
        2**settings.bench_log2n, repeats=settings.repeats, names=_names(), seed=seed
    )

    checks: dict[str, bool] = {
        "round_trip_every_code": all(v["failures"] == 0 for v in round_trip.values()),
    }
    for name, data in err["formats"].items():
        ok = data["max_in_normal_range"] <= data["unit_roundoff"]
        checks[f"{name}_error_within_unit_roundoff"] = bool(ok)
    if settings.speed_checks:
        for r in bench["rows"]:
            if r["target"] is not None:
                checks[f"{r['name']}_within_{r['target']:g}x_copy"] = bool(
                    r["meets_target"]
                )

    ratios = {r["name"]: r["ratio_paired"] for r in bench["rows"]}
    rows = []
    for f in facts:
        name = f["name"]
        e = err["formats"].get(name)
        rows.append(
            [
                name,
                f["bits"],
                f["storage"],
                f"{f['max']:.6g}",
                "-" if f["min_normal"] is None else f"{f['min_normal']:.4g}",
                f"{f['min_subnormal']:.4g}",
                f"{f['epsilon']:.4g}",
                f"{f['decimal_digits']:.2f}",
                "-" if e is None else f"{e['max_in_normal_range']:.3g}",
                "-" if name not in ratios else f"{ratios[name]:.2f}",
            ]
        )
    table = markdown_table(
        [
            "format",
            "bits",
            "storage",
            "max",
            "min normal",
            "min subnormal",
            "epsilon",
            "digits",
            "max rel. error",
            "(enc+dec)/copy",
        ],
        rows,
    )

    _framework.write_json(out_dir / "facts.json", {"formats": facts})
    _framework.write_json(out_dir / "round_trip.json", round_trip)
    _framework.write_json(out_dir / "rounding_error.json", err)
    _framework.write_json(out_dir / "bench.json", bench)
    caption = run_caption(_framework.capture_environment(seed=seed, scale=scale))
    _error_figure(err, out_dir / "rounding_error.png", caption)
    _bench_figure(bench, out_dir / "throughput.png", caption)
    _report(out_dir, scale, table, bench, checks)
    return {
        "table": table,
        "checks": checks,
        "facts": facts,
        "round_trip": round_trip,
        "bench": bench,
        "scale": scale,
    }


def _report(
    out_dir: Path,
    scale: str,
    table: str,
    bench: dict[str, Any],
    checks: dict[str, bool],
) -> None:
    check_lines = "\n".join(
        f"- {'PASS' if ok else 'FAIL'} `{name}`" for name, ok in checks.items()
    )
    text = f"""# Number formats ({scale} scale)

Facts of every registered format, the largest relative rounding error measured
over its normal range (posits: over [1, 2]), and the encode + decode time relative
to a bandwidth-bound copy of the same array ({bench["baseline"]},
{bench["baseline_gbs"]:.1f} GB/s; same rounds; the median over {bench["repeats"]}
rounds of the per-round ratio, after warm-up).

{table}

"max rel. error" must not exceed epsilon / 2 (round to nearest). The throughput
ratio counts both directions, each writing into a donated (reused) buffer: encode
reads 4 and writes b bytes per value, decode reads b and writes 4, the copy reads
and writes 4, so for arrays much larger than the caches 1 + b / 4 is the
memory-bound floor (1.5x for a 16-bit format; smaller arrays partly stay in cache,
and timings on a shared machine are noisy).

## Throughput

{bench_formats.table(bench)}

![throughput](throughput.png)

## Rounding error over magnitude

![rounding error](rounding_error.png)

fp16s is float16 shifted down by `2**15` (range `[2**-39, 2)`); fp16c trades the
Inf/NaN codes and one exponent bit for one more mantissa bit; the posits are most
precise near 1 and lose precision gradually towards minpos/maxpos.

## Checks

{check_lines}

Every <= 16-bit format was decoded code by code and re-encoded (round_trip.json).
"""
    (out_dir / "REPORT.md").write_text(text)
