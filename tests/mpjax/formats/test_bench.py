"""The throughput benchmark script at a tiny size (timings are not asserted)."""

from __future__ import annotations

import json
import statistics

import jax.numpy as jnp
import numpy as np
import pytest

from experiments import bench_formats
from mpjax import formats


@pytest.fixture(scope="module")
def result():
    return bench_formats.bench(2**10, repeats=2, names=["float16", "fp16c"])


def test_bench_reports_every_requested_format(result):
    assert [r["name"] for r in result["rows"]] == ["float16", "fp16c"]
    assert result["n"] == 2**10 and result["repeats"] == 2
    for r in result["rows"]:
        assert r["encode_ms"] > 0 and r["decode_ms"] > 0 and result["copy_ms"] > 0
        assert r["ratio"] == pytest.approx(r["total_ms"] / result["copy_ms"])
        assert r["target"] == bench_formats.TARGETS[r["name"]]
        assert r["meets_target"] == (r["ratio_paired"] <= r["target"])
        assert r["bytes_per_value"] == 2
        assert r["floor"] == 1.5
    assert len(result["baseline_gbs_rounds"]) == 2
    assert result["baseline_gbs"] == statistics.median(result["baseline_gbs_rounds"])
    assert result["copy_ms"] == pytest.approx(
        1e3 * 2 * 4 * 2**10 / (1e9 * result["baseline_gbs"])
    )


def test_bench_baseline_is_the_stream_copy_run_in_every_round(monkeypatch):
    # The baseline is lbm_jax.bench's STREAM copy (a preallocated output, so
    # bandwidth-bound), run once per round between the codec timings.
    events = []
    copy_gbs = iter([5.0, 15.0, 10.0])

    def fake_stream(*, size_mib, repeats, kernels):
        events.append(("stream", size_mib, repeats))
        assert kernels == ("copy",)  # the baseline pays for the copy alone
        return {"copy": next(copy_gbs)}

    real_in_place = bench_formats.in_place

    def logged_in_place(fmt, x):
        def logged(fn):
            def call():
                events.append("codec")
                return fn()

            return call

        return tuple(logged(fn) for fn in real_in_place(fmt, x))

    monkeypatch.setattr(bench_formats, "stream_bandwidths", fake_stream)
    monkeypatch.setattr(bench_formats, "in_place", logged_in_place)
    result = bench_formats.bench(2**18, repeats=3, names=["float16", "fp16c"])
    # 2**18 float32 values are 1 MiB: the copy runs on arrays of that size
    warm_up = ["codec"] * 4
    one_round = [("stream", 1, 1), "codec", "codec", "codec", "codec"]
    assert events == warm_up + one_round * 3
    assert result["baseline_gbs_rounds"] == [5.0, 15.0, 10.0]
    assert result["baseline_gbs"] == 10.0
    assert result["copy_ms"] == pytest.approx(1e3 * 2 * 4 * 2**18 / 10e9)


def test_in_place_codecs_reuse_their_output_buffers():
    x = jnp.linspace(-1.0, 1.0, 4096, dtype=np.float32)
    for name in ("float16", "posit16"):
        fmt = formats.get_format(name)
        run_encode, run_decode = bench_formats.in_place(fmt, x)
        codes, values = run_encode(), run_decode()
        pointers = (codes.unsafe_buffer_pointer(), values.unsafe_buffer_pointer())
        codes, values = run_encode(), run_decode()
        assert (codes.unsafe_buffer_pointer(), values.unsafe_buffer_pointer()) == (
            pointers
        )
        np.testing.assert_array_equal(
            np.asarray(codes).view(np.uint16),
            np.asarray(fmt.encode(x)).view(np.uint16),
        )
        np.testing.assert_array_equal(values, fmt.decode(fmt.encode(x)))


def test_targets_are_not_below_the_memory_bound_floor():
    # encode + decode of b bytes per value moves 4 + 2 b + 4 bytes, a copy 8.
    for name, target in bench_formats.TARGETS.items():
        itemsize = formats.get_format(name).storage_dtype.itemsize
        assert target >= 1 + itemsize / 4, name


def test_bench_table_has_a_row_per_format(result):
    lines = bench_formats.table(result).splitlines()
    assert lines[0].startswith("n = 1,024 float32 values")
    assert f"{result['baseline_gbs']:.1f} GB/s" in lines[0]
    assert "STREAM copy" in lines[0]
    assert [ln.split("|")[1].strip() for ln in lines[4:]] == ["float16", "fp16c"]


def test_bench_rejects_bad_arguments():
    with pytest.raises(ValueError, match="n must be a positive int, got 0"):
        bench_formats.bench(0)
    with pytest.raises(ValueError, match="repeats must be a positive int"):
        bench_formats.bench(16, repeats=0)
    with pytest.raises(ValueError, match="unknown number format 'fp99'"):
        bench_formats.bench(16, names=["fp99"])


def test_bench_command_line_writes_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    code = bench_formats.main(
        ["--log2n", "8", "--repeats", "1", "--formats", "posit16", "--json", str(out)]
    )
    data = json.loads(out.read_text())
    assert [r["name"] for r in data["rows"]] == ["posit16"]
    assert data["baseline_gbs"] > 0 and data["baseline"] == bench_formats.BASELINE
    # the exit status reports the stated target (timing on a shared machine)
    assert code == (
        0 if all(r["meets_target"] is not False for r in data["rows"]) else 1
    )
    assert "| posit16 | 16 |" in capsys.readouterr().out
