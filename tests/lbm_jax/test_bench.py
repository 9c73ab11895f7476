"""Benchmark helpers: bandwidth measurement and MLUPs reports (tiny sizes)."""

from __future__ import annotations

import json
import statistics

import numpy as np
import pytest

from lbm_jax.__main__ import main
from lbm_jax.bench import bench, format_table, measure_bandwidth, stream_bandwidths


def test_stream_bandwidths_are_positive_and_finite():
    bw = stream_bandwidths(size_mib=8, repeats=2)
    assert set(bw) == {"copy", "triad", "scale"}
    assert all(0 < v < 1e4 for v in bw.values())
    assert measure_bandwidth(size_mib=8, repeats=1) > 0
    assert set(stream_bandwidths(size_mib=4, repeats=1, kernels=("copy",))) == {"copy"}
    with pytest.raises(ValueError, match="kernels"):
        stream_bandwidths(size_mib=4, kernels=("fill",))


def test_stream_bandwidths_count_bytes_read_and_written(monkeypatch):
    """One timed second of each kernel: copy moves 2 arrays, triad 3, and the
    device scale kernel 2 per pass over its array."""
    import lbm_jax.bench as bench_module

    monkeypatch.setattr(bench_module, "median_seconds", lambda fn, repeats: 1.0)
    bw = stream_bandwidths(size_mib=4, repeats=1)
    nbytes = 4 * 2**20
    assert bw["copy"] == pytest.approx(2 * nbytes / 1e9)
    assert bw["triad"] == pytest.approx(3 * nbytes / 1e9)
    assert bw["scale"] == pytest.approx(2 * bench_module.SCALE_PASSES * nbytes / 1e9)


@pytest.mark.parametrize(("storage", "bytes_per_cell"), [("fp32", 72), ("fp16s", 36)])
def test_bench_reports_mlups_and_bytes_per_cell(storage, bytes_per_cell):
    import jax

    r = bench("D2Q9", 32, storage, steps=3, repeats=2, bandwidth=10.0)
    # by default the grid is split over the local devices (32 divides by 2)
    assert r["devices"] == jax.local_device_count()
    assert r["bytes_per_cell"] == bytes_per_cell
    assert r["cells"] == 32 * 32
    assert r["mlups"] > 0
    assert r["roofline_mlups"] == pytest.approx(10e9 / bytes_per_cell / 1e6)
    assert r["roofline_fraction"] == pytest.approx(r["mlups"] / r["roofline_mlups"])
    json.dumps(r)  # JSON-ready
    table = format_table([r])
    assert r["storage"] in table and "MLUPs" in table
    assert r["flow"].startswith("Taylor-Green") and "Taylor-Green" in table


@pytest.mark.parametrize("d", [2, 3])
def test_bench_flow_is_a_divergence_free_vortex_field(d):
    from lbm_jax.bench import taylor_green_velocity

    u = taylor_green_velocity(d, 16)
    assert u.shape == (d, *(16,) * d)
    assert np.max(np.abs(u)) == pytest.approx(0.05)
    # periodic central differences of this field cancel exactly
    div = sum(np.roll(u[a], -1, axis=a) - np.roll(u[a], 1, axis=a) for a in range(d))
    assert np.max(np.abs(div)) < 1e-12


def test_bench_runs_on_one_device_when_the_grid_does_not_divide():
    # (the default split over the local devices: test_bench_reports_mlups_...)
    r1 = bench("D2Q9", 33, "fp32", steps=2, repeats=1, bandwidth=10.0)
    assert r1["devices"] == 1  # 33 is not divisible by 2 devices
    with pytest.raises(ValueError, match="devices"):
        bench("D2Q9", 32, "fp32", steps=2, devices=64, bandwidth=10.0)


def test_bench_reports_the_decomposition_and_its_halo_traffic():
    import jax

    if jax.local_device_count() < 2:
        pytest.skip("needs two devices (tests/conftest.py sets two host devices)")
    r = bench("D3Q19", 8, "fp16s", steps=2, repeats=1, devices=(1, 2, 1), bandwidth=1.0)
    assert r["devices"] == 2 and r["decomposition"] == [1, 2, 1]
    # two blocks, each sends two y-layers of (8 + 2) x 8 cells, 19 values of 2 B
    assert r["halo_bytes"] == 2 * 2 * 10 * 8 * 19 * 2
    one = bench("D3Q19", 8, "fp16c", steps=2, repeats=1, devices=1, bandwidth=1.0)
    assert one["decomposition"] == [1, 1, 1] and one["halo_bytes"] == 0
    assert one["bytes_per_cell"] == 2 * 19 * 2 and one["lattice"] == "D3Q19"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"lattice": "D2Q7"}, "lattice"),
        ({"storage": "fp7"}, "storage"),
        ({"n": 2}, "n must"),
        ({"repeats": 0}, "repeats"),
        ({"steps": 0}, "steps"),
    ],
)
def test_bench_rejects_bad_arguments(kwargs, match):
    args = {"lattice": "D2Q9", "n": 16, "storage": "fp32", **kwargs}
    with pytest.raises(ValueError, match=match):
        bench(args.pop("lattice"), args.pop("n"), args.pop("storage"), **args)


@pytest.fixture(scope="module")
def cli_pair(tmp_path_factory):
    """One ``python -m lbm_jax bench`` run, shared by the CLI tests: two storages
    side by side over three rounds, the grid split in y over two devices."""
    import contextlib
    import io

    path = tmp_path_factory.mktemp("bench") / "pair.json"
    argv = ["bench", "--lattice", "D2Q9", "--n", "16", "--steps", "2", "--repeats"]
    argv += ["1", "--storage", "fp16s,fp32", "--rounds", "3", "--devices", "1x2"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main([*argv, "--json", str(path)])
    return code, json.loads(path.read_text()), out.getvalue()


def test_cli_bench_writes_json(cli_pair):
    code, report, out = cli_pair
    assert code == 0
    by_name = {r["storage"]: r for r in report["results"]}
    r = by_name["FP32/FP32"]
    assert r["mlups"] > 0 and r["bytes_per_cell"] == 72
    assert report["bandwidth_gbs"] > 0
    assert "roofline" in out


def test_cli_bench_reports_the_split_and_its_halo_traffic(cli_pair):
    _, report, _ = cli_pair
    for result in report["results"]:
        assert result["decomposition"] == [1, 2] and result["devices"] == 2
        # two blocks, two y-layers of (16 + 2) cells, 9 values each
        assert result["halo_bytes"] == 2 * 2 * 18 * 9 * result["bytes_per_cell"] // 18


def test_cli_bench_compares_storages_side_by_side_over_rounds(cli_pair):
    _, report, out = cli_pair
    assert report["rounds"] == 3
    by_name = {r["storage"]: r for r in report["results"]}
    assert set(by_name) == {"FP32/FP16S", "FP32/FP32"}
    fp32, fp16s = by_name["FP32/FP32"], by_name["FP32/FP16S"]
    assert len(fp16s["mlups_rounds"]) == 3
    # The reported figure is the median round, and ratios pair rounds one to one.
    assert fp16s["mlups"] == sorted(fp16s["mlups_rounds"])[1]
    pairs = zip(fp16s["mlups_rounds"], fp32["mlups_rounds"], strict=True)
    expected = [a / b for a, b in pairs]
    assert fp16s["vs_fp32_rounds"] == pytest.approx(expected)
    assert fp16s["vs_fp32"] == pytest.approx(sorted(expected)[1])
    assert fp32["vs_fp32"] == 1.0
    assert "vs FP32" in out


def test_cli_bench_rejects_bad_rounds_and_storage_lists():
    base = ["bench", "--lattice", "D2Q9", "--n", "32"]
    for extra in (["--rounds", "0"], ["--storage", "fp32,fp7"]):
        with pytest.raises(SystemExit) as exc:
            main([*base, *extra])
        assert exc.value.code == 2
    with pytest.raises(SystemExit):
        main([*base, "--storage", "fp32,fp16s", "--devices", "3x1"])


def test_bench_all_compiles_each_configuration_once_over_rounds(monkeypatch):
    from lbm_jax import bench as bench_module

    built = []  # each configuration initialises its flow once, when it is built
    original = bench_module.taylor_green_velocity

    def counting(d, n, *args):
        built.append((d, n))
        return original(d, n, *args)

    monkeypatch.setattr(bench_module, "taylor_green_velocity", counting)
    report = bench_module.bench_all(
        problems=(("D2Q9", 16),),
        storages=("fp32", "fp16s"),
        steps=2,
        repeats=1,
        rounds=3,
        collision="trt",
        bandwidth_mib=4,
    )
    assert built == [(2, 16), (2, 16)]  # two policies, three rounds
    by_name = {r["storage"]: r for r in report["results"]}
    assert len(by_name["FP32/FP16S"]["vs_fp32_rounds"]) == 3
    assert by_name["FP32/FP32"]["vs_fp32_rounds"] == [1.0, 1.0, 1.0]
    assert all(r["collision"] == "trt" for r in report["results"])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"collision": "mrt"}, "collision"),
        ({"updates": 0}, "updates"),
        ({"rounds": 0}, "rounds"),
        ({"problems": (("D2Q7", 16),)}, "lattice"),
        ({"repeats": 0}, "repeats"),
    ],
)
def test_bench_all_refuses_bad_arguments_before_measuring(monkeypatch, kwargs, match):
    from lbm_jax import bench as bench_module

    def measured(**_):
        raise AssertionError("measured before validating")

    monkeypatch.setattr(bench_module, "measure_bandwidth", measured)
    args = {"problems": (("D2Q9", 16),), "storages": ("fp32",), **kwargs}
    with pytest.raises(ValueError, match=match):
        bench_module.bench_all(**args)


def test_steps_for_gives_about_the_requested_updates():
    from lbm_jax.bench import steps_for

    assert steps_for(128**3, 2e7) == 10
    assert steps_for(10**9) == 4  # at least four steps


def test_free_surface_bench_reports_ratios_and_fails_below_its_target(tmp_path):
    from lbm_jax import bench_free_surface

    out = tmp_path / "fs.json"
    args = ["--n", "16", "--storage", "fp32", "--steps", "2", "--repeats", "1"]
    args += ["--rounds", "2", "--json", str(out)]
    assert bench_free_surface.main([*args, "--target", "1e-9"]) == 0
    (row,) = json.loads(out.read_text())["results"]
    assert row["storage"] == "FP32/FP32" and len(row["ratios"]) == 2
    pairs = zip(row["free_surface_mlups"], row["plain_mlups"], strict=True)
    assert row["ratio"] == pytest.approx(statistics.median(a / b for a, b in pairs))
    assert 0 < row["free_surface"] and 0 < row["plain"]
    assert bench_free_surface.main([*args, "--target", "1e9"]) == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--n", "8"], "n must be an integer >= 16"),
        (["--storage", "fp13"], "fp13"),
        (["--backend", "fast"], "invalid choice"),
        (["--target", "0"], "--target must be a positive ratio"),
    ],
)
def test_free_surface_bench_refuses_bad_input(argv, message, capsys):
    from lbm_jax import bench_free_surface

    with pytest.raises(SystemExit) as err:
        bench_free_surface.main(argv)
    assert err.value.code == 2 and message in capsys.readouterr().err


def test_free_surface_bench_refuses_the_gpu_kernel_without_a_gpu(capsys):
    """``--backend gpu`` off a GPU stops with the reason before anything compiles."""
    from lbm_jax import bench_free_surface
    from lbm_jax.step import _gpu

    if _gpu.available():
        pytest.skip("a GPU is present")
    with pytest.raises(SystemExit) as err:
        bench_free_surface.main(["--n", "16", "--backend", "gpu"])
    message = capsys.readouterr().err
    assert err.value.code == 2 and "backend='gpu' is not available" in message
    assert "not a GPU" in message
