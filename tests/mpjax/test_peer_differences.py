"""Where mpjax deliberately differs from jmp, optax, Flax, PyTorch and Keras.

Each test pins one behaviour listed in docs/mixed_precision/differences.md, run
against the peer itself where it is installed here (jmp, optax's
``apply_if_finite``, Flax's ``DynamicScale``); PyTorch's ``GradScaler`` and
Keras' ``LossScaleOptimizer`` are not dependencies, so their side is documented
and only mpjax's side is pinned.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import jmp
import numpy as np
import optax
import pytest
from flax.training.dynamic_scale import DynamicScale

import mpjax


def _grads(value, n=3):
    return {"w": jnp.full(n, value, jnp.float32)}


# ------------------------------------------------------------------- policies


@pytest.mark.parametrize("spec", ["mixed_bfloat16", "mixed_float16"])
def test_policy_accepts_keras_names_jmp_refuses(spec):
    with pytest.raises((ValueError, KeyError)):
        jmp.get_policy(spec)
    policy = mpjax.get_policy(spec)
    assert policy.compute_dtype.itemsize == 2


def test_policy_agrees_with_jmp_on_jmp_spellings():
    for spec in ("p=f32,c=bf16,o=f32", "params=float32,compute=float16", "half"):
        assert mpjax.get_policy(spec) == mpjax.Policy.from_jmp(jmp.get_policy(spec))


# ------------------------------------------------------------- loss-scale values


def test_initial_scale_follows_jmp_and_keras_not_flax_or_torch():
    defaults = inspect.signature(mpjax.dynamic_loss_scaling).parameters
    assert defaults["init_scale"].default == 2.0**15  # jmp, Keras
    assert float(DynamicScale().scale) == 2.0**16  # Flax (and torch's GradScaler)
    assert defaults["period"].default == DynamicScale().growth_interval == 2000


@pytest.mark.standard_promotion  # Flax's DynamicScale mixes int32 and bool
def test_scale_grows_on_the_period_th_finite_step_like_jmp_one_before_flax():
    period = 3
    opt = mpjax.dynamic_loss_scaling(optax.sgd(0.1), init_scale=8.0, period=period)
    state = opt.init(_grads(0.0))
    theirs = jmp.DynamicLossScale(jnp.float32(8.0), period=period)
    flax_scale = DynamicScale(growth_interval=period, scale=8.0)
    grad_fn = flax_scale.value_and_grad(lambda w: jnp.sum(w))
    ours, jmps, flaxes = [], [], []
    for _ in range(2 * period + 2):
        _, state = opt.update(_grads(float(state.scale)), state)
        theirs = theirs.adjust(jnp.array(True))
        flax_scale = grad_fn(jnp.ones(3))[0]
        grad_fn = flax_scale.value_and_grad(lambda w: jnp.sum(w))
        ours.append(float(state.scale))
        jmps.append(float(theirs.loss_scale))
        flaxes.append(float(flax_scale.scale))
    assert ours == jmps == [8, 8, 16, 16, 16, 32, 32, 32]
    assert flaxes == [8, 8, 8, 16, 16, 16, 16, 32]  # grows one step later


def test_scale_has_a_floor_and_a_ceiling():
    opt = mpjax.dynamic_loss_scaling(
        optax.sgd(0.1), init_scale=2.0, min_scale=1.0, max_scale=4.0, period=1
    )
    state = opt.init(_grads(0.0))
    for _ in range(3):  # non-finite: 2 -> 1 -> 1 -> 1
        _, state = opt.update(_grads(jnp.nan), state)
    assert float(state.scale) == 1.0
    for _ in range(5):  # finite: 1 -> 2 -> 4 -> 4
        _, state = opt.update(_grads(1.0), state)
    assert float(state.scale) == 4.0
    # Flax's floor is float32's smallest normal number, and it has no ceiling
    assert DynamicScale().minimum_scale == float(jnp.finfo(jnp.float32).tiny)


def test_growth_and_backoff_share_one_factor():
    # torch's GradScaler takes growth_factor and backoff_factor separately, as
    # Flax's DynamicScale does; mpjax takes one factor (back-off is 1/factor).
    parameters = inspect.signature(mpjax.dynamic_loss_scaling).parameters
    assert "factor" in parameters and "backoff_factor" not in parameters
    assert {"growth_factor", "backoff_factor"} <= set(
        inspect.signature(DynamicScale).parameters
    )


@pytest.mark.parametrize(
    "kwargs",
    [{"period": 0}, {"factor": 1.0}, {"init_scale": 0.0}, {"min_scale": 2.0**30}],
)
def test_hyperparameters_are_validated_where_peers_take_anything(kwargs):
    with pytest.raises(ValueError):
        mpjax.dynamic_loss_scaling(optax.sgd(0.1), **kwargs)
    # jmp and Flax build the same settings without a word
    jmp.DynamicLossScale(jnp.float32(2.0**15), period=0, factor=1)
    DynamicScale(growth_interval=0, growth_factor=1.0, scale=0.0)


# ----------------------------------------------------------------- skipped steps


def test_skipped_step_returns_zero_updates_and_the_old_inner_state_like_optax():
    inner = optax.sgd(0.1, momentum=0.9)
    ours = mpjax.no_loss_scaling(inner)
    theirs = optax.apply_if_finite(inner, max_consecutive_errors=5)
    params = _grads(1.0)
    s_ours, s_theirs = ours.init(params), theirs.init(params)
    _, s_ours = ours.update(_grads(0.5), s_ours, params)
    _, s_theirs = theirs.update(_grads(0.5), s_theirs, params)
    u_ours, n_ours = ours.update(_grads(jnp.nan), s_ours, params)
    u_theirs, n_theirs = theirs.update(_grads(jnp.nan), s_theirs, params)
    np.testing.assert_array_equal(u_ours["w"], 0.0)
    np.testing.assert_array_equal(u_theirs["w"], 0.0)
    for a, b in ((n_ours.inner_state, s_ours.inner_state),):
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
            np.testing.assert_array_equal(x, y)
    # the counters: optax's total_notfinite is mpjax's skipped
    assert int(n_ours.skipped) == int(n_theirs.total_notfinite) == 1
    assert int(n_ours.consecutive) == int(n_theirs.notfinite_count) == 1


def test_after_the_limit_optax_applies_the_non_finite_update_mpjax_keeps_skipping():
    limit = 2
    ours = mpjax.no_loss_scaling(
        optax.sgd(0.1), max_consecutive_skips=limit, on_stuck="flag"
    )
    theirs = optax.apply_if_finite(optax.sgd(0.1), max_consecutive_errors=limit)
    params = _grads(1.0)
    s_ours, s_theirs = ours.init(params), theirs.init(params)
    for _ in range(limit + 1):
        u_ours, s_ours = ours.update(_grads(jnp.nan), s_ours, params)
        u_theirs, s_theirs = theirs.update(_grads(jnp.nan), s_theirs, params)
    assert bool(jnp.all(jnp.isnan(u_theirs["w"])))  # optax gives up and applies
    np.testing.assert_array_equal(u_ours["w"], 0.0)  # mpjax still skips ...
    assert bool(s_ours.stuck)  # ... and says so (or raises, by default)


def test_an_update_that_overflows_the_parameters_counts_as_skipped():
    # optax, jmp, Flax, torch and Keras check the gradients only
    params = {"w": jnp.full(2, 6e4, jnp.float16)}
    grads = {"w": jnp.full(2, -1.0, jnp.float16)}
    theirs = optax.apply_if_finite(optax.sgd(1e4), max_consecutive_errors=5)
    u_theirs, s_theirs = theirs.update(grads, theirs.init(params), params)
    assert not bool(jnp.all(jnp.isfinite(optax.apply_updates(params, u_theirs)["w"])))
    assert int(s_theirs.total_notfinite) == 0
    ours = mpjax.no_loss_scaling(optax.sgd(1e4))
    u_ours, s_ours = ours.update(grads, ours.init(params), params)
    assert bool(jnp.all(jnp.isfinite(optax.apply_updates(params, u_ours)["w"])))
    assert int(s_ours.skipped) == 1


def test_gradients_come_back_in_the_parameter_dtype_not_float32():
    params = jnp.ones(3, jnp.bfloat16)

    def loss_fn(w):
        return jnp.sum(w.astype(jnp.float32) ** 2)

    _, ours = mpjax.scaled_value_and_grad(loss_fn)(params, jnp.float32(2.0**10))
    *_, theirs = DynamicScale(scale=2.0**10).value_and_grad(loss_fn)(params)
    assert ours.dtype == jnp.bfloat16  # scaled; the optimizer unscales in float32
    assert theirs.dtype == jnp.float32  # Flax hands back unscaled float32 grads


def test_every_test_the_differences_page_names_exists():
    root = Path(__file__).resolve().parents[2]
    page = (root / "docs/mixed_precision/differences.md").read_text()
    named = set(re.findall(r"`(test_\w+\.py)::(test_\w+)`", page))
    assert len(named) >= 20
    for file, test in sorted(named):
        source = (root / "tests/mpjax" / file).read_text()
        assert re.search(rf"^def {test}\(", source, re.M), f"{file}::{test}"
