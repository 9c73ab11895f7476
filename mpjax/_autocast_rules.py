"""What `mpjax.autocast` does to each primitive: the operation lists, as data.

:class:`AutocastRules` holds three lists of primitive names. Products
(``low_precision_ops``) take their floating operands in the policy's compute
dtype and accumulate in float32; ``float32_ops`` run in (at least) float32;
``traced_dtype_ops`` run in the dtypes the function was traced with; every other
primitive runs in the widest floating dtype of its inputs. This module also
holds the rule of each of these kinds for one equation; the interpreter
(:mod:`mpjax._autocast`) picks them from a table built from the lists.
"""

from __future__ import annotations

import dataclasses
import difflib
import textwrap
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.custom_derivatives import SymbolicZero
from jax.extend import core as jcore
from jax.extend.core import primitives as jprims

__all__ = [
    "HIGHER_ORDER",
    "AutocastRules",
    "Interpreter",
    "Rule",
    "bind",
    "cast",
    "follow_inputs",
    "in_traced_dtype",
    "is_floating",
    "list_rules",
    "widest",
]

#: Primitives the interpreter enters instead of casting: their bodies are
#: evaluated under the same rules (see :mod:`mpjax._autocast`).
HIGHER_ORDER = (
    "jit",
    "closed_call",
    "call",
    "remat2",
    "custom_jvp_call",
    "custom_vjp_call",
    "scan",
    "while",
    "cond",
    "shard_map",
)

# Products the low-precision rule knows: two operands and a
# `preferred_element_type` parameter setting the accumulation dtype.
_PRODUCTS = ("dot_general", "conv_general_dilated")

_FLOAT32 = (
    # exponentials, logarithms, powers and roots: overflow or lose range in float16
    *("exp", "exp2", "expm1", "log", "log1p", "logistic", "pow", "integer_pow"),
    *("square", "sqrt", "rsqrt", "cbrt", "sinh", "cosh"),
    # reductions (sums, means, variances, softmax and loss denominators)
    *("reduce_sum", "reduce_prod", "reduce_max", "reduce_min", "argmax", "argmin"),
    *("cumsum", "cumprod", "cumlogsumexp", "cummax", "cummin", "reduce_window_sum"),
    # special functions
    *("erf", "erfc", "erf_inv", "lgamma", "digamma", "igamma", "igammac"),
    *("polygamma", "zeta", "bessel_i0e", "bessel_i1e", "random_gamma"),
    "regularized_incomplete_beta",
    # linear algebra and transforms: no 16-bit kernels
    *("cholesky", "eig", "eigh", "lu", "qr", "svd", "schur", "hessenberg"),
    *("householder_product", "triangular_solve", "tridiagonal", "tridiagonal_solve"),
    *("fft", "complex"),
)

# Bit-level primitives and opaque kernels read their inputs' exact dtypes.
_TRACED_DTYPE = ("bitcast_convert_type", "pallas_call", "ffi_call")

_FIELDS = {
    "low_precision": "low_precision_ops",
    "float32": "float32_ops",
    "traced_dtype": "traced_dtype_ops",
}


def _known_names() -> frozenset[str]:
    found = {p.name for p in vars(jprims).values() if isinstance(p, jcore.Primitive)}
    return frozenset(found | set(_TRACED_DTYPE) | {"psum_invariant", "shard_map"})


_KNOWN = _known_names()


def _names(field: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise TypeError(
            f"AutocastRules.{field} must be a sequence of primitive names, got "
            f"{type(value).__name__} {value!r}; pass e.g. ('exp', 'log')."
        )
    names = tuple(value)
    for name in names:
        if not isinstance(name, str):
            raise TypeError(
                f"AutocastRules.{field}: primitive names are strings, got "
                f"{type(name).__name__} {name!r}."
            )
        if name not in _KNOWN:
            near = difflib.get_close_matches(name, _KNOWN, n=3)
            hint = f" Did you mean {', '.join(map(repr, near))}?" if near else ""
            raise ValueError(
                f"AutocastRules.{field}: unknown primitive {name!r}.{hint} Names are "
                "those of jax.extend.core.primitives (the names jax.make_jaxpr "
                "prints, such as 'dot_general', 'exp', 'reduce_sum')."
            )
        if name in HIGHER_ORDER or name == "convert_element_type":
            raise ValueError(
                f"AutocastRules.{field}: {name!r} cannot be listed: autocast enters "
                "higher-order primitives and evaluates their bodies under the "
                "rules, and keeps explicit dtype conversions; list the primitives "
                "inside them instead."
            )
    return tuple(sorted(set(names)))


@dataclasses.dataclass(frozen=True)
class AutocastRules:
    """The operation lists of :func:`mpjax.autocast`, by primitive name.

    Names are those ``jax.make_jaxpr`` prints (``jax.extend.core.primitives``).
    Each primitive is in at most one list; one in none runs in the widest
    floating dtype of its inputs (integers and booleans are never cast).

    Args:
      low_precision_ops: products whose floating operands are cast to the
        policy's compute dtype; they accumulate in float32
        (``preferred_element_type``) and their result is cast to the compute
        dtype. Only ``dot_general`` and ``conv_general_dilated`` can be listed.
      float32_ops: primitives whose floating inputs are cast to float32 (or a
        wider input dtype); their results stay float32.
      traced_dtype_ops: primitives run on inputs cast back to the dtypes the
        function was traced with (bit-level operations, opaque kernels).
        Primitives with a sub-program in their parameters that autocast does
        not enter (``scatter``, ``reduce``, ``custom_linear_solve``...) are run
        this way too.

    Raises:
      ValueError: for an unknown primitive name (close spellings suggested), a
        higher-order primitive, a product autocast cannot run in low precision,
        or a name in two lists.
      TypeError: if a list is not a sequence of strings.

    >>> rules = AutocastRules()
    >>> "exp" in rules.float32_ops, rules.low_precision_ops
    (True, ('conv_general_dilated', 'dot_general'))
    >>> "tanh" in rules.move("tanh", to="float32").float32_ops
    True
    """

    low_precision_ops: Sequence[str] = _PRODUCTS
    float32_ops: Sequence[str] = _FLOAT32
    traced_dtype_ops: Sequence[str] = _TRACED_DTYPE

    def __post_init__(self) -> None:
        seen: dict[str, str] = {}
        for field in _FIELDS.values():
            object.__setattr__(self, field, _names(field, getattr(self, field)))
        other = sorted(set(self.low_precision_ops) - set(_PRODUCTS))
        if other:
            raise ValueError(
                f"AutocastRules.low_precision_ops: {other} cannot run as a cast "
                f"product; only {list(_PRODUCTS)} can. Put other primitives in "
                "float32_ops, or leave them out to follow their inputs' dtype."
            )
        for field in _FIELDS.values():
            for name in getattr(self, field):
                if name in seen:
                    raise ValueError(
                        f"AutocastRules: {name!r} is in both {seen[name]} and "
                        f"{field}; a primitive follows one rule, so list it once "
                        "(AutocastRules.move takes it out of the others)."
                    )
                seen[name] = field

    def move(self, *names: str, to: str) -> AutocastRules:
        """A copy with ``names`` moved to one list and out of the others.

        Args:
          *names: primitive names.
          to: ``"low_precision"``, ``"float32"``, ``"traced_dtype"``, or
            ``"inputs"`` (in no list: follow the widest input dtype).

        Returns:
          The new rules (validated as on construction).

        Raises:
          ValueError: for an unknown list or an invalid name.

        >>> "exp" in AutocastRules().move("exp", to="inputs").float32_ops
        False
        """
        if to not in (*_FIELDS, "inputs"):
            raise ValueError(
                f"AutocastRules.move: unknown list {to!r}; expected one of "
                f"{[*_FIELDS, 'inputs']}."
            )
        _names("move", names)
        lists = {
            field: [n for n in getattr(self, field) if n not in names]
            for field in _FIELDS.values()
        }
        if to in _FIELDS:
            lists[_FIELDS[to]] += names
        return AutocastRules(**lists)

    def __str__(self) -> str:
        def block(title: str, names: Sequence[str]) -> str:
            body = textwrap.fill(", ".join(names) or "(none)", 76)
            return f"{title}:\n{textwrap.indent(body, '  ')}"

        return "\n".join(
            [
                block(
                    "low precision (compute dtype, float32 accumulation)",
                    self.low_precision_ops,
                ),
                block("float32", self.float32_ops),
                block("traced dtype", self.traced_dtype_ops),
                "every other primitive: the widest floating dtype of its inputs",
            ]
        )


class Interpreter(Protocol):
    """What a rule needs from the interpreter running it."""

    compute_dtype: np.dtype

    def evaluate(self, closed: jcore.ClosedJaxpr, args: Sequence[Any]) -> list[Any]:
        """Evaluates ``closed`` on ``args`` under the same rules."""

    def adapts(self, atom: Any) -> bool:
        """Whether an input of an equation is computed from literals only (a
        scalar constant, ``jnp.zeros``, a mask from ``iota``): it was given the
        other operands' dtype when the function was traced, and adapts again."""


#: ``rule(interpreter, eqn, invals) -> outvals`` for one equation.
Rule = Callable[[Interpreter, jcore.JaxprEqn, list[Any]], list[Any]]


def _dtype(x: Any) -> Any:
    """The dtype of a value (an array or a Python number), or ``x`` if it is one."""
    if hasattr(x, "dtype"):
        return x.dtype
    return np.result_type(type(x)) if isinstance(x, int | float | complex) else x


def is_floating(x: Any) -> bool:
    """Whether ``x`` (a value or a dtype) is real floating point."""
    return bool(jax.dtypes.issubdtype(_dtype(x), np.floating))


def cast(x: Any, dtype: Any) -> Any:
    """``x`` in ``dtype`` if it is a real floating value, else ``x`` unchanged."""
    if is_floating(x) and _dtype(x) != np.dtype(dtype):
        return lax.convert_element_type(x, dtype)
    return x


def widest(dtypes: Iterable[np.dtype]) -> np.dtype:
    """The narrowest floating dtype holding all of ``dtypes`` (bfloat16 and
    float16 together give float32), whatever the promotion mode in use."""
    out, *rest = dtypes
    with jax.numpy_dtype_promotion("standard"):
        for dtype in rest:
            out = jnp.promote_types(out, dtype)
    return np.dtype(out)


def bind(eqn: jcore.JaxprEqn, invals: Sequence[Any]) -> list[Any]:
    """Applies ``eqn``'s primitive with its own parameters to ``invals``."""
    params = eqn.primitive.get_bind_params(eqn.params)
    with eqn.ctx.manager:
        outs = eqn.primitive.bind(*invals, **params)
    return list(outs) if eqn.primitive.multiple_results else [outs]


def _free_dtypes(
    ctx: Interpreter, eqn: jcore.JaxprEqn, invals: Sequence[Any]
) -> list[np.dtype]:
    """The floating dtypes of the inputs that neither adapt nor are weakly typed."""
    return [
        _dtype(x)
        for atom, x in zip(eqn.invars, invals, strict=True)
        if is_floating(x) and not ctx.adapts(atom) and not atom.aval.weak_type
    ]


def follow_inputs(ctx: Interpreter, eqn: jcore.JaxprEqn, invals: list) -> list:
    """Runs in the widest floating dtype of the inputs."""
    dtypes = _free_dtypes(ctx, eqn, invals)
    if not dtypes:
        return bind(eqn, invals)
    target = widest(dtypes)
    return bind(eqn, [cast(x, target) for x in invals])


def in_float32(ctx: Interpreter, eqn: jcore.JaxprEqn, invals: list) -> list:
    """Runs in float32, or in a wider input dtype."""
    target = widest([np.dtype(np.float32), *_free_dtypes(ctx, eqn, invals)])
    return bind(eqn, [cast(x, target) for x in invals])


def in_traced_dtype(ctx: Interpreter, eqn: jcore.JaxprEqn, invals: list) -> list:
    """Runs on the inputs cast back to the dtypes they were traced with."""
    return bind(
        eqn, [cast(x, a.aval.dtype) for a, x in zip(eqn.invars, invals, strict=True)]
    )


def convert(ctx: Interpreter, eqn: jcore.JaxprEqn, invals: list) -> list:
    """An explicit conversion is kept, except one from a floating dtype to the
    same dtype (a change of weak type only), which keeps the input's dtype."""
    (x,), new = invals, np.dtype(eqn.params["new_dtype"])
    if is_floating(x) and np.dtype(eqn.invars[0].aval.dtype) == new:
        return [x]
    return bind(eqn, invals)


def cast_product(ctx: Interpreter, eqn: jcore.JaxprEqn, invals: list) -> list:
    """A product in the compute dtype with float32 accumulation, its result in
    the compute dtype; its backward pass has one compute-dtype product per
    operand that is differentiated."""
    if not all(is_floating(x) for x in invals):
        return bind(eqn, invals)
    low = ctx.compute_dtype
    accumulate = widest([np.dtype(np.float32), eqn.outvars[0].aval.dtype])
    params = dict(eqn.primitive.get_bind_params(eqn.params))
    params.pop("preferred_element_type")

    def plain(a: jax.Array, b: jax.Array) -> jax.Array:
        return eqn.primitive.bind(a, b, **params, preferred_element_type=low)

    @jax.custom_vjp
    def product(a: jax.Array, b: jax.Array) -> jax.Array:
        out = eqn.primitive.bind(a, b, **params, preferred_element_type=accumulate)
        return cast(out, low)

    def forward(a: Any, b: Any) -> tuple[jax.Array, tuple]:
        # symbolic zeros: an operand nothing differentiates (the data of a first
        # layer) gets no transposed product in the backward pass.
        operands = (a.value, b.value)
        return product(*operands), (operands, (a.perturbed, b.perturbed))

    def backward(residual: tuple, g: Any) -> tuple[Any, Any]:
        (a, b), (da_wanted, db_wanted) = residual
        if isinstance(g, SymbolicZero):
            return None, None
        # The transposed products return the compute dtype, which every XLA
        # backend accumulates in float32 (as cuBLAS and torch.autocast do). An
        # explicit float32 result rounded to the compute dtype here is folded by
        # XLA:CPU into a bfloat16 x bfloat16 = float32 product its runtime cannot
        # execute ("Unsupported element type for DotThunk::Execute").
        g = cast(g, low)
        da = jax.linear_transpose(lambda x: plain(x, b), a)(g)[0] if da_wanted else None
        db = jax.linear_transpose(lambda y: plain(a, y), b)(g)[0] if db_wanted else None
        return da, db

    product.defvjp(forward, backward, symbolic_zeros=True)
    return [product(*(cast(x, low) for x in invals))]


def list_rules(rules: AutocastRules) -> dict[str, Rule]:
    """The rule of every primitive named in ``rules``, and of conversions."""
    table: dict[str, Rule] = {"convert_element_type": convert}
    for names, rule in (
        (rules.low_precision_ops, cast_product),
        (rules.float32_ops, in_float32),
        (rules.traced_dtype_ops, in_traced_dtype),
    ):
        table.update(dict.fromkeys(names, rule))
    return table
