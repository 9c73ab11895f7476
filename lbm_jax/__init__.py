"""lbm_jax: a jit-compiled lattice Boltzmann solver with 16-bit population storage.

Populations are stored in a number format from :mod:`mpjax.formats` (optionally
DDF-shifted, after Lehmann et al., PRE 106, 015308, 2022) and decoded to float32 or
float64 for the arithmetic, once per fused streaming + collision step.

>>> import lbm_jax
>>> sim = lbm_jax.Simulation("D2Q9", (32, 16), tau=0.8, storage="fp16s")
>>> state = lbm_jax.run(sim, sim.init(), 50).state
>>> lbm_jax.density(sim, state).shape
(32, 16)
"""

import importlib

from lbm_jax import cases, free_surface, ibm
from lbm_jax.core._boundaries import CellType
from lbm_jax.core._collision import Collision, CollisionModel
from lbm_jax.core._lattice import Lattice, get_lattice, list_lattices
from lbm_jax.core._storage import (
    StoragePolicy,
    differentiable_storages,
    get_storage,
    list_storages,
)
from lbm_jax.core._units import CS2, MAX_MACH, MAX_SPEED, MIN_TAU
from lbm_jax.io._files import load_state, save_state, write_vti, write_vtp
from lbm_jax.io._outputs import FolderInUseError
from lbm_jax.runs._checkpoint import Checkpoint, ResumeError, code_version
from lbm_jax.runs._driver import (
    InstabilityError,
    RunResult,
    RunStats,
    Samples,
    run,
)
from lbm_jax.runs._loop import History
from lbm_jax.runs._stop import relative_change, steady
from lbm_jax.sim._decomp import to_host
from lbm_jax.sim._observables import (
    density,
    momentum_exchange_force,
    velocity,
    vorticity,
)
from lbm_jax.sim._simulation import LBMState, Simulation
from lbm_jax.step._native_build import NativeStepWarning
from lbm_jax.step._xla_inplace import Streaming

__all__ = [
    "CS2",
    "MAX_MACH",
    "MAX_SPEED",
    "MIN_TAU",
    "CellType",
    "Checkpoint",
    "Collision",
    "CollisionModel",
    "History",
    "FolderInUseError",
    "InstabilityError",
    "LBMState",
    "ResumeError",
    "Lattice",
    "NativeStepWarning",
    "RunResult",
    "RunStats",
    "Samples",
    "Simulation",
    "StoragePolicy",
    "Streaming",
    "bench",
    "cases",
    "free_surface",
    "ibm",
    "code_version",
    "density",
    "differentiable_storages",
    "get_lattice",
    "get_storage",
    "list_lattices",
    "list_storages",
    "load_state",
    "momentum_exchange_force",
    "relative_change",
    "run",
    "save_state",
    "steady",
    "to_host",
    "velocity",
    "vorticity",
    "write_vti",
    "write_vtp",
]


def __getattr__(name: str):
    # The benchmarks (``python -m lbm_jax bench``) are loaded when first used, not
    # with the package: ``lbm_jax.bench`` and ``from lbm_jax import bench`` work.
    if name == "bench":
        return importlib.import_module("lbm_jax.bench")
    raise AttributeError(f"module 'lbm_jax' has no attribute {name!r}")
