"""Throughput benchmark (MLUPs) and a STREAM-like memory-bandwidth measurement.

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

import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["bench", "bench_all", "measure_bandwidth", "stream_bandwidths"]


def _median_seconds(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm-up (and compilation for jitted callables)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def stream_bandwidths(*, size_mib: int = 128, repeats: int = 5) -> dict[str, float]:
    """STREAM-like kernels on arrays far larger than cache, in GB/s (1e9 B/s).

    ``copy`` is ``b[:] = a`` in NumPy (one thread; 2 arrays moved), ``triad`` is
    ``a + s * b`` compiled by JAX (XLA may use every core; 3 arrays moved). Each
    figure is the median of ``repeats`` timed runs after a warm-up.

    Args:
        size_mib: Size of each array in MiB.
        repeats: Timed repetitions per kernel (>= 1).

    Raises:
        ValueError: If ``size_mib`` or ``repeats`` is not positive.
    """
    if size_mib < 1 or repeats < 1:
        raise ValueError(
            f"size_mib and repeats must be >= 1, got {size_mib} and {repeats}."
        )
    n = size_mib * (1 << 20) // 4
    a = np.full(n, 1.0, dtype=np.float32)
    b = np.empty_like(a)
    t_copy = _median_seconds(lambda: np.copyto(b, a), repeats)

    triad = jax.jit(lambda x, y: x + jnp.float32(3.0) * y)
    xa = jnp.asarray(a)
    ya = jnp.asarray(b)
    t_triad = _median_seconds(lambda: triad(xa, ya), repeats)
    nbytes = float(a.nbytes)
    return {"copy": 2 * nbytes / t_copy / 1e9, "triad": 3 * nbytes / t_triad / 1e9}


def measure_bandwidth(*, size_mib: int = 128, repeats: int = 5) -> float:
    """Sustained memory bandwidth in GB/s: the better of STREAM copy and triad.

    See :func:`stream_bandwidths` for the kernels.
    """
    bw = stream_bandwidths(size_mib=size_mib, repeats=repeats)
    return max(bw.values())
