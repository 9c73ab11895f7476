"""Command line: ``python -m experiments``.

Usage::

    python -m experiments reproduce [--quick | --standard | --full] [--out DIR]
                                    [--seed N] [--only NAME[,NAME...]]
    python -m experiments <pipeline> [--quick | --standard | --full] [--out DIR]
                                     [--seed N]
    python -m experiments list

``reproduce`` runs every pipeline (``formats``, ``mixed_precision_bench``, ``amp``,
``lbm_accuracy``, ``lbm_gradients``, ``lbm_performance``, ``lbm_capsule``,
``lbm_raindrop``, ``number_range``, ``inverse_design``) in order, each under a
progress bar with its expected time, prints each result table as it finishes, then
a table of every pipeline's status and wall time, and writes ``REPORT.md``,
``summary.json`` and ``index.html`` (one page with every table and figure) next to
the per-pipeline directories. ``--quick`` (the
default) is sized for a 2-core CPU (the goal, five minutes on an idle one, is checked
by the slow test ``tests/experiments/test_reproduce.py``; on 2026-12-07 it took 4 min
10 s on an idle 2-core machine); ``--standard`` runs the larger CPU settings (about
ten minutes); ``--full`` runs paper-scale settings meant for a GPU.

Results go to ``results/<pipeline>/`` in the current directory (``--out`` to write
elsewhere; the notebooks use the same default). Each run writes into a fresh
temporary directory that replaces the old one when the pipeline finishes; the
previous run is kept as ``<pipeline>.prev``. The exit status is 0 when
every check of every pipeline passed, 1 otherwise (results are written either way),
and 2 for a usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from experiments import _framework, _timing
from experiments._outcome import NO_CHECKS, UNRESOLVED, PipelineOutcome
from experiments._report import elapsed_bar, fmt
from experiments._reproduce_report import write_top_level_report

_SCALE_HELP = {
    "quick": (
        "the main job, sized for a 2-core CPU (at most five minutes on an idle one; "
        "4 min 10 s measured) (default)"
    ),
    "standard": "larger CPU settings with more rounds (about ten minutes)",
    "full": "paper-scale settings (meant for a GPU)",
}


def _parser(pipelines: Mapping[str, object]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m experiments",
        description="Reproduce the project's tables and figures.",
    )
    parser.add_argument(
        "target",
        help=f"'reproduce', 'list', or one pipeline: {', '.join(pipelines)}",
    )
    mode = parser.add_mutually_exclusive_group()
    for scale, text in _SCALE_HELP.items():
        mode.add_argument(
            f"--{scale}",
            dest="scale",
            action="store_const",
            const=scale,
            help=text,
        )
    parser.add_argument(
        "--out",
        type=Path,
        default=_framework.DEFAULT_RESULTS_DIR,
        help="parent directory of the result directories (default: ./results)",
    )
    parser.add_argument("--seed", type=int, default=0, help="base random seed")
    parser.add_argument(
        "--only",
        default=None,
        help="with 'reproduce': comma-separated subset of pipelines to run",
    )
    return parser


def _print_outcome(outcome: PipelineOutcome, write: Callable[[str], None]) -> None:
    if outcome.error is not None:
        write(outcome.error)
        write(
            f"{outcome.name}: ERROR after {outcome.wall_s:.1f} s (previous results, "
            "if any, left in place)\n"
        )
        return
    write(outcome.table.rstrip() + "\n")
    failed = [
        k for k, v in outcome.checks.items() if not v and k not in outcome.unresolved
    ]
    if not outcome.checks:
        status = f"FAILED: {NO_CHECKS}"
    else:
        status = "all checks passed" if not failed else f"FAILED: {', '.join(failed)}"
    for check, spread in outcome.unresolved.items():
        write(f"{outcome.name}: {check}: {UNRESOLVED}, {spread}\n")
    if outcome.unresolved and not failed:
        status = "all other checks passed"
    if outcome.over_budget is not None:
        write(outcome.over_budget + "\n")
    write(
        f"{outcome.name}: {status} in {outcome.wall_s:.1f} s; results in "
        f"{outcome.out_dir}\n"
    )


def _print_wall_times(
    outcomes: Sequence[PipelineOutcome], write: Callable[[str], None]
) -> None:
    write(
        "\n| pipeline | status | wall time (s) | expected (s) | CPU time (s) "
        "| other load (cores) |\n|---|---|---:|---:|---:|---:|\n"
    )
    for o in outcomes:
        expected = _timing.EXPECTED_S.get(o.scale, {}).get(o.name)
        write(
            f"| {o.name} | {o.status} | {o.wall_s:.1f} | {fmt(expected, '.0f')} | "
            f"{fmt(o.cpu_s, '.1f')} | {fmt(o.other_cores, '.2f')} |\n"
        )
    total = sum(o.wall_s for o in outcomes)
    write(f"| total | | {total:.1f} | | | |\n")


def _announce(
    name: str, scale: str, write: Callable[[str], None]
) -> contextlib.AbstractContextManager:
    """The heading of a pipeline and its progress bar against its expected time."""
    expected = _timing.EXPECTED_S.get(scale, {}).get(name)
    when = f"expected ~{expected:.0f} s" if expected is not None else "no estimate"
    write(f"\n## {name}  ({scale} scale, {when})\n")
    sys.stdout.flush()
    return elapsed_bar(name, expected)


def main(
    argv: Sequence[str] | None = None,
    *,
    pipelines: Mapping[str, str | Callable[..., dict]] = _framework.PIPELINES,
) -> int:
    """Run the command line; return the process exit status.

    Args:
        argv: arguments without the program name (default: ``sys.argv[1:]``).
        pipelines: the pipeline registry (name -> module path or ``run`` callable).

    Returns:
        0 when every check passed, 1 when a check failed or a pipeline raised,
        2 for a usage error.
    """
    parser = _parser(pipelines)
    args = parser.parse_args(argv)
    write = sys.stdout.write
    if args.seed < 0:
        parser.error(f"--seed is {args.seed}; expected a non-negative integer.")
    if args.target == "list":
        for name in pipelines:
            write(name + "\n")
        return 0
    if args.target == "reproduce":
        names = list(pipelines)
        if args.only is not None:
            names = [n.strip() for n in args.only.split(",") if n.strip()]
            if not names:
                parser.error(
                    f"--only is {args.only!r}, which names no pipeline; give a "
                    f"comma-separated subset of: {', '.join(pipelines)}."
                )
    elif args.target in pipelines:
        if args.only is not None:
            parser.error("--only is only valid with 'reproduce'.")
        names = [args.target]
    else:
        parser.error(
            f"unknown target {args.target!r}; expected 'reproduce', 'list' or one "
            f"of: {', '.join(pipelines)}."
        )
    unknown = [n for n in names if n not in pipelines]
    if unknown:
        parser.error(
            f"--only names unknown pipeline(s) {unknown}; known: "
            f"{', '.join(pipelines)}."
        )
    try:
        scale = _framework.resolve_scale(args.scale != "full", args.scale)
    except ValueError as err:
        parser.error(str(err))
    if args.out.exists() and not args.out.is_dir():
        parser.error(
            f"--out {str(args.out)!r} is a file, not a directory; give a directory "
            "for the results (it is created if missing)."
        )
    try:  # before the first pipeline runs, not after it
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        parser.error(
            f"--out {str(args.out)!r} cannot be created ({err.strerror or err}); "
            "choose a directory you can write to."
        )

    def report(outcome: PipelineOutcome) -> None:
        _print_outcome(outcome, write)
        sys.stdout.flush()

    outcomes = _framework.run_pipelines(
        names,
        out_root=args.out,
        quick=scale != "full",
        seed=args.seed,
        scale=scale,
        pipelines=pipelines,
        on_done=report,
        around=lambda name: _announce(name, scale, write),
    )
    _print_wall_times(outcomes, write)
    if args.target == "reproduce":
        write_top_level_report(args.out, outcomes, scale=scale, seed=args.seed)
        write(
            f"\nRead the results in {args.out / 'REPORT.md'} and, with every figure "
            f"and table on one page, {args.out / 'index.html'} (open it in a "
            "browser).\n"
        )
    return 0 if all(o.passed for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
