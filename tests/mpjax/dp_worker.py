"""A small MLP problem for the data-parallel tests, and a multi-process worker.

Imported by ``test_data_parallel.py`` and ``test_data_parallel_processes.py`` for
the model, data, one-device reference and tolerance. Run as a script, it is one
process of a multi-process run over localhost CPU collectives (gloo): it joins
``jax.distributed``, trains the MLP data-parallel on a mesh spanning every process
(replicated, then FSDP), takes one step whose batch holds an Inf in the last
process's rows only, and saves what it saw to an ``.npz`` file for the test::

    python tests/mpjax/dp_worker.py PROCESS_ID NUM_PROCESSES PORT OUT.npz
"""

from __future__ import annotations

import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax

import mpjax

SIZES = (6, 16, 8, 1)
BATCH = 8
N_STEPS = 3
LAYOUTS = ("replicated", "fsdp")
WORKER_POLICY = "mixed_float16"
REL_TOL = 0.02


def init_params(key: jax.Array) -> dict:
    """Float32 MLP parameters; the 16- and 8-wide axes split over 2 devices."""
    keys = jax.random.split(key, len(SIZES) - 1)
    return {
        f"layer{i}": {
            "w": jax.random.normal(k, (m, n)) / np.float32(np.sqrt(m)),
            "b": jnp.zeros(n),
        }
        for i, (k, m, n) in enumerate(zip(keys, SIZES[:-1], SIZES[1:], strict=True))
    }


def mlp_loss(params: dict, batch: dict) -> jax.Array:
    h = batch["x"]
    for i in range(len(SIZES) - 1):
        h = h @ params[f"layer{i}"]["w"] + params[f"layer{i}"]["b"][None, :]
        if i < len(SIZES) - 2:
            h = jnp.tanh(h)
    return jnp.mean(jnp.square(h[:, 0] - batch["y"]))


def global_batch(i: int) -> dict:
    """The ``i``-th global batch (the same in every process)."""
    x = jax.random.normal(jax.random.PRNGKey(100 + i), (BATCH, SIZES[0]))
    return {"x": x, "y": jnp.sin(jnp.sum(x, axis=1))}


def take_rows(batch: dict, rows: slice) -> dict:
    return jax.tree.map(lambda leaf: leaf[rows], batch)


def overflowing(batch: dict, rows: slice) -> dict:
    """``batch`` with an Inf in input feature 0 of the given rows."""
    return {**batch, "x": batch["x"].at[rows, 0].set(jnp.inf)}


def optimizer() -> optax.GradientTransformation:
    return mpjax.dynamic_loss_scaling(optax.sgd(0.1), init_scale=2.0**12, period=100)


def initial_state(policy: str) -> mpjax.TrainState:
    return mpjax.TrainState.create(
        init_params(jax.random.PRNGKey(0)), optimizer(), policy=policy
    )


def reference_params(policy: str) -> dict:
    """Parameters after ``N_STEPS`` one-device steps on the global batches."""
    step = jax.jit(mpjax.make_train_step(mlp_loss, optimizer(), policy))
    state = initial_state(policy)
    for i in range(N_STEPS):
        state, _ = step(state, global_batch(i))
    return jax.device_get(state.params)


def assert_close_to_reference(
    params: object, reference: object, initial: object
) -> None:
    """Asserts data-parallel ``params`` equal the one-device ``reference``.

    A data-parallel step sums each shard's gradient in the compute dtype and then
    all-reduces the partial sums, so it rounds differently from the one-device
    step. The tolerance is 2% of the largest parameter change over the run
    (``reference - initial``). Observed with jax 0.10 on CPU: at most 0.13% with
    float16 compute (two devices in one process, or two processes), 0.3% with
    bfloat16, 1e-6 with float32. Training on one shard's rows only, or summing
    instead of averaging over the shards, is off by more than 100%.
    """
    change = max(
        float(np.max(np.abs(np.asarray(r) - np.asarray(p0))))
        for r, p0 in zip(
            jax.tree.leaves(reference), jax.tree.leaves(initial), strict=True
        )
    )
    assert change > 1e-3, "the reference run did not train"
    chex.assert_trees_all_close(params, reference, rtol=0.0, atol=REL_TOL * change)


def _local_rows(sharding: jax.sharding.NamedSharding) -> slice:
    """The rows of a global batch that this process's devices hold."""
    starts = sorted(
        index[0].start or 0
        for index in sharding.addressable_devices_indices_map((BATCH,)).values()
    )
    per_device = BATCH // sharding.mesh.shape["data"]
    return slice(starts[0], starts[-1] + per_device)


def flatten(prefix: str, tree: object) -> dict[str, np.ndarray]:
    """``{prefix + key path: leaf}`` for saving a pytree with ``np.savez``."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {prefix + jax.tree_util.keystr(p): np.asarray(x) for p, x in leaves}


def _gather(prefix: str, tree: object) -> dict[str, np.ndarray]:
    """The global values of a tree of (possibly sharded) global arrays."""
    from jax.experimental import multihost_utils

    return flatten(prefix, multihost_utils.process_allgather(tree, tiled=True))


def main(process_id: int, num_processes: int, port: int, out: str) -> None:
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=num_processes,
        process_id=process_id,
        initialization_timeout=60,
    )
    policy = WORKER_POLICY
    mesh = jax.make_mesh(
        (jax.device_count(),), ("data",), axis_types=(jax.sharding.AxisType.Auto,)
    )
    data = mpjax.batch_sharding(mesh)
    rows = _local_rows(data)
    results: dict[str, np.ndarray] = {
        "process_count": np.asarray(jax.process_count()),
        "rows": np.asarray([rows.start, rows.stop]),
    }
    for layout in LAYOUTS:
        state = mpjax.shard_state(initial_state(policy), mesh, fsdp=layout == "fsdp")
        shardings = mpjax.state_shardings(state, mesh, fsdp=layout == "fsdp")
        step = jax.jit(
            mpjax.make_train_step(mlp_loss, optimizer(), policy),
            in_shardings=(shardings, data),
            out_shardings=(shardings, None),
        )
        for i in range(N_STEPS):
            state, metrics = step(
                state, mpjax.shard_batch(take_rows(global_batch(i), rows), mesh)
            )
        # The Inf goes into the rows of the last process only.
        bad = global_batch(N_STEPS)
        if jax.process_index() == num_processes - 1:
            bad = overflowing(bad, slice(None))
        after, metrics = step(state, mpjax.shard_batch(take_rows(bad, rows), mesh))
        scale = mpjax.get_loss_scale(after.opt_state)
        results |= _gather(f"{layout}/params", state.params)
        results |= _gather(f"{layout}/params_after_overflow", after.params)
        results |= {
            f"{layout}/skipped": np.asarray(metrics["skipped"].addressable_data(0)),
            f"{layout}/scale_before": np.asarray(
                mpjax.get_loss_scale(state.opt_state).addressable_data(0)
            ),
            f"{layout}/scale_after": np.asarray(scale.addressable_data(0)),
            f"{layout}/scale_replicated": np.asarray(
                scale.sharding.is_fully_replicated
            ),
            f"{layout}/skipped_steps": np.asarray(
                mpjax.get_skipped_steps(after.opt_state).addressable_data(0)
            ),
        }
    np.savez(out, **results)
    jax.distributed.shutdown()


if __name__ == "__main__":
    # As in tests/conftest.py: no implicit dtype promotion.
    with jax.numpy_dtype_promotion("strict"):
        main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
