"""The interpreter of `mpjax.profile`: evaluates a jaxpr and records its values.

Sub-jaxprs of `jit`, `custom_jvp_call`, `custom_vjp_call`, `closed_call` and
`remat` are inlined and their equations recorded one by one. Loops are
rewritten: a `scan` (`fori_loop` with static bounds lowers to one) or
`while_loop` body runs through this interpreter inside a new loop of the same
kind whose carry also holds the summaries of the body's values accumulated over
the iterations (see `combine`), so the memory of a profile does not grow with
the iteration count. A `cond` runs its branches through the interpreter; only
the taken branch's records count elements. Nested control flow works the same
way at every level.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core as jcore
from jax.extend import source_info_util

from mpjax._profile_stats import combine, empty_summaries, is_float, summarise
from mpjax.formats import NumberFormat

__all__: list[str] = []

# Primitives whose sub-jaxpr is evaluated in line, and the parameter holding it.
_INLINE_PARAMS = {
    "jit": "jaxpr",
    "pjit": "jaxpr",
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
    "remat": "jaxpr",
    "checkpoint": "jaxpr",
}

Meta = tuple[str, str, str, str, tuple[int, ...], str]


class Collector:
    """The records of one (sub-)program, in evaluation order.

    A record is either a value (summarised by `summarise`) or a row of a block
    of summaries already computed, such as those a loop accumulated.
    """

    def __init__(
        self, bins: tuple[int, int], formats: Sequence[NumberFormat], sample: int
    ) -> None:
        self.bins, self.formats, self.sample = bins, formats, sample
        self.metas: list[Meta] = []
        self._values: list[jax.Array] = []
        self._blocks: list[dict[str, jax.Array]] = []
        self._order: list[tuple[bool, int]] = []  # (is a value, its position)

    def child(self) -> Collector:
        """An empty collector with the same settings."""
        return Collector(self.bins, self.formats, self.sample)

    def value(
        self, value: Any, primitive: str, stack: str, location: str, kind: str = ""
    ) -> None:
        """Records one value; `kind` defaults to "grad" inside a transpose."""
        value = jnp.asarray(value)
        kind = kind or ("grad" if "transpose(" in stack else "value")
        meta = (kind, primitive, stack, location, value.shape, str(value.dtype))
        self.metas.append(meta)
        self._order += [(True, len(self._values))]
        self._values.append(value)

    def block(self, metas: Sequence[Meta], stats: dict[str, jax.Array]) -> None:
        """Records summaries computed elsewhere, one row per meta."""
        self.metas.extend(metas)
        start = sum(len(b["zeros"]) for b in self._blocks)
        self._order += [(False, start + k) for k in range(len(metas))]
        self._blocks.append(stats)

    def summaries(self) -> dict[str, jax.Array]:
        """The summaries of every record, one row each, in evaluation order."""
        values = summarise(self._values, self.bins, self.formats, self.sample)
        if not self._blocks:
            return values
        pieces = [values, *self._blocks]
        stacked = {k: jnp.concatenate([p[k] for p in pieces]) for k in values}
        n = len(self._values)
        perm = np.array([i if own else n + i for own, i in self._order])
        return {k: v[perm] for k, v in stacked.items()}


def _inline_target(eqn: Any) -> tuple[Any, list[Any], str] | None:
    key = _INLINE_PARAMS.get(eqn.primitive.name)
    sub = eqn.params.get(key) if key else None
    if sub is None:
        return None
    if isinstance(sub, jcore.ClosedJaxpr):
        return sub.jaxpr, list(sub.consts), str(eqn.params.get("name", ""))
    if isinstance(sub, jcore.Jaxpr) and not sub.constvars:
        return sub, [], ""
    return None


def join(*parts: str) -> str:
    """Joins the non-empty parts of a name stack with "/"."""
    return "/".join(p for p in parts if p)


def evaluate(jaxpr, consts, args, stack, location, rec: Collector) -> list[Any]:  # noqa: ANN001
    """Evaluates `jaxpr` on `args`, recording its floating-point values in `rec`."""
    env: dict[Any, Any] = {}

    def read(atom: Any) -> Any:
        return atom.val if isinstance(atom, jcore.Literal) else env[atom]

    env.update(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))
    for eqn in jaxpr.eqns:
        invals = [read(a) for a in eqn.invars]
        here = join(stack, str(eqn.source_info.name_stack))
        summary = source_info_util.summarize(eqn.source_info)
        loc = summary if summary and summary != "unknown" else location
        target = _inline_target(eqn)
        rule = _CONTROL_FLOW.get(eqn.primitive.name)
        if target is not None:
            sub, sub_consts, name = target
            outs = evaluate(sub, sub_consts, invals, join(here, name), loc, rec)
        else:
            if rule is not None:
                outs = rule(eqn, invals, here, loc, rec)
            else:
                params = eqn.primitive.get_bind_params(eqn.params)
                with eqn.ctx.manager:
                    outs = eqn.primitive.bind(*invals, **params)
                outs = outs if eqn.primitive.multiple_results else [outs]
            for var, out in zip(eqn.outvars, outs, strict=True):
                if is_float(var.aval):
                    rec.value(out, eqn.primitive.name, here, loc)
        env.update(zip(eqn.outvars, outs, strict=True))
    return [read(v) for v in jaxpr.outvars]


def _traced_body(
    rec: Collector, body: Any, where: str, location: str
) -> tuple[Callable[[list[Any]], tuple[list[Any], dict]], list[list[Meta]]]:
    """`run(args) -> (outs, summaries)` of a closed jaxpr, and its latest metas."""
    latest: list[list[Meta]] = [[]]

    def run(args: list[Any]) -> tuple[list[Any], dict[str, jax.Array]]:
        inner = rec.child()
        outs = evaluate(body.jaxpr, body.consts, args, where, location, inner)
        latest[0] = list(inner.metas)
        return outs, inner.summaries()

    return run, latest


def _start(rec: Collector, run: Callable, args: list[Any]) -> tuple[dict, jax.Array]:
    """The empty running summaries of a loop body, sized by tracing it once."""
    specs = [jax.ShapeDtypeStruct(jnp.shape(a), jnp.result_type(a)) for a in args]
    rows = jax.eval_shape(lambda a: run(a)[1], specs)["zeros"].shape[0]
    total = empty_summaries(rec.bins, len(rec.formats), rows)
    return total, jnp.zeros((rows, len(rec.formats)), jnp.int32)


def _scan(eqn: Any, invals: list[Any], stack: str, loc: str, rec: Collector) -> list:
    """`scan` with its body recorded, summaries accumulated in the carry."""
    p = eqn.params
    nc, nk = p["num_consts"], p["num_carry"]
    consts, init, xs = invals[:nc], invals[nc : nc + nk], invals[nc + nk :]
    run, latest = _traced_body(rec, p["jaxpr"], join(stack, "scan/body"), loc)

    def step(state: Any, x: list[Any]) -> Any:
        carry, total, taken = state
        outs, stats = run([*consts, *carry, *x])
        total, taken = combine(total, taken, stats)
        return (outs[:nk], total, taken), outs[nk:]

    x0 = [jax.ShapeDtypeStruct(jnp.shape(x)[1:], jnp.result_type(x)) for x in xs]
    total, taken = _start(rec, run, [*consts, *init, *x0])
    (carry, total, _), ys = lax.scan(
        step,
        (list(init), total, taken),
        list(xs),
        length=p["length"],
        reverse=p["reverse"],
        unroll=p["unroll"],
    )
    rec.block(latest[0], total)
    return [*carry, *ys]


def _while(eqn: Any, invals: list[Any], stack: str, loc: str, rec: Collector) -> list:
    """`while_loop` with its body recorded (not its condition)."""
    p = eqn.params
    cn, bn = p["cond_nconsts"], p["body_nconsts"]
    cconsts, bconsts, init = invals[:cn], invals[cn : cn + bn], invals[cn + bn :]
    cond = p["cond_jaxpr"]
    run, latest = _traced_body(rec, p["body_jaxpr"], join(stack, "while/body"), loc)

    def cond_fn(state: Any) -> jax.Array:
        args = [*cconsts, *state[0]]  # evaluated, its records dropped
        return evaluate(cond.jaxpr, cond.consts, args, "", loc, rec.child())[0]

    def body_fn(state: Any) -> Any:
        carry, total, taken = state
        outs, stats = run([*bconsts, *carry])
        return (outs, *combine(total, taken, stats))

    total, taken = _start(rec, run, [*bconsts, *init])
    carry, total, _ = lax.while_loop(cond_fn, body_fn, (list(init), total, taken))
    rec.block(latest[0], total)
    return list(carry)


def _cond(eqn: Any, invals: list[Any], stack: str, loc: str, rec: Collector) -> list:
    """`cond` / `switch`: every branch recorded; the untaken ones count nothing."""
    branches = eqn.params["branches"]
    index, ops = invals[0], invals[1:]
    runs = [
        _traced_body(rec, b, join(stack, f"cond/branch{i}"), loc)
        for i, b in enumerate(branches)
    ]
    empties = [_start(rec, run, list(ops))[0] for run, _ in runs]

    def branch(i: int) -> Callable:
        def taken(*args: Any) -> Any:
            outs, stats = runs[i][0](list(args))
            blocks = [stats if j == i else e for j, e in enumerate(empties)]
            return outs, {k: jnp.concatenate([b[k] for b in blocks]) for k in stats}

        return taken

    outs, stats = lax.switch(index, [branch(i) for i in range(len(runs))], *ops)
    rec.block([m for _, latest in runs for m in latest[0]], stats)
    return list(outs)


_CONTROL_FLOW = {"scan": _scan, "while": _while, "cond": _cond}
