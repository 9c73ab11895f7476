"""Command line: run a validation case or benchmark the solver.

Usage::

    python -m lbm_jax run {poiseuille,taylor_green,cavity,cavity3d,cylinder,
                           cylinder_unconfined,capsule,static_drop,
                           capillary_wave,drop_impact,raindrop} [--n N] [--re RE]
                          [--storage NAME] [--steps S] [--shift/--no-shift]
                          [case options: --lattice {D2Q9,D3Q19,D3Q27}
                           --collision {bgk,trt} --u-ref U --run-times T
                           --radius R --ca CA --law L --skalak-c C --kernel K
                           --nodes N --dims D --sigma S --depth H --amplitude A
                           --we WE --oh OH --bo BO --width W --smagorinsky C
                           --duration T] --out DIR
                          [--checkpoint-every N] [--overwrite] [--progress]
    python -m lbm_jax run --resume DIR [--progress]
    python -m lbm_jax run --help     # what --n counts and the defaults, per case
    python -m lbm_jax bench [--lattice {D2Q9,D3Q19,D3Q27}] [--n 128]
                            [--storage fp32[,fp16s,...]] [--collision {bgk,trt}]
                            [--steps S] [--repeats R] [--rounds K]
                            [--devices D | DXxDY[xDZ]]
                            [--kernel {auto,native,xla}]
                            [--json FILE]
    python -m lbm_jax bench --all [--collision C] [--steps S] [--repeats R]
                            [--rounds K] [--json FILE]
    python -m lbm_jax build-native   # build the native CPU step now, or say why not

``--n`` counts cells across each case's characteristic length: the cylinder
diameter in the cylinder cases, the drop diameter in the impacts, the channel
width, box or cavity side, or the capsule's channel height elsewhere. The case
options come from one list (:data:`lbm_jax.cases.CLI_OPTIONS`); a case refuses
an option it does not take. ``--lattice`` takes D2Q9 (default), D3Q19 or D3Q27
for ``cavity``, D3Q19 (default) or D3Q27 for ``cavity3d``, any for ``bench``.
``--steps S`` runs exactly S steps; without it a case runs its default length
(steady cases stop once steady).

``run`` writes ``DIR/fields.npz`` (``rho`` ``(X, Y[, Z])``, ``u``
``(D, X, Y[, Z])`` in lattice units; the free-surface cases add ``phi`` and
``flags``), ``DIR/summary.json`` (all parameters and metrics, and
``warnings``), ``DIR/fields.vti`` and PNG figures, and prints a short summary
(case, grid, what ``--n`` meant, steps, storage, speed, key figures) with the
path of ``summary.json``; warnings, such as a cylinder run too short for a
Strouhal number, go to stderr. ``--checkpoint-every N`` saves the whole run to
``DIR/checkpoints`` every ``N`` steps (the arguments go to ``DIR/run.json``);
``--resume DIR`` continues a killed run from its newest readable checkpoint, bit
for bit, and refuses other options or another code version (exit status 2), and
a finished run whose outputs are written (``--overwrite`` writes them again).

``bench`` measures MLUPs on a periodic box after compilation, with the memory
bandwidth measured in the same process. ``--all`` covers every storage policy on
D2Q9 1024^2 and D3Q19 128^3 (so it refuses ``--lattice``, ``--n``, ``--storage``
and ``--devices``); a comma-separated ``--storage`` list compares policies side
by side; ``--rounds K`` repeats the measurement K times, interleaved, and
reports the median round (with the ratio to FP32/FP32 per round).
``--collision`` applies in every mode. ``--devices`` sets the domain
decomposition of the box: ``2`` splits x over two devices, ``1x2x1`` splits y,
``2x2x1`` x and y over four (one entry per axis of the lattice).

Every argument is validated before anything is compiled; invalid input exits with
status 2 and a message that names the flag and says what to change. Unless
``XLA_FLAGS`` is already set, the host platform is split into one device per CPU
core.
"""

from __future__ import annotations

import os

if "XLA_FLAGS" not in os.environ:  # must precede JAX's backend initialisation
    os.environ["XLA_FLAGS"] = (
        f"--xla_force_host_platform_device_count={os.cpu_count() or 1}"
    )

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import TYPE_CHECKING, Any  # noqa: E402

if TYPE_CHECKING:
    from lbm_jax.cases import CaseResult

__all__ = ["build_parser", "main"]

# run's own flags that name a prepare_case argument (the case options come on top)
_RUN_ARGUMENTS = ("n", "re", "storage", "shift", "steps")


class _Parser(argparse.ArgumentParser):
    """An argument parser whose epilog is built only when its help is shown.

    ``epilog_factory`` returns the epilog; the case table it builds for ``run``
    prepares every case, which ``--help`` alone should pay for.
    """

    def __init__(
        self,
        *args: Any,
        epilog_factory: Callable[[], str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._epilog_factory = epilog_factory
        #: The subcommands' parsers by name, whose usage their errors print.
        self.commands: dict[str, argparse.ArgumentParser] = {}

    def format_help(self) -> str:
        if self._epilog_factory is not None and self.epilog is None:
            self.epilog = self._epilog_factory()
        return super().format_help()


def _flag(name: str) -> str:
    """The command-line flag of a parameter name: ``u_ref`` -> ``--u-ref``."""
    return "--" + name.replace("_", "-")


def _as_flags(message: str) -> str:
    """A library message with the parameter names it quotes written as flags.

    ``u_ref`` becomes ``--u-ref`` anywhere, ``name=value`` becomes
    ``--name value``, and a plain name (``n``, ``radius``) becomes a flag where
    it is the subject (``n must be ...``, ``ca (capillary number) must ...``) or
    the object of advice (``raise n``, ``lower re``, ``give steps``).
    """
    from lbm_jax.cases import CLI_OPTIONS

    verb = r"(?:(?<=[Rr]aise )|(?<=[Ll]ower )|(?<=[Gg]ive ))"
    for name in sorted((*_RUN_ARGUMENTS, *CLI_OPTIONS), key=len, reverse=True):
        flag, start = _flag(name), rf"(?<![\w.'-]){name}"
        message = re.sub(rf"{start}=(?=[^\s=])", flag + " ", message)
        subject = r"(?![\w-])" if "_" in name else r"(?=\s+must\b|\s+\()"
        message = re.sub(start + subject, flag, message)
        message = re.sub(rf"{verb}{name}\b(?!-)", flag, message)
    return message


def _value(value: object) -> str:
    """A summary value for people: floats to 4 digits, ``None`` as ``n/a``."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _case_table() -> str:
    """The epilog of ``run --help``: what ``--n`` counts in each case, and the
    defaults the case uses for every flag it takes."""
    from lbm_jax.cases import CASE_INFO, case_defaults

    lines = ["cases: what --n counts, and the defaults of the flags each case takes:"]
    indent = " " * 24
    for case, info in CASE_INFO.items():
        defaults = case_defaults(case)
        n, steps = defaults.pop("n"), defaults.pop("steps")
        note = f" [{info.n_note}]" if info.n_note else ""
        lines.append(f"  {case:<21} --n {n} = {info.n}{note}")
        text = ", ".join(
            [f"{_flag(name)} {_value(value)}" for name, value in defaults.items()]
            + [f"--steps {steps}" + (" at most (until steady)" if info.steady else "")]
        )
        lines += textwrap.wrap(
            text, width=88, initial_indent=indent, subsequent_indent=indent
        )
    return "\n".join(lines)


def build_parser() -> _Parser:
    """The argument parser of ``python -m lbm_jax``."""
    from lbm_jax import Collision, Streaming, list_lattices
    from lbm_jax._native import KERNELS
    from lbm_jax.bench import DEFAULT_UPDATES, FULL_PROBLEMS
    from lbm_jax.cases import CASES, CLI_OPTIONS

    collisions = [c.value for c in Collision]
    lattices = ", ".join(list_lattices())
    case_default = " (default: case default, listed below)"
    parser = _Parser(
        prog="python -m lbm_jax",
        description="Lattice Boltzmann validation cases and benchmarks.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser(
        "run",
        help="run a validation case",
        description="Run a validation case, compare it with its reference and "
        "write fields,\nsummary.json and figures to --out; print a short summary.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog_factory=_case_table,
    )
    run.add_argument(
        "case", nargs="?", choices=CASES, help="case name (optional with --resume)"
    )
    run.add_argument(
        "--n",
        type=int,
        default=None,
        help="resolution in cells: the cylinder diameter for the cylinder cases, "
        "the channel width, box or cavity side, channel height or drop diameter "
        "elsewhere (each case below)" + case_default,
    )
    run.add_argument(
        "--re", type=float, default=None, help="Reynolds number" + case_default
    )
    run.add_argument(
        "--storage",
        default=None,
        help="storage policy: fp32, fp16s, fp16c, ... (default: fp32)",
    )
    run.add_argument(
        "--steps",
        type=int,
        default=None,
        help="time steps, run exactly; without it steady cases stop once steady"
        + case_default,
    )
    run.add_argument(
        "--shift",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="DDF-shifting of stored populations (default: on)",
    )
    for name, option in CLI_OPTIONS.items():
        only = "" if option.cases == CASES else f" [{', '.join(option.cases)}]"
        run.add_argument(
            _flag(name),
            type=option.type,
            choices=option.choices,
            default=None,
            help=option.help + only + case_default,
        )
    run.add_argument(
        "--out",
        default=None,
        help="output directory (default: none; required without --resume)",
    )
    run.add_argument(
        "--checkpoint-every",
        type=int,
        default=None,
        metavar="N",
        help="save the whole run to OUT/checkpoints every N steps (default: none)",
    )
    run.add_argument(
        "--resume",
        default=None,
        metavar="DIR",
        help="continue the checkpointed run in DIR from its newest readable "
        "checkpoint (default: start a new run)",
    )
    run.add_argument(
        "--overwrite",
        action="store_true",
        help="allow writing into an existing non-empty --out directory (default: off)",
    )
    run.add_argument(
        "--progress", action="store_true", help="show a progress bar (default: off)"
    )

    build_native = sub.add_parser(
        "build-native",
        help="build the native CPU step now; print where it is or why not",
        description="Build (or find in the cache) the native CPU step's library "
        "and print its path, or why it is unavailable (exit status 1).",
    )

    full = " and ".join(f"{lat} {n}^{lat[1]}" for lat, n in FULL_PROBLEMS)
    bench = sub.add_parser("bench", help="measure MLUPs on a periodic box")
    bench.add_argument(
        "--lattice",
        default=None,
        help=f"lattice: {lattices} (default: D3Q19; not with --all)",
    )
    bench.add_argument(
        "--n", type=int, default=None, help="box side (default: 128; not with --all)"
    )
    bench.add_argument(
        "--storage",
        default=None,
        help="storage policy, or a comma-separated list measured side by side "
        "(default: fp32; not with --all)",
    )
    bench.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="interleaved rounds of the whole measurement, median reported "
        "(default: %(default)s)",
    )
    bench.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"steps per timed repeat (default: about {DEFAULT_UPDATES:.0e} cell "
        "updates)",
    )
    bench.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="timed repeats per run, median reported (default: %(default)s)",
    )
    bench.add_argument(
        "--collision",
        choices=collisions,
        default="bgk",
        help="collision operator (default: %(default)s)",
    )
    bench.add_argument(
        "--devices",
        type=_decomposition,
        default=None,
        help="domain decomposition: D devices along x, or sub-domains per axis "
        "as DXxDY[xDZ], e.g. 2x1x1 (default: all devices along x, if they "
        "divide --n)",
    )
    bench.add_argument(
        "--kernel",
        choices=KERNELS,
        default="auto",
        help="the step's implementation: auto picks the fused GPU kernel on a "
        "GPU and the fused native CPU kernel on a CPU where they cover the "
        "configuration, else XLA (default: %(default)s)",
    )
    bench.add_argument(
        "--streaming",
        choices=[s.value for s in Streaming],
        default="auto",
        help="keep the populations in one buffer updated in place, or pull into "
        "a second one (default: %(default)s)",
    )
    bench.add_argument(
        "--all",
        action="store_true",
        help=f"every storage policy on {full} (default: off)",
    )
    bench.add_argument(
        "--json",
        default=None,
        help="write results to this JSON file (default: none, the table only)",
    )
    parser.commands.update({"run": run, "bench": bench, "build-native": build_native})
    return parser


def _decomposition(text: str) -> int | tuple[int, ...]:
    """``--devices``: ``"2"`` -> 2 (x split), ``"2x1x1"`` -> (2, 1, 1)."""
    try:
        parts = [int(p) for p in text.lower().split("x")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a device count (e.g. 2) or sub-domains per axis "
            "(e.g. 2x1x1)"
        ) from None
    return parts[0] if len(parts) == 1 else tuple(parts)


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
    from lbm_jax import get_storage

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


def _run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
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
    from lbm_jax.cases import CLI_OPTIONS, RUN_FILE

    given = {
        name: getattr(args, name)
        for name in (*_RUN_ARGUMENTS, *CLI_OPTIONS)
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
        stored = json.loads((out / RUN_FILE).read_text())
    except (OSError, ValueError) as err:
        parser.error(
            f"--resume {str(out)!r}: no readable {RUN_FILE} ({err}); start a "
            "checkpointed run with --checkpoint-every N --out DIR."
        )
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

    takes = [name for name in _RUN_ARGUMENTS if name != "re" or CASE_INFO[case].re]
    takes += [name for name, option in CLI_OPTIONS.items() if case in option.cases]
    foreign = [name for name in given if name not in takes]
    if foreign:
        parser.error(
            f"Unknown option {', '.join(map(_flag, foreign))} for case {case!r}; "
            f"it takes {', '.join(map(_flag, takes))} (see python -m lbm_jax run "
            "--help)."
        )


def _run_case(
    case: str,
    kwargs: dict,
    out: Path,
    args: argparse.Namespace,
    parser: argparse.ArgumentParser,
) -> int:
    from lbm_jax import ResumeError
    from lbm_jax.cases import make_out_dir, prepare_case, run_case

    resume = args.resume is not None
    try:
        prepare_case(case, **kwargs)  # checks the grid against the memory too
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
        parser.error(_as_flags(str(err)))
    if resume:
        newest = sorted(out.glob("checkpoints/step_*.npz"))
        where = newest[-1].name if newest else "the start (no checkpoint yet)"
        print(f"resuming {str(out)!r} from {where}", file=sys.stderr)
    tic = time.perf_counter()
    try:
        result = run_case(
            case,
            out_dir=out,
            progress=args.progress,
            overwrite=args.overwrite,
            checkpoint_every=args.checkpoint_every,
            resume=resume,
            **kwargs,
        )
    except ResumeError as err:
        parser.error(_as_flags(str(err)))
    seconds = time.perf_counter() - tic
    for warning in result.summary["warnings"]:
        print(f"warning: {_as_flags(warning)}", file=sys.stderr)
    print(_short_summary(result, seconds))
    print(f"full summary: {out / 'summary.json'}")
    print(f"wrote {', '.join(str(p) for p in result.files)}")
    return 0


def _short_summary(result: CaseResult, seconds: float) -> str:
    """A few lines for people: case, grid, what ``--n`` meant, steps, storage,
    speed, the case's key figures and the number of warnings."""
    from lbm_jax.cases import CASE_INFO

    s = result.summary
    info = CASE_INFO[s["case"]]
    grid = " x ".join(map(str, result.fields["rho"].shape))
    re_text = f", Re {s['re']:.4g}" if info.re else ""
    speed = "" if s.get("mlups") is None else f", {s['mlups']:.4g} MLUPs"
    speed += f", {s['step_kernel']} step" if s.get("step_kernel") else ""
    shift = "" if s["shift"] else ", no shift"
    lines = [
        f"{s['case']}: {s['lattice']}, grid {grid}, --n {s['n']} = {info.n}" + re_text,
        f"{s['steps']} steps, storage {s['storage']}{shift}, {s['collision']}, "
        f"{seconds:.3g} s wall (compilation included){speed}",
    ]
    suffixes = ("_error", "_deviation", "_drift")
    keys = [k for k in info.results if k in s]
    keys += sorted(k for k in s if k.endswith(suffixes) and k not in keys)
    lines += textwrap.wrap(
        ", ".join(f"{k} {_value(s[k])}" for k in keys),
        width=88,
        initial_indent="results: ",
        subsequent_indent="  ",
    )
    if s["warnings"]:
        lines.append(f"warnings: {len(s['warnings'])} (above, and in summary.json)")
    return "\n".join(lines)


def _bench(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    import jax

    from lbm_jax import bench, get_lattice, get_storage

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
        if not args.all:
            get_lattice(lattice)
            for storage in storages:
                get_storage(storage)
        if args.devices is not None:
            _check_decomposition(args.devices, get_lattice(lattice).d, n)
        if args.json is not None:
            if Path(args.json).is_dir():
                raise ValueError(
                    f"--json {args.json!r} is a directory; give a file name."
                )
            _check_creatable("--json", Path(args.json).parent)
    except (ValueError, TypeError) as err:
        parser.error(str(err))
    measure = {
        "steps": args.steps,
        "repeats": args.repeats,
        "collision": args.collision,
        "kernel": args.kernel,
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
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (2 for invalid arguments)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    command = parser.commands[args.command]  # its errors show its own usage
    if args.command == "run":
        return _run(args, command)
    if args.command == "build-native":
        return _build_native()
    return _bench(args, command)


def _build_native() -> int:
    from lbm_jax import _native

    why = _native.unavailable_reason()
    if why is not None:
        print(f"native CPU step unavailable (the XLA step runs): {why}")
        return 1
    print(f"native CPU step: {_native.library_path()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
