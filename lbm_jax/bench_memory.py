"""Memory benchmark: the peak host memory of each public operation, per storage.

Each operation runs in its own fresh Python process, so that its high-water mark
is its own. The worker process

1. imports ``jax`` and ``lbm_jax``, runs one tiny compiled function (JAX's CPU
   client allocates its thread pools and arenas lazily, on first use: that
   memory belongs to the interpreter), builds the
   :class:`~lbm_jax.Simulation` and returns freed heap memory to the system
   (``malloc_trim``); its resident set size (``VmRSS``) is then the
   **baseline**;
2. builds the operation's inputs (e.g. a state by ``sim.init()``);
3. calls the operation twice, each time after trimming the heap and resetting
   the kernel's high-water mark (writing ``5`` to ``/proc/self/clear_refs``),
   and reads the high-water mark ``VmHWM`` after it (``getrusage``'s
   ``ru_maxrss`` would also carry the peak of the spawning process, which Linux
   keeps across ``exec``). The first call compiles; the
   second, with the first one's result still alive (so its memory cannot be
   reused), measures the operation itself: what it adds over the RSS just
   before the call is its **own** memory.

The row's **peak** is ``baseline + inputs + own`` and ``cold_peak`` the same
for the first call (compilation included: tens of MB of LLVM code and caches,
which do not grow with the grid). The **bound** is what the operation must
hold: the baseline, its inputs (the state), its output and the scratch buffers
of its scheme (a second population buffer for two-buffer streaming); ``excess``
is ``own`` minus output and scratch. An operation fails when its peak exceeds
the bound by more than :data:`TOLERANCE` (10 %); at small grids the baseline
dominates the bound, so the tests also bound ``excess`` directly. Where the
high-water mark cannot be reset, the mark before the call is used as well
(which can only overstate a peak). ``simulation`` measures the constructor
against the int8 cell-type grid it must keep, ``cli_run`` the whole
``python -m lbm_jax run cavity3d`` (reported, not bounded).

Run::

    python3 -m lbm_jax.bench_memory --n 256 --storage fp32,fp16s --json out.json

or from Python: ``rows = measure(n=96, storages=("fp32", "fp16s"))`` then
``check(rows)`` (the failures) and ``table(rows)`` (a text table). The exit
status is 1 when an operation exceeds its bound or a measurement fails.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from lbm_jax.cli._parser import Parser

__all__ = [
    "OPERATIONS",
    "TOLERANCE",
    "check",
    "main",
    "measure",
    "peak_rss",
    "table",
    "within_bound",
]

#: Allowed excess of the peak over the bound.
TOLERANCE = 0.10

#: Operations measured, in order (``simulation`` is the constructor itself).
OPERATIONS = (
    "simulation",
    "init",
    "init_jit",
    "advance",
    "run",
    "density",
    "velocity",
    "populations",
    "healthy",
    "vorticity",
    "momentum_exchange",
    "save_state",
    "load_state",
    "checkpoint",
    "write_vti",
    "cli_run",
)


def _status(field: str) -> int | None:
    """A ``/proc/self/status`` memory field in bytes, or ``None``."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _rss() -> int:
    """Current resident set size in bytes (``VmRSS``)."""
    rss = _status("VmRSS")
    if rss is None:
        raise OSError("VmRSS not found in /proc/self/status")
    return rss


def peak_rss() -> int:
    """This process's high-water mark of resident memory in bytes: ``VmHWM``
    (reset by ``_reset_peak``).

    ``getrusage``'s ``ru_maxrss`` is the fallback only: Linux carries the peak
    of the process image before ``exec`` into it, so a worker spawned by a
    large process (a test session) would report its parent's size.
    """
    peak = _status("VmHWM")
    if peak is None:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return peak


def _trim() -> None:
    """Return freed heap memory to the system (glibc), so that memory an earlier
    call freed but the allocator kept cannot hide an operation's own use."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _reset_peak() -> bool:
    """Reset the high-water mark to the current RSS (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        return False
    return True


def _worker(op: str, n: int, lattice: str, storage: str, streaming: str | None) -> dict:
    """Measure one operation in this (fresh) process; see the module docstring."""
    import jax
    import jax.numpy as jnp

    import lbm_jax

    def settle() -> None:
        jax.block_until_ready(jnp.zeros(8) + 1)
        gc.collect()
        _trim()

    settle()
    shape = (n,) * lbm_jax.get_lattice(lattice).d
    kwargs: dict[str, Any] = {"tau": 0.8, "storage": storage}
    if streaming is not None:
        kwargs["streaming"] = streaming
    cells = math.prod(shape)
    work = tempfile.mkdtemp(prefix="lbm_mem_")
    if op == "simulation":
        baseline = _rss()
        before_peak = peak_rss()
        reset = _reset_peak()
        sim = lbm_jax.Simulation(lattice, shape, **kwargs)
        peak = peak_rss() if reset else max(peak_rss(), before_peak)
        # what it must hold: the int8 cell-type grid
        return _row(op, baseline, 0, cells, peak - baseline, peak - baseline, reset)
    sim = lbm_jax.Simulation(lattice, shape, **kwargs)
    settle()
    baseline = _rss()
    buffers = 1 if streaming == "inplace" else 2  # None: no such option, two
    operation = _operation(op, sim, work, buffers)
    # first call: compiles, then runs
    settle()
    before_peak, before = peak_rss(), _rss()
    reset = _reset_peak()
    t0 = time.perf_counter()
    first = jax.block_until_ready(operation.action())
    seconds = time.perf_counter() - t0
    cold = (peak_rss() if reset else max(peak_rss(), before_peak)) - before
    # second call, compiled; the first result stays alive, so its memory cannot
    # be reused for the second one's output (a consumed state is the new input)
    if operation.feed is not None:
        operation.feed(first)
        first = None
    settle()
    before_peak, held = peak_rss(), _rss()
    reset = _reset_peak()
    second = jax.block_until_ready(operation.action())
    own = (peak_rss() if reset else max(peak_rss(), before_peak)) - held
    del first, second
    shutil.rmtree(work, ignore_errors=True)
    inputs, output = operation.inputs, operation.output
    row = _row(op, baseline, inputs, inputs + output, own, cold, reset)
    row["seconds"] = round(seconds, 3)
    return row


class _Operation(NamedTuple):
    """One measured operation, ready to call.

    Attributes:
        action: Runs the operation once and returns its result.
        inputs: Bytes of the inputs the operation reads.
        output: Bytes it returns, or of the scratch buffers it needs.
        feed: For an operation that donates its input state: hands it the
            state the previous call returned (``None`` for the others).
    """

    action: Callable[[], Any]
    inputs: int
    output: int
    feed: Callable[[Any], None] | None = None


def _operation(op: str, sim: Any, work: str, buffers: int) -> _Operation:
    """Operation ``op`` on ``sim``'s initial state (files go to ``work``); the
    state is held only by the operation's closure, or dropped where the
    operation reads something derived from it."""
    import jax

    import lbm_jax

    cells, q, d = sim.num_cells, sim.lattice.q, sim.lattice.d
    state_bytes = cells * q * sim.storage.storage_dtype.itemsize
    value = sim.storage.compute_dtype.itemsize
    if op in ("init", "init_jit"):
        action = sim.init if op == "init" else jax.jit(sim.init)
        return _Operation(action, 0, state_bytes)
    box = {"state": jax.block_until_ready(sim.init())}
    feed = box.__setitem__
    scratch = (buffers - 1) * state_bytes
    if op == "advance":
        return _Operation(
            lambda: sim.advance(box["state"], 4),
            state_bytes,
            scratch,
            lambda new: feed("state", new),
        )
    if op == "run":
        return _Operation(
            lambda: lbm_jax.run(sim, box["state"], 4).state,
            state_bytes,
            scratch,
            lambda new: feed("state", new),
        )
    if op == "checkpoint":
        dirs = iter(os.path.join(work, f"ck{i}") for i in range(2))

        def checkpointed() -> Any:
            policy = lbm_jax.Checkpoint(next(dirs), every=2)
            return lbm_jax.run(sim, box["state"], 4, checkpoint=policy).state

        return _Operation(
            checkpointed, state_bytes, scratch, lambda new: feed("state", new)
        )
    readouts = {
        "density": (lambda: lbm_jax.density(sim, box["state"]), cells * value),
        "velocity": (lambda: lbm_jax.velocity(sim, box["state"]), d * cells * value),
        "populations": (lambda: sim.populations(box["state"]), q * cells * value),
        "healthy": (lambda: sim.healthy(box["state"]), 0),
        # output: the cell-type grid, copied to the device
        "momentum_exchange": (
            lambda: lbm_jax.momentum_exchange_force(sim, box["state"]),
            cells,
        ),
    }
    if op in readouts:
        action, output = readouts[op]
        return _Operation(action, state_bytes, output)
    state = box.pop("state")
    return _file_or_derived_operation(op, sim, state, work, state_bytes, value)


def _file_or_derived_operation(
    op: str, sim: Any, state: Any, work: str, state_bytes: int, value: int
) -> _Operation:
    """The operations that write or read files, or read a field derived from the
    state (the state itself is dropped where it is not needed)."""
    import jax

    import lbm_jax

    if op == "vorticity":
        u = jax.block_until_ready(lbm_jax.velocity(sim, state))
        del state
        output = u.nbytes if sim.lattice.d == 3 else sim.num_cells * value
        return _Operation(lambda: lbm_jax.vorticity(u), u.nbytes, output)
    if op == "save_state":
        paths = iter(os.path.join(work, f"s{i}.npz") for i in range(2))
        return _Operation(
            lambda: lbm_jax.save_state(next(paths), state), state_bytes, 0
        )
    if op == "load_state":
        path = os.path.join(work, "s.npz")
        lbm_jax.save_state(path, state)
        template = jax.eval_shape(lambda: state)
        del state
        return _Operation(
            lambda: lbm_jax.load_state(path, like=template)[0], 0, state_bytes
        )
    if op == "write_vti":
        fields = jax.block_until_ready(sim.fields(state))
        del state
        paths = iter(os.path.join(work, f"f{i}.vti") for i in range(2))
        return _Operation(
            lambda: lbm_jax.write_vti(next(paths), {"rho": fields[0], "u": fields[1]}),
            sum(a.nbytes for a in fields),
            0,
        )
    raise ValueError(f"unknown operation {op!r}; expected one of {OPERATIONS}.")


def _row(
    op: str,
    baseline: int,
    inputs: int,
    needed: int,
    own: int,
    cold: int,
    reset: bool,
) -> dict:
    """A result row: ``peak = baseline + inputs + own`` (the operation's own
    memory measured over what the process held just before the call), and
    ``cold_peak`` the same with the first call's (compilation included)."""
    return {
        "operation": op,
        "baseline": baseline,
        "inputs": inputs,
        "needed": needed,
        "bound": baseline + needed,
        "own": own,
        "excess": own - (needed - inputs),
        "peak": baseline + inputs + own,
        "cold_peak": baseline + inputs + cold,
        "peak_reset": reset,
    }


def _cli_run(n: int, storage: str) -> dict:
    """``python -m lbm_jax run cavity3d --n n --steps 4`` in a child process: its
    whole peak, and its baseline (the RSS once ``lbm_jax`` is imported)."""
    out = tempfile.mkdtemp(prefix="lbm_mem_cli_")
    code = (
        "import runpy, sys\n"
        "import lbm_jax, jax.numpy as jnp\n"
        "(jnp.zeros(8) + 1).block_until_ready()\n"
        "print('BASE', [int(l.split()[1]) * 1024 for l in open('/proc/self/status')"
        " if l.startswith('VmRSS:')][0], flush=True)\n"
        "sys.argv = ['lbm_jax'] + sys.argv[1:]\n"
        "try:\n"
        "    runpy.run_module('lbm_jax', run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    code = e.code\n"
        "else:\n"
        "    code = 0\n"
        "print('PEAK', [int(l.split()[1]) * 1024 for l in open('/proc/self/status')"
        " if l.startswith('VmHWM:')][0])\n"
        "sys.exit(code)\n"
    )
    args = ["run", "cavity3d", "--n", str(n), "--storage", storage, "--steps", "4"]
    args += ["--out", out, "--overwrite"]
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True
    )
    shutil.rmtree(out, ignore_errors=True)
    found = dict(
        line.split()[:2]
        for line in proc.stdout.splitlines()
        if line[:4] in ("BASE", "PEAK")
    )
    if proc.returncode != 0 or "PEAK" not in found:
        raise RuntimeError(f"cli run failed: {proc.stderr[-2000:]}")
    return {
        "operation": "cli_run",
        "baseline": int(found["BASE"]),
        "peak": int(found["PEAK"]),
        "args": args,
    }


def _in_subprocess(
    op: str,
    n: int,
    lattice: str,
    storage: str,
    streaming: str | None,
    timeout: float | None = None,
) -> dict:
    """One measurement in a fresh interpreter; a row with ``error`` if it fails."""
    cmd = [sys.executable, "-m", "lbm_jax.bench_memory", "--worker", op]
    cmd += ["--n", str(n), "--lattice", lattice, "--storage", storage]
    if streaming is not None:
        cmd += ["--streaming", streaming]
    env = dict(os.environ)
    env.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env=env, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {"operation": op, "error": f"timed out after {timeout} s"}
    if proc.returncode != 0:
        return {"operation": op, "error": proc.stderr[-3000:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


#: Operations whose memory depends on ``Simulation(streaming=...)``.
STREAMING_OPERATIONS = ("advance", "run", "checkpoint")


def streaming_modes() -> tuple[str | None, ...]:
    """The streaming schemes ``Simulation`` offers (``(None,)`` without the
    option: two buffers)."""
    import inspect

    from lbm_jax.sim._simulation import Simulation

    if "streaming" in inspect.signature(Simulation).parameters:
        return ("two-buffer", "inplace")
    return (None,)


def measure(
    n: int = 96,
    storages: Sequence[str] = ("fp32", "fp16s"),
    operations: Sequence[str] = OPERATIONS,
    *,
    lattice: str = "D3Q19",
    streaming: Sequence[str | None] | None = None,
    timeout: float | None = None,
) -> list[dict]:
    """Measure each operation for each storage, one fresh process each.

    Args:
        n: Cube side (``n^d`` cells).
        storages: Storage policies.
        operations: Names from :data:`OPERATIONS`.
        lattice: Velocity set.
        streaming: Schemes for the operations of :data:`STREAMING_OPERATIONS`
            (``"two-buffer"`` needs two population buffers, ``"inplace"`` one);
            default: every scheme ``Simulation`` offers. Other operations use
            the constructor's default.
        timeout: Seconds each measurement may take (``None``: no limit); one
            that fails or times out gives a row with ``error``.

    Returns:
        One dict per measurement: ``operation``, ``storage``, ``streaming``,
        ``n``, and in bytes ``baseline``, ``inputs``, ``needed`` (inputs plus
        output and scratch buffers), ``bound`` (baseline + needed), ``own``
        (what the call added), ``peak`` (baseline + inputs + own),
        ``cold_peak`` (the same for the first, compiling call); ``ratio``
        (peak / bound) and ``ok``.
    """
    unknown = sorted(set(operations) - set(OPERATIONS))
    if unknown:
        raise ValueError(
            f"unknown operations {unknown}; expected some of {OPERATIONS}."
        )
    modes = streaming_modes() if streaming is None else tuple(streaming)
    rows = []
    for storage in storages:
        for op in operations:
            for mode in modes if op in STREAMING_OPERATIONS else (None,):
                row = _in_subprocess(op, n, lattice, storage, mode, timeout)
                row.update(storage=storage, n=n, lattice=lattice, streaming=mode)
                if "bound" in row:
                    row["ratio"] = row["peak"] / row["bound"]
                    row["ok"] = within_bound(row)
                rows.append(row)
    return rows


def within_bound(row: dict) -> bool:
    """Whether a row's peak is at most :data:`TOLERANCE` above its bound.

    >>> bound = {"bound": 100}
    >>> within_bound({**bound, "peak": 110}), within_bound({**bound, "peak": 111})
    (True, False)
    """
    return row["peak"] <= (1 + TOLERANCE) * row["bound"]


def check(rows: Sequence[dict]) -> list[str]:
    """Messages for the rows whose peak exceeds the bound by more than
    :data:`TOLERANCE` (judged here from ``peak`` and ``bound``), or whose
    measurement failed."""
    out = []
    for r in rows:
        where = f"{r['operation']} ({r['storage']}, {r.get('streaming') or 'default'}"
        where += f", n={r['n']})"
        if "error" in r:
            out.append(f"{where}: failed: {r['error'].strip().splitlines()[-1]}")
        elif "bound" in r and not within_bound(r):
            out.append(
                f"{where}: peak {r['peak'] / 1e9:.3f} GB > {1 + TOLERANCE:.2f} x "
                f"bound {r['bound'] / 1e9:.3f} GB"
            )
    return out


def table(rows: Sequence[dict]) -> str:
    """A text table of the rows (GB = 1e9 bytes)."""
    lines = [
        f"{'operation':<18} {'storage':<8} {'streaming':<10} {'baseline':>9} "
        f"{'needed':>8} {'bound':>8} {'cold':>8} {'peak':>8} {'ratio':>6}  ok"
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['operation']:<18} {r['storage']:<8} ERROR")
            continue
        gb = {k: f"{r[k] / 1e9:.3f}" for k in ("baseline", "needed", "bound") if k in r}
        lines.append(
            f"{r['operation']:<18} {r['storage']:<8} {r.get('streaming') or '-':<10} "
            f"{gb.get('baseline', '-'):>9} "
            f"{gb.get('needed', '-'):>8} {gb.get('bound', '-'):>8} "
            f"{r.get('cold_peak', r['peak']) / 1e9:>8.3f} {r['peak'] / 1e9:>8.3f} "
            + (f"{r['ratio']:>6.3f}  {'yes' if r['ok'] else 'NO'}" if "ok" in r else "")
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line; see the module docstring."""
    parser = Parser(prog="python -m lbm_jax.bench_memory")
    parser.add_argument("--n", type=int, default=96, help="cube side (default 96)")
    parser.add_argument("--storage", default="fp32,fp16s")
    parser.add_argument("--lattice", default="D3Q19")
    parser.add_argument("--ops", default=",".join(OPERATIONS))
    parser.add_argument(
        "--streaming",
        default=None,
        help="comma-separated schemes for advance/run/checkpoint "
        "(default: every scheme Simulation offers)",
    )
    parser.add_argument("--json", default=None, help="write the rows to this file")
    parser.add_argument(
        "--timeout", type=float, default=None, help="seconds per measurement"
    )
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        if args.worker == "cli_run":
            row = _cli_run(args.n, args.storage)
        else:
            row = _worker(
                args.worker, args.n, args.lattice, args.storage, args.streaming
            )
        print(json.dumps(row))
        return 0
    rows = measure(
        args.n,
        args.storage.split(","),
        args.ops.split(","),
        lattice=args.lattice,
        streaming=None if args.streaming is None else args.streaming.split(","),
        timeout=args.timeout,
    )
    print(table(rows))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)
    failures = check(rows)
    for message in failures:
        print("FAIL", message, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
