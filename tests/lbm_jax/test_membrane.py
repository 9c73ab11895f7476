"""Capsule membranes: closed meshes, shape measures, strain laws, bending, forces."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lbm_jax.ibm import (
    BENDING_MODELS,
    ICOSPHERE_NODES,
    LAWS,
    Membrane,
    TriangleMesh,
    area,
    ellipsoid_axes,
    icosphere,
    shear_plane_deformation,
    volume,
)

MESH = icosphere(1.0, nodes=162)
# Every law and every bending model (the terms add up independently), with the
# area and volume penalties on.
VARIANTS = list(zip(LAWS, BENDING_MODELS, strict=True))


@jax.jit
def mechanics(membrane: Membrane, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Energy and forces, compiled once per configuration and dtype for all tests."""
    return membrane.energy(x), membrane.forces(x)


def energy_fn(membrane: Membrane, x: jax.Array) -> jax.Array:
    return mechanics(membrane, x)[0]


def forces_fn(membrane: Membrane, x: jax.Array) -> jax.Array:
    return mechanics(membrane, x)[1]


@functools.cache
def full_membrane(law: str, bending: str) -> Membrane:
    """A membrane with every term on: strain law, bending, area and volume."""
    return Membrane(
        MESH,
        law=law,
        shear_modulus=1.0,
        skalak_c=0.7,
        bending_modulus=0.05,
        bending=bending,
        area_modulus=2.0,
        volume_modulus=3.0,
    )


def deformed(seed: int, mesh: TriangleMesh = MESH) -> np.ndarray:
    """The mesh's nodes under a random affine map plus random node noise."""
    rng = np.random.default_rng(seed)
    stretch = np.eye(3) + 0.15 * rng.standard_normal((3, 3))
    noise = 0.02 * rng.standard_normal(mesh.nodes.shape)
    return mesh.nodes @ stretch.T + noise + rng.standard_normal(3)


def rotation(seed: int) -> np.ndarray:
    q, r = np.linalg.qr(np.random.default_rng(seed).standard_normal((3, 3)))
    q = q * np.sign(np.diag(r))
    return q * np.linalg.det(q)  # a proper rotation


def unit_cube() -> TriangleMesh:
    """The cube [0, 1]^3, two triangles per side, node index 4 x + 2 y + z."""
    nodes = np.array(list(itertools.product((0.0, 1.0), repeat=3)))
    quads = [(0, 1, 3, 2), (4, 6, 7, 5), (0, 4, 5, 1), (2, 3, 7, 6)]
    quads += [(0, 2, 6, 4), (1, 5, 7, 3)]
    faces = [tri for a, b, c, d in quads for tri in ((a, b, c), (a, c, d))]
    return TriangleMesh(nodes, faces)


def principal_tension(law: str, l1: float, l2: float, c: float) -> float:
    """Tension along stretch ``l1`` per current length for G_s = 1.

    Barthes-Biesel, Diaz & Dhenin, J. Fluid Mech. 460, 211 (2002), eqs. 2.4-2.5.
    """
    if law == "skalak":
        return l1 / l2 * (l1**2 - 1 + c * l2**2 * (l1**2 * l2**2 - 1))
    return (l1**2 - 1 / (l1 * l2) ** 2) / (l1 * l2)


# -- meshes -----------------------------------------------------------------------


@pytest.mark.parametrize("n", ICOSPHERE_NODES[:5])
def test_icosphere_counts_and_radius(n):
    mesh = icosphere(2.5, nodes=n, center=(1.0, -2.0, 3.0))
    assert (mesh.num_nodes, mesh.num_faces, mesh.num_edges) == (n, 2 * n - 4, 3 * n - 6)
    radius = np.linalg.norm(mesh.nodes - [1.0, -2.0, 3.0], axis=1)
    np.testing.assert_allclose(radius, 2.5, rtol=1e-14)
    assert mesh.faces.dtype == np.int32 and mesh.edges.dtype == np.int32


def test_icosphere_volume_and_area_converge(x64):
    r = 1.7
    errors = []
    measures = jax.jit(lambda x, faces: (volume(x, faces), area(x, faces)))
    for n in ICOSPHERE_NODES[1:5]:
        mesh = icosphere(r, nodes=n, center=(4.0, 5.0, 6.0))
        v, a = measures(mesh.nodes, mesh.faces)
        assert v.dtype == jnp.float64
        errors.append(
            (1 - float(v) / (4 / 3 * np.pi * r**3), 1 - float(a) / (4 * np.pi * r**2))
        )
    errors = np.array(errors)
    assert np.all(errors > 0) and np.all(np.diff(errors, axis=0) < 0)
    # the inscribed polyhedron's error falls as 1 / nodes
    assert np.all(errors[-1] < 3e-3) and np.all(errors[-2] / errors[-1] > 3.5)


def test_icosphere_rejects_bad_arguments():
    with pytest.raises(ValueError, match=r"one of \(12, 42, 162, 642, 2562, 10242\)"):
        icosphere(1.0, nodes=100)
    with pytest.raises(ValueError, match="radius must be positive"):
        icosphere(0.0)
    with pytest.raises(ValueError, match="center must be three"):
        icosphere(1.0, nodes=12, center=(0.0, 0.0))


def _broken(kind: str) -> tuple[np.ndarray, np.ndarray]:
    nodes, faces = MESH.nodes, np.array(MESH.faces)
    if kind == "open":
        faces = faces[:-1]
    elif kind == "flipped face":
        faces[7] = faces[7, ::-1]
    elif kind == "inward":
        faces = faces[:, ::-1]
    elif kind == "bad index":
        faces[3, 1] = len(nodes)
    elif kind == "degenerate":
        faces[5, 2] = faces[5, 0]
    elif kind == "unused node":
        nodes = np.concatenate([nodes, [[0.0, 0.0, 0.0]]])
    elif kind == "shape":
        nodes = nodes[:, :2]
    return nodes, faces


@pytest.mark.parametrize(
    "kind, message",
    [
        ("open", r"edge \[\d+, \d+\] belongs to only one face: the surface is open"),
        ("flipped face", r"faces \[\d+, 7\] both traverse edge .* reverse the node"),
        ("inward", r"negative volume .* reverse the face order"),
        ("bad index", r"face 3 \[.*\] refers to a node outside 0\.\.161"),
        ("degenerate", r"face 5 .* is degenerate"),
        ("unused node", r"nodes \[162\] belong to no face"),
        ("shape", r"nodes must have shape \(N, 3\).*got shape \(162, 2\)"),
    ],
)
def test_mesh_validation_rejects(kind, message):
    with pytest.raises(ValueError, match=message):
        TriangleMesh(*_broken(kind))


def test_mesh_is_read_only():
    with pytest.raises(ValueError, match="read-only"):
        MESH.nodes[0, 0] = 2.0
    assert np.array_equal(np.unique(MESH.edges, axis=0), MESH.edges)


# -- shape measures ----------------------------------------------------------------


@pytest.mark.parametrize("angle", [0.3, -0.7, 1.2])
def test_shear_plane_deformation_of_a_rotated_ellipsoid(x64, angle):
    mesh = icosphere(1.0, nodes=2562)
    a, b, c = 1.3, 1.0, 0.7
    cos, sin = np.cos(angle), np.sin(angle)
    turn = np.array([[cos, 0.0, -sin], [0.0, 1.0, 0.0], [sin, 0.0, cos]])
    x = mesh.nodes * [a, b, c] @ turn.T + [20.0, 30.0, 40.0]
    d, theta = jax.jit(shear_plane_deformation)(x, mesh.faces)
    np.testing.assert_allclose(float(d), (a - c) / (a + c), rtol=1e-9)
    np.testing.assert_allclose(float(theta), angle, atol=1e-9)
    semi, axes = ellipsoid_axes(x, mesh.faces)
    np.testing.assert_allclose(semi, [a, b, c], rtol=3e-3)  # inscribed polyhedron
    np.testing.assert_allclose(
        abs(np.asarray(axes)[:, 0] @ [cos, 0.0, sin]), 1.0, rtol=1e-9
    )


def test_shear_plane_deformation_float32():
    x = jnp.asarray(MESH.nodes * [1.2, 1.0, 0.8] + 50.0, jnp.float32)
    d, theta = jax.jit(shear_plane_deformation)(x, MESH.faces)
    assert d.dtype == theta.dtype == jnp.float32
    np.testing.assert_allclose(float(d), 0.4 / 2.0, atol=1e-3)
    np.testing.assert_allclose(float(theta), 0.0, atol=1e-3)


# -- mechanics ---------------------------------------------------------------------


@pytest.mark.parametrize("law, bending", VARIANTS)
def test_forces_are_minus_energy_gradient(x64, law, bending):
    membrane = full_membrane(law, bending)
    x = jnp.asarray(deformed(0))
    forces = forces_fn(membrane, x)
    rng = np.random.default_rng(1)
    h = 1e-5
    for _ in range(4):
        v = rng.standard_normal(x.shape)
        v /= np.linalg.norm(v)
        slope = (energy_fn(membrane, x + h * v) - energy_fn(membrane, x - h * v)) / (
            2 * h
        )
        np.testing.assert_allclose(float(slope), -float(jnp.sum(forces * v)), rtol=1e-6)


@pytest.mark.parametrize("law, bending", VARIANTS)
def test_reference_shape_is_stress_free(x64, law, bending):
    membrane = full_membrane(law, bending)
    x = jnp.asarray(membrane.reference_nodes)
    assert abs(float(energy_fn(membrane, x))) < 1e-13
    assert float(jnp.abs(forces_fn(membrane, x)).max()) < 1e-13


@pytest.mark.parametrize("law, bending", VARIANTS)
def test_total_force_and_torque_vanish(x64, law, bending):
    membrane = full_membrane(law, bending)
    x = jnp.asarray(deformed(2))
    forces = forces_fn(membrane, x)
    scale = float(jnp.sum(jnp.linalg.norm(forces, axis=1)))
    assert scale > 1.0  # the shape is loaded
    arm = x - jnp.mean(x, axis=0, keepdims=True)
    lever = scale * float(jnp.linalg.norm(arm, axis=1).max())
    assert float(jnp.abs(jnp.sum(forces, axis=0)).max()) < 1e-13 * scale
    assert float(jnp.abs(jnp.sum(jnp.cross(arm, forces), axis=0)).max()) < 1e-13 * lever


@pytest.mark.parametrize("law, bending", VARIANTS)
def test_energy_is_rotation_invariant(x64, law, bending):
    membrane = full_membrane(law, bending)
    x = deformed(3)
    turn = rotation(4)
    e, f = energy_fn(membrane, x), forces_fn(membrane, x)
    e_turned, f_turned = (
        energy_fn(membrane, x @ turn.T),
        forces_fn(membrane, x @ turn.T),
    )
    np.testing.assert_allclose(float(e_turned), float(e), rtol=1e-12)
    np.testing.assert_allclose(
        f_turned, f @ turn.T, atol=1e-12 * float(jnp.abs(f).max())
    )


@pytest.mark.parametrize(
    "law, c", [("skalak", 1.0), ("skalak", 0.3), ("neo-hookean", 1.0)]
)
def test_inflated_sphere_carries_the_isotropic_tension(x64, law, c):
    radius, g_s = 2.0, 0.4
    mesh = icosphere(radius, nodes=642)
    membrane = Membrane(mesh, law=law, shear_modulus=g_s, skalak_c=c)
    for lam in (0.9, 1.05, 1.3):
        x = jnp.asarray(lam * mesh.nodes)
        forces = forces_fn(membrane, x)
        tension = g_s * principal_tension(law, lam, lam, c)
        # every face stretches by lam: E = A0 w(lam, lam) and sum F.x = -lam dE/dlam
        virial = float(jnp.sum(forces * x))
        area0 = membrane.reference_area
        np.testing.assert_allclose(virial, -2 * lam**2 * area0 * tension, rtol=1e-11)
        # Laplace: the inward force per area is the pressure 2 T / (lam R)
        pressure = -virial / (lam * radius) / (4 * np.pi * (lam * radius) ** 2)
        np.testing.assert_allclose(pressure, 2 * tension / (lam * radius), rtol=6e-3)
        radial = np.asarray(jnp.sum(forces * x, axis=1))  # inward when inflated
        assert np.all(np.sign(radial) == np.sign(1 - lam))


@pytest.mark.parametrize("law", LAWS)
def test_stretched_cube_carries_the_principal_tensions(x64, law):
    c, (l1, l2) = 0.6, (1.3, 0.8)
    membrane = Membrane(unit_cube(), law=law, shear_modulus=1.0, skalak_c=c)
    x = jnp.asarray(membrane.reference_nodes * [l1, l2, 1.0])
    forces = forces_fn(membrane, x)
    # sides z = 0, 1 stretch by (l1, l2), sides y = 0, 1 by (l1, 1): dE/dl1 =
    # 2 (l2 T1(l1, l2) + T1(l1, 1)) and sum F_x x = -l1 dE/dl1; likewise for y.
    for axis, (a, b) in enumerate([(l1, l2), (l2, l1)]):
        t = principal_tension(law, a, b, c), principal_tension(law, a, 1.0, c)
        virial = float(jnp.sum(forces[:, axis] * x[:, axis]))
        np.testing.assert_allclose(virial, -2 * a * (b * t[0] + t[1]), rtol=1e-12)


@pytest.mark.parametrize("bending", BENDING_MODELS)
def test_inflated_sphere_bending_energy(x64, bending):
    mesh = icosphere(3.0, nodes=642)
    kb = 0.25
    plain = Membrane(mesh, shear_modulus=1.0)
    bent = Membrane(mesh, shear_modulus=1.0, bending=bending, bending_modulus=kb)
    for lam in (0.8, 1.1):
        x = jnp.asarray(lam * mesh.nodes)
        e_bend = float(energy_fn(bent, x) - energy_fn(plain, x))
        if bending == "dihedral":  # uniform inflation keeps every dihedral angle
            assert abs(e_bend) < 1e-12
        else:  # k_b/2 (2/(lam R) - 2/R)^2 4 pi (lam R)^2 = 8 pi k_b (1 - lam)^2
            np.testing.assert_allclose(
                e_bend, 8 * np.pi * kb * (1 - lam) ** 2, rtol=6e-3
            )


# -- contract: dtypes, jit, pytree, validation -------------------------------------


@pytest.mark.parametrize("law, bending", VARIANTS)
def test_forces_keep_the_dtype_under_jit(request, law, bending):
    membrane = full_membrane(law, bending)
    x = jnp.asarray(deformed(5), jnp.float32)
    forces = forces_fn(membrane, x)
    assert forces.dtype == jnp.float32 and forces.shape == x.shape
    assert bool(jnp.all(jnp.isfinite(forces))) and float(jnp.abs(forces).max()) > 0
    # float64 reference arrays never leak into a float32 computation, with x64 on
    # too (strict promotion would raise); float64 positions compute in float64
    request.getfixturevalue("x64")
    for dtype in (jnp.float32, jnp.float64):
        x = jax.ShapeDtypeStruct((MESH.num_nodes, 3), dtype)
        assert jax.eval_shape(membrane.forces, x).dtype == dtype
        assert jax.eval_shape(membrane.energy, x).dtype == dtype


def test_membrane_pytree_keeps_configuration():
    membrane = full_membrane("skalak", "helfrich")
    leaves, tree = jax.tree_util.tree_flatten(membrane)
    rebuilt = jax.tree_util.tree_unflatten(tree, leaves)
    assert repr(rebuilt) == repr(membrane)
    assert all(
        np.array_equal(a, b)
        for a, b in zip(jax.tree.leaves(rebuilt), leaves, strict=True)
    )
    # a changed modulus is a changed static configuration, not a stale cache hit
    x = jnp.asarray(deformed(6), jnp.float32)
    soft = Membrane(MESH, shear_modulus=1.0)
    stiff = Membrane(MESH, shear_modulus=3.0)
    np.testing.assert_allclose(energy_fn(stiff, x), 3 * energy_fn(soft, x), rtol=1e-6)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"law": "hooke"}, ValueError, r"unknown membrane law 'hooke'.*'skalak'"),
        ({"bending": "spring"}, ValueError, r"unknown bending model 'spring'"),
        ({"shear_modulus": 0.0}, ValueError, "shear_modulus must be positive"),
        ({"shear_modulus": "1"}, TypeError, "shear_modulus must be a real number"),
        ({"skalak_c": -0.5}, ValueError, r"skalak_c must exceed -1/2"),
        ({"bending_modulus": -1.0}, ValueError, "bending_modulus must be non-neg"),
        ({"area_modulus": np.inf}, ValueError, "area_modulus must be finite"),
        ({"volume_modulus": -1e-3}, ValueError, "volume_modulus must be non-neg"),
    ],
)
def test_membrane_rejects_bad_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        Membrane(MESH, **{"shear_modulus": 1.0, **kwargs})


def test_membrane_rejects_bad_positions():
    membrane = Membrane(MESH, shear_modulus=1.0)
    with pytest.raises(TypeError, match="mesh must be a TriangleMesh"):
        Membrane(MESH.nodes, shear_modulus=1.0)
    with pytest.raises(ValueError, match=r"x must have shape \(162, 3\)"):
        membrane.forces(jnp.zeros((161, 3)))
    with pytest.raises(TypeError, match="floating-point"):
        membrane.energy(jnp.zeros((162, 3), jnp.int32))
