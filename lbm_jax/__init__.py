"""lbm_jax: a jit-compiled lattice Boltzmann solver with 16-bit population storage.

Populations are stored in a number format from :mod:`mpjax.formats` (optionally
DDF-shifted, after Lehmann et al., PRE 106, 015308, 2022) and decoded to float32 or
float64 for the arithmetic, once per fused streaming + collision step.

>>> import lbm_jax
>>> sim = lbm_jax.Simulation("D2Q9", (32, 16), tau=0.8, storage="fp16s")
>>> state = lbm_jax.run(sim, sim.init(), 50)
>>> lbm_jax.density(sim, state).shape
(32, 16)
"""

from lbm_jax import cases
from lbm_jax._bench import bench, measure_bandwidth
from lbm_jax._boundaries import CellType
from lbm_jax._collision import Collision, CollisionModel
from lbm_jax._lattice import CS2, Lattice, get_lattice, list_lattices
from lbm_jax._observables import (
    density,
    momentum_exchange_force,
    velocity,
    vorticity,
)
from lbm_jax._run import InstabilityError, run
from lbm_jax._simulation import LBMState, Simulation
from lbm_jax._storage import StoragePolicy, get_storage, list_storages
from lbm_jax._validation import MAX_MACH

__all__ = [
    "CS2",
    "MAX_MACH",
    "CellType",
    "Collision",
    "CollisionModel",
    "InstabilityError",
    "LBMState",
    "Lattice",
    "Simulation",
    "StoragePolicy",
    "bench",
    "cases",
    "density",
    "get_lattice",
    "get_storage",
    "list_lattices",
    "list_storages",
    "measure_bandwidth",
    "momentum_exchange_force",
    "run",
    "velocity",
    "vorticity",
]
