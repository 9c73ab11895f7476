"""Invalid input is refused on the host, naming the argument, before compiling."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

import lbm_jax
from lbm_jax.__main__ import main
from lbm_jax.bench import bench


@pytest.fixture
def sim() -> lbm_jax.Simulation:
    return lbm_jax.Simulation("D2Q9", (16, 8), tau=0.8)


@pytest.mark.parametrize(
    ("other", "what"),
    [
        ({"shape": (8, 8)}, "shape"),
        ({"shape": (16, 8), "storage": "fp16s"}, "dtype"),
    ],
)
@pytest.mark.parametrize(
    "read",
    [
        lambda s, st: lbm_jax.density(s, st),
        lambda s, st: lbm_jax.velocity(s, st),
        lambda s, st: s.populations(st),
        lambda s, st: s.healthy(st),
        lambda s, st: s.step(st),
    ],
    ids=["density", "velocity", "populations", "healthy", "step"],
)
def test_foreign_state_is_refused(sim, other, what, read):
    foreign = lbm_jax.Simulation("D2Q9", tau=0.8, **other).init()
    with pytest.raises(ValueError, match=rf"state.*{what}.*(?s:.*)Simulation"):
        read(sim, foreign)


def test_own_state_reads_inside_jit(sim):
    rho = jax.jit(lambda st: lbm_jax.density(sim, st))(sim.init(rho=1.25))
    assert rho.shape == sim.shape
    np.testing.assert_allclose(np.asarray(rho), 1.25, rtol=1e-6)
    assert bool(jax.jit(sim.healthy)(sim.init()))


@pytest.mark.parametrize("bandwidth", [0, 0.0, -3.0, math.inf, math.nan])
def test_bench_refuses_bad_bandwidth(bandwidth, monkeypatch):
    def no_simulation(*args, **kwargs):
        raise AssertionError("a simulation was built before validation")

    monkeypatch.setattr(lbm_jax.Simulation, "__init__", no_simulation)
    with pytest.raises(ValueError, match=r"bandwidth.*positive.*finite.*None"):
        bench("D2Q9", 8, steps=1, repeats=1, bandwidth=bandwidth)


def test_bench_refuses_non_numeric_bandwidth():
    with pytest.raises(TypeError, match=r"bandwidth.*'fast'"):
        bench("D2Q9", 8, steps=1, repeats=1, bandwidth="fast")


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        ({"shape": None}, TypeError, "shape"),
        ({"shape": "ab"}, TypeError, "shape"),
        ({"shape": (8, 8), "magic": "x"}, TypeError, "magic"),
        ({"shape": (8, 8), "magic": "x", "collision": "trt"}, TypeError, "magic"),
        ({"shape": (8, 8), "magic": -1.0, "collision": "trt"}, ValueError, "magic"),
    ],
)
def test_simulation_messages_name_the_argument(kwargs, error, name):
    with pytest.raises(error, match=rf"^{name}\b.*got"):
        lbm_jax.Simulation("D2Q9", tau=0.8, **kwargs)


@pytest.mark.parametrize("rho", ["a", [1.0, "b"], None])
def test_init_message_names_rho(sim, rho):
    with pytest.raises(TypeError, match=r"^rho\b.*got"):
        sim.init(rho=rho)


def test_get_storage_keeps_the_policy_shift():
    unshifted = lbm_jax.get_storage("fp16s", shift=False)
    assert lbm_jax.get_storage(unshifted).shift is False
    assert lbm_jax.get_storage(unshifted, shift=True).shift is True
    assert lbm_jax.get_storage("fp16s").shift is True
    sim = lbm_jax.Simulation("D2Q9", (8, 8), tau=0.8, storage=unshifted)
    assert sim.storage.shift is False
    sim = lbm_jax.Simulation("D2Q9", (8, 8), tau=0.8, storage=unshifted, shift=True)
    assert sim.storage.shift is True


def test_run_refuses_an_out_dir_under_a_file(tmp_path, capsys, monkeypatch):
    import lbm_jax.cases as cases

    def no_run(*args, **kwargs):
        raise AssertionError("the case ran before --out was checked")

    monkeypatch.setattr(cases, "run_case", no_run)
    blocker = tmp_path / "some_file"
    blocker.write_text("")
    argv = ["run", "poiseuille", "--steps", "10", "--out", str(blocker / "out")]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "--out" in capsys.readouterr().err


def test_run_creates_out_before_the_run_and_refuses_one_it_cannot(
    tmp_path, capsys, monkeypatch
):
    import lbm_jax.cases as cases

    def no_run(*args, **kwargs):
        raise AssertionError("the case ran before --out was created")

    monkeypatch.setattr(cases, "run_case", no_run)
    # an existing, writable ancestor (as root, /proc passes os.access) under which
    # no folder can be made: refused before anything runs
    argv = ["run", "cavity", "--n", "16", "--steps", "2", "--out", "/proc/x/y"]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--out '/proc/x/y' cannot be created" in err
    assert "(python -m lbm_jax run --help for usage)" in err  # the subcommand's
    made = tmp_path / "a" / "b"
    with pytest.raises(AssertionError, match="ran before"):
        main(["run", "cavity", "--n", "16", "--steps", "2", "--out", str(made)])
    assert made.is_dir()  # created before the run started


def test_a_grid_beyond_the_memory_is_refused_with_the_bytes_per_cell(
    capsys, monkeypatch
):
    from lbm_jax.cases import _common, prepare_case

    with pytest.raises(SystemExit) as exc:  # 1e10 cells: a terabyte
        main(["run", "cavity", "--n", "100000", "--out", "unused"])
    assert exc.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "at 109 bytes per cell (D2Q9, FP32/FP32 storage)" in err
    assert "Lower --n" in err
    # the threshold itself, on both sides: D2Q9 FP32 128^2 needs 130^2 * 109 B
    need = 130 * 130 * 109
    for free, refused in ((need - 1, True), (need, False)):
        monkeypatch.setattr(_common, "available_memory", lambda f=free: (f, "test"))
        setup = prepare_case("cavity", n=128)
        try:
            _common.check_memory(setup, floor=0)
        except ValueError as err:
            assert refused and "109 bytes per cell" in str(err), err
        else:
            assert not refused
