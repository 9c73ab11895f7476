"""In-place streaming: bit-identical to the two-buffer path, one population buffer."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lbm_jax
from lbm_jax import CellType, Simulation

STEPS = (0, 1, 2, 3, 7)


def _cell_type(shape):
    """Solid and moving walls at the y ends, an obstacle, an equilibrium cell."""
    ct = np.zeros(shape, np.int8)
    ct[:, 0] = CellType.SOLID
    ct[:, -1] = CellType.WALL
    ct[(2, 2) + (1,) * (len(shape) - 2)] = CellType.SOLID
    ct[(0, 1) + (2,) * (len(shape) - 2)] = CellType.EQUILIBRIUM
    return ct


def _boundaries(shape):
    d = len(shape)
    x = np.arange(shape[0]).reshape(-1, *([1] * (d - 1)))
    uw = np.zeros((d, *shape))
    uw[0] = 0.05 + 0.01 * np.cos(2 * np.pi * x / shape[0])  # a wall velocity field
    return {
        "cell_type": _cell_type(shape),
        "wall_velocity": uw,
        "boundary_density": 1.01,
        "boundary_velocity": (0.02,) + (0.0,) * (d - 1),
    }


def _force_field(shape, scale=1e-4):
    d = len(shape)
    x = np.arange(shape[0]).reshape(-1, *([1] * (d - 1)))
    force = np.zeros((d, *shape), np.float32)
    force[0] = scale * np.cos(2 * np.pi * x / shape[0])
    force[-1] = 0.5 * scale
    return force


def _initial(sim, seed=0):
    rng = np.random.default_rng(seed)
    rho = 1 + 0.01 * rng.standard_normal(sim.shape)
    u = 0.02 * rng.standard_normal((sim.lattice.d, *sim.shape))
    return sim.init(rho, u)


def _assert_same_runs(lattice, shape, slab, steps=STEPS, forces=(None,), **kwargs):
    """Both streaming schemes, from the same state, over several step counts
    (and per-call forces; ``None`` uses the construction force)."""
    sims = [
        Simulation(lattice, shape, tau=0.7, slab=slab, streaming=s, **kwargs)
        for s in ("two-buffer", "inplace")
    ]
    start = _initial(sims[0])
    for force in forces:
        for n in steps:
            # advance consumes its input: give each run its own copy
            ref, got = (
                sim.advance(jax.tree.map(jnp.copy, start), n, force=force)
                for sim in sims
            )
            assert int(got.t) == n
            chex.assert_trees_all_equal(got, ref)


# Every lattice, storage kind (32-bit, 16-bit shifted, 16-bit other), collision and
# boundary kind at least once; odd sizes and small slabs so the last slab overlaps
# the previous one and the grid wraps around inside a slab.
CASES = [
    ("D2Q9", (6, 5), 4, {"storage": "fp32", "force": (1e-4, 0.0)}, True),
    ("D3Q19", (5, 4, 6), 2, {"storage": "fp16s", "collision": "trt"}, True),
    ("D3Q27", (5, 4, 3), 3, {"storage": "bf16"}, False),
]


@pytest.mark.parametrize(("lattice", "shape", "slab", "kwargs", "walls"), CASES)
def test_inplace_is_bit_identical_to_two_buffer(lattice, shape, slab, kwargs, walls):
    forces = (None,)
    if walls:
        kwargs = {**kwargs, **_boundaries(shape)}
    if lattice == "D3Q19":
        kwargs["force"] = _force_field(shape)
    if lattice == "D2Q9":  # per-call forces replace the constant one
        forces = (None, _force_field(shape, 2e-4), jnp.asarray([0.0, 1e-4]))
    _assert_same_runs(lattice, shape, slab, forces=forces, **kwargs)


def test_inplace_fp64(x64):
    _assert_same_runs("D2Q9", (5, 4), 2, steps=(1, 2, 3), storage="fp64")


def test_inplace_step_counts_compose():
    """Advancing in pieces equals one piece, and equals repeated ``step``."""
    sim = Simulation("D2Q9", (6, 5), tau=0.7, slab=4, streaming="inplace")
    whole = sim.advance(_initial(sim), 6)
    pieces = sim.advance(sim.advance(sim.advance(_initial(sim), 1), 2), 3)
    chex.assert_trees_all_equal(pieces, whole)
    stepped = _initial(sim)
    for _ in range(6):
        stepped = sim.step(stepped)
    chex.assert_trees_all_equal(stepped, whole)


@pytest.mark.slow
@pytest.mark.parametrize(
    "storage", [lbm_jax.get_storage(n).short_name for n in lbm_jax.list_storages()]
)
@pytest.mark.parametrize("lattice", ["D2Q9", "D3Q19", "D3Q27"])
@pytest.mark.parametrize("collision", ["bgk", "trt"])
def test_inplace_matrix_slow(lattice, storage, collision, request):
    if storage == "fp64":
        request.getfixturevalue("x64")
    shape = (9, 5) if lattice == "D2Q9" else (7, 5, 3)
    _assert_same_runs(
        lattice,
        shape,
        2,
        steps=(1, 2, 5),
        storage=storage,
        collision=collision,
        force=_force_field(shape),
        **_boundaries(shape),
    )


@pytest.mark.slow
@pytest.mark.parametrize("slab", [1, 2, 3, 4, 5, 6, 7])
def test_inplace_every_slab_size_slow(slab):
    shape = (7, 5, 4)
    _assert_same_runs(
        "D3Q19", shape, slab, steps=(1, 2, 3, 8), storage="fp16s", **_boundaries(shape)
    )


def _compiled_advance(streaming, shape=(96, 7), slab=1):
    sim = Simulation(
        "D2Q9", shape, tau=0.7, slab=slab, streaming=streaming, **_boundaries(shape)
    )
    state = sim.init()
    fn = jax.jit(lambda s, n: sim.advance(s, n), donate_argnums=0)
    return state, fn.lower(state, jnp.int32(3)).compile()


def test_inplace_holds_one_population_buffer():
    state, compiled = _compiled_advance("inplace")
    size = state.f.nbytes
    full = "[" + ",".join(str(n) for n in state.f.shape) + "]"
    copies = [
        line
        for line in compiled.as_text().splitlines()
        if " copy(" in line and full in line.split(" copy(")[0]
    ]
    assert not copies, copies
    memory = compiled.memory_analysis()
    assert memory.alias_size_in_bytes >= size  # the result reuses the input buffer
    assert memory.temp_size_in_bytes < size // 2, (memory.temp_size_in_bytes, size)
    # the check can fail: the two-buffer path holds a second full buffer
    _, two = _compiled_advance("two-buffer")
    assert two.memory_analysis().temp_size_in_bytes >= size


def test_streaming_validation():
    with pytest.raises(ValueError, match="Unknown streaming 'aa'"):
        Simulation("D2Q9", (8, 6), tau=0.7, streaming="aa")
    with pytest.raises(TypeError, match="streaming must be a str"):
        Simulation("D2Q9", (8, 6), tau=0.7, streaming=1)
    if len(jax.devices()) < 2:
        pytest.skip("needs two devices (tests/conftest.py sets two host devices)")
    with pytest.raises(ValueError, match="streaming='inplace' runs on one device"):
        Simulation("D2Q9", (8, 6), tau=0.7, streaming="inplace", devices=2)
    # "auto" is the two-buffer step on a split grid: same results
    split = Simulation("D2Q9", (8, 6), tau=0.7, devices=2)
    one = Simulation("D2Q9", (8, 6), tau=0.7, streaming="inplace")
    chex.assert_trees_all_equal(
        jax.device_get(split.advance(_initial(split), 3)),
        jax.device_get(one.advance(_initial(one), 3)),
    )
