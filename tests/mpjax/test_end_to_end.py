"""End to end: NNX models trained on bundled data under each precision policy.

An MLP classifies scikit-learn's digits, a one-level U-Net denoises them and a
one-block BERT-style encoder predicts masked characters of standard-library source
text (masked language modelling). All three are trained with
``mpjax.apply_policy`` + ``mpjax.make_train_step`` under ``float32``,
``mixed_bfloat16`` and ``mixed_float16`` (dynamic loss scaling); the mixed runs must
reach the float32 held-out loss within the tolerance stated in each task
(``atol + rtol * |float32 loss|``), and the held-out accuracy within the task's metric
tolerance. Float16 without loss scaling must show gradient underflow that the loss
scale removes.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from experiments import _data, _models, amp

STEPS = 120


@pytest.fixture(scope="module")
def tasks() -> dict[str, amp.Task]:
    digits = _data.digits(seed=0)
    rng = np.random.default_rng(0)
    index = rng.integers(0, len(digits.x_train), size=(STEPS, 128))
    noisy = _data.noisy_digits(seed=0)
    codes = _data.python_text()
    train_codes, eval_codes = codes[:-10_000], codes[-10_000:]
    windows, _ = _data.char_windows(train_codes, length=16, count=STEPS * 16, seed=0)
    masked = _data.mask_tokens(windows, seed=0)
    eval_windows, _ = _data.char_windows(eval_codes, length=16, count=128, seed=1)
    rngs = nnx.Rngs(0)
    return {
        "mlp": amp.Task(
            "mlp",
            _models.MLP(64, 64, 10, rngs=rngs),
            _models.classification_loss,
            (digits.x_train[index], digits.y_train[index]),
            (digits.x_test, digits.y_test),
            learning_rate=3e-3,
            rtol=0.10,
            atol=0.02,
            metric=amp.Metric("accuracy", _models.classification_accuracy, 0.03),
        ),
        "unet": amp.Task(
            "unet",
            _models.UNet(4, levels=1, rngs=rngs),
            _models.denoising_loss,
            (noisy.x_train[index[:, :32]], noisy.y_train[index[:, :32]]),
            (noisy.x_test, noisy.y_test),
            learning_rate=3e-3,
            rtol=0.10,
            atol=0.002,
        ),
        "bert": amp.Task(
            "bert",
            _models.BertMLM(
                _data.MLM_VOCAB, 32, heads=4, layers=1, max_length=16, rngs=rngs
            ),
            _models.masked_lm_loss,
            tuple(a.reshape(STEPS, 16, 16) for a in masked),
            _data.mask_tokens(eval_windows, seed=1),
            learning_rate=3e-3,
            rtol=0.03,
            atol=0.03,
            metric=amp.Metric(
                "masked-token accuracy", _models.masked_token_accuracy, 0.03
            ),
        ),
    }


@pytest.fixture(scope="module")
def runs(tasks) -> dict[tuple[str, str], amp.RunRecord]:
    return {
        (name, policy): amp.train(task, policy)
        for name, task in tasks.items()
        for policy in amp.POLICIES
        if (name, policy) not in SKIPPED
    }


# fp8 accuracy is checked on the MLP and the encoder here; the U-Net's fp8 run (its
# convolutions in fp8) is a check of the amp pipeline, and tests/mpjax/test_fp8.py
# tests the fp8 convolution itself.
SKIPPED = {("unet", "fp8")}


NAMES = ["mlp", "unet", "bert"]
# Largest accepted ratio of the last ten training losses to the first three: masked
# language modelling sees few targets per step (two of 16 characters) and learns
# more slowly than the digit tasks.
LEARNED = {"mlp": 0.6, "unet": 0.6, "bert": 0.75}


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_float32_training_learns(runs, name):
    record = runs[name, "float32"]
    assert record.losses[-10:].mean() < LEARNED[name] * record.losses[:3].mean()
    assert np.isfinite(record.eval_loss)
    if name == "mlp":
        assert record.eval_metric > 0.9


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "policy", "reference"),
    [
        (name, policy, reference)
        for name in NAMES
        for policy, reference in [
            ("mixed_bfloat16", "float32"),
            ("mixed_float16", "float32"),
            ("fp8", "float32"),
            ("fp8", "mixed_bfloat16"),  # fp8 computes around bfloat16
        ]
        if (name, policy) not in SKIPPED
    ],
)
def test_mixed_training_reaches_reference_loss(tasks, runs, name, policy, reference):
    task, record = tasks[name], runs[name, policy]
    reference = runs[name, reference]
    tolerance = task.atol + task.rtol * abs(reference.eval_loss)
    assert abs(record.eval_loss - reference.eval_loss) <= tolerance
    assert record.losses[-10:].mean() < LEARNED[name] * record.losses[:3].mean()
    if task.metric is not None:
        gap = abs(record.eval_metric - reference.eval_metric)
        assert gap <= task.metric.atol


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_float16_run_is_loss_scaled(runs, name):
    record = runs[name, "mixed_float16"]
    assert record.loss_scales[0] == 2.0**15
    assert np.all(np.isfinite(record.losses))
    # The scale moves: it backs off on overflow or grows after finite periods.
    assert len(np.unique(record.loss_scales)) > 1
    assert record.skipped == int(np.sum(np.diff(record.loss_scales) < 0))
    for policy in ("float32", "mixed_bfloat16"):
        assert np.all(runs[name, policy].loss_scales == 1.0)
        assert runs[name, policy].skipped == 0


@pytest.mark.slow
def test_mixed_policies_store_float32_master_params(runs):
    for (_, policy), record in runs.items():
        # the fp8 state (int32 bit patterns of scales and histories) is not a weight
        weights = nnx.filter_state(record.params, nnx.Param)
        dtypes = {np.dtype(leaf.dtype) for leaf in jax.tree.leaves(weights)}
        assert dtypes == {np.dtype(np.float32)}, policy


@pytest.mark.slow
def test_float16_without_loss_scaling_loses_gradients(tasks, runs):
    task = tasks["mlp"]
    params = runs["mlp", "mixed_float16"].params
    scale = float(runs["mlp", "mixed_float16"].loss_scales[-1])
    sampled = tuple(np.concatenate([a[i] for i in range(len(a))]) for a in task.batches)
    lost = amp.gradient_underflow(
        task, "mixed_float16", params, (1.0, scale), batch=sampled
    )
    # Without scaling, gradient entries that float32 resolves flush to zero
    # (measured: 0.1 % of them at this point of training) ...
    assert lost[1.0] > 3e-4
    # ... and the dynamic loss scale recovers every one of them.
    assert lost[scale] == 0.0
    bf16 = amp.gradient_underflow(task, "mixed_bfloat16", params, (1.0,), batch=sampled)
    assert bf16[1.0] == 0.0  # bfloat16 has float32's exponent range


def test_bundled_data_is_deterministic_and_well_formed():
    a, b = _data.digits(seed=3), _data.digits(seed=3)
    np.testing.assert_array_equal(a.x_train, b.x_train)
    assert a.x_train.shape[1] == 64 and len(a.x_train) + len(a.x_test) == 1797
    assert 0.0 <= a.x_train.min() and a.x_train.max() <= 1.0
    assert not np.array_equal(_data.digits(seed=4).y_test, a.y_test)
    noisy = _data.noisy_digits(seed=3)
    assert noisy.x_train.shape == noisy.y_train.shape == (len(a.x_train), 8, 8, 1)
    np.testing.assert_array_equal(noisy.y_train[..., 0].reshape(-1, 64), a.x_train)
    codes = _data.python_text()
    assert codes.min() >= 0 and codes.max() < _data.ASCII_VOCAB
    tokens, targets = _data.char_windows(codes, length=8, count=4, seed=0)
    again, _ = _data.char_windows(codes, length=8, count=4, seed=0)
    np.testing.assert_array_equal(tokens, again)
    np.testing.assert_array_equal(tokens[:, 1:], targets[:, :-1])


def test_bundled_data_rejects_bad_arguments():
    with pytest.raises(ValueError, match="test_fraction.*got 1.5"):
        _data.digits(test_fraction=1.5)
    with pytest.raises(ValueError, match="longer than length"):
        _data.char_windows(np.arange(5), length=8, count=1, seed=0)
    with pytest.raises(ValueError, match="at least one module"):
        _data.python_text(())
