"""The command line's commands: ``run`` a case, ``bench`` the solver,
``build-native``.

Each command takes the parsed arguments and its own parser
(:mod:`lbm_jax.cli._parser`), validates every argument before anything is
compiled (an invalid one exits with status 2 through ``parser.error``, with a
message that names the flag: :func:`as_flags` rewrites the library's parameter
names as flags), runs, prints and returns the exit status.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from lbm_jax.cli._parser import RUN_ARGUMENTS, flag_of, show_value
from lbm_jax.io._outputs import FolderInUseError, write_set
from lbm_jax.runs._driver import InstabilityError

if TYPE_CHECKING:
    from lbm_jax.cases import CaseResult, CaseSetup

__all__ = [
    "EXPECTED_FAILURES",
    "as_flags",
    "bench_command",
    "build_native_command",
    "explain_failure",
    "duration",
    "estimate_printer",
    "run_command",
    "short_summary",
    "sized_defaults_note",
]

#: What a command may raise that is no fault of the program (beyond the invalid
#: arguments its parser refuses): :func:`explain_failure` says what happened.
EXPECTED_FAILURES = (InstabilityError, FolderInUseError, OSError, KeyboardInterrupt)


def explain_failure(err: BaseException, out: Path | None) -> tuple[int, str]:
    """The exit status and the one message of an expected failure.

    Args:
        err: One of :data:`EXPECTED_FAILURES`.
        out: The run's output folder, if the command has one.

    Returns:
        ``(1, message)`` for a failed run (an instability), ``(2, message)`` for
        a command that could not do what was asked (a folder in use, a full disk
        or another file-system error, an interrupt).
    """
    if isinstance(err, InstabilityError):
        return 1, str(err)
    resume = ""
    if out is not None and any(out.glob("checkpoints/step_*.npz")):
        resume = (
            " The run continues from its newest checkpoint with: python -m lbm_jax "
            f"run --resume {out}"
        )
    if isinstance(err, KeyboardInterrupt):
        return 2, "interrupted." + resume
    if isinstance(err, OSError):
        where = "" if err.filename is None else f" ({err.filename})"
        return 2, (
            f"{err.strerror or err}{where}. No file was left half-written: the "
            "outputs of a previous run stay as they were; free space (or make the "
            "folder writable) and run again." + resume
        )
    return 2, str(err)


def as_flags(message: str) -> str:
    """A library message with the parameter names it quotes written as flags.

    ``u_ref`` becomes ``--u-ref`` anywhere, ``name=value`` becomes
    ``--name value``, and a plain name (``n``, ``radius``) becomes a flag where
    it is the subject (``n must be ...``, ``ca (capillary number) must ...``) or
    the object of advice (``raise n``, ``lower re``, ``give steps``).
    """
    from lbm_jax.cases import CLI_OPTIONS

    verb = r"(?:(?<=[Rr]aise )|(?<=[Ll]ower )|(?<=[Gg]ive ))"
    for name in sorted((*RUN_ARGUMENTS, *CLI_OPTIONS), key=len, reverse=True):
        flag, start = flag_of(name), rf"(?<![\w.'-]){name}"
        message = re.sub(rf"{start}=(?=[^\s=])", flag + " ", message)
        subject = r"(?![\w-])" if "_" in name else r"(?=\s+must\b|\s+\()"
        message = re.sub(start + subject, flag, message)
        message = re.sub(rf"{verb}{name}\b(?!-)", flag, message)
    return message


def _check_decomposition(devices: int | tuple[int, ...], d: int, n: int) -> None:
    """Refuse a ``--devices`` that does not fit the box or the devices."""
    import jax

    splits = (devices,) + (1,) * (d - 1) if isinstance(devices, int) else devices
    available = jax.device_count()
    text = "x".join(map(str, splits))
    if len(splits) != d:
        raise ValueError(
            f"--devices {text}: give one sub-domain count per axis ({d} for "
            f"this lattice), e.g. --devices {'x'.join(['2'] + ['1'] * (d - 1))}."
        )
    if min(splits) < 1 or math.prod(splits) > available or any(n % s for s in splits):
        raise ValueError(
            f"--devices {text}: need at least 1 sub-domain per axis, at most "
            f"{available} in all (devices), each dividing --n {n}."
        )


def _needs_x64(storage: str) -> bool:
    """Whether a storage policy name needs 64-bit types (unknown names do not)."""
    from lbm_jax.core._storage import get_storage

    try:
        return get_storage(storage).needs_x64
    except (ValueError, TypeError):  # reported by the validation that follows
        return False


def _check_creatable(flag: str, directory: Path) -> None:
    """Raise ``ValueError`` unless ``directory`` exists or can be created.

    Nothing is created: the nearest existing ancestor must be a writable
    directory.
    """
    ancestor = directory.absolute()
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ValueError(
            f"{flag} {str(directory)!r} cannot be created: {str(ancestor)!r} is a "
            "file, not a directory; choose a path under a directory."
        )
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ValueError(
            f"{flag} {str(directory)!r} cannot be created: {str(ancestor)!r} is not "
            "writable; choose a path in a directory you can write to."
        )


def run_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    import jax

    case, kwargs, out = _run_arguments(args, parser)
    with jax.enable_x64(_needs_x64(kwargs["storage"])):
        return _run_case(case, kwargs, out, args, parser)


def _run_arguments(
    args: argparse.Namespace, parser: argparse.ArgumentParser
) -> tuple[str, dict, Path]:
    """Case name, run_case keyword arguments and output directory of ``run``.

    With ``--resume DIR`` they come from ``DIR/run.json``; options given on the
    command line as well must agree with them (``run_case`` checks).
    """
    from lbm_jax.cases import CLI_OPTIONS, read_run_record
    from lbm_jax.runs._checkpoint import ResumeError

    given = {
        name: getattr(args, name)
        for name in (*RUN_ARGUMENTS, *CLI_OPTIONS)
        if getattr(args, name) is not None
    }
    if args.checkpoint_every is not None and args.checkpoint_every < 1:
        parser.error(
            f"--checkpoint-every must be at least 1, got {args.checkpoint_every}."
        )
    if args.resume is None:
        if args.case is None or args.out is None:
            parser.error("run needs a case and --out DIR (or --resume DIR).")
        _check_applies(args.case, given, parser)
        return args.case, {"storage": "fp32", "shift": True, **given}, Path(args.out)
    out = Path(args.resume)
    if args.out is not None and Path(args.out).resolve() != out.resolve():
        parser.error("--out must name the --resume directory, or be left out.")
    try:
        stored = read_run_record(out)
    except ResumeError as err:
        parser.error(f"--resume: {err}")
    if args.case is not None and args.case != stored["case"]:
        parser.error(
            f"--resume {str(out)!r} holds a {stored['case']!r} run, not {args.case!r}."
        )
    _check_applies(stored["case"], given, parser)
    return stored["case"], {**stored["arguments"], **given}, out


def _check_applies(case: str, given: dict, parser: argparse.ArgumentParser) -> None:
    """Refuse the flags given on the command line that ``case`` does not take,
    naming those it does take."""
    from lbm_jax.cases import CASE_INFO, CLI_OPTIONS

    takes = [name for name in RUN_ARGUMENTS if name != "re" or CASE_INFO[case].re]
    takes += [name for name, option in CLI_OPTIONS.items() if case in option.cases]
    foreign = [name for name in given if name not in takes]
    if foreign:
        parser.error(
            f"Unknown option {', '.join(map(flag_of, foreign))} for case {case!r}; "
            f"it takes {', '.join(map(flag_of, takes))} (see python -m lbm_jax run "
            "--help)."
        )


def _run_case(
    case: str,
    kwargs: dict,
    out: Path,
    args: argparse.Namespace,
    parser: argparse.ArgumentParser,
) -> int:
    from lbm_jax.cases import make_out_dir, prepare_case, run_case
    from lbm_jax.runs._checkpoint import ResumeError

    resume = args.resume is not None
    try:
        setup = prepare_case(case, **kwargs)  # checks the grid against the memory
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out {str(out)!r} exists and is not a directory.")
        _check_creatable("--out", out)
        if not resume and out.is_dir() and any(out.iterdir()) and not args.overwrite:
            raise ValueError(
                f"--out {str(out)!r} already exists and is not empty; choose a new "
                "directory or pass --overwrite to replace the files of this case "
                "(or --resume it, if it holds a checkpointed run)."
            )
        make_out_dir(out, "--out")  # before the run, not after it
    except (ValueError, TypeError) as err:
        parser.error(as_flags(str(err)))
    if resume:
        newest = sorted(out.glob("checkpoints/step_*.npz"))
        where = newest[-1].name if newest else "the start (no checkpoint yet)"
        print(f"resuming {str(out)!r} from {where}", file=sys.stderr)
    note = sized_defaults_note(case, kwargs)
    if note:
        print(note, file=sys.stderr)
    tic = time.perf_counter()
    try:
        result = run_case(
            case,
            out_dir=out,
            progress=args.progress,
            overwrite=args.overwrite,
            checkpoint_every=args.checkpoint_every,
            resume=resume,
            estimate=estimate_printer(setup),
            **kwargs,
        )
    except ResumeError as err:
        parser.error(as_flags(str(err)))
    seconds = time.perf_counter() - tic
    for warning in result.summary["warnings"]:
        print(f"warning: {as_flags(warning)}", file=sys.stderr)
    print(short_summary(result, seconds))
    print(f"full summary: {out / 'summary.json'}")
    print(f"wrote {', '.join(str(p) for p in result.files)}")
    return 0


def sized_defaults_note(case: str, kwargs: dict) -> str:
    """The line that names the device-sized defaults a run of ``case`` uses
    (those not given in ``kwargs``), or ``""`` where it uses none."""
    from lbm_jax.cases._common import device_defaults, on_gpu

    here = device_defaults(case)
    there = device_defaults(case, gpu=not on_gpu())
    used = [name for name in here if name not in kwargs]
    if not used:
        return ""
    device, other = ("GPU", "CPU") if on_gpu() else ("CPU", "GPU")
    return (
        f"{case}: {device}-sized defaults on this {device} backend: "
        + ", ".join(f"{flag_of(k)} {show_value(here[k])}" for k in used)
        + f" (on a {other}: "
        + ", ".join(f"{flag_of(k)} {show_value(there[k])}" for k in used)
        + "); give them to choose"
    )


def estimate_printer(setup: CaseSetup) -> Callable[[float, int], None]:
    """The ``estimate`` of a case run (:func:`lbm_jax.run`): a line on stderr
    that says how long the rest of the run will take, from its cell updates
    (cells x steps) and the rate measured on its second hundredth."""
    from lbm_jax.cases import CASE_INFO

    cells = math.prod(setup.shape) if setup.shape else 0
    bound = "at most " if CASE_INFO[setup.case].steady and not setup.steps_given else ""

    def estimate(seconds_per_step: float, steps_left: int) -> None:
        rate = ""
        if cells:
            mlups = cells / seconds_per_step / 1e6
            rate = f"{cells * steps_left:.3g} cell updates at {mlups:.3g} MLUPs, "
        print(
            f"estimate: {bound}{duration(seconds_per_step * steps_left)} more for "
            f"{steps_left} steps ({rate}measured on its second hundredth)",
            file=sys.stderr,
            flush=True,
        )

    return estimate


def duration(seconds: float) -> str:
    """A length of time for people.

    >>> duration(42.0), duration(500.0), duration(7200.0)
    ('42 s', '8.3 min', '2 h')
    """
    if seconds < 100:
        return f"{seconds:.2g} s"
    if seconds < 6000:
        return f"{seconds / 60:.2g} min"
    return f"{seconds / 3600:.2g} h"


def short_summary(result: CaseResult, seconds: float) -> str:
    """A few lines for people: case, grid, what ``--n`` meant, steps, storage,
    speed, the case's key figures and the number of warnings."""
    from lbm_jax.cases import CASE_INFO

    s = result.summary
    info = CASE_INFO[s["case"]]
    grid = " x ".join(map(str, result.fields["rho"].shape))
    re_text = f", Re {s['re']:.4g}" if info.re else ""
    speed = "" if s.get("mlups") is None else f", {s['mlups']:.4g} MLUPs"
    shift = "" if s["shift"] else ", no shift"
    lines = [
        f"{s['case']}: {s['lattice']}, grid {grid}, --n {s['n']} = {info.n}" + re_text,
        f"{s['steps']} steps, storage {s['storage']}{shift}, {s['collision']}, "
        f"{seconds:.3g} s wall (compilation included){speed}",
    ]
    if s.get("step_backend"):
        why = f": {s['step_reason']}" if s.get("step_reason") else ""
        lines.append(f"{s['step_backend']} step{why}")
    suffixes = ("_error", "_deviation", "_drift")
    keys = [k for k in info.results if k in s]
    keys += sorted(k for k in s if k.endswith(suffixes) and k not in keys)
    lines += textwrap.wrap(
        ", ".join(f"{k} {show_value(s[k])}" for k in keys),
        width=88,
        initial_indent="results: ",
        subsequent_indent="  ",
    )
    if s["warnings"]:
        lines.append(f"warnings: {len(s['warnings'])} (above, and in summary.json)")
    return "\n".join(lines)


def bench_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    import jax

    from lbm_jax import bench
    from lbm_jax.cases._common import check_grid_memory
    from lbm_jax.core._lattice import get_lattice
    from lbm_jax.core._storage import get_storage, list_storages

    lattice = "D3Q19" if args.lattice is None else args.lattice
    n = 128 if args.n is None else args.n
    storages = [
        s.strip() for s in ("fp32" if args.storage is None else args.storage).split(",")
    ]
    try:
        if args.all:
            mixed = [f"--{k}" for k in ("lattice", "n", "storage", "devices")]
            mixed = [flag for flag in mixed if getattr(args, flag[2:]) is not None]
            if mixed:
                raise ValueError(
                    f"{', '.join(mixed)} cannot be combined with --all, which "
                    "measures every storage policy on its own grids; drop --all to "
                    "measure one grid."
                )
        for name, value, minimum in (
            ("--n", n, 4),
            ("--repeats", args.repeats, 1),
            ("--rounds", args.rounds, 1),
        ):
            if value < minimum:
                raise ValueError(f"{name} must be at least {minimum}, got {value}.")
        if args.steps is not None and args.steps < 1:
            raise ValueError(f"--steps must be at least 1, got {args.steps}.")
        problems = bench.FULL_PROBLEMS if args.all else ((lattice, n),)
        for lat, side in problems:  # each box against the memory, before any work
            for storage in list_storages() if args.all else storages:
                check_grid_memory(
                    (side,) * get_lattice(lat).d, lat, get_storage(storage), n=side
                )
        if args.devices is not None:
            _check_decomposition(args.devices, get_lattice(lattice).d, n)
        if args.json is not None:
            if Path(args.json).is_dir():
                raise ValueError(
                    f"--json {args.json!r} is a directory; give a file name."
                )
            _check_creatable("--json", Path(args.json).parent)
    except (ValueError, TypeError) as err:
        parser.error(as_flags(str(err)))
    measure = {
        "steps": args.steps,
        "repeats": args.repeats,
        "collision": args.collision,
        "backend": args.backend,
        "streaming": args.streaming,
    }
    if args.all or len(storages) > 1 or args.rounds > 1:
        if not args.all:
            measure.update(
                problems=((lattice, n),), storages=storages, devices=args.devices
            )
        x64 = args.all or any(map(_needs_x64, storages))
        with jax.enable_x64(x64):  # FP64/FP64 needs 64-bit types
            report = bench.bench_all(rounds=args.rounds, **measure)
        results = report["results"]
    else:
        (storage,) = storages
        with jax.enable_x64(_needs_x64(storage)):
            result = bench.bench(lattice, n, storage, devices=args.devices, **measure)
        report = {"bandwidth_gbs": result["bandwidth_gbs"], "results": [result]}
        results = [result]
    print(bench.format_table(results))
    if args.json is not None:
        _write_report(Path(args.json), report)
    return 0


def _write_report(path: Path, report: dict) -> None:
    """``bench --json``: the report written whole, or the previous file stays."""
    path.parent.mkdir(parents=True, exist_ok=True)

    def write(folder: Path) -> list[Path]:
        (folder / path.name).write_text(json.dumps(report, indent=2) + "\n")
        return [folder / path.name]

    write_set(path.parent, write)


def build_native_command() -> int:
    from lbm_jax.step import _native

    why = _native.unavailable_reason()
    if why is not None:
        print(f"native CPU step unavailable (the XLA step runs): {why}")
        return 1
    print(f"native CPU step: {_native.library_path()}")
    return 0
