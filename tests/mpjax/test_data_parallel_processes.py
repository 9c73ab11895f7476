"""Data-parallel training on two processes joined by ``jax.distributed``.

Two worker processes (tests/mpjax/dp_worker.py), each with one CPU device, join
over localhost (gloo CPU collectives, JAX's default in 0.10), train the MLP on a
mesh spanning both, replicated and FSDP, then take one step with an Inf in the
second process's rows. Both must end with the same parameters, equal to a
one-process, one-device run to round-off (see
dp_worker.assert_close_to_reference), and both must skip the overflowing step.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import chex
import numpy as np
import pytest

from tests._workers import wait_for
from tests.mpjax import dp_worker as problem

POLICY = problem.WORKER_POLICY
TIMEOUT_S = 120
WORKER = Path(__file__).with_name("dp_worker.py")


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker_env():
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    # One CPU device per process: drop the device-count flag conftest.py sets.
    flags = [
        f
        for f in env.get("XLA_FLAGS", "").split()
        if not f.startswith("--xla_force_host_platform_device_count")
    ]
    env["XLA_FLAGS"] = " ".join(flags)
    return env


def _run_workers(out_dir, n_processes=2):
    port = _free_port()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                str(i),
                str(n_processes),
                str(port),
                str(out_dir / f"{i}.npz"),
            ],
            env=_worker_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(n_processes)
    ]
    wait_for(procs, TIMEOUT_S)
    return [dict(np.load(out_dir / f"{i}.npz")) for i in range(n_processes)]


def _params(results, key):
    return {k: v for k, v in results.items() if k.startswith(key + "[")}


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    return _run_workers(tmp_path_factory.mktemp("data_parallel"))


def test_two_processes_train_like_one_device(two_processes):
    first, second = two_processes
    assert int(first["process_count"]) == int(second["process_count"]) == 2
    # Each process fed its own half of every global batch.
    assert sorted([tuple(first["rows"]), tuple(second["rows"])]) == [(0, 4), (4, 8)]
    initial = problem.flatten("", problem.initial_state(POLICY).params)
    expected = problem.flatten("", problem.reference_params(POLICY))
    for layout in problem.LAYOUTS:
        params = [_params(r, f"{layout}/params") for r in two_processes]
        chex.assert_trees_all_equal(params[0], params[1])
        got = {k.removeprefix(f"{layout}/params"): v for k, v in params[0].items()}
        problem.assert_close_to_reference(got, expected, initial)


def test_overflow_on_one_process_skips_on_both(two_processes):
    for results in two_processes:
        for layout in problem.LAYOUTS:
            assert bool(results[f"{layout}/skipped"]), layout
            assert float(results[f"{layout}/scale_before"]) == 2.0**12
            assert float(results[f"{layout}/scale_after"]) == 2.0**11
            assert bool(results[f"{layout}/scale_replicated"])
            assert int(results[f"{layout}/skipped_steps"]) == 1
            after = _params(results, f"{layout}/params_after_overflow")
            before = _params(results, f"{layout}/params")
            assert len(after) == len(before) == 6
            for key, value in before.items():
                name = key.removeprefix(f"{layout}/params")
                np.testing.assert_array_equal(
                    after[f"{layout}/params_after_overflow{name}"], value
                )
