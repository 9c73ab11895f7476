"""The step backends' one vocabulary and one choice (lbm_jax.step)."""

import subprocess
import sys

import pytest

import lbm_jax
from lbm_jax.free_surface import FreeSurface
from lbm_jax.step import BACKENDS, Backend, Candidate, choose, parse_backend
from lbm_jax.step._native import MIN_PLANE_CELLS


def _never() -> str:
    raise AssertionError("unavailable() asked of a configuration it does not cover")


def test_the_vocabulary_is_one_enum():
    assert BACKENDS == ("auto", "xla", "native", "gpu")
    assert parse_backend(" Native ") is Backend.NATIVE
    assert parse_backend(Backend.GPU) is Backend.GPU


def test_an_unknown_backend_names_the_closest():
    with pytest.raises(ValueError, match=r"\(did you mean 'native'\?\)"):
        parse_backend("nativ")
    with pytest.raises(TypeError, match="backend must be a str"):
        parse_backend(3)


def test_auto_takes_the_first_that_covers_and_runs_here():
    fast = Candidate(Backend.GPU, None, lambda: None)
    native = Candidate(Backend.NATIVE, None, lambda: None)
    assert choose("auto", [fast, native], "x") == (Backend.GPU, None)
    uncovered = Candidate(Backend.GPU, "no D3Q15", _never)
    chosen = choose("auto", [uncovered, native], "x")
    assert chosen.backend is Backend.NATIVE and chosen.why_not_faster is None


def test_auto_falls_back_with_every_reason_and_reports_unavailability():
    told = []
    gpu_elsewhere = Candidate(Backend.GPU, None, lambda: "not a GPU", here=False)
    broken = Candidate(Backend.NATIVE, None, lambda: "no compiler", told.append)
    chosen = choose("auto", [gpu_elsewhere, broken], "simulation")
    assert chosen.backend is Backend.XLA
    assert chosen.why_not_faster == "no compiler"
    assert told == ["no compiler"]


def test_a_named_backend_runs_or_says_why_not():
    native = Candidate(Backend.NATIVE, "needs BGK collision (got TRT)", _never)
    with pytest.raises(ValueError, match=r"backend='native' is not available for"):
        choose("native", [native], "simulation")
    with pytest.raises(ValueError, match="there is no gpu step for a free"):
        choose("gpu", [native], "free surface")
    assert choose("xla", [native], "simulation").backend is Backend.XLA


def test_simulation_says_which_backend_runs_and_why_no_faster_one():
    sim = lbm_jax.Simulation("D2Q9", (16, 16), tau=0.8, collision="trt")
    assert sim.backend == "xla"
    assert "BGK collision (got TRT)" in sim.backend_reason
    assert f"at least {MIN_PLANE_CELLS} cells per x-plane (got 16)" in (
        sim.backend_reason
    )
    assert sim.backends == {
        "step": "xla",
        "step_force": "xla",
        "advance": "xla",
        "derivative": "xla",
    }


def test_a_per_call_force_on_the_native_step_is_reported():
    sim = lbm_jax.Simulation("D3Q19", (8, 16, 16), tau=0.6, backend="native")
    assert sim.backends["step"] == "native"
    # the native step runs the XLA step for a step given a force per call
    assert sim.backends["step_force"] == "xla"
    inplace = lbm_jax.Simulation(
        "D3Q19", (8, 16, 16), tau=0.6, backend="native", streaming="inplace"
    )
    assert inplace.backends["advance"] == "xla"


def test_kernel_is_a_deprecated_alias_of_backend():
    with pytest.warns(DeprecationWarning, match="kernel= is deprecated"):
        sim = lbm_jax.Simulation("D2Q9", (8, 8), tau=0.8, kernel="xla")
    assert sim.backend == "xla"
    with pytest.warns(DeprecationWarning, match="Simulation.kernel is deprecated"):
        assert sim.kernel == "xla"
    with pytest.raises(TypeError, match="give the step's backend once"):
        lbm_jax.Simulation("D2Q9", (8, 8), tau=0.8, kernel="xla", backend="xla")
    with pytest.warns(DeprecationWarning, match="kernel= is deprecated"):
        fs = FreeSurface(sim, kernel="xla")
    with pytest.warns(DeprecationWarning, match="FreeSurface.kernel is deprecated"):
        assert fs.kernel == "xla"


def test_the_free_surface_asks_the_same_rule():
    sim = lbm_jax.Simulation("D2Q9", (16, 16), tau=0.8, storage="posit16")
    fs = FreeSurface(sim)
    assert fs.backend == "xla" and "storage" in fs.backend_reason
    with pytest.raises(ValueError, match="backend='native' is not available for"):
        FreeSurface(sim, backend="native")


def test_importing_the_package_leaves_the_warning_filters_alone():
    # (third-party imports install filters of their own; none may be ours)
    code = (
        "import warnings, lbm_jax, lbm_jax.step._gpu, lbm_jax.free_surface; "
        "ours = [f for f in warnings.filters if 'Pallas' in str(f[1])]; "
        "assert not ours, ours"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_benchmarks_load_when_first_used():
    code = (
        "import sys, lbm_jax; "
        "assert not [m for m in sys.modules if m.startswith('lbm_jax.bench')]; "
        "assert callable(lbm_jax.bench.bench); "
        "from lbm_jax import bench; assert bench is sys.modules['lbm_jax.bench']; "
        "assert not hasattr(lbm_jax, 'benchmark')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_free_surface_asks_for_what_its_simulation_was_asked_for():
    sim = lbm_jax.Simulation("D2Q9", (16, 16), tau=0.8, backend="xla")
    assert sim.backend_requested == "xla"
    assert FreeSurface(sim).backend == "xla"
    assert lbm_jax.Simulation("D2Q9", (16, 16), tau=0.8).backend_requested == "auto"
