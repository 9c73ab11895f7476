"""Shared pytest configuration.

Every test runs with JAX's strict dtype promotion and rank promotion set to "raise",
so an accidental float64/float32 or rank mix in library code fails loudly. Tests that
exercise third-party code which promotes internally (optax, flax) opt out with
``@pytest.mark.standard_promotion``. 64-bit types are off by default, as in JAX; a
test that needs them takes the ``x64`` fixture, which enables them only for itself.
"""

from __future__ import annotations

import os

# Two host devices let sharded code paths run on a CPU-only machine. Must be set
# before JAX initialises its backends.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
# The test workers share one accelerator where there is one: none of them takes
# most of its memory up front.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

# One compilation cache for the whole run, its worker processes and the processes
# tests start: a program that another test builds again from a new closure (the
# same simulation, the same train step) is compiled once. The folder is new for
# each run and removed after it (nothing carries over between runs); the first
# process to load this file makes it and the workers inherit it.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _CACHE = tempfile.mkdtemp(prefix="lbm_jax_tests_compiled_")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _CACHE
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)

import jax  # noqa: E402
import pytest  # noqa: E402

_ROOT = Path(__file__).resolve().parent.parent
# Tests whose results depend on the backend (number formats, population storage,
# the LBM step, loss scaling, Taylor-Green, the native CPU step and the compiled
# fused GPU step, each of which skips where its device is missing): marked
# ``backend``; ``pytest -m "backend and not slow"`` is the selection to run on a
# GPU (docs/getting_started.md, "On a GPU").
BACKEND_SENSITIVE = (
    "tests/mpjax/formats/",
    "tests/mpjax/test_loss_scaling",  # and test_loss_scaling_composition.py
    "tests/lbm_jax/test_storage.py",
    "tests/lbm_jax/test_step.py",
    "tests/lbm_jax/test_taylor_green.py",
    "tests/lbm_jax/test_native.py",
    "tests/lbm_jax/test_native_fallback.py",
    "tests/lbm_jax/test_gpu_codecs.py",
)


# The test run is spread over worker processes (pyproject: ``-n 2 --dist
# loadgroup``) one group at a time: a test file is a group, so its module-scoped
# fixtures and compiled programs are built once; the pipeline tests are one group,
# since they share the session's notebook runs (tests/experiments/conftest.py).
SHARED_SESSION = ("tests/experiments/",)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(str(item.fspath)).resolve()
        if not path.is_relative_to(_ROOT):
            continue
        name = path.relative_to(_ROOT).as_posix()
        if name.startswith(BACKEND_SENSITIVE):
            item.add_marker(pytest.mark.backend)
        group = next((p for p in SHARED_SESSION if name.startswith(p)), name)
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(autouse=True)
def _strict_promotion(request):
    if request.node.get_closest_marker("standard_promotion") is not None:
        with jax.numpy_rank_promotion("raise"):
            yield
        return
    with jax.numpy_dtype_promotion("strict"), jax.numpy_rank_promotion("raise"):
        yield


@pytest.fixture
def x64():
    """Enable 64-bit types for the duration of one test."""
    with jax.enable_x64(True):
        yield
