"""The AMP pipeline's configurations, training records and memory columns."""

from __future__ import annotations

import dataclasses
import doctest

import jax
import numpy as np
import pytest
from flax import nnx

import mpjax
from experiments import (
    _amp_report,
    _amp_tasks,
    _amp_train,
    _data,
    _framework,
    _models,
    amp,
)

STEPS = 12


@pytest.fixture(scope="module")
def bert_task() -> amp.Task:
    windows, _ = _data.char_windows(
        _data.python_text(), length=16, count=(STEPS + 4) * 16, seed=0
    )
    inputs, targets, mask = _data.mask_tokens(windows, seed=0)
    steps = tuple(
        a[: STEPS * 16].reshape(STEPS, 16, 16) for a in (inputs, targets, mask)
    )
    return amp.Task(
        "bert",
        _models.BertMLM(
            _data.MLM_VOCAB, 32, heads=4, layers=1, max_length=16, rngs=nnx.Rngs(0)
        ),
        _models.masked_lm_loss,
        steps,
        tuple(a[STEPS * 16 :] for a in (inputs, targets, mask)),
        learning_rate=3e-3,
        rtol=0.05,
        atol=0.05,
        metric=amp.Metric("masked-token accuracy", _models.masked_token_accuracy, 0.03),
    )


def test_policies_start_with_the_reference_and_name_mpjax_policies():
    assert next(iter(amp.POLICIES)) == amp.REFERENCE == "float32"
    assert list(amp.POLICIES) == [
        "float32",
        "mixed_bfloat16",
        "mixed_float16",
        "fp8",
        "autocast_bfloat16",
    ]
    assert amp.POLICIES["fp8"].fp8 is not None
    assert [p for p, r in amp.POLICIES.items() if r.autocast] == [amp.AUTOCAST]
    assert amp.POLICIES[amp.AUTOCAST].policy == amp.POLICIES[amp.HAND_CAST].policy
    for label, recipe in amp.POLICIES.items():
        assert isinstance(recipe, amp.Recipe), label
        mpjax.get_policy(recipe.policy)  # raises for an unknown policy
        assert callable(recipe.optimizer(1e-3, 100).update)
    with pytest.raises(TypeError):
        amp.POLICIES["fp4"] = amp.POLICIES["float32"]  # extend in the module


def test_train_rejects_unknown_configuration(bert_task):
    with pytest.raises(ValueError, match="policy must be one of.*got 'fp4'"):
        amp.train(bert_task, "fp4")
    with pytest.raises(ValueError, match=r"steps must be in \[1, 12\], got 13"):
        amp.train(bert_task, "float32", steps=13)


def test_bert_trains_under_mixed_float16(bert_task):
    record = amp.train(bert_task, "mixed_float16")
    assert record.policy == "mixed_float16"
    assert np.all(np.isfinite(record.losses)) and len(record.losses) == STEPS
    # A dozen steps from 2**15: the scale backs off on overflow, skipping steps.
    assert record.loss_scales[0] == 2.0**15
    assert record.skipped == int(np.sum(np.diff(record.loss_scales) < 0))
    assert record.skipped < STEPS // 2
    assert record.losses[-3:].mean() < 0.9 * record.losses[:2].mean()
    assert 0.0 <= record.eval_metric <= 1.0 and np.isfinite(record.eval_loss)
    assert set(record.memory) == {"argument", "temp", "output"}
    assert record.memory["argument"] > 0 and record.memory["temp"] > 0
    dtypes = {np.dtype(leaf.dtype) for leaf in jax.tree.leaves(record.params)}
    assert dtypes == {np.dtype(np.float32)}
    if jax.devices()[0].memory_stats() is None:  # CPU: no allocator statistics
        assert record.device_peak_bytes is None and record.device_peak_exact is None
        assert _amp_report.device_peak_cell(record) == "n/a"
    else:
        assert record.device_peak_bytes > 0
        assert isinstance(record.device_peak_exact, bool)


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        (
            {"bytes_in_use": 100, "peak_bytes_in_use": 500},
            {"bytes_in_use": 300, "peak_bytes_in_use": 900},
            (800, True),
        ),
        # The run stayed below an earlier high-water mark: an upper bound only.
        (
            {"bytes_in_use": 100, "peak_bytes_in_use": 900},
            {"bytes_in_use": 300, "peak_bytes_in_use": 900},
            (800, False),
        ),
        (None, None, (None, None)),
        ({"bytes_in_use": 1}, {"bytes_in_use": 2}, (None, None)),
        (
            {"bytes_in_use": 1, "peak_bytes_in_use": -1},
            {"bytes_in_use": 2, "peak_bytes_in_use": -1},
            (None, None),
        ),
    ],
)
def test_device_peak_is_exact_only_when_the_mark_rises(before, after, expected):
    assert _amp_train.device_peak(before, after) == expected


def test_device_peak_cell_marks_upper_bounds():
    @dataclasses.dataclass
    class Peak:
        device_peak_bytes: int | None
        device_peak_exact: bool | None

    assert _amp_report.device_peak_cell(Peak(5 * 2**19, True)) == "2.5"
    assert _amp_report.device_peak_cell(Peak(5 * 2**19, False)) == "<= 2.5"
    assert _amp_report.device_peak_cell(Peak(None, None)) == "n/a"


def test_metric_check_uses_the_task_tolerance(bert_task):
    def record(loss: float, metric: float) -> amp.RunRecord:
        return amp.RunRecord(
            "x",
            np.ones(2),
            np.ones(2),
            0,
            1.0,
            {},
            None,
            None,
            loss,
            metric,
            None,
            time_step=lambda: 0.0,
        )

    reference = record(2.0, 0.50)
    assert amp.metric_within(record(2.0, 0.525), reference, bert_task)
    assert not amp.metric_within(record(2.0, 0.54), reference, bert_task)
    assert not amp.metric_within(record(2.0, float("nan")), reference, bert_task)
    # Loss: 0.05 + 0.05 * 2.0 = 0.15 either way.
    assert amp.within(record(2.14, 0.5), reference, bert_task)
    assert not amp.within(record(1.84, 0.5), reference, bert_task)
    assert not amp.within(record(float("nan"), 0.5), reference, bert_task)


@pytest.mark.parametrize("module", [_amp_train, _amp_report, _models, amp])
def test_docstring_examples_run(module):
    result = doctest.testmod(module)
    assert result.attempted >= 1 and result.failed == 0


def test_full_scale_encoder_has_a_few_million_parameters():
    s = _amp_tasks.SETTINGS["full"]
    model = nnx.eval_shape(
        lambda: _models.BertMLM(
            _data.MLM_VOCAB,
            s.bert_dim,
            heads=s.bert_heads,
            layers=s.bert_layers,
            max_length=s.bert_length,
            rngs=nnx.Rngs(0),
        )
    )
    count = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    assert 3.2e6 < count < 3.4e6  # "3.3-million-parameter" in _amp_tasks
    assert s.bert_length == 128 and s.bert_steps == 3000


def test_make_tasks_rejects_unknown_scale():
    with pytest.raises(ValueError, match="scale must be one of.*got 'huge'"):
        amp.make_tasks("huge")


def test_settings_cover_every_framework_scale():
    assert tuple(_amp_tasks.SETTINGS) == _framework.SCALES


@pytest.fixture(scope="module")
def equinox_task() -> amp.Task:
    pytest.importorskip("equinox")
    return amp.make_tasks("tiny")["eqx_mlp"]


def test_every_task_has_a_figure_title():
    assert set(_amp_report.TITLES) == set(amp.make_tasks("tiny"))


def test_equinox_archetype_trains_under_every_policy_within_tolerance(equinox_task):
    import equinox as eqx

    assert isinstance(equinox_task.model, eqx.nn.MLP)
    runs = {p: amp.train(equinox_task, p) for p in amp.POLICIES}
    reference = runs[amp.REFERENCE]
    for policy, record in runs.items():
        assert np.all(np.isfinite(record.losses)), policy
        assert amp.within(record, reference, equinox_task), policy
        assert amp.metric_within(record, reference, equinox_task), policy
    assert runs["mixed_float16"].loss_scales[0] == 2.0**15
    # the float16 run's parameters fit the model under any policy
    underflow = amp.gradient_underflow(
        equinox_task, "mixed_float16", runs["mixed_float16"].params, (1.0, 2.0**15)
    )
    assert set(underflow) == {1.0, 2.0**15}
    assert all(0.0 <= v <= 1.0 for v in underflow.values())


def test_autocast_runs_the_hand_cast_programs_products_in_bfloat16(equinox_task):
    hand = amp.product_dtypes(equinox_task, amp.HAND_CAST)
    auto = amp.product_dtypes(equinox_task, amp.AUTOCAST)
    # three layers: three forward products, three weight gradients and two input
    # gradients (none for the data) in both programs
    assert hand == auto == {"bfloat16 x bfloat16": 8}
    assert amp.products_match(hand, auto, "bfloat16")
    assert amp.product_dtypes(equinox_task, "float32") == {"float32 x float32": 8}
    # a product left in float32 by autocast fails the check
    assert not amp.products_match(
        hand, {"bfloat16 x bfloat16": 7, "float32 x float32": 1}, "bfloat16"
    )


@pytest.mark.slow
def test_quick_scale_trains_the_mlp_and_the_others_all_four():
    quick = amp.make_tasks("quick")
    assert list(quick) == ["mlp"]
    every = ("mlp", "eqx_mlp", "unet", "bert")
    for scale in ("tiny", "standard", "full"):
        assert _amp_tasks.SETTINGS[scale].networks == every
    tiny = amp.make_tasks("tiny")
    assert list(tiny) == list(every)
