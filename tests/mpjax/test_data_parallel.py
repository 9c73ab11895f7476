"""Tests for data-parallel train steps: mpjax.shard_state, shard_batch and friends.

Run on the two host devices that tests/conftest.py forces. The same problem on two
processes is test_data_parallel_processes.py; the tolerance of the comparisons
with a one-device run is explained in dp_worker.assert_close_to_reference. Loss
scales, skip counts and the parameters of a skipped step are compared exactly.
"""

from __future__ import annotations

import doctest

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec

import mpjax
from mpjax import _parallel
from tests.mpjax import dp_worker as problem

N_DEVICES = 2
POLICY = "mixed_float16"
# layout -> mesh axis type. Replication runs on jax.make_mesh's default axes
# (Explicit in jax 0.10) and relies on sharding propagation (plain jax.jit); FSDP
# needs Auto axes and passes in_shardings/out_shardings. The other two pairings
# are the slow test_either_jit_style_gives_the_documented_layout.
LAYOUTS = {"replicated": None, "fsdp": AxisType.Auto}


def _mesh(axis_type):
    if axis_type is None:
        return jax.make_mesh((N_DEVICES,), ("data",))
    return jax.make_mesh((N_DEVICES,), ("data",), axis_types=(axis_type,))


def _jit_step(policy, mesh, fsdp, explicit):
    step = mpjax.make_train_step(problem.mlp_loss, problem.optimizer(), policy)
    if not explicit:
        return jax.jit(step, donate_argnums=0)
    shardings = mpjax.state_shardings(problem.initial_state(policy), mesh, fsdp=fsdp)
    return jax.jit(
        step,
        in_shardings=(shardings, mpjax.batch_sharding(mesh)),
        out_shardings=(shardings, None),
        donate_argnums=0,
    )


@pytest.fixture(scope="module")
def compiled():
    """``get(policy, layout) -> (mesh, step)``, each step built once per module."""
    if jax.device_count() < N_DEVICES:
        pytest.skip(f"needs {N_DEVICES} devices (tests/conftest.py forces them)")
    cache = {}

    def get(policy, layout):
        if (policy, layout) not in cache:
            mesh = _mesh(LAYOUTS[layout])
            fsdp = layout == "fsdp"
            cache[policy, layout] = mesh, _jit_step(policy, mesh, fsdp, explicit=fsdp)
        return cache[policy, layout]

    return get


@pytest.fixture(scope="module")
def reference():
    """``get(policy)``: parameters after the one-device run, computed once."""
    cache = {}

    def get(policy):
        if policy not in cache:
            cache[policy] = problem.reference_params(policy)
        return cache[policy]

    return get


def _train(mesh, step, state, n_steps):
    for i in range(n_steps):
        state, metrics = step(state, mpjax.shard_batch(problem.global_batch(i), mesh))
    return state, metrics


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(
    "policy", [POLICY, pytest.param("mixed_bfloat16", marks=pytest.mark.slow)]
)
def test_data_parallel_steps_match_one_device_run(compiled, reference, policy, layout):
    mesh, step = compiled(policy, layout)
    initial = problem.initial_state(policy)
    state = mpjax.shard_state(initial, mesh, fsdp=layout == "fsdp")
    state, metrics = _train(mesh, step, state, problem.N_STEPS)

    assert not bool(metrics["skipped"])
    assert int(state.step) == problem.N_STEPS
    assert float(mpjax.get_loss_scale(state.opt_state)) == 2.0**12
    problem.assert_close_to_reference(
        jax.device_get(state.params), reference(policy), initial.params
    )


@pytest.mark.parametrize("layout", LAYOUTS)
def test_overflow_in_one_shard_skips_on_every_device(compiled, layout):
    mesh, step = compiled(POLICY, layout)
    initial = problem.initial_state(POLICY)
    state, _ = _train(
        mesh, step, mpjax.shard_state(initial, mesh, fsdp=layout == "fsdp"), 1
    )
    before = jax.device_get(state)
    # Inf in the rows of the second device only.
    half = problem.BATCH // N_DEVICES
    bad = mpjax.shard_batch(
        problem.overflowing(problem.global_batch(1), slice(half, None)), mesh
    )
    shards = sorted(bad["x"].addressable_shards, key=lambda s: s.index[0].start or 0)
    assert np.isfinite(np.asarray(shards[0].data)).all()
    assert not np.isfinite(np.asarray(shards[1].data)).all()

    new, metrics = step(state, bad)

    assert bool(metrics["skipped"])
    assert metrics["skipped"].sharding.is_fully_replicated
    chex.assert_trees_all_equal(jax.device_get(new.params), before.params)
    scale = mpjax.get_loss_scale(new.opt_state)
    skipped = mpjax.get_skipped_steps(new.opt_state)
    for leaf, expected in ((scale, 2.0**11), (skipped, 1)):
        assert leaf.sharding.is_fully_replicated
        assert [s.data.item() for s in leaf.addressable_shards] == [expected] * 2
    # Every device kept its own (replicated or FSDP) part of the old parameters.
    for leaf, old in zip(
        jax.tree.leaves(new.params), jax.tree.leaves(before.params), strict=True
    ):
        for shard in leaf.addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data), old[shard.index])
    assert int(new.step) == 2


@pytest.mark.parametrize(
    "make",
    [
        lambda inner: mpjax.dynamic_loss_scaling(inner, init_scale=8.0),
        lambda inner: mpjax.static_loss_scaling(inner, 8.0),
        mpjax.no_loss_scaling,
    ],
    ids=["dynamic", "static", "none"],
)
def test_finiteness_check_reduces_over_fsdp_sharded_gradients(make):
    # With FSDP the gradients reach the loss scaler sharded; an Inf in the shard
    # of one device must still make both devices reject the update.
    mesh = _mesh(AxisType.Auto)
    opt = make(optax.sgd(1.0))
    params = mpjax.shard_state({"w": jnp.ones(8)}, mesh, fsdp=True)
    state = mpjax.shard_state(opt.init(params), mesh, fsdp=True)
    grads = mpjax.shard_state({"w": jnp.ones(8).at[7].set(jnp.inf)}, mesh, fsdp=True)
    assert np.isfinite(np.asarray(grads["w"].addressable_shards[0].data)).all()

    updates, new = jax.jit(opt.update)(grads, state, params)

    assert grads["w"].sharding.spec == PartitionSpec("data")
    for shard in updates["w"].addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), np.zeros(4))
    for leaf in (mpjax.get_skipped_steps(new), mpjax.get_loss_scale(new)):
        assert leaf.sharding.is_fully_replicated
    assert [s.data.item() for s in mpjax.get_skipped_steps(new).addressable_shards] == [
        1,
        1,
    ]
    if isinstance(new, mpjax.DynamicLossScaleState):
        assert float(new.scale) == 4.0


# Parameter layouts of the MLP (6x16, 16x8, 8x1 weights; 16, 8, 1 biases) on 2
# devices: FSDP splits the largest dimension divisible by 2, and replicates the
# last bias, which has none.
_FSDP_SPECS = {
    "w": (PartitionSpec(None, "data"), PartitionSpec("data"), PartitionSpec("data")),
    "b": (PartitionSpec("data"), PartitionSpec("data"), PartitionSpec()),
}


def _assert_documented_layout(mesh, layout, step):
    """One step from a placed state; checks the shardings before and after."""
    fsdp = layout == "fsdp"
    initial = problem.initial_state(POLICY)
    state = mpjax.shard_state(initial, mesh, fsdp=fsdp)
    placed = [(leaf.sharding, leaf.ndim) for leaf in jax.tree.leaves(state)]
    state, metrics = step(state, mpjax.shard_batch(problem.global_batch(0), mesh))

    for i in range(3):
        for name in ("w", "b"):
            leaf = state.params[f"layer{i}"][name]
            spec = _FSDP_SPECS[name][i] if fsdp else PartitionSpec()
            assert leaf.sharding.is_equivalent_to(NamedSharding(mesh, spec), leaf.ndim)
    returned = [(leaf.sharding, leaf.ndim) for leaf in jax.tree.leaves(state)]
    expected = jax.tree.leaves(mpjax.state_shardings(initial, mesh, fsdp=fsdp))
    for got in (placed, returned):  # by shard_state, then by the step
        assert len(got) == len(expected)
        for (sharding, ndim), want in zip(got, expected, strict=True):
            assert sharding.is_equivalent_to(want, ndim)
    scalars = (state.step, mpjax.get_loss_scale(state.opt_state), *metrics.values())
    for scalar in scalars:
        assert scalar.sharding.is_fully_replicated
        assert scalar.sharding.mesh.shape == mesh.shape


@pytest.mark.parametrize("layout", LAYOUTS)
def test_output_shardings_are_as_documented(compiled, layout):
    mesh, step = compiled(POLICY, layout)
    _assert_documented_layout(mesh, layout, step)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("layout", "explicit"), [("replicated", True), ("fsdp", False)]
)
def test_either_jit_style_gives_the_documented_layout(layout, explicit):
    mesh = _mesh(LAYOUTS[layout])
    step = _jit_step(POLICY, mesh, layout == "fsdp", explicit=explicit)
    _assert_documented_layout(mesh, layout, step)


def test_fsdp_splits_the_largest_divisible_dimension_or_replicates():
    mesh = _mesh(AxisType.Auto)
    tree = {
        "wide": jnp.zeros((6, 16)),  # 16 is the largest divisible dimension
        "tie": jnp.zeros((4, 4)),  # the first among equals
        "odd": jnp.zeros((3, 5)),  # nothing divisible: replicated
        "one": jnp.zeros((1,)),  # smaller than the axis: replicated
        "scalar": jnp.zeros(()),
        "count": jnp.zeros((), jnp.int32),
    }
    specs = {k: s.spec for k, s in mpjax.state_shardings(tree, mesh, fsdp=True).items()}
    assert specs["wide"] == PartitionSpec(None, "data")
    assert specs["tie"] == PartitionSpec("data")
    for name in ("odd", "one", "scalar", "count"):
        assert specs[name] == PartitionSpec(), name
    replicated = mpjax.state_shardings(tree, mesh)
    assert all(s.is_fully_replicated for s in jax.tree.leaves(replicated))


def test_shard_state_copies_so_donation_keeps_the_input():
    mesh = _mesh(None)
    params = {"w": jnp.ones((4, 2))}
    placed = mpjax.shard_state(params, mesh)
    jax.jit(lambda p: jax.tree.map(lambda x: x + 1, p), donate_argnums=0)(placed)
    assert not params["w"].is_deleted()
    np.testing.assert_array_equal(np.asarray(params["w"]), np.ones((4, 2)))


def test_shard_batch_splits_the_leading_axis():
    mesh = _mesh(None)
    batch = {"x": jnp.arange(12.0).reshape(6, 2), "y": jnp.arange(6)}
    placed = mpjax.shard_batch(batch, mesh)
    for name, leaf in placed.items():
        assert leaf.sharding.is_equivalent_to(mpjax.batch_sharding(mesh), leaf.ndim)
        assert [s.data.shape[0] for s in leaf.addressable_shards] == [3, 3]
        np.testing.assert_array_equal(np.asarray(leaf), np.asarray(batch[name]))


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (
            lambda m: mpjax.shard_batch({"x": jnp.ones((3, 2))}, m),
            ValueError,
            r"batch leaf \['x'\] has leading size 3, not a multiple of the 2 devices",
        ),
        (
            lambda m: mpjax.shard_batch({"x": jnp.ones(())}, m),
            ValueError,
            r"batch leaf \['x'\] is a scalar",
        ),
        (
            lambda m: mpjax.shard_batch([1.0, 2.0], m),
            TypeError,
            r"batch leaf \[0\] is a float",
        ),
        (
            lambda m: mpjax.shard_batch(jnp.ones(4), m, "batch"),
            ValueError,
            r"axis 'batch' is not an axis of the mesh, whose axes are \('data',\)",
        ),
        (
            lambda m: mpjax.shard_state(jnp.ones(4), m, fsdp=True),
            ValueError,
            r"fsdp=True needs the mesh axis 'data' to be of type AxisType.Auto",
        ),
        (
            lambda m: mpjax.shard_state(jnp.ones(4), m, fsdp=1),
            TypeError,
            r"fsdp must be a bool, got int 1",
        ),
        (
            lambda m: mpjax.state_shardings({"lr": 0.1}, m),
            TypeError,
            r"state leaf \['lr'\] is a float",
        ),
        (
            lambda m: mpjax.batch_sharding(jax.devices(), "data"),
            TypeError,
            r"mesh must be a jax.sharding.Mesh, got list",
        ),
    ],
)
def test_bad_arguments_raise_before_placing(call, error, match):
    with pytest.raises(error, match=match):
        call(_mesh(None))


def test_docstring_examples_run():
    result = doctest.testmod(_parallel)
    assert result.attempted >= 10 and result.failed == 0
