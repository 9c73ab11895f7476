"""The result of `mpjax.profile`: records, range fractions and recommendations.

Range fractions are computed on the host from each record's histogram of binary
exponents (bin `k` holds the non-zero finite values with 2**k <= |x| < 2**(k+1))
and its exact smallest and largest magnitude. Thresholds that are powers of two
(a format's smallest normal value and half its smallest subnormal) fall on bin
edges, so those fractions are exact. A threshold inside a bin (a format's
largest value, e.g. 65504 for float16) is apportioned: the bin's values are
taken as log-uniform over the part of the bin between the record's smallest and
largest magnitude, so a record lying wholly on one side is still exact.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from mpjax._policy import Policy, get_policy
from mpjax.formats import NumberFormat, get_format

__all__ = ["DEFAULT_FORMATS", "ProfileReport", "RangeFractions", "Record"]

#: Candidate formats assessed by `mpjax.profile` unless told otherwise.
DEFAULT_FORMATS = (
    "float16",
    "bfloat16",
    "float8_e4m3fn",
    "float8_e5m2",
    "fp16s",
    "posit16",
)

# Policies tried by `suggest_policy`, cheapest first: (compute format, policy spec).
_POLICY_LADDER = (
    ("float16", "p=f32,c=f16,o=f32"),
    ("bfloat16", "p=f32,c=bf16,o=f32"),
    ("float32", "float32"),
)
_F32_MAX = float(np.finfo(np.float32).max)


class RangeFractions(NamedTuple):
    """Shares of a record's non-zero finite values, for one format.

    Attributes:
        overflow: `|x| > max`: becomes +-Inf/NaN, or +-max where the format
            saturates (see `ProfileReport.saturates`).
        underflow: `|x| < min_subnormal / 2`: rounds to zero. Always 0 for formats
            that never flush (posits round to minpos).
        subnormal: `min_subnormal / 2 <= |x| < min_normal`: held with reduced
            precision (0 for formats without subnormals).
    """

    overflow: float
    underflow: float
    subnormal: float


@dataclasses.dataclass(frozen=True)
class Record:
    """Statistics of one floating-point value of the profiled program.

    Attributes:
        index: position in evaluation order.
        kind: "value" (forward) or "grad" (a cotangent of the backward pass).
        primitive: the producing primitive, or "input", "const", "output".
        source: the JAX name stack (`jax.named_scope`, module paths, transforms
            such as `jvp(...)`), or the argument path for inputs.
        location: the user source line that produced the value, where known.
        shape: array shape.
        dtype: dtype name.
        count: number of elements (summed over the iterations for a value of a
            loop body, 0 for the untaken branch of a `cond`).
        zeros: number of zeros.
        nonfinite: number of Inf/NaN.
        min_abs: smallest non-zero finite `|x|` (None if there is none).
        max_abs: largest finite `|x|` (None if there is no non-zero finite value).
        histogram: counts of floor(log2|x|) of the non-zero finite values, one per
            exponent of the report's `bins`, clipped into the end bins.
        rounding_error: per format, the median `|round(x) - x| / |x|` over a strided
            sample (None if the sample has no normal value): the lower median,
            truncated to bfloat16 precision (within a factor 1 - 2**-7 below the
            exact one). For a loop body value, the mean of the iterations'
            medians.
    """

    index: int
    kind: str
    primitive: str
    source: str
    location: str
    shape: tuple[int, ...]
    dtype: str
    count: int
    zeros: int
    nonfinite: int
    min_abs: float | None
    max_abs: float | None
    histogram: tuple[int, ...]
    rounding_error: Mapping[str, float | None]

    @classmethod
    def from_stats(
        cls, index: int, meta: tuple, stats: Mapping[str, Any], formats: tuple
    ) -> Record:
        """Builds a record from the profiler's metadata and fetched statistics.

        `stats` may hold a ``count`` (elements counted on the device); without
        one the count is the size of `shape`.
        """
        kind, primitive, source, location, shape, dtype = meta
        opt = lambda v: None if math.isnan(float(v)) else float(v)  # noqa: E731
        errors = np.asarray(stats["rounding_error"]).tolist()
        return cls(
            index=index,
            kind=kind,
            primitive=primitive,
            source=source,
            location=location,
            shape=tuple(int(d) for d in shape),
            dtype=dtype,
            count=int(stats["count"]) if "count" in stats else math.prod(shape),
            zeros=int(stats["zeros"]),
            nonfinite=int(stats["nonfinite"]),
            min_abs=opt(stats["min_abs"]),
            max_abs=opt(stats["max_abs"]),
            histogram=tuple(int(c) for c in np.asarray(stats["histogram"])),
            rounding_error={f: opt(e) for f, e in zip(formats, errors, strict=True)},
        )

    @property
    def label(self) -> str:
        """Short name: index, primitive and source."""
        return f"#{self.index} {self.primitive} {self.source}".strip()


def _share_beyond(rec: Record, lo: int, threshold: float, above: bool) -> float:
    """Share of `rec`'s non-zero finite values above (or below) `threshold`."""
    hist = np.asarray(rec.histogram, np.float64)
    total = hist.sum()
    if total == 0 or rec.min_abs is None or rec.max_abs is None:
        return 0.0
    t = math.log2(threshold)
    small, large = math.log2(rec.min_abs), math.log2(rec.max_abs)
    hi = lo + len(hist) - 1
    counted = 0.0
    for k in np.flatnonzero(hist):
        e = lo + int(k)
        a = max(e if e > lo else -math.inf, small)
        b = min(e + 1 if e < hi else math.inf, large)
        if b <= a:  # one point
            share = float(a > t) if above else float(a < t)
        else:
            share = (b - t) / (b - a) if above else (t - a) / (b - a)
        counted += hist[k] * min(max(share, 0.0), 1.0)
    return float(counted / total)


def _behaviour(fmt: NumberFormat) -> tuple[bool, bool]:
    """(saturates, flushes): probed by rounding beyond the format's range."""
    if fmt.max >= _F32_MAX:  # float32 values cannot overflow it
        return False, True
    big = np.float32(min(4.0 * fmt.max, _F32_MAX))
    saturates = bool(np.isfinite(np.asarray(fmt.round(big))))
    flushes = float(fmt.round(np.float32(fmt.min_subnormal / 4.0))) == 0.0
    return saturates, flushes


@dataclasses.dataclass(frozen=True)
class ProfileReport:
    """Number-range profile of a program, as returned by `mpjax.profile`.

    Attributes:
        records: one `Record` per floating-point value, in evaluation order.
        formats: the candidate format names whose rounding error was measured.
        bins: lowest and highest binary exponent of the histograms.
    """

    records: tuple[Record, ...]
    formats: tuple[str, ...]
    bins: tuple[int, int]

    # ---------------------------------------------------------------- ranges
    def exponents(self) -> np.ndarray:
        """The binary exponents floor(log2|x|) the histogram bins stand for."""
        return np.arange(self.bins[0], self.bins[1] + 1)

    def saturates(self, format_name: str) -> bool:
        """Whether `format_name` clamps overflow to +-max (instead of Inf/NaN)."""
        return _behaviour(get_format(format_name))[0]

    def fractions(self, format_name: str) -> tuple[RangeFractions, ...]:
        """Over/underflow and subnormal shares of every record for one format.

        Any registered format may be asked, not only the profiled candidates.
        """
        fmt = get_format(format_name)
        _, flushes = _behaviour(fmt)
        lo = self.bins[0]
        half_sub = fmt.min_subnormal / 2.0
        out = []
        for rec in self.records:
            under = _share_beyond(rec, lo, half_sub, False) if flushes else 0.0
            sub = 0.0
            if fmt.min_normal is not None:
                sub = _share_beyond(rec, lo, fmt.min_normal, False) - under
            over = _share_beyond(rec, lo, fmt.max, True)
            out.append(RangeFractions(over, under, max(sub, 0.0)))
        return tuple(out)

    def _select(self, kind: str) -> list[int]:
        return [i for i, r in enumerate(self.records) if r.kind == kind]

    # ------------------------------------------------------------- rendering
    def table(self, top: int | None = None) -> str:
        """A markdown table: one row per record, one column per candidate format.

        Format cells read `overflow% / underflow% / subnormal% ~ median error`.

        Args:
            top: keep only the `top` records with the largest over- plus
                underflow share in any candidate format (all records if None).
        """
        if top is not None and (not isinstance(top, int) or top < 1):
            raise ValueError(f"top must be a positive int or None, got {top!r}")
        fracs = {f: self.fractions(f) for f in self.formats}
        rows = list(range(len(self.records)))
        if top is not None:
            risk = lambda i: max(  # noqa: E731
                (fracs[f][i].overflow + fracs[f][i].underflow for f in self.formats),
                default=0.0,
            )
            rows = sorted(rows, key=lambda i: (-risk(i), i))[:top]
        head = ["#", "kind", "primitive", "source", "shape", "min|x|", "max|x|"]
        head += ["zeros", "non-finite", *self.formats]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        num = lambda v: "-" if v is None else f"{v:.3g}"  # noqa: E731
        for i in rows:
            r = self.records[i]
            cells = [str(r.index), r.kind, r.primitive, r.source or "-"]
            cells += [f"{r.dtype}{list(r.shape)}", num(r.min_abs), num(r.max_abs)]
            cells += [str(r.zeros), str(r.nonfinite)]
            for f in self.formats:
                o, u, s = fracs[f][i]
                err = num(r.rounding_error.get(f))
                cells.append(f"{100 * o:.3g}/{100 * u:.3g}/{100 * s:.3g} ~ {err}")
            lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
        return "\n".join(lines)

    def to_json(self) -> str:
        """The report as a JSON string (`ProfileReport.from_json` reads it back)."""
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ProfileReport:
        """Reads a report written by `to_json`."""
        data = json.loads(text)
        records = tuple(
            Record(
                **{
                    **r,
                    "shape": tuple(r["shape"]),
                    "histogram": tuple(r["histogram"]),
                }
            )
            for r in data["records"]
        )
        return cls(records, tuple(data["formats"]), tuple(data["bins"]))

    def figure(
        self,
        formats: tuple[str, ...] | None = None,
        *,
        title: str | None = None,
        row_labels: tuple[str, ...] | None = None,
        row_axis: str | None = None,
    ) -> Any:
        """Heat map of log10 counts, records x binary exponent, with format ranges.

        Args:
            formats: formats whose ranges are drawn (default: the candidates).
            title: the figure's title (default: one for a program profile).
            row_labels: one y tick label per record (default: `Record.label`).
            row_axis: the y-axis label (default: evaluation order).

        Returns:
            A `matplotlib.figure.Figure` (not registered with pyplot).
        """
        from mpjax._profile_figure import range_figure

        return range_figure(
            self,
            self.formats if formats is None else formats,
            title=title,
            row_labels=row_labels,
            row_axis=row_axis,
        )

    # ------------------------------------------------------- recommendations
    def suggest_policy(
        self, max_overflow: float = 0.0, max_underflow: float = 0.01
    ) -> tuple[Policy, str]:
        """The cheapest policy whose compute format holds the forward values.

        Tries float16, then bfloat16, then float32 compute (float32 parameters and
        outputs) and returns the first whose overflow and underflow shares stay
        within the thresholds in every forward ("value") record.

        Args:
            max_overflow: largest allowed overflow share of any record.
            max_underflow: largest allowed underflow (flush to zero) share.

        Returns:
            `(policy, reason)`: an `mpjax.Policy` and a sentence explaining it.
        """
        for name, value in (
            ("max_overflow", max_overflow),
            ("max_underflow", max_underflow),
        ):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a share in [0, 1], got {value!r}")
        rows = self._select("value")
        reasons = []
        for fmt_name, spec in _POLICY_LADDER:
            fr = self.fractions(fmt_name)
            over = max((fr[i].overflow, i) for i in rows) if rows else (0.0, -1)
            under = max((fr[i].underflow, i) for i in rows) if rows else (0.0, -1)
            if over[0] <= max_overflow and under[0] <= max_underflow:
                why = (
                    f"{fmt_name} compute: worst overflow {over[0]:.3g} <= "
                    f"{max_overflow} and worst underflow {under[0]:.3g} <= "
                    f"{max_underflow} over {len(rows)} forward values"
                )
                return get_policy(spec), "; ".join([*reasons, why])
            worst, share = (
                (over, "overflow")
                if over[0] > max_overflow
                else (
                    under,
                    "underflow",
                )
            )
            reasons.append(
                f"{fmt_name} rejected: {share} {worst[0]:.3g} in "
                f"{self.records[worst[1]].label}"
            )
        return get_policy("float32"), "; ".join(
            [*reasons, "float32 is the widest policy offered"]
        )

    def suggest_loss_scale(
        self, margin: float = 2.0, percentile: float = 5.0
    ) -> tuple[float, str]:
        """An initial float16 loss scale 2**k from the gradient histograms.

        Rule: k is the largest integer with `max|g| * 2**k <= float16.max /
        margin` over all gradient records, so the scaled gradients keep a margin
        below overflow. The reason says whether the `percentile`-th percentile of
        the gradient exponents then lies at or above float16's smallest normal
        exponent (-14), i.e. whether the bulk of the gradients leaves the
        subnormal and flush-to-zero range.

        Args:
            margin: headroom factor below float16's largest value (>= 1).
            percentile: percentile (0-100) of the pooled gradient exponents
                taken as "the bulk".

        Returns:
            `(scale, reason)`.

        Raises:
            ValueError: if the report has no gradient records (profile with
                `grads=True`) or the arguments are out of range.
        """
        rows = self._select("grad")
        if not rows:
            raise ValueError(
                "suggest_loss_scale needs gradient records, but this report has "
                "none; profile a scalar loss with mpjax.profile(..., grads=True)"
            )
        if not margin >= 1.0 or not 0.0 <= percentile <= 100.0:
            raise ValueError(
                f"need margin >= 1 and 0 <= percentile <= 100, got margin={margin!r}, "
                f"percentile={percentile!r}"
            )
        f16 = get_format("float16")
        largest = max((self.records[i].max_abs or 0.0) for i in rows)
        if largest == 0.0:
            return 1.0, "all gradients are zero or non-finite; no scale helps"
        k = math.floor(math.log2(f16.max / margin / largest))
        k = max(min(k, 100), -100)
        pooled = np.sum([self.records[i].histogram for i in rows], axis=0)
        cdf = np.cumsum(pooled) / pooled.sum()
        bulk = int(self.exponents()[np.searchsorted(cdf, percentile / 100.0)])
        floor_exp = int(math.log2(f16.min_normal))
        verdict = "at or above" if bulk + k >= floor_exp else "still below"
        return float(2.0**k), (
            f"largest gradient {largest:.3g} * 2^{k} stays below float16 max/"
            f"{margin:g}; the {percentile:g}th-percentile gradient exponent {bulk} "
            f"moves to {bulk + k}, {verdict} float16's smallest normal exponent "
            f"{floor_exp}"
        )
