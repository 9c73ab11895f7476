"""The sanity checks of the accuracy study (part of :mod:`experiments.lbm_accuracy`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import lbm_jax
from experiments._accuracy_runs import SHEDDING_METRICS, Settings, find_run
from experiments._lbm_figures import STROUHAL_RANGE, metric

__all__ = ["SHEDDING_TOLERANCE", "evaluate_checks"]

#: Largest relative difference to the reference run of each shedding statistic
#: accepted for shifted 16-bit storage (bfloat16 excluded, as in the other checks).
SHEDDING_TOLERANCE: dict[str, float] = {
    "strouhal": 0.01,
    "cd_max": 0.02,
    "cd_mean": 0.02,
    "cl_max": 0.05,
    "cl_amplitude": 0.05,
}


def _ordered_worse(records, worse: tuple[str, bool], better: tuple[str, bool]) -> bool:
    """Whether ``worse`` is further from FP64 than ``better``; False if either is
    missing, unstable or without a finite error (nothing was compared)."""
    a, b = find_run(records, *worse), find_run(records, *better)
    if a is None or b is None or not (a["stable"] and b["stable"]):
        return False
    ea, eb = a["err_vs_fp64"], b["err_vs_fp64"]
    return bool(math.isfinite(ea) and math.isfinite(eb) and ea > eb)


def evaluate_checks(
    poiseuille: list[dict[str, Any]],
    taylor_green: list[dict[str, Any]],
    cavity: list[dict[str, Any]],
    cylinder: list[dict[str, Any]],
    settings: Settings,
    *,
    unconfined: Sequence[dict[str, Any]] = (),
) -> dict[str, bool]:
    """The study's sanity checks, ``{name: passed}``.

    The cylinders are checked by their FP32 Strouhal number against the published
    range and by the shedding statistics of every planned shifted 16-bit run
    against the reference run (:data:`SHEDDING_TOLERANCE`); a planned run that is
    missing or unstable fails its check.
    """
    ref = ("fp64", True) if ("fp64", True) in settings.runs else ("fp32", True)
    checks = {
        "poiseuille_reference_matches_analytic": metric(
            find_run(poiseuille, *ref), "l2_error"
        )
        < 0.02,
        "taylor_green_reference_matches_analytic": metric(
            find_run(taylor_green, *ref), "l2_error"
        )
        < 0.05,
    }
    for case, records in (("poiseuille", poiseuille), ("taylor_green", taylor_green)):
        fp32 = find_run(records, "fp32", True)
        if ref[0] == "fp64" and fp32 is not None:
            checks[f"{case}_fp32_matches_fp64"] = fp32["err_vs_fp64"] < 1e-3
        shifted = [
            r
            for r in records
            if r["shift"]
            and r["storage"] not in ("FP64/FP64", "FP32/FP32")
            and r["storage"] != "FP32/bfloat16"
        ]
        checks[f"{case}_shifted_16bit_finite"] = all(
            r["stable"] and math.isfinite(r["err_vs_fp64"]) for r in shifted
        )
        # Only where the scale plans both runs; a planned run that is missing or
        # unstable then fails the check.
        worse, better = ("fp16", False), ("fp16s", True)
        if worse in settings.runs and better in settings.runs:
            checks[f"{case}_fp16_unshifted_worse_than_fp16s"] = _ordered_worse(
                records, worse, better
            )
    if cavity:
        fp32 = [r for r in cavity if r["storage"] == "FP32/FP32"]
        checks["cavity_fp32_matches_ghia"] = all(
            metric(r, "ghia_max_error") < _GHIA_TOL[settings.cavity_n >= 96]
            for r in fp32
        )
        fp16s = [r for r in cavity if r["storage"] == "FP32/FP16S" and r["shift"]]
        checks["cavity_fp16s_finite"] = all(
            r["stable"] and math.isfinite(r["err_vs_fp64"]) for r in fp16s
        )
    for case, prefix, records, planned in (
        ("cylinder", "cylinder", cylinder, settings.cylinder_runs),
        ("cylinder_unconfined", "unconfined", unconfined, settings.unconfined_runs),
    ):
        if records:
            checks.update(_shedding_checks(case, prefix, records, planned))
    return checks


def _shedding_checks(
    case: str,
    prefix: str,
    records: Sequence[dict[str, Any]],
    planned: Sequence[tuple[str, bool]],
) -> dict[str, bool]:
    """FP32 Strouhal number within 10 % of the published range's middle, and the
    shedding statistics of the planned shifted 16-bit runs near the reference."""
    fp32 = find_run(list(records), "fp32", True)
    st = metric(fp32, "strouhal") if fp32 else math.nan
    low, high = STROUHAL_RANGE[case]
    checks = {
        f"{prefix}_fp32_strouhal_within_10pct": abs(st / (0.5 * (low + high)) - 1.0)
        < 0.1
    }
    shifted = [
        (s, shift)
        for s, shift in planned
        if shift and lbm_jax.get_storage(s).bytes_per_value == 2 and s != "bf16"
    ]
    if shifted:
        found = [find_run(list(records), *run) for run in shifted]
        checks[f"{prefix}_shifted_16bit_shedding_matches_reference"] = all(
            r is not None
            and r["stable"]
            and all(
                abs(metric(r, f"{key}_vs_ref")) <= SHEDDING_TOLERANCE[key]
                for key in SHEDDING_METRICS[case]
            )
            for r in found
        )
    return checks


# Largest deviation from Ghia's table accepted for FP32 (coarse grid, fine grid).
_GHIA_TOL = {False: 0.08, True: 0.04}
