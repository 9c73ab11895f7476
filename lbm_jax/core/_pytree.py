"""One way to make a validated class a pytree: named attributes as children.

The models (:class:`~lbm_jax.ibm.Membrane`, :class:`~lbm_jax.ibm.ImmersedBoundary`,
:class:`~lbm_jax.free_surface.FreeSurface`) check their arguments in ``__init__``
and are passed to jitted functions as arguments. :func:`pytree_attributes`
registers such a class: its ``data`` attributes are children (arrays, or pytrees
of them), its ``meta`` attributes static (hashed into the compilation cache), and
a rebuilt object skips ``__init__`` (the values were checked when the original
was made, and children may be tracers). ``jax.tree_util.register_dataclass``
calls ``__init__`` on rebuilding, so it fits dataclasses only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import jax

__all__ = ["pytree_attributes"]

_T = TypeVar("_T")


def pytree_attributes(
    *, data: tuple[str, ...], meta: tuple[str, ...] = ()
) -> Callable[[type[_T]], type[_T]]:
    """Class decorator: register the class as a pytree of the named attributes.

    Args:
        data: Attributes that are children (their leaves are traced under ``jit``).
        meta: Attributes that are static (hashable; a change compiles anew).

    >>> @pytree_attributes(data=("x",), meta=("name",))
    ... class Point:
    ...     def __init__(self, x, name):
    ...         self.x, self.name = x, name
    >>> p = jax.tree.map(lambda v: v + 1, Point(1.0, "a"))
    >>> p.x, p.name
    (2.0, 'a')
    """

    def register(cls: type[_T]) -> type[_T]:
        keys = tuple(jax.tree_util.GetAttrKey(n) for n in data)

        def flatten_with_keys(obj: Any) -> tuple[list, tuple]:
            children = [(k, getattr(obj, n)) for k, n in zip(keys, data, strict=True)]
            return children, tuple(getattr(obj, n) for n in meta)

        def flatten(obj: Any) -> tuple[tuple, tuple]:
            children = tuple(getattr(obj, n) for n in data)
            return children, tuple(getattr(obj, n) for n in meta)

        def unflatten(static: tuple, children: Any) -> _T:
            obj = object.__new__(cls)
            for name, value in zip(meta, static, strict=True):
                object.__setattr__(obj, name, value)
            for name, value in zip(data, children, strict=True):
                object.__setattr__(obj, name, value)
            return obj

        jax.tree_util.register_pytree_with_keys(
            cls, flatten_with_keys, unflatten, flatten_func=flatten
        )
        return cls

    return register
