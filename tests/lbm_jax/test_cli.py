"""The command-line contract: outputs of ``run``, validation with exit code 2."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from lbm_jax import get_storage
from lbm_jax.__main__ import build_parser, main
from lbm_jax.cases import CASE_INFO, CASES, CLI_OPTIONS, case_defaults, prepare_case

SUMMARY_KEYS = {
    "case",
    "lattice",
    "storage",
    "shift",
    "steps",
    "u_ref",
    "mlups",
    "step_backend",
}


def error_line(err: str) -> str:
    """The message of a refused command line: ``error: <message>`` comes first,
    then one line that points to ``--help`` (no usage block)."""
    first, hint, *rest = err.splitlines()
    assert first.startswith("error: ") and not rest, err
    assert re.fullmatch(r"\(python -m lbm_jax(?: \S+)? --help for usage\)", hint), err
    return first


@pytest.mark.parametrize(
    ("argv", "rho_shape", "u_shape", "metrics"),
    [
        (
            ["poiseuille", "--n", "8", "--steps", "50"],
            (4, 8),
            (2, 4, 8),
            {"l2_error", "slip"},
        ),
        (
            ["taylor_green", "--n", "16", "--steps", "20", "--storage", "fp16s"],
            (16, 16),
            (2, 16, 16),
            {"l2_error", "decay_rate_error"},
        ),
        (
            ["cavity", "--n", "16", "--steps", "50", "--no-shift"],
            (16, 16),
            (2, 16, 16),
            {"ghia_max_error", "u_min_centre"},
        ),
        (
            ["cylinder", "--n", "4", "--steps", "40", "--u-ref", "0.1"],
            (90, 18),
            (2, 90, 18),
            {"strouhal", "cd_max", "cl_max"},
        ),
    ],
)
def test_cli_run_writes_fields_summary_and_png(
    tmp_path, capsys, argv, rho_shape, u_shape, metrics
):
    out = tmp_path / "out"
    assert main(["run", *argv, "--out", str(out)]) == 0
    with np.load(out / "fields.npz") as data:
        assert data["rho"].shape == rho_shape
        assert data["u"].shape == u_shape
        assert np.all(np.isfinite(data["u"]))
    summary = json.loads((out / "summary.json").read_text())
    assert SUMMARY_KEYS | metrics <= set(summary)
    assert summary["case"] == argv[0]
    assert summary["steps"] == int(argv[argv.index("--steps") + 1])
    # the storage and the shift as given (FP32/FP32, shifted, by default)
    storage = argv[argv.index("--storage") + 1] if "--storage" in argv else "fp32"
    assert summary["storage"] == get_storage(storage).name
    assert summary["shift"] is ("--no-shift" not in argv)
    if argv[0] == "cavity":
        assert summary["u_ref"] == pytest.approx(0.1)
    assert list(out.glob("*.png"))
    assert (out / "fields.vti").stat().st_size > 0
    # A short summary for people; the full one stays in summary.json.
    printed = capsys.readouterr().out
    assert '"case"' not in printed
    assert len(printed.splitlines()) <= 9
    n = argv[argv.index("--n") + 1]
    assert f"--n {n} = {CASE_INFO[argv[0]].n}" in printed
    assert f"{summary['steps']} steps, storage {summary['storage']}" in printed
    assert f"full summary: {out / 'summary.json'}" in printed
    assert f"wrote {out / 'fields.npz'}" in printed
    assert summary["step_backend"] in ("native", "xla", "gpu")
    # one line: which step ran and, where not the backend's fused step, why
    lines = printed.splitlines()
    (step_line,) = [x for x in lines if re.match(r"(native|xla|gpu) step", x)]
    assert step_line.startswith(f"{summary['step_backend']} step")
    if summary["step_reason"] is None:
        assert summary["step_backend"] in ("native", "gpu")
    else:
        assert step_line.endswith(f" step: {summary['step_reason']}")
    for key in metrics & set(CASE_INFO[argv[0]].results):
        assert f"{key} " in printed


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "nosuchcase", "--out", "X"], "invalid choice"),
        (["run", "cavity", "--storage", "fp7", "--out", "X"], "Unknown storage"),
        (["run", "cavity", "--n", "3", "--out", "X"], "at least 8"),
        (["run", "cavity", "--re", "1e7", "--n", "16", "--out", "X"], "tau"),
        (["run", "cavity", "--re", "-5", "--out", "X"], "positive"),
        (["run", "cavity", "--u-ref", "0.4", "--out", "X"], "Mach"),
        (["run", "poiseuille", "--lattice", "D3Q19", "--out", "X"], "Unknown option"),
        (["run", "cavity", "--steps", "0", "--out", "X"], "steps"),
        (["run", "cavity"], "--out"),
        (["bench", "--storage", "fp7"], "Unknown storage"),
        (["bench", "--lattice", "D4Q1"], "lattice"),
        (["bench", "--n", "2"], "at least 4"),
        (["bench", "--n", "33", "--devices", "2"], "dividing"),
    ],
)
def test_cli_bad_input_exits_2_with_message(tmp_path, capsys, argv, message):
    argv = [str(tmp_path / a) if a == "X" else a for a in argv]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in error_line(capsys.readouterr().err)
    assert not (tmp_path / "X").exists()


def test_cli_refuses_non_empty_out_dir_unless_overwrite(tmp_path, capsys):
    out = tmp_path / "prev"
    out.mkdir()
    (out / "keep.txt").write_text("previous results")
    argv = ["run", "taylor_green", "--n", "8", "--steps", "2", "--out", str(out)]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "--overwrite" in capsys.readouterr().err
    assert not (out / "summary.json").exists()
    # the run that overwrites goes through ``python -m lbm_jax`` (the entry point)
    cmd = [sys.executable, "-m", "lbm_jax", *argv, "--overwrite"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "summary.json").read_text())["steps"] == 2
    assert (out / "keep.txt").read_text() == "previous results"


@pytest.mark.parametrize("command", ["run", "bench"])
def test_cli_help_shows_every_default(capsys, command):
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    options = capsys.readouterr().out.split("options:\n")[1].split("\n\n")[0]
    entries = re.split(r"\n(?=  -)", options)
    assert len(entries) > 8
    for entry in entries:
        if not entry.lstrip().startswith("-h"):
            assert "(default: " in " ".join(entry.split()), entry


def test_cli_run_help_says_what_n_means_and_the_defaults_per_case(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run", "--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # undo the wrapping
    assert "the cylinder diameter for the cylinder cases" in text
    for case, info in CASE_INFO.items():
        defaults = case_defaults(case)
        assert f"{case} --n {defaults['n']} = {info.n}" in text
        assert f"--steps {defaults['steps']}" in text
    cylinder = case_defaults("cylinder")
    assert cylinder["n"] == prepare_case("cylinder").n == 20
    assert "--re 100, --collision bgk, --u-ref 0.05, --run-times 60" in text
    assert "--lattice LATTICE lattice (D2Q9, D3Q19, D3Q27;" in text


def test_cli_summary_says_what_n_meant_for_this_run_only(tmp_path, capsys):
    # the 3-D default of the cavity belongs to --help, not to a 2-D run's summary
    argv = ["run", "cavity", "--n", "8", "--steps", "2", "--out", str(tmp_path)]
    assert main(argv) == 0
    assert "--n 8 = cavity side (cells), Re 100\n" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert (
        "cavity --n 128 = cavity side (cells) [32 by default on a 3-D lattice]" in text
    )


def test_capillary_wave_refusal_names_flags_that_exist(tmp_path, capsys):
    argv = ["run", "capillary_wave", "--steps", "5", "--out", str(tmp_path / "w")]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = error_line(capsys.readouterr().err)
    assert "the frequency fit needs at least 8: give --steps >=" in err
    assert "raise samples" not in err  # no such flag
    usage = build_parser().commands["run"].format_usage()
    named = set(re.findall(r"--[a-z-]+", err))
    assert named and all(flag in usage for flag in named), named


def test_raindrop_summary_line_shows_whether_tau_was_raised():
    from types import SimpleNamespace

    from lbm_jax.cli._commands import short_summary

    summary = {
        "case": "raindrop", "lattice": "D3Q19", "n": 20, "steps": 10, "shift": True,
        "storage": "FP32/FP32", "collision": "bgk", "mlups": 1.0, "warnings": [],
        "crown_exponent": None, "time_ms": 0.5, "tau_raised": True,
    }  # fmt: skip
    fields = {"rho": np.zeros((4, 4, 4))}
    text = short_summary(SimpleNamespace(summary=summary, fields=fields), 1.0)
    assert "tau_raised yes" in text and "crown_exponent n/a" in text


def test_cli_bench_help_lists_the_lattices(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    assert "D2Q9, D3Q19, D3Q27 (default: D3Q19" in capsys.readouterr().out


@pytest.mark.parametrize("case", CASES)
def test_cli_options_name_exactly_the_cases_that_take_them(case):
    def refused(**kwargs):
        try:
            prepare_case(case, **kwargs)
        except (ValueError, TypeError) as err:
            return "Unknown option" in str(err) or "takes no Reynolds" in str(err)
        return False

    assert refused(re=50.0) is not CASE_INFO[case].re
    for name, option in CLI_OPTIONS.items():
        value = option.choices[0] if option.choices else option.type(8)
        assert refused(**{name: value}) is (case not in option.cases), name


def test_cli_cavity_runs_on_d3q27(tmp_path):
    out = tmp_path / "q27"
    argv = ["run", "cavity", "--lattice", "D3Q27", "--n", "8", "--steps", "4"]
    assert main([*argv, "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["lattice"] == "D3Q27" and summary["steps"] == 4


@pytest.mark.parametrize(
    "argv",
    [
        # the force is sampled every 3 steps, the amplitude every 2
        ["cylinder", "--n", "8", "--u-ref", "0.1", "--steps", "50"],
        ["taylor_green", "--n", "8", "--steps", "45"],
        ["cylinder", "--n", "8", "--u-ref", "0.1", "--steps", "50"]
        + ["--checkpoint-every", "7", "--progress"],
    ],
)
def test_cli_runs_exactly_the_steps_asked_for(tmp_path, argv):
    out = tmp_path / "o"
    assert main(["run", *argv, "--out", str(out)]) == 0
    steps = int(argv[argv.index("--steps") + 1])
    assert json.loads((out / "summary.json").read_text())["steps"] == steps
    with np.load(out / "fields.npz") as data:
        sampled = data["t"]
    assert sampled[-1] <= steps and steps % sampled[1] != 0  # a partial interval


def test_cli_warns_when_a_cylinder_run_is_too_short_for_strouhal(tmp_path, capsys):
    out = tmp_path / "short"
    argv = ["cylinder", "--n", "4", "--u-ref", "0.1", "--steps", "40"]
    assert main(["run", *argv, "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["strouhal"] is None
    (warning,) = summary["warnings"]
    assert "too short to measure the Strouhal number" in warning
    needed = prepare_case("cylinder", n=4, u_ref=0.1).steps  # the default length
    captured = capsys.readouterr()
    assert "warning: run too short to measure the Strouhal number" in captured.err
    assert f"give --steps {needed}, or --run-times 60" in captured.err
    assert "warnings: 1" in captured.out


def test_cli_summary_has_no_warnings_when_nothing_is_missing(tmp_path):
    out = tmp_path / "tg"
    assert (
        main(["run", "taylor_green", "--n", "8", "--steps", "5", "--out", str(out)])
        == 0
    )
    assert json.loads((out / "summary.json").read_text())["warnings"] == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["cylinder", "--radius", "3"], "Unknown option --radius for case 'cylinder'"),
        (["cylinder", "--u-ref", "0.3"], "peak inflow speed 1.5 --u-ref reaches"),
        (["cylinder", "--u-ref", "-1"], "--u-ref (the mean inflow speed) must be"),
        (["cylinder", "--re", "1e6"], "--re 1e+06 with --n 20, --u-ref 0.05 gives"),
        (["cylinder", "--run-times", "0"], "--run-times must be positive"),
        (
            ["cylinder_unconfined", "--width", "1"],
            "--width must be above 2 + 2 |offset| = 2.2",
        ),
        (["cylinder", "--n", "3"], "--n must be at least 4"),
        (["capsule", "--skalak-c", "-1"], "--skalak-c must be non-negative"),
        (["capsule", "--width", "3"], "--width must be at least 4, got 3"),
        (["capsule", "--ca", "1e-6"], "Raise --ca or lower --re"),
        (["static_drop", "--re", "5"], "Unknown option --re for case 'static_drop'"),
        (["taylor_green", "--u-ref", "0.5"], "vortex velocity --u-ref reaches"),
    ],
)
def test_cli_errors_name_flags_as_typed(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        main(["run", *argv, "--out", str(tmp_path / "x")])
    assert exc.value.code == 2
    error = error_line(capsys.readouterr().err)
    assert message in error
    # no parameter names (u_ref, samples_per_time) outside quoted case names
    unquoted = re.sub(r"'[^']*'", "", error)
    symbols = {"lbm_jax", "gamma_dot"}  # the program and the shear rate
    assert set(re.findall(r"\b[a-z]+(?:_[a-z]+)+\b", unquoted)) <= symbols
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--all", "--n", "64"], "--n cannot be combined with --all"),
        (["--all", "--storage", "fp16s"], "--storage cannot be combined with --all"),
        (["--all", "--lattice", "D2Q9"], "--lattice cannot be combined with --all"),
        (["--all", "--devices", "2"], "--devices cannot be combined with --all"),
        (["--devices", "2x1"], "one sub-domain count per axis (3 for"),
        (["--devices", "2y1"], "is not a device count (e.g. 2)"),
        (["--devices", "1x3x1"], "each dividing --n 128"),
    ],
)
def test_cli_bench_refuses_flags_a_mode_cannot_use(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        main(["bench", *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "storage", ["fp32", pytest.param("fp32,fp16s", marks=pytest.mark.slow)]
)
def test_cli_bench_collision_and_rounds_apply_in_every_mode(tmp_path, storage):
    path = tmp_path / "bench.json"
    argv = ["bench", "--lattice", "D2Q9", "--n", "16", "--steps", "2"]
    argv += ["--repeats", "1", "--storage", storage, "--collision", "trt"]
    assert main([*argv, "--rounds", "2", "--json", str(path)]) == 0
    report = json.loads(path.read_text())
    assert report["rounds"] == 2
    assert len(report["results"]) == len(storage.split(","))
    for result in report["results"]:
        assert result["collision"] == "trt"
        assert len(result["mlups_rounds"]) == 2


@pytest.mark.parametrize(
    ("argv", "suggestion"),
    [
        (["run", "cavity", "--nn", "32", "--out", "X"], "--nn (did you mean '--n'?)"),
        (["run", "cavty", "--out", "X"], "'cavty' (did you mean 'cavity'"),
        (["run", "cavity", "--colision", "bgk", "--out", "X"], "'--collision'"),
        (["run", "cavity", "--collision", "bkg", "--out", "X"], "mean 'bgk'?"),
        (["run", "cavity", "--storage", "fp16z", "--out", "X"], "mean 'fp16'"),
        (["run", "cavity", "--lattice", "D2Q8", "--out", "X"], "mean 'D2Q9'?"),
        (["bench", "--strage", "fp32"], "--strage (did you mean '--storage'"),
        (["bench", "--lattice", "D3Q91"], "(did you mean 'D3Q19'"),
        (["bench", "--backend", "nativ"], "(did you mean 'native'?)"),
    ],
)
def test_cli_mistyped_names_get_the_closest_ones(tmp_path, capsys, argv, suggestion):
    argv = [str(tmp_path / a) if a == "X" else a for a in argv]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert suggestion in error_line(capsys.readouterr().err)
    assert not (tmp_path / "X").exists()


def test_cli_error_comes_first_without_the_usage_block(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run", "cavity", "--n", "3"])
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert error_line(captured.err).startswith("error: run needs a case and --out")
    assert "usage:" not in captured.err


def test_cli_bench_refuses_a_box_beyond_the_memory_before_any_work(capsys, monkeypatch):
    from lbm_jax import bench

    def no_work(*args, **kwargs):
        raise AssertionError("the benchmark started before the memory check")

    monkeypatch.setattr(bench, "BenchRun", no_work)
    monkeypatch.setattr(bench, "measure_bandwidth", no_work)
    with pytest.raises(SystemExit) as exc:  # 8e9 cells of D3Q19: terabytes
        main(["bench", "--n", "2000"])
    assert exc.value.code == 2
    err = " ".join(error_line(capsys.readouterr().err).split())
    assert "at 201 bytes per cell (D3Q19, FP32/FP32 storage)" in err
    assert "Lower --n (about" in err
    # the library refuses it too, before building anything
    with pytest.raises(ValueError, match="bytes per cell"):
        bench.bench("D2Q9", 200_000)
    with pytest.raises(ValueError, match="bytes per cell"):
        bench.bench_all(problems=(("D3Q19", 2000),), storages=("fp16s",))


def test_cli_run_estimates_its_length_before_the_bulk_of_it(tmp_path, capsys):
    argv = ["run", "taylor_green", "--n", "8", "--steps", "300"]
    assert main([*argv, "--out", str(tmp_path / "tg")]) == 0
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if line.startswith("estimate: ")]
    # a warm-up hundredth (3 steps) and a timed one, then the estimate
    assert re.fullmatch(
        r"estimate: [\d.]+ (s|min|h) more for 294 steps \(1\.88e\+04 cell updates "
        r"at [\d.e+]+ MLUPs, measured on its second hundredth\)",
        line,
    ), line


def test_cli_capsule_defaults_are_sized_for_the_backend(tmp_path, capsys, monkeypatch):
    import jax

    import lbm_jax.cases as cases
    from lbm_jax.cases._common import device_defaults
    from lbm_jax.cli._commands import sized_defaults_note

    if jax.default_backend() != "cpu":
        pytest.skip("the CPU-sized defaults are checked on a CPU backend")
    assert device_defaults("capsule", gpu=False) == {"radius": 5.0}
    assert device_defaults("capsule", gpu=True) == {"radius": 12.0}  # the paper's
    defaults = case_defaults("capsule")
    assert defaults["radius"] == 5.0 and defaults["n"] == 50  # a 50^3 box
    assert prepare_case("capsule", radius=12.0).n == 120
    note = sized_defaults_note("capsule", {})
    assert note == (
        "capsule: CPU-sized defaults on this CPU backend: --radius 5 (on a GPU: "
        "--radius 12); give them to choose"
    )
    assert sized_defaults_note("capsule", {"radius": 8.0}) == ""
    assert sized_defaults_note("cavity", {}) == ""
    # stated in the help text ...
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "(on this CPU backend; [on a GPU] where the default depends on it)" in (
        help_text
    )
    assert "capsule --n 50 = channel height H" in help_text
    assert "--radius 5 [12 on a GPU]" in help_text

    # ... and in the run's first lines, before it runs
    def not_yet(*args, **kwargs):
        raise RuntimeError("the run started")

    monkeypatch.setattr(cases, "run_case", not_yet)
    with pytest.raises(RuntimeError, match="the run started"):
        main(["run", "capsule", "--out", str(tmp_path / "c")])
    assert capsys.readouterr().err.splitlines()[0] == note


def test_the_virtual_environment_of_the_readme_is_not_tracked():
    from pathlib import Path

    ignored = Path(__file__).parents[2].joinpath(".gitignore").read_text()
    assert ".venv/" in ignored.splitlines()
