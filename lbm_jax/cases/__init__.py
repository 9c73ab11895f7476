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

from lbm_jax.cases import _common
from lbm_jax.cases._common import CASE_INFO, CLI_OPTIONS, CaseInfo, CaseSetup, CliOption
from lbm_jax.io._outputs import folder_lock, is_empty, write_set
from lbm_jax.runs._checkpoint import Checkpoint, ResumeError, check_same, code_version

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
    "read_run_record",
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


def _check_out_dir(out_dir: str | os.PathLike[str], *, needs_record: bool) -> Path:
    """``out_dir`` checked to be usable and created (nothing is run yet); with
    ``needs_record``, it must hold a checkpointed run (a :data:`RUN_FILE`)."""
    path = Path(out_dir)
    if path.exists() and not path.is_dir():
        raise ValueError(
            f"out_dir {str(path)!r} exists and is not a directory; choose a new path."
        )
    if needs_record and not (path / RUN_FILE).is_file():
        raise ValueError(
            f"{str(path)!r} holds no checkpointed run to resume ({RUN_FILE} is "
            "missing); start one with checkpoint_every (--checkpoint-every)."
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
            An existing non-empty directory is refused unless ``overwrite``. The
            run holds the folder's lock throughout (one writer per folder), and
            writes its outputs as a set: the previous files stay until every new
            one is complete, so a failed write leaves them as they were.
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
        lbm_jax.FolderInUseError: At once, if another run writes to ``out_dir``.
        OSError: If an output cannot be written (e.g. a full disk).
    """
    setup = prepare_case(
        case, n=n, re=re, storage=storage, shift=shift, steps=steps, **case_options
    )
    checkpointed = checkpoint_every is not None or resume
    if out_dir is None:
        if checkpointed:
            raise ValueError(
                "checkpoint_every and resume need out_dir: the checkpoints live in "
                "out_dir/checkpoints."
            )
        return _run(setup, None, progress, estimate=estimate)
    out = _check_out_dir(out_dir, needs_record=resume and checkpoint_every is None)
    with folder_lock(out):  # one writer at a time, refused at once
        if not resume and not overwrite and not is_empty(out):
            raise ValueError(
                f"out_dir {str(out)!r} already exists and is not empty; choose a new "
                "directory or pass overwrite=True (--overwrite) to replace the "
                "files this case writes."
            )
        checkpoint = None
        if checkpointed:
            # The shift as resolved, so that runs started with shift=True resume.
            arguments = {"n": n, "re": re, "storage": storage}
            arguments.update(shift=setup.storage.shift)
            arguments.update(steps=steps, **case_options)
            checkpoint = _checkpoint_policy(
                out, case, arguments, setup, checkpoint_every, resume
            )
            if resume and not overwrite:
                _refuse_finished(out, checkpoint, setup.steps)
        return _run(setup, checkpoint, progress, out, estimate=estimate)


def _run(
    setup: CaseSetup,
    checkpoint: Checkpoint | None,
    progress: bool,
    out: Path | None = None,
    *,
    estimate: Callable[[float, int], None] | None = None,
) -> CaseResult:
    """Run a prepared case and write its outputs to ``out`` (if given), as a set:
    the previous files stay until every new one is complete."""
    metrics, fields, extras = setup.run(
        progress=progress, checkpoint=checkpoint, estimate=estimate
    )
    summary = _common.jsonable({**setup.summary(), "warnings": [], **metrics})
    files: tuple[Path, ...] = ()
    if out is not None:
        files = write_set(
            out,
            lambda staging: _write(staging, summary, fields, extras, setup),
            last="summary.json",  # a finished run's mark (see _refuse_finished)
        )
    return CaseResult(summary=summary, fields=fields, files=files)


#: The file in a checkpointed run's directory that records how it was started.
RUN_FILE = "run.json"

#: The entries of :data:`RUN_FILE` and their types.
_RUN_RECORD = {
    "case": str,
    "arguments": dict,
    "checkpoint_every": int,
    "identity": dict,
}


def read_run_record(out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """How the checkpointed run in ``out_dir`` was started (its :data:`RUN_FILE`):
    ``case``, ``arguments`` (of :func:`run_case`), ``checkpoint_every`` and
    ``identity`` (what a resumed run must match).

    Raises:
        lbm_jax.ResumeError: If the file is missing, unreadable or damaged (not
            JSON, an entry missing or of the wrong type, an unknown case).
    """
    path = Path(out_dir) / RUN_FILE
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ResumeError(
            f"{str(Path(out_dir))!r} has no readable {RUN_FILE} ({err}); start a "
            "checkpointed run with checkpoint_every (--checkpoint-every N)."
        ) from None
    record = record if isinstance(record, dict) else {}
    damaged = [k for k, t in _RUN_RECORD.items() if not isinstance(record.get(k), t)]
    if damaged or record["case"] not in CASE_INFO:
        what = f"lacks {', '.join(damaged)}" if damaged else "names an unknown case"
        raise ResumeError(
            f"{str(path)!r} is damaged (it {what}), so the run cannot resume; "
            "restore the file, or start the run afresh in a new directory."
        )
    return record


def _checkpoint_policy(
    out: Path,
    case: str,
    arguments: dict[str, Any],
    setup: CaseSetup,
    every: int | None,
    resume: bool,
) -> Checkpoint:
    """The checkpoints of a case run in ``out``, after checking a resume is sound
    (call it holding the folder's lock: a new run removes the old checkpoints)."""
    identity = {"case": setup.identity(), "code_version": code_version()}
    record = out / RUN_FILE
    if resume and record.is_file():
        stored = read_run_record(out)
        check_same(repr(str(out)), stored["identity"], identity)
        every = stored["checkpoint_every"] if every is None else every
    else:
        for old in (out / "checkpoints").glob("step_*.npz"):  # an overwritten run's
            old.unlink()
        content = {
            "case": case,
            "arguments": _common.jsonable(arguments),
            "checkpoint_every": every,
            "identity": identity,
        }
        write_set(out, lambda d: [_write_json(d / RUN_FILE, content)])
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
    """Write a run's outputs into the (existing) folder ``out``; their paths."""
    from lbm_jax.io import _files, _plot

    files = []
    npz = out / "fields.npz"
    np.savez_compressed(npz, **fields, **extras)
    files.append(npz)
    files.append(_files.write_vti(out / "fields.vti", fields))
    files.append(_write_json(out / "summary.json", summary))
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


def _write_json(path: Path, content: Mapping[str, Any]) -> Path:
    """``content`` as indented JSON with sorted keys at ``path``."""
    path.write_text(json.dumps(content, indent=2, sort_keys=True) + "\n")
    return path
