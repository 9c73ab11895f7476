"""Offline datasets for the AMP experiments and the end-to-end tests.

Everything here ships inside installed packages, so nothing is downloaded:

* :func:`digits` - scikit-learn's bundled 8x8 handwritten digits (1,797 images),
  split into train and test sets with a seeded permutation.
* :func:`noisy_digits` - the same images with seeded Gaussian noise, as a denoising
  task for a convolutional U-Net (inputs and targets of shape ``(N, 8, 8, 1)``).
* :func:`python_text` - the source text of a few standard-library modules of the
  running Python, encoded as 7-bit ASCII codes; :func:`char_windows` cuts seeded
  windows from it and :func:`mask_tokens` masks them for masked language modelling
  (BERT's 80/10/10 rule, with the extra token :data:`MASK_ID`).

Results depend only on the seed and on the installed scikit-learn / Python versions
(which the experiment framework records).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect

import numpy as np

__all__ = [
    "ASCII_VOCAB",
    "MASK_ID",
    "MLM_VOCAB",
    "Split",
    "TEXT_MODULES",
    "char_windows",
    "digits",
    "mask_tokens",
    "noisy_digits",
    "python_text",
]

#: Size of the character vocabulary of :func:`python_text` (7-bit ASCII).
ASCII_VOCAB = 128

#: Token id of ``[MASK]``: the first id after the ASCII codes.
MASK_ID = ASCII_VOCAB

#: Vocabulary size of the masked language model: the ASCII codes and ``[MASK]``,
#: rounded up to a multiple of 8 so the embedding and output matrices tile evenly on
#: tensor cores (ids above ``MASK_ID`` never occur in the data).
MLM_VOCAB = -(-(MASK_ID + 1) // 8) * 8

#: Standard-library modules whose source makes up :func:`python_text`.
TEXT_MODULES = ("textwrap", "string", "functools", "dataclasses")


@dataclasses.dataclass(frozen=True)
class Split:
    """A train/test split of inputs ``x`` and targets ``y`` (NumPy arrays)."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def _check_fraction(test_fraction: float) -> None:
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(
            f"test_fraction must lie strictly between 0 and 1, got {test_fraction}; "
            "pass e.g. 0.2."
        )


def digits(*, seed: int = 0, test_fraction: float = 0.2) -> Split:
    """scikit-learn's 8x8 digits as flat float32 vectors in [0, 1] and int32 labels.

    Args:
        seed: seed of the train/test permutation.
        test_fraction: share of the 1,797 images held out for testing.

    Returns:
        A :class:`Split` with ``x`` of shape ``(N, 64)`` and ``y`` of shape ``(N,)``.
    """
    from sklearn.datasets import load_digits

    _check_fraction(test_fraction)
    bunch = load_digits()
    x = (bunch.data / 16.0).astype(np.float32)
    y = bunch.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(round(test_fraction * len(x)))
    test, train = order[:n_test], order[n_test:]
    return Split(x[train], y[train], x[test], y[test])


def noisy_digits(
    *, seed: int = 0, noise: float = 0.35, test_fraction: float = 0.2
) -> Split:
    """Digit images with additive Gaussian noise (inputs) and clean images (targets).

    Args:
        seed: seed of the split and of the noise.
        noise: standard deviation of the noise, relative to the [0, 1] pixel range.
        test_fraction: share of the images held out for testing.

    Returns:
        A :class:`Split` with ``x`` and ``y`` of shape ``(N, 8, 8, 1)``, float32.
    """
    if noise < 0.0:
        raise ValueError(f"noise must be >= 0, got {noise}; pass e.g. 0.35.")
    base = digits(seed=seed, test_fraction=test_fraction)
    rng = np.random.default_rng(seed + 1)

    def corrupt(x: np.ndarray) -> np.ndarray:
        return (x + noise * rng.standard_normal(x.shape)).astype(np.float32)

    clean_train = base.x_train.reshape(-1, 8, 8, 1)
    clean_test = base.x_test.reshape(-1, 8, 8, 1)
    return Split(corrupt(clean_train), clean_train, corrupt(clean_test), clean_test)


def python_text(modules: tuple[str, ...] = TEXT_MODULES) -> np.ndarray:
    """The concatenated source of standard-library modules as ASCII codes.

    Characters outside 7-bit ASCII become ``?``.

    Args:
        modules: names of importable modules whose source to read.

    Returns:
        A 1-D int32 array of codes in ``[0, ASCII_VOCAB)``.
    """
    if not modules:
        raise ValueError("modules must name at least one module, got an empty tuple.")
    text = "\n".join(inspect.getsource(importlib.import_module(m)) for m in modules)
    codes = np.frombuffer(text.encode("ascii", errors="replace"), dtype=np.uint8)
    return codes.astype(np.int32)


def char_windows(
    codes: np.ndarray, *, length: int, count: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Seeded random windows of a code sequence as next-character prediction pairs.

    Args:
        codes: 1-D integer sequence, e.g. from :func:`python_text`.
        length: window length (tokens per example).
        count: number of windows.
        seed: seed of the window positions.

    Returns:
        ``(inputs, targets)``, both int32 of shape ``(count, length)``, where
        ``targets`` is ``inputs`` shifted by one character.
    """
    if length < 1 or count < 1:
        raise ValueError(
            f"length and count must be >= 1, got length={length}, count={count}."
        )
    if codes.ndim != 1 or codes.shape[0] <= length + 1:
        raise ValueError(
            f"codes must be 1-D and longer than length + 1 = {length + 1}, got shape "
            f"{codes.shape}; pass a longer text or a shorter length."
        )
    starts = np.random.default_rng(seed).integers(0, len(codes) - length - 1, count)
    index = starts[:, None] + np.arange(length + 1)[None, :]
    windows = codes[index]
    return windows[:, :-1].astype(np.int32), windows[:, 1:].astype(np.int32)


def mask_tokens(
    tokens: np.ndarray, *, seed: int, rate: float = 0.15
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """BERT's masking of token windows for masked language modelling.

    In every window ``max(1, round(rate * length))`` positions are chosen at random
    (seeded); of the chosen positions 80 % become :data:`MASK_ID`, 10 % a uniformly
    random ASCII code and 10 % keep their token. The model has to predict the
    original token at exactly the chosen positions.

    Args:
        tokens: int array of shape ``(count, length)`` with codes below
            :data:`MASK_ID`, e.g. the inputs from :func:`char_windows`.
        seed: seed of the positions and replacements.
        rate: share of the positions to predict, in (0, 1).

    Returns:
        ``(inputs, targets, mask)``: the corrupted tokens (int32), the original
        tokens (int32) and the chosen positions (bool), each of shape
        ``(count, length)``.

    >>> inputs, targets, mask = mask_tokens(np.full((2, 20), 65), seed=0)
    >>> mask.sum(axis=1).tolist(), bool(np.all(inputs[~mask] == 65))
    ([3, 3], True)
    """
    if not 0.0 < rate < 1.0:
        raise ValueError(
            f"rate must lie strictly between 0 and 1, got {rate}; pass e.g. 0.15."
        )
    tokens = np.asarray(tokens)
    if tokens.ndim != 2 or not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(
            f"tokens must be a 2-D integer array (count, length), got dtype "
            f"{tokens.dtype} and shape {tokens.shape}."
        )
    if tokens.size and (tokens.min() < 0 or tokens.max() >= MASK_ID):
        raise ValueError(
            f"tokens must lie in [0, {MASK_ID}) (ASCII codes), got values in "
            f"[{tokens.min()}, {tokens.max()}]."
        )
    count, length = tokens.shape
    chosen = max(1, round(rate * length))
    rng = np.random.default_rng(seed)
    # The `chosen` smallest of `length` uniform keys per row: a uniformly random
    # subset of positions of that size in every window.
    keys = rng.random((count, length))
    positions = np.argsort(keys, axis=1)[:, :chosen]
    mask = np.zeros((count, length), bool)
    np.put_along_axis(mask, positions, True, axis=1)
    action = rng.random((count, length))
    random_codes = rng.integers(0, ASCII_VOCAB, size=(count, length))
    inputs = np.where(mask & (action < 0.8), MASK_ID, tokens)
    inputs = np.where(mask & (action >= 0.8) & (action < 0.9), random_codes, inputs)
    return inputs.astype(np.int32), tokens.astype(np.int32), mask
