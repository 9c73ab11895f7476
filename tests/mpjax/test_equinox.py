"""Equinox modules under mpjax: policies, filtered gradients, the train step, fp8,
and an Equinox training loop turned float16 in a few changed lines."""

from __future__ import annotations

import difflib
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import mpjax
from experiments import _data

eqx = pytest.importorskip("equinox")

# Equinox's own layers mix Python scalars with arrays, and optax.adam promotes
# internally: these tests run under standard promotion.
pytestmark = pytest.mark.standard_promotion


class Block(eqx.Module):
    """Linear -> LayerNorm -> Linear, with an activation function as a leaf."""

    lin: eqx.nn.Linear
    norm: eqx.nn.LayerNorm
    head: eqx.nn.Linear
    act: object

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.lin = eqx.nn.Linear(4, 8, key=k1)
        self.norm = eqx.nn.LayerNorm(8)
        self.head = eqx.nn.Linear(8, 2, key=k2)
        self.act = jax.nn.gelu

    def __call__(self, x):
        return self.head(self.norm(self.act(self.lin(x))))


def _dtypes(tree):
    return [x.dtype for x in jax.tree.leaves(tree) if eqx.is_array(x)]


def _product_dtypes(fn, *args):
    jaxpr = jax.make_jaxpr(fn)(*args)
    return [
        (eqn.invars[0].aval.dtype, eqn.invars[1].aval.dtype)
        for eqn in jaxpr.eqns
        if eqn.primitive.name == "dot_general"
    ]


def test_apply_policy_keeps_the_type_and_leaves_the_model_alone():
    model = eqx.nn.MLP(4, 2, 8, 2, key=jax.random.key(0))
    mixed = mpjax.apply_policy(model, "mixed_bfloat16")
    assert isinstance(mixed, eqx.nn.MLP) and type(mixed).__name__ == "MLP"
    assert str(mixed.mpjax_policy) == "p=float32,c=bfloat16,o=float32"
    assert set(_dtypes(mixed)) == {np.dtype(jnp.float32)}
    assert mixed.activation is model.activation  # non-array leaves pass through
    x = jnp.ones(4)
    assert mixed(x).dtype == jnp.float32
    assert _product_dtypes(mixed, x) == [(jnp.bfloat16, jnp.bfloat16)] * 3
    assert _product_dtypes(model, x) == [(jnp.float32, jnp.float32)] * 3
    # same tree paths as the original, so checkpoints and filters carry over
    assert [p for p, _ in jax.tree_util.tree_leaves_with_path(mixed)] == [
        p for p, _ in jax.tree_util.tree_leaves_with_path(model)
    ]


def test_apply_policy_stores_params_and_keeps_norms_in_float32():
    half = mpjax.apply_policy(Block(jax.random.key(1)), "half")
    assert half.lin.weight.dtype == half.head.weight.dtype == jnp.float16
    assert half.norm.weight.dtype == jnp.float32  # default override
    assert str(half.norm.mpjax_policy) == "p=float32,c=float32,o=float16"
    x = jnp.ones(4, jnp.float16)
    assert half(x).dtype == jnp.float16
    assert _product_dtypes(half, x) == [(jnp.float16, jnp.float16)] * 2


def test_apply_policy_override_keeps_a_layer_in_float32():
    model = mpjax.apply_policy(
        Block(jax.random.key(2)), "mixed_float16", overrides={eqx.nn.Linear: "float32"}
    )
    assert _product_dtypes(model, jnp.ones(4)) == [(jnp.float32, jnp.float32)] * 2
    assert model(jnp.ones(4)).dtype == jnp.float32


def test_apply_policy_rejects_bad_equinox_arguments():
    model = Block(jax.random.key(3))
    with pytest.raises(TypeError, match="Equinox module classes"):
        mpjax.apply_policy(model, "float32", overrides={"LayerNorm": "float32"})
    with pytest.raises(TypeError, match="mapping from Equinox module classes"):
        mpjax.apply_policy(model, "float32", overrides=[eqx.nn.LayerNorm])
    with pytest.raises(ValueError, match="policy"):
        mpjax.apply_policy(model, "float99")
    with pytest.raises(TypeError, match="Fp8Config"):
        mpjax.apply_policy(model, "float32", fp8={"history_length": 4})


def test_missing_equinox_gives_an_install_hint(monkeypatch):
    from mpjax import _equinox

    monkeypatch.setitem(sys.modules, "equinox", None)
    with pytest.raises(ImportError, match=r"mpjax\[equinox\]"):
        _equinox.require_equinox()
    assert not _equinox.is_equinox_module(Block(jax.random.key(4)))


def test_scaled_value_and_grad_filters_non_array_leaves():
    model = eqx.nn.MLP(3, 1, 4, 1, key=jax.random.key(5))
    x = jnp.ones((2, 3))

    def loss_fn(m, x):
        return jnp.mean(jax.vmap(m)(x) ** 2)

    loss, grads = mpjax.scaled_value_and_grad(loss_fn)(model, jnp.float32(8.0), x)
    ref_loss, ref = eqx.filter_value_and_grad(loss_fn)(model, x)
    np.testing.assert_allclose(loss, ref_loss)
    assert grads.activation is None and ref.activation is None
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref), strict=True):
        np.testing.assert_allclose(g, 8.0 * r, rtol=1e-6)


def test_plain_pytree_with_a_function_leaf_trains_without_equinox():
    params = {"w": jnp.zeros(2), "act": jnp.tanh, "n": jnp.int32(3)}

    def loss_fn(p, batch):
        return jnp.mean((p["act"](batch @ p["w"]) - 0.5) ** 2)

    opt = mpjax.dynamic_loss_scaling(optax.sgd(0.5), init_scale=2.0**8)
    state = mpjax.TrainState.create(params, opt)
    assert state.opt_state.inner_state[0] == optax.EmptyState()
    # jax.jit refuses a function as an argument: run the step as it is (or
    # compile it with eqx.filter_jit)
    step = mpjax.make_train_step(loss_fn, opt, "mixed_float16")
    batch = jnp.ones((4, 2))
    losses = []
    for _ in range(5):
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    assert state.params["act"] is jnp.tanh and int(state.params["n"]) == 3
    assert losses[-1] < 0.5 * losses[0]
    assert not bool(metrics["skipped"])


def test_make_train_step_trains_an_equinox_module_under_float16():
    digits = _data.digits(seed=0)
    batch = (jnp.asarray(digits.x_train[:256]), jnp.asarray(digits.y_train[:256]))
    model = mpjax.apply_policy(
        eqx.nn.MLP(64, 10, 32, 2, key=jax.random.key(6)), "mixed_float16"
    )

    def loss_fn(m, b):
        logits = jax.vmap(m)(b[0])
        return optax.softmax_cross_entropy_with_integer_labels(logits, b[1]).mean()

    opt = mpjax.dynamic_loss_scaling(optax.adam(3e-3))
    state = mpjax.TrainState.create(model, opt, policy="mixed_float16")
    step = eqx.filter_jit(mpjax.make_train_step(loss_fn, opt, "mixed_float16"))
    losses = []
    for _ in range(40):
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    assert isinstance(state.params, eqx.nn.MLP)
    assert set(_dtypes(state.params)) == {np.dtype(jnp.float32)}
    assert losses[-1] < 0.5 * losses[0]


def test_fp8_products_in_equinox_linear_layers_train_their_scales():
    config = mpjax.Fp8Config(history_length=4)
    model = mpjax.apply_policy(
        eqx.nn.MLP(4, 2, 8, 1, key=jax.random.key(7)), "mixed_bfloat16", fp8=config
    )
    assert all(isinstance(layer, eqx.nn.Linear) for layer in model.layers)
    x = jax.random.normal(jax.random.key(8), (16, 4))
    jaxpr = str(jax.make_jaxpr(model)(x[0]))
    assert "custom_vjp_call" in jaxpr  # the fp8 product of the Flax layers

    def loss_fn(m, b):
        return jnp.mean(m(b) ** 2)  # fp8 layers take the batch directly

    opt = mpjax.fp8_delayed_scaling(mpjax.dynamic_loss_scaling(optax.adam(1e-2)))
    state = mpjax.TrainState.create(model, opt)
    step = eqx.filter_jit(mpjax.make_train_step(loss_fn, opt, "mixed_bfloat16"))
    state, _ = step(state, x)
    first = state.params.layers[0].fp8_meta
    # the history holds this step's amaxes: the input's and the weight's
    np.testing.assert_allclose(first.amax_history[0, 0], jnp.abs(x).max(), rtol=1e-2)
    np.testing.assert_allclose(
        first.amax_history[1, 0], jnp.abs(model.layers[0].weight).max(), rtol=1e-2
    )
    assert float(first.scale[0]) == pytest.approx(float(jnp.abs(x).max()) / 448.0, 1e-2)


@pytest.mark.slow
def test_fp8_linear_under_vmap_records_the_batch_amax_not_a_sum():
    config = mpjax.Fp8Config(history_length=4)
    model = mpjax.apply_policy(
        eqx.nn.MLP(4, 2, 8, 1, key=jax.random.key(9)), "float32", fp8=config
    )
    x = jax.random.normal(jax.random.key(10), (16, 4))
    np.testing.assert_allclose(jax.vmap(model)(x), model(x), rtol=1e-6)

    def per_example(m):
        return jnp.mean(jax.vmap(m)(x) ** 2)

    def whole_batch(m):
        return jnp.mean(m(x) ** 2)

    mapped = eqx.filter_grad(per_example)(model).layers[0].fp8_meta.amax
    direct = eqx.filter_grad(whole_batch)(model).layers[0].fp8_meta.amax
    np.testing.assert_allclose(mapped, direct, rtol=1e-6)
    np.testing.assert_allclose(mapped[0], jnp.abs(x).max(), rtol=1e-6)


FLOAT32_LOOP = """
model = eqx.nn.MLP(64, 10, 32, 2, key=jax.random.key(0))
optimizer = optax.adam(3e-3)
opt_state = optimizer.init(eqx.filter(model, eqx.is_array))


def loss_fn(model, x, y):
    logits = jax.vmap(model)(x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


@eqx.filter_jit
def step(model, opt_state, x, y):
    loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
    params = eqx.filter(model, eqx.is_array)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return eqx.apply_updates(model, updates), opt_state, loss


losses = []
for _ in range(40):
    model, opt_state, loss = step(model, opt_state, x, y)
    losses.append(float(loss))
"""

FLOAT16_LOOP = """
model = eqx.nn.MLP(64, 10, 32, 2, key=jax.random.key(0))
model = mpjax.apply_policy(model, "mixed_float16")
optimizer = mpjax.dynamic_loss_scaling(optax.adam(3e-3))
opt_state = optimizer.init(eqx.filter(model, eqx.is_array))


def loss_fn(model, x, y):
    logits = jax.vmap(model)(x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


@eqx.filter_jit
def step(model, opt_state, x, y):
    scale = mpjax.get_loss_scale(opt_state)
    loss, grads = mpjax.scaled_value_and_grad(loss_fn)(model, scale, x, y)
    params = eqx.filter(model, eqx.is_array)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return eqx.apply_updates(model, updates), opt_state, loss


losses = []
for _ in range(40):
    model, opt_state, loss = step(model, opt_state, x, y)
    losses.append(float(loss))
"""


def _changed_lines(a: str, b: str) -> int:
    """Lines of ``a`` replaced or deleted plus lines of ``b`` inserted, counting a
    replaced block as the longer of its two sides."""
    matcher = difflib.SequenceMatcher(a=a.splitlines(), b=b.splitlines())
    return sum(
        max(i2 - i1, j2 - j1)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes()
        if tag != "equal"
    )


def _run(program: str) -> dict:
    digits = _data.digits(seed=0)
    namespace = {
        "eqx": eqx,
        "jax": jax,
        "mpjax": mpjax,
        "optax": optax,
        "x": jnp.asarray(digits.x_train[:256]),
        "y": jnp.asarray(digits.y_train[:256]),
    }
    exec(compile(program, "<program>", "exec"), namespace)
    return namespace


def test_float32_equinox_loop_becomes_float16_in_four_changed_lines():
    assert _changed_lines(FLOAT32_LOOP, FLOAT16_LOOP) <= 4
    full, half = _run(FLOAT32_LOOP), _run(FLOAT16_LOOP)
    for run in (full, half):
        assert run["losses"][-1] < 0.5 * run["losses"][0]
    # the float16 program computes in float16 and keeps float32 master weights
    x = jnp.ones(64)
    assert _product_dtypes(half["model"], x) == [(jnp.float16, jnp.float16)] * 3
    assert set(_dtypes(half["model"])) == {np.dtype(jnp.float32)}
    assert float(mpjax.get_loss_scale(half["opt_state"])) > 1.0
    assert abs(half["losses"][-1] - full["losses"][-1]) < 0.05 * full["losses"][-1]


def test_equinox_guide_runs():
    page = Path(__file__).resolve().parents[2] / "docs/mixed_precision/equinox.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
    assert len(blocks) >= 6
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(page), "exec"), namespace)
    assert namespace["model"].layers[0].weight.dtype == jnp.float32
    assert isinstance(namespace["half"].head, namespace["Head"])
    assert namespace["half"].body.weight.dtype == jnp.float32
