"""Data-parallel placement of a train state and its batches on a device mesh.

:func:`mpjax.make_train_step` needs no change to run data-parallel: place the
state and the batch with the helpers below and ``jax.jit`` the step as usual. The
step is written in JAX's global view: the loss function sees the whole, global
batch (a mean is over every shard), the compiler all-reduces the gradients, and
the loss scaler's finiteness check (``jnp.all(jnp.isfinite(g))`` over every
gradient leaf) is a reduction over the global gradient, sharded or not. One
non-finite value in any shard makes every device skip the step and back off the
scale, and the loss-scale state stays replicated.

* :func:`shard_batch` splits the leading (batch) axis of every leaf over one mesh
  axis. In a multi-process run each process passes its own part of the batch.
* :func:`shard_state` replicates the state, or with ``fsdp=True`` shards every
  array along its largest dimension divisible by the axis size (FSDP/ZeRO-3
  style); scalars (``step``, the loss scale, its counters, optimizer step
  counts) are always replicated, so every device holds the same loss-scale
  state.
* :func:`state_shardings` and :func:`batch_sharding` return the same layouts as
  :class:`jax.sharding.NamedSharding` objects for ``jax.jit``'s
  ``in_shardings``/``out_shardings``.

Usage (``params``, ``opt``, ``loss_fn``, ``batches`` defined as for a
one-device run)::

    mesh = jax.make_mesh((jax.device_count(),), ("data",))
    state = mpjax.shard_state(mpjax.TrainState.create(params, opt), mesh)
    step = jax.jit(mpjax.make_train_step(loss_fn, opt, "mixed_float16"),
                   donate_argnums=0)  # sharding propagation keeps the layout
    for batch in batches:
        state, metrics = step(state, mpjax.shard_batch(batch, mesh))

To pin the layout, pass ``in_shardings=(shardings, mpjax.batch_sharding(mesh))``
and ``out_shardings=(shardings, None)`` to ``jax.jit``, with ``shardings =
mpjax.state_shardings(state, mesh)``. For FSDP pass ``fsdp=True`` to both
``shard_state`` and ``state_shardings``, on a mesh made with
``axis_types=(jax.sharding.AxisType.Auto,)``.

The same code runs in one process with several devices and under
``jax.distributed.initialize`` with one mesh spanning several processes.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

__all__ = ["batch_sharding", "shard_batch", "shard_state", "state_shardings"]


# --------------------------------------------------------------------------------
# Argument validation (before anything is placed or compiled).


def _check_mesh_axis(mesh: Any, axis: Any) -> int:
    """Checks ``mesh`` and ``axis``; returns the number of devices along the axis."""
    if not isinstance(mesh, Mesh):
        raise TypeError(
            f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}; build one "
            "with e.g. jax.make_mesh((jax.device_count(),), ('data',))."
        )
    if not isinstance(axis, str) or axis not in mesh.axis_names:
        raise ValueError(
            f"axis {axis!r} is not an axis of the mesh, whose axes are "
            f"{tuple(mesh.axis_names)}; pass one of those names (the data axis)."
        )
    return int(mesh.shape[axis])


def _check_fsdp(fsdp: Any, mesh: Mesh, axis: str) -> bool:
    if not isinstance(fsdp, bool):
        raise TypeError(
            f"fsdp must be a bool, got {type(fsdp).__name__} {fsdp!r}; pass True to "
            "shard the state over the data axis, False to replicate it."
        )
    axis_types = getattr(mesh, "axis_types", None)
    auto = getattr(getattr(jax.sharding, "AxisType", None), "Auto", None)
    if fsdp and axis_types is not None and auto is not None:
        axis_type = dict(zip(mesh.axis_names, axis_types, strict=True))[axis]
        if axis_type != auto:
            raise ValueError(
                f"fsdp=True needs the mesh axis {axis!r} to be of type "
                f"AxisType.Auto, but it is {axis_type}: with explicit sharding, "
                "matmuls between data-sharded activations and FSDP-sharded "
                "weights do not type-check. Build the mesh with "
                f"jax.make_mesh(shape, names, axis_types=(jax.sharding.AxisType."
                "Auto, ...)), or use fsdp=False."
            )
    return fsdp


def _check_array_leaves(tree: Any, what: str) -> list[tuple[Any, Any]]:
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    for path, leaf in leaves:
        if not isinstance(leaf, jax.Array | np.ndarray | np.generic):
            raise TypeError(
                f"{what} leaf {jax.tree_util.keystr(path) or '<root>'} is a "
                f"{type(leaf).__name__} ({leaf!r}); only arrays can be placed on a "
                "mesh. Convert it with jnp.asarray, or keep it out of the "
                f"{what} (e.g. in the loss function's closure)."
            )
    return leaves


def _local_positions(mesh: Mesh, axis: str) -> int:
    """Number of positions along ``axis`` held by this process's devices."""
    dim = mesh.axis_names.index(axis)
    here = jax.process_index()
    positions = {
        index[dim]
        for index, device in np.ndenumerate(mesh.devices)
        if device.process_index == here
    }
    if not positions:
        raise ValueError(
            f"the mesh holds no device of this process (process {here}); build it "
            "from jax.devices() so that it spans every process."
        )
    return len(positions)


# --------------------------------------------------------------------------------
# Shardings.


def batch_sharding(mesh: Mesh, axis: str = "data") -> NamedSharding:
    """The sharding of a batch: leading axis split over ``axis``.

    One sharding serves the whole batch pytree (``jax.jit`` accepts it as a tree
    prefix): every leaf's leading axis is split over the devices along ``axis``
    and its other axes are replicated.

    Args:
      mesh: the device mesh.
      axis: name of the mesh axis that splits the batch.

    Returns:
      ``NamedSharding(mesh, PartitionSpec(axis))``.

    Raises:
      TypeError: if ``mesh`` is not a :class:`jax.sharding.Mesh`.
      ValueError: if ``axis`` is not one of the mesh's axis names.

    >>> mesh = jax.make_mesh((jax.device_count(),), ("data",))
    >>> batch_sharding(mesh).spec == jax.sharding.PartitionSpec("data")
    True
    """
    _check_mesh_axis(mesh, axis)
    return NamedSharding(mesh, PartitionSpec(axis))


def _fsdp_spec(shape: tuple[int, ...], axis: str, size: int) -> PartitionSpec:
    """Splits the largest dimension divisible by ``size`` (the first among equals)."""
    candidates = [d for d, n in enumerate(shape) if n >= size and n % size == 0]
    if not candidates:
        return PartitionSpec()
    dim = max(candidates, key=lambda d: (shape[d], -d))
    return PartitionSpec(*([None] * dim), axis)


def state_shardings(
    state: Any, mesh: Mesh, axis: str = "data", *, fsdp: bool = False
) -> Any:
    """The shardings :func:`shard_state` gives each leaf of ``state``.

    With ``fsdp=False`` every leaf is replicated over the mesh. With
    ``fsdp=True`` every array is split over ``axis`` along its largest dimension
    whose size is a multiple of the axis size (the first such dimension among
    equals); an array with no such dimension, and every scalar, falls back to
    replication (no error: small biases and odd-sized tables simply stay whole).
    The layout depends on the shape alone, so optimizer moments get the layout of
    their parameters, and the scalars of the state (``step``, the loss scale, its
    counter and skip count) are always replicated.

    Args:
      state: a :class:`mpjax.TrainState`, or any pytree of arrays.
      mesh: the device mesh.
      axis: name of the mesh axis for data parallelism.
      fsdp: whether to shard the arrays over ``axis`` instead of replicating
        them. Needs an ``AxisType.Auto`` mesh axis (the compiler then inserts
        the all-gathers and reduce-scatters).

    Returns:
      A pytree of :class:`jax.sharding.NamedSharding` with the structure of
      ``state``, usable as ``in_shardings``/``out_shardings`` of ``jax.jit``.

    Raises:
      TypeError: if ``mesh`` is not a mesh, ``fsdp`` is not a bool or a leaf of
        ``state`` is not an array.
      ValueError: if ``axis`` is not an axis of ``mesh``, or ``fsdp=True`` on an
        axis that is not ``AxisType.Auto``.

    >>> import jax.numpy as jnp
    >>> mesh = jax.make_mesh((jax.device_count(),), ("data",))
    >>> state_shardings({"w": jnp.zeros((8, 3))}, mesh)["w"].is_fully_replicated
    True
    """
    size = _check_mesh_axis(mesh, axis)
    fsdp = _check_fsdp(fsdp, mesh, axis)
    _check_array_leaves(state, "state")

    def sharding(leaf: Any) -> NamedSharding:
        spec = _fsdp_spec(np.shape(leaf), axis, size) if fsdp else PartitionSpec()
        return NamedSharding(mesh, spec)

    return jax.tree.map(sharding, state)


# --------------------------------------------------------------------------------
# Placement.


def shard_batch(batch: Any, mesh: Mesh, axis: str = "data") -> Any:
    """Places a batch on the mesh, its leading axis split over ``axis``.

    In a single process, ``batch`` is the whole (global) batch. When the mesh
    spans several processes (after ``jax.distributed.initialize``), each process
    passes its own, equally sized part of the batch, and the result is one
    global array per leaf whose leading size is the sum over processes
    (:func:`jax.make_array_from_process_local_data`); the parts are laid out in
    the mesh's device order, which a mean loss does not depend on.

    Args:
      batch: a pytree of arrays, each with a leading batch axis.
      mesh: the device mesh.
      axis: name of the mesh axis that splits the batch.

    Returns:
      The batch as global :class:`jax.Array` leaves sharded like
      :func:`batch_sharding`.

    Raises:
      TypeError: if ``mesh`` is not a mesh or a leaf is not an array.
      ValueError: if ``axis`` is not an axis of ``mesh``, a leaf is a scalar, or
        a leaf's leading size is not a multiple of the number of devices along
        ``axis`` (in this process, for a multi-process mesh).

    >>> import jax.numpy as jnp
    >>> mesh = jax.make_mesh((jax.device_count(),), ("data",))
    >>> x = shard_batch({"x": jnp.ones((8, 3))}, mesh)["x"]
    >>> x.shape, x.sharding.spec == jax.sharding.PartitionSpec("data")
    ((8, 3), True)
    """
    sharding = batch_sharding(mesh, axis)
    multi_process = mesh.is_multi_process
    local = _local_positions(mesh, axis) if multi_process else mesh.shape[axis]
    for path, leaf in _check_array_leaves(batch, "batch"):
        name = jax.tree_util.keystr(path) or "<root>"
        shape = np.shape(leaf)
        if not shape:
            raise ValueError(
                f"batch leaf {name} is a scalar; every batch leaf needs a leading "
                f"batch axis to split over {axis!r}. Give it one, or pass the "
                "value to the loss function through its closure."
            )
        if shape[0] % local:
            where = "this process's devices" if multi_process else "devices"
            raise ValueError(
                f"batch leaf {name} has leading size {shape[0]}, not a multiple of "
                f"the {local} {where} along mesh axis {axis!r}; use a batch size "
                f"divisible by {local} (drop or pad the remainder)."
            )
    if not multi_process:
        return jax.device_put(batch, sharding)
    return jax.tree.map(
        lambda leaf: jax.make_array_from_process_local_data(sharding, leaf), batch
    )


def _place(leaf: Any, sharding: NamedSharding) -> jax.Array:
    if not sharding.mesh.is_multi_process:
        # Copy first: device_put may reuse the input buffer for one shard (even
        # with may_alias=False, as of jax 0.10), and donating the placed state
        # to the step would then delete the caller's arrays.
        return jax.device_put(jnp.array(leaf, copy=True), sharding)
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
        return jax.device_put(leaf, sharding)  # already global: reshard
    # A process-local value: go through the host so that device_put builds the
    # global array (it checks that every process passed the same value).
    return jax.device_put(np.asarray(leaf), sharding)


def shard_state(
    state: Any, mesh: Mesh, axis: str = "data", *, fsdp: bool = False
) -> Any:
    """Places a train state on the mesh: replicated, or FSDP-sharded.

    Every leaf goes to the sharding :func:`state_shardings` gives it; the loss
    scale and the other scalars are always replicated. The leaves are copied, so
    donating the result to the step (``donate_argnums=0``) leaves ``state``
    intact. In a multi-process run every process must pass the same state (e.g.
    initialised from the same seed); a mismatch raises.

    Args:
      state: a :class:`mpjax.TrainState`, or any pytree of arrays.
      mesh: the device mesh.
      axis: name of the mesh axis for data parallelism.
      fsdp: whether to shard arrays over ``axis`` (see :func:`state_shardings`,
        including its fallback to replication) instead of replicating them.

    Returns:
      ``state`` with global :class:`jax.Array` leaves.

    Raises:
      TypeError: as :func:`state_shardings`.
      ValueError: as :func:`state_shardings`.

    >>> import jax.numpy as jnp
    >>> import optax
    >>> import mpjax
    >>> mesh = jax.make_mesh((jax.device_count(),), ("data",))
    >>> opt = mpjax.dynamic_loss_scaling(optax.sgd(0.1))
    >>> state = shard_state(mpjax.TrainState.create(jnp.zeros(8), opt), mesh)
    >>> state.opt_state.scale.sharding.is_fully_replicated
    True
    """
    shardings = state_shardings(state, mesh, axis, fsdp=fsdp)
    return jax.tree.map(_place, state, shardings)
