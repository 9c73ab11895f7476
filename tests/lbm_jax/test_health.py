"""Health checks inside the compiled loop, and input validation before compiling."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lbm_jax
from lbm_jax import CellType, InstabilityError, Simulation, run


def _jet(shape):
    """A strong sheared jet that blows up at tau close to 1/2."""
    x = np.arange(shape[0])[:, None] * np.ones(shape)
    y = np.ones(shape[0])[:, None] * np.arange(shape[1])[None, :]
    u = np.stack(
        [0.19 * np.tanh(8 * np.sin(2 * np.pi * y / shape[1])), 0.02 * np.sin(x)]
    )
    return u


def test_unstable_run_names_the_step():
    sim = Simulation("D2Q9", (32, 16), tau=0.5001)
    with pytest.raises(InstabilityError, match=r"unstable at step \d+") as info:
        run(sim, sim.init(u=_jet(sim.shape)), 20_000, check_every=25)
    assert "density is non-finite or non-positive" in str(info.value)
    err = info.value
    assert err.step % 25 == 0 and 0 < err.step < 20_000
    assert err.last_good_step == err.step - 25
    rho = lbm_jax.density(sim, err.state)
    assert int(err.state.t) == err.step
    assert not bool(jnp.all(jnp.isfinite(rho) & (rho > 0)))
    # the same run checked in larger blocks fails at a later or equal check step
    with pytest.raises(InstabilityError) as coarse:
        run(sim, sim.init(u=_jet(sim.shape)), 20_000, check_every=1000)
    assert coarse.value.step % 1000 == 0
    assert coarse.value.step >= err.step > coarse.value.last_good_step - 1000


def test_a_speed_beyond_the_lattice_limit_is_an_instability():
    # a periodic box driven by a body force: the density stays 1 while the speed
    # grows by 0.01 a step (the stored momentum is 0.01 (t + 1/2)); it passes
    # MAX_SPEED = 0.816 (Mach sqrt 2) between step 81 and step 82
    sim = Simulation("D2Q9", (8, 8), tau=0.8, force=(0.01, 0.0))
    with pytest.raises(InstabilityError, match="unstable at step 82") as info:
        run(sim, sim.init(), 2000, check_every=1)
    assert info.value.last_good_step == 81
    message = str(info.value)
    assert "a speed exceeds the lattice's stability limit |u| = 0.816" in message
    assert message.endswith("Increase tau or the resolution, or lower the velocity.")
    assert lbm_jax.MAX_SPEED == pytest.approx(np.sqrt(2 / 3))
    assert bool(sim.healthy(info.value.state)) is False
    rho = lbm_jax.density(sim, info.value.state)
    np.testing.assert_allclose(rho, 1.0, rtol=1e-5)  # the density alone looks fine


def test_healthy_flag_is_jittable():
    sim = Simulation("D2Q9", (8, 8), tau=0.7)
    state = sim.init()
    assert bool(jax.jit(sim.healthy)(state))
    bad = state._replace(f=state.f.at[0, 0, 0].set(jnp.nan))
    assert not bool(jax.jit(sim.healthy)(bad))


def _no_compile(caplog, fn):
    caplog.set_level(logging.WARNING)
    with jax.log_compiles(True):
        with pytest.raises((ValueError, TypeError)) as info:
            fn()
    assert not [r for r in caplog.records if "ompil" in r.getMessage()]
    return info


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tau": 0.5}, r"tau = 0\.5, but tau must be finite and at least 0\.5001"),
        ({"tau": 0.3}, "tau must be"),
        ({"tau": 0.7, "storage": "fp12"}, r"Unknown storage policy 'fp12'"),
        ({"tau": 0.7, "collision": "mrt"}, "Unknown collision"),
        (
            {"tau": 0.7, "cell_type": np.zeros((8, 9), np.int8)},
            r"shape \(8, 9\).*\(8, 8\)",
        ),
        ({"tau": 0.7, "cell_type": np.full((8, 8), 7)}, r"unknown codes \[7\]"),
        ({"tau": 0.7, "cell_type": np.ones((8, 8), np.int8)}, "no FLUID"),
        (
            {"tau": 0.7, "force": (1e-5, 0.0, 0.0)},
            r"force must be a vector of shape \(2,\)",
        ),
        (
            {
                "tau": 0.7,
                "cell_type": np.full((8, 8), int(CellType.WALL)) * (np.arange(8) == 7),
                "wall_velocity": (0.4, 0.0),
            },
            "wall_velocity reaches .* low-Mach limit",
        ),
        (
            {
                "tau": 0.7,
                "cell_type": np.full((8, 8), int(CellType.EQUILIBRIUM))
                * (np.arange(8) == 0),
                "boundary_velocity": np.zeros((2, 8, 8)) + 0.35,
            },
            "boundary_velocity reaches",
        ),
        (
            {"tau": 0.7, "boundary_density": -1.0},
            "boundary_density must be finite and positive",
        ),
        ({"tau": 0.7, "storage": "fp64"}, "64-bit types are disabled"),
    ],
)
def test_invalid_parameters_raise_before_compiling(kwargs, message, caplog):
    info = _no_compile(caplog, lambda: Simulation("D2Q9", (8, 8), **kwargs))
    assert info.match(message)


def test_invalid_shapes_and_types():
    with pytest.raises(ValueError, match=r"does not fit lattice D3Q19"):
        Simulation("D3Q19", (8, 8), tau=0.7)
    with pytest.raises(TypeError, match="shape must be a sequence of ints"):
        Simulation("D2Q9", (8.0, 8), tau=0.7)
    with pytest.raises(TypeError, match="integer CellType codes"):
        Simulation("D2Q9", (4, 4), tau=0.7, cell_type=np.zeros((4, 4)))


def test_initial_velocity_above_low_mach_limit(caplog):
    sim = Simulation("D2Q9", (8, 8), tau=0.7)
    info = _no_compile(caplog, lambda: sim.init(u=(0.3, 0.0)))
    assert info.match(r"initial velocity u reaches \|u\| = 0\.3 .*\(Mach 0\.35\)")
    with pytest.raises(ValueError, match="rho must be finite and positive"):
        sim.init(rho=0.0)
    with pytest.raises(ValueError, match=r"u must be a vector of shape \(2,\)"):
        sim.init(u=np.zeros((3, 8, 8)))
    assert lbm_jax.MAX_MACH == 0.35
    lbm_jax.Simulation("D2Q9", (8, 8), tau=0.7).init(u=(0.2, 0.0))  # Mach 0.346
