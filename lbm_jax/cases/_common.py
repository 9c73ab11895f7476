"""Case registry, argument validation and the shared parts of every case."""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from lbm_jax._checkpoint import Checkpoint
from lbm_jax._collision import Collision
from lbm_jax._lattice import list_lattices
from lbm_jax._storage import StoragePolicy, get_storage
from lbm_jax._units import check_mach, mach, viscosity
from lbm_jax._validation import check_int, check_real
from lbm_jax.ibm._membrane import LAWS

__all__ = [
    "CLI_OPTIONS",
    "CaseSetup",
    "CliOption",
    "case_names",
    "check_speed",
    "jsonable",
    "prepare",
]

# case name -> module (imported lazily, so the registry costs nothing)
_MODULES: dict[str, str] = {
    "poiseuille": "lbm_jax.cases.poiseuille",
    "taylor_green": "lbm_jax.cases.taylor_green",
    "cavity": "lbm_jax.cases.cavity",
    "cavity3d": "lbm_jax.cases.cavity",
    "cylinder": "lbm_jax.cases.cylinder",
    "cylinder_unconfined": "lbm_jax.cases.cylinder",
    "capsule": "lbm_jax.cases.capsule",
    "static_drop": "lbm_jax.cases.free_surface",
    "capillary_wave": "lbm_jax.cases.free_surface",
    "drop_impact": "lbm_jax.cases.free_surface",
    "raindrop": "lbm_jax.cases.free_surface",
}


@dataclasses.dataclass(frozen=True)
class CliOption:
    """A case option the command line offers as ``--name`` (``_`` becomes ``-``).

    Attributes:
        type: Parser type of the value.
        help: One line for ``--help``.
        choices: Accepted values, if the choice is closed.
        cases: The cases that take the option (for ``--help``).
    """

    type: type
    help: str
    choices: tuple[Any, ...] | None = None
    cases: tuple[str, ...] = ()


_IMPACTS = ("drop_impact", "raindrop")

#: Case options offered on the command line; each case validates its own (an
#: option a case does not take is refused by :func:`merge_options`).
CLI_OPTIONS: Mapping[str, CliOption] = {
    "lattice": CliOption(
        str, f"lattice ({', '.join(list_lattices())})", cases=("cavity",)
    ),
    "collision": CliOption(
        str, "collision operator", choices=tuple(c.value for c in Collision)
    ),
    "u_ref": CliOption(float, "characteristic velocity (lattice units)"),
    "radius": CliOption(
        float, "capsule or drop radius (cells)", cases=("capsule", "static_drop")
    ),
    "ca": CliOption(float, "capillary number mu gamma_dot r / G_s", cases=("capsule",)),
    "law": CliOption(str, "membrane law", choices=LAWS, cases=("capsule",)),
    "skalak_c": CliOption(
        float, "Skalak area-dilation parameter C", cases=("capsule",)
    ),
    "kernel": CliOption(
        int,
        "immersed-boundary kernel width (points)",
        choices=(2, 3, 4),
        cases=("capsule",),
    ),
    "nodes": CliOption(int, "membrane mesh nodes (icosphere)", cases=("capsule",)),
    "dims": CliOption(
        int, "spatial dimensions", choices=(2, 3), cases=("static_drop", *_IMPACTS)
    ),
    "sigma": CliOption(
        float,
        "surface tension (lattice units)",
        cases=("static_drop", "capillary_wave"),
    ),
    "depth": CliOption(
        float,
        "liquid depth (cells for the wave, drop diameters for impacts)",
        cases=("capillary_wave", *_IMPACTS),
    ),
    "amplitude": CliOption(float, "wave amplitude (cells)", cases=("capillary_wave",)),
    "we": CliOption(float, "Weber number rho U^2 D / sigma", cases=("drop_impact",)),
    "oh": CliOption(
        float, "Ohnesorge number mu / sqrt(rho sigma D)", cases=("drop_impact",)
    ),
    "bo": CliOption(float, "Bond number rho g D^2 / sigma", cases=("drop_impact",)),
    "width": CliOption(
        float, "box width (drop diameters)", cases=("drop_impact", "raindrop")
    ),
    "smagorinsky": CliOption(
        float, "Smagorinsky constant (0: no subgrid model)", cases=_IMPACTS
    ),
    "duration": CliOption(
        float,
        "run length (t U / D for drop_impact, milliseconds for raindrop)",
        cases=_IMPACTS,
    ),
}


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
        runner: ``runner(setup, driver) -> (metrics, fields, extras)``; ``driver``
            holds keyword arguments for :func:`lbm_jax.run`.
        figures: Figures written with ``out_dir``.
        write_files: ``write_files(out, summary, fields, extras) -> paths``: the
            case's own files, written with ``out_dir`` after the common ones.
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
    runner: Callable[[CaseSetup, dict[str, Any]], tuple[dict, dict, dict]]
    figures: tuple[str, ...] = ("velocity",)
    write_files: Callable[..., list[Path]] | None = None

    @property
    def nu(self) -> float:
        """Kinematic viscosity in lattice units."""
        return viscosity(self.tau)

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
            "mach": mach(self.u_ref),
            **{k: v for k, v in self.options.items() if k not in ("collision",)},
        }

    def run(
        self, *, progress: bool = False, checkpoint: Checkpoint | None = None
    ) -> tuple[dict, dict, dict]:
        """Run the case: ``(metrics, fields, extra arrays for fields.npz)``.

        ``progress`` and ``checkpoint`` go to :func:`lbm_jax.run`, which every
        case's runner calls once.
        """
        return self.runner(self, {"progress": progress, "checkpoint": checkpoint})

    def identity(self) -> dict[str, Any]:
        """What makes two runs of a case the same run: its JSON-ready summary and
        the maximum step count."""
        return jsonable({**self.summary(), "steps": self.steps})


def check_speed(u: float, *, what: str) -> None:
    """Reject a characteristic velocity that is not positive or not low-Mach."""
    if not u > 0:
        raise ValueError(f"{what} must be positive, got {u!r}.")
    check_mach(u, what=what)


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
            value = check_real(value, key)
        out[key] = value
    collision = out.get("collision")
    if collision is not None:
        names = tuple(c.value for c in Collision)
        if not isinstance(collision, str) or collision.lower() not in names:
            raise ValueError(
                f"Unknown collision {collision!r}; expected one of {names}."
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
    return check_int(steps, "steps", 1)


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
        re = check_real(re, "re")
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
