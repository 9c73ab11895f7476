"""The command line's argument parser, built from the cases' declared options.

:func:`build_parser` builds the parser of ``python -m lbm_jax``: ``run`` takes its
own arguments (:data:`RUN_ARGUMENTS`, the output and checkpoint flags) and every
case option of :data:`lbm_jax.cases.CLI_OPTIONS`, each flag spelled from its
parameter name (:func:`flag_of`); ``bench`` and ``build-native`` take theirs. The
commands themselves are :mod:`lbm_jax.cli._commands`.
"""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from lbm_jax.core._lattice import did_you_mean

__all__ = [
    "RUN_ARGUMENTS",
    "Parser",
    "build_parser",
    "choice_of",
    "flag_of",
    "show_value",
]

#: run's own flags that name a prepare_case argument (the case options come on top)
RUN_ARGUMENTS = ("n", "re", "storage", "shift", "steps")


def choice_of(names: Sequence[str]) -> Callable[[str], str]:
    """An argparse ``type`` that accepts one of ``names`` and refuses any other
    value with the closest names (:func:`did_you_mean`) and the full list."""

    def check(value: str) -> str:
        if value in names:
            return value
        raise argparse.ArgumentTypeError(
            f"invalid choice: {value!r}{did_you_mean(value, names)}; choose from "
            f"{', '.join(names)}"
        )

    return check


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors come first, and whose epilog is built
    only when its help is shown.

    An error prints ``error: <message>`` and one line that points to ``--help``
    (no usage block), and exits with status 2; an unrecognized flag is answered
    with the closest flags the command takes. ``epilog_factory`` returns the
    epilog; the case table it builds for ``run`` prepares every case, which
    ``--help`` alone should pay for.
    """

    def __init__(
        self,
        *args: Any,
        epilog_factory: Callable[[], str] | None = None,
        **kwargs: Any,
    ) -> None:
        #: Every flag this parser takes, for the closest ones to a mistyped flag.
        self.flags: list[str] = []
        super().__init__(*args, **kwargs)
        self._epilog_factory = epilog_factory
        #: The subcommands' parsers by name, whose usage their errors print.
        self.commands: dict[str, Parser] = {}

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        self.flags += action.option_strings
        return action

    def format_help(self) -> str:
        if self._epilog_factory is not None and self.epilog is None:
            self.epilog = self._epilog_factory()
        return super().format_help()

    def error(self, message: str) -> NoReturn:
        """Print the message, then where the usage is; exit with status 2."""
        self.exit(2, f"error: {message}\n({self.prog} --help for usage)\n")

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        """As argparse's, with the closest flags named for unrecognized ones."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = self.commands.get(getattr(parsed, "command", None), self)
            named = ", ".join(
                e + did_you_mean(e.split("=")[0], command.flags) for e in extras
            )
            command.error(f"unrecognized arguments: {named}")
        return parsed


def flag_of(name: str) -> str:
    """The command-line flag of a parameter name: ``u_ref`` -> ``--u-ref``."""
    return "--" + name.replace("_", "-")


def show_value(value: object) -> str:
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
    from lbm_jax.cases._common import device_defaults, on_gpu

    device, other = ("GPU", "CPU") if on_gpu() else ("CPU", "GPU")
    lines = [
        "cases: what --n counts, and the defaults of the flags each case takes",
        f"(on this {device} backend; [on a {other}] where the default depends on it):",
    ]
    indent = " " * 24
    for case, info in CASE_INFO.items():
        defaults = case_defaults(case)
        n, steps = defaults.pop("n"), defaults.pop("steps")
        note = f" [{info.n_note}]" if info.n_note else ""
        lines.append(f"  {case:<21} --n {n} = {info.n}{note}")
        there = {
            name: f" [{show_value(value)} on a {other}]"
            for name, value in device_defaults(case, gpu=not on_gpu()).items()
        }
        text = ", ".join(
            [
                f"{flag_of(name)} {show_value(value)}{there.get(name, '')}"
                for name, value in defaults.items()
            ]
            + [f"--steps {steps}" + (" at most (until steady)" if info.steady else "")]
        )
        lines += textwrap.wrap(
            text, width=88, initial_indent=indent, subsequent_indent=indent
        )
    return "\n".join(lines)


def build_parser() -> Parser:
    """The argument parser of ``python -m lbm_jax``."""
    parser = Parser(
        prog="python -m lbm_jax",
        description="Lattice Boltzmann validation cases and benchmarks.",
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        help="print the traceback of an error as well as its message",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = _add_run(sub)
    _add_run_outputs(run)
    build_native = sub.add_parser(
        "build-native",
        help="build the native CPU step now; print where it is or why not",
        description="Build (or find in the cache) the native CPU step's library "
        "and print its path, or why it is unavailable (exit status 1).",
    )

    bench = _add_bench(sub)
    _add_bench_implementation(bench)
    parser.commands.update({"run": run, "bench": bench, "build-native": build_native})
    return parser


def _add_run(sub: Any) -> Parser:
    """The ``run`` command: a case, its resolution, storage and length, and the
    options the cases declare (:data:`lbm_jax.cases.CLI_OPTIONS`)."""
    from lbm_jax.cases import CASES, CLI_OPTIONS

    case_default = " (default: case default, listed below)"
    run = sub.add_parser(
        "run",
        help="run a validation case",
        description="Run a validation case, compare it with its reference and "
        "write fields,\nsummary.json and figures to --out; print a short summary.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog_factory=_case_table,
    )
    run.add_argument(
        "case",
        nargs="?",
        type=choice_of(CASES),
        choices=CASES,
        help="case name (optional with --resume)",
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
        closed = option.choices is not None and option.type is str
        run.add_argument(
            flag_of(name),
            type=choice_of(option.choices) if closed else option.type,
            choices=option.choices,
            default=None,
            help=option.help + only + case_default,
        )
    return run


def _add_run_outputs(run: Parser) -> None:
    """``run``'s output directory, checkpoints, resume and progress flags."""
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


def _add_bench(sub: Any) -> Parser:
    """The ``bench`` command: the measured box, storage and repeats."""
    from lbm_jax.bench import DEFAULT_UPDATES
    from lbm_jax.core._collision import Collision
    from lbm_jax.core._lattice import list_lattices

    collisions = [c.value for c in Collision]
    lattices = ", ".join(list_lattices())
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
        type=choice_of(collisions),
        choices=collisions,
        default="bgk",
        help="collision operator (default: %(default)s)",
    )
    return bench


def _add_bench_implementation(bench: Parser) -> None:
    """``bench``'s domain decomposition, step implementation, ``--all`` and output
    flags."""
    from lbm_jax.bench import FULL_PROBLEMS
    from lbm_jax.step._backend import BACKENDS
    from lbm_jax.step._xla_inplace import Streaming

    full = " and ".join(f"{lat} {n}^{lat[1]}" for lat, n in FULL_PROBLEMS)
    bench.add_argument(
        "--devices",
        type=_decomposition,
        default=None,
        help="domain decomposition: D devices along x, or sub-domains per axis "
        "as DXxDY[xDZ], e.g. 2x1x1 (default: all devices along x, if they "
        "divide --n)",
    )
    bench.add_argument(
        "--backend",
        type=choice_of(BACKENDS),
        choices=BACKENDS,
        default="auto",
        help="the step's backend: auto picks the fused GPU step on a GPU and "
        "the fused native CPU step on a CPU where they cover the "
        "configuration, else XLA (default: %(default)s)",
    )
    streamings = [s.value for s in Streaming]
    bench.add_argument(
        "--streaming",
        type=choice_of(streamings),
        choices=streamings,
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
