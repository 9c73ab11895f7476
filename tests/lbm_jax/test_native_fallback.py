"""The native step fails soft: every way it can be unavailable ends in a working
``Simulation()`` on the XLA step with one :class:`NativeStepWarning` that says why.

Each scenario runs in a fresh process (tests/lbm_jax/native_worker.py), since
the build is cached per process: no compiler, a failing compiler (remembered, so
a second process does not compile again), an unusable cache directory, and CPUs
without AVX2/FMA/F16C or of another architecture (the CPU-feature probe
replaced). A fake compiler that logs its calls shows which processes compiled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from lbm_jax.step import _native_build

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("native_worker.py")

pytestmark = pytest.mark.skipif(
    jax.default_backend() != "cpu", reason="the native step is a CPU kernel"
)


def _env(tmp_path: Path, **changes: str | None) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), LBM_JAX_CACHE=str(tmp_path / "c"))
    for key, value in changes.items():
        env.pop(key, None)
        if value is not None:
            env[key] = value
    return env


def _worker(env: dict[str, str], *args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, str(WORKER), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _assert_fell_back(out: dict, *fragments: str) -> None:
    assert out["backend"] == "xla" and "backend='xla'" in out["repr"]
    assert out["finite"] and out["other_warnings"] == []
    assert len(out["native_warnings"]) == 1, out["native_warnings"]
    message = out["native_warnings"][0]
    assert "the XLA step runs" in message and "build-native" in message
    for fragment in fragments:
        assert fragment in message and fragment in out["reason"], message


def _logging_compiler(tmp_path: Path, delay: float = 0.0) -> tuple[Path, Path]:
    """A compiler that records its arguments, takes ``delay`` seconds and fails
    (exit status 3)."""
    log, cxx = tmp_path / "calls.log", tmp_path / "fake-c++"
    cxx.write_text(
        f'#!/bin/sh\necho "$@" >> {log}\nsleep {delay}\n'
        'echo "fake failure" >&2\nexit 3\n'
    )
    cxx.chmod(0o755)
    return cxx, log


def _compiles(log: Path) -> int:
    """Compilations the fake compiler was asked for (not ``--version``)."""
    if not log.exists():
        return 0
    return sum(" -o " in line for line in log.read_text().splitlines())


needs_capable_cpu = pytest.mark.skipif(
    _native_build.cpu_problem() is not None, reason="this CPU cannot build it anyway"
)


@pytest.mark.slow
@needs_capable_cpu
def test_failing_compiler_falls_back_and_is_remembered(tmp_path):
    cxx, log = _logging_compiler(tmp_path)
    env = _env(tmp_path, CXX=str(cxx))
    _assert_fell_back(_worker(env), "exit status 3", "fake failure", "FAILED")
    # each source (compiled in parallel) with OpenMP, then without
    attempts = 2 * len(_native_build.SOURCES)
    assert _compiles(log) == attempts
    second = _worker(env)
    _assert_fell_back(second, "an earlier build", "delete it to retry")
    assert _compiles(log) == attempts  # the second process compiled nothing


@pytest.mark.slow
@needs_capable_cpu
def test_processes_building_at_once_compile_once(tmp_path):
    """Two processes (test workers, say) needing the same build at the same time:
    the second waits for the first and takes its outcome."""
    cxx, log = _logging_compiler(tmp_path, delay=1.0)
    env = _env(tmp_path, CXX=str(cxx))
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER)], env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outs = [
        json.loads(p.communicate(timeout=300)[0].strip().splitlines()[-1])
        for p in procs
    ]
    assert all(p.returncode == 0 for p in procs)
    reasons = sorted(out["reason"] for out in outs)
    assert "an earlier build" in reasons[0] and "exit status 3" in reasons[1], reasons
    assert _compiles(log) == 2 * len(_native_build.SOURCES)  # one build's attempts


@pytest.mark.slow
@needs_capable_cpu
def test_compiler_that_fails_silently_falls_back(tmp_path):
    """``/bin/false`` exits 1 without a word: judged by the exit status."""
    _assert_fell_back(_worker(_env(tmp_path, CXX="/bin/false")), "exit status 1")


@needs_capable_cpu
def test_no_compiler_falls_back(tmp_path):
    (tmp_path / "bin").mkdir()
    env = _env(tmp_path, CXX=str(tmp_path / "missing"), PATH=str(tmp_path / "bin"))
    _assert_fell_back(_worker(env), "no C++ compiler found", "set $CXX")


@pytest.mark.parametrize(
    "where", ["home_proc", pytest.param("cache_is_a_file", marks=pytest.mark.slow)]
)
def test_unusable_cache_falls_back(tmp_path, where):
    if where == "home_proc":
        env = _env(tmp_path, HOME="/proc", LBM_JAX_CACHE=None, XDG_CACHE_HOME=None)
    else:
        (tmp_path / "file").write_text("not a directory")
        env = _env(tmp_path, LBM_JAX_CACHE=str(tmp_path / "file"))
    out = _worker(env)
    if _native_build.cpu_problem() is None:
        _assert_fell_back(out, "cannot create the cache directory", "LBM_JAX_CACHE")
    else:
        _assert_fell_back(out)


@pytest.mark.parametrize(
    ("cpu", "fragment"),
    [
        ("x86_64:sse2,avx", "this CPU lacks AVX2, FMA, F16C"),
        pytest.param("x86_64:avx2,fma", "this CPU lacks F16C", marks=pytest.mark.slow),
        pytest.param("aarch64", "this machine is aarch64", marks=pytest.mark.slow),
    ],
)
def test_other_cpus_fall_back_without_compiling(tmp_path, cpu, fragment):
    cxx, log = _logging_compiler(tmp_path)
    _assert_fell_back(_worker(_env(tmp_path, CXX=str(cxx)), cpu), fragment)
    assert _compiles(log) == 0


def test_build_native_command_reports(tmp_path):
    env = _env(tmp_path, CXX="/bin/false")
    cmd = [sys.executable, "-m", "lbm_jax", "build-native"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert "native CPU step unavailable" in proc.stdout


def test_cache_directory_must_be_private(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    assert "group or others may write" in _native_build.private_dir(shared)
    private = tmp_path / "new" / "cache"
    assert _native_build.private_dir(private) is None
    assert private.stat().st_mode & 0o777 == 0o700
    if os.getuid() != 0:
        pytest.skip("changing a directory's owner needs root")
    os.chown(private, 12345, -1)
    assert "belongs to uid 12345" in _native_build.private_dir(private)


def test_old_builds_are_pruned(tmp_path):
    now = 1_000_000_000.0
    dirs = []
    for i, age_days in enumerate([0, 1, 2, 30, 40]):
        d = tmp_path / f"{i:016x}"
        d.mkdir()
        stamp = now - age_days * 86400
        os.utime(d, (stamp, stamp))
        dirs.append(d)
    (tmp_path / "notes").mkdir()  # not a build: never touched
    keep = tmp_path / "feedfacefeedface"
    keep.mkdir()
    _native_build.prune(tmp_path, keep, now=now)
    left = sorted(p.name for p in tmp_path.iterdir())
    # the two most recently used besides `keep`, and a recent third, stay
    assert left == sorted([*(d.name for d in dirs[:3]), "notes", keep.name])
