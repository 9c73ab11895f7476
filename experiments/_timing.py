"""Wall-time expectations of the pipelines and the load besides a run.

The main job promises a wall time on an idle 2-core CPU: the expected times of
:data:`EXPECTED_S` (the progress bars show them) add up to at most
:data:`QUICK_TOTAL_S` at the quick scale. A quick run's budget, past which the run
says it is over budget and why, is its expected time times :data:`BUDGET_FACTOR`.

A wall time over budget, or a timing check the measurement cannot decide, is only
blamed on the machine's load when something besides the run kept the CPUs busy:
:func:`cpu_sample` and :func:`load_besides` compare the whole system's busy CPU time
(``/proc/stat``) with this process's own (:func:`os.times`) over the same interval.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping

__all__ = [
    "BUDGET_FACTOR",
    "BUSY_CORES",
    "EXPECTED_S",
    "QUICK_TOTAL_S",
    "CpuSample",
    "budget_s",
    "cpu_sample",
    "load_besides",
    "load_reason",
    "over_budget_note",
    "with_load_reason",
]

#: Wall time (s) of each pipeline on an idle 2-core CPU (AMD EPYC, 2 logical CPUs), per
#: scale. ``standard``: measured there (the former quick settings; the raindrop's 48 s
#: in the idle 10 min 48 s run of 2026-12-07, whose quick raindrop ran these settings;
#: 664 s in all). ``quick``: measured in one ``reproduce --quick`` run on that machine
#: on 2026-12-07 with no other load (at most 0.2 cores besides the run), rounded up to
#: the second: 240 s in the pipelines, 250 s in all with the imports and reports; the
#: mixed-precision benchmark from its own run at 60 and 12 pairs (22 s).
EXPECTED_S: Mapping[str, dict[str, float]] = {
    "quick": {
        "formats": 14.0,
        "mixed_precision_bench": 22.0,
        "amp": 32.0,
        "lbm_accuracy": 43.0,
        "lbm_gradients": 16.0,
        "lbm_performance": 28.0,
        "lbm_capsule": 25.0,
        "lbm_raindrop": 28.0,
        "number_range": 23.0,
        "inverse_design": 14.0,
    },
    "standard": {
        "formats": 14.0,  # the quick settings; measured with them
        "mixed_precision_bench": 59.0,
        "amp": 138.0,
        "lbm_accuracy": 152.0,
        "lbm_gradients": 215.0,  # 214 CPU s; 418 s wall beside 1.5 busy cores
        "lbm_performance": 108.0,
        "lbm_capsule": 99.0,
        "lbm_raindrop": 48.0,
        "number_range": 52.0,
        "inverse_design": 45.0,  # 42 CPU s under load 7 (71 s wall there)
    },
}

#: A quick run's budget is its expected time times this factor.
BUDGET_FACTOR = 1.25

#: The most ``reproduce --quick`` may take on an idle 2-core CPU (seconds).
QUICK_TOTAL_S = 300.0

#: Cores busy besides this process above which a run counts as loaded.
BUSY_CORES = 0.25


def budget_s(name: str, scale: str) -> float | None:
    """The wall-time budget of pipeline ``name`` at ``scale`` (quick only), or None.

    >>> budget_s("amp", "quick") == EXPECTED_S["quick"]["amp"] * BUDGET_FACTOR
    True
    >>> budget_s("amp", "full") is None
    True
    """
    expected = EXPECTED_S.get(scale, {}).get(name) if scale == "quick" else None
    return None if expected is None else expected * BUDGET_FACTOR


@dataclasses.dataclass(frozen=True)
class CpuSample:
    """CPU time counters at one moment (see :func:`cpu_sample`).

    Attributes:
        wall: :func:`time.monotonic` seconds.
        busy: busy CPU seconds of the whole system, all cores (``None`` without
            ``/proc/stat``).
        own: CPU seconds of this process and its finished children.
    """

    wall: float
    busy: float | None
    own: float


def _system_busy_s() -> float | None:
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    # user nice system idle iowait irq softirq steal: all but idle and iowait
    ticks = [int(v) for v in fields[1:9]]
    busy = sum(ticks) - ticks[3] - ticks[4]
    return busy / os.sysconf("SC_CLK_TCK")


def cpu_sample() -> CpuSample:
    """Sample the system's and this process's CPU time now."""
    t = os.times()
    own = t.user + t.system + t.children_user + t.children_system
    return CpuSample(time.monotonic(), _system_busy_s(), own)


def load_besides(since: CpuSample, until: CpuSample | None = None) -> float | None:
    """Average number of cores kept busy by other processes between two samples.

    >>> s = cpu_sample()
    >>> load_besides(s, s) is None or load_besides(s, s) == 0.0
    True

    Returns:
        The other processes' busy CPU seconds divided by the wall seconds, or
        ``None`` where the system's CPU time is unknown (no ``/proc/stat``).
    """
    until = cpu_sample() if until is None else until
    if since.busy is None or until.busy is None:
        return None
    wall = until.wall - since.wall
    if wall <= 0.0:
        return 0.0
    others = (until.busy - since.busy) - (until.own - since.own)
    return max(others, 0.0) / wall


def load_reason(other_cores: float | None) -> str:
    """Why a timing check went unresolved, from the load besides the run.

    >>> load_reason(1.4)
    'machine load: 1.4 cores busy besides this run'
    >>> load_reason(0.0).startswith("no load besides this run")
    True
    """
    if other_cores is None:
        return "load besides this run unknown (no /proc/stat)"
    if other_cores >= BUSY_CORES:
        return f"machine load: {other_cores:.1f} cores busy besides this run"
    return (
        f"no load besides this run ({other_cores:.2f} cores): the timing's own "
        "spread straddles the target; rerun it, or at --standard for more rounds"
    )


def with_load_reason(unresolved: Mapping[str, str], since: CpuSample) -> dict[str, str]:
    """``unresolved`` (check -> spread) with the load besides the run since
    ``since`` appended to each spread (see :func:`load_reason`).

    >>> with_load_reason({}, cpu_sample())
    {}
    """
    if not unresolved:
        return {}
    reason = load_reason(load_besides(since))
    return {name: f"{spread}; {reason}" for name, spread in unresolved.items()}


def over_budget_note(
    name: str, wall_s: float, budget: float, other_cores: float | None
) -> str:
    """What an over-budget quick run means and what to do about it.

    >>> over_budget_note("amp", 70, 56, 1.2)[:44]
    'amp: over budget, 70 s against its 56 s, wit'
    """
    head = f"{name}: over budget, {wall_s:.0f} s against its {budget:.0f} s"
    if other_cores is not None and other_cores >= BUSY_CORES:
        return (
            f"{head}, with {other_cores:.1f} cores busy besides this run; wall "
            "times grow with load, so time it again on an idle machine"
        )
    return (
        f"{head} on an otherwise idle machine: time it alone with `python -m "
        f"experiments {name} --quick`; if it stays over, this CPU is slower than "
        "the 2-core reference or the pipeline grew: lower its quick settings or "
        "raise its entry in experiments._timing.EXPECTED_S"
    )
