"""Checkpoints (bit-identical continuation) and VTK image data and mesh export."""

from __future__ import annotations

import base64
import xml.etree.ElementTree as ET

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from lbm_jax import Simulation, load_state, save_state, write_vti
from lbm_jax.io import _transfer
from lbm_jax.io._files import write_vtp


@pytest.fixture(scope="module", params=["fp32", "fp16c"])
def sim(request):
    # A small sheared periodic box; fp16c stores uint16 codes.
    return Simulation("D2Q9", (24, 16), tau=0.7, storage=request.param)


def _initial(sim):
    y = np.arange(16)[None, :] * np.ones((24, 1))
    u = np.stack([0.05 * np.sin(2 * np.pi * y / 16), np.zeros((24, 16))])
    return sim.init(1.0, u)


def test_checkpoint_continuation_is_bit_identical(sim, tmp_path):
    straight = sim.advance(_initial(sim), 40)
    half = sim.advance(_initial(sim), 20)
    save_state(tmp_path / "ckpt.npz", half, metadata={"step": 20, "case": "shear"})
    loaded, meta = load_state(tmp_path / "ckpt.npz", like=_initial(sim))
    raw, _ = load_state(tmp_path / "ckpt.npz")
    assert set(raw) == {"f", "t"}
    assert meta == {"step": 20, "case": "shear"}
    assert int(loaded.t) == 20
    assert loaded.f.dtype == sim.storage.storage_dtype
    resumed = sim.advance(loaded, 20)
    assert int(resumed.t) == int(straight.t) == 40
    np.testing.assert_array_equal(
        np.asarray(resumed.f).view(np.uint8), np.asarray(straight.f).view(np.uint8)
    )


def test_load_without_template_returns_named_arrays(tmp_path):
    tree = {"a": np.arange(4, dtype=np.int32), "b": np.float16([1.5, -2.0])}
    save_state(tmp_path / "s.npz", tree)
    out, meta = load_state(tmp_path / "s.npz")
    assert meta == {}
    np.testing.assert_array_equal(out["a"], tree["a"])
    assert out["b"].dtype == np.float16


def test_bfloat16_leaves_round_trip_exactly(tmp_path):
    import ml_dtypes

    x = np.array([1.0, -3.5, 1e-20, np.inf], dtype=ml_dtypes.bfloat16)
    save_state(tmp_path / "b.npz", (x,))
    (y,), _ = load_state(tmp_path / "b.npz", like=(x,))
    assert y.dtype == x.dtype
    np.testing.assert_array_equal(np.asarray(y).view(np.uint16), x.view(np.uint16))


def test_load_rejects_mismatched_template(tmp_path):
    save_state(tmp_path / "s.npz", {"f": np.zeros((3, 4), np.float32)})
    with pytest.raises(ValueError, match="shape"):
        load_state(tmp_path / "s.npz", like={"f": np.zeros((3, 5), np.float32)})
    with pytest.raises(ValueError, match="pytree"):
        load_state(tmp_path / "s.npz", like=(np.zeros((3, 4), np.float32),))
    with pytest.raises(FileNotFoundError):
        load_state(tmp_path / "missing.npz")


def test_save_rejects_non_json_metadata(tmp_path):
    with pytest.raises(TypeError, match="JSON"):
        save_state(tmp_path / "s.npz", {"f": np.zeros(2)}, metadata={"x": object()})


def _read_array(elem) -> np.ndarray:
    raw = base64.b64decode(elem.text.strip())
    nbytes = int(np.frombuffer(raw[:8], "<u8")[0])
    dtype = {"Float32": "<f4", "Float64": "<f8", "UInt8": "u1", "Int64": "<i8"}[
        elem.get("type")
    ]
    data = np.frombuffer(raw[8 : 8 + nbytes], dtype)
    assert data.nbytes == nbytes
    return data


@pytest.mark.parametrize("shape", [(5, 3), (4, 3, 2)])
def test_vti_parses_with_extents_and_arrays(tmp_path, shape):
    rng = np.random.default_rng(0)
    rho = rng.random(shape).astype(np.float32)
    u = rng.random((len(shape), *shape))
    path = write_vti(tmp_path / "flow", {"rho": rho, "u": u, "solid": rho > 0.5})
    assert path.suffix == ".vti"
    root = ET.parse(path).getroot()
    assert root.get("type") == "ImageData"
    image = root.find("ImageData")
    dims = list(shape) + [1] * (3 - len(shape))
    extent = " ".join(f"0 {d - 1}" for d in dims)
    assert image.get("WholeExtent") == extent
    assert image.find("Piece").get("Extent") == extent
    arrays = {a.get("Name"): a for a in image.iter("DataArray")}
    assert set(arrays) == {"rho", "u", "solid"}
    assert arrays["u"].get("NumberOfComponents") == "3"
    # point order: x fastest
    got_rho = _read_array(arrays["rho"]).reshape(dims[::-1]).transpose()
    np.testing.assert_array_equal(got_rho.reshape(shape), rho)
    got_u = _read_array(arrays["u"]).reshape(*dims[::-1], 3)
    for k in range(len(shape)):
        np.testing.assert_array_equal(got_u[..., k].transpose().reshape(shape), u[k])
    if len(shape) == 2:
        assert np.all(got_u[..., 2] == 0)
    assert _read_array(arrays["solid"]).sum() == int((rho > 0.5).sum())


def test_vti_rejects_mismatched_fields(tmp_path):
    with pytest.raises(ValueError, match="grid"):
        write_vti(
            tmp_path / "x.vti", {"rho": np.zeros((4, 4)), "u": np.zeros((2, 5, 4))}
        )
    with pytest.raises(ValueError, match="at least one"):
        write_vti(tmp_path / "x.vti", {})


def test_vti_writes_device_arrays(tmp_path):
    path = write_vti(tmp_path / "d.vti", {"rho": jax.numpy.ones((3, 3))})
    assert ET.parse(path).getroot().find("ImageData") is not None


def _octahedron(dtype):
    points = np.array(
        [[1, 0, 0], [-1, 0, 0], [0, 1, 0], [0, -1, 0], [0, 0, 1], [0, 0, -1]],
        dtype=dtype,
    ) * dtype(0.7) + dtype(0.1)
    faces = np.array(
        [[0, 2, 4], [2, 1, 4], [1, 3, 4], [3, 0, 4],
         [2, 0, 5], [1, 2, 5], [3, 1, 5], [0, 3, 5]],
        dtype=np.int32,
    )  # fmt: skip
    return points, faces


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_vtp_round_trips_mesh_and_data(tmp_path, dtype):
    points, faces = _octahedron(dtype)
    rng = np.random.default_rng(1)
    tension = rng.random(6).astype(np.float32)
    force = rng.standard_normal((6, 3))
    area = rng.random(8)
    path = write_vtp(
        tmp_path / "capsule",
        points,
        faces,
        point_data={"tension": tension, "force": force, "top": points[:, 2] > 0},
        cell_data={"area": area},
    )
    assert path.name == "capsule.vtp"
    root = ET.parse(path).getroot()
    assert root.get("type") == "PolyData"
    assert root.get("header_type") == "UInt64"
    piece = root.find("PolyData/Piece")
    assert piece.get("NumberOfPoints") == "6" and piece.get("NumberOfPolys") == "8"
    # the element order VTK's XML readers expect
    assert [c.tag for c in piece] == ["PointData", "CellData", "Points", "Polys"]
    xyz = piece.find("Points/DataArray")
    assert xyz.get("NumberOfComponents") == "3"
    assert xyz.get("type") == {np.float32: "Float32", np.float64: "Float64"}[dtype]
    np.testing.assert_array_equal(_read_array(xyz).reshape(-1, 3), points)
    polys = {a.get("Name"): a for a in piece.find("Polys")}
    np.testing.assert_array_equal(_read_array(polys["connectivity"]), faces.ravel())
    np.testing.assert_array_equal(_read_array(polys["offsets"]), 3 * np.arange(1, 9))
    point_arrays = {a.get("Name"): a for a in piece.find("PointData")}
    assert point_arrays["force"].get("NumberOfComponents") == "3"
    assert point_arrays["tension"].get("NumberOfComponents") == "1"
    np.testing.assert_array_equal(_read_array(point_arrays["tension"]), tension)
    np.testing.assert_array_equal(
        _read_array(point_arrays["force"]).reshape(6, 3), force
    )
    np.testing.assert_array_equal(_read_array(point_arrays["top"]), points[:, 2] > 0)
    (cell_array,) = piece.find("CellData")
    assert cell_array.get("Name") == "area"
    np.testing.assert_array_equal(_read_array(cell_array), area)


def test_vtp_writes_device_arrays_and_narrow_floats(tmp_path):
    points, faces = _octahedron(np.float32)
    path = write_vtp(
        tmp_path / "m.vtp",
        jax.numpy.asarray(points),
        jax.numpy.asarray(faces),
        point_data={"h": np.float16([1.5, -2, 0, 1, 2, 3])},
    )
    assert path.name == "m.vtp"
    piece = ET.parse(path).getroot().find("PolyData/Piece")
    (h,) = piece.find("PointData")
    assert h.get("type") == "Float32"
    np.testing.assert_array_equal(_read_array(h), [1.5, -2, 0, 1, 2, 3])
    assert list(piece.find("CellData")) == []


def test_vtp_rejects_bad_shapes(tmp_path):
    points, faces = _octahedron(np.float64)
    with pytest.raises(ValueError, match=r"points must have shape \(N, 3\)"):
        write_vtp(tmp_path / "x", points[:, :2], faces)
    with pytest.raises(ValueError, match=r"faces must have shape \(F, 3\)"):
        write_vtp(tmp_path / "x", points, faces[:, :2])
    with pytest.raises(ValueError, match="6 points"):
        write_vtp(tmp_path / "x", points, faces + 1)
    with pytest.raises(TypeError, match="integer"):
        write_vtp(tmp_path / "x", points, faces.astype(np.float64))
    with pytest.raises(ValueError, match=r"'tension' has shape \(5,\)"):
        write_vtp(tmp_path / "x", points, faces, point_data={"tension": np.ones(5)})
    with pytest.raises(ValueError, match=r"cell_data array 'n' has shape \(8, 2\)"):
        write_vtp(tmp_path / "x", points, faces, cell_data={"n": np.ones((8, 2))})
    assert not (tmp_path / "x.vtp").exists()


# -- streaming: files are written and read slab by slab ---------------------------
@pytest.fixture
def tiny_chunks(monkeypatch):
    """Host pieces of 64 bytes, so that small arrays stream in many pieces."""
    monkeypatch.setattr(_transfer, "HOST_CHUNK_BYTES", 64)


def _split(a, spec):
    mesh = Mesh(np.array(jax.devices()[:2]).reshape(spec[1]), spec[0])
    return jax.device_put(a, NamedSharding(mesh, PartitionSpec(*spec[2])))


SPLITS = {
    "x": (("x", "y"), (2, 1), ("x", "y")),
    "y": (("x", "y"), (1, 2), ("x", "y")),
}


@pytest.mark.parametrize("shape", [(6, 4), (4, 6, 3)])
def test_vti_streams_in_pieces_to_the_same_bytes(tmp_path, monkeypatch, shape):
    rng = np.random.default_rng(2)
    rho = rng.random(shape).astype(np.float16)
    u = rng.random((len(shape), *shape)).astype(np.float32)
    whole = write_vti(tmp_path / "whole", {"rho": rho, "u": u}).read_bytes()
    monkeypatch.setattr(_transfer, "HOST_CHUNK_BYTES", 16)
    cases = {
        "numpy": (rho, u),
        "device": (jax.numpy.asarray(rho), jax.numpy.asarray(u)),
    }
    for name, (axes, grid, _) in SPLITS.items():
        spec = (axes[: len(shape)], grid, axes[: len(shape)])
        vspec = (axes[: len(shape)], grid, (None, *axes[: len(shape)]))
        cases[name] = (_split(rho, spec), _split(u, vspec))
    for name, (r, v) in cases.items():
        got = write_vti(tmp_path / name, {"rho": r, "u": v}).read_bytes()
        assert got == whole, name


@pytest.mark.parametrize("split", [None, "x", "y"])
def test_checkpoints_stream_and_keep_the_split(tmp_path, tiny_chunks, split):
    devices = {None: None, "x": 2, "y": (1, 2, 1)}[split]
    sim = Simulation("D3Q19", (4, 6, 2), tau=0.7, storage="fp16s", devices=devices)
    rng = np.random.default_rng(3)
    state = sim.init(u=0.02 * rng.standard_normal((3, *sim.shape)))
    save_state(tmp_path / "s.npz", state, metadata={"n": 1})
    with np.load(tmp_path / "s.npz") as raw:  # an ordinary .npz
        assert raw["leaf_0"].dtype == np.uint16
        np.testing.assert_array_equal(
            raw["leaf_0"], np.asarray(state.f).view(np.uint16)
        )
    for like in (state, jax.eval_shape(lambda: state)):
        loaded, meta = load_state(tmp_path / "s.npz", like=like)
        assert meta == {"n": 1}
        np.testing.assert_array_equal(
            np.asarray(loaded.f).view(np.uint16), np.asarray(state.f).view(np.uint16)
        )
        assert int(loaded.t) == 0
    # with the state as template, the result is split like it
    loaded, _ = load_state(tmp_path / "s.npz", like=state)
    assert loaded.f.sharding.is_equivalent_to(state.f.sharding, 4)
    plain, _ = load_state(tmp_path / "s.npz")
    np.testing.assert_array_equal(plain["f"], np.asarray(state.f))
    # and the run continues exactly
    a = sim.advance(loaded, 2)
    b = sim.advance(state, 2)
    np.testing.assert_array_equal(
        np.asarray(a.f).view(np.uint16), np.asarray(b.f).view(np.uint16)
    )
