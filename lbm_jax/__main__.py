"""Command line: run a validation case or benchmark the solver.

Usage::

    python -m lbm_jax run {poiseuille,taylor_green,cavity,cavity3d,cylinder,
                           cylinder_unconfined,capsule,static_drop,
                           capillary_wave,drop_impact,raindrop} [--n N] [--re RE]
                          [--storage NAME] [--steps S] [--shift/--no-shift]
                          [case options: --lattice L --collision {bgk,trt} --u-ref U
                           --radius R --ca CA --law L --skalak-c C --kernel K
                           --nodes N --dims D --sigma S --depth H --amplitude A
                           --we WE --oh OH --bo BO --width W --smagorinsky C
                           --duration T] --out DIR
                          [--checkpoint-every N] [--overwrite] [--progress]
    python -m lbm_jax run --resume DIR [--progress]
    python -m lbm_jax bench [--lattice D3Q19] [--n 128] [--storage fp32[,fp16s,...]]
                            [--steps S] [--repeats R] [--rounds K] [--all]
                            [--json FILE]

The case options come from one list (:data:`lbm_jax.cases.CLI_OPTIONS`); a case
refuses an option it does not take. ``run`` writes ``DIR/fields.npz`` (``rho``
``(X, Y[, Z])``, ``u`` ``(D, X, Y[, Z])`` in lattice units; the free-surface cases
add ``phi`` and ``flags``), ``DIR/summary.json``
and PNG figures. With
``--checkpoint-every N`` it saves the whole run to ``DIR/checkpoints`` every ``N``
steps (the arguments go to ``DIR/run.json``); ``--resume DIR`` continues a killed
run from its newest readable checkpoint, and its results equal an uninterrupted
run's bit for bit. A resume with other options or another code version is
refused (exit status 2). ``bench`` measures MLUPs
on a periodic box after compilation, with the memory bandwidth measured in the
same process; ``--all`` covers every storage policy on D2Q9 1024^2 and D3Q19 128^3,
and a comma-separated ``--storage`` list compares policies side by side; with
``--rounds K`` the sweep is repeated K times, interleaved, and each figure is the
median round, with the ratio to FP32/FP32 per round.

Every argument is validated before anything is compiled; invalid input exits with
status 2 and a message saying what to change. Unless ``XLA_FLAGS`` is already
set, the host platform is split into one device per CPU core.
"""

from __future__ import annotations

import os

if "XLA_FLAGS" not in os.environ:  # must precede JAX's backend initialisation
    os.environ["XLA_FLAGS"] = (
        f"--xla_force_host_platform_device_count={os.cpu_count() or 1}"
    )

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m lbm_jax``."""
    from lbm_jax import Collision
    from lbm_jax.cases import CASES, CLI_OPTIONS

    collisions = [c.value for c in Collision]
    parser = argparse.ArgumentParser(
        prog="python -m lbm_jax",
        description="Lattice Boltzmann validation cases and benchmarks.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a validation case")
    run.add_argument(
        "case", nargs="?", choices=CASES, help="case name (optional with --resume)"
    )
    run.add_argument("--n", type=int, default=None, help="resolution (cells)")
    run.add_argument("--re", type=float, default=None, help="Reynolds number")
    run.add_argument(
        "--storage", default=None, help="storage policy (fp32 (default), fp16s, ...)"
    )
    run.add_argument("--steps", type=int, default=None, help="time steps")
    run.add_argument(
        "--shift",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="DDF-shifting of stored populations (default on)",
    )
    for name, option in CLI_OPTIONS.items():
        only = f" [{', '.join(option.cases)}]" if option.cases else ""
        run.add_argument(
            "--" + name.replace("_", "-"),
            type=option.type,
            choices=option.choices,
            default=None,
            help=option.help + only,
        )
    run.add_argument("--out", default=None, help="output directory")
    run.add_argument(
        "--checkpoint-every",
        type=int,
        default=None,
        metavar="N",
        help="save the whole run to OUT/checkpoints every N steps",
    )
    run.add_argument(
        "--resume",
        default=None,
        metavar="DIR",
        help="continue the checkpointed run in DIR from its newest readable checkpoint",
    )
    run.add_argument(
        "--overwrite",
        action="store_true",
        help="allow writing into an existing non-empty --out directory",
    )
    run.add_argument("--progress", action="store_true", help="show a progress bar")

    bench = sub.add_parser("bench", help="measure MLUPs on a periodic box")
    bench.add_argument("--lattice", default="D3Q19")
    bench.add_argument("--n", type=int, default=128)
    bench.add_argument(
        "--storage",
        default="fp32",
        help="storage policy, or a comma-separated list measured side by side",
    )
    bench.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="interleaved rounds of a multi-storage or --all sweep (median reported)",
    )
    bench.add_argument("--steps", type=int, default=None)
    bench.add_argument("--repeats", type=int, default=5)
    bench.add_argument("--collision", choices=collisions, default="bgk")
    bench.add_argument(
        "--devices",
        type=int,
        default=None,
        help="devices to split the box over (default: all, if n divides)",
    )
    bench.add_argument(
        "--all",
        action="store_true",
        help="every storage policy on D2Q9 1024^2 and D3Q19 128^3",
    )
    bench.add_argument("--json", default=None, help="write results to this JSON file")
    return parser


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
        key: value
        for key, value in (
            ("n", args.n),
            ("re", args.re),
            ("storage", args.storage),
            ("shift", args.shift),
            ("steps", args.steps),
            *((name, getattr(args, name)) for name in CLI_OPTIONS),
        )
        if value is not None
    }
    if args.checkpoint_every is not None and args.checkpoint_every < 1:
        parser.error(
            f"--checkpoint-every must be at least 1, got {args.checkpoint_every}."
        )
    if args.resume is None:
        if args.case is None or args.out is None:
            parser.error("run needs a case and --out DIR (or --resume DIR).")
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
    return stored["case"], {**stored["arguments"], **given}, out


def _run_case(
    case: str,
    kwargs: dict,
    out: Path,
    args: argparse.Namespace,
    parser: argparse.ArgumentParser,
) -> int:
    from lbm_jax import ResumeError
    from lbm_jax.cases import prepare_case, run_case

    resume = args.resume is not None
    try:
        prepare_case(case, **kwargs)
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out {str(out)!r} exists and is not a directory.")
        _check_creatable("--out", out)
        if not resume and out.is_dir() and any(out.iterdir()) and not args.overwrite:
            raise ValueError(
                f"--out {str(out)!r} already exists and is not empty; choose a new "
                "directory or pass --overwrite to replace the files of this case "
                "(or --resume it, if it holds a checkpointed run)."
            )
    except (ValueError, TypeError) as err:
        parser.error(str(err))
    if resume:
        newest = sorted(out.glob("checkpoints/step_*.npz"))
        where = newest[-1].name if newest else "the start (no checkpoint yet)"
        print(f"resuming {str(out)!r} from {where}", file=sys.stderr)
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
        parser.error(str(err))
    print(json.dumps(result.summary, indent=2, sort_keys=True))
    print(f"wrote {', '.join(str(p) for p in result.files)}")
    return 0


def _bench(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    import jax

    from lbm_jax import bench, get_lattice, get_storage

    try:
        for name, value, minimum in (
            ("--n", args.n, 4),
            ("--repeats", args.repeats, 1),
            ("--rounds", args.rounds, 1),
        ):
            if value < minimum:
                raise ValueError(f"{name} must be at least {minimum}, got {value}.")
        if args.devices is not None:
            if args.all:
                raise ValueError("--devices applies to a single run, not to --all.")
            available = jax.local_device_count()
            if not 1 <= args.devices <= available or args.n % args.devices:
                raise ValueError(
                    f"--devices {args.devices}: need 1 <= devices <= {available} "
                    f"(local devices) dividing --n {args.n}."
                )
        if args.steps is not None and args.steps < 1:
            raise ValueError(f"--steps must be at least 1, got {args.steps}.")
        storages = [s.strip() for s in args.storage.split(",")]
        if not args.all:
            get_lattice(args.lattice)
            for storage in storages:
                get_storage(storage)
            if args.devices is not None and len(storages) > 1:
                raise ValueError("--devices applies to a single storage policy.")
        if args.json is not None:
            if Path(args.json).is_dir():
                raise ValueError(
                    f"--json {args.json!r} is a directory; give a file name."
                )
            _check_creatable("--json", Path(args.json).parent)
    except (ValueError, TypeError) as err:
        parser.error(str(err))
    if args.all or len(storages) > 1:
        kwargs: dict = {"steps": args.steps, "repeats": args.repeats}
        if not args.all:
            kwargs.update(problems=((args.lattice, args.n),), storages=storages)
        x64 = args.all or any(map(_needs_x64, storages))
        with jax.enable_x64(x64):  # FP64/FP64 needs 64-bit types
            report = bench.bench_all(rounds=args.rounds, **kwargs)
        results = report["results"]
    else:
        with jax.enable_x64(_needs_x64(args.storage)):
            result = bench.bench(
                args.lattice,
                args.n,
                args.storage,
                steps=args.steps,
                repeats=args.repeats,
                collision=args.collision,
                devices=args.devices,
            )
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
    if args.command == "run":
        return _run(args, parser)
    return _bench(args, parser)


if __name__ == "__main__":
    sys.exit(main())
