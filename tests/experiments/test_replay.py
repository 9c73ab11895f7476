"""An unstable 16-bit run is replayed in FP32 from its last healthy state, so
that a study tells the format's instabilities from the flow's."""

from __future__ import annotations

import lbm_jax
from experiments._accuracy_runs import replay_in_reference, run_one, run_status

# a lid at Mach 0.21 over 16 cells at Re 3000: unstable by step 300
_VIOLENT = {"n": 16, "re": 3e3, "u_ref": 0.12}


def test_a_flow_unstable_in_every_format_is_the_flows():
    record = run_one("cavity", "fp16s", True, **_VIOLENT)
    assert not record["stable"]
    replay = record["replay"]
    assert replay["storage"] == "FP32/FP32" and not replay["stable"]
    assert 0 < replay["from_step"] < record["unstable_step"]
    # steps count from the start of the run, one health check apart at most
    last = record["unstable_step"] + 100
    assert replay["from_step"] < replay["unstable_step"] <= last
    status = run_status(record)
    assert "fails at step" in status and "(the flow's)" in status


def test_fp32_runs_are_not_replayed():
    record = run_one("cavity", "fp32", True, **_VIOLENT)
    assert not record["stable"] and record["replay"] is None
    assert run_status(record) == f"UNSTABLE at step {record['unstable_step']}"


def test_a_free_surface_run_replays_through_its_fp32_copy():
    # a healthy raindrop stands in for a failed one: FP32 from its step 20 runs
    # on to the end, which run_status reads as the format's instability
    options = {"n": 6, "duration": 0.3, "samples": 4}
    err = lbm_jax.InstabilityError(40, 20, None)
    replay = replay_in_reference("raindrop", "fp16c", True, options, err)
    assert replay == {
        "storage": "FP32/FP32",
        "from_step": 20,
        "stable": True,
        "unstable_step": None,
    }
    record = {"stable": False, "unstable_step": 40, "replay": replay}
    assert run_status(record) == (
        "UNSTABLE at step 40; FP32/FP32 from step 20 runs to the end "
        "(the format's instability)"
    )
