"""Moments, equilibria and collision operators (conservation laws, limits)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lbm_jax
from lbm_jax import Collision, get_lattice, list_lattices
from lbm_jax.core._collision import collide, equilibrium, moments, parse_collision

LATTICES = list_lattices()


def _fields(lat, shape=(5, 4, 3), seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    grid = shape[: lat.d]
    rho = jnp.asarray(1 + 0.05 * rng.standard_normal(grid), dtype)
    u = [jnp.asarray(0.05 * rng.standard_normal(grid), dtype) for _ in range(lat.d)]
    return rho, u


@pytest.mark.parametrize("shift", [True, False])
@pytest.mark.parametrize("name", LATTICES)
def test_equilibrium_moments_reproduce_density_and_momentum(name, shift, x64):
    lat = get_lattice(name)
    rho, u = _fields(lat)
    feq = equilibrium(lat, rho, u, shift=shift)
    assert feq.shape == (lat.q, *rho.shape) and feq.dtype == jnp.float64
    r, j = moments(lat, feq, shift=shift)
    np.testing.assert_allclose(r, rho, rtol=1e-14)
    for ja, ua in zip(j, u, strict=True):
        np.testing.assert_allclose(ja, rho * ua, atol=1e-15)


@pytest.mark.parametrize("axis", [0, 1])
def test_moments_derivatives_are_the_moments_of_the_tangent(axis, x64):
    """The moments are linear (up to the shift's constant): forward mode gives
    the unshifted moments of the tangent, and reverse mode is its transpose."""
    lat = get_lattice("D3Q19")
    rng = np.random.default_rng(3)
    f, df = (
        jnp.moveaxis(jnp.asarray(rng.normal(size=(19, 4, 3))), 0, axis)
        for _ in range(2)
    )

    def fn(f):
        rho, j = moments(lat, f, shift=True, axis=axis)
        return jnp.stack([rho, *j])

    primal, tangent = jax.jvp(fn, (f,), (df,))
    np.testing.assert_allclose(primal, fn(f), rtol=1e-15)
    rho, j = moments(lat, df, shift=False, axis=axis)
    np.testing.assert_allclose(tangent, jnp.stack([rho, *j]), rtol=1e-14)
    ct = jnp.asarray(rng.normal(size=primal.shape))
    (back,) = jax.vjp(fn, f)[1](ct)
    np.testing.assert_allclose(jnp.vdot(back, df), jnp.vdot(ct, tangent), rtol=1e-13)


@pytest.mark.parametrize("name", LATTICES)
def test_shifted_equilibrium_is_offset_by_weights(name, x64):
    lat = get_lattice(name)
    rho, u = _fields(lat, seed=1)
    plain = equilibrium(lat, rho, u, shift=False)
    shifted = equilibrium(lat, rho, u, shift=True)
    w = lat.w.reshape((lat.q,) + (1,) * lat.d)
    np.testing.assert_allclose(shifted + w, plain, atol=1e-15)
    # the shift keeps stored values small: at rest they are exactly zero
    rest = equilibrium(
        lat, jnp.ones_like(rho), [jnp.zeros_like(rho)] * lat.d, shift=True
    )
    np.testing.assert_array_equal(rest, 0.0)


def test_equilibrium_second_moment_is_pressure_plus_momentum_flux(x64):
    lat = get_lattice("D2Q9")
    rho, u = _fields(lat, seed=2)
    feq = equilibrium(lat, rho, u, shift=False)
    c = lat.c.astype(np.float64)
    pi_xy = jnp.einsum("q,q...->...", c[:, 0] * c[:, 1], feq)
    pi_xx = jnp.einsum("q,q...->...", c[:, 0] * c[:, 0], feq)
    np.testing.assert_allclose(pi_xy, rho * u[0] * u[1], atol=1e-14)
    np.testing.assert_allclose(pi_xx, rho / 3 + rho * u[0] ** 2, atol=1e-14)


def _random_populations(lat, seed, shift, grid=(6, 5, 4)):
    rho, u = _fields(lat, seed=seed, shape=grid)
    feq = equilibrium(lat, rho, u, shift=shift)
    noise = np.random.default_rng(seed + 10).standard_normal(feq.shape)
    return feq + 1e-3 * jnp.asarray(noise * lat.w.reshape((-1,) + (1,) * lat.d))


@pytest.mark.parametrize("kind", [c.value for c in Collision])
@pytest.mark.parametrize("name", LATTICES)
@pytest.mark.parametrize("shift", [True, False])
def test_collision_conserves_mass_and_momentum(name, kind, shift, x64):
    lat = get_lattice(name)
    f = _random_populations(lat, 3, shift)
    model = parse_collision(kind, 0.73, 3 / 16)
    out, rho, u = collide(lat, model, f, shift=shift)
    r0, j0 = moments(lat, f, shift=shift)
    r1, j1 = moments(lat, out, shift=shift)
    np.testing.assert_allclose(r1, r0, rtol=1e-14)
    np.testing.assert_allclose(rho, r0, rtol=1e-14)
    for a in range(lat.d):
        np.testing.assert_allclose(j1[a], j0[a], atol=1e-15)
    assert not np.allclose(out, f)  # it did relax something


@pytest.mark.parametrize("kind", [c.value for c in Collision])
def test_guo_forcing_adds_the_force_to_the_momentum(kind, x64):
    lat = get_lattice("D3Q19")
    f = _random_populations(lat, 4, True)
    force = [np.float64(2e-4), np.float64(-1e-4), np.float64(5e-5)]
    model = parse_collision(kind, 0.9, 0.25)
    out, rho, u = collide(lat, model, f, shift=True, force=force)
    r0, j0 = moments(lat, f, shift=True)
    r1, j1 = moments(lat, out, shift=True)
    np.testing.assert_allclose(r1, r0, rtol=1e-14)
    for a in range(3):
        np.testing.assert_allclose(j1[a], j0[a] + force[a], atol=1e-15)
        # the collision velocity carries half the force
        np.testing.assert_allclose(u[a] * rho, j0[a] + force[a] / 2, atol=1e-15)


def test_collision_at_equilibrium_is_identity(x64):
    lat = get_lattice("D2Q9")
    rho, u = _fields(lat, seed=5)
    feq = equilibrium(lat, rho, u, shift=True)
    for kind in (c.value for c in Collision):
        out, _, _ = collide(lat, parse_collision(kind, 0.6, 3 / 16), feq, shift=True)
        np.testing.assert_allclose(out, feq, atol=1e-16)


def test_trt_with_equal_rates_is_bgk(x64):
    lat = get_lattice("D3Q27")
    f = _random_populations(lat, 6, True)
    tau = 0.8
    trt = parse_collision("trt", tau, (tau - 0.5) ** 2)  # tau- == tau+
    assert trt.omega_minus == pytest.approx(trt.omega_plus)
    bgk = parse_collision("bgk", tau, 3 / 16)
    np.testing.assert_allclose(
        collide(lat, trt, f, shift=True)[0],
        collide(lat, bgk, f, shift=True)[0],
        atol=1e-16,
    )


def test_bgk_relaxes_non_equilibrium_by_one_minus_omega(x64):
    # With tau = 1 BGK lands exactly on the equilibrium.
    lat = get_lattice("D2Q9")
    f = _random_populations(lat, 7, False)
    out, rho, u = collide(lat, parse_collision("bgk", 1.0, 0.25), f, shift=False)
    np.testing.assert_allclose(out, equilibrium(lat, rho, u, shift=False), atol=1e-16)


def test_collision_jits_and_keeps_float32():
    lat = get_lattice("D3Q19")
    f = jnp.zeros((lat.q, 4, 4, 4), jnp.float32)
    model = parse_collision("trt", 0.6, 3 / 16)
    out, rho, u = jax.jit(lambda f: collide(lat, model, f, shift=True))(f)
    assert out.dtype == rho.dtype == u[0].dtype == jnp.float32
    np.testing.assert_array_equal(rho, 1.0)


def test_parse_collision_validation():
    assert parse_collision("TRT", 0.6, 0.25).kind is Collision.TRT
    assert parse_collision(Collision.BGK, 1, 0.25).tau == 1.0
    model = parse_collision("bgk", 0.8, 0.25)
    assert model.viscosity == pytest.approx(0.1)
    with pytest.raises(ValueError, match=r"tau = 0\.5, but tau must be finite and at"):
        parse_collision("bgk", 0.5, 0.25)
    with pytest.raises(ValueError, match=r"at least 0\.5001"):
        parse_collision("bgk", 0.50009, 0.25)
    assert parse_collision("bgk", lbm_jax.MIN_TAU, 0.25).tau == lbm_jax.MIN_TAU
    with pytest.raises(ValueError, match="tau"):
        parse_collision("bgk", float("nan"), 0.25)
    with pytest.raises(TypeError, match="tau must be a real number"):
        parse_collision("bgk", "0.6", 0.25)
    with pytest.raises(ValueError, match=r"Unknown collision operator 'mrt'.*bgk"):
        parse_collision("mrt", 0.6, 0.25)
    with pytest.raises(ValueError, match="magic"):
        parse_collision("trt", 0.6, 0.0)
    with pytest.raises(TypeError, match="collision must be"):
        parse_collision(3, 0.6, 0.25)
