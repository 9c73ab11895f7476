"""Split-domain problems for the decomposition tests, and a subprocess worker.

Imported by ``test_decomposition.py`` for the problem (walls, moving walls, fixed
cells and a force field that all cross the sub-domain borders) and the trajectory
that is compared bit for bit. Run as a script it is either

* one process with 8 forced host devices, running every case of
  :data:`CASES` (or those of :data:`SLOW_CASES` on one lattice) split and on one
  device::

      python tests/lbm_jax/decomp_worker.py cases {quick,D2Q9,D3Q19,D3Q27} OUT.npz

* one process of a ``jax.distributed`` run over localhost CPU collectives (one
  device per process), running :data:`PROCESS_CASE` split over every process::

      python tests/lbm_jax/decomp_worker.py process ID NUM_PROCESSES PORT OUT.npz

and saves what it computed to an ``.npz`` file for the test.
"""

from __future__ import annotations

import sys
from typing import Any

import jax
import numpy as np

import lbm_jax
from lbm_jax import CellType, Simulation
from lbm_jax.sim._decomp import decompose, exchange

#: Cases of the default run: (lattice, storage, collision, split) on an 8-cell
#: grid per side: 3 split axes, with the corner directions of D3Q27.
CASES: tuple[tuple[str, str, str, tuple[int, ...]], ...] = (
    ("D3Q27", "fp32", "bgk", (2, 2, 2)),
)

#: The full matrix (``slow``): every lattice x storage on 2 and 3 split axes
#: (and 1 split axis for D3Q19).
SLOW_CASES: tuple[tuple[str, str, str, tuple[int, ...]], ...] = tuple(
    (lat, storage, collision, split)
    for lat, split, collision in (
        ("D2Q9", (2, 4), "trt"),
        ("D3Q19", (2, 2, 2), "bgk"),
        ("D3Q27", (2, 1, 4), "trt"),
        ("D3Q19", (1, 1, 8), "trt"),
    )
    for storage in ("fp32", "fp16s", "fp16c", "bf16", "posit16", "fp64")
)

#: The case of the multi-process test, split along x over the processes.
PROCESS_CASE = ("D2Q9", "fp16s", "trt")


def case_key(case: tuple[Any, ...]) -> str:
    """A readable key of one case."""
    return "-".join(
        str(x) if not isinstance(x, tuple) else "x".join(map(str, x)) for x in case
    )


def shape_of(lattice: str) -> tuple[int, ...]:
    return (8, 8) if lattice == "D2Q9" else (8, 8, 8)


def problem(lattice: str, storage: str, collision: str, devices: object) -> Simulation:
    """A simulation whose walls, moving wall, fixed cells and force cross borders.

    A solid block in the middle of the grid touches every sub-domain border (and,
    in 3-D, the corner where they meet), a moving wall lies on the last y layer
    (next to the periodic wrap), fixed equilibrium cells on the first x layer, and
    the body force is a field varying along every axis.
    """
    shape = shape_of(lattice)
    d = len(shape)
    ct = np.zeros(shape, np.int8)
    ct[tuple(slice(3, 5) for _ in shape)] = CellType.SOLID
    ct[:, -1] = CellType.WALL
    ct[0, 1:3] = CellType.EQUILIBRIUM
    wall = np.zeros(d)
    wall[0] = 0.05
    inflow = np.zeros(d)
    inflow[0] = 0.03
    grids = np.meshgrid(*[np.arange(n) for n in shape], indexing="ij")
    force = np.stack(
        [1e-4 * np.cos(2 * np.pi * (g + a) / 8) for a, g in enumerate(grids)]
    )
    return Simulation(
        lattice,
        shape,
        tau=0.7,
        storage=storage,
        collision=collision,
        cell_type=ct,
        wall_velocity=wall,
        boundary_velocity=inflow,
        boundary_density=1.01,
        force=force,
        devices=devices,
    )


def trajectory(sim: Simulation) -> dict[str, np.ndarray]:
    """Odd and even ``advance``, a jitted ``step`` with a per-call force, and every
    observable of the final state, fetched to the host."""
    rng = np.random.default_rng(7)
    shape, d = sim.shape, sim.lattice.d
    rho = 1 + 0.01 * rng.standard_normal(shape)
    u = 0.02 * rng.standard_normal((d, *shape))
    state = sim.advance(sim.init(rho, u), 3)
    state = sim.advance(state, 2)
    force = (2e-5 * rng.standard_normal((d, *shape))).astype(np.float32)
    # the simulation is an argument (a pytree), not a closed-over constant: a
    # mesh spanning processes cannot be baked into a program
    state = jax.jit(lambda m, s, f: m.step(s, force=f))(sim, state, force)
    rho_f, u_f = sim.fields(state)
    out = {
        "f": state.f,
        "t": state.t,
        "density": lbm_jax.density(sim, state),
        "velocity": lbm_jax.velocity(sim, state, force=force),
        "fields_rho": rho_f,
        "fields_u": u_f,
        "populations": sim.populations(state),
        "healthy": sim.healthy(state),
    }
    return {k: np.asarray(v) for k, v in lbm_jax.to_host(out).items()}


def halo_bytes(
    split: tuple[int, ...], shape: tuple[int, ...], q: int, dtype: Any
) -> tuple[int, int]:
    """Bytes of the ghost layers one block receives per step, as traced from
    :func:`exchange`, and as :meth:`Decomposition.halo_bytes` states them."""
    decomp = decompose(split, shape)
    sizes = []

    def block(f: jax.Array) -> jax.Array:
        for pair in exchange(f, decomp):
            sizes.extend(x.size * x.dtype.itemsize for x in pair or ())
        return f

    spec = decomp.grid_spec()
    layout = jax.ShapeDtypeStruct((shape[0], q, *shape[1:]), dtype)
    jax.eval_shape(decomp.shard(block, (spec,), spec), layout)
    return sum(sizes), decomp.halo_bytes(q, np.dtype(dtype).itemsize)


def run_case(case: tuple[str, str, str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """``{split/NAME, one/NAME}`` results of a case, split and on one device, and
    the traced and stated halo bytes (``halo_bytes``)."""
    lattice, storage, collision, split = case
    pol = lbm_jax.get_storage(storage)
    q = lbm_jax.get_lattice(lattice).q
    with jax.enable_x64(storage == "fp64"):
        out = {
            "halo_bytes": np.asarray(
                halo_bytes(split, shape_of(lattice), q, pol.storage_dtype)
            )
        }
        for name, devices in (("one", None), ("split", split)):
            sim = problem(lattice, storage, collision, devices)
            assert sim.decomposition == (split if devices else (1,) * len(split))
            out |= {f"{name}/{k}": v for k, v in trajectory(sim).items()}
    return out


def _cases(which: str, path: str) -> None:
    cases = CASES if which == "quick" else [c for c in SLOW_CASES if c[0] == which]
    results = {}
    for case in cases:
        results |= {f"{case_key(case)}/{k}": v for k, v in run_case(case).items()}
    np.savez(path, **results)


def _process(process_id: int, num_processes: int, port: int, path: str) -> None:
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=num_processes,
        process_id=process_id,
        initialization_timeout=60,
    )
    lattice, storage, collision = PROCESS_CASE
    n = jax.device_count()
    sim = problem(lattice, storage, collision, n)
    results = trajectory(sim)
    results["process_count"] = np.asarray(jax.process_count())
    results["local_devices"] = np.asarray(jax.local_device_count())
    np.savez(path, **results)
    jax.distributed.shutdown()


if __name__ == "__main__":
    # As in tests/conftest.py: no implicit dtype promotion.
    with jax.numpy_dtype_promotion("strict"):
        if sys.argv[1] == "cases":
            _cases(sys.argv[2], sys.argv[3])
        else:
            _process(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
