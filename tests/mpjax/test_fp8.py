"""Tests for fp8 delayed scaling: the math, the layers, the optimizer wrapper."""

from __future__ import annotations

import io

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import mpjax
from experiments._jaxpr import equations
from mpjax._fp8 import Fp8Config, Fp8Meta, Fp8MetaValue, fp8_loss
from mpjax._fp8_ops import Fp8DotGeneral
from mpjax._fp8_optim import fp8_delayed_scaling, update_fp8_meta

E4M3, E5M2 = 448.0, 57344.0


def _meta_leaves(tree):
    leaves = jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, Fp8Meta))
    return [x.get_value() for x in leaves if isinstance(x, Fp8Meta)]


# --- the delayed-scaling math ---------------------------------------------------


def test_update_fp8_meta_matches_hand_computation():
    value = Fp8MetaValue.create(
        jnp.ones(3), [[2.0, 1.0, 0.5], [0.0, 0.0, 0.0], [4.0, 8.0, 1.0]]
    )
    config = Fp8Config(history_length=3, margin=1)
    new = update_fp8_meta(value, jnp.array([3.0, 0.5, 16.0]), config)
    # Flax's layout: roll left by one, newest at index 0 (drops index 1).
    np.testing.assert_array_equal(
        new.amax_history, [[3.0, 0.5, 2.0], [0.5, 0.0, 0.0], [16.0, 1.0, 4.0]]
    )
    # scale = max(history) * 2**margin / fp8_max (the divisor of the quantiser)
    np.testing.assert_allclose(
        new.scale, [3.0 * 2 / E4M3, 0.5 * 2 / E4M3, 16.0 * 2 / E5M2], rtol=1e-6
    )
    np.testing.assert_array_equal(new.amax, np.zeros(3))


def test_update_fp8_meta_keeps_scale_while_history_is_empty():
    value = Fp8MetaValue.create([0.5, 2.0, 4.0], np.zeros((3, 2)))
    new = update_fp8_meta(value, jnp.zeros(3), Fp8Config(history_length=2))
    np.testing.assert_allclose(new.scale, [0.5, 2.0, 4.0], rtol=1e-6)


def test_update_fp8_meta_never_pushes_non_finite_amax():
    value = Fp8MetaValue.create([0.5, 0.25, 2.0], [[1.0, 2.0], [3.0, 4.0], [5, 6]])
    new = update_fp8_meta(
        value, jnp.array([jnp.nan, jnp.inf, 7.0]), Fp8Config(history_length=2)
    )
    np.testing.assert_array_equal(new.amax_history[:2], value.amax_history[:2])
    np.testing.assert_array_equal(new.scale[:2], value.scale[:2])
    np.testing.assert_array_equal(new.amax_history[2], [7.0, 5.0])
    assert np.isfinite(new.amax_history).all() and np.isfinite(new.scale).all()


def test_update_fp8_meta_skip_and_loss_scale_ratio():
    value = Fp8MetaValue.create([0.5, 0.25, 2.0], [[1.0, 2.0], [3.0, 4.0], [5, 6]])
    new = update_fp8_meta(
        value,
        jnp.array([9.0, 9.0, 9.0]),
        Fp8Config(history_length=2),
        skipped=jnp.array(True),
        loss_scale_ratio=0.5,
    )
    np.testing.assert_array_equal(new.amax_history[:2], value.amax_history[:2])
    np.testing.assert_array_equal(new.amax_history[2], [2.5, 3.0])
    np.testing.assert_array_equal(new.scale, [0.5, 0.25, 1.0])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"history_length": 0},
        {"margin": -1},
        {"margin": 1.5},
        {"forward_dtype": jnp.bfloat16},
        {"gradient_dtype": "float32"},
    ],
)
def test_fp8_config_rejects_bad_values(kwargs):
    with pytest.raises(ValueError, match="Fp8Config"):
        Fp8Config(**kwargs)


# --- the fp8 product --------------------------------------------------------------


def _dot_with_scale(scale):
    op = Fp8DotGeneral(Fp8Config(history_length=2))
    op.fp8_meta.set_value(Fp8MetaValue.create(scale, np.zeros((3, 2))))
    return op


def test_forward_quantizes_to_e4m3_with_the_stored_scale():
    dims = (((1,), (0,)), ((), ()))
    x = jnp.array([[0.3, 1000.0]])
    w = jnp.eye(2)
    # 0.3 rounds to 0.3125 in e4m3 (3 mantissa bits); 1000 saturates at 448.
    out = _dot_with_scale([1.0, 1.0, 1.0])(x, w, dims)
    np.testing.assert_array_equal(out, [[0.3125, 448.0]])
    # With scale 4, 1000 / 4 = 250 rounds to 256 (spacing 32 in [128, 256)).
    out = _dot_with_scale([4.0, 1.0, 1.0])(x, w, dims)
    np.testing.assert_array_equal(out[0, 1], 1024.0)


def test_backward_quantizes_gradient_to_e5m2_and_reports_amaxes():
    dims = (((1,), (0,)), ((), ()))
    op = _dot_with_scale([1.0, 1.0, 1.0])
    x = jnp.array([[2.0, -3.0]])
    w = jnp.array([[1.0], [0.5]])
    graphdef, state = nnx.split(op)
    meta = op.fp8_meta.get_value()

    def f(x, amax):
        state["fp8_meta"] = state["fp8_meta"].replace(meta._replace(amax=amax))
        # cotangent 0.3: e5m2 (2 mantissa bits) rounds it to 0.3125
        return 0.3 * jnp.sum(nnx.merge(graphdef, state)(x, w, dims))

    gx, gamax = jax.grad(f, argnums=(0, 1))(x, meta.amax)
    np.testing.assert_array_equal(gx, [[0.3125, 0.15625]])
    np.testing.assert_array_equal(gamax, [3.0, 1.0, 0.30000001192092896])


def test_fp8_formats_appear_in_forward_and_backward():
    model = mpjax.apply_policy(
        nnx.Linear(4, 3, rngs=nnx.Rngs(0)), "float32", fp8=Fp8Config(8)
    )
    graphdef, state = nnx.split(model)
    x = jnp.ones((2, 4))

    def loss(s):
        return jnp.sum(nnx.merge(graphdef, s)(x))

    def floats(fn):
        text = str(jax.make_jaxpr(fn)(state))
        return "f8_e4m3fn" in text, "f8_e5m2" in text

    assert floats(loss) == (True, False)
    params, rest = nnx.split_state(state, nnx.Param, ...)

    def grad(p):
        return jax.grad(lambda q: loss(nnx.merge_state(q, rest)))(p)

    text = str(jax.make_jaxpr(grad)(params))
    assert "f8_e4m3fn" in text and "f8_e5m2" in text


def _producers(jaxpr):
    """``{var: eqn}`` of a jaxpr and of its sub-jaxprs, with every dot_general."""
    producers, dots = {}, []
    for eqn in equations(jaxpr):
        producers.update({v: eqn for v in eqn.outvars})
        if eqn.primitive.name == "dot_general":
            dots.append(eqn)
    return producers, dots


def _fp8_source(var, producers):
    """The fp8 dtype of ``var = convert(f8 operand) * broadcast(scale)``, or None."""
    mul = producers.get(var)
    if mul is None or mul.primitive.name != "mul":
        return None
    kinds = {producers[v].primitive.name for v in mul.invars if v in producers}
    if kinds != {"convert_element_type", "broadcast_in_dim"}:
        return None
    (convert,) = (
        producers[v]
        for v in mul.invars
        if producers[v].primitive.name == "convert_element_type"
    )
    dtype = convert.invars[0].aval.dtype
    return dtype.name if "float8" in dtype.name else None


def test_fp8_operands_reach_the_product_as_the_gpu_rewriter_expects():
    # XLA's GPU rewriter turns dot(convert(f8) * scale, convert(f8) * scale) into
    # a cuBLASLt fp8 GEMM; a dequantisation through float32 would hide the f8 type.
    model = mpjax.apply_policy(
        nnx.Linear(32, 16, rngs=nnx.Rngs(0)), "mixed_bfloat16", fp8=Fp8Config(4)
    )
    graphdef, params, rest = nnx.split(model, (nnx.Param, Fp8Meta), ...)
    x = jnp.ones((8, 32))

    def loss(p):
        return jnp.sum(nnx.merge(graphdef, p, rest)(x).astype(jnp.float32) ** 2)

    closed = jax.make_jaxpr(jax.grad(loss, allow_int=True))(params)
    producers, dots = _producers(closed.jaxpr)
    pairs = sorted(tuple(_fp8_source(v, producers) for v in dot.invars) for dot in dots)
    e4, e5 = "float8_e4m3fn", "float8_e5m2"
    # forward (once, and replayed in the backward pass), then both gradients
    assert set(pairs) == {(e4, e4), (e5, e4)}, pairs
    assert pairs.count((e5, e4)) == 2
    assert all(d.outvars[0].aval.dtype == jnp.bfloat16 for d in dots)


# --- NNX integration and training ------------------------------------------------


@pytest.mark.slow
@pytest.mark.standard_promotion  # optax.adam promotes internally
def test_fp8_trains_through_nnx_optimizer_with_the_model_config():
    config = Fp8Config(history_length=4, margin=1)
    model = mpjax.apply_policy(
        nnx.Linear(16, 16, rngs=nnx.Rngs(0)), "mixed_bfloat16", fp8=config
    )
    tx = fp8_delayed_scaling(mpjax.dynamic_loss_scaling(optax.adam(1e-2)))
    optimizer = nnx.Optimizer(model, tx, wrt=(nnx.Param, Fp8Meta))
    x = jax.random.normal(jax.random.key(0), (8, 16))
    wrt = nnx.DiffState(0, (nnx.Param, Fp8Meta))

    @nnx.jit
    def step(model, optimizer):
        def loss_fn(m):
            return jnp.mean(jnp.square(m(x).astype(jnp.float32)))

        loss, grads = mpjax.nnx_value_and_grad(loss_fn, optimizer, argnums=wrt)(model)
        optimizer.update(model, grads)
        return loss

    losses = [float(step(model, optimizer)) for _ in range(4)]
    assert losses[-1] < losses[0]
    meta = model.dot_general.fp8_meta.get_value()
    assert meta.config == config  # carried through the pure optimizer trees
    amax_x = float(jnp.max(jnp.abs(x)))
    np.testing.assert_allclose(meta.amax_history[0, 0], amax_x, rtol=1e-2)
    # scale = max(history) * 2**margin / 448, with this model's margin of 1
    np.testing.assert_allclose(
        meta.scale[0], jnp.max(meta.amax_history[0]) * 2.0 / E4M3, rtol=1e-6
    )


class _Twice(nnx.Module):
    """One bias-free layer applied twice (shared weights)."""

    def __init__(self) -> None:
        self.layer = nnx.Linear(2, 2, use_bias=False, rngs=nnx.Rngs(0))

    def __call__(self, x):
        return self.layer(x) + self.layer(3.0 * x)


def _setup(model, policy, config, inner, *, wrap=True):
    model = mpjax.apply_policy(model, policy, fp8=config)
    graphdef, params, rest = nnx.split(model, (nnx.Param, Fp8Meta), ...)

    def loss_fn(p, batch):
        out = nnx.merge(graphdef, p, rest)(batch).astype(jnp.float32)
        return jnp.mean(jnp.square(out))

    optimizer = fp8_delayed_scaling(inner, config)
    step = mpjax.make_train_step(
        fp8_loss(loss_fn) if wrap else loss_fn, optimizer, policy
    )
    return jax.jit(step), mpjax.TrainState.create(params, optimizer)


def test_apply_policy_swaps_products_and_keeps_the_rest():
    rngs = nnx.Rngs(0)
    attention = nnx.MultiHeadAttention(2, 8, decode=False, rngs=rngs)
    einsum = nnx.Einsum("bi,io->bo", (8, 4), rngs=rngs)
    custom = nnx.Linear(8, 8, dot_general=jax.lax.dot_general, rngs=rngs)
    custom.dot_general = nnx.data(lambda *a, **k: jax.lax.dot_general(*a, **k))
    for module, count in ((attention, 4), (einsum, 1), (custom, 0)):
        converted = mpjax.apply_policy(module, "float32", fp8=Fp8Config(4))
        assert len(_meta_leaves(nnx.state(converted))) == count
        assert not _meta_leaves(nnx.state(module))  # the original is untouched
    x = jax.random.normal(jax.random.key(1), (3, 5, 8))
    converted = mpjax.apply_policy(attention, "float32", fp8=Fp8Config(4))
    call = nnx.jit(lambda module, x: module(x))
    exact, fp8 = call(attention, x), call(converted, x)
    assert not np.array_equal(exact, fp8)
    np.testing.assert_allclose(fp8, exact, atol=0.15 * float(jnp.max(jnp.abs(exact))))
    with pytest.raises(TypeError, match="Fp8Config"):
        mpjax.apply_policy(einsum, "float32", fp8={"history_length": 4})


@pytest.mark.standard_promotion  # optax.sgd promotes internally
@pytest.mark.parametrize("wrap", [True, False])
def test_layer_used_twice_records_max_amax(wrap):
    step, state = _setup(
        _Twice(), "float32", Fp8Config(history_length=4), optax.sgd(0.0), wrap=wrap
    )
    x = jnp.array([[1.0, -0.5]])
    state, _ = step(state, x)
    (meta,) = _meta_leaves(state.params)
    # the two uses see inputs of amax 1 and 3: the max is 3, the sum would be 4
    assert float(meta.amax_history[0, 0]) == (3.0 if wrap else 4.0)


@pytest.mark.standard_promotion
def test_state_jits_scans_and_checkpoints():
    config = Fp8Config(history_length=4)
    model = nnx.Sequential(
        nnx.Linear(3, 8, rngs=nnx.Rngs(0)), nnx.relu, nnx.Linear(8, 2, rngs=nnx.Rngs(1))
    )
    step, state = _setup(model, "mixed_bfloat16", config, optax.adam(1e-2))
    batches = jax.random.normal(jax.random.key(0), (5, 4, 3))
    looped = state
    for batch in batches:
        looped, _ = step(looped, batch)
    scanned, _ = jax.jit(lambda s: jax.lax.scan(step, s, batches))(state)
    jax.tree.map(np.testing.assert_array_equal, looped, scanned)
    metas = _meta_leaves(scanned.params)
    assert len(metas) == 2
    for meta, first in zip(metas, _meta_leaves(state.params), strict=True):
        assert meta.scale_bits.dtype == jnp.int32 and meta.amax.dtype == jnp.float32
        assert meta.history_bits.shape == first.history_bits.shape
        assert (meta.amax_history > 0).all()  # five steps filled four slots
    # a checkpoint: plain NumPy arrays (int32 bits included) written and read back
    leaves, treedef = jax.tree.flatten(scanned)
    buffer = io.BytesIO()
    np.savez(buffer, *[np.asarray(x) for x in leaves])
    buffer.seek(0)
    with np.load(buffer) as saved:
        restored = jax.tree.unflatten(treedef, [saved[k] for k in saved.files])
    jax.tree.map(np.testing.assert_array_equal, restored, scanned)
    again, _ = step(restored, batches[0])
    jax.tree.map(np.testing.assert_array_equal, again, step(scanned, batches[0])[0])


def test_grad_norm_leaves_the_fp8_state_out():
    config = Fp8Config(history_length=4)
    model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    step, state = _setup(model, "float32", config, optax.sgd(0.0))
    # small inputs: gradients ~1e-4, while the weights' amax (~0.7) would dominate
    batch = 0.01 * jnp.ones((4, 3))
    _, metrics = step(state, batch)
    fp8_model = mpjax.apply_policy(model, "float32", fp8=config)
    graphdef, params, rest = nnx.split(fp8_model, nnx.Param, ...)

    def plain(p):
        out = nnx.merge(graphdef, p, rest)(batch)
        return jnp.mean(jnp.square(out))

    grads = jax.grad(plain)(params)
    expected = optax.tree.norm(grads)
    np.testing.assert_allclose(metrics["grad_norm"], expected, rtol=0.05)


@pytest.mark.standard_promotion
def test_overflow_step_is_skipped_and_fp8_state_not_poisoned():
    config = Fp8Config(history_length=4)
    model = nnx.Linear(4, 4, use_bias=False, rngs=nnx.Rngs(0))
    inner = mpjax.dynamic_loss_scaling(optax.adam(1e-2), init_scale=2.0**24)
    step, state = _setup(model, "mixed_float16", config, inner)
    before = _meta_leaves(state.params)[0]
    state, metrics = step(state, jnp.ones((2, 4)))
    # every parameter gradient went through the e5m2 quantiser: had it saturated
    # the float16 infinities, the loss scaler would not have seen the overflow
    assert bool(metrics["skipped"])
    after = _meta_leaves(state.params)[0]
    np.testing.assert_array_equal(after.amax_history[:2], before.amax_history[:2])
    np.testing.assert_array_equal(after.scale, before.scale * jnp.array([1, 1, 0.5]))
    assert np.isfinite(after.amax_history).all() and np.isfinite(after.scale).all()
    while bool(metrics["skipped"]):
        state, metrics = step(state, jnp.ones((2, 4)))
    good = _meta_leaves(state.params)[0]
    assert (good.amax_history[:, 0] > 0).all() and np.isfinite(good.scale).all()
    # the gradient amax is measured on loss-scaled cotangents
    assert float(good.amax_history[2, 0]) > 1.0


def test_fp8_delayed_scaling_rejects_bad_input():
    with pytest.raises(TypeError, match="optax"):
        fp8_delayed_scaling("adam")
    with pytest.raises(TypeError, match="Fp8Config"):
        fp8_delayed_scaling(optax.sgd(0.1), {"margin": 1})
    with pytest.raises(ValueError, match="no mpjax.Fp8Meta"):
        fp8_delayed_scaling(optax.sgd(0.1)).init({"w": jnp.zeros(2)})
    model = mpjax.apply_policy(
        nnx.Linear(2, 2, rngs=nnx.Rngs(0)), "float32", fp8=Fp8Config(4)
    )
    params = nnx.state(model, (nnx.Param, Fp8Meta))
    with pytest.raises(ValueError, match="model carries"):
        fp8_delayed_scaling(optax.sgd(0.1), Fp8Config(8)).init(params)
    # a different margin alone is caught too: the model carries its config
    with pytest.raises(ValueError, match="margin=2.*model carries.*margin=0"):
        fp8_delayed_scaling(optax.sgd(0.1), Fp8Config(4, margin=2)).init(params)
    tx = fp8_delayed_scaling(optax.sgd(0.1), Fp8Config(4))
    with pytest.raises(ValueError, match="needs params"):
        tx.update(params, tx.init(params))


@pytest.mark.slow
@pytest.mark.standard_promotion
def test_digits_mlp_fp8_matches_bfloat16():
    from experiments import _data, _models

    data = _data.digits(seed=0)
    batches = np.random.default_rng(0).integers(0, len(data.x_train), (120, 64))
    train = (jnp.asarray(data.x_train[batches]), jnp.asarray(data.y_train[batches]))
    test = (jnp.asarray(data.x_test).astype(jnp.bfloat16), jnp.asarray(data.y_test))

    def held_out(config):
        model = _models.MLP(64, 32, 10, rngs=nnx.Rngs(0))
        model = mpjax.apply_policy(model, "mixed_bfloat16", fp8=config)
        graphdef, params, rest = nnx.split(model, (nnx.Param, Fp8Meta), ...)

        def loss_fn(p, batch):
            return _models.classification_loss(nnx.merge(graphdef, p, rest), batch)

        optimizer = optax.adam(3e-3)
        if config is not None:
            optimizer = fp8_delayed_scaling(optimizer, config)
            loss_fn = fp8_loss(loss_fn)
        step = mpjax.make_train_step(loss_fn, optimizer, "mixed_bfloat16")
        state = mpjax.TrainState.create(params, optimizer)
        state, _ = jax.jit(lambda s: jax.lax.scan(step, s, train))(state)
        params = mpjax.get_policy("mixed_bfloat16").cast_to_compute(state.params)
        trained = nnx.merge(graphdef, params, rest)
        return (
            float(_models.classification_loss(trained, test)),
            float(_models.classification_accuracy(trained, test)),
        )

    (loss_bf16, acc_bf16), (loss_fp8, acc_fp8) = map(
        held_out, (None, Fp8Config(history_length=16))
    )
    assert loss_bf16 < 0.5  # it learned something
    # the tolerances of the amp pipeline's mlp task (experiments/_amp_tasks.py)
    assert abs(loss_fp8 - loss_bf16) <= 0.02 + 0.10 * loss_bf16
    assert abs(acc_fp8 - acc_bf16) <= 0.03


def test_conv_runs_in_fp8_forward_and_backward():
    config = Fp8Config(history_length=4)
    conv = nnx.Conv(2, 3, (3, 3), rngs=nnx.Rngs(0))
    model = mpjax.apply_policy(conv, "float32", fp8=config)
    assert type(conv.conv_general_dilated).__name__ != "Fp8ConvGeneralDilated"
    x = jax.random.normal(jax.random.key(1), (2, 6, 6, 2))
    # initial scales are 1: the operands are rounded to e4m3 as they are
    e4m3 = jnp.float8_e4m3fn
    kernel = model.kernel[...].astype(e4m3).astype(jnp.float32)
    expected = nnx.Conv(2, 3, (3, 3), rngs=nnx.Rngs(0))
    expected.kernel[...] = kernel
    np.testing.assert_allclose(
        model(x), expected(x.astype(e4m3).astype(jnp.float32)), rtol=1e-5, atol=1e-6
    )
    graphdef, params, rest = nnx.split(model, (nnx.Param, Fp8Meta), ...)

    def loss(p, x):
        return jnp.mean(nnx.merge(graphdef, p, rest)(x) ** 2)

    grad = jax.grad(fp8_loss(loss), allow_int=True)
    text = str(jax.make_jaxpr(grad)(params, x))
    assert "f8_e4m3fn" in text and "f8_e5m2" in text
    amax = grad(params, x)["conv_general_dilated"]["fp8_meta"].get_value().amax
    assert float(amax[0]) == pytest.approx(float(jnp.max(jnp.abs(x))))
