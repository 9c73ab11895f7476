"""Documentation examples run: every lbm_jax docstring and the README's examples."""

import doctest
import importlib
import math
import pkgutil
import re
import textwrap
from pathlib import Path

import numpy as np
import pytest

import lbm_jax

MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(lbm_jax.__path__, "lbm_jax.")
    if not m.name.endswith("__main__")
)


@pytest.mark.parametrize("name", ["lbm_jax", *MODULES])
def test_docstring_examples_run(name):
    result = doctest.testmod(importlib.import_module(name), verbose=False)
    assert result.failed == 0


def test_the_driver_documents_a_coupled_step():
    assert doctest.testmod(importlib.import_module("lbm_jax._run")).attempted >= 10


def _readme_block(heading: str) -> str:
    text = (Path(__file__).parents[2] / "README.md").read_text()
    section = text[text.index(heading) :]
    return textwrap.dedent(re.search(r"```python\n(.*?)```", section, re.S).group(1))


def test_readme_coupled_step_example_runs(capsys):
    namespace: dict = {}
    exec(_readme_block("### Coupled physics"), namespace)
    result = namespace["result"]
    np.testing.assert_array_equal(result.samples.steps, np.arange(20, 201, 20))
    x = result.samples.values[:, 0]
    assert np.all(np.diff(x) > 0) and x[-1] > 8.0
    assert "[ 20  40" in capsys.readouterr().out


def test_readme_immersed_boundary_example_runs(capsys):
    namespace: dict = {}
    exec(_readme_block("### Immersed boundary"), namespace)
    nodes = np.asarray(namespace["result"].state.nodes)
    assert nodes.shape == (642, 3) and np.all(np.isfinite(nodes))
    assert "(642, 3)" in capsys.readouterr().out


def test_readme_free_surface_example_runs(capsys):
    namespace: dict = {}
    exec(_readme_block("### Free surface"), namespace)
    mass = np.asarray(namespace["result"].samples.values, np.float64)
    assert mass.shape == (4,)
    np.testing.assert_allclose(mass, mass[0], rtol=1e-6)
    assert abs(mass[0] / (np.pi * 12.0**2) - 1.0) < 0.01
    assert capsys.readouterr().out.strip()


def test_readme_profile_example_runs(capsys):
    namespace: dict = {}
    exec(_readme_block("- **Number-range profiling**"), namespace)
    report, policy, scale = (namespace[k] for k in ("report", "policy", "scale"))
    assert report.records and "|" in capsys.readouterr().out
    assert policy.compute_dtype is not None
    assert scale >= 1.0 and math.log2(scale).is_integer()


def test_readme_range_probe_example_runs(capsys):
    namespace: dict = {}
    exec(_readme_block("`mpjax.RangeProbe` takes"), namespace)
    below = namespace["below"]
    assert len(below) == 20 and below[0] == 0.0 and below[-1] == 1.0
    assert "at step 12: 17%" in capsys.readouterr().out


@pytest.mark.standard_promotion  # optax.adam promotes internally
def test_readme_fp8_example_runs():
    namespace: dict = {}
    exec(_readme_block("- **fp8 with delayed scaling**"), namespace)
    metrics = namespace["metrics"]
    assert np.isfinite(float(metrics["loss"])) and int(namespace["state"].step) == 1


def test_readme_domain_split_example_runs():
    namespace: dict = {}
    exec(_readme_block("### Splitting a grid over devices and processes"), namespace)
    assert namespace["sim"].decomposition == (2, 1, 1)
    assert isinstance(namespace["rho"], np.ndarray)
    np.testing.assert_allclose(namespace["rho"], 1.0, rtol=1e-6)


def test_readme_data_parallel_example_runs():
    namespace: dict = {}
    exec(_readme_block("- **Data parallel and several processes**"), namespace)
    state = namespace["state"]
    assert int(state.step) == 1 and not bool(namespace["metrics"]["skipped"])
    assert len(state.params["w"].sharding.device_set) == 2


def test_readme_walls_and_lid_example_runs(capsys):
    namespace: dict = {}
    exec(_readme_block("### Walls and a moving lid"), namespace)
    sim, u = namespace["sim"], namespace["u"]
    n = namespace["n"]
    assert sim.backend in ("gpu", "native", "xla") and u.shape == (2, n + 2, n + 2)
    # dragged along under the lid, a return flow near the floor, walls at rest
    assert 0.02 < u[0, n // 2, n] < 0.05 and u[0, n // 2, 2] < 0
    assert np.all(u[:, 0, :] == 0) and np.all(u[:, :, 0] == 0)
    assert "u below the lid 0.0" in capsys.readouterr().out


@pytest.mark.standard_promotion
def test_readme_orbax_snippet_runs_as_written(tmp_path, monkeypatch):
    # the README's checkpoint recipe, run in a fresh folder with a relative name
    import jax
    import jax.numpy as jnp
    import optax

    import mpjax

    monkeypatch.chdir(tmp_path)
    x = jax.random.normal(jax.random.PRNGKey(3), (32, 4))
    batches = [{"x": x, "y": x @ jnp.arange(4.0)}] * 6

    def mse(params, batch):
        return jnp.mean(jnp.square(batch["x"] @ params["w"] - batch["y"]))

    opt = mpjax.dynamic_loss_scaling(optax.adam(0.01))
    step = jax.jit(mpjax.make_train_step(mse, opt, "mixed_float16"))
    fresh = mpjax.TrainState.create({"w": jnp.zeros(4)}, opt)
    code = _readme_block("- **Checkpoints** with orbax")
    namespace = {"jax": jax, "state": fresh, "batches": batches, "step": step}
    exec(code, namespace)
    assert int(namespace["state"].step) == 6
    assert (tmp_path / "ckpt").is_dir()
    again = {"jax": jax, "state": fresh, "batches": batches, "step": step}
    exec(code, again)  # resumes from the newest checkpoint and finishes the run
    assert int(again["state"].step) == 6
    np.testing.assert_array_equal(
        again["state"].params["w"], namespace["state"].params["w"]
    )
