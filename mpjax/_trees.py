"""Pytrees with leaves that are not arrays: which leaves train, and how.

Models hold more than arrays: an Equinox MLP keeps its activation functions as
leaves, a module may keep a flag or a name. As in Equinox's
``filter_value_and_grad`` and ``apply_updates``, the floating (real or complex)
array leaves are differentiated and trained, other arrays (integer counters,
boolean masks, PRNG keys) get placeholder gradients, and every other leaf passes
through untouched, with ``None`` in its place in gradient, update and optimizer
trees. The helpers need no Equinox: any pytree works.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "apply_updates",
    "arrays_only",
    "gradient_placeholder",
    "is_array",
    "is_inexact_array",
]


def is_array(x: Any) -> bool:
    """Whether ``x`` is an array leaf (a JAX or NumPy array or NumPy scalar).

    >>> is_array(jnp.ones(2)), is_array(2.0), is_array(jax.nn.relu)
    (True, False, False)
    """
    return isinstance(x, jax.Array | np.ndarray | np.generic)


def is_inexact_array(x: Any) -> bool:
    """Whether ``x`` is an array leaf with a real or complex floating dtype."""
    return is_array(x) and jnp.issubdtype(x.dtype, jnp.inexact)


def arrays_only(tree: Any) -> Any:
    """``tree`` with every leaf that is not an array replaced by ``None``: what an
    optimizer's ``init`` and ``update`` receive (Equinox's
    ``eqx.filter(tree, eqx.is_array)``).

    >>> arrays_only({"w": jnp.ones(1), "act": jax.nn.relu})["act"] is None
    True
    """
    return jax.tree.map(lambda x: x if is_array(x) else None, tree)


def gradient_placeholder(x: Any) -> Any:
    """The gradient of a leaf that is not differentiated: zeros of its own dtype
    for integer and boolean arrays, float0 zeros for other arrays (PRNG keys),
    ``None`` for a leaf that is not an array."""
    if not is_array(x):
        return None
    dtype = jnp.result_type(x)
    if jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.bool_):
        return jnp.zeros_like(x)
    return np.zeros(jnp.shape(x), dtype=jax.dtypes.float0)


def apply_updates(params: Any, updates: Any) -> Any:
    """``optax.apply_updates`` for trees with leaves that are not arrays: where
    ``updates`` holds ``None`` the parameter leaf is returned as it is.

    >>> p = apply_updates({"w": jnp.ones(2), "act": jax.nn.relu},
    ...                   {"w": jnp.ones(2), "act": None})
    >>> p["w"].tolist(), p["act"] is jax.nn.relu
    ([2.0, 2.0], True)
    """

    def add(u: Any, p: Any) -> Any:
        if u is None:
            return p
        return jnp.asarray(p + u).astype(jnp.asarray(p).dtype)

    return jax.tree.map(add, updates, params, is_leaf=lambda x: x is None)
