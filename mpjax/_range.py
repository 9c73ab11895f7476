"""Number-range statistics of chosen arrays, taken inside any compiled program.

`mpjax.profile` records every value of a program it traces itself. A
`RangeProbe` records only the arrays it is handed, from inside a program the
user compiles: a sampling function of a simulation loop, a callback of a
training loop. It computes the same fixed-size summaries as `profile` (the exact
histogram of binary exponents, zeros, non-finite values, extremes and the
median rounding error of each candidate format), and `RangeProbe.report` turns
them, one call or a whole time series of calls, into a `ProfileReport` with its
range fractions, table, JSON and figure.

>>> import jax, jax.numpy as jnp, mpjax
>>> probe = mpjax.RangeProbe(formats=("float16",), bins=(-30, 20))
>>> stats = jax.jit(probe)({"x": jnp.array([1e-9, 0.5, 3.0, 0.0])})
>>> rec = probe.report(stats).records[0]
>>> rec.source, rec.count, rec.zeros, rec.max_abs
('x', 4, 1, 3.0)
>>> round(probe.report(stats).fractions("float16")[0].underflow, 3)
0.333
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from mpjax._profile import DEFAULT_BINS, check_settings
from mpjax._profile_report import DEFAULT_FORMATS, ProfileReport, Record
from mpjax._profile_stats import summarise
from mpjax.formats import get_format

__all__ = ["RangeProbe"]

# Floating-point dtypes a statistic row can name (its index is stored on device).
_DTYPES = (
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "float8_e4m3fn",
    "float8_e5m2",
)


def _dtype_code(dtype: Any) -> int:
    name = np.dtype(dtype).name
    return _DTYPES.index(name) if name in _DTYPES else -1


@dataclasses.dataclass(frozen=True)
class RangeProbe:
    """Number-range statistics of named arrays, callable inside `jax.jit`.

    Attributes:
        formats: candidate format names of `mpjax.formats` whose median rounding
            error is measured (the range fractions of any format can be asked
            of the report later).
        bins: lowest and highest binary exponent floor(log2|x|) of the
            histograms; values beyond fall into the end bins.
        sample: elements per array (a strided sample) rounded to measure the
            rounding error; the histograms and counts cover every element.
    """

    formats: tuple[str, ...] = DEFAULT_FORMATS
    bins: tuple[int, int] = DEFAULT_BINS
    sample: int = 256

    def __post_init__(self) -> None:
        if not isinstance(self.formats, str):
            object.__setattr__(self, "formats", tuple(self.formats))
        _, bins = check_settings(self.formats, self.bins, self.sample)
        object.__setattr__(self, "bins", bins)

    def __call__(
        self,
        values: Mapping[str, Any],
        where: Mapping[str, Any] | None = None,
    ) -> dict[str, dict[str, jax.Array]]:
        """Statistics of every array of `values` (traceable; no host transfer).

        Args:
            values: name -> floating-point array.
            where: optional name -> boolean mask broadcastable to that array;
                elements where it is False are left out of every statistic
                (e.g. the solid cells of a grid).

        Returns:
            name -> statistics: ``count`` (elements counted), ``zeros``,
            ``nonfinite``, ``min_abs``, ``max_abs``, ``histogram``,
            ``rounding_error`` (one per format), ``shape`` and ``dtype`` (an
            index); pass it, or a stack of such results, to `report`.
        """
        if not isinstance(values, Mapping) or not values:
            raise TypeError(
                "RangeProbe takes a non-empty mapping of name -> array, got "
                f"{type(values).__name__}; e.g. probe({{'f': populations}})"
            )
        where = dict(where or {})
        unknown = set(where) - set(values)
        if unknown:
            raise ValueError(
                f"where names {sorted(unknown)}, which are not among the values "
                f"{sorted(values)}"
            )
        arrays, excluded = [], []
        for name, value in values.items():
            x = jnp.asarray(value)
            if not jnp.issubdtype(x.dtype, jnp.floating):
                raise TypeError(
                    f"RangeProbe: {name!r} is {x.dtype}, not floating point; "
                    "profile floating-point arrays only"
                )
            if name in where:
                keep = jnp.broadcast_to(jnp.asarray(where[name], bool), x.shape)
                x = jnp.where(keep, x, jnp.asarray(jnp.nan, x.dtype))
                excluded.append(jnp.sum(~keep, dtype=jnp.int32))
            else:
                excluded.append(jnp.int32(0))
            arrays.append(x)
        fmts = [get_format(name) for name in self.formats]
        stats = summarise(arrays, self.bins, fmts, self.sample)
        out = {}
        for i, (name, x) in enumerate(zip(values, arrays, strict=True)):
            row = {k: v[i] for k, v in stats.items()}
            # masked-out elements were made NaN: take them off the non-finite count
            row["nonfinite"] = row["nonfinite"] - excluded[i]
            row["count"] = row["count"] - excluded[i]
            row["shape"] = jnp.asarray(x.shape, jnp.int32).reshape(-1)
            row["dtype"] = jnp.int32(_dtype_code(jnp.asarray(values[name]).dtype))
            out[name] = row
        return out

    def report(
        self,
        stats: Mapping[str, Mapping[str, Any]],
        *,
        labels: Sequence[str] | None = None,
    ) -> ProfileReport:
        """The `ProfileReport` of statistics from `__call__`.

        Args:
            stats: the result of one call, or of many stacked along a leading
                axis (e.g. the samples of a simulation run over time).
            labels: with stacked statistics, one label per call (e.g.
                ``"step 1000"``), kept as each record's ``location``.

        Returns:
            One record per array (and per call, in call order within an array),
            with ``primitive="array"`` and the array's name as ``source``.
        """
        records = []
        for name, row in stats.items():
            row = {k: np.asarray(v) for k, v in row.items()}
            if row["zeros"].ndim == 0:  # one call: a stack of one
                row = {k: v[None] for k, v in row.items()}
            calls = row["zeros"].shape[0]
            if labels is not None and len(labels) != calls:
                raise ValueError(
                    f"labels has {len(labels)} entries but the statistics of "
                    f"{name!r} hold {calls} call(s); pass one label per call"
                )
            for t in range(calls):
                one = {k: v[t] for k, v in row.items()}
                code = int(one["dtype"])
                meta = (
                    "value",
                    "array",
                    name,
                    labels[t] if labels is not None else f"call {t}",
                    tuple(int(d) for d in one["shape"]),
                    _DTYPES[code] if code >= 0 else "float",
                )
                records.append(Record.from_stats(len(records), meta, one, self.formats))
        return ProfileReport(
            records=tuple(records), formats=self.formats, bins=self.bins
        )
