"""The reverse-mode benchmark's verdicts (its measurements run as a script)."""

from lbm_jax.bench_gradient import COST_TARGET, MEMORY_TARGETS, check

GB = 1e9


def _memory(fp16s: float, fp32: float) -> list[dict]:
    at = {"n": MEMORY_TARGETS["n"], "steps": MEMORY_TARGETS["steps"]}
    return [
        {**at, "storage": "FP32/FP16S", "planned": fp16s * GB},
        {**at, "storage": "FP32/FP32", "planned": fp32 * GB},
    ]


def _cost(ratio: float) -> list[dict]:
    row = {"storage": "FP32/FP16S", "backend": "native", "derivative": "native"}
    return [{**row, "ratio": ratio, "target": True}]


def test_targets_met_pass():
    assert check(_memory(2.0, 4.0), _cost(COST_TARGET - 0.1)) == []


def test_each_missed_target_fails():
    failures = check(_memory(3.5, 5.0), _cost(COST_TARGET + 1))
    assert [f.split(":")[0] for f in failures] == ["memory", "memory", "cost"]


def test_missing_rows_fail_never_pass():
    assert check([], []) == [
        f"memory: no FP16S and FP32 rows at n={MEMORY_TARGETS['n']}, "
        f"{MEMORY_TARGETS['steps']} steps",
        "cost: no rows",
    ]
    other_size = [{**r, "n": 64} for r in _memory(1.0, 2.0)]
    assert check(other_size, _cost(1.0))[0].startswith("memory: no FP16S")


def test_only_the_target_rows_are_checked():
    xla = {"storage": "FP32/FP16S", "backend": "xla", "derivative": "xla"}
    rows = [*_cost(COST_TARGET - 0.1), {**xla, "ratio": 12.0, "target": False}]
    assert check(_memory(2.0, 4.0), rows) == []
    assert check(_memory(2.0, 4.0), rows[1:]) == ["cost: no rows"]


def test_cost_only_skips_the_memory_targets():
    assert check(None, _cost(COST_TARGET - 0.1)) == []
    assert [f.split(":")[0] for f in check(None, _cost(COST_TARGET + 1))] == ["cost"]
