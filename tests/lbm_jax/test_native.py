"""The native step (``jax.ffi``): bit identity with the XLA step, coverage, build."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from lbm_jax import get_lattice, get_storage
from lbm_jax.core._boundaries import BoundaryData, CellType, build_boundary
from lbm_jax.core._collision import equilibrium, parse_collision
from lbm_jax.sim._config import StepArrays
from lbm_jax.step import _native
from lbm_jax.step._layout import default_slab, to_layout
from lbm_jax.step._xla import make_step_into

from ._native_env import native_skip_reason

_WHY = native_skip_reason()
pytestmark = [
    pytest.mark.backend,
    pytest.mark.skipif(_WHY is not None, reason=str(_WHY)),
]


AUX = StepArrays(BoundaryData(None, None, None, None), None)
BGK = parse_collision("bgk", 0.8, 3 / 16)

# every lattice x storage the native step covers; odd row lengths exercise the
# scalar tails, the D2Q9 rows are longer than one tile of rows
CASES = [
    ("D2Q9", "fp32", (4, 1030)),
    pytest.param("D2Q9", "fp16s", (4, 135), marks=pytest.mark.slow),
    ("D3Q19", "fp32", (3, 12, 16)),
    ("D3Q19", "fp16s", (3, 12, 17)),
    pytest.param("D3Q27", "fp32", (3, 8, 17), marks=pytest.mark.slow),
    pytest.param("D3Q27", "fp16s", (3, 9, 16), marks=pytest.mark.slow),
    ("D3Q19", "bf16", (3, 12, 17)),
    ("D3Q19", "fp16c", (3, 12, 17)),
    pytest.param("D2Q9", "fp16c", (4, 135), marks=pytest.mark.slow),
    pytest.param("D3Q27", "fp16c", (3, 9, 16), marks=pytest.mark.slow),
    pytest.param("D2Q9", "bf16", (4, 135), marks=pytest.mark.slow),
    pytest.param("D3Q27", "bf16", (3, 9, 16), marks=pytest.mark.slow),
]


def _state(lattice, storage, shape, seed=0):
    """Stored populations of a flow: equilibria of random density and velocity
    plus non-equilibrium noise (values of realistic size)."""
    rng = np.random.default_rng(seed)
    rho = jnp.asarray(1 + 0.01 * rng.standard_normal(shape), jnp.float32)
    u = [
        jnp.asarray(0.03 * rng.standard_normal(shape), jnp.float32)
        for _ in range(lattice.d)
    ]
    f = equilibrium(lattice, rho, u, shift=True)
    noise = 1e-3 * rng.standard_normal((lattice.q, *shape))
    return storage.encode(to_layout(f + jnp.asarray(noise, jnp.float32)))


def _run(step_into, f, steps, aux=AUX):
    """``steps`` steps f -> g -> f ... of one compiled step."""
    step = jax.jit(lambda f, g: step_into(aux, f, g))
    g = jnp.zeros_like(f)
    for _ in range(steps):
        f, g = step(f, g), f
    return f


def _assert_bits_equal(a, b):
    a, b = np.asarray(a), np.asarray(b)
    uint = np.uint32 if a.itemsize == 4 else np.uint16
    differ = np.count_nonzero(a.view(uint) != b.view(uint))
    assert differ == 0, f"{differ} of {a.size} stored populations differ"


@pytest.mark.parametrize(("lattice", "storage", "shape"), CASES)
def test_native_step_bit_identical(lattice, storage, shape):
    lat, pol = get_lattice(lattice), get_storage(storage)
    assert _native.supported(lat, pol, BGK, shape), _native.unavailable_reason()
    f = _state(lat, pol, shape)
    xla = make_step_into(lat, pol, BGK, shape, default_slab(lat, shape, 4), None)
    native = _native.make_native_step_into(lat, pol, BGK, shape)
    _assert_bits_equal(_run(native, f, 3), _run(xla, f, 3))


@pytest.mark.parametrize(
    ("lattice", "storage", "shape"),
    [
        ("D2Q9", "fp32", (6, 140)),
        pytest.param("D3Q19", "fp16s", (6, 12, 17), marks=pytest.mark.slow),
    ],
)
def test_native_step_with_boundaries_bit_identical(lattice, storage, shape):
    """Bounce-back on solids, a moving wall and fixed (equilibrium) cells."""
    lat, pol = get_lattice(lattice), get_storage(storage)
    cell_type = np.full(shape, CellType.FLUID)
    cell_type[..., 0] = CellType.SOLID
    cell_type[..., -1] = CellType.WALL
    cell_type[(slice(2, 4),) + (slice(3, 6),) * (lat.d - 1)] = CellType.SOLID
    cell_type[(slice(0, 1),) + (slice(6, 8),) * (lat.d - 1)] = CellType.EQUILIBRIUM
    wall_velocity = np.zeros((lat.d, *shape))
    wall_velocity[0] = 0.05
    inflow = np.zeros((lat.d, *shape))
    inflow[1] = 0.02
    bnd = build_boundary(lat, pol, cell_type, wall_velocity, np.ones(shape), inflow)
    aux = StepArrays(BoundaryData(*(to_layout(a) for a in bnd)), None)
    f = _state(lat, pol, shape, seed=2)
    xla = make_step_into(lat, pol, BGK, shape, default_slab(lat, shape, 4), None)
    native = _native.make_native_step_into(lat, pol, BGK, shape)
    _assert_bits_equal(_run(native, f, 3, aux), _run(xla, f, 3, aux))


@pytest.mark.parametrize(
    "storage", [pytest.param("fp32", marks=pytest.mark.slow), "fp16s"]
)
def test_native_step_split_along_x_bit_identical(storage):
    lat, pol = get_lattice("D3Q19"), get_storage(storage)
    shape, ndev = (8, 10, 16), 2
    local = (shape[0] // ndev, *shape[1:])
    f = _state(lat, pol, shape, seed=1)
    native = _native.make_native_step_into(lat, pol, BGK, local)
    mesh = Mesh(np.array(jax.devices()[:ndev]), ("x",))
    perm_left = [(i, (i + 1) % ndev) for i in range(ndev)]
    perm_right = [(i, (i - 1) % ndev) for i in range(ndev)]

    def local_step(f, g):
        left = jax.lax.ppermute(f[-1:], "x", perm_left)
        right = jax.lax.ppermute(f[:1], "x", perm_right)
        return native(AUX, f, g, ((left, right), None, None))

    split = jax.shard_map(
        local_step,
        mesh=mesh,
        in_specs=(PartitionSpec("x"), PartitionSpec("x")),
        out_specs=PartitionSpec("x"),
    )
    fs = jax.device_put(f, NamedSharding(mesh, PartitionSpec("x")))
    xla = make_step_into(lat, pol, BGK, shape, default_slab(lat, shape, 4), None)
    _assert_bits_equal(_run(lambda _, f, g: split(f, g), fs, 2), _run(xla, f, 2))


@pytest.mark.parametrize(
    ("lattice", "storage", "collision", "shape", "options"),
    [
        ("D3Q19", "posit16s", "bgk", (4, 16, 16), {}),
        ("D3Q19", "posit16", "bgk", (4, 16, 16), {}),
        ("D3Q19", "fp32", "trt", (4, 16, 16), {}),
        ("D2Q9", "fp32", "bgk", (4, 135), {"force": True, "boundaries": True}),
        ("D3Q19", "fp32", "bgk", (4, 8, 8), {}),  # plane too small
        ("D2Q9", "fp32", "bgk", (4, 16, 16), {}),  # shape of the wrong rank
    ],
)
def test_native_unsupported_configurations(lattice, storage, collision, shape, options):
    lat, pol = get_lattice(lattice), get_storage(storage)
    model = parse_collision(collision, 0.8, 3 / 16)
    assert not _native.supported(lat, pol, model, shape, **options)
    if not options:
        with pytest.raises(ValueError, match="does not cover"):
            _native.make_native_step_into(lat, pol, model, shape)
    # the reason names what this configuration lacks, and only that
    why = _native.why_not_step(
        lat,
        pol,
        model,
        shape,
        split_across=False,
        force=options.get("force", False),
        boundaries=options.get("boundaries", False),
    )
    lacks = {
        "posit16s": "FP32/FP32, FP32/FP16S",
        "posit16": "FP32/FP32, FP32/FP16S",
        "trt": "BGK collision (got TRT)",
        "force": "rows of a multiple of 8 cells",
        "plane": "at least 128 cells per x-plane (got 64)",
        "rank": "a grid of the lattice's dimension",
    }
    key = storage if storage.startswith("posit") else collision
    if key == "bgk":
        key = "force" if options else "plane" if lattice == "D3Q19" else "rank"
    assert why.startswith("the native step needs ") and lacks[key] in why, why
    named = [m for m in ("storage", "BGK", "x-plane", "rows", "dimension") if m in why]
    assert len(named) == 1, why


def test_native_unshifted_storage_unsupported():
    lat, pol = get_lattice("D3Q19"), get_storage("fp32", shift=False)
    assert not _native.supported(lat, pol, BGK, (4, 16, 16))


def test_native_step_rejects_wrong_populations():
    lat, pol = get_lattice("D3Q19"), get_storage("fp32")
    native = _native.make_native_step_into(lat, pol, BGK, (4, 16, 16))
    f = jnp.zeros((4, 19, 16, 8), jnp.float32)
    with pytest.raises(ValueError, match="expected"):
        native(AUX, f, f)


def test_native_entry_checks_every_buffer():
    """The C++ entry refuses a wrong-sized output and wrongly typed boundary
    arrays with an error instead of reading or writing out of bounds."""
    lat, pol = get_lattice("D3Q19"), get_storage("fp32")
    shape = (4, 16, 16)
    native = _native.make_native_step_into(lat, pol, BGK, shape)
    f = _state(lat, pol, shape)
    with pytest.raises(jax.errors.JaxRuntimeError, match="g has the wrong size"):
        jax.block_until_ready(native(AUX, f, f[:1]))
    n = f.size
    bounce = jnp.zeros(n, jnp.float32)  # should be bool
    aux = StepArrays(BoundaryData(bounce, jnp.zeros(n, jnp.float32), None, None), None)
    with pytest.raises(jax.errors.JaxRuntimeError, match="must be bool"):
        jax.block_until_ready(native(aux, f, jnp.zeros_like(f)))


def test_simulation_repr_names_the_kernel():
    from lbm_jax import Simulation

    sim = Simulation("D3Q19", (4, 16, 16), tau=0.6, storage="fp16s")
    assert "backend='native'" in repr(sim)
    sim = Simulation("D3Q19", (4, 16, 16), tau=0.6, storage="fp16s", backend="xla")
    assert "backend='xla'" in repr(sim)


def test_native_step_constant_force_bit_identical():
    """Guo forcing with a constant force, next to a moving wall (2D, rows a
    multiple of 8) and on a periodic 3D grid."""
    lat, pol = get_lattice("D2Q9"), get_storage("fp32")
    shape = (6, 136)
    force = [np.float32(3.1e-3), np.float32(-2.3e-3)]
    assert _native.supported(lat, pol, BGK, shape, force=True, boundaries=True)
    cell_type = np.full(shape, CellType.FLUID)
    cell_type[:, 0] = CellType.SOLID
    cell_type[:, -1] = CellType.WALL
    wall_velocity = np.zeros((2, *shape))
    wall_velocity[0] = 0.05
    zero = np.zeros((2, *shape))
    bnd = build_boundary(lat, pol, cell_type, wall_velocity, np.ones(shape), zero)
    aux = StepArrays(
        BoundaryData(*(None if a is None else to_layout(a) for a in bnd)), None
    )
    f = _state(lat, pol, shape, seed=3)
    xla = make_step_into(lat, pol, BGK, shape, 4, force)
    native = _native.make_native_step_into(lat, pol, BGK, shape, None, force)
    _assert_bits_equal(_run(native, f, 3, aux), _run(xla, f, 3, aux))

    lat, shape = get_lattice("D3Q19"), (3, 12, 17)
    force = [np.float32(1.7e-3), np.float32(-2.9e-3), np.float32(2.1e-3)]
    f = _state(lat, pol, shape, seed=4)
    xla = make_step_into(lat, pol, BGK, shape, 3, force)
    native = _native.make_native_step_into(lat, pol, BGK, shape, None, force)
    _assert_bits_equal(_run(native, f, 3), _run(xla, f, 3))


def test_native_step_force_field_runs_xla_step():
    lat, pol = get_lattice("D2Q9"), get_storage("fp16s")
    shape = (4, 136)
    field = np.random.default_rng(5).standard_normal((2, *shape)) * 1e-4
    aux = StepArrays(AUX.boundary, jnp.asarray(field, jnp.float32))
    native = _native.make_native_step_into(lat, pol, BGK, shape)
    f = _state(lat, pol, shape, seed=5)
    text = jax.jit(lambda f, g: native(aux, f, g)).lower(f, f).as_text()
    assert "lbm_step" not in text
    xla = make_step_into(lat, pol, BGK, shape, 4, None)
    _assert_bits_equal(_run(native, f, 1, aux), _run(xla, f, 1, aux))


def test_native_library_cached_by_content():
    path = _native.library_path()
    assert path is not None and path.is_file()
    assert _native.unavailable_reason() is None
    int(path.parent.name, 16)  # the directory is named by the content hash
    assert len(path.parent.name) == 16


def test_native_without_compiler_reports_reason(monkeypatch):
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("PATH", "")
    assert "no C++ compiler" in _native.unavailable_reason()
    assert _native.library_path() is None


def test_simulation_backend_choice_and_bad_input():
    from lbm_jax import Simulation

    shape = (8, 16, 16)
    u = np.full((3, *shape), 0.03)
    states = {}
    for backend, expected in (("auto", "native"), ("native", "native"), ("xla", "xla")):
        sim = Simulation("D3Q19", shape, tau=0.6, storage="fp16s", backend=backend)
        assert sim.backend == expected
        states[backend] = np.asarray(sim.advance(sim.init(u=u), 5).f)
    _assert_bits_equal(states["auto"], states["xla"])
    _assert_bits_equal(states["native"], states["xla"])
    assert sim.backend_reason == "backend='xla' was asked for"
    assert Simulation("D3Q19", shape, tau=0.6, storage="fp16s").backend_reason is None
    # uncovered configurations fall back under "auto", saying why, and are
    # refused under "native"
    posit = Simulation("D3Q19", shape, tau=0.6, storage="posit16")
    assert posit.backend == "xla"
    assert posit.backend_reason.startswith("the native step needs FP32/FP32")
    with pytest.raises(ValueError, match="backend='native' is not available"):
        Simulation("D3Q19", shape, tau=0.6, storage="posit16", backend="native")
    with pytest.raises(ValueError, match="backend must be one of"):
        Simulation("D3Q19", shape, tau=0.6, backend="fast")
    with pytest.raises(TypeError, match="backend must be a str"):
        Simulation("D3Q19", shape, tau=0.6, backend=True)
