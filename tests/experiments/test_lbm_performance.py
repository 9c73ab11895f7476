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


def test_a_miss_within_the_spread_is_unresolved_and_a_real_miss_fails():
    # median 1.0 below 1.05, but one round above: the load cannot be told apart
    rows = _rows((0.9, 1.0, 1.3), fp64_rounds=(0.9, 0.85, 0.95))
    unresolved = lbm_performance.unresolved_targets(rows, (_FP16S, _FP64))
    assert list(unresolved) == [_FP16S.name]  # FP64: every round misses
    assert unresolved[_FP16S.name] == "median 1, spread 0.9-1.3 straddles >= 1.05"
    table = lbm_performance.target_table(rows, (_FP16S, _FP64))
    assert "unresolved" in table and "FAIL" in table
    passed = _rows((1.1, 1.2, 0.7))
    assert lbm_performance.unresolved_targets(passed, (_FP16S,)) == {}


def test_a_strong_speedup_miss_is_unresolved_only_within_the_spread():
    from experiments._lbm_scaling import scaling_checks, scaling_unresolved

    name = "scaling: strong speedup on 2 devices >= 1"
    rows = _scaling_rows(mlups=(30.0, 28.0, 50.0))  # speedup 0.93
    rows[0]["rounds"], rows[1]["rounds"] = [29.0, 31.0], [27.0, 30.0]
    assert not scaling_checks(rows, _SCALING)[name]
    assert scaling_unresolved(rows, _SCALING)[name] == (
        "median 0.949, spread 0.871-1.03 straddles >= 1"  # 27/31 to 30/29
    )
    rows[1]["rounds"] = [20.0, 21.0]  # every ratio below 1: a real miss
    assert scaling_unresolved(rows, _SCALING) == {}


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


@pytest.mark.parametrize("scale", ["quick", "standard"])
def test_cpu_targets_name_runs_that_the_sweep_makes(scale):
    cpu = settings_for(scale)
    assert cpu.targets and set(cpu.targets) <= set(lbm_performance.RATIO_TARGETS)
    assert cpu.rounds >= 3
    if scale == "standard":  # every stated ratio
        assert cpu.targets == lbm_performance.RATIO_TARGETS
    for t in cpu.targets:
        assert (t.lattice, t.n) in cpu.grids
        names = {get_storage(s).name for s in cpu.storages}
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


def _scaling_rows(halo_2=2 * 2 * 128**2 * 19 * 4, mlups=(30.0, 45.0, 80.0)):
    from experiments._lbm_scaling import analyse_scaling

    rows = [
        {
            "kind": kind,
            "lattice": "D3Q19",
            "n": n,
            "cells": n**3,
            "storage": "FP32/FP32",
            "mlups": m,
            "bytes_per_cell": 152,
            "devices": p,
            "decomposition": [p, 1, 1],
            "halo_bytes": halo,
        }
        for (kind, p, n, halo), m in zip(
            [
                ("strong", 1, 128, 0),
                ("strong", 2, 128, halo_2),
                ("weak", 2, 160, 2 * 2 * 160**2 * 19 * 4),
            ],
            mlups,
            strict=True,
        )
    ]
    analyse_scaling(rows)
    return rows


_SCALING = lbm_performance.Scaling(128, (1, 2), 4e6, 3, 2, min_speedup=1.0)


def test_scaling_reports_speedup_efficiency_and_halo_traffic():
    from experiments._lbm_scaling import scaling_checks, scaling_table

    rows = _scaling_rows()
    strong2, weak2 = rows[1], rows[2]
    assert strong2["speedup"] == pytest.approx(1.5)
    assert strong2["efficiency"] == pytest.approx(0.75)
    assert weak2["cells_per_device"] == 160**3 // 2
    # two 128^2 x-faces per device, 19 fp32 values: 1/32 of the step's bytes
    assert strong2["halo_share"] == pytest.approx(
        2 * 2 * 128**2 * 19 * 4 / 128**3 / 152
    )
    checks = scaling_checks(rows, _SCALING)
    assert all(checks.values()) and len(checks) == 4, checks
    assert "strong" in scaling_table(rows) and "halo MB/step" in scaling_table(rows)
    assert _SCALING.runs() == [("strong", 1, 128), ("strong", 2, 128), ("weak", 2, 160)]


def test_scaling_checks_fail_on_wrong_or_missing_figures():
    from experiments._lbm_scaling import scaling_checks

    wrong_halo = scaling_checks(_scaling_rows(halo_2=12345), _SCALING)
    assert [k for k, ok in wrong_halo.items() if not ok] == [
        "scaling: halo bytes = devices x 2 faces x n^2 cells x q x storage bytes"
    ]
    slow = scaling_checks(_scaling_rows(mlups=(30.0, 25.0, 50.0)), _SCALING)
    assert not slow["scaling: strong speedup on 2 devices >= 1"]
    missing = scaling_checks(_scaling_rows()[:2], _SCALING)  # no weak run
    assert [k for k, ok in missing.items() if ok] == [
        "scaling: strong speedup on 2 devices >= 1"  # the strong runs are there
    ]
    assert not missing[
        "scaling: every run measured, MLUPs and efficiency finite and positive"
    ]
    assert not scaling_checks([], _SCALING)["scaling: strong speedup on 2 devices >= 1"]


def test_each_scaling_point_runs_the_benchmark_with_its_own_devices(tmp_path):
    from experiments._lbm_scaling import scaling_command, scaling_env

    quick = settings_for("standard").scaling
    assert quick.n == 128 and quick.lattice == "D3Q19" and quick.devices[0] == 1
    cmd = scaling_command(quick, 2, 160, tmp_path / "w.json")
    args = build_parser().parse_args(cmd[3:])
    assert (args.n, args.devices, args.storage) == (160, 2, quick.storage)
    flags = scaling_env(2)["XLA_FLAGS"].split()
    assert flags.count("--xla_force_host_platform_device_count=2") == 1
    assert not [f for f in flags if f.endswith("_count=1")]


def test_memory_checks_fail_on_missing_excess_or_a_whole_run_above_the_ratio():
    from experiments._lbm_memory import MemorySweep, memory_checks

    sweep = MemorySweep(n=8, operations=("init",), storages=("fp16s",), whole_run_n=8)

    def row(op, storage, peak, bound=100.0):
        ok = peak <= 1.1 * bound
        return {"operation": op, "storage": storage, "n": 8, "peak": peak,
                "bound": bound, "ok": ok}  # fmt: skip

    good = {
        "rows": [row("init", "fp16s", 105.0)],
        "whole_run": [row("run", "fp32", 100.0), row("run", "fp16s", 55.0)],
    }
    assert all(memory_checks(good, sweep).values())
    over = {**good, "rows": [row("init", "fp16s", 120.0)]}
    missing = {"rows": [], "whole_run": []}
    heavy = {
        **good,
        "whole_run": [row("run", "fp32", 100.0), row("run", "fp16s", 70.0)],
    }
    for bad in (over, missing, heavy):
        assert not all(memory_checks(bad, sweep).values())
    assert sum(memory_checks(heavy, sweep).values()) == 1  # only the ratio fails
