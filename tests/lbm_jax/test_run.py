"""The one run driver: any step over any pytree, sampling, early stop, reuse."""

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lbm_jax
from lbm_jax import InstabilityError, LBMState, Simulation, run


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
    result = run(sim, _initial(sim), 37, check_every=10)
    advanced = sim.advance(_initial(sim), 37)
    assert int(result.state.t) == 37
    chex.assert_trees_all_equal(result.state, advanced)
    stats = result.stats
    assert stats.steps == 37 and not stats.stopped
    assert stats.seconds > 0 and stats.compile_seconds > 0
    assert stats.mlups == pytest.approx(37 * sim.num_cells / stats.seconds / 1e6)
    assert result.samples is None


def test_run_estimate_comes_after_a_timed_hundredth_before_the_rest(sim):
    calls = []

    def estimate(seconds_per_step, steps_left):
        calls.append((seconds_per_step, steps_left))

    ticks = []  # the callback runs at the end of every chunk from the third on
    result = run(
        sim,
        _initial(sim),
        1000,
        estimate=estimate,
        callback=lambda s: ticks.append((int(s.t), len(calls))),
        callback_every=100,
    )
    assert result.stats.steps == 1000
    # a warm-up chunk of 10 steps, a timed one of 10, then the estimate
    ((seconds, left),) = calls
    assert left == 980 and seconds > 0
    assert ticks[0] == (100, 1)  # given before the bulk of the run
    # a run too short for a timed hundredth gives no estimate
    run(sim, _initial(sim), 1, estimate=estimate)
    assert len(calls) == 1
    with pytest.raises(TypeError, match="estimate must be callable"):
        run(sim, _initial(sim), 5, estimate=3)


def test_step_method_and_plain_step_function_give_the_same_run(sim):
    expected = sim.advance(_initial(sim), 23)
    via_method = run(sim.step, _initial(sim), 23, check_every=5)
    via_function = run(lambda s: sim.step(s), _initial(sim), 23, check_every=5)
    chex.assert_trees_all_equal(via_method.state, expected)
    chex.assert_trees_all_equal(via_function.state, expected)
    assert via_function.stats.mlups > 0  # cells counted from the LBMState inside


def test_run_callbacks_at_every_interval(sim):
    seen = []

    def record(state):
        assert isinstance(state, LBMState)
        seen.append((int(state.t), float(lbm_jax.density(sim, state).mean())))

    start = sim.advance(_initial(sim), 3)
    final = run(sim, start, 25, check_every=4, callback_every=10, callback=record).state
    assert [t for t, _ in seen] == [13, 23]
    assert int(final.t) == 28
    assert all(abs(m - 1) < 1e-2 for _, m in seen)
    chex.assert_trees_all_equal(final, sim.advance(_initial(sim), 28))


def test_run_progress_bar_and_zero_steps(sim, capsys):
    state = run(sim, _initial(sim), 30, progress=True).state
    assert int(state.t) == 30
    assert "30/30" in capsys.readouterr().err
    same = run(sim, state, 0)
    assert int(same.state.t) == 30 and same.stats.steps == 0


def test_observe_samples_inside_the_loop_at_the_state_steps(sim):
    start = sim.advance(_initial(sim), 3)
    result = run(
        sim,
        start,
        50,
        observe=lambda s: {"ux": lbm_jax.velocity(sim, s)[0, 2], "t": s.t},
        sample_every=7,
        window=3,  # seven samples over chunks of at most three
    )
    samples = result.samples
    np.testing.assert_array_equal(samples.steps, 3 + 7 * np.arange(1, 8))
    np.testing.assert_array_equal(samples.values["t"], samples.steps)
    assert samples.values["ux"].shape == (7, 12)
    reference = sim.advance(_initial(sim), 3 + 35)
    np.testing.assert_array_equal(
        samples.values["ux"][4], lbm_jax.velocity(sim, reference)[0, 2]
    )


def _channel():
    """A body-force-driven channel: it settles to the steady Poiseuille profile."""
    cell_type = np.zeros((4, 18), np.int8)
    cell_type[:, [0, -1]] = int(lbm_jax.CellType.SOLID)
    return Simulation("D2Q9", (4, 18), tau=1.0, force=(1e-5, 0.0), cell_type=cell_type)


def test_steady_stop_ends_the_run_on_the_device():
    sim = _channel()
    tol = 1e-3  # relative change per sample

    def energy(s):
        return jnp.sum(lbm_jax.velocity(sim, s) ** 2)

    result = run(
        sim,
        sim.init(),
        100_000,
        observe=energy,
        sample_every=50,
        stop=lbm_jax.steady(tol),
    )
    stats, values = result.stats, result.samples.values
    assert stats.stopped and stats.steps < 5000 and stats.steps % 50 == 0
    assert len(values) == stats.steps // 50
    change = [
        float(lbm_jax.relative_change(a, b))
        for a, b in zip(values[1:], values[:-1], strict=True)
    ]
    assert change[-1] < tol <= change[-2]
    # the same criterion per step (sample_every) stops at the same sample
    per_step = run(
        sim,
        sim.init(),
        100_000,
        observe=energy,
        sample_every=50,
        stop=lbm_jax.steady(tol / 50, sample_every=50),
    )
    assert per_step.stats.steps == stats.steps


def test_stop_sees_the_state():
    sim = Simulation("D2Q9", (8, 8), tau=0.8)
    result = run(
        sim,
        sim.init(),
        1000,
        observe=lambda s: s.t,
        sample_every=10,
        stop=lambda s, h: s.t >= 35,
    )
    assert result.stats.stopped and int(result.state.t) == 40
    assert result.samples.values.tolist() == [10, 20, 30, 40]


def test_stop_without_observe_is_refused():
    # steady() without samples would compare nothing and never stop the run
    sim = Simulation("D2Q9", (8, 8), tau=0.8)
    with pytest.raises(ValueError, match="stop needs observe="):
        run(sim, sim.init(), 1000, sample_every=10, stop=lbm_jax.steady(1e-3))


def test_history_latest_reads_the_ring_buffer():
    # samples 10..13 of a window of 4: sample k sits in slot k % 4
    values = jnp.array([[12.0], [13.0], [10.0], [11.0]])
    history = lbm_jax.History(values, jnp.int32(14))
    assert float(history.latest(0)[0]) == 13.0
    assert float(history.latest(1)[0]) == 12.0
    assert float(history.latest(3)[0]) == 10.0


def test_run_reuses_one_compiled_program(sim):
    traces = []

    def healthy(s):
        traces.append(1)
        return sim.healthy(s)

    state = run(sim, _initial(sim), 5, check_every=7, healthy=healthy).state
    state = run(
        sim,
        state,
        23,
        check_every=7,
        healthy=healthy,
        callback_every=4,
        callback=lambda s: None,
        progress=True,
    ).state
    state = run(sim, state, 1, check_every=7, healthy=healthy).state
    assert len(traces) == 1
    assert int(state.t) == 29


class _Doubling(NamedTuple):
    x: jax.Array
    n: jax.Array


def test_generic_pytree_state_and_default_finite_check():
    def step(s):
        return _Doubling(s.x * 2.0, s.n + 1)

    ok = run(step, _Doubling(jnp.ones(3), jnp.int32(0)), 100, check_every=10)
    assert int(ok.state.n) == 100 and float(ok.state.x[0]) == 2.0**100
    assert ok.stats.mlups is None  # no lattice in the state
    with pytest.raises(InstabilityError, match="at step 130.*non-finite") as info:
        run(step, _Doubling(jnp.ones(3), jnp.int32(0)), 500, check_every=10)
    err = info.value
    assert (err.step, err.last_good_step) == (130, 120)  # 2**128 overflows float32
    assert not np.isfinite(err.state.x).all()


def test_restart_from_host_copy_is_bit_identical(sim, tmp_path):
    half = run(sim, _initial(sim), 20).state
    lbm_jax.save_state(tmp_path / "ckpt.npz", half)
    loaded, _ = lbm_jax.load_state(tmp_path / "ckpt.npz", like=half)
    assert loaded.f.dtype == sim.storage.storage_dtype
    resumed = run(sim, loaded, 20).state
    straight = run(sim, _initial(sim), 40).state
    chex.assert_trees_all_equal(resumed, straight)


def test_run_consumes_its_input_state(sim):
    state = _initial(sim)
    run(sim, state, 2)
    assert state.f.is_deleted()


def test_run_validates_arguments(sim):
    state = _initial(sim)
    with pytest.raises(TypeError, match="step must be a pure function"):
        run("sim", state, 10)
    with pytest.raises(TypeError, match="LBMState"):
        run(sim, (state.f, state.t), 10)
    with pytest.raises(ValueError, match="callback needs callback_every"):
        run(sim, state, 10, callback=print)
    with pytest.raises(ValueError, match="check_every must be at least 1"):
        run(sim, state, 10, check_every=0)
    with pytest.raises(ValueError, match=r"steps must be in \[0"):
        run(sim, state, -5)
    with pytest.raises(TypeError, match="callback must be callable"):
        run(sim, state, 10, callback_every=2, callback="print")
    with pytest.raises(ValueError, match="observe and stop need sample_every"):
        run(sim, state, 10, observe=lambda s: s.t)
    with pytest.raises(ValueError, match="sample_every needs observe"):
        run(sim, state, 10, sample_every=5)
    with pytest.raises(ValueError, match="window must be at least 1"):
        run(sim, state, 10, observe=lambda s: s.t, sample_every=5, window=0)
    with pytest.raises(TypeError, match="stop must be callable"):
        run(sim, state, 10, observe=lambda s: s.t, sample_every=5, stop=0.5)
    with pytest.raises(ValueError, match="tol must be non-negative"):
        lbm_jax.steady(-1.0)
    assert not state.f.is_deleted()
    with pytest.raises(TypeError, match="healthy.*bool scalar"):
        run(sim, state, 10, healthy=lambda s: lbm_jax.density(sim, s) > 0)


def test_every_is_a_deprecated_alias_of_callback_every(sim):
    seen = []
    with pytest.warns(
        DeprecationWarning, match=r"run\(every=\.\.\.\).*callback_every="
    ):
        run(sim, _initial(sim), 20, every=10, callback=lambda s: seen.append(int(s.t)))
    assert seen == [10, 20]
    with pytest.raises(ValueError, match="both callback_every=10 and .* alias every=5"):
        run(sim, _initial(sim), 20, callback_every=10, every=5, callback=print)


def test_steady_interval_is_a_deprecated_alias_of_sample_every():
    with pytest.warns(DeprecationWarning, match=r"steady\(interval=\.\.\.\).*sample_"):
        lbm_jax.steady(1e-3, interval=50)
    with pytest.raises(ValueError, match="both sample_every=50 and .* interval=50"):
        lbm_jax.steady(1e-3, sample_every=50, interval=50)
    with pytest.raises(ValueError, match="sample_every must be at least 1"):
        lbm_jax.steady(1e-3, sample_every=0)
