"""Automatic mixed precision for any JAX function: :func:`autocast`.

``autocast(fun, policy)`` traces ``fun`` to a jaxpr and evaluates it with one
rule per primitive, taken from a table: the operation lists of
:class:`mpjax.AutocastRules` (products in the compute dtype, a float32 list, a
traced-dtype list; everything else follows its inputs) and the higher-order
primitives below, whose bodies are evaluated under the same rules:

* ``jit``, ``closed_call``, ``call``: evaluated in line;
* ``remat2`` (``jax.checkpoint``): re-wrapped in ``jax.checkpoint`` with its
  own policy;
* ``scan``, ``while``, ``cond``: re-built with ``lax.scan``, ``lax.while_loop``
  and ``lax.switch``; a loop carry takes the widest dtype its initial value and
  its body give it (found by tracing the body until it stops widening), the
  outputs of the branches of a ``cond`` the widest dtype over the branches;
* ``custom_jvp_call``, ``custom_vjp_call``: the primal body is evaluated under
  the rules; derivatives come from the function's own rule, run on inputs cast
  back to the dtypes ``fun`` was traced with (a ``custom_vjp`` function's
  forward pass is recomputed there for its backward rule);
* ``shard_map``: re-wrapped in ``jax.shard_map`` with the same mesh and specs.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax import lax
from jax.extend import core as jcore

from mpjax._autocast_rules import (
    AutocastRules,
    Rule,
    bind,
    cast,
    follow_inputs,
    in_traced_dtype,
    is_floating,
    list_rules,
    widest,
)
from mpjax._policy import Policy, get_policy

__all__ = ["autocast"]


@dataclasses.dataclass(frozen=True)
class _Interpreter:
    """Evaluates jaxprs with the rule of each primitive from ``table``.

    ``constants`` holds the variables of the jaxpr being evaluated that are
    computed from literals only (each evaluation has its own).
    """

    policy: Policy
    table: Mapping[str, Rule]
    constants: set[Any] = dataclasses.field(default_factory=set)

    @property
    def compute_dtype(self) -> np.dtype:
        return self.policy.compute_dtype

    def adapts(self, atom: Any) -> bool:
        return isinstance(atom, jcore.Literal) or atom in self.constants

    def evaluate(
        self,
        closed: jcore.ClosedJaxpr,
        args: Sequence[Any],
        adapting: Sequence[bool] | None = None,
    ) -> list[Any]:
        """Evaluates ``closed`` on ``args``; its floating constants (arrays the
        traced function closed over) are cast to the compute dtype, like the
        arguments of the top-level function. ``adapting`` marks the arguments
        computed from literals only."""
        jaxpr = closed.jaxpr
        scope = _Interpreter(self.policy, self.table)
        if adapting is not None:
            marked = zip(jaxpr.invars, adapting, strict=True)
            scope.constants.update(v for v, a in marked if a)
        env: dict[Any, Any] = {}

        def read(atom: Any) -> Any:
            if not isinstance(atom, jcore.Literal):
                return env[atom]
            if jax.dtypes.issubdtype(atom.aval.dtype, jax.dtypes.extended):
                return atom.val
            return np.asarray(atom.val, atom.aval.dtype)

        consts = self.policy.cast_to_compute(closed.consts)
        env.update(zip(jaxpr.constvars, consts, strict=True))
        env.update(zip(jaxpr.invars, args, strict=True))
        for eqn in jaxpr.eqns:
            rule = self.table.get(eqn.primitive.name)
            if rule is None:
                has_body = any(True for _ in jcore.jaxprs_in_params(eqn.params))
                rule = in_traced_dtype if has_body else follow_inputs
            outs = rule(scope, eqn, [read(a) for a in eqn.invars])
            env.update(zip(eqn.outvars, outs, strict=True))
            if all(scope.adapts(a) for a in eqn.invars):
                scope.constants.update(eqn.outvars)
        return [read(v) for v in jaxpr.outvars]


def _closed(jaxpr: jcore.Jaxpr | jcore.ClosedJaxpr) -> jcore.ClosedJaxpr:
    return (
        jaxpr if isinstance(jaxpr, jcore.ClosedJaxpr) else jcore.ClosedJaxpr(jaxpr, ())
    )


def _as_traced(atoms: Sequence[Any], values: Sequence[Any]) -> list[Any]:
    """``values`` cast to the dtypes of ``atoms`` (variables of a jaxpr)."""
    return [cast(x, a.aval.dtype) for a, x in zip(atoms, values, strict=True)]


def _like(values: Sequence[Any], examples: Sequence[Any]) -> list[Any]:
    """``values`` cast to the dtypes of ``examples`` (floating ones only)."""
    return [cast(x, e.dtype) for x, e in zip(values, examples, strict=True)]


def _spec(x: Any, dtype: Any = None) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(x.shape, dtype or x.dtype)


def _widened(
    run: Callable[[list, list], list], carry: Sequence[Any], rest: Sequence[Any]
) -> list[np.dtype]:
    """Dtypes of a loop carry: those of ``carry``, widened until one iteration
    ``run(carry, rest) -> new carry`` returns the same dtypes."""
    dtypes = [x.dtype for x in carry]
    while True:
        specs = [_spec(x, d) for x, d in zip(carry, dtypes, strict=True)]
        outs = jax.eval_shape(run, specs, [_spec(x) for x in rest])
        new = [
            widest([d, o.dtype]) if is_floating(d) else d
            for d, o in zip(dtypes, outs, strict=True)
        ]
        if new == dtypes:
            return dtypes
        dtypes = new


def _inline(ctx: _Interpreter, eqn: jcore.JaxprEqn, invals: list) -> list:
    key = "jaxpr" if "jaxpr" in eqn.params else "call_jaxpr"
    adapting = [ctx.adapts(a) for a in eqn.invars]
    return ctx.evaluate(_closed(eqn.params[key]), invals, adapting)


def _remat(ctx: _Interpreter, eqn: jcore.JaxprEqn, invals: list) -> list:
    p = eqn.params
    body = _closed(p["jaxpr"])
    run = jax.checkpoint(
        lambda *args: ctx.evaluate(body, args),
        prevent_cse=p["prevent_cse"],
        policy=p["policy"],
    )
    return list(run(*invals))


def _primal(ctx: _Interpreter, eqn: jcore.JaxprEqn) -> Callable[..., list]:
    """The body of a custom-derivative call under the rules, named as before."""

    def primal(*args: Any) -> list:
        return ctx.evaluate(eqn.params["call_jaxpr"], args)

    info = eqn.params["call_jaxpr"].jaxpr.debug_info
    primal.__name__ = getattr(info, "func_name", None) or "primal"
    return primal


def _custom_jvp(ctx: _Interpreter, eqn: jcore.JaxprEqn, invals: list) -> list:
    fun = jax.custom_jvp(_primal(ctx, eqn))

    def jvp(primals: tuple, tangents: tuple) -> tuple[list, list]:
        outs = fun(*primals)
        _, out_tangents = jax.jvp(
            lambda *args: bind(eqn, args),
            _as_traced(eqn.invars, primals),
            _as_traced(eqn.invars, tangents),
        )
        return outs, _like(out_tangents, outs)

    fun.defjvp(jvp)
    return list(fun(*invals))


def _custom_vjp(ctx: _Interpreter, eqn: jcore.JaxprEqn, invals: list) -> list:
    fun = jax.custom_vjp(_primal(ctx, eqn))

    def forward(*args: Any) -> tuple[list, tuple]:
        return fun(*args), args

    def backward(args: tuple, cotangents: list) -> tuple:
        _, pull = jax.vjp(lambda *a: bind(eqn, a), *_as_traced(eqn.invars, args))
        return tuple(_like(pull(_as_traced(eqn.outvars, cotangents)), args))

    fun.defvjp(forward, backward)
    return list(fun(*invals))


def _scan(ctx: _Interpreter, eqn: jcore.JaxprEqn, invals: list) -> list:
    p = eqn.params
    nc, nk = p["num_consts"], p["num_carry"]
    consts, init, xs = invals[:nc], invals[nc : nc + nk], invals[nc + nk :]
    x0 = [jax.ShapeDtypeStruct(np.shape(x)[1:], x.dtype) for x in xs]

    def body(carry: list, x: list) -> list:
        return ctx.evaluate(p["jaxpr"], [*consts, *carry, *x])

    dtypes = _widened(lambda carry, x: body(carry, x)[:nk], init, x0)

    def step(carry: list, x: list) -> tuple[list, list]:
        outs = body(carry, x)
        return [cast(c, d) for c, d in zip(outs[:nk], dtypes, strict=True)], outs[nk:]

    carry, ys = lax.scan(
        step,
        [cast(c, d) for c, d in zip(init, dtypes, strict=True)],
        list(xs),
        length=p["length"],
        reverse=p["reverse"],
        unroll=p["unroll"],
    )
    return [*carry, *ys]


def _while(ctx: _Interpreter, eqn: jcore.JaxprEqn, invals: list) -> list:
    p = eqn.params
    cn, bn = p["cond_nconsts"], p["body_nconsts"]
    cconsts, bconsts, init = invals[:cn], invals[cn : cn + bn], invals[cn + bn :]

    def body(carry: list, _: Any = ()) -> list:
        return ctx.evaluate(p["body_jaxpr"], [*bconsts, *carry])

    dtypes = _widened(body, init, [])
    carry = lax.while_loop(
        lambda carry: ctx.evaluate(p["cond_jaxpr"], [*cconsts, *carry])[0],
        lambda carry: [cast(c, d) for c, d in zip(body(carry), dtypes, strict=True)],
        [cast(c, d) for c, d in zip(init, dtypes, strict=True)],
    )
    return list(carry)


def _cond(ctx: _Interpreter, eqn: jcore.JaxprEqn, invals: list) -> list:
    index, ops = invals[0], invals[1:]
    branches = eqn.params["branches"]
    shapes = [jax.eval_shape(lambda o, b=b: ctx.evaluate(b, o), ops) for b in branches]
    dtypes = [
        widest([s.dtype for s in outs]) if is_floating(outs[0].dtype) else outs[0].dtype
        for outs in zip(*shapes, strict=True)
    ]

    def branch(body: jcore.ClosedJaxpr) -> Callable[..., list]:
        return lambda *o: [
            cast(x, d) for x, d in zip(ctx.evaluate(body, o), dtypes, strict=True)
        ]

    return list(lax.switch(index, [branch(b) for b in branches], *ops))


def _shard_map(ctx: _Interpreter, eqn: jcore.JaxprEqn, invals: list) -> list:
    p = eqn.params
    body = _closed(p["jaxpr"])
    run = jax.shard_map(
        lambda *args: tuple(ctx.evaluate(body, args)),
        mesh=p["mesh"],
        in_specs=p["in_specs"],
        out_specs=p["out_specs"],
        axis_names=p["newly_manual_axes"],
        check_vma=p["check_vma"],
    )
    return list(run(*invals))


#: The rule of each higher-order primitive (names: ``HIGHER_ORDER``).
HIGHER_ORDER_RULES: Mapping[str, Rule] = {
    "jit": _inline,
    "closed_call": _inline,
    "call": _inline,
    "remat2": _remat,
    "custom_jvp_call": _custom_jvp,
    "custom_vjp_call": _custom_vjp,
    "scan": _scan,
    "while": _while,
    "cond": _cond,
    "shard_map": _shard_map,
}


def _is_array(x: Any) -> bool:
    return isinstance(x, jax.Array | np.ndarray | np.generic)


def autocast(
    fun: Callable[..., Any],
    policy: Policy | str | Any,
    *,
    rules: AutocastRules | None = None,
) -> Callable[..., Any]:
    """Runs any JAX function in mixed precision, one rule per operation.

    The returned function has ``fun``'s signature. Each call traces ``fun`` to a
    jaxpr and evaluates it with these rules (the lists are ``rules``, by
    default ``AutocastRules()``; ``print(AutocastRules())`` shows them):

    * floating array arguments, and floating arrays ``fun`` closes over, enter
      in the policy's compute dtype; floating outputs leave in its output dtype;
    * products (``low_precision_ops``: ``dot_general``, ``conv_general_dilated``)
      take their operands in the compute dtype, accumulate in float32
      (``preferred_element_type``) and return the compute dtype. Their backward
      pass does the same: the cotangent is cast to the compute dtype and the two
      transposed products accumulate in float32;
    * ``float32_ops`` (exponentials, logarithms, powers, reductions, cumulative
      sums, special functions, linear algebra) run in float32 and return
      float32, so softmax, normalisation and losses are float32;
    * ``traced_dtype_ops`` run in the dtypes ``fun`` was traced with;
    * every other primitive runs in the widest floating dtype of its inputs
      (constants, such as literals, ``jnp.zeros`` or an ``iota`` mask, take the
      others' dtype), so a float32 value stays float32 until a product takes
      it; explicit conversions (``x.astype(...)``) are kept.

    Bodies of ``jit``, ``scan``, ``while_loop``, ``cond``, ``jax.checkpoint``,
    ``custom_jvp``/``custom_vjp`` functions and ``shard_map`` are evaluated
    under the same rules. The result composes with ``jit``, ``grad``, ``vmap``
    and ``jax.checkpoint`` like any JAX function.

    Array leaves of the arguments (``jax.Array``, NumPy arrays and scalars) are
    traced; other leaves (Python numbers, functions, strings: an Equinox
    module's activation functions) are fixed at trace time and returned as
    they are when ``fun`` returns them. Outside ``jax.jit`` each call traces
    ``fun`` again and runs it operation by operation: jit the result.

    Args:
      fun: the function to run.
      policy: a :class:`mpjax.Policy` or anything :func:`mpjax.get_policy`
        accepts (``"mixed_bfloat16"``, ``"p=f32,c=f16,o=f32"``...). Its
        compute dtype is the products' dtype and that of the inputs, its output
        dtype that of the outputs; its parameter dtype is not used.
      rules: the operation lists; ``AutocastRules().move("tanh",
        to="float32")`` changes one.

    Returns:
      The function, running under the policy.

    Raises:
      TypeError: if ``fun`` is not callable or ``rules`` is not an
        :class:`mpjax.AutocastRules`.
      ValueError: if ``policy`` is not a policy.

    >>> import jax.numpy as jnp
    >>> def attention(q, k, v):
    ...     return jax.nn.softmax(q @ k.T) @ v
    >>> x = jnp.ones((4, 8))
    >>> f = autocast(attention, "mixed_bfloat16")
    >>> f(x, x, x).dtype
    dtype('float32')
    >>> "bf16[4,8]" in str(jax.make_jaxpr(f)(x, x, x))
    True
    """
    if not callable(fun):
        raise TypeError(
            f"autocast expects a callable, got {type(fun).__name__} {fun!r:.60}; "
            "pass the function to run, e.g. autocast(loss_fn, 'mixed_bfloat16')."
        )
    policy = get_policy(policy)
    rules = AutocastRules() if rules is None else rules
    if not isinstance(rules, AutocastRules):
        raise TypeError(
            f"rules must be an mpjax.AutocastRules, got {type(rules).__name__}; "
            "pass e.g. mpjax.AutocastRules().move('tanh', to='float32')."
        )
    ctx = _Interpreter(policy, {**list_rules(rules), **HIGHER_ORDER_RULES})

    @functools.wraps(fun)
    def run(*args: Any, **kwargs: Any) -> Any:
        leaves, tree = jax.tree.flatten((args, kwargs))
        traced = [i for i, x in enumerate(leaves) if _is_array(x)]
        out_parts: list[Any] = []

        def flat(*arrays: Any) -> list[Any]:
            full = list(leaves)
            for i, x in zip(traced, arrays, strict=True):
                full[i] = x
            a, k = jax.tree.unflatten(tree, full)
            out_leaves, out_tree = jax.tree.flatten(fun(*a, **k))
            out_parts[:] = [out_tree, out_leaves]
            return [x for x in out_leaves if _is_array(x)]

        arrays = [leaves[i] for i in traced]
        closed = jax.make_jaxpr(flat)(*arrays)
        outs = iter(ctx.evaluate(closed, policy.cast_to_compute(arrays)))
        out_tree, out_leaves = out_parts
        full = [next(outs) if _is_array(x) else x for x in out_leaves]
        return policy.cast_to_output(jax.tree.unflatten(out_tree, full))

    return run
