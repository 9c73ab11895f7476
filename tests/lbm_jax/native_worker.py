"""One ``Simulation()`` in a fresh process, for the native step's fallback tests.

Run as ``python tests/lbm_jax/native_worker.py [CPU]``: builds a simulation the
native step covers (D3Q19 FP32/FP16S, ``backend="auto"``), advances it one step
and prints one JSON line: the kernel that ran, the :class:`NativeStepWarning`
messages, every other warning, and ``build-native``'s view. ``CPU`` replaces the
CPU-feature probe, e.g. ``aarch64`` or ``x86_64:sse2,avx`` (machine, flags), to
emulate another CPU. The environment (``CXX``, ``PATH``, ``HOME``,
``LBM_JAX_CACHE``) sets the scenario.
"""

from __future__ import annotations

import json
import sys
import warnings

import numpy as np


def main(argv: list[str]) -> None:
    from lbm_jax import NativeStepWarning, Simulation
    from lbm_jax.step import _native, _native_build

    if argv:
        machine, _, flags = argv[0].partition(":")
        probe = (machine, frozenset(flags.split(",")) if flags else None)
        _native_build.cpu_features = lambda: probe
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sim = Simulation("D3Q19", (4, 16, 16), tau=0.6, storage="fp16s")
        state = sim.advance(sim.init(u=np.full((3, 4, 16, 16), 0.02)), 1)
    native = [str(w.message) for w in caught if w.category is NativeStepWarning]
    other = [str(w.message) for w in caught if w.category is not NativeStepWarning]
    print(
        json.dumps(
            {
                "backend": sim.backend,
                "repr": repr(sim),
                "native_warnings": native,
                "other_warnings": other,
                "finite": bool(np.isfinite(np.asarray(state.f, np.float32)).all()),
                "reason": _native.unavailable_reason(),
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1:])
