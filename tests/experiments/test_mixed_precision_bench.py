"""The train-step benchmark's statistics: intervals of median ratios and verdicts."""

from __future__ import annotations

import copy
import json
import random

import pytest

from experiments import _stats, _timing
from experiments import mixed_precision_bench as mpb


@pytest.fixture(scope="module")
def tiny_results():
    return mpb.measure(mpb.settings_for("tiny"))


def test_median_interval_uses_the_binomial_order_statistics():
    values = list(range(1, 101))
    random.Random(0).shuffle(values)
    # the textbook 95 % ranks for n = 100 are 40 and 61
    assert _stats.median_interval(values) == (40, 61)
    assert _stats.median_interval(range(1, 12)) == (2, 10)  # n = 11
    assert _stats.median_interval(range(1, 7)) == (1, 6)  # n = 6: min and max
    assert _stats.median_interval(range(1, 101), level=0.5) == (47, 54)


def test_median_interval_rejects_too_few_values_and_bad_levels():
    with pytest.raises(ValueError, match="5 values are too few .* at least 6"):
        _stats.median_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    with pytest.raises(ValueError, match="level must be in"):
        _stats.median_interval(range(10), level=1.0)


@pytest.mark.parametrize(
    ("low", "high", "at_most", "expected"),
    [
        (0.98, 1.04, True, "met"),
        (1.06, 1.10, True, "missed"),
        (1.00, 1.08, True, "unresolved"),
        (1.50, 1.70, False, "met"),
        (1.20, 1.30, False, "missed"),
        (1.30, 1.60, False, "unresolved"),
    ],
)
def test_verdict_compares_the_whole_interval(low, high, at_most, expected):
    limit = 1.05 if at_most else 1.4
    assert _stats.verdict(low, high, limit, at_most=at_most) == expected


def test_measure_times_each_checked_ratio_in_its_own_pairs(tiny_results):
    settings = mpb.settings_for("tiny")
    ratios = tiny_results["ratios"]
    overhead = ratios["bf16+dynamic / bf16"]
    assert overhead["rounds"] == settings.overhead_pairs
    assert ratios["jmp pattern / bf16+dynamic"]["rounds"] == settings.jmp_pairs
    assert ratios["bf16 / float32"]["rounds"] == settings.repeats
    for r in ratios.values():
        assert r["low"] <= r["median"] <= r["high"]
        half_width = max(r["high"] - r["median"], r["median"] - r["low"])
        assert r["resolution"] == pytest.approx(half_width / r["median"])
        assert r["level"] == 0.95
    samples = {r["variant"]: r["samples_ms"] for r in tiny_results["rows"]}
    assert all(len(s) == settings.repeats for s in samples.values())


def _with_overhead(results, low, median, high):
    out = copy.deepcopy(results)
    out["settings"]["timing_checks"] = True
    out["ratios"]["bf16+dynamic / bf16"].update(
        low=low, median=median, high=high, resolution=max(high - median, median - low)
    )
    out["ratios"]["jmp pattern / bf16+dynamic"].update(low=1.5, median=1.6, high=1.7)
    return out


def test_overhead_inside_the_noise_fails_as_unresolved(
    tiny_results, monkeypatch, capsys, tmp_path
):
    # the median (1.00) meets "<= 1.05", but the interval reaches 1.08
    results = _with_overhead(tiny_results, 0.97, 1.00, 1.08)
    monkeypatch.setattr(mpb, "measure", lambda settings, seed: results)
    path = tmp_path / "r.json"
    assert mpb.main(["--json", str(path)]) == 1
    out = capsys.readouterr().out
    assert "dynamic_overhead_le_5pct: FAIL" in out
    assert "unresolved" in out and "cannot tell" in out
    assert "resolution +-8.0 %" in out and "2 % overhead is not resolved" in out
    data = json.loads(path.read_text())
    assert data["verdicts"]["dynamic_overhead_le_5pct"] == "unresolved"
    assert data["ratios"]["bf16+dynamic / bf16"]["resolution"] == pytest.approx(0.08)


def test_an_unresolved_overhead_is_reported_to_the_main_job_as_unresolved(
    tiny_results, monkeypatch, tmp_path
):
    results = _with_overhead(tiny_results, 0.97, 1.00, 1.08)
    monkeypatch.setattr(mpb, "measure", lambda settings, seed: results)
    monkeypatch.setattr(_timing, "load_besides", lambda since, until=None: 1.5)
    out = mpb.run(tmp_path, scale="tiny")
    assert out["checks"]["dynamic_overhead_le_5pct"] is False
    spread = "median 1, 95% interval 0.97-1.08 straddles <= 1.05"
    assert out["unresolved"] == {
        "dynamic_overhead_le_5pct": f"{spread}; machine load: 1.5 cores busy "
        "besides this run"
    }
    report = (tmp_path / "REPORT.md").read_text()
    assert "- dynamic_overhead_le_5pct: unresolved, median 1" in report
    assert "machine load: 1.5 cores" in report
    # on an otherwise idle machine the load is not blamed
    monkeypatch.setattr(_timing, "load_besides", lambda since, until=None: 0.02)
    (tmp_path / "idle").mkdir()
    idle = mpb.run(tmp_path / "idle", scale="tiny")["unresolved"]
    assert "machine load" not in idle["dynamic_overhead_le_5pct"]
    assert "no load besides this run" in idle["dynamic_overhead_le_5pct"]
    missed = _with_overhead(tiny_results, 1.06, 1.07, 1.08)  # a real miss
    monkeypatch.setattr(mpb, "measure", lambda settings, seed: missed)
    assert mpb.run(tmp_path, scale="tiny")["unresolved"] == {}


def test_overhead_resolved_below_target_passes(tiny_results, monkeypatch, capsys):
    results = _with_overhead(tiny_results, 0.99, 1.00, 1.01)
    monkeypatch.setattr(mpb, "measure", lambda settings, seed: results)
    assert mpb.main([]) == 0
    out = capsys.readouterr().out
    assert "dynamic_overhead_le_5pct: pass" in out
    assert "2 % overhead is resolved" in out


def test_pairs_below_a_95_percent_interval_are_refused(monkeypatch):
    def no_measure(*args, **kwargs):
        raise AssertionError("measured with too few pairs")

    monkeypatch.setattr(mpb, "measure", no_measure)
    with pytest.raises(SystemExit) as exc:
        mpb.main(["--pairs", "5"])
    assert exc.value.code == 2
