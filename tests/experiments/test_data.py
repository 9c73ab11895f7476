"""BERT masking of the bundled text (experiments._data.mask_tokens)."""

from __future__ import annotations

import doctest

import numpy as np
import pytest

from experiments import _data


@pytest.fixture(scope="module")
def windows() -> np.ndarray:
    tokens, _ = _data.char_windows(_data.python_text(), length=64, count=2000, seed=0)
    return tokens


def test_mlm_vocabulary_holds_ascii_and_mask_and_tiles_by_eight():
    assert _data.MASK_ID == _data.ASCII_VOCAB
    assert _data.MASK_ID < _data.MLM_VOCAB < _data.MASK_ID + 9
    assert _data.MLM_VOCAB % 8 == 0


def test_mask_tokens_shapes_dtypes_and_chosen_count(windows):
    inputs, targets, mask = _data.mask_tokens(windows, seed=1)
    assert inputs.shape == targets.shape == mask.shape == windows.shape
    assert inputs.dtype == targets.dtype == np.int32 and mask.dtype == np.bool_
    # 15 % of 64 positions, rounded: exactly 10 chosen in every window.
    np.testing.assert_array_equal(mask.sum(axis=1), np.full(len(windows), 10))
    np.testing.assert_array_equal(targets, windows)
    np.testing.assert_array_equal(inputs[~mask], windows[~mask])
    assert inputs.min() >= 0 and inputs.max() <= _data.MASK_ID


def test_mask_tokens_follows_the_80_10_10_rule(windows):
    inputs, targets, mask = _data.mask_tokens(windows, seed=2)
    chosen_in, chosen_orig = inputs[mask], targets[mask]
    n = chosen_in.size  # 20,000 chosen positions: binomial s.d. <= 0.0035
    masked = np.mean(chosen_in == _data.MASK_ID)
    replaced = np.mean((chosen_in != _data.MASK_ID) & (chosen_in != chosen_orig))
    kept = np.mean(chosen_in == chosen_orig)
    assert n == 20_000
    assert abs(masked - 0.8) < 0.015
    # A random replacement equals the original with probability 1/128 only.
    assert abs(replaced - 0.1) < 0.015
    assert abs(kept - 0.1) < 0.015
    # Replacements are uniform over the ASCII codes, not drawn from the text.
    random_codes = chosen_in[(chosen_in != _data.MASK_ID) & (chosen_in != chosen_orig)]
    assert len(np.unique(random_codes)) > 120


def test_mask_tokens_chooses_every_position_alike(windows):
    _, _, mask = _data.mask_tokens(windows, seed=3)
    per_position = mask.sum(axis=0)  # expected 2000 * 10 / 64 = 312.5 each
    assert per_position.min() > 250 and per_position.max() < 380


def test_mask_tokens_is_seeded(windows):
    a = _data.mask_tokens(windows[:50], seed=4)
    b = _data.mask_tokens(windows[:50], seed=4)
    c = _data.mask_tokens(windows[:50], seed=5)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a[2], c[2])


def test_mask_tokens_chooses_at_least_one_position():
    _, _, mask = _data.mask_tokens(np.zeros((3, 4), np.int32), seed=0)
    np.testing.assert_array_equal(mask.sum(axis=1), [1, 1, 1])


@pytest.mark.parametrize(
    ("tokens", "rate", "match"),
    [
        (np.zeros((2, 8), np.int32), 0.0, "rate must lie strictly between 0 and 1"),
        (np.zeros((2, 8), np.int32), 1.0, "got 1.0"),
        (np.zeros(8, np.int32), 0.15, "2-D integer array.*shape \\(8,\\)"),
        (np.zeros((2, 8), np.float32), 0.15, "dtype float32"),
        (np.full((2, 8), _data.MASK_ID), 0.15, "must lie in \\[0, 128\\)"),
    ],
)
def test_mask_tokens_rejects_bad_arguments(tokens, rate, match):
    with pytest.raises(ValueError, match=match):
        _data.mask_tokens(tokens, seed=0, rate=rate)


def test_docstring_examples_run():
    result = doctest.testmod(_data)
    assert result.attempted >= 1 and result.failed == 0
