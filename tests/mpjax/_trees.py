"""Parameter and gradient trees shared by the loss-scaling tests."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def make_params(dtype=jnp.float32):
    return {
        "w": jnp.linspace(-1.0, 1.0, 6, dtype=dtype).reshape(2, 3),
        "b": jnp.ones(3, dtype),
    }


def make_grads(params, value=0.5):
    return jax.tree.map(lambda p: jnp.full(p.shape, value, p.dtype), params)


def scale_tree(tree, scale):
    return jax.tree.map(lambda g: (g.astype(jnp.float32) * scale).astype(g.dtype), tree)
