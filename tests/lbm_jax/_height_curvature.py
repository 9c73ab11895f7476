"""The free-surface model with the height-function curvature, for tests that
measure it inside the model (its XLA step: the native step computes the
smoothed curvature)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import jax
import pytest

import lbm_jax.free_surface._xla_step as xla_step
import lbm_jax.step._native as native
from lbm_jax.free_surface import curvature


@contextlib.contextmanager
def height_curvature() -> Iterator[None]:
    """Within the block, free-surface models built and stepped use
    ``curvature(phi, method="height")`` in the XLA step; compiled steps are
    traced afresh (JAX's caches are cleared on entry and exit)."""
    jax.clear_caches()
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(
                xla_step, "curvature", functools.partial(curvature, method="height")
            )
            mp.setattr(native, "covered_free_surface", lambda *a: "height test")
            yield
    finally:
        jax.clear_caches()
