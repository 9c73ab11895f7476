"""Tests for mpjax.TrainState and mpjax.make_train_step."""

from __future__ import annotations

import re

import chex
import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import mpjax

BF16 = np.dtype(jnp.bfloat16)
N_CLASSES = 3


def _init_params(key):
    k1, k2, k3 = jax.random.split(key, 3)
    return {
        "conv": 0.3 * jax.random.normal(k1, (3, 3, 1, 4)),  # HWIO
        "dense": {
            "w": 0.1 * jax.random.normal(k2, (4 * 6 * 6, 16)),
            "b": jnp.zeros(16),
        },
        "head": 0.1 * jax.random.normal(k3, (16, N_CLASSES)),
    }


def _cnn_loss(params, batch):
    x, y = batch["x"], batch["y"]
    # Trace-time contract: params and images arrive in the compute dtype, labels
    # stay integers.
    dtype = params["head"].dtype
    if x.dtype != dtype or y.dtype != jnp.int32:
        raise AssertionError(f"batch not cast as promised: {x.dtype}, {y.dtype}")
    h = jax.lax.conv_general_dilated(
        x, params["conv"], (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )
    h = jax.nn.relu(h).reshape(x.shape[0], -1)
    h = jnp.tanh(h @ params["dense"]["w"] + params["dense"]["b"][None, :])
    logits = h @ params["head"]
    onehot = jax.nn.one_hot(y, N_CLASSES, dtype=logits.dtype)
    return -jnp.mean(jnp.sum(onehot * jax.nn.log_softmax(logits), axis=-1))


def _batch(key, n=8):
    kx, ky = jax.random.split(key)
    return {
        "x": jax.random.normal(kx, (n, 8, 8, 1)),
        "y": jax.random.randint(ky, (n,), 0, N_CLASSES),
    }


@pytest.fixture(scope="module")
def cnn():
    key = jax.random.PRNGKey(0)
    return _init_params(key), _batch(jax.random.PRNGKey(1))


def _sub_jaxprs(value):
    if hasattr(value, "eqns"):
        yield value
    elif hasattr(value, "jaxpr") and hasattr(value.jaxpr, "eqns"):
        yield value.jaxpr
    elif isinstance(value, tuple | list):
        for v in value:
            yield from _sub_jaxprs(v)


def _all_eqns(jaxpr):
    for eqn in jaxpr.eqns:
        yield eqn
        for param in eqn.params.values():
            for sub in _sub_jaxprs(param):
                yield from _all_eqns(sub)


# ------------------------------------------------------------ traced-program dtypes


@pytest.mark.standard_promotion  # optax.adam promotes internally
def test_mixed_bfloat16_step_runs_matmuls_and_convs_in_bfloat16(cnn):
    params, batch = cnn
    opt = mpjax.no_loss_scaling(optax.adam(1e-3))
    step = mpjax.make_train_step(_cnn_loss, opt, "mixed_bfloat16")
    state = mpjax.TrainState.create(params, opt)

    closed = jax.make_jaxpr(step)(state, batch)
    heavy = [
        e
        for e in _all_eqns(closed.jaxpr)
        if e.primitive.name in ("dot_general", "conv_general_dilated")
    ]
    # Forward and backward: 2 dense matmuls + 1 conv, each with 1 forward op and
    # at least 1 gradient op.
    assert len(heavy) >= 6
    for eqn in heavy:
        dtypes = [v.aval.dtype for v in eqn.invars]
        assert dtypes == [BF16, BF16], (eqn.primitive.name, dtypes)

    # The same holds in the lowered StableHLO program handed to XLA.
    text = jax.jit(step).lower(state, batch).as_text()
    ops = re.findall(r"stablehlo\.(?:dot_general|convolution).*? : \((.*?)\) ->", text)
    assert len(ops) >= 6
    for operand_types in ops:
        assert re.findall(r"x([a-z]\w*)>", operand_types) == ["bf16"] * 2, operand_types

    # Master params and optimizer moments stay float32.
    new_state, metrics = jax.eval_shape(step, state, batch)
    for leaf in jax.tree.leaves(new_state.params):
        assert leaf.dtype == jnp.float32
    adam_state = new_state.opt_state.inner_state[0]
    for leaf in jax.tree.leaves((adam_state.mu, adam_state.nu)):
        assert leaf.dtype == jnp.float32
    assert metrics["loss"].dtype == jnp.float32


def test_float32_policy_keeps_matmuls_in_float32(cnn):
    params, batch = cnn
    opt = optax.sgd(0.1)
    step = mpjax.make_train_step(_cnn_loss, opt, "float32")
    closed = jax.make_jaxpr(step)(mpjax.TrainState.create(params, opt), batch)
    dots = [e for e in _all_eqns(closed.jaxpr) if e.primitive.name == "dot_general"]
    assert dots and all(v.aval.dtype == jnp.float32 for e in dots for v in e.invars)


# --------------------------------------------------------------------- behaviour


def _regression():
    key = jax.random.PRNGKey(3)
    x = jax.random.normal(key, (64, 4))
    w_true = jnp.array([1.0, -2.0, 0.5, 3.0])
    return {"x": x, "y": x @ w_true}, w_true


def _mse(params, batch):
    pred = batch["x"] @ params["w"] + params["b"]
    return jnp.mean(jnp.square(pred - batch["y"]))


@pytest.mark.standard_promotion
@pytest.mark.parametrize("policy", ["float32", "mixed_float16", "mixed_bfloat16"])
def test_training_converges_inside_scan(policy):
    batch, w_true = _regression()
    opt = mpjax.dynamic_loss_scaling(optax.adam(0.05), period=20)
    step = mpjax.make_train_step(_mse, opt, policy)
    state = mpjax.TrainState.create({"w": jnp.zeros(4), "b": jnp.zeros(())}, opt)

    @jax.jit
    def train(state):
        return jax.lax.scan(lambda s, _: step(s, batch), state, length=300)

    final, metrics = train(state)
    chex.assert_trees_all_equal_shapes_and_dtypes(final, state)
    assert int(final.step) == 300
    tol = {"float32": 1e-3, "mixed_float16": 2e-2, "mixed_bfloat16": 1e-1}[policy]
    np.testing.assert_allclose(final.params["w"], w_true, atol=tol)
    assert float(metrics["loss"][-1]) < float(metrics["loss"][0]) / 100
    skipped = np.asarray(metrics["skipped"])
    # Steps are skipped only while the float16 scale backs off from 2**15.
    assert int(final.opt_state.skipped) == int(skipped.sum())
    if policy != "mixed_float16":
        assert not skipped.any()


def test_non_finite_batch_is_skipped_and_scale_halves():
    batch, _ = _regression()
    opt = mpjax.dynamic_loss_scaling(optax.sgd(0.01), init_scale=256.0)
    step = jax.jit(mpjax.make_train_step(_mse, opt, "float32"))
    state = mpjax.TrainState.create({"w": jnp.ones(4), "b": jnp.zeros(())}, opt)

    bad = {**batch, "y": batch["y"].at[5].set(jnp.nan)}
    new, metrics = step(state, bad)
    assert bool(metrics["skipped"])
    assert float(metrics["loss_scale"]) == 256.0
    assert float(mpjax.get_loss_scale(new.opt_state)) == 128.0
    assert not np.isfinite(float(metrics["grad_norm"]))
    chex.assert_trees_all_equal(new.params, state.params)
    assert int(new.step) == 1

    newer, metrics = step(new, batch)
    assert not bool(metrics["skipped"])
    assert float(metrics["loss_scale"]) == 128.0
    assert float(jnp.abs(newer.params["w"] - new.params["w"]).max()) > 0


def test_metrics_match_unscaled_reference_step():
    batch, _ = _regression()
    params = {"w": jnp.ones(4), "b": jnp.zeros(())}
    opt = mpjax.static_loss_scaling(optax.sgd(0.01), 1024.0)
    step = jax.jit(mpjax.make_train_step(_mse, opt, "float32"))
    new, metrics = step(mpjax.TrainState.create(params, opt), batch)

    loss, grads = jax.value_and_grad(_mse)(params, batch)
    assert set(metrics) == {"loss", "loss_scale", "skipped", "stuck", "grad_norm"}
    assert metrics["skipped"].dtype == metrics["stuck"].dtype == jnp.bool_
    assert not metrics["stuck"]
    assert all(metrics[k].dtype == jnp.float32 for k in ("loss", "loss_scale"))
    np.testing.assert_allclose(metrics["loss"], loss, rtol=1e-6)
    np.testing.assert_allclose(metrics["grad_norm"], optax.tree.norm(grads), rtol=1e-5)
    expected = jax.tree.map(lambda p, g: p - 0.01 * g, params, grads)
    chex.assert_trees_all_close(new.params, expected, rtol=1e-6)


def test_plain_optimizer_has_unit_scale_and_aux_is_returned():
    batch, _ = _regression()

    def loss_with_aux(params, batch):
        loss = _mse(params, batch)
        return loss, {"double": 2 * loss}

    opt = optax.sgd(0.01)
    step = jax.jit(mpjax.make_train_step(loss_with_aux, opt, "float32", has_aux=True))
    state = mpjax.TrainState.create({"w": jnp.ones(4), "b": jnp.zeros(())}, opt)
    _, metrics = step(state, batch)
    assert float(metrics["loss_scale"]) == 1.0
    assert not bool(metrics["skipped"])
    np.testing.assert_allclose(metrics["aux"]["double"], 2 * metrics["loss"], rtol=1e-6)


def test_create_casts_to_policy_param_dtype_and_step_is_donatable():
    params = {"w": jnp.ones(4, jnp.bfloat16), "n": jnp.int32(1)}
    opt = optax.multi_transform(
        {"float": optax.sgd(0.1), "int": optax.set_to_zero()},
        {"w": "float", "n": "int"},
    )
    state = mpjax.TrainState.create(params, opt, policy="mixed_bfloat16")
    assert state.params["w"].dtype == jnp.float32
    assert state.params["n"].dtype == jnp.int32

    def loss(p, b):
        assert p["n"].dtype == jnp.int32  # integer leaves reach the loss uncast
        return jnp.sum(p["w"] * b)

    step = jax.jit(mpjax.make_train_step(loss, opt, "float32"), donate_argnums=0)
    new, _ = step(state, jnp.ones(4))
    np.testing.assert_allclose(new.params["w"], 0.9)
    assert new.params["n"].dtype == jnp.int32
    assert int(new.params["n"]) == 1 and int(new.step) == 1


@pytest.mark.standard_promotion
def test_checkpoint_round_trip_keeps_loss_scale_state(tmp_path):
    batch, _ = _regression()
    opt = mpjax.dynamic_loss_scaling(optax.adam(0.01), init_scale=64.0, period=2)
    step = jax.jit(mpjax.make_train_step(_mse, opt, "mixed_float16"))
    state = mpjax.TrainState.create({"w": jnp.zeros(4), "b": jnp.zeros(())}, opt)
    for b in (batch, {**batch, "y": batch["y"] * jnp.inf}, batch, batch, batch):
        state, _ = step(state, b)
    assert int(state.opt_state.skipped) == 1 and int(state.opt_state.counter) == 1

    template = mpjax.TrainState.create({"w": jnp.ones(4), "b": jnp.ones(())}, opt)
    restored = flax.serialization.from_bytes(
        template, flax.serialization.to_bytes(state)
    )
    assert type(restored) is mpjax.TrainState
    assert type(restored.opt_state) is mpjax.DynamicLossScaleState
    chex.assert_trees_all_equal(restored, state)
    chex.assert_trees_all_equal_shapes_and_dtypes(restored, state)

    import orbax.checkpoint as ocp

    path = tmp_path / "ckpt"
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(path, state)
        ckptr.wait_until_finished()
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
        from_disk = ckptr.restore(path, abstract)
    from_disk = jax.tree.unflatten(
        jax.tree.structure(template), jax.tree.leaves(from_disk)
    )
    chex.assert_trees_all_equal(from_disk, state)

    # Training continues identically from the restored state.
    a, ma = step(state, batch)
    b, mb = step(from_disk, batch)
    chex.assert_trees_all_equal((a, ma), (b, mb))
    assert float(ma["loss_scale"]) == 64.0
    assert float(mpjax.get_loss_scale(a.opt_state)) == 128.0  # 2nd finite step


@pytest.mark.standard_promotion
def test_orbax_checkpoint_manager_resumes_training_exactly(tmp_path):
    """The guide's recipe: an interrupted run restored by orbax's CheckpointManager
    continues with the same parameters, optimizer state and loss scale."""
    import orbax.checkpoint as ocp

    batch, _ = _regression()
    inf = {**batch, "y": batch["y"] * jnp.inf}
    batches = [inf if i in (3, 14) else batch for i in range(20)]  # two overflows
    opt = mpjax.dynamic_loss_scaling(optax.adam(0.01), init_scale=64.0, period=2)
    step = jax.jit(mpjax.make_train_step(_mse, opt, "mixed_float16"))

    def fresh():
        return mpjax.TrainState.create({"w": jnp.zeros(4), "b": jnp.zeros(())}, opt)

    straight = fresh()
    scales = []
    for b in batches:
        straight, metrics = step(straight, b)
        scales.append(float(metrics["loss_scale"]))
    assert len(set(scales)) > 2  # the scale grew and backed off

    options = ocp.CheckpointManagerOptions(save_interval_steps=5, max_to_keep=2)
    with ocp.CheckpointManager(tmp_path / "ckpt", options=options) as manager:
        state = fresh()
        for b in batches[:13]:  # interrupted after step 13
            state, _ = step(state, b)
            manager.save(int(state.step), args=ocp.args.StandardSave(state))
        manager.wait_until_finished()
    assert sorted(int(p.name) for p in (tmp_path / "ckpt").iterdir()) == [5, 10]

    with ocp.CheckpointManager(tmp_path / "ckpt", options=options) as manager:
        latest = manager.latest_step()
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, fresh())
        state = manager.restore(latest, args=ocp.args.StandardRestore(abstract))
    assert type(state) is mpjax.TrainState and int(state.step) == latest == 10
    assert float(mpjax.get_loss_scale(state.opt_state)) == scales[10]
    for b in batches[latest:]:
        state, _ = step(state, b)
    chex.assert_trees_all_equal(state, straight)


# --------------------------------------------------------------------- bad input


def test_bad_arguments_raise_before_tracing():
    with pytest.raises(TypeError, match="loss_fn must be callable"):
        mpjax.make_train_step("loss", optax.sgd(0.1), "float32")
    with pytest.raises(TypeError, match="optax.GradientTransformation"):
        mpjax.make_train_step(_mse, object(), "float32")
    with pytest.raises(ValueError, match="Unknown dtype name"):
        mpjax.make_train_step(_mse, optax.sgd(0.1), "mixed_float17")
    with pytest.raises(TypeError, match="optax.GradientTransformation"):
        mpjax.TrainState.create({"w": jnp.ones(2)}, "adam")


def test_docstring_examples_run():
    import doctest

    from mpjax import _train

    result = doctest.testmod(_train)
    assert result.attempted >= 4 and result.failed == 0
