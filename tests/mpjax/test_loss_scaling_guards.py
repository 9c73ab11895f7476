"""The loss scalers' guards: a stuck run is reported, and no parameter turns
non-finite unreported (rejected updates, low-precision master parameters)."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import mpjax
from experiments import _data

# One factory per variant, as in test_loss_scaling.py.
VARIANTS = {
    "none": lambda inner, **kw: mpjax.no_loss_scaling(inner, **kw),
    "static": lambda inner, **kw: mpjax.static_loss_scaling(inner, 2.0**10, **kw),
    "dynamic": lambda inner, **kw: mpjax.dynamic_loss_scaling(
        inner, init_scale=2.0**10, period=3, **kw
    ),
}
FACTORIES = (
    mpjax.no_loss_scaling,
    mpjax.static_loss_scaling,
    mpjax.dynamic_loss_scaling,
)


def _params():
    return {"w": jnp.ones(3), "b": jnp.zeros(2)}


def _grads(value):
    return {"w": jnp.full(3, value), "b": jnp.full(2, value)}


@pytest.mark.parametrize("factory", FACTORIES, ids=lambda f: f.__name__)
def test_max_consecutive_skips_defaults_to_100_and_raises(factory):
    parameters = inspect.signature(factory).parameters
    assert parameters["max_consecutive_skips"].default == 100
    assert parameters["on_stuck"].default == "raise"


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_stuck_run_raises_a_checked_error_under_jit(variant):
    opt = VARIANTS[variant](optax.sgd(0.1), max_consecutive_skips=3)
    update = jax.jit(opt.update)
    params = _params()
    state = opt.init(params)
    for _ in range(2):
        _, state = update(_grads(jnp.nan), state, params)
    assert int(state.consecutive) == 2 and not bool(state.stuck)
    with pytest.raises(jax.errors.JaxRuntimeError, match="3 steps in a row"):
        jax.block_until_ready(update(_grads(jnp.nan), state, params))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_stuck_flag_counts_in_the_state_and_clears_on_a_good_step(variant):
    opt = VARIANTS[variant](optax.sgd(0.1), max_consecutive_skips=2, on_stuck="flag")
    update = jax.jit(opt.update)
    params = _params()
    state = opt.init(params)
    flags, counts = [], []
    for value in (jnp.nan, jnp.inf, jnp.nan, 0.5 * float(mpjax.get_loss_scale(state))):
        if not np.isfinite(value):
            value = float(value)
        _, state = update(_grads(value), state, params)
        flags.append(bool(state.stuck))
        counts.append(int(state.consecutive))
    assert flags == [False, True, True, False]
    assert counts == [1, 2, 3, 0]
    assert int(state.skipped) == 3


def test_no_limit_never_reports_a_stuck_run():
    opt = mpjax.dynamic_loss_scaling(optax.sgd(0.1), max_consecutive_skips=None)
    params = _params()
    state = opt.init(params)
    run = jax.jit(
        lambda s: jax.lax.fori_loop(
            0, 150, lambda _, s: opt.update(_grads(jnp.nan), s, params)[1], s
        )
    )
    state = run(state)
    assert int(state.consecutive) == 150 and not bool(state.stuck)
    assert float(state.scale) == 1.0  # clamped at min_scale


@pytest.mark.parametrize("skip", ["cond", "select"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_update_that_makes_a_parameter_non_finite_is_skipped(variant, skip):
    # Finite gradients, but the float16 parameter overflows: 60000 + 10000 > 65504.
    opt = VARIANTS[variant](optax.sgd(1e4), skip=skip)
    params = {"w": jnp.full(2, 6e4, jnp.float16)}
    state = opt.init(params)
    scale = float(mpjax.get_loss_scale(state))
    grads = {"w": jnp.full(2, -scale, jnp.float16)}
    updates, new_state = jax.jit(opt.update)(grads, state, params)
    assert float(jnp.abs(updates["w"]).max()) == 0.0
    assert int(new_state.skipped) == 1 and int(new_state.consecutive) == 1
    new_params = optax.apply_updates(params, updates)
    assert bool(jnp.all(jnp.isfinite(new_params["w"])))
    if variant == "dynamic":
        assert float(new_state.scale) == scale / 2  # backs off as for an overflow


def test_float32_parameters_are_not_checked():
    # The check would keep the update from fusing with its application (1.5x the
    # step of a 3-million-parameter MLP on a CPU); float32 is documented unchecked.
    opt = mpjax.no_loss_scaling(optax.sgd(1.0))
    params = {"w": jnp.full(2, 3e38, jnp.float32)}
    state = opt.init(params)
    grads = {"w": jnp.full(2, -1e38, jnp.float32)}
    updates, new_state = jax.jit(opt.update)(grads, state, params)
    assert int(new_state.skipped) == 0
    assert not bool(jnp.all(jnp.isfinite(optax.apply_updates(params, updates)["w"])))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_consecutive_skips": 0}, "max_consecutive_skips must be a positive"),
        ({"max_consecutive_skips": 2.5}, "max_consecutive_skips must be a positive"),
        ({"max_consecutive_skips": True}, "max_consecutive_skips must be a positive"),
        ({"on_stuck": "ignore"}, "on_stuck must be one of"),
    ],
)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_bad_stuck_arguments_raise_value_error(variant, kwargs, match):
    with pytest.raises(ValueError, match=match):
        VARIANTS[variant](optax.sgd(0.1), **kwargs)


# ------------------------------------------- float16 master parameters under Adam


def _mlp_params(key):
    k1, k2 = jax.random.split(key)
    return {  # 64 x 8 = 512 first-layer weights
        "w1": 0.1 * jax.random.normal(k1, (64, 8)),
        "w2": 0.1 * jax.random.normal(k2, (8, 10)),
    }


def _mlp_loss(params, batch):
    x, y = batch
    h = jnp.tanh(x @ params["w1"])
    logits = h @ params["w2"]
    onehot = jax.nn.one_hot(y, 10, dtype=logits.dtype)
    return -jnp.mean(jnp.sum(onehot * jax.nn.log_softmax(logits), axis=-1))


@pytest.mark.slow
@pytest.mark.standard_promotion  # optax.adam promotes internally
def test_float16_masters_with_adam_warn_and_never_turn_non_finite():
    # policy "half" (float16 masters) + Adam + dynamic loss scaling on digits:
    # Adam's eps=1e-8 is 0 in float16, so the first update divided by zero and
    # made first-layer weights inf while the step counted as accepted.
    digits = _data.digits(seed=0)
    batch = (jnp.asarray(digits.x_train[:128]), jnp.asarray(digits.y_train[:128]))
    opt = mpjax.dynamic_loss_scaling(optax.adam(1e-4))
    with pytest.warns(mpjax.PrecisionWarning, match="mixed_float16"):
        state = mpjax.TrainState.create(
            _mlp_params(jax.random.key(0)), opt, policy="half"
        )
    assert state.params["w1"].dtype == jnp.float16
    step = jax.jit(mpjax.make_train_step(_mlp_loss, opt, "half"))
    state, metrics = step(state, batch)
    assert (
        bool(metrics["skipped"]) and int(mpjax.get_skipped_steps(state.opt_state)) == 1
    )
    for leaf in jax.tree.leaves(state.params):
        assert bool(jnp.all(jnp.isfinite(leaf)))
    assert np.isfinite(float(metrics["loss"]))


@pytest.mark.standard_promotion  # optax.adam promotes internally
def test_float32_masters_with_adam_do_not_warn_and_train():
    digits = _data.digits(seed=0)
    batch = (jnp.asarray(digits.x_train[:128]), jnp.asarray(digits.y_train[:128]))
    opt = mpjax.dynamic_loss_scaling(optax.adam(1e-2))
    # warnings are errors in this suite: a PrecisionWarning here fails the test
    state = mpjax.TrainState.create(
        _mlp_params(jax.random.key(0)), opt, policy="mixed_float16"
    )
    step = jax.jit(mpjax.make_train_step(_mlp_loss, opt, "mixed_float16"))
    losses = []
    for _ in range(30):
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    assert losses[-1] < 0.8 * losses[0]
    assert int(mpjax.get_skipped_steps(state.opt_state)) == 0


@pytest.mark.standard_promotion
def test_bfloat16_masters_with_sgd_do_not_warn():
    opt = mpjax.no_loss_scaling(optax.sgd(0.1))
    state = mpjax.TrainState.create(_mlp_params(jax.random.key(1)), opt, policy="bf16")
    assert state.params["w1"].dtype == jnp.bfloat16


def test_stuck_metric_is_reported_by_the_train_step():
    opt = mpjax.no_loss_scaling(
        optax.sgd(0.1), max_consecutive_skips=2, on_stuck="flag"
    )
    step = jax.jit(mpjax.make_train_step(lambda p, b: jnp.sum(p * b), opt, "float32"))
    state = mpjax.TrainState.create(jnp.ones(2), opt)
    stuck = []
    for _ in range(3):
        state, metrics = step(state, jnp.full(2, jnp.nan))
        stuck.append(bool(metrics["stuck"]))
    assert stuck == [False, True, True]
