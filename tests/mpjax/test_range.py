"""mpjax.RangeProbe: exact statistics of chosen arrays inside compiled programs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mpjax

BINS = (-40, 10)


def _numpy_histogram(x: np.ndarray) -> np.ndarray:
    x = x[np.isfinite(x) & (x != 0)].astype(np.float64)
    e = np.clip(np.frexp(x)[1] - 1, *BINS) - BINS[0]
    return np.bincount(e, minlength=BINS[1] - BINS[0] + 1)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(3, 12, 10)) * np.exp2(rng.integers(-30, 5, (3, 12, 10)))
    x = x.astype(np.float32)
    x[0, 0, :3] = 0.0
    x[1, 2, 4] = np.nan
    mask = rng.random((12, 10)) < 0.6
    mask[2, 4] = True  # the NaN is counted
    return x, mask


def test_masked_statistics_are_exact(data):
    x, mask = data
    probe = mpjax.RangeProbe(formats=("float16", "fp16s"), bins=BINS)
    stats = jax.jit(probe)({"x": x, "all": x}, where={"x": mask})
    report = probe.report(stats)
    kept = x[:, mask]
    by_name = {r.source: r for r in report.records}
    rec = by_name["x"]
    assert rec.count == kept.size and rec.shape == (3, 12, 10)
    assert rec.dtype == "float32" and rec.location == "call 0"
    assert rec.zeros == int(np.sum(kept == 0)) and rec.nonfinite == 1
    np.testing.assert_array_equal(rec.histogram, _numpy_histogram(kept))
    finite = np.abs(kept[np.isfinite(kept) & (kept != 0)])
    assert rec.min_abs == finite.min() and rec.max_abs == finite.max()
    whole = by_name["all"]
    assert whole.count == x.size and whole.zeros == 3
    np.testing.assert_array_equal(whole.histogram, _numpy_histogram(x))
    # float16's smallest normal is 2**-14: the exact share of the kept values below
    below = np.mean(finite < 2.0**-14)
    frac = report.fractions("float16")[report.records.index(rec)]
    assert frac.underflow + frac.subnormal == pytest.approx(below)


def test_statistics_stacked_over_a_loop_keep_their_labels():
    probe = mpjax.RangeProbe(formats=("bfloat16",), bins=BINS)

    def loop(x):
        def body(c, _):
            c = c * 0.5
            return c, probe({"c": c})

        return jax.lax.scan(body, x, None, length=4)[1]

    stats = jax.jit(loop)(jnp.full((5,), 8.0, jnp.float16))
    report = probe.report(stats, labels=[f"step {t}" for t in range(1, 5)])
    assert [r.location for r in report.records] == [f"step {t}" for t in range(1, 5)]
    assert [r.max_abs for r in report.records] == [4.0, 2.0, 1.0, 0.5]
    assert all(r.dtype == "float16" and r.count == 5 for r in report.records)
    assert report.records[0].rounding_error["bfloat16"] == 0.0
    with pytest.raises(ValueError, match="one label per call"):
        probe.report(stats, labels=["only one"])


def test_bad_input_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="unknown|Unknown"):
        mpjax.RangeProbe(formats=("float17",))
    with pytest.raises(TypeError, match=r"formats=\('float16',\)"):
        mpjax.RangeProbe(formats="float16")
    with pytest.raises(ValueError, match="bins"):
        mpjax.RangeProbe(bins=(3, 1))
    with pytest.raises(ValueError, match="sample"):
        mpjax.RangeProbe(sample=0)
    probe = mpjax.RangeProbe(formats=())
    with pytest.raises(TypeError, match="mapping"):
        probe(jnp.ones(3))
    with pytest.raises(TypeError, match="mapping"):
        probe({})
    with pytest.raises(TypeError, match="not floating point"):
        probe({"i": jnp.arange(3)})
    with pytest.raises(ValueError, match=r"\['y'\]"):
        probe({"x": jnp.ones(3)}, where={"y": jnp.ones(3, bool)})
