"""The step backends' one vocabulary and the one rule that chooses among them.

A simulation (:class:`lbm_jax.Simulation`) and a free surface
(:class:`lbm_jax.free_surface.FreeSurface`) each ask :func:`choose` which backend
runs their step. Each backend module answers only "why not this configuration"
(a reason, or ``None``) and "why not on this machine" (the library cannot be
built, the default device is not a GPU); the preference order and the error
messages live here.
"""

from __future__ import annotations

import enum
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero, linear_call

from lbm_jax.core._lattice import did_you_mean
from lbm_jax.core._remat import jvp_of_perturbed

__all__ = [
    "BACKENDS",
    "Adjoint",
    "Backend",
    "Candidate",
    "Choice",
    "choose",
    "parse_backend",
    "resolve_alias",
    "with_derivative_of",
    "without_derivative",
]


class Backend(enum.Enum):
    """Which implementation runs a step.

    ``AUTO`` picks the fastest backend that covers the configuration on this
    machine (the fused GPU step on a GPU, the native C++ step on a CPU, else the
    XLA step); ``XLA`` is the reference every other backend is tested against.
    """

    AUTO = "auto"
    XLA = "xla"
    NATIVE = "native"
    GPU = "gpu"


#: The names :func:`parse_backend` accepts, in the order a reader meets them.
BACKENDS = tuple(b.value for b in Backend)


def parse_backend(backend: str | Backend) -> Backend:
    """``backend`` as a :class:`Backend` (a name in any case, or a member).

    Raises:
        ValueError: An unknown name (with the closest known name, if any).
        TypeError: Neither a string nor a :class:`Backend`.

    >>> parse_backend(" XLA ")
    <Backend.XLA: 'xla'>
    """
    if isinstance(backend, Backend):
        return backend
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str, one of {BACKENDS}, got {backend!r}.")
    key = backend.strip().lower()
    if key not in BACKENDS:
        raise ValueError(
            f"backend must be one of {BACKENDS}, got {backend!r}"
            f"{did_you_mean(key, BACKENDS)}."
        )
    return Backend(key)


def resolve_alias(backend: str | Backend, kernel: str | Backend | None) -> Backend:
    """The backend asked for, from ``backend=`` or its deprecated alias
    ``kernel=`` (a :class:`DeprecationWarning`; both given is an error).

    Raises:
        TypeError: Both ``backend`` (other than ``"auto"``) and ``kernel``.
    """
    if kernel is None:
        return parse_backend(backend)
    if parse_backend(backend) is not Backend.AUTO:
        raise TypeError(
            f"give the step's backend once: backend={backend!r} and the deprecated "
            f"kernel={kernel!r} were both given; use backend= only."
        )
    warnings.warn(
        "kernel= is deprecated and will be removed in the next release; use "
        "backend= (same values: 'auto', 'xla', 'native', 'gpu').",
        DeprecationWarning,
        stacklevel=3,
    )
    return parse_backend(kernel)


class Candidate(NamedTuple):
    """One fast backend's answer for a configuration.

    Attributes:
        backend: ``Backend.GPU`` or ``Backend.NATIVE``.
        why_not: Why it does not cover the configuration, or ``None``.
        unavailable: Called only for a covered configuration (it may be costly,
            e.g. build a library): why it cannot run on this machine, or ``None``.
        on_fallback: Called with that reason when ``"auto"`` runs another
            backend because this one is unavailable (e.g. a warning), or ``None``.
        here: Whether this kind of backend runs on this machine's default device
            at all (the GPU step off a GPU does not): ``"auto"`` passes over such
            a candidate without a word.
    """

    backend: Backend
    why_not: str | None
    unavailable: Callable[[], str | None]
    on_fallback: Callable[[str], None] | None = None
    here: bool = True


class Choice(NamedTuple):
    """The backend that runs, and why no faster one does (``None``: it is the
    fastest that can run here)."""

    backend: Backend
    why_not_faster: str | None


def choose(asked: str | Backend, candidates: Sequence[Candidate], what: str) -> Choice:
    """The backend that runs ``what`` (e.g. ``"simulation"``).

    ``"auto"`` takes the first candidate (in the given order, fastest first) that
    covers the configuration and can run here, else the XLA step; ``"gpu"`` and
    ``"native"`` take theirs or raise; ``"xla"`` takes the XLA step.

    Raises:
        ValueError: A backend named explicitly that cannot run ``what`` (the
            message says why and what to use instead), or an unknown name.
        TypeError: A backend that is neither a string nor a :class:`Backend`.
    """
    backend = parse_backend(asked)
    if backend is Backend.XLA:
        return Choice(Backend.XLA, "backend='xla' was asked for")
    if backend is not Backend.AUTO:
        named = [c for c in candidates if c.backend is backend]
        why = (
            named[0].why_not or named[0].unavailable()
            if named
            else f"there is no {backend.value} step for a {what}"
        )
        if why:
            raise ValueError(
                f"backend={backend.value!r} is not available for this {what}: {why}; "
                "use backend='auto' to run the fastest step that covers it."
            )
        return Choice(backend, None)
    reasons = []
    for cand in (c for c in candidates if c.here):
        why = cand.why_not or cand.unavailable()
        if why is None:
            return Choice(cand.backend, None)
        if cand.why_not is None and cand.on_fallback is not None:
            cand.on_fallback(why)
        reasons.append(why)
    return Choice(Backend.XLA, "; ".join(reasons) or None)


def without_derivative(fun: Callable[..., Any], what: str) -> Callable[..., Any]:
    """``fun`` unchanged, except that differentiating it raises.

    A backend whose step has no derivative rule (a foreign call, a Pallas
    kernel) wraps it here: ``jax.grad`` or ``jax.jvp`` through it then fails
    while tracing, before any work, naming the backend that differentiates,
    instead of returning a zero or an unrelated error.

    >>> double = without_derivative(lambda x: 2 * x, "doubling")
    >>> float(double(1.5))
    3.0
    """

    @jax.custom_jvp
    def wrapped(*args: Any) -> Any:
        return fun(*args)

    @wrapped.defjvp
    def _refuse(primals: tuple, tangents: tuple) -> Any:
        raise TypeError(
            f"{what} has no derivative rule, so jax.grad and jax.jvp cannot pass "
            f'through it; build the simulation with backend="xla" (the reference '
            "step, differentiable) to differentiate it."
        )

    return wrapped


class Adjoint(NamedTuple):
    """A fast step's own reverse-mode derivative (see :func:`with_derivative_of`).

    Attributes:
        covers: ``covers(aux, f, g[, halos])``: whether ``vjp`` differentiates
            this call (decided while tracing, from shapes and static structure).
        vjp: ``vjp(aux, f, ct) -> f_bar``: the cotangent of the populations ``f``
            given the cotangent ``ct`` of the step's result (the step arrays
            ``aux`` held constant).
    """

    covers: Callable[..., bool]
    vjp: Callable[[Any, jax.Array, jax.Array], jax.Array]


def with_derivative_of(
    fun: Callable[..., Any],
    reference: Callable[..., Any],
    adjoint: Adjoint | None = None,
) -> Callable[..., Any]:
    """``fun``, differentiated as ``reference``, transposed by ``adjoint``.

    For a fast step (a foreign call, a Pallas kernel) that computes what the
    differentiable ``reference`` computes (bit for bit, or to within rounding).
    Without ``adjoint``: ``fun`` runs when nothing is differentiated; under
    ``jax.jvp``, ``jax.grad`` or ``jax.linearize`` the reference runs, primal
    and derivative alike, so the derivative belongs to the values it is taken at.

    With ``adjoint`` (``fun`` and ``reference`` then take a step's arguments
    ``(aux, f, g[, halos])``, ``g``'s content unused): where ``adjoint.covers``
    the call and only ``f`` carries a tangent, ``fun`` computes the primal, the
    tangent is the reference's (``jax.jvp`` stays exact) and its transpose,
    which ``jax.grad`` and ``jax.vjp`` run, is ``adjoint.vjp``. A call whose step
    arrays (``aux``: force, walls) carry a tangent, or that the adjoint does not
    cover, is differentiated as without it. ``jax.vmap`` of the transposable
    derivative raises (``linear_call`` has no batching rule).

    >>> import jax
    >>> fast_sin = with_derivative_of(jax.numpy.sin, jax.numpy.sin)
    >>> float(jax.grad(fast_sin)(0.0))
    1.0
    """

    @jax.custom_jvp
    def wrapped(*args: Any) -> Any:
        return fun(*args)

    def _rule(primals: tuple, tangents: tuple) -> Any:
        if adjoint is not None and adjoint.covers(*primals):
            aux, f = primals[:2]
            if all(_is_zero(t) for t in jax.tree.leaves(tangents[0], is_leaf=_is_zero)):
                return fun(*primals), _transposable(aux, f, tangents[1])
        return jvp_of_perturbed(reference, primals, tangents)

    def _transposable(aux: Any, f: jax.Array, df: Any) -> jax.Array:
        if _is_zero(df):  # only g (whose content is unused) carries a tangent
            return jnp.zeros(f.shape, f.dtype)

        def jvp(res: tuple, t: jax.Array) -> jax.Array:
            aux, f = res
            return jax.jvp(lambda f: reference(aux, f, f), (f,), (t,))[1]

        def vjp(res: tuple, ct: jax.Array) -> jax.Array:
            aux, f = res
            return adjoint.vjp(aux, f, ct)

        return linear_call(jvp, vjp, (aux, f), df)

    wrapped.defjvp(_rule, symbolic_zeros=True)
    return wrapped


def _is_zero(t: Any) -> bool:
    return isinstance(t, SymbolicZero)
