"""Memory discipline: each operation holds its buffers and output, nothing more.

Each measurement runs in a fresh subprocess (:mod:`lbm_jax.bench_memory`); at
these small sizes the interpreter's baseline dominates the 10 % bound, so the
tests also bound what a call adds beyond its output directly.
"""

import pytest

from lbm_jax import bench_memory


def _assert_lean(rows, slack=0.25):
    """No failures, and what each call added beyond its output and scratch
    buffers stays below ``slack`` of what it must hold (plus 4 MB of noise)."""
    assert not bench_memory.check(rows), bench_memory.table(rows)
    for row in rows:
        allowed = slack * row["needed"] + 4e6
        assert row["excess"] <= allowed, bench_memory.table(rows)


def test_check_flags_an_operation_over_its_bound():
    # the rows carry no verdict: check judges peak against the 10 % threshold
    row = {"operation": "velocity", "storage": "fp16s", "streaming": None, "n": 8}
    under = dict(row, peak=1_099_000, bound=1_000_000)  # 9.9 % above
    over = dict(row, peak=1_101_000, bound=1_000_000)  # 10.1 % above
    assert bench_memory.check([under]) == []
    (message,) = bench_memory.check([under, over])
    assert "velocity" in message and "fp16s" in message and "1.10 x" in message
    with pytest.raises(ValueError, match="unknown operations"):
        bench_memory.measure(8, operations=("nope",))


def test_velocity_holds_only_the_state_and_its_output():
    # a decoded float32 copy of the state (the full-array formulation) adds
    # twice the state here: far above the allowance
    rows = bench_memory.measure(64, ("fp16s",), ("velocity",))
    assert rows[0]["inputs"] == 64**3 * 19 * 2
    _assert_lean(rows)


@pytest.mark.slow
def test_every_operation_stays_within_its_bound():
    ops = [op for op in bench_memory.OPERATIONS if op not in ("simulation", "cli_run")]
    _assert_lean(bench_memory.measure(96, ("fp32", "fp16s"), ops))
