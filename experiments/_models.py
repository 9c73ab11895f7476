"""Flax NNX models for the AMP experiments: three of the network archetypes.

* :class:`MLP` - a feed-forward classifier (digits).
* :class:`UNet` - a small convolutional encoder/decoder with skip connections
  (digit denoising), with GroupNorm in every block.
* :class:`BertMLM` - a BERT-style bidirectional transformer encoder (pre-LayerNorm
  :class:`EncoderBlock` s) with a masked-language-modelling head, for characters.

The models are written dtype-agnostically: layers take their computation dtype from
their ``dtype`` attributes (set by :func:`mpjax.apply_policy`), and every place that
mixes a layer output with something else casts explicitly, so they also run under
JAX's strict dtype promotion. Loss functions take ``(model, batch)`` and return a
float32 scalar; the metric functions take the same arguments. The fourth
archetype, an Equinox MLP (``eqx.nn.MLP``), needs no class here: its model takes one
example at a time, and :func:`per_example` maps these losses and metrics over the
batch for it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

__all__ = [
    "BertMLM",
    "EncoderBlock",
    "MLP",
    "UNet",
    "classification_accuracy",
    "classification_loss",
    "denoising_loss",
    "masked_lm_loss",
    "masked_token_accuracy",
    "per_example",
]


class MLP(nnx.Module):
    """Feed-forward classifier: ``depth`` hidden ReLU layers of width ``width``."""

    def __init__(
        self,
        in_features: int,
        width: int,
        out_features: int,
        *,
        depth: int = 2,
        rngs: nnx.Rngs,
    ) -> None:
        sizes = [in_features] + [width] * depth
        self.hidden = nnx.List(
            [
                nnx.Linear(a, b, rngs=rngs)
                for a, b in zip(sizes[:-1], sizes[1:], strict=True)
            ]
        )
        self.head = nnx.Linear(width, out_features, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.hidden:
            x = jax.nn.relu(layer(x))
        return self.head(x)


class _ConvBlock(nnx.Module):
    """Two 3x3 convolutions, each followed by GroupNorm and GELU."""

    def __init__(self, cin: int, cout: int, *, rngs: nnx.Rngs) -> None:
        groups = 4 if cout % 4 == 0 else 1
        self.conv1 = nnx.Conv(cin, cout, (3, 3), rngs=rngs)
        self.norm1 = nnx.GroupNorm(cout, num_groups=groups, rngs=rngs)
        self.conv2 = nnx.Conv(cout, cout, (3, 3), rngs=rngs)
        self.norm2 = nnx.GroupNorm(cout, num_groups=groups, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        # Convolutions cast their inputs to their own dtype, so a GroupNorm that
        # runs wider (a float32 override) needs no cast in between.
        h = jax.nn.gelu(self.norm1(self.conv1(x)))
        return jax.nn.gelu(self.norm2(self.conv2(h)))


class UNet(nnx.Module):
    """A U-Net for 8x8 single-channel images with ``levels`` resolution levels.

    Each level halves the resolution with a strided convolution and doubles the
    channels; the decoder upsamples with transposed convolutions and concatenates
    the encoder features of the same level.
    """

    def __init__(
        self,
        channels: int = 16,
        *,
        levels: int = 2,
        in_channels: int = 1,
        rngs: nnx.Rngs,
    ) -> None:
        if levels < 1:
            raise ValueError(f"levels must be >= 1, got {levels}.")
        widths = [channels * 2**i for i in range(levels + 1)]
        self.stem = _ConvBlock(in_channels, widths[0], rngs=rngs)
        self.down = nnx.List(
            [
                nnx.Conv(widths[i], widths[i + 1], (3, 3), strides=2, rngs=rngs)
                for i in range(levels)
            ]
        )
        self.encode = nnx.List(
            [_ConvBlock(widths[i + 1], widths[i + 1], rngs=rngs) for i in range(levels)]
        )
        self.up = nnx.List(
            [
                nnx.ConvTranspose(
                    widths[i + 1], widths[i], (2, 2), strides=(2, 2), rngs=rngs
                )
                for i in range(levels)
            ]
        )
        self.decode = nnx.List(
            [_ConvBlock(2 * widths[i], widths[i], rngs=rngs) for i in range(levels)]
        )
        self.head = nnx.Conv(widths[0], in_channels, (1, 1), rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = self.stem(x)
        skips = [h]
        for down, block in zip(self.down, self.encode, strict=True):
            h = block(down(h))
            skips.append(h)
        skips.pop()
        for i in reversed(range(len(self.up))):
            up = self.up[i](h)
            skip = skips.pop().astype(up.dtype)
            h = self.decode[i](jnp.concatenate([up, skip], axis=-1))
        return self.head(h)


class EncoderBlock(nnx.Module):
    """Pre-LayerNorm transformer encoder block: bidirectional (unmasked)
    self-attention and a GELU MLP, each in a residual branch."""

    def __init__(self, dim: int, heads: int, *, rngs: nnx.Rngs) -> None:
        if dim % heads:
            raise ValueError(f"dim ({dim}) must be a multiple of heads ({heads}).")
        self.norm1 = nnx.LayerNorm(dim, rngs=rngs)
        self.attention = nnx.MultiHeadAttention(
            num_heads=heads, in_features=dim, decode=False, rngs=rngs
        )
        self.norm2 = nnx.LayerNorm(dim, rngs=rngs)
        self.mlp_in = nnx.Linear(dim, 4 * dim, rngs=rngs)
        self.mlp_out = nnx.Linear(4 * dim, dim, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        # No attention mask: every position attends to every other one.
        h = self.attention(self.norm1(x))
        x = x + h.astype(x.dtype)
        h = self.mlp_out(jax.nn.gelu(self.mlp_in(self.norm2(x))))
        return x + h.astype(x.dtype)


class BertMLM(nnx.Module):
    """A BERT-style encoder with a masked-language-modelling head.

    Token and learned position embeddings, ``layers`` pre-LayerNorm
    :class:`EncoderBlock` s with bidirectional self-attention, a final LayerNorm and
    BERT's prediction head (dense, GELU, LayerNorm, projection to the vocabulary).
    Calling it on int tokens of shape ``(..., length)`` returns logits of shape
    ``(..., length, vocab)``.
    """

    def __init__(
        self,
        vocab: int,
        dim: int,
        *,
        heads: int = 4,
        layers: int = 2,
        max_length: int = 128,
        rngs: nnx.Rngs,
    ) -> None:
        if layers < 1:
            raise ValueError(f"layers must be >= 1, got {layers}.")
        self.embed = nnx.Embed(vocab, dim, rngs=rngs)
        self.position = nnx.Param(
            0.02 * jax.random.normal(rngs.params(), (max_length, dim), jnp.float32)
        )
        self.blocks = nnx.List(
            [EncoderBlock(dim, heads, rngs=rngs) for _ in range(layers)]
        )
        self.norm = nnx.LayerNorm(dim, rngs=rngs)
        self.head_dense = nnx.Linear(dim, dim, rngs=rngs)
        self.head_norm = nnx.LayerNorm(dim, rngs=rngs)
        self.head_out = nnx.Linear(dim, vocab, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        length = tokens.shape[-1]
        if length > self.position.shape[0]:
            raise ValueError(
                f"sequence length {length} exceeds max_length "
                f"{self.position.shape[0]}; build the model with a larger max_length."
            )
        x = self.embed(tokens)
        x = x + self.position[...][None, :length].astype(x.dtype)
        for block in self.blocks:
            x = block(x)
        h = jax.nn.gelu(self.head_dense(self.norm(x)))
        return self.head_out(self.head_norm(h))


def per_example(fn: Callable[[Any, tuple], jax.Array]) -> Callable:
    """``fn(model, batch)`` for a model that takes one example at a time (an
    Equinox model): ``fn`` sees the model mapped over the batch with ``jax.vmap``.

    >>> loss = per_example(classification_loss)
    >>> round(float(loss(lambda x: x, (jnp.zeros((2, 3)), jnp.zeros(2, jnp.int32)))), 4)
    1.0986
    """

    @functools.wraps(fn)
    def batched(model: Any, batch: tuple) -> jax.Array:
        return fn(jax.vmap(model), batch)

    return batched


def classification_loss(model: nnx.Module, batch: tuple) -> jax.Array:
    """Mean softmax cross-entropy of ``model(x)`` against integer labels, float32."""
    x, y = batch
    logits = model(x).astype(jnp.float32)
    return _cross_entropy(logits, y)


def denoising_loss(model: nnx.Module, batch: tuple) -> jax.Array:
    """Mean squared error between ``model(noisy)`` and the clean image, float32."""
    x, y = batch
    error = model(x).astype(jnp.float32) - y.astype(jnp.float32)
    return jnp.mean(jnp.square(error))


def masked_lm_loss(model: nnx.Module, batch: tuple) -> jax.Array:
    """Mean cross-entropy in nats over the masked positions only, float32.

    ``batch`` is ``(inputs, targets, mask)`` from :func:`experiments._data.mask_tokens`;
    positions where ``mask`` is false do not enter the loss.
    """
    inputs, targets, mask = batch
    logits = model(inputs).astype(jnp.float32)
    return _cross_entropy(logits, targets, mask)


def classification_accuracy(model: nnx.Module, batch: tuple) -> jax.Array:
    """Share of ``(x, y)`` examples whose arg-max logit is the label, float32."""
    x, y = batch
    hits = jnp.argmax(model(x), axis=-1) == y
    return jnp.mean(hits.astype(jnp.float32))


def masked_token_accuracy(model: nnx.Module, batch: tuple) -> jax.Array:
    """Share of masked positions whose arg-max logit is the original token."""
    inputs, targets, mask = batch
    hits = (jnp.argmax(model(inputs), axis=-1) == targets) & mask
    return jnp.sum(hits.astype(jnp.float32)) / jnp.sum(mask.astype(jnp.float32))


def _cross_entropy(
    logits: jax.Array, labels: jax.Array, where: jax.Array | None = None
) -> jax.Array:
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]
    if where is None:
        return -jnp.mean(picked)
    weights = where.astype(jnp.float32)
    return -jnp.sum(picked * weights) / jnp.sum(weights)
