"""Command line: run a validation case or benchmark the solver.

Usage::

    python -m lbm_jax run {poiseuille,taylor_green,cavity,cavity3d,cylinder,
                           cylinder_unconfined,capsule,static_drop,
                           capillary_wave,drop_impact,raindrop} [--n N] [--re RE]
                          [--storage NAME] [--steps S] [--shift/--no-shift]
                          [case options: --lattice {D2Q9,D3Q19,D3Q27}
                           --collision {bgk,trt} --u-ref U --run-times T
                           --radius R --ca CA --law L --skalak-c C --delta K
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
                            [--backend {auto,xla,native,gpu}]
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
status 2, printing ``error: <message>`` (which names the flag, says what to
change and, for a mistyped flag, case or name, the closest ones) and one line
that points to ``--help``. A run prints first the device-sized defaults it uses
(the capsule's radius: CPU-sized on a CPU, the paper's on a GPU), then, after a
timed hundredth of the run, how long the rest will take; its summary names the
step that ran and why no faster one did.

Exit status: 0 when the command did what was asked; 1 when the run failed (it
became unstable: the message names the step); 2 when the command could not do
what was asked: invalid arguments, an output folder in use by another run (one
writer per folder; the message names the holder), a damaged ``run.json``, a full
disk or another file-system error, an interrupt (Ctrl-C). Each is one message on
stderr; ``python -m lbm_jax --debug ...`` prints the traceback too. ``run``
writes its final outputs as a set (into a temporary folder inside ``DIR``, then
renamed into place), so a run that fails while writing leaves the previous
run's outputs as they were and no partial file. Unless
``XLA_FLAGS`` is already set, the host platform is split into one device per CPU
core.

The parser, built from the cases' declared options, is :mod:`lbm_jax.cli._parser`;
the commands are :mod:`lbm_jax.cli._commands`.
"""

from __future__ import annotations

import os

if "XLA_FLAGS" not in os.environ:  # must precede JAX's backend initialisation
    os.environ["XLA_FLAGS"] = (
        f"--xla_force_host_platform_device_count={os.cpu_count() or 1}"
    )

import sys  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402

from lbm_jax.cli._commands import (  # noqa: E402
    EXPECTED_FAILURES,
    bench_command,
    build_native_command,
    explain_failure,
    run_command,
)
from lbm_jax.cli._parser import build_parser  # noqa: E402

__all__ = ["build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (see the module's docstring).

    Invalid arguments exit through the parser (status 2); every other failure
    the command line expects is one message on stderr (with the traceback
    before it under ``--debug``) and the status :func:`explain_failure` gives.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    command = parser.commands[args.command]  # its errors show its own usage
    try:
        if args.command == "run":
            return run_command(args, command)
        if args.command == "build-native":
            return build_native_command()
        return bench_command(args, command)
    except EXPECTED_FAILURES as err:
        if args.debug:
            traceback.print_exc()
        out = getattr(args, "resume", None) or getattr(args, "out", None)
        status, message = explain_failure(err, None if out is None else Path(out))
        print(f"error: {message}", file=sys.stderr)
        return status


if __name__ == "__main__":
    sys.exit(main())
