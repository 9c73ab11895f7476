"""Building the native CPU step's library: CPU check, private cache, compiler.

Every failure ends in a reason (what went wrong and how to fix it), never an
exception: the caller falls back to the XLA step. The library is built into a
per-user cache directory (``$LBM_JAX_CACHE``, else ``$XDG_CACHE_HOME/lbm_jax/native``
or ``~/.cache/lbm_jax/native``), which must be the user's own and not writable by
group or others, since a library is loaded from it. The sources compile in
parallel, one compiler process each, and are then linked. Builds are keyed by a hash of
the sources, the generated lattice tables, the compiler, its flags, JAX and the
CPU; a failed build leaves a marker file under its key, so later processes fall
back at once instead of compiling again. Builds beyond the :data:`KEEP_BUILDS`
most recently used are removed once unused for :data:`PRUNE_AFTER_S`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import hashlib
import logging
import os
import platform
import shutil
import stat
import subprocess
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import jax
import numpy as np

from lbm_jax.core._lattice import get_lattice

__all__ = [
    "KEEP_BUILDS",
    "LATTICES",
    "PRUNE_AFTER_S",
    "REQUIRED_CPU_FLAGS",
    "SOURCES",
    "NativeStepWarning",
    "build",
    "cache_dir",
    "cpu_features",
    "cpu_problem",
    "private_dir",
    "prune",
    "warn_fallback",
]

_log = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).with_name("_native")
#: the library's sources (one library: the plain step, its adjoint and the
#: free-surface step), compiled in parallel
SOURCES = ("lbm_step.cc", "lbm_adjoint.cc", "lbm_free_surface.cc")
#: headers the sources share (hashed into the build key with them)
_HEADERS = ("lbm_codecs.h", "lbm_free_surface.h")
LATTICES = ("D2Q9", "D3Q19", "D3Q27")
#: x86 instruction sets the source needs (it guards them with ``#error``)
REQUIRED_CPU_FLAGS = ("avx2", "fma", "f16c")
#: builds always kept in the cache (the most recently used)
KEEP_BUILDS = 3
#: older builds go once unused this long (other checkouts may still use them)
PRUNE_AFTER_S = 7 * 24 * 3600
#: the library's file name, and the marker a failed build leaves instead
LIBRARY, FAILED = "liblbm_native.so", "FAILED"
_COMPILE_TIMEOUT_S = 600
# No fast-math, no contraction: the source spells out every fused multiply-add.
_FLAGS = (
    "-O3",
    "-march=native",
    "-ffp-contract=off",
    "-fno-fast-math",
    "-std=c++17",
    "-shared",
    "-fPIC",
)
_OPENMP = "-fopenmp"


class NativeStepWarning(UserWarning):
    """The native CPU step is unavailable and the XLA step runs instead (same
    results, slower); the message says why and how to fix it."""


def warn_fallback(why: str) -> None:
    """Warn (:class:`NativeStepWarning`) that the XLA step runs because ``why``."""
    warnings.warn(
        f"the native CPU step is unavailable, so the XLA step runs (same results, "
        f"slower): {why}. `python -m lbm_jax build-native` retries the build and "
        "reports; Simulation(backend='xla') runs the XLA step without trying.",
        NativeStepWarning,
        stacklevel=3,
    )


def cpu_features() -> tuple[str, frozenset[str] | None]:
    """The machine (``platform.machine()``, lower case) and the CPU's feature
    flags from ``/proc/cpuinfo`` (``None`` where that cannot be read)."""
    machine = platform.machine().lower()
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return machine, None
    for line in info.splitlines():
        if line.startswith("flags"):
            return machine, frozenset(line.partition(":")[2].split())
    return machine, None


def cpu_problem() -> str | None:
    """Why this CPU cannot run the native step (before compiling), or None."""
    machine, flags = cpu_features()
    need = "/".join(f.upper() for f in REQUIRED_CPU_FLAGS)
    if machine not in ("x86_64", "amd64"):
        return f"it needs an x86-64 CPU with {need}, and this machine is {machine}"
    missing = [f.upper() for f in REQUIRED_CPU_FLAGS if flags and f not in flags]
    if missing:
        return f"this CPU lacks {', '.join(missing)} (the native step needs {need})"
    return None


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _cpu_id() -> str:
    """The CPU's identity and features (the library is built for this CPU)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    keep = ("model name", "flags")
    return "\n".join(sorted({ln for ln in info.splitlines() if ln.startswith(keep)}))


def cache_dir() -> Path:
    """The root of the build cache (see the module docstring)."""
    root = os.environ.get("LBM_JAX_CACHE")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "lbm_jax" / "native"


def private_dir(path: Path) -> str | None:
    """Create ``path`` (mode 0700) if needed; why it cannot be used, or None."""
    fix = "set LBM_JAX_CACHE to a private directory of yours"
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = path.stat()
    except (OSError, RuntimeError) as err:
        return f"cannot create the cache directory {path} ({err}); {fix}"
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        return (
            f"refusing the cache directory {path}: it belongs to uid {info.st_uid}, "
            f"not to you (a library is loaded from it); {fix}"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (
            f"refusing the cache directory {path}: group or others may write to it "
            f"(a library is loaded from it); `chmod 700 {path}` or {fix}"
        )
    return None


def lattice_header() -> str:
    """C++ tables of the lattices, generated from :mod:`lbm_jax.core._lattice`."""
    lines = [
        "// Generated by lbm_jax/step/_native_build.py from lbm_jax.core._lattice.",
        "#pragma once",
    ]
    for name in LATTICES:
        lat = get_lattice(name)
        c = ", ".join("{" + ", ".join(str(int(v)) for v in ci) + "}" for ci in lat.c)
        w = ", ".join(float(v).hex() + "f" for v in lat.w.astype(np.float32))
        opp = ", ".join(str(int(o)) for o in lat.opposite)
        lines += [
            f"struct {name} {{",
            f"  static constexpr int D = {lat.d};",
            f"  static constexpr int Q = {lat.q};",
            f"  static constexpr int C[{lat.q}][{lat.d}] = {{{c}}};",
            f"  static constexpr float W[{lat.q}] = {{{w}}};",
            f"  static constexpr int OPP[{lat.q}] = {{{opp}}};",
            "};",
        ]
    return "\n".join(lines) + "\n"


def _run(cmd: list[str], made: Path) -> str | None:
    """Run one compiler command; ``None`` when it succeeded (judged by the exit
    status and the presence of ``made``), else why it failed."""
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, check=False, timeout=_COMPILE_TIMEOUT_S
        )
    except (OSError, subprocess.SubprocessError) as err:
        return f"running {cmd[0]} failed ({err})"
    if proc.returncode == 0 and made.is_file():
        return None
    tail = (proc.stderr or proc.stdout).strip()[-1500:] or "no output"
    status = f"exit status {proc.returncode}"
    if proc.returncode == 0:
        what = "object file" if made.suffix == ".o" else "library"
        status = f"exit status 0 but no {what} written"
    return f"compiling with {cmd[0]} failed ({status}): {tail}"


def _compile(cxx: str, include: list[Path], out: Path) -> str | None:
    """Compile to ``out`` (with OpenMP when the compiler has it): every source
    in its own compiler process at once, then one link; ``None`` on success,
    else why the first failing command failed."""
    base = [cxx, *_FLAGS, *(f"-I{p}" for p in include)]
    why = ""
    for extra in ([_OPENMP], []):
        objects = [out.with_name(Path(s).stem + ".o") for s in SOURCES]
        cmds = [
            [*base, *extra, "-c", str(SOURCE_DIR / s), "-o", str(o)]
            for s, o in zip(SOURCES, objects, strict=True)
        ]
        with concurrent.futures.ThreadPoolExecutor(len(cmds)) as pool:
            failures = [w for w in pool.map(_run, cmds, objects) if w is not None]
        if not failures:
            link = [cxx, *_FLAGS, *extra, *map(str, objects), "-o", str(out)]
            failures = [w for w in [_run(link, out)] if w is not None]
        if not failures:
            return None
        why = failures[0]
    return why


def _key(cxx: str, header: str) -> str:
    version = ""
    try:
        version = subprocess.run(
            [cxx, "--version"], capture_output=True, text=True, check=False, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError):
        pass
    digest = hashlib.sha256()
    for part in (
        header,
        *((SOURCE_DIR / s).read_text() for s in (*SOURCES, *_HEADERS)),
        cxx,
        version,
        " ".join((*_FLAGS, _OPENMP)),
        jax.ffi.include_dir(),
        jax.__version__,
        _cpu_id(),
    ):
        digest.update(part.encode())
    return digest.hexdigest()[:16]


def build() -> tuple[Path | None, str]:
    """Build (or find in the cache) the library: ``(path, "")`` or
    ``(None, why)``, where ``why`` says what failed and how to fix it."""
    return _build_with(_compiler(), str(cache_dir()))


@functools.cache
def _build_with(cxx: str | None, root_name: str) -> tuple[Path | None, str]:
    problem = cpu_problem()
    if problem is not None:
        return None, problem
    if cxx is None:
        return None, "no C++ compiler found; install g++ or clang++, or set $CXX"
    root = Path(root_name)
    why = private_dir(root)
    if why is not None:
        return None, why
    header = lattice_header()
    key_dir = root / _key(cxx, header)
    target, failed = key_dir / LIBRARY, key_dir / FAILED
    found = _found(key_dir)
    if found is not None:
        return found
    why = private_dir(key_dir)
    if why is not None:
        return None, why
    with _build_lock(key_dir):  # one build at a time; the others wait for it
        found = _found(key_dir)
        if found is not None:
            return found
        _log.info("lbm_jax: compiling the native step into %s", target)
        try:
            with tempfile.TemporaryDirectory(dir=key_dir) as tmp:
                (Path(tmp) / "lbm_lattices.h").write_text(header)
                built = Path(tmp) / LIBRARY
                why = _compile(cxx, [Path(tmp), Path(jax.ffi.include_dir())], built)
                if why is None:
                    os.replace(built, target)  # atomic: readers see all or nothing
        except OSError as err:
            why = f"writing to the cache directory {key_dir} failed ({err})"
        if why is not None:
            why += f"; fix the compiler (or set $CXX), then delete {failed} to retry"
            try:
                failed.write_text(why + "\n")
            except OSError:
                pass
            return None, why
    prune(root, keep=key_dir)
    return target, ""


def _found(key_dir: Path) -> tuple[Path | None, str] | None:
    """The outcome of an earlier build in ``key_dir``: the library, the failure
    it remembered, or ``None`` when nothing was built there yet."""
    target, failed = key_dir / LIBRARY, key_dir / FAILED
    if target.is_file():
        _touch(key_dir)
        return target, ""
    if failed.is_file():
        earlier = failed.read_text(errors="replace").strip()
        return None, (
            f"an earlier build for this source, compiler and CPU failed (remembered "
            f"in {failed}; delete it to retry): {earlier}"
        )
    return None


@contextlib.contextmanager
def _build_lock(key_dir: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``key_dir`` (processes building the same library
    at once, such as test workers, wait for the first instead of compiling it
    again). Where files cannot be locked, builds run side by side, which the
    atomic install makes harmless."""
    try:
        import fcntl
    except ImportError:  # not a POSIX system
        yield
        return
    try:
        handle = open(key_dir / ".lock", "a")  # noqa: SIM115 (held across the yield)
    except OSError:
        yield
        return
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError:
            pass
        yield


def _touch(path: Path) -> None:
    """Mark a build as used now (its directory's modification time)."""
    try:
        os.utime(path)
    except OSError:
        pass


def prune(root: Path, keep: Path, now: float | None = None) -> None:
    """Remove builds beyond the :data:`KEEP_BUILDS` most recently used that have
    not been used for :data:`PRUNE_AFTER_S` before ``now`` (default: the current
    time); ``keep`` stays."""
    try:
        builds = [
            (p.stat().st_mtime, p)
            for p in root.iterdir()
            if p.is_dir()
            and p != keep
            and len(p.name) == 16
            and all(ch in "0123456789abcdef" for ch in p.name)
        ]
    except OSError:
        return
    builds.sort(reverse=True)
    now = time.time() if now is None else now
    for used, old in builds[KEEP_BUILDS - 1 :]:
        if now - used > PRUNE_AFTER_S:
            shutil.rmtree(old, ignore_errors=True)
