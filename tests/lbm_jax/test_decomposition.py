"""Domain decomposition over 1, 2 or 3 grid axes, and over several processes.

Splits over 4 or 8 devices and the multi-process run use subprocesses
(tests/lbm_jax/decomp_worker.py): a process with 8 forced host devices, and two
processes joined by ``jax.distributed`` over localhost CPU collectives.

Bit identity and the CPU's fused multiply-add: XLA:CPU contracts ``a * b + c``
into FMA instructions depending on the shape of the fused loop, so the collision
of a block whose y-z plane is smaller than the whole grid's can round differently
in the last bit (x splits keep the plane and stay bit-identical). The 8-device
worker therefore runs with ``--xla_cpu_max_isa=AVX`` (no FMA), where every split
must match one device bit for bit: that isolates the decomposition itself (halo
exchange, corners, borders). Under the default flags a y/z split must agree to
round-off.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

import lbm_jax
from lbm_jax import Simulation
from tests._workers import wait_for
from tests.lbm_jax import decomp_worker as problem

WORKER = Path(__file__).with_name("decomp_worker.py")
TIMEOUT_S = 300


def _env(devices: int | None, *extra: str) -> dict[str, str]:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    flags = [
        f
        for f in env.get("XLA_FLAGS", "").split()
        if not f.startswith("--xla_force_host_platform_device_count")
    ]
    if devices is not None:
        flags.append(f"--xla_force_host_platform_device_count={devices}")
    env["XLA_FLAGS"] = " ".join([*flags, *extra])
    return env


def _run(procs: list[subprocess.Popen], timeout_s: float = TIMEOUT_S) -> None:
    wait_for(procs, timeout_s)


def _start_cases(out: Path, which: str) -> subprocess.Popen:
    """The 8-device worker (no FMA: see the module docstring)."""
    return subprocess.Popen(
        [sys.executable, str(WORKER), "cases", which, str(out)],
        env=_env(8, "--xla_cpu_max_isa=AVX"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _start_processes(out_dir: Path, n: int = 2) -> list[subprocess.Popen]:
    """``n`` workers joined by ``jax.distributed``, one CPU device each."""
    port = _free_port()
    return [
        subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                "process",
                str(i),
                str(n),
                str(port),
                str(out_dir / f"{i}.npz"),
            ],
            env=_env(None),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(n)
    ]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    """Runs the 8-device worker and the two processes side by side."""
    tmp = tmp_path_factory.mktemp("decomp")
    procs = [_start_cases(tmp / "quick.npz", "quick"), *_start_processes(tmp)]
    _run(procs)
    return {
        "cases": dict(np.load(tmp / "quick.npz")),
        "processes": [dict(np.load(tmp / f"{i}.npz")) for i in range(2)],
    }


#: Read out element by element from the stored populations: bit-identical.
EXACT = ("f", "t", "populations", "healthy")
#: Sums over directions, which XLA:CPU may order differently per block shape.
SUMS = ("density", "velocity", "fields_rho", "fields_u")


def _assert_split_matches_one_device(results, cases):
    for case in cases:
        key = problem.case_key(case)
        for name in EXACT + SUMS:
            one, split = results[f"{key}/one/{name}"], results[f"{key}/split/{name}"]
            assert one.shape == split.shape, (key, name)
            if name in EXACT:
                np.testing.assert_array_equal(split, one, err_msg=f"{key}: {name}")
            else:
                np.testing.assert_array_max_ulp(split, one, maxulp=2)
        assert bool(results[f"{key}/one/healthy"]) and int(results[f"{key}/one/t"]) == 6
        traced, stated = results[f"{key}/halo_bytes"]
        assert traced == stated > 0, key


def test_splits_over_three_axes_are_bit_identical(workers):
    _assert_split_matches_one_device(workers["cases"], problem.CASES)
    assert {case[3] for case in problem.CASES} == {(2, 2, 2)}


@pytest.mark.slow
@pytest.mark.parametrize("lattice", ["D2Q9", "D3Q19", "D3Q27"])
def test_every_lattice_and_storage_split_is_bit_identical(tmp_path, lattice):
    _run([_start_cases(tmp_path / "slow.npz", lattice)], timeout_s=1800)
    results = dict(np.load(tmp_path / "slow.npz"))
    cases = [c for c in problem.SLOW_CASES if c[0] == lattice]
    _assert_split_matches_one_device(results, cases)


needs_two = pytest.mark.skipif(
    len(jax.devices()) < 2, reason="needs two devices (tests/conftest.py sets two)"
)


@needs_two
@pytest.mark.parametrize(
    ("lattice", "storage", "devices"),
    [
        ("D2Q9", "fp32", "mesh"),
        pytest.param("D3Q19", "fp16s", (1, 1, 2), marks=pytest.mark.slow),
        pytest.param("D3Q27", "fp32", (1, 2, 1), marks=pytest.mark.slow),
    ],
)
def test_y_and_z_splits_agree_to_round_off(lattice, storage, devices):
    if devices == "mesh":  # a user's mesh: the axis names say what is split
        devices = Mesh(np.array(jax.devices()[:2]), ("y",))
    sims = [problem.problem(lattice, storage, "trt", d) for d in (None, devices)]
    one, two = (problem.trajectory(sim) for sim in sims)
    assert sims[1].devices == 2 and 2 in sims[1].decomposition
    if isinstance(devices, Mesh):
        assert sims[1].decomposition == (1, 2) and sims[1].mesh is devices
    # FMA contraction (see the module docstring) moves the last bits of the
    # compute dtype, which can flip the rounding of a 16-bit stored value; a lost
    # ghost layer or corner moves populations by ~1e-3
    atol = 2e-6 if storage == "fp32" else 1e-4
    for name in EXACT[2:] + SUMS:
        np.testing.assert_allclose(
            two[name], one[name], rtol=0, atol=atol, err_msg=name
        )
    assert bool(two["healthy"]) and int(two["t"]) == 6


@needs_two
def test_split_state_and_fields_stay_split():
    sim = Simulation("D3Q19", (4, 6, 8), tau=0.7, devices=(1, 1, 2))
    state = sim.init()
    assert state.f.sharding.shard_shape(state.f.shape) == (4, 19, 6, 4)
    assert {d.id for d in state.f.sharding.device_set} == {
        d.id for d in jax.devices()[:2]
    }
    state = sim.advance(state, 2)
    assert state.f.sharding.shard_shape(state.f.shape) == (4, 19, 6, 4)
    assert np.asarray(lbm_jax.to_host(lbm_jax.density(sim, state))).shape == (4, 6, 8)


@pytest.mark.parametrize(
    ("devices", "error", "match"),
    [
        ((2, 1, 1), ValueError, "one sub-domain count per grid axis"),
        ((1, 2), ValueError, r"y size 9 is not divisible by devices=\(1, 2\)"),
        ((8, 9), ValueError, r"72 sub-domains but \d+ device\(s\).*XLA_FLAGS"),
        ((1, 0), ValueError, r"devices\[1\] must be at least 1"),
        ((1, 2.0), TypeError, r"devices\[1\] must be an integer"),
        ("2x1", TypeError, "devices must be an int, a tuple of ints"),
        (True, TypeError, "devices must be an int"),
    ],
)
def test_bad_decompositions_fail_before_compiling(devices, error, match):
    with pytest.raises(error, match=match):
        Simulation("D2Q9", (8, 9), tau=0.7, devices=devices)


def test_a_mesh_with_unknown_axis_names_is_refused():
    mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
    with pytest.raises(ValueError, match=r"axis names \('data',\) must be among"):
        Simulation("D2Q9", (8, 8), tau=0.7, devices=mesh)
    mesh = Mesh(np.array(jax.devices()[:1]), ("z",))
    with pytest.raises(ValueError, match="must be among"):
        Simulation("D2Q9", (8, 8), tau=0.7, devices=mesh)  # 2-D grid: no z


def test_one_sub_domain_runs_on_one_device():
    sim = Simulation("D3Q19", (4, 4, 4), tau=0.7, devices=(1, 1, 1))
    assert sim.devices == 1 and sim.mesh is None and sim.decomposition == (1, 1, 1)


def test_two_processes_end_bit_identical_to_one(workers):
    lattice, storage, collision = problem.PROCESS_CASE
    reference = problem.trajectory(problem.problem(lattice, storage, collision, None))
    for r in workers["processes"]:
        r = dict(r)
        assert int(r.pop("process_count")) == 2 and int(r.pop("local_devices")) == 1
        assert set(r) == set(reference)
        for name, value in reference.items():
            np.testing.assert_array_equal(r[name], value, err_msg=name)
