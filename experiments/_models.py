"""Flax NNX models for the AMP experiments: the three network archetypes.

* :class:`MLP` - a feed-forward classifier (digits).
* :class:`UNet` - a small convolutional encoder/decoder with skip connections
  (digit denoising), with GroupNorm in every block.
* :class:`TransformerLM` - a pre-LayerNorm causal transformer for character-level
  language modelling.

The models are written dtype-agnostically: layers take their computation dtype from
their ``dtype`` attributes (set by :func:`mpjax.apply_policy`), and every place that
mixes a layer output with something else casts explicitly, so they also run under
JAX's strict dtype promotion. Loss functions take ``(model, batch)`` and return a
float32 scalar.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

__all__ = [
    "MLP",
    "TransformerBlock",
    "TransformerLM",
    "UNet",
    "classification_loss",
    "denoising_loss",
    "language_model_loss",
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


class TransformerBlock(nnx.Module):
    """Pre-LayerNorm transformer block: causal self-attention and a GELU MLP."""

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
        mask = nnx.make_causal_mask(x[..., 0], dtype=jnp.bool_)
        h = self.attention(self.norm1(x), mask=mask)
        x = x + h.astype(x.dtype)
        h = self.mlp_out(jax.nn.gelu(self.mlp_in(self.norm2(x))))
        return x + h.astype(x.dtype)


class TransformerLM(nnx.Module):
    """Causal character-level language model with learned positional embeddings."""

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
        self.embed = nnx.Embed(vocab, dim, rngs=rngs)
        self.position = nnx.Param(
            0.02 * jax.random.normal(rngs.params(), (max_length, dim), jnp.float32)
        )
        self.blocks = nnx.List(
            [TransformerBlock(dim, heads, rngs=rngs) for _ in range(layers)]
        )
        self.norm = nnx.LayerNorm(dim, rngs=rngs)
        self.head = nnx.Linear(dim, vocab, rngs=rngs)

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
        return self.head(self.norm(x))


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


def language_model_loss(model: nnx.Module, batch: tuple) -> jax.Array:
    """Mean next-token cross-entropy in nats per character, float32."""
    tokens, targets = batch
    logits = model(tokens).astype(jnp.float32)
    return _cross_entropy(logits, targets)


def _cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(log_probs, labels[..., None], axis=-1)
    return -jnp.mean(picked)
