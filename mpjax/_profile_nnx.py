"""Flax NNX module paths for the records of `mpjax.profile`.

JAX names the source of an operation by its name stack (`jax.named_scope`);
Flax linen pushes one scope per module, NNX pushes none. While `module_scopes`
is active, every NNX module found in the arguments calls ``__call__`` inside
``jax.named_scope(<its attribute path>)``, e.g. ``hidden.0`` for
``model.hidden[0]``, so the records of the values it computes name it.

Each module gets, for the duration, a subclass of its own class that carries its
path (a class attribute, so the copies JAX makes when it flattens and rebuilds
the module as a pytree carry it too); the original classes are restored on exit.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import jax

__all__ = ["module_scopes"]


@functools.cache
def _scoped_class(cls: type, path: str) -> type:
    """A subclass of `cls` whose ``__call__`` runs under ``named_scope(path)``."""

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        with jax.named_scope(path):
            return super(scoped, self).__call__(*args, **kwargs)

    scoped = type(
        cls.__name__, (cls,), {"__call__": __call__, "__module__": cls.__module__}
    )
    scoped.__qualname__ = cls.__qualname__
    scoped._mpjax_original_class = cls  # noqa: SLF001 (read back by module_scopes)
    return scoped


def _modules(tree: Any) -> list[tuple[str, Any]]:
    """(path, module) of every callable NNX module reachable from `tree`'s roots."""
    try:
        from flax import nnx
    except ImportError:  # pragma: no cover - flax is a dependency
        return []
    roots = jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, nnx.Module))
    found: dict[int, tuple[str, Any]] = {}
    for root in roots:
        if not isinstance(root, nnx.Module):
            continue
        for path, node in nnx.iter_graph(root):
            if isinstance(node, nnx.Module) and id(node) not in found:
                name = ".".join(str(p) for p in path) or type(node).__name__
                if callable(node):
                    found[id(node)] = (name, node)
    return list(found.values())


@contextlib.contextmanager
def module_scopes(tree: Any) -> Iterator[None]:
    """Names every NNX module of `tree` by its path while the context is active."""
    patched = []
    try:
        for path, module in _modules(tree):
            cls = type(module)
            original = getattr(cls, "_mpjax_original_class", cls)
            object.__setattr__(module, "__class__", _scoped_class(original, path))
            patched.append((module, cls))
        yield
    finally:
        for module, cls in patched:
            object.__setattr__(module, "__class__", cls)
