"""The performance pipeline's stated speed ratios and the command it measures with."""

from __future__ import annotations

import math

import pytest

from experiments import lbm_performance
from experiments.lbm_performance import RatioTarget, evaluate_checks, settings_for
from lbm_jax import get_storage
from lbm_jax.__main__ import build_parser


def _rows(fp16s_rounds, fp64_rounds=(0.5, 0.5, 0.5)):
    rows = []
    for storage, nbytes, rounds in (
        ("FP32/FP32", 152.0, (1.0, 1.0, 1.0)),
        ("FP32/FP16S", 76.0, fp16s_rounds),
        ("FP64/FP64", 304.0, fp64_rounds),
    ):
        rows.append(
            {
                "lattice": "D3Q19",
                "n": 128,
                "storage": storage,
                "mlups": 40.0 * rounds[1],
                "bytes_per_cell": nbytes,
                "vs_fp32_rounds": list(rounds),
            }
        )
    lbm_performance.analyse_rows(rows, 20.0)
    return rows


_FP16S = RatioTarget("D3Q19", 128, "FP32/FP16S", 1.05, math.inf, "faster")
_FP64 = RatioTarget("D3Q19", 128, "FP64/FP64", 0.0, 0.8, "slower")


def test_a_ratio_target_is_judged_on_the_median_paired_ratio():
    # one lucky round does not carry a slow median
    rows = _rows((0.9, 1.0, 1.3))
    checks = evaluate_checks(rows, [20.0], (_FP16S, _FP64))
    assert rows[1]["speedup_vs_fp32"] == pytest.approx(1.0)
    assert checks[_FP16S.name] is False
    assert checks[_FP64.name] is True
    rows = _rows((1.1, 1.2, 0.7), fp64_rounds=(0.9, 0.85, 0.95))
    checks = evaluate_checks(rows, [20.0], (_FP16S, _FP64))
    assert checks[_FP16S.name] is True
    assert checks[_FP64.name] is False
    assert _FP64.name.endswith("<= 0.8") and _FP16S.name.endswith(">= 1.05")


def test_a_missing_run_fails_its_ratio_target():
    rows = [r for r in _rows((1.2, 1.2, 1.2)) if r["storage"] != "FP32/FP16S"]
    checks = evaluate_checks(rows, [20.0], (_FP16S,))
    assert checks[_FP16S.name] is False
    table = lbm_performance.target_table(rows, (_FP16S,))
    assert "missing" in table and "FAIL" in table


def test_out_of_cache_grids_may_not_beat_the_roofline():
    rows = _rows((1.2, 1.2, 1.2))
    assert evaluate_checks(rows, [20.0])[
        "out-of-cache grids below the bandwidth roofline"
    ]
    # a bandwidth figure far too low makes the measured speed impossible
    lbm_performance.analyse_rows(rows, 1.0)
    assert not evaluate_checks(rows, [1.0])[
        "out-of-cache grids below the bandwidth roofline"
    ]
    small = [dict(r, n=8) for r in rows]  # in cache: no such check
    assert "out-of-cache grids below the bandwidth roofline" not in evaluate_checks(
        small, [1.0]
    )


def test_quick_targets_name_runs_that_the_quick_sweep_makes():
    quick = settings_for("quick")
    assert quick.targets == lbm_performance.RATIO_TARGETS and quick.rounds >= 3
    for t in quick.targets:
        assert (t.lattice, t.n) in quick.grids
        names = {get_storage(s).name for s in quick.storages}
        assert {t.storage, "FP32/FP32"} <= names
    assert settings_for("tiny").targets == ()  # tiny grids sit in the caches


def test_each_grid_is_measured_by_the_benchmark_command(tmp_path):
    settings = settings_for("quick")
    cmd = lbm_performance.bench_command(settings, "D3Q19", 128, tmp_path / "x.json")
    assert cmd[1:4] == ["-m", "lbm_jax", "bench"]
    args = build_parser().parse_args(cmd[3:])
    assert (args.lattice, args.n, args.rounds) == ("D3Q19", 128, settings.rounds)
    assert args.storage.split(",") == list(settings.storages)
    assert args.steps == settings.steps("D3Q19", 128)
    assert args.json == str(tmp_path / "x.json")
