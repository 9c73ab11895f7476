"""Pipeline registry, scales, fresh result directories and environment capture.

A *pipeline* is a module ``experiments.<name>`` exposing::

    run(out_dir: pathlib.Path, *, quick: bool = True, seed: int = 0,
        scale: str | None = None) -> dict

that writes its JSON, PNG figures and a ``REPORT.md`` into ``out_dir`` (which exists
and is empty) and returns a dict with at least ``"table"`` (a markdown table string)
and ``"checks"`` (``{name: bool}``, at least one: a pipeline that checks nothing
fails).

:func:`run_pipeline` gives every run a fresh directory: the pipeline writes into a
temporary sibling ``.<name>.tmp-<id>`` which is renamed into place when the pipeline
returns. A previous result directory is kept as ``<name>.prev`` (one generation; an
older ``.prev`` is removed). If the pipeline raises, the temporary directory is removed
and the previous results stay untouched. The framework adds ``environment.json``
(package versions, backend, device, git commit, seed, scale, timestamp) and
``summary.json`` (checks, wall time, environment) to every result directory; the
report over all pipelines is :mod:`experiments._reproduce_report`'s.

Scales: ``"quick"`` (the main job, sized for a 2-core CPU; its goal is five minutes
on an idle one), ``"standard"`` (larger CPU runs with more rounds, about ten minutes),
``"full"`` (paper-scale, for a GPU) and a hidden ``"tiny"`` scale for tests, selected
with the environment variable ``MPJAX_EXPERIMENTS_SCALE=tiny`` (honoured by
:func:`resolve_scale` when no scale is given). The framework passes the scale to a
pipeline whose ``run`` takes ``scale``; each pipeline looks its settings up with
:func:`settings_for`. Expected wall times and budgets are :mod:`experiments._timing`'s.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import inspect
import json
import math
import os
import platform
import shutil
import subprocess
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

from experiments import _timing
from experiments._outcome import PipelineOutcome, checks_failure

__all__ = [
    "DEFAULT_RESULTS_DIR",
    "PIPELINES",
    "SCALES",
    "SCALE_ENV_VAR",
    "capture_environment",
    "fresh_directory",
    "git_commit",
    "resolve_scale",
    "run_pipeline",
    "run_pipelines",
    "to_jsonable",
    "write_json",
]

#: Pipelines in the order ``reproduce`` runs them, with their module and a one-liner.
PIPELINES: Mapping[str, str] = {
    "formats": "experiments.formats",
    "mixed_precision_bench": "experiments.mixed_precision_bench",
    "amp": "experiments.amp",
    "lbm_accuracy": "experiments.lbm_accuracy",
    "lbm_gradients": "experiments.lbm_gradients",
    "lbm_performance": "experiments.lbm_performance",
    "lbm_capsule": "experiments.lbm_capsule",
    "lbm_raindrop": "experiments.lbm_raindrop",
    "number_range": "experiments.number_range",
    "inverse_design": "experiments.inverse_design",
}

SCALES: tuple[str, ...] = ("tiny", "quick", "standard", "full")
_S = TypeVar("_S")
SCALE_ENV_VAR = "MPJAX_EXPERIMENTS_SCALE"
#: Parent of the result directories for the command line and the notebooks alike:
#: ``results`` in the current working directory, never inside the installed package.
DEFAULT_RESULTS_DIR = Path("results")

_PACKAGES = (
    "jax",
    "jaxlib",
    "flax",
    "optax",
    "jmp",
    "chex",
    "numpy",
    "ml_dtypes",
    "matplotlib",
    "mpjax",
)

RunFn = Callable[..., dict]


def resolve_scale(quick: bool, scale: str | None = None) -> str:
    """Return the scale a pipeline should run at.

    An explicit ``scale`` wins (``"standard"`` comes this way, from the command
    line's ``--standard``); otherwise a quick run honours the environment variable
    ``MPJAX_EXPERIMENTS_SCALE`` (``tiny`` for tests); otherwise ``"quick"`` or
    ``"full"`` follows ``quick``.

    Args:
        quick: the pipeline's ``quick`` flag.
        scale: an explicit scale, one of :data:`SCALES`, or ``None``.

    Returns:
        One of :data:`SCALES`.

    Raises:
        ValueError: if ``scale`` or the environment variable names an unknown scale.

    >>> resolve_scale(False), resolve_scale(True, "standard")
    ('full', 'standard')
    """
    if scale is None and quick:
        scale = os.environ.get(SCALE_ENV_VAR) or None
        source = f"environment variable {SCALE_ENV_VAR}"
    else:
        source = "argument scale"
    if scale is None:
        return "quick" if quick else "full"
    if scale not in SCALES:
        raise ValueError(
            f"{source} is {scale!r}, expected one of {SCALES}; unset it or pick a "
            "known scale."
        )
    return scale


def settings_for(table: Mapping[str, _S], scale: str) -> _S:
    """The entry of a pipeline's per-scale settings ``table`` for ``scale``.

    The one lookup every pipeline uses (``scale`` usually comes from
    :func:`resolve_scale`, which has checked it already; a direct call with an
    unknown scale gets the same message).

    Raises:
        ValueError: if ``table`` has no entry for ``scale``.

    >>> settings_for({"tiny": 1, "quick": 2, "standard": 3, "full": 4}, "quick")
    2
    """
    if scale not in table:
        raise ValueError(
            f"scale must be one of {tuple(table)}, got {scale!r}; pick a known scale."
        )
    return table[scale]


def git_commit(repo: Path | None = None) -> str:
    """Return the git commit of ``repo`` (default: this checkout), ``+dirty`` marked.

    Returns ``"unknown"`` when git or the repository is unavailable.
    """
    cwd = repo if repo is not None else Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if not head:
        return "unknown"
    return head + ("+dirty" if dirty else "")


def _package_versions() -> dict[str, str]:
    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def _cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``, else :func:`platform.processor`)."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def capture_environment(*, seed: int, scale: str | None = None) -> dict[str, Any]:
    """Describe the software and hardware a result was produced on.

    Every pipeline and benchmark records its environment with this one function.

    Args:
        seed: the run's base random seed.
        scale: the run's scale (one of :data:`SCALES`), or ``None``
            for a benchmark that has none (``scale`` and ``quick`` are then
            ``None``).

    Returns:
        A JSON-ready dict: package versions, Python, platform, JAX backend, device kind
        and count, ``XLA_FLAGS``, git commit (or ``"unknown"``), seed, scale, quick
        flag and an ISO-8601 UTC timestamp.
    """
    import jax

    devices = jax.devices()
    return {
        "packages": _package_versions(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "backend": jax.default_backend(),
        "device_kind": devices[0].device_kind if devices else "none",
        "device_count": len(devices),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "git_commit": git_commit(),
        "seed": seed,
        "scale": scale,
        "quick": None if scale is None else scale != "full",
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def to_jsonable(value: Any) -> Any:
    """Convert numpy/JAX scalars and arrays, paths and tuples into JSON values.

    Non-finite floats become ``None`` (JSON has no NaN), so files stay standard JSON.
    """
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if hasattr(value, "tolist"):  # numpy / JAX arrays and scalars
        return to_jsonable(value.tolist())
    raise TypeError(
        f"cannot write a {type(value).__name__} to JSON; convert it to a number, "
        "string, list or dict first."
    )


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write ``data`` as indented JSON, atomically (temporary file + rename)."""
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    tmp.write_text(json.dumps(to_jsonable(data), indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)


@contextlib.contextmanager
def fresh_directory(final: Path) -> Iterator[Path]:
    """Yield an empty temporary directory that replaces ``final`` on success.

    The temporary directory is a hidden sibling of ``final`` (same filesystem, so
    the final rename is atomic). On a clean exit an existing ``final`` is kept as
    ``<final>.prev`` (replacing an older ``.prev``) and the temporary directory
    takes its place. On an exception (including ``KeyboardInterrupt``) the
    temporary directory is deleted and ``final`` is left untouched.
    """
    final = Path(final)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():
        prev = final.with_name(final.name + ".prev")
        if prev.exists():
            shutil.rmtree(prev)
        os.replace(final, prev)
    os.replace(tmp, final)


def work_directory(out_root: Path, name: str) -> Path:
    """The work directory of a pipeline that keeps finished pieces of work.

    A pipeline whose ``run`` takes a ``work_dir`` keyword gets
    ``out_root/.<name>.partial``: it survives an interrupted run, so a re-run
    reuses what finished, and it is deleted once the pipeline completes. Work kept
    by another code version (:func:`lbm_jax.code_version`) or JAX version is
    discarded first, so results of two code versions never mix.
    """
    import jax

    import lbm_jax

    work = Path(out_root) / f".{name}.partial"
    stamp = f"{lbm_jax.code_version()} jax {jax.__version__}\n"
    marker = work / "CODE_VERSION"
    if work.exists() and (not marker.is_file() or marker.read_text() != stamp):
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    marker.write_text(stamp)
    return work


def _load_run(name: str, pipelines: Mapping[str, str | RunFn]) -> RunFn:
    if name not in pipelines:
        raise ValueError(
            f"unknown pipeline {name!r}; expected one of {tuple(pipelines)}."
        )
    target = pipelines[name]
    if callable(target):
        return target
    module = importlib.import_module(target)
    return module.run


def _validate_result(
    name: str, result: Any
) -> tuple[str, dict[str, bool], dict[str, str]]:
    if not isinstance(result, Mapping):
        raise TypeError(
            f"pipeline {name!r} returned {type(result).__name__}; expected a dict "
            "with 'table' (str) and 'checks' ({name: bool})."
        )
    table, checks = result.get("table"), result.get("checks")
    if not isinstance(table, str) or not isinstance(checks, Mapping):
        raise TypeError(
            f"pipeline {name!r} returned keys {sorted(result)}; expected 'table' "
            "(str) and 'checks' ({name: bool})."
        )
    checks = {str(k): bool(v) for k, v in checks.items()}
    unresolved = {str(k): str(v) for k, v in result.get("unresolved", {}).items()}
    wrong = [k for k in unresolved if checks.get(k, True)]
    if wrong:
        raise ValueError(
            f"pipeline {name!r} marks {wrong} unresolved, which are not failed "
            "checks; 'unresolved' names failed checks only."
        )
    return table, checks, unresolved


def run_pipeline(
    name: str,
    *,
    out_root: Path = DEFAULT_RESULTS_DIR,
    quick: bool = True,
    seed: int = 0,
    scale: str | None = None,
    pipelines: Mapping[str, str | RunFn] = PIPELINES,
    catch: bool = True,
) -> PipelineOutcome:
    """Run one pipeline into a fresh ``out_root/<name>`` directory.

    Args:
        name: a key of ``pipelines``.
        out_root: the parent directory of the result directory.
        quick: quick (CPU) or full (paper-scale) settings.
        seed: base random seed passed to the pipeline.
        scale: an explicit scale (see :func:`resolve_scale`), passed on to a
            pipeline whose ``run`` takes ``scale``.
        pipelines: the registry (name -> module path or ``run`` callable).
        catch: record an exception raised by the pipeline in the outcome instead of
            propagating it (the CLI keeps going with the next pipeline).

    Returns:
        The :class:`PipelineOutcome`.

    Raises:
        ValueError: for an unknown pipeline name or scale, or a negative seed.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed is {seed!r}; expected a non-negative int.")
    run = _load_run(name, pipelines)
    scale = resolve_scale(quick, scale)
    final = Path(out_root) / name
    extra: dict[str, Any] = {}
    parameters = inspect.signature(run).parameters
    if "work_dir" in parameters:
        extra["work_dir"] = work_directory(out_root, name)
    if "scale" in parameters:
        extra["scale"] = scale
    start, sample = time.perf_counter(), _timing.cpu_sample()
    try:
        with fresh_directory(final) as tmp:
            environment = capture_environment(seed=seed, scale=scale)
            write_json(tmp / "environment.json", environment)
            result = run(tmp, quick=scale != "full", seed=seed, **extra)
            table, checks, unresolved = _validate_result(name, result)
            wall_s = time.perf_counter() - start
            until = _timing.cpu_sample()
            other_cores = _timing.load_besides(sample, until)
            cpu_s = until.own - sample.own
            summary = {
                "pipeline": name,
                "passed": checks_failure(checks, unresolved) is None,
                "checks": checks,
                "unresolved": unresolved,
                "wall_s": wall_s,
                "cpu_s": cpu_s,
                "other_cores": other_cores,
                "environment": environment,
                "table": table,
            }
            write_json(tmp / "summary.json", summary)
        if "work_dir" in extra:  # finished: nothing left to reuse
            shutil.rmtree(extra["work_dir"], ignore_errors=True)
    except Exception:  # a failing pipeline must not stop the others
        if not catch:
            raise
        return PipelineOutcome(
            name=name,
            out_dir=None,
            wall_s=time.perf_counter() - start,
            checks={},
            table="",
            error=traceback.format_exc(),
            scale=scale,
            other_cores=_timing.load_besides(sample),
            cpu_s=_timing.cpu_sample().own - sample.own,
        )
    return PipelineOutcome(
        name,
        final,
        wall_s,
        checks,
        table,
        unresolved=unresolved,
        scale=scale,
        other_cores=other_cores,
        cpu_s=cpu_s,
    )


def run_pipelines(
    names: Sequence[str],
    *,
    out_root: Path = DEFAULT_RESULTS_DIR,
    quick: bool = True,
    seed: int = 0,
    scale: str | None = None,
    pipelines: Mapping[str, str | RunFn] = PIPELINES,
    on_done: Callable[[PipelineOutcome], None] | None = None,
    around: Callable[[str], contextlib.AbstractContextManager] | None = None,
) -> list[PipelineOutcome]:
    """Run several pipelines in order; see :func:`run_pipeline`.

    Args:
        names: pipeline names, validated before anything runs.
        out_root: parent directory of the result directories.
        quick: quick or full settings.
        seed: base random seed.
        scale: an explicit scale for every pipeline (see :func:`resolve_scale`).
        pipelines: the registry.
        on_done: called with each outcome as soon as it is available.
        around: ``around(name)`` gives a context manager each pipeline runs in
            (the command line's progress bar).

    Returns:
        The outcomes, in the order of ``names``.
    """
    unknown = [n for n in names if n not in pipelines]
    if unknown:
        raise ValueError(
            f"unknown pipeline(s) {unknown}; expected names from {tuple(pipelines)}."
        )
    outcomes = []
    for name in names:
        with around(name) if around is not None else contextlib.nullcontext():
            outcome = run_pipeline(
                name,
                out_root=out_root,
                quick=quick,
                seed=seed,
                scale=scale,
                pipelines=pipelines,
            )
        outcomes.append(outcome)
        if on_done is not None:
            on_done(outcome)
    return outcomes
