"""Tests for mpjax.Policy and mpjax.get_policy."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import jmp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mpjax

F32, BF16, F16, F64 = (
    np.dtype(d) for d in (jnp.float32, jnp.bfloat16, jnp.float16, jnp.float64)
)
FLOAT_DTYPES = [F32, BF16, F16, F64] + [
    np.dtype(getattr(jnp, n))
    for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
]


def _dtypes(policy):
    return (policy.param_dtype, policy.compute_dtype, policy.output_dtype)


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("p=f32,c=bf16,o=f32", (F32, BF16, F32)),
        ("params=float32,compute=float16,output=float32", (F32, F16, F32)),
        ("params=float32,compute=float16", (F32, F16, F16)),
        ("c=bf16", (F32, BF16, BF16)),
        ("p=f16", (F16, F16, F16)),
        ("o=bf16", (F32, F32, BF16)),
        ("float32", (F32, F32, F32)),
        ("full", (F32, F32, F32)),
        ("half", (F16, F16, F16)),  # CPU: jmp's half is float16 off TPU
        ("bf16", (BF16, BF16, BF16)),
        ("mixed_float16", (F32, F16, F32)),
        ("mixed_bfloat16", (F32, BF16, F32)),
        (" P = f32 , C = BF16 ", (F32, BF16, BF16)),
        ("p=f32,c=float8_e4m3fn,o=f32", (F32, np.dtype(jnp.float8_e4m3fn), F32)),
        ("c=f8e5m2", (F32, np.dtype(jnp.float8_e5m2), np.dtype(jnp.float8_e5m2))),
        ("mixed_float8_e4m3fn", (F32, np.dtype(jnp.float8_e4m3fn), F32)),
    ],
)
def test_get_policy_grammar(spec, expected):
    assert _dtypes(mpjax.get_policy(spec)) == expected


@settings(max_examples=150, deadline=None)
@given(st.tuples(*[st.sampled_from(FLOAT_DTYPES)] * 3))
def test_policy_str_parses_back_to_equal_policy(dtypes):
    with jax.enable_x64(True):  # FLOAT_DTYPES includes float64
        policy = mpjax.Policy(*dtypes)
        again = mpjax.get_policy(str(policy))
    assert again == policy
    assert hash(again) == hash(policy)
    assert _dtypes(again) == dtypes
    assert repr(policy).startswith("Policy(param_dtype=")


def test_policy_accepts_dtype_likes_and_is_frozen():
    policy = mpjax.Policy(jnp.float32, "bf16", np.dtype("float16"))
    assert _dtypes(policy) == (F32, BF16, F16)
    assert all(isinstance(d, np.dtype) for d in _dtypes(policy))
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.param_dtype = F16
    assert mpjax.get_policy(policy) is policy
    assert policy.with_output_dtype("f32") == mpjax.Policy(F32, BF16, F32)
    assert policy.with_param_dtype(F16).param_dtype == F16
    assert policy.with_compute_dtype(jnp.float32).compute_dtype == F32


def test_policy_accepts_native_number_format_and_rejects_encoded_one():
    from mpjax import formats

    policy = mpjax.Policy(F32, formats.get_format("bfloat16"), F32)
    assert policy.compute_dtype == BF16
    e4m3 = formats.get_format("float8_e4m3fn")
    assert mpjax.Policy(F32, e4m3, F32).compute_dtype == np.dtype(jnp.float8_e4m3fn)
    for name in ("fp16s", "fp16c", "posit16"):
        with pytest.raises(ValueError, match="not a native dtype"):
            mpjax.Policy(F32, formats.get_format(name), F32)


def test_cast_touches_only_floating_leaves():
    policy = mpjax.get_policy("p=f32,c=bf16,o=f16")
    key = jax.random.key(0)
    raw_key = jax.random.PRNGKey(0)
    tree = {
        "w": jnp.ones((2, 2), jnp.float32),
        "h": np.ones(3, np.float16),
        "s": np.float32(2.0),
        "count": jnp.int32(4),
        "mask": jnp.array([True, False]),
        "key": key,
        "raw_key": raw_key,
        "lr": 0.5,
        "none": None,
        "spec": jax.ShapeDtypeStruct((4,), jnp.float32),
        "ispec": jax.ShapeDtypeStruct((4,), jnp.int32),
    }
    out = policy.cast_to_compute(tree)
    assert out["w"].dtype == BF16 and isinstance(out["w"], jax.Array)
    assert out["h"].dtype == BF16 and isinstance(out["h"], np.ndarray)
    assert out["s"].dtype == BF16
    assert out["count"] is tree["count"]
    assert out["mask"] is tree["mask"]
    assert out["key"] is key and out["raw_key"] is raw_key
    assert out["lr"] == 0.5 and out["none"] is None
    assert out["spec"].dtype == BF16 and out["spec"].shape == (4,)
    assert out["ispec"] is tree["ispec"]
    assert policy.cast_to_output(tree)["w"].dtype == F16
    back = policy.cast_to_param(out)
    assert back["w"].dtype == F32
    np.testing.assert_array_equal(back["w"], tree["w"])


def test_cast_leaves_matching_dtype_uncopied_and_works_under_jit():
    policy = mpjax.get_policy("mixed_bfloat16")
    x = jnp.arange(3.0)
    assert policy.cast_to_param(x) is x

    @jax.jit
    def f(tree):
        return policy.cast_to_compute(tree)

    out = f({"x": x, "n": jnp.arange(3)})
    assert out["x"].dtype == BF16 and out["n"].dtype == jnp.int32


def test_jmp_round_trip_and_casting_agree(x64):
    for spec in ("p=f32,c=bf16,o=f32", "half", "c=f16", "f64", "mixed_bfloat16"):
        policy = mpjax.get_policy(spec)
        theirs = policy.to_jmp()
        assert isinstance(theirs, jmp.Policy)
        assert mpjax.Policy.from_jmp(theirs) == policy
        assert mpjax.get_policy(theirs) == policy
        assert mpjax.get_policy(str(theirs)) == policy
    policy = mpjax.get_policy("p=f32,c=bf16,o=f16")
    tree = {"a": jnp.ones(2), "b": jnp.arange(2)}
    for ours, theirs in (
        (policy.cast_to_compute, policy.to_jmp().cast_to_compute),
        (policy.cast_to_output, policy.to_jmp().cast_to_output),
    ):
        a, b = ours(tree), theirs(tree)
        assert jax.tree.map(lambda x: x.dtype, a) == jax.tree.map(lambda x: x.dtype, b)


_KEYS = ["p", "params", "c", "compute", "o", "output", "x", "P", ""]
_NAMES = [
    "f32", "float32", "full", "bf16", "bfloat16", "f16", "float16", "half", "f64",
    "float64", "float8_e4m3fn", "int32", "F32", "f", "", "mixed_float16",
]  # fmt: skip


@st.composite
def _specs(draw):
    if draw(st.booleans()):
        return draw(st.sampled_from(_NAMES))
    parts = draw(
        st.lists(
            st.tuples(st.sampled_from(_KEYS), st.sampled_from(_NAMES)),
            min_size=1,
            max_size=4,
        )
    )
    return ",".join(f"{k}={v}" for k, v in parts)


def _try(parse, spec):
    try:
        return parse(spec)
    except (ValueError, KeyError):
        return None


@settings(max_examples=400, deadline=None)
@given(_specs())
def test_get_policy_agrees_with_jmp_on_every_spec_both_accept(spec):
    with jax.enable_x64(True):  # _NAMES includes float64, which jmp always accepts
        theirs = _try(jmp.get_policy, spec)
        ours = _try(mpjax.get_policy, spec)
    if theirs is not None and ours is not None:
        assert _dtypes(ours) == tuple(
            np.dtype(d)
            for d in (theirs.param_dtype, theirs.compute_dtype, theirs.output_dtype)
        )
    # We reject only what jmp accepts ambiguously: a key given twice.
    if theirs is not None and ours is None:
        keys = [part.split("=")[0] for part in spec.split(",")]
        canon = [{"params": "p", "compute": "c", "output": "o"}.get(k, k) for k in keys]
        assert len(set(canon)) < len(canon), spec


@pytest.mark.parametrize(
    "spec, match",
    [
        ("p=f33", "Unknown dtype name 'f33'"),
        ("float", "Unknown dtype name"),
        ("p=int32,c=f16", "must be floating point"),
        ("bool", "must be floating point"),
        ("x=f32", "Unknown key 'x'"),
        ("p=f32,p=f16", "given twice"),
        ("p=f32,", "Malformed entry"),
        ("p=f32=bf16", "Malformed entry"),
        ("", "Empty policy spec"),
        ("mixed_int8", "must be floating point"),
    ],
)
def test_get_policy_bad_specs_raise_value_error(spec, match):
    with pytest.raises(ValueError, match=match):
        mpjax.get_policy(spec)


def test_policy_bad_dtypes_raise():
    with pytest.raises(ValueError, match="param_dtype must be a floating dtype"):
        mpjax.Policy(jnp.int32, jnp.float32, jnp.float32)
    with pytest.raises(ValueError, match="output_dtype must be a floating dtype"):
        mpjax.Policy(jnp.float32, jnp.float32, jnp.bool_)
    with pytest.raises(TypeError, match="compute_dtype must be a dtype"):
        mpjax.Policy(jnp.float32, object(), jnp.float32)
    with pytest.raises(TypeError, match="get_policy expects"):
        mpjax.get_policy(32)
    with pytest.raises(TypeError, match="from_jmp expects a jmp.Policy"):
        mpjax.Policy.from_jmp("p=f32")


def test_docstring_examples_run():
    import doctest

    from mpjax import _policy

    result = doctest.testmod(_policy)
    assert result.attempted >= 4 and result.failed == 0


def test_policy_is_a_valid_static_jit_argument():
    traces = []

    def f(x, policy):
        traces.append(policy)
        return policy.cast_to_compute(x)

    f = jax.jit(f, static_argnums=1)
    x = jnp.ones(2)
    assert f(x, mpjax.get_policy("mixed_bfloat16")).dtype == BF16
    assert f(x, mpjax.Policy("f32", "bf16", "f32")).dtype == BF16  # equal: cached
    assert f(x, mpjax.get_policy("mixed_float16")).dtype == F16
    assert len(traces) == 2


@pytest.mark.parametrize("role", ["param", "compute", "output"])
def test_policy_none_dtype_raises_naming_the_argument(role):
    dtypes = {"param": "float32", "compute": "float32", "output": "float32"}
    dtypes[role] = None
    with pytest.raises(TypeError, match=rf"{role}_dtype must be .* got None"):
        mpjax.Policy(dtypes["param"], dtypes["compute"], dtypes["output"])


def test_policy_all_none_raises_type_error():
    with pytest.raises(TypeError, match="param_dtype"):
        mpjax.Policy(None, None, None)


@pytest.mark.parametrize(
    "spec",
    ["float64", "f64", "params=float64,compute=float64,output=float64", "c=f64"],
)
def test_get_policy_float64_without_x64_raises(spec):
    with pytest.raises(ValueError, match="jax_enable_x64"):
        mpjax.get_policy(spec)


def test_policy_float64_dtype_without_x64_raises():
    with pytest.raises(ValueError, match="compute_dtype.*jax_enable_x64"):
        mpjax.Policy(np.float32, np.float64, np.float32)


@pytest.mark.parametrize(
    "spec", ["float64", "f64", "params=float64,compute=float64,output=float64"]
)
def test_get_policy_float64_with_x64_computes_in_float64(x64, spec):
    policy = mpjax.get_policy(spec)
    assert _dtypes(policy) == (F64, F64, F64)
    out = policy.cast_to_compute({"w": jnp.ones(2, jnp.float32)})
    assert out["w"].dtype == jnp.float64
