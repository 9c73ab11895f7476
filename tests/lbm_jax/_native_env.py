"""Where the native CPU steps can be tested, and which free-surface step runs."""

from __future__ import annotations

import jax

from lbm_jax.step import _gpu, _native


def native_skip_reason() -> str | None:
    """Why the native-step tests cannot run here: not a CPU backend, or an
    environment without the native step (no compiler, another CPU, no usable
    cache). A compiler that fails on the source fails the tests instead (the
    reason is in the assertion messages)."""
    if jax.default_backend() != "cpu":
        return (
            f"the native step is a CPU kernel; the backend is {jax.default_backend()}"
        )
    why = _native.unavailable_reason()
    return None if why is None or "compiling with" in why else why


def auto_free_surface_kernel() -> str:
    """The step ``FreeSurface(backend="auto")`` runs on a covered configuration
    here: the GPU step on a GPU, the native step on a CPU that builds it."""
    if _gpu.available():
        return "gpu"
    return "native" if native_skip_reason() is None else "xla"
