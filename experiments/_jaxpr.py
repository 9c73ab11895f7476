"""Reading traced programs: every equation of a jaxpr, and its matrix-product FLOPs.

One walker for the benchmarks (and the tests) that read what a step computes:
:func:`equations` recurses into the sub-jaxprs of ``jit``, ``custom_vjp``,
``scan``, ``cond`` and the like; :func:`matmul_flops` counts the multiply-adds of
every ``dot_general`` and ``conv_general_dilated`` in it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

__all__ = ["equations", "matmul_flops"]


def equations(jaxpr: Any) -> Iterator[Any]:
    """Every equation of ``jaxpr`` (a ``Jaxpr`` or ``ClosedJaxpr``), sub-jaxprs
    included, in program order (a sub-jaxpr's after the equation holding it)."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    for eqn in jaxpr.eqns:
        yield eqn
        for param in eqn.params.values():
            for sub in param if isinstance(param, tuple | list) else (param,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from equations(inner)


def _product_flops(eqn: Any) -> int:
    out = eqn.outvars[0].aval
    lhs, rhs = (v.aval for v in eqn.invars[:2])
    if eqn.primitive.name == "dot_general":
        (lhs_contract, _), _ = eqn.params["dimension_numbers"]
        depth = math.prod(lhs.shape[d] for d in lhs_contract)
    else:  # conv_general_dilated: every output element sums over one kernel slice
        out_feature = eqn.params["dimension_numbers"].rhs_spec[0]
        depth = math.prod(rhs.shape) // rhs.shape[out_feature]
    return 2 * math.prod(out.shape) * depth


def matmul_flops(jaxpr: Any) -> int:
    """Floating-point operations (2 per multiply-add) of the matrix products and
    convolutions of ``jaxpr``; a ``scan`` or loop body counts once.

    >>> import jax, jax.numpy as jnp
    >>> matmul_flops(jax.make_jaxpr(jnp.matmul)(jnp.ones((2, 3)), jnp.ones((3, 4))))
    48
    """
    names = ("dot_general", "conv_general_dilated")
    return sum(_product_flops(e) for e in equations(jaxpr) if e.primitive.name in names)
