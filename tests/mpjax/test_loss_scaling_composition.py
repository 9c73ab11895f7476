"""Loss scaling composed with Optax (multi-steps, injected hyperparameters,
schedules, multi_transform) and read back from optimizer states
(``get_loss_scale``, ``get_skipped_steps``, Flax NNX optimizers)."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import mpjax
from tests.mpjax._trees import make_grads, make_params, scale_tree

INF, NAN = float("inf"), float("nan")


# -------------------------------------------------------------------- composition


@pytest.mark.standard_promotion
def test_multisteps_accumulation_matches_unscaled():
    opt = optax.MultiSteps(
        mpjax.dynamic_loss_scaling(optax.adam(1e-2), init_scale=2.0**12, period=1),
        every_k_schedule=2,
    )
    ref = optax.MultiSteps(optax.adam(1e-2), every_k_schedule=2)
    params = make_params()
    state, ref_state = opt.init(params), ref.init(params)
    update, ref_update = jax.jit(opt.update), jax.jit(ref.update)
    scales = []
    for i in range(4):
        grads = jax.tree.map(lambda p, i=i: p * (i + 1.0), params)
        scale = mpjax.get_loss_scale(state)
        updates, state = update(scale_tree(grads, scale), state, params)
        expected, ref_state = ref_update(grads, ref_state, params)
        chex.assert_trees_all_close(updates, expected, rtol=1e-6, atol=1e-9)
        scales.append(float(mpjax.get_loss_scale(state)))
    # The scale changes only when the accumulated step reaches the inner optimizer.
    assert scales == [2.0**12, 2.0**13, 2.0**13, 2.0**14]


@pytest.mark.standard_promotion
def test_inject_hyperparams_inside_and_outside():
    inner = optax.inject_hyperparams(optax.sgd)(learning_rate=0.5)
    opt = mpjax.dynamic_loss_scaling(inner, init_scale=4.0)
    params = make_params()
    state = opt.init(params)
    update = jax.jit(opt.update)
    updates, state = update(scale_tree(make_grads(params), 4.0), state, params)
    np.testing.assert_allclose(updates["b"], -0.25)
    hyper = dict(state.inner_state.hyperparams, learning_rate=jnp.asarray(0.125))
    state = state._replace(inner_state=state.inner_state._replace(hyperparams=hyper))
    updates, state = update(scale_tree(make_grads(params), 4.0), state, params)
    np.testing.assert_allclose(updates["b"], -0.0625)

    outer = optax.inject_hyperparams(
        lambda learning_rate: mpjax.dynamic_loss_scaling(
            optax.sgd(learning_rate), init_scale=8.0, period=1
        )
    )(learning_rate=0.5)
    state = outer.init(params)
    assert float(mpjax.get_loss_scale(state)) == 8.0
    updates, state = jax.jit(outer.update)(
        scale_tree(make_grads(params), 8.0), state, params
    )
    np.testing.assert_allclose(updates["b"], -0.25)
    assert float(mpjax.get_loss_scale(state)) == 16.0


@pytest.mark.standard_promotion
def test_schedule_count_advances_only_on_applied_steps():
    schedule = optax.piecewise_constant_schedule(1.0, {2: 0.1})
    opt = mpjax.dynamic_loss_scaling(optax.sgd(schedule), init_scale=2.0)
    params = make_params()
    state = opt.init(params)
    update = jax.jit(opt.update)
    rates = []
    for bad in (False, True, True, False, False):
        scale = float(mpjax.get_loss_scale(state))
        grads = scale_tree(make_grads(params, NAN if bad else 1.0), scale)
        updates, state = update(grads, state, params)
        rates.append(-float(updates["b"][0]))
    # Skipped steps leave the schedule's count alone: rates 1, -, -, 1, 0.1.
    assert rates == pytest.approx([1.0, 0.0, 0.0, 1.0, 0.1])


def test_multi_transform_with_int_counters():
    params = {"w": jnp.ones((2, 2)), "count": jnp.int32(7)}
    labels = {"w": "float", "count": "int"}
    inner = optax.multi_transform(
        {"float": optax.sgd(0.5), "int": optax.set_to_zero()}, labels
    )
    opt = mpjax.dynamic_loss_scaling(inner, init_scale=8.0)
    state = opt.init(params)
    grads = {"w": jnp.full((2, 2), 8.0), "count": jnp.int32(3)}
    updates, state = jax.jit(opt.update)(grads, state, params)
    assert updates["count"].dtype == jnp.int32 and int(updates["count"]) == 0
    np.testing.assert_array_equal(updates["w"], -0.5)
    new = optax.apply_updates(params, updates)
    assert new["count"].dtype == jnp.int32 and int(new["count"]) == 7
    assert int(state.skipped) == 0


def test_get_loss_scale_inside_multi_transform_and_ambiguity():
    params = {"a": jnp.ones(2), "b": jnp.ones(2)}
    one = optax.multi_transform(
        {
            "a": mpjax.static_loss_scaling(optax.sgd(0.1), 32.0),
            "b": optax.set_to_zero(),
        },
        {"a": "a", "b": "b"},
    )
    assert float(mpjax.get_loss_scale(one.init(params))) == 32.0
    two = optax.multi_transform(
        {
            "a": mpjax.static_loss_scaling(optax.sgd(0.1), 32.0),
            "b": mpjax.dynamic_loss_scaling(optax.sgd(0.1)),
        },
        {"a": "a", "b": "b"},
    )
    with pytest.raises(ValueError, match="2 loss-scaling states"):
        mpjax.get_loss_scale(two.init(params))


def test_get_loss_scale_defaults_and_nesting():
    params = make_params()
    nested = optax.chain(
        optax.identity(), mpjax.dynamic_loss_scaling(optax.sgd(0.1), init_scale=64.0)
    )
    assert float(mpjax.get_loss_scale(nested.init(params))) == 64.0
    none = mpjax.no_loss_scaling(optax.sgd(0.1))
    assert float(mpjax.get_loss_scale(none.init(params))) == 1.0
    assert mpjax.get_skipped_steps(none.init(params)).dtype == jnp.int32


@pytest.mark.parametrize("getter", [mpjax.get_loss_scale, mpjax.get_skipped_steps])
def test_getters_refuse_a_state_without_loss_scaling(getter):
    # a plain optimizer holds no scale: reading one would report a made-up 1.0
    state = optax.chain(optax.identity(), optax.sgd(0.1)).init(make_params())
    with pytest.raises(ValueError, match="holds no loss-scaling state.*dynamic_loss"):
        getter(state)


# ---------------------------------------------------------------- Flax NNX states


def _nnx_model_and_optimizer():
    from flax import nnx

    model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
    tx = mpjax.dynamic_loss_scaling(optax.adam(1e-3), init_scale=2.0**10)
    return model, nnx.Optimizer(model, tx, wrt=nnx.Param)


@pytest.mark.standard_promotion
def test_get_loss_scale_reads_nnx_optimizer_and_its_states():
    from flax import nnx

    _, optimizer = _nnx_model_and_optimizer()
    for held in (
        optimizer,
        optimizer.opt_state,
        nnx.state(optimizer),
        nnx.state(optimizer.opt_state),
    ):
        scale = mpjax.get_loss_scale(held)
        assert isinstance(scale, jax.Array), type(held)
        assert scale.dtype == jnp.float32 and float(scale) == 2.0**10
        skipped = mpjax.get_skipped_steps(held)
        assert isinstance(skipped, jax.Array), type(held)
        assert skipped.dtype == jnp.int32 and int(skipped) == 0


@pytest.mark.standard_promotion
def test_get_loss_scale_nnx_optimizer_follows_skipped_step():
    from flax import nnx

    model, optimizer = _nnx_model_and_optimizer()
    grads = jax.tree.map(
        lambda p: jnp.full(p.shape, INF, p.dtype), nnx.state(model, nnx.Param)
    )
    optimizer.update(model, grads)
    scale = mpjax.get_loss_scale(optimizer)
    assert isinstance(scale, jax.Array) and float(scale) == 2.0**9
    assert int(mpjax.get_skipped_steps(optimizer.opt_state)) == 1


@pytest.mark.standard_promotion
def test_get_loss_scale_nnx_optimizer_without_loss_scaling_raises():
    from flax import nnx

    model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    with pytest.raises(ValueError, match="no loss-scaling state"):
        mpjax.get_loss_scale(optimizer)
    with pytest.raises(ValueError, match="no loss-scaling state"):
        mpjax.get_skipped_steps(optimizer.opt_state)


@pytest.mark.parametrize("bad", [None, 3.0, 7, "adam", jnp.ones(2), object()])
@pytest.mark.parametrize("getter", [mpjax.get_loss_scale, mpjax.get_skipped_steps])
def test_get_loss_scale_rejects_non_states(getter, bad):
    with pytest.raises(TypeError, match="optimizer state"):
        getter(bad)


@pytest.mark.standard_promotion
def test_get_loss_scale_rejects_nnx_model():
    from flax import nnx

    model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
    with pytest.raises(TypeError, match="nnx.Optimizer"):
        mpjax.get_loss_scale(model)
