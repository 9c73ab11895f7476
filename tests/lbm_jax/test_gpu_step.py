"""The fused GPU step's logic, run on the CPU in Pallas' interpret mode.

Every test builds one configuration twice (:func:`gpu_twin`): with the XLA step,
the reference, and with the fused GPU step. Results agree to within rounding of
the per-cell arithmetic (the fused step sums the same terms in the same order; on
a GPU the compiler may contract multiply-adds differently), with equal sums of
mass and momentum; in-place (esoteric-pull) and two-buffer fused steps agree bit
for bit.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lbm_jax
from experiments.gpu_lbm_check import within_rounding
from lbm_jax import CellType, get_lattice, get_storage
from lbm_jax.core._boundaries import BoundaryData
from lbm_jax.core._collision import parse_collision
from lbm_jax.sim._config import StepArrays
from lbm_jax.step import _gpu
from lbm_jax.step._xla import make_step_into

from ._gpu_pairs import gpu_twin


def _walls(shape):
    """A channel: resting wall at y = 0, moving lid at y = Y - 1, and a patch of
    equilibrium cells (an inlet) on the first x-plane."""
    ct = np.zeros(shape, np.int32)
    ct[:, 0] = CellType.SOLID
    ct[:, -1] = CellType.WALL
    ct[0, 2:4] = CellType.EQUILIBRIUM
    return ct


def _flow(d):
    return np.array([0.02, -0.01, 0.015][:d])


def _copy(state):
    return jax.tree.map(jnp.copy, state)


def _compare(ref, fused, u0, steps, force=None):
    """Run both ``steps`` steps from the same flow. The last step, taken by both
    from the reference's state, agrees to within rounding population by
    population; over the whole run the populations stay within the storage
    precision of each other and the sums of mass and momentum agree."""
    a = ref.advance(ref.init(u=u0), steps - 1, force)
    last_ref = ref.advance(_copy(a), 1, force)
    last_fused = fused.advance(_copy(a), 1, force)
    close, worst = within_rounding(ref, last_ref.f, last_fused.f, 1)
    assert close, f"one step differs beyond rounding (up to {worst} codes)"
    b = fused.advance(fused.init(u=u0), steps, force)
    eps = 10 * steps * float(ref.storage.format.epsilon)
    pa, pb = ref.populations(last_ref), fused.populations(b)
    assert float(jnp.linalg.norm(pa - pb)) <= eps * float(jnp.linalg.norm(pa))
    ra, rb = lbm_jax.density(ref, last_ref), lbm_jax.density(fused, b)
    ua = lbm_jax.velocity(ref, last_ref, force=force)
    ub = lbm_jax.velocity(fused, b, force=force)
    ma, mb = np.sum(np.asarray(ra, np.float64)), np.sum(np.asarray(rb, np.float64))
    assert abs(ma - mb) <= eps * abs(ma), (ma, mb)
    axes = tuple(range(1, ua.ndim))
    ja = np.sum(np.asarray(ra[None] * ua, np.float64), axis=axes)
    jb = np.sum(np.asarray(rb[None] * ub, np.float64), axis=axes)
    np.testing.assert_allclose(ja, jb, rtol=0, atol=eps * abs(ma))


# lattice x storage x boundaries x force x collision: every storage format
# appears, every lattice with walls and a force, both collision operators
CASES = [
    ("D2Q9", (12, 40), "fp16c", dict(force=[1e-5, 2e-5])),
    pytest.param(
        "D3Q19",
        (6, 8, 20),
        "fp16s",
        dict(collision="trt", field=True),
        marks=pytest.mark.slow,
    ),
    pytest.param(
        "D3Q27",
        (5, 6, 18),
        "bf16",
        dict(shift=False, walls=False),
        marks=pytest.mark.slow,
    ),
    pytest.param(
        "D3Q19", (4, 6, 20), "posit16", dict(walls=False), marks=pytest.mark.slow
    ),
    pytest.param(
        "D2Q9", (8, 24), "fp32", dict(collision="trt"), marks=pytest.mark.slow
    ),
    pytest.param(
        "D3Q19", (4, 6, 20), "fp16", dict(shift=False), marks=pytest.mark.slow
    ),
    pytest.param("D3Q19", (4, 6, 20), "posit16_es2", {}, marks=pytest.mark.slow),
    pytest.param("D3Q19", (4, 6, 20), "posit16s", {}, marks=pytest.mark.slow),
    pytest.param(
        "D3Q27", (4, 6, 18), "fp16c", dict(field=True), marks=pytest.mark.slow
    ),
]


def _config(shape, storage, extra):
    d = len(shape)
    extra = dict(extra)
    config = dict(tau=0.7, storage=storage)
    if extra.pop("walls", True):
        uw = np.zeros(d)
        uw[0] = 0.05
        config.update(cell_type=_walls(shape), wall_velocity=uw)
    if extra.pop("field", False):
        rng = np.random.default_rng(1)
        config["force"] = 1e-5 * rng.standard_normal((d, *shape))
    config.update(extra)
    return config


@pytest.mark.parametrize(("lattice", "shape", "storage", "extra"), CASES)
def test_gpu_step_matches_xla_step(monkeypatch, lattice, shape, storage, extra):
    config = _config(shape, storage, extra)
    ref, fused = gpu_twin(monkeypatch, lattice, shape, **config)
    _compare(ref, fused, _flow(len(shape)), 5)


@pytest.mark.slow
def test_gpu_step_float64(monkeypatch, x64):
    shape = (4, 6, 20)
    config = _config(shape, "fp64", {})
    ref, fused = gpu_twin(monkeypatch, "D3Q19", shape, **config)
    _compare(ref, fused, _flow(3), 3)


@pytest.mark.slow
def test_gpu_step_per_call_force(monkeypatch):
    """A force given per call (a vector, then a field) replaces the own force."""
    shape = (6, 30)
    ref, fused = gpu_twin(monkeypatch, "D2Q9", shape, tau=0.8, storage="fp16s")
    vector = jnp.asarray([2e-5, -1e-5], jnp.float32)
    field = jnp.asarray(1e-5 * np.random.default_rng(2).standard_normal((2, *shape)))
    for force in (vector, field):
        _compare(ref, fused, _flow(2), 2, force=force)


@pytest.mark.slow
@pytest.mark.parametrize("steps", [4, 7])
def test_gpu_inplace_equals_two_buffer(monkeypatch, steps):
    """Esoteric pull in one buffer gives the two-buffer fused step's bits, for
    even and odd step counts, with walls, a moving lid and equilibrium cells."""
    shape = (6, 8, 20)
    config = _config(shape, "fp16s", dict(force=[1e-5, 0.0, 0.0]))
    _, fused = gpu_twin(monkeypatch, "D3Q19", shape, **config)
    _, inplace = gpu_twin(monkeypatch, "D3Q19", shape, streaming="inplace", **config)
    u0 = _flow(3)
    b = fused.advance(fused.init(u=u0), steps)
    c = inplace.advance(inplace.init(u=u0), steps)
    np.testing.assert_array_equal(np.asarray(c.f), np.asarray(b.f))


@pytest.mark.slow
def test_gpu_step_with_x_ghost_planes():
    """A sub-domain of a grid split along x, stepped with the neighbours' ghost
    planes, gives the whole grid's step on its planes (the step a device runs
    inside ``shard_map``, where ghost planes travel by ``ppermute``)."""
    lat, storage = get_lattice("D3Q19"), get_storage("fp16s")
    model = parse_collision("trt", 0.7, 3 / 16)
    shape, half = (8, 6, 20), 4
    force = [np.float32(1e-5), np.float32(0.0), np.float32(-1e-5)]
    sim = lbm_jax.Simulation("D3Q19", shape, tau=0.7, storage="fp16s", backend="xla")
    f = sim.advance(sim.init(u=_flow(3)), 2).f
    aux = StepArrays(BoundaryData(None, None, None, None), None)
    whole = make_step_into(lat, storage, model, shape, shape[0], force)
    expected = whole(aux, f, jnp.zeros_like(f))
    local = (half, *shape[1:])
    step = _gpu.make_gpu_step_into(
        lat, storage, model, local, None, force, interpret=True
    )
    for lo in (0, half):
        sub = f[lo : lo + half]
        halos = (f[(lo - 1) % shape[0]][None], f[(lo + half) % shape[0]][None])
        got = step(aux, sub, jnp.zeros_like(sub), (halos, None, None))
        close, worst = within_rounding(sim, expected[lo : lo + half], got, 1)
        assert close, f"sub-domain at x = {lo} differs (up to {worst} codes)"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("collision", "storage"),
    [("bgk", "fp32"), ("trt", "fp16s")],
)
def test_gpu_step_with_the_smagorinsky_model(collision, storage):
    """The subgrid model's per-cell rates (which the free-surface impacts use)
    in the fused step: one step of a sheared flow under a force, as the XLA
    step takes it, to within rounding."""
    lat, pol = get_lattice("D2Q9"), get_storage(storage)
    model = dataclasses.replace(
        parse_collision(collision, 0.502, 3 / 16), smagorinsky=0.15
    )
    shape = (12, 40)
    sim = lbm_jax.Simulation("D2Q9", shape, tau=0.502, storage=storage, backend="xla")
    y = np.arange(shape[1]) / shape[1]
    u = np.zeros((2, *shape))
    u[0] = 0.08 * np.sin(2 * np.pi * y)[None]
    u[1] = 0.03 * np.cos(2 * np.pi * np.arange(shape[0]) / shape[0])[:, None]
    f = sim.advance(sim.init(u=u), 2).f
    force = [np.float32(1e-5), np.float32(-2e-5)]
    aux = StepArrays(BoundaryData(None, None, None, None), None)
    expected = make_step_into(lat, pol, model, shape, shape[0], force)(
        aux, f, jnp.zeros_like(f)
    )
    plain = make_step_into(
        lat, pol, dataclasses.replace(model, smagorinsky=0.0), shape, shape[0], force
    )(aux, f, jnp.zeros_like(f))
    step = _gpu.make_gpu_step_into(lat, pol, model, shape, None, force, interpret=True)
    got = step(aux, f, jnp.zeros_like(f))
    close, worst = within_rounding(sim, expected, got, 1)
    assert close, f"differs beyond rounding (up to {worst} codes)"
    # the model acts here: without it the step differs far beyond rounding
    assert not within_rounding(sim, expected, plain, 1)[0]


def test_gpu_step_coverage():
    lat = get_lattice("D3Q19")
    fp16s = get_storage("fp16s")
    bgk = parse_collision("bgk", 0.8, 3 / 16)
    assert _gpu.supported(lat, fp16s, bgk, (8, 8, 8), interpret=True)
    assert not _gpu.supported(lat, fp16s, bgk, (8, 8, 8), split_yz=True, interpret=True)
    smag = dataclasses.replace(bgk, smagorinsky=0.1)
    assert _gpu.supported(lat, fp16s, smag, (8, 8, 8), interpret=True)
    d1q3 = dataclasses.replace(lat, name="D1Q3")
    assert not _gpu.supported(d1q3, fp16s, bgk, (8, 8, 8), interpret=True)
    with pytest.raises(ValueError, match="does not cover"):
        _gpu.make_gpu_step_into(d1q3, fp16s, bgk, (8, 8, 8), interpret=True)


def test_gpu_kernel_refused_where_unavailable():
    if _gpu.available():
        pytest.skip("a GPU is present")
    with pytest.raises(ValueError, match="backend='gpu' is not available.*not a GPU"):
        lbm_jax.Simulation("D2Q9", (8, 8), tau=0.8, backend="gpu")
    assert lbm_jax.Simulation("D2Q9", (8, 8), tau=0.8).backend != "gpu"


def test_gpu_step_rejects_wrong_populations():
    lat = get_lattice("D2Q9")
    step = _gpu.make_gpu_step_into(
        lat,
        get_storage("fp32"),
        parse_collision("bgk", 0.8, 3 / 16),
        (4, 8),
        interpret=True,
    )
    f = jnp.zeros((4, 9, 9), jnp.float32)
    with pytest.raises(ValueError, match=r"expected \(4, 9, 8\)"):
        step(None, f, f)
