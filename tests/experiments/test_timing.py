"""Expected times, budgets and the load besides a run (experiments._timing)."""

from __future__ import annotations

import subprocess
import sys
import time

from experiments import _framework, _timing


def test_quick_expected_times_cover_every_pipeline_within_the_promise():
    quick = _timing.EXPECTED_S["quick"]
    assert set(quick) == set(_framework.PIPELINES)
    assert set(_timing.EXPECTED_S["standard"]) == set(_framework.PIPELINES)
    assert sum(quick.values()) <= _timing.QUICK_TOTAL_S, sum(quick.values())
    for name, standard in _timing.EXPECTED_S["standard"].items():
        assert quick[name] <= standard, name  # quick never does more
    assert _timing.budget_s("amp", "quick") > quick["amp"]
    assert _timing.budget_s("amp", "standard") is None  # budgets are quick-only


def test_load_besides_sees_another_process_and_not_this_one():
    since = _timing.cpu_sample()
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(1.5)
        until = _timing.cpu_sample()  # before the child is waited for
    finally:
        busy.kill()
        busy.wait()
    other = _timing.load_besides(since, until)
    assert other is not None and other >= 0.5, other
    # this process's own CPU time is not counted as others'
    since = _timing.CpuSample(wall=0.0, busy=10.0, own=1.0)
    until = _timing.CpuSample(wall=2.0, busy=14.0, own=3.0)
    assert _timing.load_besides(since, until) == 1.0


def test_load_reason_and_over_budget_note_blame_load_only_when_there_is_some():
    assert _timing.load_reason(1.2).startswith("machine load: 1.2 cores")
    idle = _timing.load_reason(0.05)
    assert "machine load" not in idle and "no load besides this run" in idle
    loaded = _timing.over_budget_note("amp", 80.0, 56.0, 1.5)
    assert "1.5 cores busy besides this run" in loaded
    quiet = _timing.over_budget_note("amp", 80.0, 56.0, 0.0)
    assert "otherwise idle" in quiet and "python -m experiments amp" in quiet
    assert "EXPECTED_S" in quiet
