"""Case registry, argument validation and the shared parts of every case."""

from __future__ import annotations

import dataclasses
import importlib
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from lbm_jax.core._collision import Collision
from lbm_jax.core._lattice import get_lattice, list_lattices
from lbm_jax.core._storage import StoragePolicy, get_storage
from lbm_jax.core._units import check_mach, mach, viscosity
from lbm_jax.core._validation import check_int, check_real
from lbm_jax.ibm._membrane import LAWS
from lbm_jax.runs._checkpoint import Checkpoint

__all__ = [
    "CASE_INFO",
    "CLI_OPTIONS",
    "CaseInfo",
    "CaseSetup",
    "CliOption",
    "available_memory",
    "bytes_per_cell",
    "case_names",
    "check_grid_memory",
    "check_memory",
    "check_speed",
    "device_defaults",
    "jsonable",
    "on_gpu",
    "prepare",
    "step_fields",
]


@dataclasses.dataclass(frozen=True)
class CaseInfo:
    """What the registry and the command line know about a case.

    Attributes:
        module: The module holding the case's ``prepare``.
        n: What the resolution ``n`` counts, true of every run of the case.
        n_note: A remark on ``n`` for ``--help`` only (e.g. the default on a
            3-D lattice), not printed with a run's summary.
        results: The summary's key figures, shown first by ``python -m lbm_jax run``
            (with every ``*_error``, ``*_deviation`` and ``*_drift`` figure).
        re: Whether the case takes a Reynolds number (the free-surface cases
            derive their viscosity otherwise).
        steady: Whether, without a step count, the run stops once the flow is
            steady (the default ``steps`` is then a maximum).
    """

    module: str
    n: str
    results: tuple[str, ...]
    re: bool = True
    steady: bool = False
    n_note: str = ""


_FREE_SURFACE = "lbm_jax.cases.free_surface"
_CAVITY_RESULTS = ("ghia_max_error", "u_min_centre", "converged")
_CYLINDER_RESULTS = ("strouhal", "cd_max", "cd_mean", "cl_max", "periods")
_IMPACT_RESULTS = ("crown_exponent", "crown_height_max", "cavity_depth_max", "droplets")

#: The cases, in the order of ``--help``; their modules are imported lazily, so
#: the registry costs nothing.
CASE_INFO: Mapping[str, CaseInfo] = {
    "poiseuille": CaseInfo(
        "lbm_jax.cases.poiseuille",
        "channel width (cells)",
        ("l2_error", "slip", "converged"),
        steady=True,
    ),
    "taylor_green": CaseInfo(
        "lbm_jax.cases.taylor_green",
        "box side (cells)",
        ("l2_error", "decay_rate_error"),
    ),
    "cavity": CaseInfo(
        "lbm_jax.cases.cavity",
        "cavity side (cells)",
        _CAVITY_RESULTS,
        steady=True,
        n_note="32 by default on a 3-D lattice",
    ),
    "cavity3d": CaseInfo(
        "lbm_jax.cases.cavity", "cube side (cells)", _CAVITY_RESULTS, steady=True
    ),
    "cylinder": CaseInfo(
        "lbm_jax.cases.cylinder", "cylinder diameter D (cells)", _CYLINDER_RESULTS
    ),
    "cylinder_unconfined": CaseInfo(
        "lbm_jax.cases.cylinder", "cylinder diameter D (cells)", _CYLINDER_RESULTS
    ),
    "capsule": CaseInfo(
        "lbm_jax.cases.capsule",
        "channel height H (cells)",
        ("taylor_deformation", "deformation_theory", "inclination_deg"),
        steady=True,
        n_note="10 radius by default",
    ),
    "static_drop": CaseInfo(
        _FREE_SURFACE,
        "box side (cells)",
        ("laplace_pressure", "laplace_theory", "spurious_velocity"),
        re=False,
        n_note="64 by default in 3-D",
    ),
    "capillary_wave": CaseInfo(
        _FREE_SURFACE,
        "wavelength = box width (cells)",
        ("frequency", "damping"),
        re=False,
    ),
    "drop_impact": CaseInfo(
        _FREE_SURFACE, "drop diameter D (cells)", _IMPACT_RESULTS, re=False
    ),
    "raindrop": CaseInfo(
        _FREE_SURFACE,
        "drop diameter D (cells)",
        (*_IMPACT_RESULTS, "time_ms", "tau_raised"),
        re=False,
        n_note="the paper's is 84",
    ),
}


@dataclasses.dataclass(frozen=True)
class CliOption:
    """A case option the command line offers as ``--name`` (``_`` becomes ``-``).

    Attributes:
        type: Parser type of the value.
        help: One line for ``--help``.
        choices: Accepted values, if the choice is closed.
        cases: The cases that take the option; the command line refuses it for
            any other case.
    """

    type: type
    help: str
    choices: tuple[Any, ...] | None = None
    cases: tuple[str, ...] = tuple(CASE_INFO)


_IMPACTS = ("drop_impact", "raindrop")
_CYLINDERS = ("cylinder", "cylinder_unconfined")
_AT_REST = ("static_drop", "capillary_wave")

#: Case options offered on the command line; each case validates its own (an
#: option a case does not take is refused by ``merge_options``).
CLI_OPTIONS: Mapping[str, CliOption] = {
    "lattice": CliOption(
        str,
        f"lattice ({', '.join(list_lattices())}; cavity3d takes a 3-D one)",
        cases=("cavity", "cavity3d"),
    ),
    "collision": CliOption(
        str, "collision operator", choices=tuple(c.value for c in Collision)
    ),
    "u_ref": CliOption(
        float,
        "characteristic velocity (lattice units)",
        cases=tuple(c for c in CASE_INFO if c not in ("capsule", *_AT_REST)),
    ),
    "run_times": CliOption(
        float,
        "run length without --steps, in convective times D / u_ref",
        cases=_CYLINDERS,
    ),
    "radius": CliOption(
        float, "capsule or drop radius (cells)", cases=("capsule", "static_drop")
    ),
    "ca": CliOption(float, "capillary number mu gamma_dot r / G_s", cases=("capsule",)),
    "law": CliOption(str, "membrane law", choices=LAWS, cases=("capsule",)),
    "skalak_c": CliOption(
        float, "Skalak area-dilation parameter C", cases=("capsule",)
    ),
    "delta": CliOption(
        int,
        "immersed-boundary delta function width (points)",
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
        cases=_AT_REST,
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
        float,
        "box width (cells for capsule, else diameters of the drop or cylinder)",
        cases=("capsule", "cylinder_unconfined", *_IMPACTS),
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
    """Names accepted by ``prepare``."""
    return tuple(CASE_INFO)


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
        builder: ``builder(setup) -> (model, state)``: what the runner steps (see
            :meth:`build`).
        figures: Figures written with ``out_dir``.
        write_files: ``write_files(out, summary, fields, extras) -> paths``: the
            case's own files, written with ``out_dir`` after the common ones.
        shape: The grid the case allocates (wall layers included), checked
            against the available memory by ``prepare``; ``None`` if unknown.
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
    builder: Callable[[CaseSetup], tuple[Any, Any]]
    figures: tuple[str, ...] = ("velocity",)
    write_files: Callable[..., list[Path]] | None = None
    shape: tuple[int, ...] | None = None

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
        self,
        *,
        progress: bool = False,
        checkpoint: Checkpoint | None = None,
        estimate: Callable[[float, int], None] | None = None,
    ) -> tuple[dict, dict, dict]:
        """Run the case: ``(metrics, fields, extra arrays for fields.npz)``.

        ``progress``, ``checkpoint`` and ``estimate`` go to :func:`lbm_jax.run`,
        which every case's runner calls once.
        """
        driver = {"progress": progress, "checkpoint": checkpoint, "estimate": estimate}
        return self.runner(self, driver)

    def build(self) -> tuple[Any, Any]:
        """The case's model and initial state, as its runner steps them.

        Returns:
            ``(model, state)``: a :class:`~lbm_jax.Simulation` and its
            :class:`~lbm_jax.LBMState`, or a coupled model (an immersed boundary,
            a free surface) and its state. ``lbm_jax.run(sim, state, steps)``
            advances the first, ``lbm_jax.run(model.step, state, steps)`` the
            second. Compiles nothing.
        """
        return self.builder(self)

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


def resolve_storage(storage: Any, shift: bool | None) -> StoragePolicy:
    """Storage policy by name, checked to be usable (x64 enabled for FP64).

    ``shift`` ``None``: as :func:`lbm_jax.get_storage` (on for a name).
    """
    if shift is not None and not isinstance(shift, bool):
        raise TypeError(f"shift must be a bool or None, got {shift!r}.")
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
    shift: bool | None,
    steps: int | None,
    **options: Any,
) -> CaseSetup:
    """Validate the arguments of a case and derive its parameters."""
    if not isinstance(case, str) or case not in CASE_INFO:
        raise ValueError(f"Unknown case {case!r}; expected one of {list(CASE_INFO)}.")
    if re is not None:
        re = check_real(re, "re")
        if re <= 0:
            raise ValueError(f"re must be positive, got {re}.")
    policy = resolve_storage(storage, shift)
    module = importlib.import_module(CASE_INFO[case].module)
    sized = {k: v for k, v in device_defaults(case).items() if k not in options}
    sized_n = sized.pop("n", None)
    n = sized_n if n is None else n
    setup = module.prepare(
        case,
        n=n,
        re=re,
        storage=policy,
        steps=resolve_steps(steps),
        options={**sized, **options},
    )
    check_memory(setup)
    return setup


def on_gpu() -> bool:
    """Whether the default JAX backend is an accelerator (a case's defaults
    are then its GPU-sized ones, :func:`device_defaults`)."""
    import jax

    return jax.default_backend() != "cpu"


def device_defaults(case: str, gpu: bool | None = None) -> dict[str, Any]:
    """The case's defaults that depend on the device, as used on a GPU
    (``gpu=True``), on a CPU (``False``) or on the default backend (``None``).

    A case module declares them as ``DEVICE_DEFAULTS[case] = {option: (on a CPU,
    on a GPU)}``: paper-sized runs on a GPU, runs of minutes on a CPU.

    >>> device_defaults("capsule", gpu=False), device_defaults("capsule", gpu=True)
    ({'radius': 5.0}, {'radius': 12.0})
    """
    module = importlib.import_module(CASE_INFO[case].module)
    pairs = getattr(module, "DEVICE_DEFAULTS", {}).get(case, {})
    gpu = on_gpu() if gpu is None else gpu
    return {name: pair[1] if gpu else pair[0] for name, pair in pairs.items()}


def bytes_per_cell(lattice: str, storage: StoragePolicy) -> int:
    """Bytes a case run holds per grid cell at least: two population buffers of
    ``q`` stored values, the density and velocity on the device (float32) and
    their float64 copies on the host, and the int8 cell type.

    >>> bytes_per_cell("D2Q9", get_storage("fp32"))  # 72 + 12 + 24 + 1
    109
    """
    lat = get_lattice(lattice)
    return 2 * lat.q * storage.bytes_per_value + (4 + 8) * (1 + lat.d) + 1


def available_memory() -> tuple[int, str]:
    """``(bytes, where)``: the free memory of the default device (an
    accelerator's allocator limit) or, on the CPU, the host's available memory."""
    import jax

    device = jax.devices()[0]
    if device.platform != "cpu":
        stats = device.memory_stats() or {}
        if "bytes_limit" in stats:
            free = stats["bytes_limit"] - stats.get("bytes_in_use", 0)
            return int(free), f"{device.platform} device memory"
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "available host memory"
    except OSError:
        pass
    pages = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return int(pages), "free host memory"


def check_memory(setup: CaseSetup, *, floor: int = 2**30) -> None:
    """Refuse a case's grid that cannot fit the memory, before anything is
    allocated (:func:`check_grid_memory`; a case of unknown shape passes)."""
    if setup.shape is not None:
        check_grid_memory(
            setup.shape, setup.lattice, setup.storage, n=setup.n, floor=floor
        )


def check_grid_memory(
    shape: tuple[int, ...],
    lattice: str,
    storage: StoragePolicy,
    *,
    n: int,
    floor: int = 2**30,
) -> None:
    """Refuse a grid that cannot fit the memory, before anything is allocated.

    Grids needing less than ``floor`` bytes (:func:`bytes_per_cell` each) pass
    unchecked (no device query).

    Args:
        shape: The grid, wall layers included.
        lattice, storage: What each cell holds.
        n: The resolution the grid was made from (the advice scales it).
        floor: Bytes below which no check is made.

    Raises:
        ValueError: If the grid needs more memory than is available, with the
            bytes per cell and the largest ``n`` that fits.
    """
    cells = math.prod(shape)
    per_cell = bytes_per_cell(lattice, storage)
    need = cells * per_cell
    if need < floor:
        return
    free, where = available_memory()
    if need <= free:
        return
    d = len(shape)
    fits = max(1, math.floor(n * (free / need) ** (1.0 / d)))
    grid = " x ".join(map(str, shape))
    raise ValueError(
        f"n={n} gives a grid of {grid} = {cells:.3g} cells; at "
        f"{per_cell} bytes per cell ({lattice}, {storage.name} "
        f"storage) the run needs at least {need / 2**30:.3g} GiB, but only "
        f"{free / 2**30:.3g} GiB of {where} is free. Lower n (about {fits} "
        "fits) or use a 16-bit storage."
    )


def step_fields(model: Any, *, per_call_force: bool = False) -> dict[str, Any]:
    """A summary's ``step_backend`` (the step that ran: ``"native"``, ``"gpu"``
    or ``"xla"``) and ``step_reason`` (why no faster backend ran, or ``None``)
    for a :class:`~lbm_jax.Simulation` or a free surface; ``per_call_force``:
    the steps take a force per call (the backend of such a step, see
    :attr:`lbm_jax.Simulation.backends`)."""
    backend = model.backends["step_force"] if per_call_force else model.backend
    return {"step_backend": backend, "step_reason": model.backend_reason}


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
