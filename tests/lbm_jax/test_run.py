"""The run driver: equivalence with advance, callbacks, restart, compile reuse."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lbm_jax
from lbm_jax import LBMState, Simulation, run


@pytest.fixture(scope="module")
def sim():
    return Simulation("D2Q9", (16, 12), tau=0.7, storage="fp16s", collision="trt")


def _initial(sim):
    rng = np.random.default_rng(0)
    return sim.init(
        1 + 0.01 * rng.standard_normal(sim.shape),
        0.02 * rng.standard_normal((2, *sim.shape)),
    )


def test_run_matches_advance_bit_for_bit(sim):
    ran = run(sim, _initial(sim), 37, check_every=10)
    advanced = sim.advance(_initial(sim), 37)
    assert int(ran.t) == 37
    chex.assert_trees_all_equal(ran, advanced)


def test_run_callbacks_at_every_interval(sim):
    seen = []

    def record(state):
        assert isinstance(state, LBMState)
        seen.append((int(state.t), float(lbm_jax.density(sim, state).mean())))

    start = sim.advance(_initial(sim), 3)
    final = run(sim, start, 25, check_every=4, every=10, callback=record)
    assert [t for t, _ in seen] == [13, 23]
    assert int(final.t) == 28
    assert all(abs(m - 1) < 1e-2 for _, m in seen)
    chex.assert_trees_all_equal(final, sim.advance(_initial(sim), 28))


def test_run_progress_bar_and_zero_steps(sim, capsys):
    state = run(sim, _initial(sim), 30, progress=True)
    assert int(state.t) == 30
    assert "30/30" in capsys.readouterr().err
    same = run(sim, state, 0)
    assert int(same.t) == 30


def test_run_reuses_one_compiled_program(sim):
    state = run(sim, _initial(sim), 5, check_every=7)
    state = run(sim, state, 23, check_every=7, every=4, callback=lambda s: None)
    state = run(sim, state, 1, check_every=7)
    runner = sim._runners[7]
    assert runner._cache_size() == 1
    assert int(state.t) == 29


def test_restart_from_host_copy_is_bit_identical(sim, tmp_path):
    half = run(sim, _initial(sim), 20)
    np.savez(tmp_path / "ckpt.npz", **jax.device_get(half)._asdict())
    with np.load(tmp_path / "ckpt.npz") as data:
        loaded = LBMState(f=jnp.asarray(data["f"]), t=jnp.asarray(data["t"]))
    assert loaded.f.dtype == sim.storage.storage_dtype
    resumed = run(sim, loaded, 20)
    straight = run(sim, _initial(sim), 40)
    chex.assert_trees_all_equal(resumed, straight)


def test_run_consumes_its_input_state(sim):
    state = _initial(sim)
    run(sim, state, 2)
    assert state.f.is_deleted()


def test_run_validates_arguments(sim):
    state = _initial(sim)
    with pytest.raises(TypeError, match="lbm_jax.Simulation"):
        run(sim.step, state, 10)
    with pytest.raises(TypeError, match="LBMState"):
        run(sim, (state.f, state.t), 10)
    with pytest.raises(ValueError, match="callback needs every"):
        run(sim, state, 10, callback=print)
    with pytest.raises(ValueError, match="check_every must be a positive int"):
        run(sim, state, 10, check_every=0)
    with pytest.raises(ValueError, match="steps must be in"):
        run(sim, state, -5)
    with pytest.raises(TypeError, match="callback must be callable"):
        run(sim, state, 10, every=2, callback="print")
    assert not state.f.is_deleted()
