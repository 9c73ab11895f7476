"""Tests for the GPU-sized AMP benchmark: its checks, HLO reading and imports."""

from __future__ import annotations

import dataclasses
import doctest
import subprocess
import sys

import pytest

from experiments import _amp_gpu_report, _jaxpr, amp_gpu


def _results(
    device="NVIDIA H200", backend="gpu", fp8_ms=12.0, gemms=(4, 8), autocast_ms=20.5
):
    def run(ms, loss=1.0, fp8=None):
        return {
            "step_ms": ms,
            "traced_flops": 1e12,
            "loss_first": 2.0,
            "loss_last": loss,
            "device_peak_bytes": 2**30,
            "device_peak_exact": True,
            "xla_peak_bytes": None,
            "fp8_gemms": fp8,
        }

    counts = {"e4m3 x e4m3": gemms[0], "with e5m2": gemms[1]}
    return {
        "device": device,
        "backend": backend,
        "matmul_tflops": 800.0,
        "skipped": [],
        "settings": dataclasses.asdict(amp_gpu.settings_for("gpu")),
        "wall_s": 100.0,
        "runs": {
            "mlp": {
                "float32": run(43.0),
                "float32 highest": run(237.0),
                "mixed_bfloat16": run(20.0),
                "fp8": run(fp8_ms, loss=1.05, fp8=counts),
                "autocast_bfloat16": run(autocast_ms),
            },
            "encoder": {
                "mixed_bfloat16": run(28.0),
                "autocast_bfloat16": run(28.0),
            },
        },
    }


def _checks(results):
    return _amp_gpu_report.checks(results, _amp_gpu_report.rows(results))


def test_checks_pass_when_every_target_is_met():
    checks = _checks(_results())
    assert len(checks) == 8 and all(checks.values()), checks
    row = _amp_gpu_report.rows(_results())[2]  # mlp, mixed_bfloat16
    assert row["tflops"] == pytest.approx(50.0)
    assert row["vs_float32"] == pytest.approx(43.0 / 20.0)
    assert row["vs_highest"] == pytest.approx(237.0 / 20.0)
    assert row["of_bf16_peak"] == pytest.approx(50.0 / 989.4)
    # fp8's traced step counts more products (its backward replays the forward
    # product, which XLA removes): the model's work is the float32 step's
    results = _results()
    results["runs"]["mlp"]["fp8"]["traced_flops"] = 2e12
    fp8 = _amp_gpu_report.rows(results)[3]
    assert fp8["config"] == "fp8" and fp8["tflops"] == pytest.approx(1.0 / 12e-3)


@pytest.mark.parametrize(
    ("change", "failed"),
    [
        ({"fp8_ms": 15.0}, "mlp fp8 >= 1.4x mixed_bfloat16"),
        ({"gemms": (4, 7)}, "mlp fp8 step has 4 e4m3 x e4m3 and 8 e5m2 GEMMs"),
        (
            {"autocast_ms": 21.1},
            "mlp autocast_bfloat16 within 5% of mixed_bfloat16's step time",
        ),
    ],
)
def test_checks_fail_when_a_target_is_missed(change, failed):
    checks = _checks(_results(**change))
    assert [name for name, ok in checks.items() if not ok] == [failed]


def test_slow_encoder_budget_overrun_and_far_fp8_loss_fail():
    results = _results()
    results["runs"]["encoder"]["mixed_bfloat16"]["step_ms"] = 31.0
    results["runs"]["mlp"]["fp8"]["loss_last"] = 1.2
    results["skipped"] = ["unet/fp8"]
    del results["runs"]["encoder"]["autocast_bfloat16"]  # missing fails
    failed = {name for name, ok in _checks(results).items() if not ok}
    assert failed == {
        "encoder autocast_bfloat16 within 5% of mixed_bfloat16's step time",
        "encoder mixed_bfloat16 <= 30 ms/step",
        "mlp fp8 loss within 10% of mixed_bfloat16",
        "every run inside the time budget",
    }


def test_device_targets_apply_only_where_they_are_stated():
    # no fp8 tensor cores, not an H100/H200, no GPU: only the portable checks
    for device, backend in (("NVIDIA A100-SXM4-80GB", "gpu"), ("cpu", "cpu")):
        checks = _checks(_results(device=device, backend=backend, fp8_ms=30.0))
        assert not any("1.4x" in name or "ms/step" in name for name in checks)
    assert any("GEMMs" in n for n in _checks(_results(device="NVIDIA A100")))
    report = _amp_gpu_report.report(_results("cpu", "cpu"), [], {}, "tiny")
    assert "XLA:CPU" in report and "slower than float32" in report


def test_docstring_examples():
    for module in (amp_gpu, _amp_gpu_report, _jaxpr):
        result = doctest.testmod(module)
        assert result.attempted >= 1 and result.failed == 0


def test_importing_the_benchmark_does_not_import_jmp():
    code = "import sys, experiments.amp_gpu; print('jmp' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


@pytest.mark.slow
def test_tiny_scale_runs_and_writes_its_results(tmp_path):
    assert amp_gpu.main(["--scale", "tiny", "--out", str(tmp_path)]) == 0
    for name in ("results.json", "REPORT.md", "log.txt"):
        assert (tmp_path / name).stat().st_size > 0
