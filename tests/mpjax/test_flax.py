"""Tests for the Flax glue: apply_policy (NNX) and policy_apply (linen-style)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import mpjax
from experiments._jaxpr import equations

BF16, F16, F32 = jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), jnp.dtype(jnp.float32)


def _ops(fn, *args):
    """``[(primitive, operand dtypes, output dtypes)]`` of ``fn(*args)``."""
    closed = jax.make_jaxpr(fn)(*args)
    return [
        (
            eqn.primitive.name,
            tuple(v.aval.dtype for v in eqn.invars if hasattr(v.aval, "dtype")),
            tuple(v.aval.dtype for v in eqn.outvars),
        )
        for eqn in equations(closed.jaxpr)
    ]


class Net(nnx.Module):
    """Linear -> LayerNorm -> self-attention -> Conv -> Linear."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        self.dense = nnx.Linear(6, 8, rngs=rngs)
        self.norm = nnx.LayerNorm(8, rngs=rngs)
        self.attention = nnx.MultiHeadAttention(2, 8, decode=False, rngs=rngs)
        self.conv = nnx.Conv(8, 8, (3,), rngs=rngs)
        self.head = nnx.Linear(8, 3, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = self.norm(self.dense(x))
        mask = nnx.make_causal_mask(x[..., 0], dtype=jnp.bool_)
        h = self.attention(h, mask=mask)
        return self.head(self.conv(h))


class Wide(nnx.Linear):
    """A subclass, to check that overrides follow the MRO."""


class Pair(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.inner = nnx.Linear(4, 4, rngs=rngs)
        self.wide = Wide(4, 4, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.wide(self.inner(x))


@pytest.fixture(scope="module")
def net() -> Net:
    return Net(nnx.Rngs(0))


@pytest.fixture(scope="module")
def x() -> jax.Array:
    return jax.random.normal(jax.random.key(1), (2, 5, 6), jnp.float32)


@pytest.fixture(scope="module")
def bf16_ops(net, x):
    mixed = mpjax.apply_policy(net, "mixed_bfloat16")
    graphdef, state = nnx.split(mixed)
    return _ops(lambda s, x: nnx.merge(graphdef, s)(x), state, x)


def _matmuls(ops):
    return [op for op in ops if op[0] in ("dot_general", "conv_general_dilated")]


def test_apply_policy_matmuls_and_convs_take_bf16_operands(bf16_ops):
    matmuls = _matmuls(bf16_ops)
    # dense, query, key, value, logits, weights @ values, out, conv, head
    assert len(matmuls) == 9
    assert all(operands == (BF16, BF16) for _, operands, _ in matmuls), matmuls
    assert any(op[0] == "conv_general_dilated" for op in matmuls)


def test_apply_policy_attention_logits_and_softmax_in_float32(bf16_ops):
    wide_out = [op for op in _matmuls(bf16_ops) if op[2] == (F32,)]
    assert len(wide_out) == 1  # the logits: bf16 operands, float32 accumulation
    exps = [op for op in bf16_ops if op[0] == "exp"]
    assert exps and all(op[2] == (F32,) for op in exps)


def test_apply_policy_layernorm_override_computes_in_float32(net, bf16_ops):
    rsqrt = [op for op in bf16_ops if op[0] == "rsqrt"]
    assert rsqrt and all(op[2] == (F32,) for op in rsqrt)
    mixed = mpjax.apply_policy(net, "mixed_bfloat16")
    assert mixed.norm.dtype == F32 and mixed.dense.dtype == BF16


def test_apply_policy_params_stay_float32_and_output_in_output_dtype(net, x):
    mixed = mpjax.apply_policy(net, "mixed_bfloat16")
    dtypes = {v.dtype for v in jax.tree.leaves(nnx.state(mixed, nnx.Param))}
    assert dtypes == {F32}
    assert mixed(x).dtype == F32
    half_out = mpjax.apply_policy(net, "p=f32,c=bf16,o=bf16")
    assert half_out(x).dtype == BF16


def test_apply_policy_param_dtype_casts_params(net):
    half = mpjax.apply_policy(net, "p=bf16,c=bf16,o=f32")
    params = nnx.state(half, nnx.Param)
    assert params["dense"]["kernel"][...].dtype == BF16
    # LayerNorm keeps its float32 override, params included.
    assert params["norm"]["scale"][...].dtype == F32
    assert half.dense.param_dtype == BF16


def test_apply_policy_leaves_the_original_untouched(net, x):
    before = net(x)
    mixed = mpjax.apply_policy(net, "mixed_float16")
    mixed.dense.kernel[...] = jnp.zeros_like(mixed.dense.kernel[...])
    assert type(net) is Net and net.dense.dtype is None
    assert net.attention.attention_fn is nnx.dot_product_attention
    np.testing.assert_array_equal(net(x), before)


def test_apply_policy_keeps_type_paths_and_state_structure(net):
    mixed = mpjax.apply_policy(net, "mixed_bfloat16")
    assert isinstance(mixed, Net) and isinstance(mixed.norm, nnx.LayerNorm)
    original = jax.tree.structure(nnx.state(net, nnx.Param))
    assert jax.tree.structure(nnx.state(mixed, nnx.Param)) == original
    again = mpjax.apply_policy(mixed, "float32")
    assert type(again) is type(mixed)  # no double wrapping
    assert again.dense.dtype == F32


def test_apply_policy_float32_matches_the_original_model(net, x):
    # Also checks the float32-softmax attention against Flax's own attention.
    np.testing.assert_allclose(
        mpjax.apply_policy(net, "float32")(x), net(x), rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_apply_policy_mixed_output_is_close_to_float32(net, x, policy):
    eps = float(jnp.finfo(mpjax.get_policy(policy).compute_dtype).eps)
    reference = net(x)
    out = mpjax.apply_policy(net, policy)(x)
    scale = float(jnp.max(jnp.abs(reference)))
    assert float(jnp.max(jnp.abs(out - reference))) < 20 * eps * scale
    assert float(jnp.max(jnp.abs(out - reference))) > 0.0  # it did compute lower


def test_apply_policy_works_under_jit(net, x):
    mixed = mpjax.apply_policy(net, "mixed_bfloat16")
    np.testing.assert_allclose(nnx.jit(lambda m, x: m(x))(mixed, x), mixed(x))


def test_apply_policy_override_follows_mro_and_is_inherited():
    pair = Pair(nnx.Rngs(0))
    x = jnp.ones((2, 4), jnp.float32)
    mixed = mpjax.apply_policy(pair, "mixed_bfloat16", overrides={nnx.Linear: "f32"})
    # Wide is an nnx.Linear: the override applies to it too.
    assert mixed.inner.dtype == F32 and mixed.wide.dtype == F32
    only_wide = mpjax.apply_policy(pair, "mixed_bfloat16", overrides={Wide: "f32"})
    ops = _matmuls(_ops(only_wide, x))
    assert [operands for _, operands, _ in ops] == [(BF16, BF16), (F32, F32)]
    # A container override reaches the layers it holds.
    whole = mpjax.apply_policy(pair, "mixed_bfloat16", overrides={Pair: "float16"})
    assert whole.inner.dtype == F16 and whole.wide.dtype == F16
    assert whole(x).dtype == F16


def test_apply_policy_softmax_dtype_is_configurable(net, x):
    narrow = mpjax.apply_policy(net, "mixed_bfloat16", attention_softmax_dtype="bf16")
    graphdef, state = nnx.split(narrow)
    ops = _ops(lambda s, x: nnx.merge(graphdef, s)(x), state, x)
    exps = [op for op in ops if op[0] == "exp"]
    assert exps and all(op[2] == (BF16,) for op in exps)
    untouched = mpjax.apply_policy(net, "mixed_bfloat16", attention_softmax_dtype=None)
    assert untouched.attention.attention_fn is nnx.dot_product_attention


@pytest.fixture(scope="module")
def gqa():
    # 4 query heads sharing 2 key/value heads.
    return nnx.MultiHeadAttention(4, 8, num_kv_heads=2, decode=False, rngs=nnx.Rngs(3))


def test_apply_policy_attention_matches_flax_with_gqa_and_causal_mask(gqa, x):
    h = x[..., :4].repeat(2, axis=-1)  # (2, 5, 8)
    reference = gqa(h, is_causal=True)
    ours = mpjax.apply_policy(gqa, "float32")
    assert ours.attention_fn is not nnx.dot_product_attention
    np.testing.assert_allclose(ours(h, is_causal=True), reference, atol=1e-5)


def test_apply_policy_attention_sows_float32_weights(gqa, x):
    h = x[..., :4].repeat(2, axis=-1)
    mixed = mpjax.apply_policy(gqa, "mixed_float16")
    forward = nnx.capture(lambda m, h: m(h, sow_weights=True), nnx.Intermediate)
    out, captured = forward(mixed, h)
    (weights,) = captured["attention_weights"].get_value()
    assert out.dtype == F32 and weights.dtype == F32
    assert weights.shape == (2, 4, 5, 5)
    np.testing.assert_allclose(jnp.sum(weights, axis=-1), 1.0, rtol=1e-6)


def test_apply_policy_attention_dropout_is_applied(x):
    layer = nnx.MultiHeadAttention(
        2, 8, dropout_rate=0.5, decode=False, rngs=nnx.Rngs(0)
    )
    mixed = mpjax.apply_policy(layer, "mixed_bfloat16")
    h = x[..., :4].repeat(2, axis=-1)
    kept = mixed(h, deterministic=True)
    dropped = mixed(h, deterministic=False, rngs=nnx.Rngs(dropout=1))
    assert dropped.dtype == F32 and bool(jnp.all(jnp.isfinite(dropped)))
    assert float(jnp.max(jnp.abs(dropped - kept))) > 1e-2


def test_apply_policy_rejects_a_non_module():
    with pytest.raises(TypeError, match="NNX module.*got dict.*policy_apply"):
        mpjax.apply_policy({"w": jnp.ones(2)}, "mixed_bfloat16")


def test_apply_policy_rejects_bad_override_keys_and_values(net):
    with pytest.raises(TypeError, match="module classes.*got 'LayerNorm'"):
        mpjax.apply_policy(net, "mixed_bfloat16", overrides={"LayerNorm": "f32"})
    with pytest.raises(TypeError, match="module classes.*got <class 'int'>"):
        mpjax.apply_policy(net, "mixed_bfloat16", overrides={int: "f32"})
    with pytest.raises(ValueError, match=r"overrides\[LayerNorm\]"):
        mpjax.apply_policy(net, "mixed_bfloat16", overrides={nnx.LayerNorm: "f17"})
    with pytest.raises(TypeError, match="mapping"):
        mpjax.apply_policy(net, "mixed_bfloat16", overrides=[nnx.LayerNorm])


def test_apply_policy_rejects_bad_policy_and_softmax_dtype(net):
    with pytest.raises(ValueError, match="policy"):
        mpjax.apply_policy(net, "mixed_float17")
    with pytest.raises(ValueError, match="attention_softmax_dtype.*int32"):
        mpjax.apply_policy(net, "mixed_bfloat16", attention_softmax_dtype="int32")


class LinenMLP(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array, tokens: jax.Array) -> jax.Array:
        x = nn.Dense(8)(x) + nn.Embed(10, 8)(tokens)
        return nn.Dense(2)(jax.nn.relu(x))


@pytest.fixture(scope="module")
def linen():
    model = LinenMLP()
    x = jnp.ones((3, 4), jnp.float32)
    tokens = jnp.arange(3, dtype=jnp.int32)
    params = model.init(jax.random.key(0), x, tokens)
    return model, params, x, tokens


def test_policy_apply_casts_params_inputs_and_outputs(linen):
    model, params, x, tokens = linen
    seen = {}

    def spy(p, x, tokens):
        seen["params"] = {leaf.dtype for leaf in jax.tree.leaves(p)}
        seen["x"], seen["tokens"] = x.dtype, tokens.dtype
        return model.apply(p, x, tokens)

    out = mpjax.policy_apply(spy, "mixed_bfloat16")(params, x, tokens)
    assert seen == {"params": {BF16}, "x": BF16, "tokens": jnp.dtype(jnp.int32)}
    assert out.dtype == F32
    ops = _matmuls(
        _ops(mpjax.policy_apply(model.apply, "mixed_float16"), params, x, tokens)
    )
    assert ops and all(operands == (F16, F16) for _, operands, _ in ops)


def test_policy_apply_gradients_come_back_in_param_dtype(linen):
    model, params, x, tokens = linen
    apply = mpjax.policy_apply(model.apply, "mixed_bfloat16")
    grads = jax.grad(lambda p: jnp.sum(apply(p, x, tokens)))(params)
    assert {g.dtype for g in jax.tree.leaves(grads)} == {F32}
    reference = jax.grad(lambda p: jnp.sum(model.apply(p, x, tokens)))(params)
    tol = 0.05 * max(float(jnp.max(jnp.abs(r))) for r in jax.tree.leaves(reference))
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(reference), strict=True):
        np.testing.assert_allclose(g, r, atol=tol)


def test_policy_apply_passes_keyword_arguments_through():
    seen = {}

    def apply(params, x, *, scale):
        seen["scale"] = scale.dtype
        return params["w"] * x * scale.astype(x.dtype)

    wrapped = mpjax.policy_apply(apply, "p=f32,c=f16,o=bf16")
    out = wrapped({"w": jnp.ones(2)}, jnp.ones(2), scale=jnp.float32(2.0))
    assert seen["scale"] == F32  # keyword arguments are not cast
    assert out.dtype == BF16
    assert wrapped.__wrapped__ is apply


def test_policy_apply_rejects_non_callables_and_bad_policies():
    with pytest.raises(TypeError, match="callable.*got dict"):
        mpjax.policy_apply({}, "float32")
    with pytest.raises(ValueError, match="policy"):
        mpjax.policy_apply(lambda p, x: x, "p=f32,c=f17")


def test_apply_policy_fuses_attention_unless_dropout_or_sow(gqa, x, monkeypatch):
    calls = []
    fused = jax.nn.dot_product_attention

    def spy(*args, **kwargs):
        calls.append(kwargs.get("implementation"))
        return fused(*args, **kwargs)

    monkeypatch.setattr(jax.nn, "dot_product_attention", spy)
    h = x[..., :4].repeat(2, axis=-1)
    mixed = mpjax.apply_policy(gqa, "mixed_bfloat16")
    out = mixed(h, is_causal=True)
    # the CPU has no cuDNN: XLA's implementation, float32 logits and softmax
    assert calls == ["xla"] and out.dtype == F32
    # the weights are wanted: Flax's unfused path
    nnx.capture(lambda m, h: m(h, sow_weights=True), nnx.Intermediate)(mixed, h)
    narrow = mpjax.apply_policy(gqa, "mixed_bfloat16", attention_softmax_dtype="bf16")
    narrow(h)  # a 16-bit softmax was asked for: unfused as well
    # float16: XLA's attention needs F16_F16_F32 products, which the CPU does not
    # compile; unfused here, and it compiles
    half = mpjax.apply_policy(gqa, "mixed_float16")
    assert nnx.jit(lambda m, h: m(h))(half, h).dtype == F32
    assert calls == ["xla"]
