"""Validation cases: Poiseuille, Taylor-Green, lid-driven cavity, cylinder flows.

:func:`run_case` validates its arguments (raising ``ValueError``/``TypeError``
before anything is compiled), runs one case, compares it with its analytic
solution or published reference data, and returns a :class:`CaseResult`. With
``out_dir`` it also writes ``fields.npz``, ``summary.json``, ``fields.vti`` (VTK
image data for ParaView) and PNG figures.

Fields are in lattice units (the free-surface cases add the fill level ``phi``
and the cell ``flags``): ``rho`` has shape ``(X, Y[, Z])`` and ``u`` shape
``(D, X, Y[, Z])``, x the first spatial axis, over the fluid nodes of the case
(wall layers are not included; in the cylinder cases the obstacle's cells are part
of the grid with ``u = 0``). In the cavity the lid is the top y boundary and moves
in +x.

Cases (:data:`CASES`):

=================== ========================================================
poiseuille          2-D channel driven by a body force, analytic profile
taylor_green        2-D periodic decaying vortices, analytic decay
cavity              2-D lid-driven cavity, Ghia et al. (1982) centre lines
cavity3d            D3Q19 lid-driven cube
cylinder            Schaefer-Turek 2D-2 (confined, Re = 100): St, cd, cl
cylinder_unconfined Karman vortex street in a wide domain: St, mean drag
capsule             D3Q19 immersed-boundary capsule in shear flow: deformation
static_drop         free-surface drop at rest (2-D or 3-D): Laplace law
capillary_wave      2-D free-surface capillary wave: frequency and damping
drop_impact         drop falling into a pool (We, Oh, Bo): crown and cavity
raindrop            the paper's raindrop in physical units (sea water)
=================== ========================================================

>>> "cavity" in CASES
True
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from lbm_jax._checkpoint import Checkpoint, ResumeError, check_same, code_version
from lbm_jax.cases import _common
from lbm_jax.cases._common import CASE_INFO, CLI_OPTIONS, CaseInfo, CaseSetup, CliOption

__all__ = [
    "CASES",
    "CASE_INFO",
    "CLI_OPTIONS",
    "RUN_FILE",
    "CaseInfo",
    "CaseResult",
    "CaseSetup",
    "CliOption",
    "case_defaults",
    "make_out_dir",
    "prepare_case",
    "run_case",
]

#: Names of the available cases.
CASES: tuple[str, ...] = _common.case_names()


@dataclasses.dataclass(frozen=True)
class CaseResult:
    """Outcome of :func:`run_case`.

    Attributes:
        summary: JSON-ready dictionary: ``case``, ``lattice``, ``storage``,
            ``shift``, ``collision``, ``n``, ``re``, ``tau``, ``steps``, ``u_ref``
            (the characteristic velocity), ``mlups``, ``warnings`` (a list of
            sentences: what the run could not measure and how to fix it, e.g. a
            cylinder run too short for the Strouhal number) and the case's
            metrics.
        fields: ``{"rho": (X, Y[, Z]), "u": (D, X, Y[, Z])}`` NumPy arrays in
            lattice units.
        files: Paths written (empty without ``out_dir``).
    """

    summary: dict[str, Any]
    fields: dict[str, np.ndarray]
    files: tuple[Path, ...] = ()


def prepare_case(
    case: str,
    *,
    n: int | None = None,
    re: float | None = None,
    storage: str = "fp32",
    shift: bool | None = None,
    steps: int | None = None,
    **case_options: Any,
) -> CaseSetup:
    """Validate a case's arguments and derive its parameters, without compiling.

    This is what :func:`run_case` and the command line call first; it raises on
    any bad input (unknown case, option or storage policy, n too small, a Reynolds
    number giving tau <= 1/2, a velocity too high for the low-Mach assumption).

    Returns:
        The case's derived parameters (resolution, tau, u_ref, steps, ...).

    Raises:
        ValueError: For an invalid value.
        TypeError: For an argument of the wrong type.
    """
    return _common.prepare(
        case, n=n, re=re, storage=storage, shift=shift, steps=steps, **case_options
    )


def case_defaults(case: str) -> dict[str, Any]:
    """What :func:`run_case` uses for ``case`` when given nothing but its name.

    Returns:
        ``n``, ``re`` (for the cases that take one, see :data:`CASE_INFO`), every
        option of :data:`CLI_OPTIONS` the case takes, and ``steps`` (a maximum
        for the cases that stop once steady). A default derived from another
        (the capsule's ``width`` from ``n``) is the one at the other defaults.

    >>> defaults = case_defaults("cylinder")
    >>> defaults["n"], defaults["u_ref"], defaults["run_times"]
    (20, 0.05, 60.0)
    """
    setup = prepare_case(case)
    common = {
        "n": setup.n,
        "re": setup.re,
        "collision": setup.collision,
        "lattice": setup.lattice,
        "u_ref": setup.u_ref,
        "steps": setup.steps,
    }
    names = [
        "n",
        *(["re"] if CASE_INFO[case].re else []),
        *(name for name, option in CLI_OPTIONS.items() if case in option.cases),
        "steps",
    ]
    return {name: common.get(name, setup.options.get(name)) for name in names}


def make_out_dir(path: Path, flag: str = "out_dir") -> Path:
    """Create ``path`` (with its parents) before a run, so that a path that
    cannot hold the outputs is refused before the run instead of after it.

    Raises:
        ValueError: If the folder cannot be created, naming ``flag``.
    """
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(
            f"{flag} {str(path)!r} cannot be created ({err.strerror or err}); "
            "choose a path in a directory you can write to."
        ) from None
    return path


def _check_out_dir(out_dir: str | os.PathLike[str], overwrite: bool) -> Path:
    """``out_dir`` checked to be usable and created (nothing is run yet)."""
    path = Path(out_dir)
    if path.exists() and not path.is_dir():
        raise ValueError(
            f"out_dir {str(path)!r} exists and is not a directory; choose a new path."
        )
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise ValueError(
            f"out_dir {str(path)!r} already exists and is not empty; choose a new "
            "directory or pass overwrite=True (--overwrite) to replace the files "
            "this case writes."
        )
    return make_out_dir(path)


def run_case(
    case: str,
    *,
    n: int | None = None,
    re: float | None = None,
    storage: str = "fp32",
    shift: bool | None = None,
    steps: int | None = None,
    out_dir: str | os.PathLike[str] | None = None,
    progress: bool = False,
    overwrite: bool = False,
    checkpoint_every: int | None = None,
    resume: bool = False,
    estimate: Callable[[float, int], None] | None = None,
    **case_options: Any,
) -> CaseResult:
    """Run one validation case and compare it with its reference.

    Args:
        case: One of :data:`CASES`.
        n: Resolution (cells per characteristic length: channel width, box side,
            cavity side, cylinder diameter); default per case.
        re: Reynolds number; default per case.
        storage: Storage policy name (``"fp32"``, ``"FP32/FP16S"``, ...).
        shift: DDF-shifting of the stored populations; ``None`` (default) as
            :func:`lbm_jax.get_storage`: on for a name, a policy's own flag.
        steps: Time steps; default: long enough for the steady or periodic state
            (steady cases stop early once converged).
        out_dir: If given, write ``fields.npz`` (``rho``, ``u`` and the case's time
            series or profiles), ``summary.json``, ``fields.vti`` and PNGs there.
            An existing non-empty directory is refused unless ``overwrite``.
        progress: Show a tqdm progress bar.
        overwrite: Allow writing into a non-empty ``out_dir``.
        checkpoint_every: Save the whole run (fluid state, sampled time series,
            step counter) to ``out_dir/checkpoints`` every this many steps; the
            arguments go to ``out_dir/run.json``.
        resume: Continue the checkpointed run in ``out_dir`` from its newest
            readable checkpoint (or start it, if it has none); the arguments and
            the code version must be those it was started with. The result equals
            an uninterrupted run's bit for bit. A finished run whose outputs are
            written is refused unless ``overwrite`` (which writes them again).
        estimate: ``estimate(seconds_per_step, steps_left)``, called once after
            a first timed hundredth of the run (see :func:`lbm_jax.run`).
        **case_options: Case-specific options, e.g. ``collision="bgk"``,
            ``u_ref=0.05``, ``lattice="D3Q19"`` for the cavity.

    Returns:
        The :class:`CaseResult`.

    Raises:
        ValueError: For invalid arguments (before anything is compiled).
        TypeError: For arguments of the wrong type.
        lbm_jax.ResumeError: If ``out_dir`` holds another run's checkpoints, or
            (with ``resume`` and without ``overwrite``) a finished run.
        lbm_jax.InstabilityError: If the run becomes unstable.
    """
    setup = prepare_case(
        case, n=n, re=re, storage=storage, shift=shift, steps=steps, **case_options
    )
    checkpoint = None
    if checkpoint_every is not None or resume:
        if out_dir is None:
            raise ValueError(
                "checkpoint_every and resume need out_dir: the checkpoints live in "
                "out_dir/checkpoints."
            )
        # The shift as resolved, so that runs started with shift=True resume.
        arguments = {"n": n, "re": re, "storage": storage}
        arguments.update(shift=setup.storage.shift)
        arguments.update(steps=steps, **case_options)
        checkpoint = _checkpoint_policy(
            Path(out_dir), case, arguments, setup, checkpoint_every, resume, overwrite
        )
        out_path = Path(out_dir)
        if resume and not overwrite:
            _refuse_finished(out_path, checkpoint, setup.steps)
    else:
        out_path = None if out_dir is None else _check_out_dir(out_dir, overwrite)
    metrics, fields, extras = setup.run(
        progress=progress, checkpoint=checkpoint, estimate=estimate
    )
    summary = _common.jsonable({**setup.summary(), "warnings": [], **metrics})
    files: tuple[Path, ...] = ()
    if out_path is not None:
        files = _write(out_path, summary, fields, extras, setup)
    return CaseResult(summary=summary, fields=fields, files=files)


#: The file in a checkpointed run's directory that records how it was started.
RUN_FILE = "run.json"


def _checkpoint_policy(
    out: Path,
    case: str,
    arguments: dict[str, Any],
    setup: CaseSetup,
    every: int | None,
    resume: bool,
    overwrite: bool,
) -> Checkpoint:
    """The checkpoints of a case run in ``out``, after checking a resume is sound."""
    identity = {"case": setup.identity(), "code_version": code_version()}
    record = out / RUN_FILE
    if resume and record.is_file():
        stored = json.loads(record.read_text())
        check_same(repr(str(out)), stored["identity"], identity)
        every = stored["checkpoint_every"] if every is None else every
    else:
        if not resume:
            _check_out_dir(out, overwrite)
        if every is None:
            raise ValueError(
                f"{str(out)!r} holds no checkpointed run to resume ({RUN_FILE} is "
                "missing); start one with checkpoint_every (--checkpoint-every)."
            )
        for old in (out / "checkpoints").glob("step_*.npz"):  # an overwritten run's
            old.unlink()
        make_out_dir(out)
        content = {
            "case": case,
            "arguments": _common.jsonable(arguments),
            "checkpoint_every": every,
            "identity": identity,
        }
        tmp = record.with_name(record.name + ".tmp")
        tmp.write_text(json.dumps(content, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, record)
    return Checkpoint(out / "checkpoints", every, metadata=identity, resume=resume)


def _refuse_finished(out: Path, checkpoint: Checkpoint, steps: int) -> None:
    """Raise ``ResumeError`` if the run in ``out`` has finished and written its
    outputs: resuming it would only write them again."""
    record = checkpoint.newest_record()
    summary = out / "summary.json"
    if record is None or not summary.is_file():
        return
    if record.get("stopped") or record.get("done", 0) >= steps:
        raise ResumeError(
            f"{str(out)!r} holds a finished run (it ended at step "
            f"{record.get('done')}); its outputs are left as they are "
            f"({str(summary)!r}). Pass overwrite=True (--overwrite) to analyse it "
            "and write them again."
        )


def _write(
    out: Path,
    summary: Mapping[str, Any],
    fields: Mapping[str, np.ndarray],
    extras: Mapping[str, np.ndarray],
    setup: CaseSetup,
) -> tuple[Path, ...]:
    from lbm_jax import _io, _plot

    out.mkdir(parents=True, exist_ok=True)
    files = []
    npz = out / "fields.npz"
    np.savez_compressed(npz, **fields, **extras)
    files.append(npz)
    files.append(_io.write_vti(out / "fields.vti", fields))
    js = out / "summary.json"
    js.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    files.append(js)
    title = f"{setup.case} ({summary['storage']}, step {summary['steps']})"
    solid = {"solid": extras["body"]} if "body" in extras else {}  # e.g. a cylinder
    for kind in setup.figures:
        make, kwargs = {
            "velocity": (_plot.velocity_magnitude_figure, solid),
            "vorticity": (_plot.vorticity_figure, solid),
            "streamlines": (_plot.streamlines_figure, {}),
        }[kind]
        figure = make(fields["u"], title=f"{kind}: {title}", **kwargs)
        files.append(_plot.save_figure(figure, out / f"{kind}.png"))
    if setup.write_files is not None:
        files.extend(setup.write_files(out, summary, fields, extras))
    return tuple(files)
