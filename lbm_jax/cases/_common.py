"""Case registry, argument validation and the shared parts of every case."""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from lbm_jax._storage import StoragePolicy, get_storage
from lbm_jax.cases import _params

__all__ = ["CaseSetup", "case_names", "jsonable", "prepare"]

# case name -> module (imported lazily, so the registry costs nothing)
_MODULES: dict[str, str] = {
    "poiseuille": "lbm_jax.cases.poiseuille",
    "taylor_green": "lbm_jax.cases.taylor_green",
    "cavity": "lbm_jax.cases.cavity",
    "cavity3d": "lbm_jax.cases.cavity",
    "cylinder": "lbm_jax.cases.cylinder",
    "cylinder_unconfined": "lbm_jax.cases.cylinder",
}

_COLLISIONS = ("bgk", "trt")


def case_names() -> tuple[str, ...]:
    """Names accepted by :func:`prepare`."""
    return tuple(_MODULES)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CaseSetup:
    """Validated, derived parameters of one case run (no arrays, nothing compiled).

    Attributes:
        case: Case name.
        lattice: Lattice name.
        storage: Storage policy (with its ``shift`` flag).
        collision: ``"bgk"`` or ``"trt"``.
        magic: TRT magic parameter.
        n: Resolution (cells per characteristic length).
        re: Reynolds number.
        tau: Relaxation time.
        u_ref: Characteristic velocity in lattice units.
        steps: Maximum number of time steps.
        steps_given: Whether ``steps`` was fixed by the caller (otherwise steady
            cases may stop early once converged).
        options: Case-specific options, validated.
        runner: ``runner(setup, progress) -> (metrics, fields, extras)``.
        figures: Figures written with ``out_dir``.
    """

    case: str
    lattice: str
    storage: StoragePolicy
    collision: str
    magic: float
    n: int
    re: float
    tau: float
    u_ref: float
    steps: int
    steps_given: bool
    options: Mapping[str, Any]
    runner: Callable[..., tuple[dict, dict, dict]]
    figures: tuple[str, ...] = ("velocity",)

    @property
    def nu(self) -> float:
        """Kinematic viscosity in lattice units."""
        return _params.nu_from_tau(self.tau)

    def summary(self) -> dict[str, Any]:
        """The case-independent part of the summary."""
        return {
            "case": self.case,
            "lattice": self.lattice,
            "storage": self.storage.name,
            "shift": self.storage.shift,
            "collision": self.collision,
            "magic": self.magic if self.collision == "trt" else None,
            "n": self.n,
            "re": self.re,
            "tau": self.tau,
            "nu": self.nu,
            "u_ref": self.u_ref,
            "mach": _params.mach(self.u_ref),
            **{k: v for k, v in self.options.items() if k not in ("collision",)},
        }

    def run(self, *, progress: bool = False) -> tuple[dict, dict, dict]:
        """Run the case: ``(metrics, fields, extra arrays for fields.npz)``."""
        return self.runner(self, progress)


def _float_option(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.floating):
        raise TypeError(
            f"{name} must be a real number, got {value!r} of type "
            f"{type(value).__name__}."
        )
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}.")
    return value


def merge_options(
    case: str, given: Mapping[str, Any], defaults: Mapping[str, Any]
) -> dict[str, Any]:
    """Defaults updated with the given options; unknown names raise ``ValueError``.

    Numeric defaults make the given value be checked as a real number.
    """
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise ValueError(
            f"Unknown option(s) {unknown} for case {case!r}; its options are "
            f"{sorted(defaults)}."
        )
    out = dict(defaults)
    for key, value in given.items():
        default = defaults[key]
        if isinstance(default, float):
            value = _float_option(value, key)
        out[key] = value
    collision = out.get("collision")
    if collision is not None:
        if not isinstance(collision, str) or collision.lower() not in _COLLISIONS:
            raise ValueError(
                f"Unknown collision {collision!r}; expected one of {_COLLISIONS}."
            )
        out["collision"] = collision.lower()
    return out


def resolve_storage(storage: Any, shift: bool) -> StoragePolicy:
    """Storage policy by name, checked to be usable (x64 enabled for FP64)."""
    if not isinstance(shift, bool):
        raise TypeError(f"shift must be a bool, got {shift!r}.")
    policy = get_storage(storage, shift=shift)
    policy.check_enabled()
    return policy


def resolve_steps(steps: Any) -> int | None:
    """``None`` or a positive int number of steps."""
    if steps is None:
        return None
    return _params.check_positive_int(steps, name="steps", minimum=1)


def prepare(
    case: str,
    *,
    n: int | None,
    re: float | None,
    storage: Any,
    shift: bool,
    steps: int | None,
    **options: Any,
) -> CaseSetup:
    """Validate the arguments of a case and derive its parameters."""
    if not isinstance(case, str) or case not in _MODULES:
        raise ValueError(f"Unknown case {case!r}; expected one of {list(_MODULES)}.")
    if re is not None:
        re = _float_option(re, "re")
        if re <= 0:
            raise ValueError(f"re must be positive, got {re}.")
    policy = resolve_storage(storage, shift)
    module = importlib.import_module(_MODULES[case])
    return module.prepare(
        case, n=n, re=re, storage=policy, steps=resolve_steps(steps), options=options
    )


def jsonable(obj: Any) -> Any:
    """Convert NumPy scalars/arrays (and nested containers) to JSON types.

    Non-finite floats become ``None`` (JSON has no NaN).
    """
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, np.bool_ | bool):
        return bool(obj)
    if isinstance(obj, np.integer | int):
        return int(obj)
    if isinstance(obj, np.floating | float):
        value = float(obj)
        return value if math.isfinite(value) else None
    return obj


def drive(
    sim: Any,
    state: Any,
    steps: int,
    *,
    every: int,
    on_sample: Callable[[Any, int], bool | None] | None = None,
    progress: bool = False,
    desc: str = "",
) -> tuple[Any, dict[str, float]]:
    """Advance ``sim`` by up to ``steps`` steps in compiled chunks of ``every`` steps.

    After each chunk the density is checked (one host sync per chunk, never per
    step) and ``on_sample(state, t)`` is called; returning ``True`` stops early
    (e.g. once a steady state is reached). The first step runs on its own so that
    compilation is excluded from the measured throughput.

    Returns:
        ``(state, stats)`` with ``steps`` (run), ``seconds`` (timed, excluding
        compilation) and ``mlups``.

    Raises:
        InstabilityError: If the density becomes non-finite or non-positive; the
            message names the chunk's last step.
    """
    import time

    import jax
    from tqdm.auto import tqdm

    from lbm_jax._run import InstabilityError

    bar = tqdm(total=steps, desc=desc or "steps", disable=not progress, leave=False)
    t = 0
    last_good = 0
    seconds = 0.0
    timed_steps = 0
    try:
        if steps > 0:
            state = jax.block_until_ready(sim.advance(state, 1))
            t = 1
            bar.update(1)
        while t < steps:
            k = min(every - (t % every), steps - t)
            t0 = time.perf_counter()
            state = jax.block_until_ready(sim.advance(state, k))
            seconds += time.perf_counter() - t0
            timed_steps += k
            t += k
            bar.update(k)
            if not bool(sim.healthy(state)):
                raise InstabilityError(t, last_good, state)
            last_good = t
            if t % every == 0 and on_sample is not None and on_sample(state, t):
                break
    finally:
        bar.close()
    if on_sample is not None and t % every != 0 and t == steps:
        on_sample(state, t)
    mlups = timed_steps * sim.num_cells / seconds / 1e6 if seconds > 0 else None
    return state, {"steps": t, "seconds": seconds, "mlups": mlups}
