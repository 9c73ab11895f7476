"""The BERT-style encoder of the AMP experiments and its masked-LM loss/metric."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments import _data, _models

LENGTH = 16


@pytest.fixture(scope="module")
def model() -> _models.BertMLM:
    return _models.BertMLM(
        _data.MLM_VOCAB, 32, heads=4, layers=2, max_length=LENGTH, rngs=nnx.Rngs(0)
    )


@pytest.fixture(scope="module")
def batch() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    windows, _ = _data.char_windows(_data.python_text(), length=LENGTH, count=8, seed=0)
    return _data.mask_tokens(windows, seed=0)


def test_bert_logits_shape_and_dtype(model, batch):
    logits = model(jnp.asarray(batch[0]))
    assert logits.shape == (8, LENGTH, _data.MLM_VOCAB)
    assert logits.dtype == jnp.float32
    assert bool(jnp.all(jnp.isfinite(logits)))


def test_bert_attends_to_later_tokens(model):
    # Position 2 is masked; only token 12, after it, differs between the inputs.
    tokens = np.full((1, LENGTH), ord("a"), np.int32)
    tokens[0, 2] = _data.MASK_ID
    later = tokens.copy()
    later[0, 12] = ord("(")
    before, after = model(jnp.asarray(tokens)), model(jnp.asarray(later))
    assert float(jnp.max(jnp.abs(before[0, 2] - after[0, 2]))) > 1e-4
    # Masking itself is what the model sees at position 2.
    unmasked = tokens.copy()
    unmasked[0, 2] = ord("a")
    changed = model(jnp.asarray(unmasked))[0, 2] - before[0, 2]
    assert float(jnp.max(jnp.abs(changed))) > 1e-4


def test_masked_lm_loss_counts_masked_positions_only(model, batch):
    inputs, targets, mask = batch
    loss = float(_models.masked_lm_loss(model, batch))
    # Other targets at unmasked positions leave the loss unchanged ...
    other = np.where(mask, targets, (targets + 1) % _data.ASCII_VOCAB)
    np.testing.assert_allclose(
        float(_models.masked_lm_loss(model, (inputs, other, mask))), loss, rtol=1e-6
    )
    # ... another target at one masked position changes it.
    row, col = np.argwhere(mask)[0]
    moved = targets.copy()
    moved[row, col] = (moved[row, col] + 1) % _data.ASCII_VOCAB
    assert float(_models.masked_lm_loss(model, (inputs, moved, mask))) != loss
    # An untrained model is near the uniform guess over the vocabulary.
    assert abs(loss - np.log(_data.MLM_VOCAB)) < 1.5


def test_masked_token_accuracy_scores_masked_positions_only():
    targets = np.array([[1, 2, 3, 4]], np.int32)
    mask = np.array([[True, True, False, False]])

    def predict_ones(tokens: jax.Array) -> jax.Array:  # arg-max is always token 1
        return jax.nn.one_hot(jnp.ones_like(tokens), 8)

    accuracy = _models.masked_token_accuracy
    # Masked: targets 1 (hit) and 2 (miss); the unmasked hit-free 3 and 4 don't count.
    assert float(accuracy(predict_ones, (targets, targets, mask))) == 0.5
    assert float(accuracy(predict_ones, (targets, targets, ~mask))) == 0.0


def test_bert_rejects_bad_shapes():
    with pytest.raises(ValueError, match="multiple of heads"):
        _models.EncoderBlock(30, 4, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="layers must be >= 1"):
        _models.BertMLM(8, 8, heads=2, layers=0, rngs=nnx.Rngs(0))
    small = _models.BertMLM(8, 8, heads=2, layers=1, max_length=4, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="exceeds max_length 4"):
        small(jnp.zeros((1, 5), jnp.int32))
