"""Tests for the loss-scaling Optax wrappers: the contract battery over every
variant, injected faults, scaled gradients and bad input.

Their composition with other Optax transformations and the state readers are
``test_loss_scaling_composition.py``.
"""

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

# One factory per variant: the contract battery runs over all of them.
VARIANTS = {
    "none": lambda inner, **kw: mpjax.no_loss_scaling(inner, **kw),
    "static": lambda inner, **kw: mpjax.static_loss_scaling(inner, 2.0**10, **kw),
    "dynamic": lambda inner, **kw: mpjax.dynamic_loss_scaling(
        inner, init_scale=2.0**10, period=3, **kw
    ),
}
SCALE = {"none": 1.0, "static": 2.0**10, "dynamic": 2.0**10}
STATE_TYPES = {
    "none": mpjax.NoLossScaleState,
    "static": mpjax.StaticLossScaleState,
    "dynamic": mpjax.DynamicLossScaleState,
}


def _avals(tree):
    return jax.tree.map(lambda x: (jnp.shape(x), jnp.result_type(x)), tree)


# ---------------------------------------------------------------- contract battery


@pytest.mark.parametrize("skip", ["cond", "select"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variant_jit_init_update_and_state_type(variant, skip):
    opt = VARIANTS[variant](optax.sgd(0.1, momentum=0.9), skip=skip)
    params = make_params()
    state = jax.jit(opt.init)(params)
    assert isinstance(state, STATE_TYPES[variant])
    assert state.skipped.dtype == jnp.int32
    if variant != "none":
        assert state.scale.dtype == jnp.float32 and state.scale.shape == ()
    updates, new_state = jax.jit(opt.update)(
        scale_tree(make_grads(params), SCALE[variant]), state, params
    )
    np.testing.assert_allclose(updates["w"], -0.05, rtol=1e-6)
    chex.assert_trees_all_equal_shapes_and_dtypes(state, new_state)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variant_update_dtypes_equal_param_dtypes(variant, dtype):
    opt = VARIANTS[variant](optax.sgd(0.1, momentum=0.9))
    params = make_params(dtype)
    state = opt.init(params)
    update = jax.jit(opt.update)
    for bad in (False, True):  # both the accepted and the skipped branch
        grads = scale_tree(make_grads(params, INF if bad else 0.25), SCALE[variant])
        updates, state = update(grads, state, params)
        chex.assert_trees_all_equal_dtypes(updates, params)
        chex.assert_trees_all_equal_dtypes(state.inner_state[0].trace, params)


@pytest.mark.standard_promotion  # optax.adam promotes internally
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variant_adam_bfloat16_params_keep_dtypes(variant):
    opt = VARIANTS[variant](optax.adam(1e-3))
    params = make_params(jnp.bfloat16)
    state = opt.init(params)
    updates, new_state = jax.jit(opt.update)(
        scale_tree(make_grads(params), SCALE[variant]), state, params
    )
    chex.assert_trees_all_equal_dtypes(updates, params)
    chex.assert_trees_all_equal_shapes_and_dtypes(state, new_state)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variant_state_stable_through_cond_and_scan(variant):
    opt = VARIANTS[variant](optax.sgd(0.1, momentum=0.9))
    params = make_params()
    state = opt.init(params)
    grads = scale_tree(make_grads(params), SCALE[variant])

    @jax.jit
    def run(state, pred):
        stepped = jax.lax.cond(
            pred, lambda s: opt.update(grads, s, params)[1], lambda s: s, state
        )

        def body(s, bad):
            g = jax.tree.map(lambda x: jnp.where(bad, jnp.inf, x), grads)
            return opt.update(g, s, params)[1], None

        bads = jnp.array([False, True, False, False, False])
        return jax.lax.scan(body, stepped, bads)[0]

    out = run(state, jnp.array(True))
    chex.assert_trees_all_equal_shapes_and_dtypes(out, state)
    assert int(out.skipped) == 1
    assert int(out.inner_state[0].trace["w"].size) == 6


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variant_pytree_round_trip_keeps_every_field(variant):
    opt = VARIANTS[variant](optax.sgd(0.1, momentum=0.9))
    params = make_params()
    state = opt.init(params)
    _, state = opt.update(scale_tree(make_grads(params), SCALE[variant]), state, params)
    leaves, treedef = jax.tree.flatten(state)
    rebuilt = jax.tree.unflatten(treedef, leaves)
    assert type(rebuilt) is type(state)
    assert rebuilt._fields == state._fields
    chex.assert_trees_all_equal(rebuilt, state)
    chex.assert_trees_all_equal(jax.jit(lambda s: s)(state), state)


def test_dynamic_floor_and_ceiling_survive_jit():
    # jmp's DynamicLossScale drops min_loss_scale when flattened, so under jit its
    # floor resets; here bounds live in the closure and must hold across jit calls.
    opt = mpjax.dynamic_loss_scaling(
        optax.sgd(0.1), init_scale=8.0, period=1, min_scale=2.0, max_scale=32.0
    )
    params = make_params()
    state = opt.init(params)
    update = jax.jit(opt.update)
    scales = []
    for _ in range(5):
        _, state = update(make_grads(params, NAN), state, params)
        scales.append(float(state.scale))
    assert scales == [4.0, 2.0, 2.0, 2.0, 2.0]
    scales = []
    for _ in range(6):
        _, state = update(make_grads(params), state, params)
        scales.append(float(state.scale))
    assert scales == [4.0, 8.0, 16.0, 32.0, 32.0, 32.0]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variant_update_lowers_and_compiles(variant):
    opt = VARIANTS[variant](optax.sgd(0.1))
    params = make_params()
    state = opt.init(params)
    compiled = jax.jit(opt.update).lower(make_grads(params), state, params).compile()
    updates, _ = compiled(scale_tree(make_grads(params), SCALE[variant]), state, params)
    np.testing.assert_allclose(updates["b"], -0.05, rtol=1e-6)


@pytest.mark.parametrize("variant", ["static", "dynamic"])
def test_variant_new_scale_value_never_retraces(variant):
    opt = VARIANTS[variant](optax.sgd(1.0))
    params = make_params()
    state = opt.init(params)
    traces = []

    @jax.jit
    def update(grads, state):
        traces.append(1)
        return opt.update(grads, state, params)

    for scale in (2.0, 64.0, 3.0, 1024.0):
        s = state._replace(scale=jnp.float32(scale))
        updates, _ = update(scale_tree(make_grads(params), scale), s)
        np.testing.assert_allclose(updates["b"], -0.5, rtol=1e-6)
    assert len(traces) == 1


# ------------------------------------------------------------------ fault injection


@pytest.mark.parametrize("skip", ["cond", "select"])
def test_dynamic_exact_scale_sequence_and_untouched_state(skip):
    opt = mpjax.dynamic_loss_scaling(
        optax.sgd(0.1, momentum=0.9),
        init_scale=16.0,
        period=3,
        min_scale=4.0,
        skip=skip,
    )
    params = make_params()
    state = opt.init(params)
    update = jax.jit(opt.update)
    #         finite finite finite  inf  nan  nan  nan finite x3     finite
    pattern = ["ok", "ok", "ok", INF, NAN, NAN, NAN, "ok", "ok", "ok", "ok"]
    expected = [16, 16, 32, 16, 8, 4, 4, 4, 4, 8, 8]
    scales, skipped = [], []
    for i, kind in enumerate(pattern):
        grads = scale_tree(make_grads(params, 0.5 + i), float(state.scale))
        if kind != "ok":
            grads = {**grads, "w": grads["w"].at[1, 2].set(kind)}
        before = state
        updates, state = update(grads, state, params)
        if kind != "ok":
            chex.assert_trees_all_equal(updates, jax.tree.map(jnp.zeros_like, params))
            chex.assert_trees_all_equal(state.inner_state, before.inner_state)
            params_after = optax.apply_updates(params, updates)
            chex.assert_trees_all_equal(params_after, params)
        else:
            assert float(jnp.abs(updates["w"]).min()) > 0
        scales.append(float(state.scale))
        skipped.append(int(state.skipped))
    assert scales == expected
    assert skipped == [0, 0, 0, 1, 2, 3, 4, 4, 4, 4, 4]


@pytest.mark.parametrize("variant", ["none", "static"])
def test_fixed_scale_variants_skip_non_finite_steps(variant):
    opt = VARIANTS[variant](optax.sgd(0.1, momentum=0.9))
    params = make_params(jnp.float16)
    state = opt.init(params)
    _, state = opt.update(scale_tree(make_grads(params), SCALE[variant]), state, params)
    before = state
    bad = {"w": jnp.full((2, 3), jnp.nan, jnp.float16), "b": jnp.ones(3, jnp.float16)}
    updates, state = opt.update(bad, state, params)
    chex.assert_trees_all_equal(state.inner_state, before.inner_state)
    assert float(jnp.abs(updates["b"]).max()) == 0.0
    assert int(state.skipped) == 1
    assert float(mpjax.get_loss_scale(state)) == SCALE[variant]


def test_float16_unscale_overflow_is_caught():
    # min_scale < 1 makes unscaling enlarge gradients; a float16 overflow after
    # unscaling must count as non-finite rather than feed Inf to the optimizer.
    opt = mpjax.static_loss_scaling(optax.sgd(1.0), 2.0**-4)
    params = {"w": jnp.ones(2, jnp.float16)}
    state = opt.init(params)
    updates, state = opt.update({"w": jnp.full(2, 8192.0, jnp.float16)}, state, params)
    assert int(state.skipped) == 1
    assert float(jnp.abs(updates["w"]).max()) == 0.0


@pytest.mark.standard_promotion  # optax's clipping promotes internally
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_clipping_inside_chain_sees_unscaled_gradients(variant):
    # Plain SGD (not Adam, which is invariant to a constant gradient factor), so
    # clipping the scaled instead of the unscaled gradients would be visible.
    inner = optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1, momentum=0.9))
    opt = VARIANTS[variant](inner)
    params = make_params()
    state, ref_state = opt.init(params), inner.init(params)
    update, ref_update = jax.jit(opt.update), jax.jit(inner.update)
    for i in range(3):
        grads = jax.tree.map(lambda p, i=i: (3.0 + i) * p + 1.0, params)  # norm > 1
        updates, state = update(scale_tree(grads, SCALE[variant]), state, params)
        expected, ref_state = ref_update(grads, ref_state, params)
        chex.assert_trees_all_close(updates, expected, rtol=1e-6, atol=0.0)
        params = optax.apply_updates(params, updates)
    chex.assert_trees_all_close(state.inner_state, ref_state, rtol=1e-6, atol=0.0)


# ------------------------------------------------------------- scaled_value_and_grad


def test_scaled_value_and_grad_scales_gradients_not_loss():
    def loss_fn(p, x):
        return jnp.sum(p["w"] * x) ** 2

    params = {"w": jnp.array([1.0, 2.0])}
    x = jnp.array([0.5, -1.5])
    loss, grads = mpjax.scaled_value_and_grad(loss_fn)(params, jnp.float32(256.0), x)
    ref_loss, ref_grads = jax.value_and_grad(loss_fn)(params, x)
    assert float(loss) == float(ref_loss) == 6.25
    np.testing.assert_array_equal(grads["w"], 256.0 * ref_grads["w"])


def test_scaled_value_and_grad_has_aux_and_float16_loss():
    def loss_fn(p, x):
        y = (p * x).astype(jnp.float16)
        return jnp.sum(y * y), {"n": jnp.int32(2)}

    f = mpjax.scaled_value_and_grad(loss_fn, has_aux=True)
    (loss, aux), grads = f(jnp.ones(2), 1024.0, jnp.array([1.0, 3.0]))
    assert loss.dtype == jnp.float16 and float(loss) == 10.0
    assert int(aux["n"]) == 2
    np.testing.assert_array_equal(grads, [2048.0, 18432.0])


def test_scaled_value_and_grad_rejects_non_scalar_loss():
    f = mpjax.scaled_value_and_grad(lambda p: p * 2.0)
    with pytest.raises(TypeError, match="floating scalar"):
        f(jnp.ones(3), 1.0)
    with pytest.raises(TypeError, match="callable"):
        mpjax.scaled_value_and_grad("loss")


# ----------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"init_scale": 0.0}, "init_scale must be a positive"),
        ({"init_scale": -8.0}, "init_scale must be a positive"),
        ({"init_scale": INF}, "init_scale must be a positive"),
        ({"min_scale": 0.0}, "min_scale must be a positive"),
        ({"max_scale": NAN}, "max_scale must be a positive"),
        ({"factor": -2.0}, "factor must be a positive"),
        ({"factor": 1.0}, "factor must be > 1"),
        ({"period": 0}, "period must be >= 1"),
        ({"min_scale": 64.0, "max_scale": 8.0}, "min_scale .* must not exceed"),
        ({"init_scale": 2.0**30}, "within \\[min_scale, max_scale\\]"),
        ({"skip": "where"}, "skip must be one of"),
    ],
)
def test_dynamic_bad_arguments_raise_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        mpjax.dynamic_loss_scaling(optax.sgd(0.1), **kwargs)


def test_bad_arguments_raise_type_or_value_error():
    with pytest.raises(ValueError, match="scale must be a positive"):
        mpjax.static_loss_scaling(optax.sgd(0.1), 0.0)
    with pytest.raises(ValueError, match="skip must be one of"):
        mpjax.no_loss_scaling(optax.sgd(0.1), skip="never")
    with pytest.raises(TypeError, match="period must be an int"):
        mpjax.dynamic_loss_scaling(optax.sgd(0.1), period=2.5)
    with pytest.raises(TypeError, match="Python number"):
        mpjax.static_loss_scaling(optax.sgd(0.1), jnp.float32(2.0))
    with pytest.raises(TypeError, match="optax.GradientTransformation"):
        mpjax.dynamic_loss_scaling(lambda g: g)


def test_scaled_value_and_grad_leaves_integer_params_alone():
    def loss_fn(p, x):
        return jnp.sum(p["w"] * x) * p["n"].astype(jnp.float32)

    params = {"w": jnp.array([1.0, 2.0]), "n": jnp.int32(3), "on": jnp.array(True)}
    f = jax.jit(mpjax.scaled_value_and_grad(loss_fn))
    loss, grads = f(params, jnp.float32(4.0), jnp.array([1.0, -1.0]))
    assert float(loss) == -3.0
    np.testing.assert_array_equal(grads["w"], [12.0, -12.0])
    assert grads["n"].dtype == jnp.int32 and int(grads["n"]) == 0
    assert grads["on"].dtype == jnp.bool_ and not bool(grads["on"])


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variant_mixed_leaf_dtypes_keep_their_dtypes(variant):
    params = {
        "w32": jnp.ones((2, 2), jnp.float32),
        "w16": jnp.ones(3, jnp.float16),
        "wbf": jnp.ones(4, jnp.bfloat16),
    }
    opt = VARIANTS[variant](optax.sgd(0.5, momentum=0.5))
    state = opt.init(params)
    update = jax.jit(opt.update)
    # Momentum 0.5: the third step sees 0.25 + 0.5 * 0.5 only if the NaN step left
    # the trace alone.
    for value, expected in ((0.5, -0.25), (NAN, 0.0), (0.25, -0.25)):
        grads = scale_tree(make_grads(params, value), mpjax.get_loss_scale(state))
        updates, new_state = update(grads, state, params)
        chex.assert_trees_all_equal_dtypes(updates, params)
        chex.assert_trees_all_equal_shapes_and_dtypes(new_state, state)
        assert all(float(u.ravel()[0]) == expected for u in jax.tree.leaves(updates))
        state = new_state
    assert int(state.skipped) == 1


def test_docstring_examples_run():
    import doctest

    from mpjax import _loss_scale_readers, _loss_scaling, _scaled_grad, _trees

    for module in (_loss_scaling, _loss_scale_readers, _scaled_grad, _trees):
        result = doctest.testmod(module)
        assert result.attempted >= 3 and result.failed == 0, module.__name__


def test_complex_parameters_are_unscaled_too():
    def loss_fn(p, x):
        return jnp.sum(jnp.abs(p["z"] * x) ** 2) + jnp.sum(p["w"] ** 2)

    params = {"z": jnp.array([1.0 + 1.0j, 2.0 - 1.0j]), "w": jnp.array([0.5, 1.5])}
    x = jnp.array([1.0 + 0.0j, 0.5 + 0.5j])
    opt = mpjax.static_loss_scaling(optax.sgd(0.1), 2.0**12)
    loss, scaled = mpjax.scaled_value_and_grad(loss_fn)(params, 2.0**12, x)
    updates, state = jax.jit(opt.update)(scaled, opt.init(params), params)
    _, grads = jax.value_and_grad(loss_fn)(params, x)
    chex.assert_trees_all_close(updates, jax.tree.map(lambda g: -0.1 * g, grads))
    assert updates["z"].dtype == jnp.complex64 and int(state.skipped) == 0


def test_float64_gradients_are_unscaled_in_float64(x64):
    # 1e-300 is far below float32's range: unscaling in float32 would flush it to 0.
    opt = mpjax.static_loss_scaling(optax.sgd(1.0), 2.0**10)
    params = {"w": jnp.zeros(2, jnp.float64)}
    grads = {"w": jnp.full(2, 1e-300 * 2.0**10, jnp.float64)}
    updates, _ = jax.jit(opt.update)(grads, opt.init(params), params)
    assert updates["w"].dtype == jnp.float64
    np.testing.assert_array_equal(updates["w"], -1e-300)
