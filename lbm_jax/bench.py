"""Benchmarks: solver throughput (MLUPs) and a STREAM-like memory bandwidth.

A lattice Boltzmann step is memory-bound: each cell loads and stores its Q
populations once, ``2 Q b`` bytes per cell and step for ``b``-byte storage
(152 B for D3Q19 in FP32, 76 B in 16-bit formats). The roofline throughput is
therefore ``bandwidth / (2 Q b)``, and :func:`bench` reports the measured MLUPs
next to that bound, with the bandwidth measured in the same process
(:func:`measure_bandwidth`) so that both numbers see the same machine load.

Timing follows the usual rules: compile and run once (warm-up), then time
``repeats`` runs with ``block_until_ready`` and report the median.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "DEFAULT_UPDATES",
    "FLOW",
    "FULL_PROBLEMS",
    "STREAM_KERNELS",
    "bench",
    "bench_all",
    "BenchRun",
    "format_table",
    "measure_bandwidth",
    "median_seconds",
    "steps_for",
    "stream_bandwidths",
    "taylor_green_velocity",
]


def median_seconds(fn: Callable[[], Any], repeats: int) -> float:
    """Median seconds of ``repeats`` timed calls of ``fn`` after one warm-up
    call, each ended by ``block_until_ready`` on its result."""
    fn()  # warm-up (and compilation for jitted callables)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


#: STREAM-like kernels of :func:`stream_bandwidths`.
STREAM_KERNELS = ("copy", "triad", "scale")

#: Passes of the ``scale`` kernel inside one compiled call (so the timing is the
#: device's, not the dispatch of one short call).
SCALE_PASSES = 20


@jax.jit(donate_argnums=0)
def _scale(x: jax.Array) -> jax.Array:
    """``x * (1 + 1e-7)``, ``SCALE_PASSES`` times over, in the donated buffer
    (each pass reads and writes the whole array on the default device)."""
    factor = jnp.float32(1.0000001)
    return jax.lax.fori_loop(0, SCALE_PASSES, lambda _, v: v * factor, x)


@jax.jit(donate_argnums=2)
def _triad(x: jax.Array, y: jax.Array, out: jax.Array) -> jax.Array:
    """``x + 3 y``, written into the donated buffer ``out`` (no fresh allocation)."""
    del out
    return x + jnp.float32(3.0) * y


def stream_bandwidths(
    *,
    size_mib: int = 128,
    repeats: int = 5,
    kernels: tuple[str, ...] = STREAM_KERNELS,
) -> dict[str, float]:
    """STREAM-like kernels on arrays far larger than cache, in GB/s (1e9 B/s).

    ``copy`` is ``b[:] = a`` in NumPy (host memory, one thread; 2 arrays moved),
    ``triad`` is ``a + s * b`` compiled by JAX into a donated output buffer (XLA
    may use every core; 3 arrays moved), ``scale`` multiplies a donated array in
    place on the default device, ``SCALE_PASSES`` passes in one compiled
    call (each pass reads and writes the array once: 2 arrays moved per pass;
    the figure an accelerator reaches, free of per-call dispatch). None
    allocates while timed, so page faults of fresh memory do not count against
    the bandwidth. Each figure is the median of ``repeats`` timed runs after a
    warm-up.

    Args:
        size_mib: Size of each array in MiB.
        repeats: Timed repetitions per kernel (>= 1).
        kernels: Which of :data:`STREAM_KERNELS` to run.

    Raises:
        ValueError: If ``size_mib`` or ``repeats`` is not positive, or for an
            unknown kernel.
    """
    if size_mib < 1 or repeats < 1:
        raise ValueError(
            f"size_mib and repeats must be >= 1, got {size_mib} and {repeats}."
        )
    unknown = [k for k in kernels if k not in STREAM_KERNELS]
    if unknown or not kernels:
        raise ValueError(
            f"kernels must name some of {STREAM_KERNELS}, got {tuple(kernels)!r}."
        )
    n = size_mib * (1 << 20) // 4
    a = np.full(n, 1.0, dtype=np.float32)
    nbytes = float(a.nbytes)
    out = {}
    if "copy" in kernels:
        b = np.empty_like(a)
        t_copy = median_seconds(lambda: np.copyto(b, a), repeats)
        out["copy"] = 2 * nbytes / t_copy / 1e9
    if "triad" in kernels:
        xa, ya = jnp.asarray(a), jnp.asarray(a)
        holder = [jnp.zeros_like(xa)]

        def triad() -> jax.Array:
            holder[0] = _triad(xa, ya, holder[0])
            return holder[0]

        out["triad"] = 3 * nbytes / median_seconds(triad, repeats) / 1e9
    if "scale" in kernels:
        holder = [jnp.asarray(a)]

        def scale() -> jax.Array:
            holder[0] = _scale(holder[0])
            return holder[0]

        seconds = median_seconds(scale, repeats)
        out["scale"] = 2 * SCALE_PASSES * nbytes / seconds / 1e9
    return out


#: Array size of the bandwidth measurement on accelerators (MiB): far beyond
#: their last-level caches (an H200's L2 holds 60 MiB).
ACCELERATOR_MIB = 1024


def measure_bandwidth(*, size_mib: int = 128, repeats: int = 5) -> float:
    """Sustained memory bandwidth in GB/s of the memory the solver uses.

    On a CPU the best of the STREAM-like ``copy``, ``triad`` and ``scale``
    kernels; on an accelerator the device's own ``scale`` kernel on arrays of at
    least ``ACCELERATOR_MIB`` MiB (host copies say nothing about device
    memory). See :func:`stream_bandwidths`.
    """
    if jax.default_backend() == "cpu":
        bw = stream_bandwidths(size_mib=size_mib, repeats=repeats)
    else:
        bw = stream_bandwidths(
            size_mib=max(size_mib, ACCELERATOR_MIB), repeats=repeats, kernels=("scale",)
        )
    return max(bw.values())


#: Cell updates per timed repeat when no step count is given.
DEFAULT_UPDATES = 2e7


def steps_for(cells: int, updates: float = DEFAULT_UPDATES) -> int:
    """Steps per timed repeat for about ``updates`` cell updates (at least 4).

    >>> steps_for(128**3)
    10
    """
    return max(4, round(updates / cells))


#: What :func:`bench` times: a flow, not a fluid at rest (whose DDF-shifted
#: populations are all zero, which flatters any codec).
FLOW = "Taylor-Green vortices, U0 = 0.05 (lattice units), periodic box"


def taylor_green_velocity(d: int, n: int, u0: float = 0.05) -> np.ndarray:
    """Taylor-Green velocity ``(d, n, ..., n)`` with one vortex pair per side.

    2-D: ``u = -U0 cos(kx) sin(ky)``, ``v = U0 sin(kx) cos(ky)``; 3-D:
    ``u = U0 sin(kx) cos(ky) cos(kz)``, ``v = -U0 cos(kx) sin(ky) cos(kz)``,
    ``w = 0``, with ``k = 2 pi / n``.

    >>> taylor_green_velocity(3, 8).shape
    (3, 8, 8, 8)
    """
    k = 2.0 * math.pi / n
    x = [k * np.arange(n, dtype=np.float64)] * d
    grids = np.meshgrid(*x, indexing="ij", sparse=True)
    if d == 2:
        gx, gy = grids
        u = [-np.cos(gx) * np.sin(gy), np.sin(gx) * np.cos(gy)]
    else:
        gx, gy, gz = grids
        u = [
            np.sin(gx) * np.cos(gy) * np.cos(gz),
            -np.cos(gx) * np.sin(gy) * np.cos(gz),
            np.zeros((1, 1, 1)),
        ]
    return u0 * np.stack(np.broadcast_arrays(*u))


def bench(
    lattice: str = "D3Q19",
    n: int = 128,
    storage: str = "fp32",
    *,
    steps: int | None = None,
    repeats: int = 5,
    shift: bool = True,
    collision: str = "bgk",
    bandwidth: float | None = None,
    devices: int | tuple[int, ...] | None = None,
    backend: str = "auto",
    streaming: str = "auto",
) -> dict[str, Any]:
    """Measure MLUPs of the compiled step on a periodic ``n^D`` box with a flow.

    The box holds decaying Taylor-Green vortices (:data:`FLOW`), so the stored
    populations are the values of a real flow rather than the zeros of a fluid at
    rest.

    The simulation is built and compiled first (one untimed run of ``steps``
    steps), then ``repeats`` runs of ``steps`` steps are timed with
    ``block_until_ready``; the median gives the throughput. The memory bandwidth
    is measured in the same process (unless given) to put the figure against the
    roofline ``bandwidth / bytes_per_cell``.

    Args:
        lattice: ``"D2Q9"``, ``"D3Q19"`` or ``"D3Q27"``.
        n: Cells per side.
        storage: Storage policy name.
        steps: Steps per timed run; default about 2e7 cell updates.
        repeats: Timed runs (>= 1).
        shift: DDF-shifting.
        collision: ``"bgk"`` or ``"trt"``.
        bandwidth: Memory bandwidth in GB/s to use for the roofline; measured with
            :func:`measure_bandwidth` when ``None``.
        devices: The domain decomposition (see :class:`lbm_jax.Simulation`): an
            int splits x over that many devices, a tuple such as ``(2, 1, 1)``
            gives the sub-domains per axis; ``None`` splits x over every local
            device when ``n`` is divisible by their number, else uses one. On a
            CPU the command line starts with one host device per core.
        backend: The step's backend (see :class:`lbm_jax.Simulation`):
            ``"auto"``, ``"native"``, ``"gpu"`` or ``"xla"``.
        streaming: ``"auto"``, ``"inplace"`` or ``"two-buffer"`` (see
            :class:`lbm_jax.Simulation`).

    Returns:
        A JSON-ready dict of ``lattice``, ``n``, ``cells``, ``storage``, ``shift``,
        ``collision``, ``steps``, ``repeats``, ``seconds`` (median per run),
        ``mlups``, ``bytes_per_cell`` (populations loaded and stored per cell and
        step), ``bandwidth_gbs``, ``roofline_mlups``, ``roofline_fraction``,
        ``platform`` (JAX's default backend), ``step_backend`` (the step's
        backend that ran), ``devices``,
        ``decomposition`` (sub-domains per axis) and
        ``halo_bytes`` (ghost-layer bytes all devices send per step, whole layers
        of ``q`` values in the storage format).

    Raises:
        ValueError: For an unknown lattice/storage, ``n < 4``, ``repeats < 1`` or
            a ``bandwidth`` that is not positive and finite (before anything is
            compiled).
        TypeError: For a ``bandwidth`` that is not a number.
    """
    lat, policy, steps = _checked(lattice, n, storage, shift, steps, repeats)
    if bandwidth is not None:
        if isinstance(bandwidth, bool) or not isinstance(
            bandwidth, int | float | np.integer | np.floating
        ):
            raise TypeError(
                f"bandwidth must be a number of GB/s or None, got {bandwidth!r} of "
                f"type {type(bandwidth).__name__}; pass e.g. bandwidth=50.0, or "
                "None to measure it."
            )
        if not (math.isfinite(bandwidth) and bandwidth > 0):
            raise ValueError(
                f"bandwidth must be positive and finite (GB/s) or None, got "
                f"{bandwidth!r}; pass the machine's memory bandwidth, e.g. "
                "bandwidth=50.0, or None to measure it."
            )
        bandwidth = float(bandwidth)
    run = BenchRun(
        lat,
        n,
        policy,
        steps=steps,
        collision=collision,
        devices=devices,
        backend=backend,
        streaming=streaming,
    )
    if bandwidth is None:
        bandwidth = measure_bandwidth()
    return run.result(run.time(repeats), repeats, bandwidth)


def _checked(lattice, n, storage, shift, steps, repeats, updates=DEFAULT_UPDATES):
    """Validated ``(lattice, storage policy, steps)`` of one benchmark run, its
    box checked against the memory (as a case's grid) before any work."""
    from lbm_jax.cases._common import check_grid_memory
    from lbm_jax.core._lattice import get_lattice
    from lbm_jax.core._storage import get_storage

    lat = get_lattice(lattice)
    policy = get_storage(storage, shift=shift)
    policy.check_enabled()
    for name, value, minimum in (("n", n, 4), ("repeats", repeats, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}.")
    check_grid_memory((n,) * lat.d, lat.name, policy, n=n)
    if steps is None:
        steps = steps_for(n**lat.d, updates)
    elif isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}.")
    return lat, policy, steps


class BenchRun:
    """One benchmark configuration, built, compiled and warmed up once.

    :func:`bench` times it once; :func:`bench_all` times it in every round, so
    that rounds compare storage policies without recompiling.
    """

    def __init__(
        self, lat, n, policy, *, steps, collision, devices, backend, streaming="auto"
    ) -> None:
        from lbm_jax.sim._simulation import Simulation

        if devices is None:  # in-place streaming runs on one device
            available = jax.local_device_count()
            split = n % available == 0 and str(streaming).lower() != "inplace"
            devices = available if split else 1
        self.sim = Simulation(
            lat,
            (n,) * lat.d,
            tau=0.6,
            storage=policy,
            collision=collision,
            devices=devices,
            backend=backend,
            streaming=streaming,
        )
        self.lat, self.n, self.policy = lat, n, policy
        self.steps, self.collision = steps, collision
        state = self.sim.init(1.0, taylor_green_velocity(lat.d, n))
        self.state = jax.block_until_ready(self.sim.advance(state, steps))  # warm-up

    def time(self, repeats: int) -> float:
        """Median seconds of ``repeats`` timed runs of ``steps`` steps."""
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            self.state = jax.block_until_ready(self.sim.advance(self.state, self.steps))
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    def result(self, seconds: float, repeats: int, bandwidth: float) -> dict[str, Any]:
        """The JSON-ready result dict of :func:`bench`."""
        from lbm_jax.sim._decomp import halo_bytes

        splits = self.sim.decomposition
        local = tuple(n // s for n, s in zip(self.sim.shape, splits, strict=True))
        cells = self.n**self.lat.d
        mlups = cells * self.steps / seconds / 1e6
        bytes_per_cell = 2 * self.lat.q * self.policy.bytes_per_value
        roofline = bandwidth * 1e9 / bytes_per_cell / 1e6
        return {
            "lattice": self.lat.name,
            "n": self.n,
            "cells": cells,
            "storage": self.policy.name,
            "shift": self.policy.shift,
            "collision": self.collision,
            "steps": self.steps,
            "repeats": repeats,
            "seconds": seconds,
            "mlups": mlups,
            "bytes_per_cell": bytes_per_cell,
            "bandwidth_gbs": bandwidth,
            "roofline_mlups": roofline,
            "roofline_fraction": mlups / roofline,
            "flow": FLOW,
            "platform": jax.default_backend(),
            "step_backend": self.sim.backend,
            "streaming": self.sim.streaming.value,
            "devices": self.sim.devices,
            "decomposition": list(self.sim.decomposition),
            "halo_bytes": self.sim.devices
            * halo_bytes(local, splits, self.lat.q, self.policy.bytes_per_value),
        }


#: Problems of the full benchmark: (lattice, n).
FULL_PROBLEMS = (("D2Q9", 1024), ("D3Q19", 128))


def bench_all(
    *,
    problems: tuple[tuple[str, int], ...] = FULL_PROBLEMS,
    storages: tuple[str, ...] | None = None,
    steps: int | None = None,
    updates: float = DEFAULT_UPDATES,
    repeats: int = 5,
    rounds: int = 1,
    collision: str = "bgk",
    bandwidth_mib: int = 128,
    progress: Callable[[Any], Any] | None = None,
    devices: int | tuple[int, ...] | None = None,
    backend: str = "auto",
    streaming: str = "auto",
) -> dict[str, Any]:
    """:func:`bench` for every storage policy on each problem, one bandwidth figure.

    The whole sweep runs ``rounds`` times, interleaved, so that every storage
    policy sees the same machine conditions; each result is the round with the
    median MLUPs, with the per-round figures in ``mlups_rounds`` and, where the
    problem includes FP32/FP32, the per-round ratio to it in ``vs_fp32_rounds`` and
    their median in ``vs_fp32``. The bandwidth is measured once before and once
    after the runs (arrays of ``bandwidth_mib`` MiB); the larger value is used for
    every roofline, and both are reported.

    Args:
        problems: ``(lattice, n)`` pairs.
        storages: Storage policy names; every policy (those needing x64 only
            when it is enabled) when ``None``.
        steps: Steps per timed repeat on every problem; when ``None``, each
            problem runs :func:`steps_for` its cell count and ``updates``.
        updates: Cell updates per timed repeat when ``steps`` is ``None``.
        repeats: Timed repeats per run (the median is the run's figure).
        rounds: Interleaved rounds of the whole sweep.
        collision: ``"bgk"`` or ``"trt"``, for every run.
        bandwidth_mib: Array size of the bandwidth measurement (MiB; larger
            than the caches for a meaningful roofline).
        progress: Optional wrapper of the list of runs (e.g. a progress bar).
        devices: The domain decomposition of every run (see :func:`bench`).
        backend: The step's backend in every run (see :func:`bench`).
        streaming: In place or two buffers, in every run (see :func:`bench`).

    Returns:
        A dict of ``bandwidth_gbs`` (a float), ``bandwidth_before``,
        ``bandwidth_after``, ``rounds`` (an int) and ``results`` (bench dicts).
    """
    from lbm_jax.core._collision import parse_collision
    from lbm_jax.core._lattice import get_lattice
    from lbm_jax.core._storage import get_storage, list_storages
    from lbm_jax.core._validation import check_devices

    names = (
        list_storages()
        if storages is None
        else tuple(get_storage(s).name for s in storages)
    )
    x64 = bool(jax.config.read("jax_enable_x64"))
    names = tuple(s for s in names if x64 or not get_storage(s).needs_x64)
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive integer, got {rounds!r}.")
    if isinstance(updates, bool) or not (
        isinstance(updates, int | float) and updates > 0
    ):
        raise ValueError(f"updates must be a positive number, got {updates!r}.")
    parse_collision(collision, tau=0.6, magic=3.0 / 16.0)  # refused before timing
    configs = {
        (lat, n, s): _checked(lat, n, s, True, steps, repeats, updates)
        for lat, n in problems
        for s in names
    }
    for lat, n in problems:  # refused before measuring
        check_devices(devices, (n,) * get_lattice(lat).d)
    before = measure_bandwidth(size_mib=bandwidth_mib)
    prepared: dict[tuple[str, int, str], BenchRun] = {}
    runs: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    plan = [key for _ in range(rounds) for key in configs]
    for key in plan if progress is None else progress(plan):
        if key not in prepared:  # built, compiled and warmed up in the first round
            lat, policy, n_steps = configs[key]
            prepared[key] = BenchRun(
                lat,
                key[1],
                policy,
                steps=n_steps,
                collision=collision,
                devices=devices,
                backend=backend,
                streaming=streaming,
            )
        run = prepared[key]
        runs.setdefault(key, []).append(run.result(run.time(repeats), repeats, before))
    after = measure_bandwidth(size_mib=bandwidth_mib)
    results = []
    for (lat, n, _), per_round in runs.items():
        r = dict(sorted(per_round, key=lambda x: x["mlups"])[len(per_round) // 2])
        r["mlups_rounds"] = [x["mlups"] for x in per_round]
        ref = runs.get((lat, n, "FP32/FP32"))
        if ref is not None:
            ratios = [
                x["mlups"] / y["mlups"] for x, y in zip(per_round, ref, strict=True)
            ]
            r["vs_fp32_rounds"] = ratios
            r["vs_fp32"] = statistics.median(ratios)
        results.append(r)
    bandwidth = max(before, after)
    for r in results:
        r["bandwidth_gbs"] = bandwidth
        r["roofline_mlups"] = bandwidth * 1e9 / r["bytes_per_cell"] / 1e6
        r["roofline_fraction"] = r["mlups"] / r["roofline_mlups"]
    return {
        "bandwidth_gbs": bandwidth,
        "bandwidth_before": before,
        "bandwidth_after": after,
        "rounds": rounds,
        "results": results,
    }


def format_table(results: list[dict[str, Any]]) -> str:
    """Markdown table of benchmark results."""
    lines = [
        "| lattice | n | storage | step | MLUPs | B/cell | GB/s | roofline MLUPs "
        "| fraction | vs FP32 |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        ratio = f"{r['vs_fp32']:.2f}" if "vs_fp32" in r else "-"
        lines.append(
            f"| {r['lattice']} | {r['n']} | {r['storage']} | "
            f"{r.get('step_backend', '-')} | "
            f"{r['mlups']:.1f} | "
            f"{r['bytes_per_cell']} | {r['bandwidth_gbs']:.1f} | "
            f"{r['roofline_mlups']:.1f} | {r['roofline_fraction']:.2f} | {ratio} |"
        )
    flows = sorted({r["flow"] for r in results if "flow" in r})
    if flows:
        lines += ["", "Timed flow: " + "; ".join(flows) + "."]
    return "\n".join(lines)
