"""The number range of the LBM populations per test case (the paper's first result).

Lehmann et al. (2022) start from the observation that the numbers an LBM stores
occupy a far smaller range than FP16 offers, and that DDF-shifting (storing
``f_i - w_i``) moves them to small magnitudes that a format must resolve. This
pipeline measures that range on every test case the solver has: Poiseuille flow,
Taylor-Green vortices, the lid-driven cavity, the cylinder in a channel
(Schaefer-Turek), the immersed-boundary capsule in shear flow and the raindrop
impact. Each case runs with FP32 storage and DDF-shifting; at the start and at
``samples`` times during the run an `mpjax.RangeProbe` records, inside the
compiled run loop, the exact histogram of binary exponents of the stored
(shifted) populations and of the unshifted ``f_i`` of the fluid cells (the
liquid and interface cells of the raindrop), with the median rounding error of
every 16-bit format.

From these it reports, per case: the binades the populations occupy (1st, 50th
and 99th percentile of floor(log2|x|)), the share of non-zero values below each
16-bit minifloat's smallest normal value (held with reduced precision or
flushed to zero), and each format's median relative rounding error. The figures
draw the histograms against every 16-bit format's precision per binade
(``number_range.png``, as the paper's figure does) and, per case, the histogram
over time with the formats' ranges (``range_<case>.png``). The checks hold the
paper's claims on the measurements, case by case: the shifted populations span at
most half of float16's range; float16 would hold at least 1 % of them only as
subnormals (or flush them), FP16S at least ten times fewer; and the median
exponent of the 2-D validation cases is the one the tailored posit ``posit16s`` is
scaled to.

Scales: ``tiny`` (tests), ``quick`` (a 2-core CPU, half a minute: the three 2-D
validation cases of ``standard`` at half their steps, 6 samples each),
``standard`` (every case, about a minute), ``full`` (larger grids and longer
runs). Outputs: ``results.json``, ``profiles/<case>.json``
(the `ProfileReport` of each case, reloadable with
``mpjax.ProfileReport.from_json``), the figures and ``REPORT.md``.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import jax
import numpy as np

import lbm_jax
from experiments import _framework
from experiments._lbm_figures import distinct_colours
from experiments._report import (
    checks_section,
    fmt,
    markdown_table,
    new_figure,
    run_caption,
    save_figure,
)
from experiments.formats import SIXTEEN_BIT_FORMATS, rounding_error
from lbm_jax.cases import prepare_case
from mpjax import ProfileReport, RangeProbe, formats

__all__ = [
    "CaseRun",
    "MAX_SHIFTED_SPAN",
    "Settings",
    "measure",
    "run",
    "settings_for",
    "summarize",
]

#: Binades (1st to 99th percentile of floor(log2|f_i - w_i|)) the shifted
#: populations of any case may span: half of float16's 40 (2**-24 to 2**15).
MAX_SHIFTED_SPAN = 20

#: Least share of every case's shifted populations below float16's smallest
#: normal value (they would lose precision or vanish in float16) ...
FLOAT16_BELOW_NORMAL_MIN = 0.01
#: ... and the factor by which FP16S's share must be smaller, in every case.
FP16S_GAIN_MIN = 10.0

# The 2-D validation cases whose median shifted exponent sets posit16s's scale.
_SCALE_CASES = ("poiseuille", "taylor_green", "cavity")
_MINIFLOATS = ("float16", "fp16s", "fp16c", "bfloat16")
_BINS = (-60, 4)
_KINDS = ("shifted", "unshifted")


@dataclasses.dataclass(frozen=True)
class CaseRun:
    """One case of the study: its `prepare_case` options and step count."""

    case: str
    options: dict[str, Any]
    steps: int | None = None


@dataclasses.dataclass(frozen=True)
class Settings:
    """The cases of one scale and the number of samples per run."""

    cases: tuple[CaseRun, ...]
    samples: int


_SETTINGS = {
    "tiny": Settings(
        (
            CaseRun("poiseuille", {"n": 8}, 600),
            CaseRun("taylor_green", {"n": 16}, 100),
            CaseRun("cavity", {"n": 16}, 600),
            CaseRun("cylinder", {"n": 6}, 400),
            CaseRun("capsule", {"n": 16, "radius": 3.0, "width": 14}, 60),
            CaseRun("raindrop", {"n": 6, "duration": 0.3}),
        ),
        samples=3,
    ),
    # the main job: the 2-D validation cases (each case compiles its run loop and
    # probe, 6-15 s on a 2-core CPU whatever its steps); the cylinder, the
    # capsule and the raindrop are the standard scale's
    "quick": Settings(
        (
            CaseRun("poiseuille", {"n": 16}, 1500),
            CaseRun("taylor_green", {"n": 32}, 250),
            CaseRun("cavity", {"n": 32}, 1500),
        ),
        samples=6,
    ),
    "standard": Settings(
        (
            CaseRun("poiseuille", {"n": 16}, 3000),
            CaseRun("taylor_green", {"n": 32}, 500),
            CaseRun("cavity", {"n": 32}, 3000),
            CaseRun("cylinder", {"n": 8}, 3200),
            CaseRun("capsule", {"n": 24, "radius": 4.0, "width": 20}, 600),
            CaseRun("raindrop", {"n": 8, "duration": 1.5}),
        ),
        samples=10,
    ),
    "full": Settings(
        (
            CaseRun("poiseuille", {"n": 32}),
            CaseRun("taylor_green", {"n": 64}),
            CaseRun("cavity", {"n": 128}, 60000),
            CaseRun("cylinder", {"n": 20}),
            CaseRun("capsule", {}, 4000),
            CaseRun("raindrop", {"n": 20}),
        ),
        samples=20,
    ),
}


def settings_for(scale: str) -> Settings:
    """The settings of ``scale`` (one of :data:`experiments._framework.SCALES`)."""
    return _framework.settings_for(_SETTINGS, scale)


def _fluid(model: Any, state: Any) -> tuple[Any, Any, Any]:
    """(simulation, its LBMState, mask of the cells holding fluid) of a state."""
    import jax.numpy as jnp

    from lbm_jax.free_surface import Flag

    if isinstance(model, lbm_jax.Simulation):
        sim, fluid = model, state
    else:  # a coupled model: an immersed boundary, a free surface
        sim, fluid = model.sim, state.fluid
    flags = getattr(state, "flags", None)
    if flags is not None:  # liquid and interface cells; gas is meaningless
        mask = (flags == int(Flag.FLUID)) | (flags == int(Flag.INTERFACE))
    else:
        mask = jnp.asarray(sim.cell_type == int(lbm_jax.CellType.FLUID))
    return sim, fluid, mask


def measure(spec: CaseRun, probe: RangeProbe, samples: int) -> ProfileReport:
    """Run one case with FP32 storage (DDF-shifted) and probe its populations.

    Returns:
        The report with one record per population kind (``"shifted"``,
        ``"unshifted"``) and sample, the initial state first, each labelled
        ``"step t"``.
    """
    setup = prepare_case(
        spec.case, storage="fp32", shift=True, steps=spec.steps, **spec.options
    )
    model, state = setup.build()

    def observe(s: Any) -> dict[str, Any]:
        sim, fluid, mask = _fluid(model, s)
        shifted = sim.populations(fluid, shifted=True)
        return probe(
            {"shifted": shifted, "unshifted": sim.populations(fluid)},
            where={"shifted": mask, "unshifted": mask},
        )

    first = jax.device_get(jax.jit(observe)(state))
    every = max(1, setup.steps // samples)
    # run() takes a Simulation's step method as the simulation itself
    result = lbm_jax.run(
        model.step, state, setup.steps, observe=observe, sample_every=every
    )
    stats = jax.tree.map(
        lambda a, b: np.concatenate([np.asarray(a)[None], np.asarray(b)]),
        first,
        result.samples.values,
    )
    steps = [0, *(int(t) for t in result.samples.steps)]
    return probe.report(stats, labels=[f"step {t}" for t in steps])


def _percentile(hist: np.ndarray, q: float) -> float:
    """The exponent below which a share ``q`` of a histogram's values lie."""
    cum = np.cumsum(hist) / max(hist.sum(), 1)
    return float(_BINS[0] + np.searchsorted(cum, q))


def summarize(report: ProfileReport) -> dict[str, Any]:
    """Per population kind: pooled histogram, percentiles and format shares.

    Returns:
        ``{kind: {...}}`` with the pooled ``histogram`` (over every sample),
        ``values`` (non-zero finite values counted), ``zeros``, ``nonfinite``,
        ``p01``/``p50``/``p99`` exponents, ``span`` (p99 - p01 + 1 binades),
        ``below_normal`` and ``overflow`` (share of the non-zero values, per
        16-bit format) and ``rounding_error`` (per format, the median over the
        samples of each sample's median).
    """
    out = {}
    for kind in _KINDS:
        idx = [i for i, r in enumerate(report.records) if r.source == kind]
        recs = [report.records[i] for i in idx]
        hist = np.sum([r.histogram for r in recs], axis=0)
        weights = np.array([sum(r.histogram) for r in recs], np.float64)
        total = max(weights.sum(), 1.0)
        below, over = {}, {}
        for name in SIXTEEN_BIT_FORMATS:
            fr = report.fractions(name)
            below[name] = float(
                sum(
                    w * (fr[i].underflow + fr[i].subnormal)
                    for w, i in zip(weights, idx, strict=True)
                )
                / total
            )
            over[name] = float(
                sum(w * fr[i].overflow for w, i in zip(weights, idx, strict=True))
                / total
            )
        errors = {
            name: float(
                np.nanmedian(
                    [
                        math.nan
                        if r.rounding_error[name] is None
                        else r.rounding_error[name]
                        for r in recs
                    ]
                )
            )
            for name in report.formats
        }
        p01, p50, p99 = (_percentile(hist, q) for q in (0.01, 0.5, 0.99))
        out[kind] = {
            "histogram": hist.tolist(),
            "values": int(hist.sum()),
            "zeros": int(sum(r.zeros for r in recs)),
            "nonfinite": int(sum(r.nonfinite for r in recs)),
            "p01": p01,
            "p50": p50,
            "p99": p99,
            "span": p99 - p01 + 1,
            "below_normal": below,
            "overflow": over,
            "rounding_error": errors,
        }
    return out


def evaluate_checks(
    summaries: dict[str, dict[str, Any]], expected: tuple[str, ...]
) -> dict[str, bool]:
    """The paper's claims, held against the measurements (a missing case fails)."""
    checks: dict[str, bool] = {}
    for case in expected:
        s = summaries.get(case)
        ok = s is not None and all(
            s[k]["values"] > 0 and s[k]["nonfinite"] == 0 for k in _KINDS
        )
        checks[f"{case}: ran, populations finite"] = ok
        checks[
            f"{case}: shifted populations span <= {MAX_SHIFTED_SPAN} binades "
            "(float16 spans 40)"
        ] = ok and s["shifted"]["span"] <= MAX_SHIFTED_SPAN
        below = s["shifted"]["below_normal"] if ok else {}
        checks[
            f"{case}: >= {FLOAT16_BELOW_NORMAL_MIN:.0%} of shifted populations below "
            f"float16's smallest normal, >= {FP16S_GAIN_MIN:g}x fewer below FP16S's"
        ] = ok and (
            below["float16"] >= FLOAT16_BELOW_NORMAL_MIN
            and below["fp16s"] * FP16S_GAIN_MIN <= below["float16"]
        )
    scale = formats.get_format("posit16s").exponent
    median = _scale_median(summaries)
    checks[
        f"posit16s scale 2**{scale} is minus the median shifted exponent of the "
        "2-D validation cases (within 1)"
    ] = median is not None and abs(scale + median) <= 1
    return checks


def _scale_median(summaries: dict[str, dict[str, Any]]) -> float | None:
    """Median shifted exponent of the cases that set posit16s's scale, pooled."""
    hists = [
        summaries[c]["shifted"]["histogram"] for c in _SCALE_CASES if c in summaries
    ]
    if len(hists) != len(_SCALE_CASES):
        return None
    return _percentile(np.sum(hists, axis=0), 0.5)


def _table(summaries: dict[str, dict[str, Any]]) -> str:
    rows = []
    for case, s in summaries.items():
        for kind in _KINDS:
            k = s[kind]
            rows.append(
                [
                    case,
                    kind,
                    f"{k['p01']:.0f} / {k['p50']:.0f} / {k['p99']:.0f}",
                    *(
                        f"{k['below_normal'][f]:.2%}"
                        for f in ("float16", "fp16s", "fp16c")
                    ),
                    *(
                        fmt(k["rounding_error"][f], ".2e")
                        for f in ("float16", "fp16s", "fp16c", "posit16", "posit16s")
                    ),
                ]
            )
    return markdown_table(
        [
            "case",
            "populations",
            "log2|x| p1 / p50 / p99",
            "< min normal float16",
            "FP16S",
            "FP16C",
            "median rel. error float16",
            "FP16S",
            "FP16C",
            "posit16",
            "posit16s",
        ],
        rows,
    )


def _options_words(spec: CaseRun) -> str:
    """A case's grid options and steps in words, for figure titles.

    >>> _options_words(CaseRun("cavity", {"n": 32}, 1500))
    'n = 32, 1500 steps'
    """
    words = [f"{k} = {v:g}" for k, v in spec.options.items()]
    words += [f"{spec.steps} steps"] if spec.steps is not None else []
    return ", ".join(words) or "the case's defaults"


def _range_figure(
    summaries: dict[str, dict[str, Any]],
    precision: dict[str, Any],
    path: Path,
    caption: str,
) -> Path:
    """Per case: population histograms against each format's precision."""
    cases = list(summaries)
    ncols = 3
    nrows = math.ceil(len(cases) / ncols)
    fig, axes = new_figure(nrows, ncols, size=(4.6, 3.4))
    exps = np.arange(_BINS[0], _BINS[1] + 1)
    colours = distinct_colours(len(precision["formats"]))
    mids = np.asarray(precision["binades"]) + 0.5
    for ax, case in zip(axes.ravel(), cases, strict=False):
        shades = ({"color": "0.35", "alpha": 0.6}, {"color": "0.75", "alpha": 0.6})
        for kind, style in zip(_KINDS, shades, strict=True):
            hist = np.asarray(summaries[case][kind]["histogram"], np.float64)
            share = hist / max(hist.sum(), 1.0)
            ax.bar(exps + 0.5, share, width=1.0, label=f"{kind} populations", **style)
        ax.set_xlim(-36, 3)
        ax.set_xlabel("binary exponent floor(log2|x|)")
        ax.set_ylabel("share of stored values per binade")
        ax.set_title(case.replace("_", " "))
        twin = ax.twinx()
        for colour, (name, data) in zip(
            colours, precision["formats"].items(), strict=True
        ):
            lost = np.nan_to_num(np.asarray(data["max"], float), posinf=1.0)
            twin.plot(mids, np.minimum(lost, 1.0), color=colour, lw=1.1, label=name)
        twin.set_yscale("log")
        twin.set_ylim(1e-5, 2.0)
        twin.set_ylabel("max relative rounding error")
    for ax in axes.ravel()[len(cases) :]:
        ax.set_visible(False)
    handles, labels = [], []
    for a in (axes[0, 0], twin):  # the histograms, then the precision curves
        h, lab = a.get_legend_handles_labels()
        handles += h
        labels += lab
    fig.legend(handles, labels, loc="outside lower center", ncol=5, fontsize=8)
    fig.suptitle(
        "Stored LBM populations (FP32 runs, all samples) against the precision of "
        "each 16-bit format"
    )
    return save_figure(fig, path, caption=caption)


def run(
    out_dir: Path, *, quick: bool = True, seed: int = 0, scale: str | None = None
) -> dict[str, Any]:
    """Run the study into ``out_dir``; returns the table and the checks."""
    scale = _framework.resolve_scale(quick, scale)
    st = settings_for(scale)
    probe = RangeProbe(formats=SIXTEEN_BIT_FORMATS, bins=_BINS)
    (out_dir / "profiles").mkdir()
    summaries: dict[str, dict[str, Any]] = {}
    caption = run_caption(_framework.capture_environment(seed=seed, scale=scale))
    figures = []
    for spec in st.cases:
        report = measure(spec, probe, st.samples)
        (out_dir / "profiles" / f"{spec.case}.json").write_text(report.to_json())
        summaries[spec.case] = summarize(report)
        labels = tuple(f"{r.source}, {r.location}" for r in report.records)
        fig = report.figure(
            ("float16", "fp16s", "fp16c", "posit16s"),
            title=f"{spec.case.replace('_', ' ')} ({_options_words(spec)}): stored "
            "populations over time (FP32, DDF-shifted run)",
            row_labels=labels,
            row_axis="populations and time step of the sample",
        )
        path = out_dir / f"range_{spec.case}.png"
        figures.append(save_figure(fig, path, caption=caption))
    precision = rounding_error(2**16, seed, binades=(-40, 4))
    path = out_dir / "number_range.png"
    figures.insert(0, _range_figure(summaries, precision, path, caption))
    checks = evaluate_checks(summaries, tuple(s.case for s in st.cases))
    table = _table(summaries)
    env = _framework.capture_environment(seed=seed, scale=scale)
    _framework.write_json(
        out_dir / "results.json",
        {
            "environment": env,
            "bins": list(_BINS),
            "cases": {s.case: dataclasses.asdict(s) for s in st.cases},
            "summaries": summaries,
            "posit16s_scale_median": _scale_median(summaries),
            "checks": checks,
        },
    )
    _write_report(out_dir, scale, table, figures, checks, summaries)
    return {"table": table, "checks": checks}


def _write_report(
    out_dir: Path,
    scale: str,
    table: str,
    figures: list[Path],
    checks: dict[str, bool],
    summaries: dict[str, dict[str, Any]],
) -> None:
    median = _scale_median(summaries)
    lines = [
        "# Number range of the LBM populations per test case",
        "",
        f"Scale **{scale}**; `python -m experiments number_range"
        f"{' --full' if scale == 'full' else ''}`. Every case runs with FP32 storage "
        "and DDF-shifting; the stored populations f_i - w_i (`shifted`) and f_i "
        "(`unshifted`) of the fluid cells are recorded at the start and at every "
        "sample of the run. Shares below a format's smallest normal value are held "
        "with reduced precision or flushed to zero; posits have no subnormals "
        "(their precision tapers instead, see the figure).",
        "",
        table,
        "",
        "posit16s stores posit16 of x * 2**"
        f"{formats.get_format('posit16s').exponent}; the pooled median shifted "
        f"exponent of {', '.join(_SCALE_CASES)} measured here is "
        f"{'n/a' if median is None else f'{median:.0f}'}.",
        "",
        *(f"![{p.stem}]({p.name})" for p in figures),
        "",
        *checks_section(checks),
    ]
    (out_dir / "REPORT.md").write_text("\n".join(lines) + "\n")
