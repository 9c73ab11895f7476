"""Waiting for the worker subprocesses a test starts (one deadline for all)."""

from __future__ import annotations

import subprocess
import time

import pytest


def wait_for(procs: list[subprocess.Popen], timeout_s: float) -> list[str]:
    """Wait for every process within one deadline; fail the test, with each
    process's output, when one times out (all are then killed) or exits non-zero.

    Returns:
        Each process's output (stdout, with stderr merged by the caller).
    """
    deadline = time.monotonic() + timeout_s
    outputs, timed_out = [], False
    for proc in procs:
        try:
            out = proc.communicate(timeout=max(deadline - time.monotonic(), 1.0))[0]
        except subprocess.TimeoutExpired:
            timed_out = True
            for started in procs:
                started.kill()
            out = proc.communicate()[0]
        outputs.append(out)
    report = "\n".join(
        f"--- process {i} (exit code {p.returncode}) ---\n{out[-4000:]}"
        for i, (p, out) in enumerate(zip(procs, outputs, strict=True))
    )
    if timed_out:
        pytest.fail(f"the workers did not finish within {timeout_s} s:\n{report}")
    if any(p.returncode != 0 for p in procs):
        pytest.fail(f"a worker failed:\n{report}")
    return outputs
