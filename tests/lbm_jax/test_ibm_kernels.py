"""Immersed-boundary delta kernels: moments, exactness, conservation, adjointness."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lbm_jax.ibm._kernels import (
    DeltaKernel,
    delta_1d,
    get_kernel,
    interpolate,
    kernel_support,
    spread,
)

KERNELS = list(DeltaKernel)
GRIDS = [(16, 13), (12, 10, 11)]  # unequal sizes catch mixed-up axes
N = 8  # points per test: one compilation serves several tests
_spread = jax.jit(spread, static_argnames=("shape", "kernel"))
_interpolate = jax.jit(interpolate, static_argnames="kernel")
_delta = jax.jit(delta_1d, static_argnums=0)


def _points(shape, n, margin, seed=0, dtype=np.float64):
    """Random points at least ``margin`` nodes away from the periodic seam."""
    rng = np.random.default_rng(seed)
    hi = np.asarray(shape, dtype=np.float64) - 1.0 - margin
    return (margin + rng.random((n, len(shape))) * (hi - margin)).astype(dtype)


def _nodes(shape):
    """Node coordinates, ``(d, *shape)``."""
    return np.stack(np.meshgrid(*[np.arange(n) for n in shape], indexing="ij"))


@pytest.mark.parametrize(
    ("name", "member"),
    [
        (2, DeltaKernel.LINEAR),
        ("linear", DeltaKernel.LINEAR),
        (3, DeltaKernel.ROMA),
        ("Roma", DeltaKernel.ROMA),
        (np.int64(4), DeltaKernel.PESKIN),
        ("peskin", DeltaKernel.PESKIN),
        (DeltaKernel.PESKIN, DeltaKernel.PESKIN),
    ],
)
def test_get_kernel_accepts_names_and_widths(name, member):
    assert get_kernel(name) is member
    assert kernel_support(name) == {"linear": 2, "roma": 3, "peskin": 4}[member.value]


@pytest.mark.parametrize("bad", [5, "cubic", True, 4.0, None])
def test_get_kernel_rejects_unknown_and_lists_valid(bad):
    with pytest.raises(ValueError, match="'linear' or 2, 'roma' or 3, 'peskin' or 4"):
        get_kernel(bad)


@pytest.mark.parametrize("kernel", KERNELS)
def test_delta_1d_moments_and_support(kernel, x64):
    s = kernel_support(kernel)
    r = np.linspace(0.0, 1.0, 101)[None, :] - np.arange(-4.0, 5.0)[:, None]
    phi = np.asarray(_delta(kernel, jnp.asarray(r)))  # all lattice offsets of r
    np.testing.assert_allclose(phi.sum(axis=0), 1.0, rtol=0, atol=1e-14)
    np.testing.assert_allclose((r * phi).sum(axis=0), 0.0, atol=1e-14)
    if kernel is not DeltaKernel.LINEAR:  # Peskin's and Roma's sum-of-squares rule
        want = {DeltaKernel.ROMA: 1 / 2, DeltaKernel.PESKIN: 3 / 8}[kernel]
        np.testing.assert_allclose((phi**2).sum(axis=0), want, atol=1e-14)
    assert np.all(phi >= 0)
    assert np.all(phi[np.abs(r) >= s / 2] == 0)
    assert phi[4, 0] == {2: 1.0, 3: 2 / 3, 4: 1 / 2}[s]  # phi(0)


@pytest.mark.parametrize("kernel", KERNELS)
def test_delta_1d_is_continuous_with_finite_gradient(kernel, x64):
    s = kernel_support(kernel)
    edges = np.arange(0.5, s / 2 + 0.5, 0.5)  # branch points and support end
    r = np.concatenate([np.linspace(-3.0, 3.0, 601), edges, edges - 1e-9, edges + 1e-9])
    phi, grad = jax.jit(jax.vmap(jax.value_and_grad(lambda x: delta_1d(kernel, x))))(
        jnp.asarray(r)
    )
    assert bool(jnp.all(jnp.isfinite(grad)))
    below, above = np.split(np.asarray(phi)[-2 * len(edges) :], 2)
    np.testing.assert_array_less(np.abs(below - above), 1e-8)
    assert delta_1d(kernel, jnp.float32(0.3)).dtype == jnp.float32


@pytest.mark.parametrize("shape", GRIDS)
@pytest.mark.parametrize("kernel", KERNELS)
def test_spread_unit_values_partition_unity_and_zero_first_moment(kernel, shape, x64):
    # Point n spreads a one into channel n: its weights sum to one and centre on it.
    n = N
    points = _points(shape, n, margin=3.0)
    points[0] = 4.0  # on a node
    points[1, 0] = 5.5  # half-way between nodes
    f = np.asarray(_spread(jnp.eye(n), jnp.asarray(points), shape, kernel))
    axes = tuple(range(1, len(shape) + 1))
    np.testing.assert_allclose(f.sum(axis=axes), 1.0, rtol=0, atol=1e-13)
    first = f.reshape(n, -1) @ _nodes(shape).reshape(len(shape), -1).T
    np.testing.assert_allclose(first, points, rtol=0, atol=1e-12)


@pytest.mark.parametrize("shape", GRIDS)
@pytest.mark.parametrize("kernel", KERNELS)
def test_interpolate_reproduces_linear_fields(kernel, shape, x64):
    d = len(shape)
    points = _points(shape, N, margin=3.0, seed=1)
    slopes = np.array([[0.3, -1.2, 0.7], [2.0, 0.5, -0.4], [0.0, 1.0, 0.1]])[:d, :d]
    field = 1.5 + np.einsum("ca,a...->c...", slopes, _nodes(shape))
    got = _interpolate(jnp.asarray(field), jnp.asarray(points), kernel)
    np.testing.assert_allclose(got, 1.5 + points @ slopes.T, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kernel", KERNELS)
def test_interpolate_linear_across_the_periodic_seams(kernel, x64):
    # Each coordinate wrapped into [-n/2, n/2) is linear around its seam at 0.
    shape = (12, 10, 11)
    half = np.asarray(shape)[:, None, None, None] / 2
    field = np.remainder(_nodes(shape) + half, 2 * half) - half
    rng = np.random.default_rng(8)
    near_seam = rng.uniform(-1.9, 1.9, (N, 3))
    points = near_seam + rng.integers(0, 2, (N, 3)) * np.asarray(shape)  # any image
    got = _interpolate(jnp.asarray(field), jnp.asarray(points), kernel)
    np.testing.assert_allclose(got, near_seam, rtol=0, atol=1e-12)


@pytest.mark.parametrize("shape", GRIDS)
@pytest.mark.parametrize("kernel", KERNELS)
def test_spread_conserves_force_and_torque(kernel, shape, x64):
    d = len(shape)
    points = _points(shape, N, margin=2.5, seed=2)
    forces = np.random.default_rng(3).standard_normal((N, d))
    f = np.asarray(_spread(jnp.asarray(forces), jnp.asarray(points), shape, kernel))
    axes = tuple(range(1, d + 1))
    np.testing.assert_allclose(f.sum(axis=axes), forces.sum(axis=0), atol=1e-12)
    x = _nodes(shape).astype(np.float64)
    if d == 2:
        torque_grid = np.sum(x[0] * f[1] - x[1] * f[0])
        (x0, y0), (fx, fy) = points.T, forces.T
        torque_points = np.sum(x0 * fy - y0 * fx)
    else:
        torque_grid = x.reshape(d, -1) @ f.reshape(d, -1).T
        torque_grid = torque_grid - torque_grid.T
        torque_points = points.T @ forces - forces.T @ points
    np.testing.assert_allclose(torque_grid, torque_points, rtol=0, atol=1e-10)


@pytest.mark.parametrize("kernel", KERNELS)
def test_spread_and_interpolate_wrap_around_the_periodic_seams(kernel, x64):
    shape = (12, 10, 11)
    point = np.array([[11.8, 9.3, 5.0]])  # every kernel reaches x = 0 and y = 0
    force = jnp.array([[1.0, -2.0, 0.5]])
    f = np.asarray(_spread(force, jnp.asarray(point), shape, kernel))
    np.testing.assert_allclose(f.sum(axis=(1, 2, 3)), [1.0, -2.0, 0.5], atol=1e-14)
    assert np.any(f[0, 0]) and np.any(f[0, -1])  # both sides of the x seam
    assert np.any(f[0, :, 0]) and np.any(f[0, :, -1])  # both sides of the y seam
    inside = jnp.asarray(point - np.array([[6.0, 5.0, 0.0]]))  # no seam in reach
    inner = _spread(force, inside, shape, kernel)
    np.testing.assert_allclose(np.roll(inner, (6, 5), axis=(1, 2)), f, atol=1e-14)
    images = point + np.array([[12.0, -10.0, 22.0]])  # the same point, periodically
    again = _spread(force, jnp.asarray(images), shape, kernel)
    np.testing.assert_allclose(again, f, rtol=0, atol=1e-12)
    field = jnp.asarray(np.random.default_rng(4).standard_normal((2, *shape)))
    rolled = jnp.roll(field, (3, -4, 5), axis=(1, 2, 3))
    np.testing.assert_allclose(
        _interpolate(rolled, jnp.asarray(point + np.array([[3.0, -4.0, 5.0]])), kernel),
        _interpolate(field, jnp.asarray(point), kernel),
        rtol=0,
        atol=1e-12,
    )


@pytest.mark.parametrize("shape", GRIDS)
@pytest.mark.parametrize("kernel", KERNELS)
def test_spread_is_the_adjoint_of_interpolate(kernel, shape, x64):
    rng = np.random.default_rng(5)
    d = len(shape)
    points = rng.uniform(-1.0, 1.0, (N, d)) * np.asarray(shape)  # seams included
    values = jnp.asarray(rng.standard_normal((N, d)))
    u = jnp.asarray(rng.standard_normal((d, *shape)))
    lhs = jnp.vdot(_spread(values, jnp.asarray(points), shape, kernel), u)
    rhs = jnp.vdot(values, _interpolate(u, jnp.asarray(points), kernel))
    assert abs(float(lhs) - float(rhs)) < 1e-12 * float(jnp.sum(jnp.abs(values)))


@pytest.mark.parametrize("kernel", KERNELS)
def test_float32_is_preserved(kernel):
    shape = GRIDS[1]  # the mixed-dtype test below runs in 2-D
    d = len(shape)
    points = jnp.asarray(_points(shape, N, margin=0.0, seed=6, dtype=np.float32))
    f = _spread(jnp.ones((N, d), jnp.float32), points, shape, kernel)
    u = _interpolate(jnp.ones((d, *shape), jnp.float32), points, kernel)
    assert f.dtype == u.dtype == jnp.float32
    assert f.shape == (d, *shape) and u.shape == (N, d)
    axes = tuple(range(1, d + 1))
    np.testing.assert_allclose(jnp.sum(f, axis=axes), float(N), rtol=1e-6)
    np.testing.assert_allclose(u, 1.0, rtol=1e-6)  # partition of unity in float32


@pytest.mark.parametrize("kernel", KERNELS)
def test_weights_in_point_dtype_results_in_field_dtype(kernel, x64):
    shape = GRIDS[0]
    points = jnp.asarray(_points(shape, N, margin=1.0, seed=7))  # float64
    assert points.dtype == jnp.float64
    u = _interpolate(jnp.ones((2, *shape), jnp.float32), points, kernel)
    f = _spread(jnp.ones((N, 2), jnp.float32), points, shape, kernel)
    assert u.dtype == f.dtype == jnp.float32
    np.testing.assert_allclose(u, 1.0, rtol=1e-6)
    f64 = _spread(jnp.ones((N, 2)), points.astype(jnp.float32), shape, kernel)
    assert f64.dtype == jnp.float64
    np.testing.assert_allclose(f64, f, rtol=0, atol=2e-6)  # points rounded to f32


def test_shape_and_dtype_errors():
    pts3 = jnp.zeros((5, 3))
    field = jnp.zeros((3, 8, 8, 8))
    with pytest.raises(ValueError, match=r"field must have shape"):
        interpolate(jnp.zeros((8, 8)), jnp.zeros((5, 2)), 4)
    with pytest.raises(ValueError, match=r"pass points of shape \(N, 3\)"):
        interpolate(field, jnp.zeros((5, 2)), 4)
    with pytest.raises(ValueError, match=r"points must have shape \(N, d\)"):
        interpolate(field, jnp.zeros(3), 4)
    with pytest.raises(ValueError, match="at least 4 nodes"):
        interpolate(jnp.zeros((3, 8, 3, 8)), pts3, "peskin")
    with pytest.raises(ValueError, match="one row per point"):
        spread(jnp.zeros((4, 3)), pts3, (8, 8, 8), 4)
    with pytest.raises(ValueError, match=r"values must have shape \(N, C\)"):
        spread(jnp.zeros(5), pts3, (8, 8, 8), 4)
    with pytest.raises(ValueError, match="grid"):
        spread(jnp.zeros((5, 3)), pts3, (8, 8), 4)
    with pytest.raises(ValueError, match="2 or 3 grid sizes"):
        spread(jnp.zeros((5, 3)), pts3, 8, 4)
    with pytest.raises(ValueError, match="at least 3 nodes"):
        spread(jnp.zeros((5, 3)), pts3, (8, 2, 8), "roma")
    with pytest.raises(TypeError, match="floating point"):
        interpolate(field, jnp.zeros((5, 3), jnp.int32), 4)
    with pytest.raises(TypeError, match="floating point"):
        spread(jnp.zeros((5, 3), jnp.int32), pts3, (8, 8, 8), 4)
    with pytest.raises(ValueError, match="Unknown delta kernel"):
        spread(jnp.zeros((5, 3)), pts3, (8, 8, 8), "gauss")


def test_no_points_give_empty_results():
    assert _interpolate(jnp.ones((2, 6, 6)), jnp.zeros((0, 2)), 4).shape == (0, 2)
    assert not jnp.any(_spread(jnp.zeros((0, 2)), jnp.zeros((0, 2)), (6, 6), 4))
