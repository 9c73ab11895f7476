"""Tests for the number-range profiler: mpjax.profile and ProfileReport."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import mpjax
from experiments._data import digits
from experiments._models import MLP, classification_loss
from mpjax import profile_program

F16 = mpjax.formats.get_format("float16")


def _by_primitive(report, primitive):
    return [r for r in report.records if r.primitive == primitive]


@pytest.fixture(scope="module")
def hand_report():
    """x * 2 on a vector with zeros, Inf, NaN and a float32 subnormal."""
    x = jnp.array([0.0, 0.0, 1.5, -3.0, jnp.inf, jnp.nan, 1e-40, 2.0**-20], jnp.float32)

    def fn(v):
        with jax.named_scope("scaled"):
            return v * jnp.float32(2.0)

    return mpjax.profile(fn, x, formats=("float32", "bfloat16", "float16"))


@pytest.fixture(scope="module")
def random_data():
    rng = np.random.default_rng(0)
    signs = rng.choice(np.array([-1.0, 1.0]), 5000)
    return (signs * 2.0 ** rng.uniform(-40.0, 40.0, 5000)).astype(np.float32)


@pytest.fixture(scope="module")
def random_report(random_data):
    return mpjax.profile(lambda v: v, jnp.asarray(random_data), formats=("bfloat16",))


@pytest.fixture(scope="module")
def mlp_task():
    split = digits()
    model = MLP(64, 32, 10, depth=2, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    x, y = jnp.asarray(split.x_train), jnp.asarray(split.y_train)

    def loss(params, xb, yb, scale=1.0):
        value = classification_loss(nnx.merge(graphdef, params), (xb, yb))
        return value * jnp.float32(scale)

    return loss, state, x, y


@pytest.fixture(scope="module")
def mlp_report(mlp_task):
    loss, state, x, y = mlp_task
    return mpjax.profile(loss, state, x, y, grads=True, formats=("float16",))


def test_profile_exact_counts(hand_report):
    inp, mul, out = hand_report.records
    assert (inp.count, inp.zeros, inp.nonfinite) == (8, 2, 2)
    assert inp.min_abs == pytest.approx(1e-40, rel=1e-3)  # subnormal counted
    assert inp.max_abs == 3.0
    exps = hand_report.exponents()
    assert exps[np.flatnonzero(inp.histogram)].tolist() == [-133, -20, 0, 1]
    assert sum(inp.histogram) == 4
    # XLA:CPU may flush the doubled subnormal to zero; the rest is exact
    assert mul.nonfinite == 2 and mul.max_abs == 6.0 and mul.min_abs == 2.0**-19
    assert mul.zeros + sum(mul.histogram) + mul.nonfinite == 8
    assert [r.primitive for r in hand_report.records] == ["input", "mul", "output"]
    assert out.histogram == mul.histogram


def test_profile_histogram_matches_numpy(random_report, random_data):
    (rec,) = _by_primitive(random_report, "input")
    lo, hi = random_report.bins
    want = np.bincount(
        np.floor(np.log2(np.abs(random_data))).astype(int) - lo,
        minlength=hi - lo + 1,
    )
    np.testing.assert_array_equal(np.asarray(rec.histogram), want)


def test_profile_float16_range_fractions():
    # 4 values overflow, 2 flush to zero, 3 are subnormal, 1 is normal
    x = jnp.array(
        [1e5, -7e4, 1e6, 3e38, 1e-8, -2e-9, 1e-6, 2e-5, -3e-7, 1.0], jnp.float32
    )
    report = mpjax.profile(lambda v: v, x, formats=("float16",))
    over, under, sub = report.fractions("float16")[0]
    assert (over, under, sub) == pytest.approx((0.4, 0.2, 0.3))


def test_profile_rounding_error(random_report, hand_report):
    (rec,) = _by_primitive(random_report, "input")
    assert (
        0.0
        < rec.rounding_error["bfloat16"]
        <= mpjax.formats.get_format("bfloat16").epsilon
    )
    (mul,) = _by_primitive(hand_report, "mul")
    assert mul.rounding_error["float32"] == 0.0


def test_profile_names_primitives_and_scopes(hand_report):
    (mul,) = _by_primitive(hand_report, "mul")
    assert mul.source == "scaled"
    assert mul.shape == (8,) and mul.dtype == "float32"
    assert "test_profile.py" in mul.location


def test_profile_skips_integers():
    report = mpjax.profile(
        lambda i, v: v * i.astype(jnp.float32), jnp.arange(3), jnp.ones(3)
    )
    assert all(r.dtype == "float32" for r in report.records)
    assert [r.primitive for r in report.records] == [
        "input",
        "convert_element_type",
        "mul",
        "output",
    ]


def test_profile_grads_records_cotangents(mlp_report):
    kinds = {r.kind for r in mlp_report.records}
    assert kinds == {"value", "grad"}
    grads = [r for r in mlp_report.records if r.kind == "grad"]
    assert any(r.primitive == "dot_general" for r in grads)
    assert all("transpose(" in r.source or r.primitive == "output" for r in grads)


def test_profile_nnx_module_paths(mlp_report):
    sources = [r.source for r in mlp_report.records if r.primitive == "input"]
    assert "args[0]['hidden'][0]['kernel'].value" in sources
    assert any("MLP.__call__" in r.location for r in mlp_report.records)


def test_suggest_policy_prefers_float16_when_values_fit(hand_report):
    fits = mpjax.profile(lambda v: v * 3.0, jnp.linspace(0.5, 100.0, 16), formats=())
    policy, reason = fits.suggest_policy()
    assert policy == mpjax.get_policy("p=f32,c=f16,o=f32")
    assert "float16" in reason


def test_suggest_policy_avoids_float16_on_overflow():
    big = mpjax.profile(lambda v: v * 1e3, jnp.linspace(1.0, 1e3, 16), formats=())
    policy, reason = big.suggest_policy()
    assert policy.compute_dtype in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32))
    assert "float16 rejected: overflow" in reason


def _grad_underflow(report):
    fractions = report.fractions("float16")
    rows = [i for i, r in enumerate(report.records) if r.kind == "grad"]
    live = sum(sum(report.records[i].histogram) for i in rows)
    return (
        sum(fractions[i].underflow * sum(report.records[i].histogram) for i in rows)
        / live
    )


def test_suggest_loss_scale_reduces_underflow(mlp_task, mlp_report):
    loss, state, x, y = mlp_task
    before = _grad_underflow(mlp_report)
    assert before > 0.0  # float16 gradients of this MLP underflow
    scale, reason = mlp_report.suggest_loss_scale()
    assert scale > 1.0 and np.log2(scale).is_integer() and "2^" in reason
    scaled = mpjax.profile(
        lambda p, a, b: loss(p, a, b, scale), state, x, y, grads=True, formats=()
    )
    assert _grad_underflow(scaled) < before
    grads = [i for i, r in enumerate(scaled.records) if r.kind == "grad"]
    assert max(scaled.fractions("float16")[i].overflow for i in grads) == 0.0


def test_suggest_loss_scale_needs_grads(hand_report):
    with pytest.raises(ValueError, match="grads=True"):
        hand_report.suggest_loss_scale()


def test_report_json_round_trip(mlp_report):
    again = mpjax.ProfileReport.from_json(mlp_report.to_json())
    assert again == mlp_report


def test_report_table(hand_report):
    text = hand_report.table()
    assert text.count("\n") == 1 + len(hand_report.records)
    assert "float16" in text.splitlines()[0] and "mul" in text
    assert hand_report.table(top=1).count("\n") == 2


def test_report_figure_labels(hand_report):
    from matplotlib.figure import Figure

    fig = hand_report.figure()
    assert isinstance(fig, Figure)
    (ax, _colorbar) = fig.axes
    assert ax.get_xlabel() == "binary exponent floor(log2|x|)"
    assert ax.get_ylabel() and ax.get_title()
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(label.startswith("float16") for label in labels)
    assert {"float32", "bfloat16", "float16"} <= {t.get_text() for t in ax.texts}


def test_profile_rejects_unknown_format():
    with pytest.raises(ValueError, match="registered formats: float64"):
        mpjax.profile(lambda v: v, jnp.ones(2), formats=("float17",))


@pytest.mark.parametrize("bad", ["text", None])
def test_profile_rejects_non_array_outputs(bad):
    with pytest.raises(TypeError, match=r"outputs?.*return only arrays"):
        mpjax.profile(lambda v: (v, bad), jnp.ones(2))


def test_profile_rejects_programs_without_floats():
    with pytest.raises(ValueError, match="no floating-point values"):
        mpjax.profile(lambda i: i + 1, jnp.arange(3))


def test_profile_rejects_non_scalar_loss_with_grads():
    with pytest.raises(ValueError, match="one floating-point scalar"):
        mpjax.profile(lambda v: v * 2.0, jnp.ones(3), grads=True)


def test_profile_rejects_bad_bins_and_formats_string():
    with pytest.raises(ValueError, match="bins must be a pair"):
        mpjax.profile(lambda v: v, jnp.ones(2), bins=(5, -5))
    with pytest.raises(TypeError, match="formats=\\('float16',\\)"):
        mpjax.profile(lambda v: v, jnp.ones(2), formats="float16")


@pytest.mark.parametrize(
    "argv",
    [["--repeats", "5"], ["--batch", "0"], ["--sample", "0"], ["--json", "."]],
)
def test_bench_profile_cli_rejects_bad_arguments(argv, capsys):
    from experiments import bench_profile

    with pytest.raises(SystemExit) as info:
        bench_profile.main(argv)
    assert info.value.code == 2
    assert argv[0] in capsys.readouterr().err


def test_profile_program_matches_profile(hand_report):
    x = jnp.array([0.0, 0.0, 1.5, -3.0, jnp.inf, jnp.nan, 1e-40, 2.0**-20], jnp.float32)

    def fn(v):
        with jax.named_scope("scaled"):
            return v * jnp.float32(2.0)

    program, inputs, finish = profile_program(
        fn, x, formats=("float32", "bfloat16", "float16")
    )
    again = finish(jax.device_get(program(*inputs)))
    stats = lambda r: (r.histogram, r.zeros, r.min_abs, r.rounding_error)  # noqa: E731
    assert [stats(r) for r in again.records] == [stats(r) for r in hand_report.records]
