"""The guides' examples run (docs/), with what they print and compute checked.

Every docstring example runs in tests/test_docs_site.py, every README block too.
"""

import doctest
import importlib
import math

import numpy as np
import pytest

from tests._docs import DOCS, block_after


def test_the_driver_documents_a_coupled_step():
    assert (
        doctest.testmod(importlib.import_module("lbm_jax.runs._driver")).attempted >= 10
    )


def test_guide_coupled_step_example_runs(capsys):
    namespace: dict = {}
    exec(block_after(DOCS / "lbm/coupled.md", "# Coupled physics"), namespace)
    result = namespace["result"]
    np.testing.assert_array_equal(result.samples.steps, np.arange(20, 201, 20))
    x = result.samples.values[:, 0]
    assert np.all(np.diff(x) > 0) and x[-1] > 8.0
    assert "[ 20  40" in capsys.readouterr().out


def test_guide_immersed_boundary_example_runs(capsys):
    namespace: dict = {}
    exec(block_after(DOCS / "lbm/capsule.md", "# Immersed boundary"), namespace)
    nodes = np.asarray(namespace["result"].state.nodes)
    assert nodes.shape == (642, 3) and np.all(np.isfinite(nodes))
    assert "(642, 3)" in capsys.readouterr().out


def test_guide_free_surface_example_runs(capsys):
    namespace: dict = {}
    exec(block_after(DOCS / "lbm/free_surface.md", "# Free surface"), namespace)
    mass = np.asarray(namespace["result"].samples.values, np.float64)
    assert mass.shape == (4,)
    np.testing.assert_allclose(mass, mass[0], rtol=1e-6)
    assert abs(mass[0] / (np.pi * 12.0**2) - 1.0) < 0.01
    assert capsys.readouterr().out.strip()


def test_guide_profile_example_runs(capsys):
    namespace: dict = {}
    exec(
        block_after(DOCS / "mixed_precision/profiling.md", "# Number-range"), namespace
    )
    report, policy, scale = (namespace[k] for k in ("report", "policy", "scale"))
    assert report.records and "|" in capsys.readouterr().out
    assert policy.compute_dtype is not None
    assert scale >= 1.0 and math.log2(scale).is_integer()


def test_guide_range_probe_example_runs(capsys):
    namespace: dict = {}
    exec(
        block_after(DOCS / "mixed_precision/profiling.md", "`mpjax.RangeProbe` takes"),
        namespace,
    )
    below = namespace["below"]
    assert len(below) == 20 and below[0] == 0.0 and below[-1] == 1.0
    assert "at step 12: 17%" in capsys.readouterr().out


@pytest.mark.standard_promotion  # optax.adam promotes internally
def test_guide_fp8_example_runs():
    namespace: dict = {}
    exec(block_after(DOCS / "mixed_precision/fp8.md", "# fp8 with delayed"), namespace)
    metrics = namespace["metrics"]
    assert np.isfinite(float(metrics["loss"])) and int(namespace["state"].step) == 1


def test_guide_domain_split_example_runs():
    namespace: dict = {}
    exec(block_after(DOCS / "lbm/multi_device.md", "# Splitting a grid"), namespace)
    assert namespace["sim"].decomposition == (2, 1, 1)
    assert isinstance(namespace["rho"], np.ndarray)
    np.testing.assert_allclose(namespace["rho"], 1.0, rtol=1e-6)


def test_guide_data_parallel_example_runs():
    namespace: dict = {}
    exec(
        block_after(DOCS / "mixed_precision/data_parallel.md", "# Data parallel"),
        namespace,
    )
    state = namespace["state"]
    assert int(state.step) == 1 and not bool(namespace["metrics"]["skipped"])
    assert len(state.params["w"].sharding.device_set) == 2


def test_guide_walls_and_lid_example_runs(capsys):
    namespace: dict = {}
    exec(
        block_after(DOCS / "lbm/boundaries.md", "## Walls and a moving lid"), namespace
    )
    sim, u = namespace["sim"], namespace["u"]
    n = namespace["n"]
    assert sim.backend in ("gpu", "native", "xla") and u.shape == (2, n + 2, n + 2)
    # dragged along under the lid, a return flow near the floor, walls at rest
    assert 0.02 < u[0, n // 2, n] < 0.05 and u[0, n // 2, 2] < 0
    assert np.all(u[:, 0, :] == 0) and np.all(u[:, :, 0] == 0)
    assert "u below the lid 0.0" in capsys.readouterr().out


@pytest.mark.standard_promotion
def test_guide_orbax_snippet_runs_as_written(tmp_path, monkeypatch):
    # the guide's checkpoint recipe, run in a fresh folder with a relative name
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
    code = block_after(
        DOCS / "mixed_precision/loss_scaling.md", "## Checkpoints with orbax"
    )
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


def test_guide_first_gradient_example_runs(capsys):
    namespace: dict = {}
    exec(block_after(DOCS / "lbm/gradients.md", "## A first gradient"), namespace)
    grad = float(capsys.readouterr().out.strip().strip("[]"))
    energy = float(namespace["energy"](0.05))
    np.testing.assert_allclose(grad, 2 * energy / 0.05, rtol=1e-2)


@pytest.mark.slow  # a gradient and a run: about 20 s on two busy cores
def test_guide_gray_obstacle_example_runs(capsys):
    namespace: dict = {}
    exec(
        block_after(DOCS / "lbm/gradients.md", "## A differentiable geometry"),
        namespace,
    )
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "True"
    rate, opened = (float(v) for v in lines[1].split())
    assert opened > rate > 0
    assert namespace["channel"].backend == "xla"


@pytest.mark.slow
def test_guide_lid_speed_and_ensemble_example_runs(capsys):
    namespace: dict = {}
    exec(block_after(DOCS / "lbm/gradients.md", "## A first gradient"), namespace)
    exec(block_after(DOCS / "lbm/gradients.md", "Every array a simulation"), namespace)
    lines = capsys.readouterr().out.strip().splitlines()
    assert float(lines[1]) > 0  # a faster lid turns the vortex harder
    strengths = np.asarray(
        namespace["jax"].vmap(namespace["vortex_strength"])(
            namespace["jnp"].array([0.02, 0.05, 0.08])
        )
    )
    assert np.all(np.diff(strengths) > 0)
    exec(
        block_after(DOCS / "lbm/gradients.md", "are differentiated **emulated**"),
        namespace,
    )
    assert namespace["sim16c"].storage.storage_dtype == np.float32
