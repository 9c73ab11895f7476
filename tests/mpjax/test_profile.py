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


def test_profile_names_values_by_nnx_module_path():
    model = MLP(8, 16, 4, depth=2, rngs=nnx.Rngs(0))
    classes = [type(model), type(model.hidden[0]), type(model.head)]

    def loss(m, x):
        return jnp.mean(m(x) ** 2)

    report = mpjax.profile(loss, model, jnp.ones((5, 8)), grads=True, formats=())
    forward = {
        r.source
        for r in report.records
        if r.primitive == "dot_general" and r.kind == "value"
    }
    assert forward == {"jvp(MLP)/hidden.0", "jvp(MLP)/hidden.1", "jvp(MLP)/head"}
    plain = mpjax.profile(lambda m, x: m(x), model, jnp.ones((5, 8)), formats=())
    assert "MLP/hidden.0" in {r.source for r in plain.records}
    grads = {r.source for r in report.records if r.kind == "grad"}
    assert any(s.endswith("/hidden.0") for s in grads), grads
    # the model keeps its own classes afterwards
    assert [type(model), type(model.hidden[0]), type(model.head)] == classes
    assert isinstance(model(jnp.ones((1, 8))), jax.Array)


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


def test_profile_program_profiles_the_inputs_it_is_given():
    # the split program is what lets a caller repeat the on-device part on new
    # data: it must read its inputs, not the values it was traced with
    x = jnp.array([0.0, 0.0, 1.5, -3.0, jnp.inf, jnp.nan, 1e-40, 2.0**-20], jnp.float32)
    program, (consts, flat), finish = profile_program(
        lambda v: v * jnp.float32(2.0), x, formats=("float16",)
    )
    first = finish(jax.device_get(program(consts, flat)))
    assert [r.max_abs for r in first.records] == [3.0, 6.0, 6.0]
    y = jnp.array([0.0, 5e3, -1.0, 4.0, 0.25, 8.0, 2.0, 1.0], jnp.float32)
    second = finish(jax.device_get(program(consts, [y])))
    inp, mul, out = second.records
    assert (inp.max_abs, mul.max_abs, mul.min_abs) == (5e3, 1e4, 0.5)
    assert (mul.zeros, mul.nonfinite) == (1, 0)
    # 1e4 fits float16, so nothing overflows; the first data had none either
    assert second.fractions("float16")[1].overflow == 0.0
    assert sum(inp.histogram) == 7 and out.histogram == mul.histogram


def _body_records(report, where):
    return [r for r in report.records if where in r.source]


def test_profile_scan_body_histogram_over_iterations():
    # iteration t (t = 0, 1, 2) computes c * 2**t for c = [1, 1, 0, 3]
    def fn(c):
        def body(k, _):
            return k * jnp.float32(2.0), k * jnp.float32(3.0)

        return jax.lax.scan(body, c, None, length=3)

    report = mpjax.profile(fn, jnp.array([1.0, 1.0, 0.0, 3.0]), formats=("float16",))
    muls = _body_records(report, "scan/body")
    assert [r.primitive for r in muls] == ["mul", "mul"]
    doubled = muls[0]  # 2c, 4c, 8c: exponents 1, 1, 2 | 2, 2, 3 | 3, 3, 4
    assert (doubled.count, doubled.zeros, doubled.shape) == (12, 3, (4,))
    exps = report.exponents()
    want = {1: 2, 2: 3, 3: 3, 4: 1}
    got = {int(exps[k]): c for k, c in enumerate(doubled.histogram) if c}
    assert got == want
    assert (doubled.min_abs, doubled.max_abs) == (2.0, 24.0)
    assert doubled.rounding_error["float16"] == 0.0


def test_profile_while_counts_data_dependent_iterations():
    def fn(x):
        # halves x until its sum drops below 1: the trip count depends on the data
        return jax.lax.while_loop(lambda v: jnp.sum(v) >= 1.0, lambda v: v * 0.5, x)

    x = jnp.array([3.0, 5.0])  # sums 8, 4, 2, 1, 0.5: four iterations
    (rec,) = _body_records(mpjax.profile(fn, x, formats=()), "while/body")
    assert rec.count == 4 * 2 and rec.primitive == "mul"
    assert (rec.min_abs, rec.max_abs) == (0.1875, 2.5)


def test_profile_nested_loops_and_fori_loop():
    def inner(v):
        return jax.lax.fori_loop(0, 2, lambda i, w: w + 1.0, v)  # a scan

    def fn(x):
        def outer(c, _):
            return inner(c) * 2.0, None

        c, _ = jax.lax.scan(outer, x, None, length=3)
        n = jnp.sum(c).astype(jnp.int32) % 3  # dynamic bound: a while loop
        return jax.lax.fori_loop(0, n, lambda i, w: w - 1.0, c)

    report = mpjax.profile(fn, jnp.zeros(5), formats=())
    nested = [r for r in report.records if r.source.count("/body") == 2]
    assert nested and all(r.count == 5 * 2 * 3 for r in nested)
    assert "scan/body" in nested[0].source
    # c = ((0 + 2) * 2 + 2) * 2 + 2) * 2 = 28 per element: sum 140 % 3 = 2 steps
    (dec,) = [r for r in _body_records(report, "while/body") if r.primitive == "sub"]
    assert dec.count == 5 * 2 and (dec.min_abs, dec.max_abs) == (26.0, 27.0)


def test_profile_cond_counts_the_taken_branch():
    def fn(x):
        return jax.lax.cond(x[0] > 0, lambda v: v * 4.0, lambda v: v - 1.0, x)

    report = mpjax.profile(fn, jnp.array([1.0, 2.0]), formats=())
    taken = _body_records(report, "cond/branch1")  # branches: false, true
    other = _body_records(report, "cond/branch0")
    assert [r.count for r in taken] == [2] and taken[0].max_abs == 8.0
    assert [r.count for r in other] == [0] and other[0].max_abs is None
    assert report.records[-1].primitive == "output"


def test_profile_grads_through_scan():
    def loss(w, x):
        def body(h, _):
            return jnp.tanh(h * w), None

        h, _ = jax.lax.scan(body, x, None, length=4)
        return jnp.sum(h)

    report = mpjax.profile(loss, jnp.float32(0.5), jnp.ones(3), grads=True)
    grads = [r for r in report.records if r.kind == "grad"]
    assert any("scan/body" in r.source for r in grads)
    assert any("scan/body" in r.source for r in report.records if r.kind == "value")
    assert all(r.count == 4 * 3 for r in grads if "scan/body" in r.source and r.shape)


def test_profile_argnums_selects_cotangents():
    def loss(a, b, s):
        return jnp.sum(a * b) * s

    a, b = jnp.ones(2), jnp.full(3, 2.0)[:2]
    both = mpjax.profile(loss, a, b, jnp.float32(3.0), grads=True, argnums=(0, 1))
    outs = [r for r in both.records if r.primitive == "output" and r.kind == "grad"]
    assert [r.max_abs for r in outs] == [6.0, 3.0]  # d/da = b s, d/db = a s
    second = mpjax.profile(loss, a, b, jnp.float32(3.0), grads=True, argnums=-1)
    outs = [r for r in second.records if r.primitive == "output" and r.kind == "grad"]
    assert [(r.shape, r.max_abs) for r in outs] == [((), 4.0)]


@pytest.mark.parametrize(
    ("argnums", "error", "match"),
    [
        (2, ValueError, r"selects argument 2.*2 positional"),
        ((0, 0), ValueError, "repeats"),
        ((), TypeError, "non-empty tuple of ints"),
        ("0", TypeError, "int or a non-empty tuple"),
        (1, ValueError, "argument 1 .*no floating-point leaves"),
    ],
)
def test_profile_rejects_bad_argnums(argnums, error, match):
    with pytest.raises(error, match=match):
        mpjax.profile(
            lambda v, i: jnp.sum(v) * i,
            jnp.ones(2),
            jnp.int32(2),
            grads=True,
            argnums=argnums,
        )


def test_profile_rejects_argnums_without_grads():
    with pytest.raises(ValueError, match="grads=True"):
        mpjax.profile(lambda v: v, jnp.ones(2), argnums=1)


def test_nanmedian_last_is_the_lower_median_to_bfloat16():
    from mpjax._profile_stats import _nanmedian_last

    rng = np.random.default_rng(1)
    x = np.abs(rng.standard_normal((4, 9))).astype(np.float32)
    x[1, 3:] = np.nan  # 3 valid
    x[2] = np.nan  # none
    x[3, :4] = [0.0, 0.0, 0.0, 0.0]  # lower median of 9 is the 5th smallest
    got = np.asarray(_nanmedian_last(jnp.asarray(x)))
    for row, value in zip(x, got, strict=True):
        valid = np.sort(row[~np.isnan(row)])
        if valid.size == 0:
            assert np.isnan(value)
            continue
        exact = valid[(valid.size - 1) // 2]
        assert exact * (1 - 2.0**-7) <= value <= exact
    exact_bf16 = jnp.array([[0.5, 0.25, 3.0, np.nan]], jnp.float32)
    assert float(_nanmedian_last(exact_bf16)[0]) == 0.5


def test_profile_of_a_policy_model_records_the_program_that_runs():
    layer = mpjax.apply_policy(nnx.Linear(4, 3, rngs=nnx.Rngs(0)), "mixed_float16")
    x = jnp.ones((2, 4))
    real = layer(x).dtype
    seen = []

    def forward(m, x):
        out = m(x)
        seen.append(out.dtype)
        return out

    def modules():
        return [m for _, m in nnx.iter_graph(layer) if isinstance(m, nnx.Module)]

    classes = [type(m) for m in modules()]
    report = mpjax.profile(forward, layer, x, formats=())
    (output,) = [r for r in report.records if r.primitive == "output"]
    # the policy casts the float16 product back to float32, under the profiler too
    assert real == jnp.float32 and seen == [real] and output.dtype == real.name
    (dot,) = [r for r in report.records if r.primitive == "dot_general"]
    assert dot.dtype == "float16" and dot.source == "Linear"
    # nothing about the modules changed, during the profile or after it
    assert [type(m) for m in modules()] == classes
    assert not any("_mpjax_scope_path" in vars(m) for m in modules())
