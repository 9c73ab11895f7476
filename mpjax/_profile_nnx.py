"""Flax NNX module paths for the records of `mpjax.profile`.

JAX names the source of an operation by its name stack (`jax.named_scope`);
Flax linen pushes one scope per module, NNX pushes none. While `module_scopes`
is active, every NNX module found in the arguments runs its ``__call__`` inside
``jax.named_scope(<its attribute path>)``, e.g. ``hidden.0`` for
``model.hidden[0]``, so the records of the values it computes name it.

Nothing about the modules' classes changes: the program traced is exactly the
one that runs without the profiler (a policy's casts included). Each module
carries its path, for the duration, in one static attribute, which the copies
JAX makes when it flattens and rebuilds a module as a pytree carry too; a
profile function of this thread (`sys.setprofile`, the previous one chained and
restored on exit) enters the scope when a module's ``__call__`` starts and
leaves it when that call returns or raises.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from types import FrameType
from typing import Any

import jax

__all__ = ["module_scopes"]

_PATH = "_mpjax_scope_path"


def _modules(tree: Any) -> list[tuple[str, Any]]:
    """(path, module) of every callable NNX module reachable from `tree`'s roots."""
    from flax import nnx

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


class _Scopes:
    """The profile function: a stack of (frame, module, open named scope)."""

    def __init__(self, previous: Any) -> None:
        from flax import nnx

        self.module_type = nnx.Module
        self.previous = previous
        self.stack: list[tuple[FrameType, Any, Any]] = []

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if self.previous is not None:
            self.previous(frame, event, arg)
        if event == "call" and frame.f_code.co_name == "__call__":
            module = frame.f_locals.get("self")
            if not isinstance(module, self.module_type):
                return
            path = vars(module).get(_PATH)
            # a subclass' __call__ calling its base's is one module call
            if path is None or (self.stack and self.stack[-1][1] is module):
                return
            scope = jax.named_scope(path)
            scope.__enter__()
            self.stack.append((frame, module, scope))
        elif event == "return" and self.stack and self.stack[-1][0] is frame:
            self.stack.pop()[2].__exit__(None, None, None)


@contextlib.contextmanager
def module_scopes(tree: Any) -> Iterator[None]:
    """Names every NNX module of `tree` by its path while the context is active."""
    marked = []
    previous = sys.getprofile()
    scopes = _Scopes(previous)
    try:
        for path, module in _modules(tree):
            object.__setattr__(module, _PATH, path)
            marked.append(module)
        sys.setprofile(scopes)
        yield
    finally:
        sys.setprofile(previous)
        while scopes.stack:  # left open only if the context exits mid-call
            scopes.stack.pop()[2].__exit__(None, None, None)
        for module in marked:
            vars(module).pop(_PATH, None)
