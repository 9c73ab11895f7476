"""Checkpoints of the run driver: atomic files, resume bit for bit, refusals."""

import errno
import json
import os
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lbm_jax
from lbm_jax import Checkpoint, Simulation, run
from lbm_jax.io import _files, _transfer
from lbm_jax.runs._checkpoint import source_files


@pytest.fixture(scope="module")
def sim():
    return Simulation("D2Q9", (16, 12), tau=0.6, storage="fp16s")


def _start(sim):
    rng = np.random.default_rng(3)
    return sim.init(u=0.03 * rng.standard_normal((2, *sim.shape)))


def _observe(sim):
    return lambda s: {"ux": lbm_jax.velocity(sim, s)[0, 3], "t": s.t}


class _Interrupt(Exception):
    pass


def _interrupt(state):
    raise _Interrupt


def _interrupt_at(step):
    def callback(state):
        if int(state.t) == step:
            raise _Interrupt

    return callback


def test_checkpoints_are_written_and_pruned(sim, tmp_path):
    policy = Checkpoint(tmp_path / "ck", every=20, keep=3, metadata={"case": "box"})
    result = run(sim, _start(sim), 90, checkpoint=policy)
    names = [p.name for p in policy.files()]
    assert names == [
        "step_0000000060.npz",
        "step_0000000080.npz",
        "step_0000000090.npz",
    ]
    _, meta = lbm_jax.load_state(policy.files()[-1])
    assert meta["user"] == {"case": "box"}
    assert meta["run"]["done"] == 90 and meta["run"]["t0"] == 0
    assert not list((tmp_path / "ck").glob("*.tmp"))
    assert result.stats.resumed_from is None


def test_interrupted_run_resumes_bit_for_bit_with_its_samples(sim, tmp_path):
    straight = run(sim, _start(sim), 100, observe=_observe(sim), sample_every=10)
    policy = Checkpoint(tmp_path, every=20, metadata={"run": 1})
    with pytest.raises(_Interrupt):
        run(
            sim,
            _start(sim),
            100,
            observe=_observe(sim),
            sample_every=10,
            checkpoint=policy,
            callback=_interrupt_at(60),
            callback_every=30,
        )
    assert policy.files()[-1].name == "step_0000000060.npz"
    resumed = run(
        sim, _start(sim), 100, observe=_observe(sim), sample_every=10, checkpoint=policy
    )
    assert resumed.stats.resumed_from == 60 and resumed.stats.steps == 40
    chex.assert_trees_all_equal(resumed.state, straight.state)
    np.testing.assert_array_equal(resumed.samples.steps, straight.samples.steps)
    chex.assert_trees_all_equal(resumed.samples.values, straight.samples.values)


def test_steady_stop_resumes_with_its_history(tmp_path):
    cell_type = np.zeros((4, 18), np.int8)
    cell_type[:, [0, -1]] = int(lbm_jax.CellType.SOLID)
    sim = Simulation("D2Q9", (4, 18), tau=1.0, force=(1e-5, 0.0), cell_type=cell_type)

    def energy(s):
        return jnp.sum(lbm_jax.velocity(sim, s) ** 2)

    kwargs = dict(observe=energy, sample_every=50, stop=lbm_jax.steady(1e-3), window=2)
    straight = run(sim, sim.init(), 100_000, **kwargs)
    policy = Checkpoint(tmp_path, every=500)
    with pytest.raises(_Interrupt):
        run(
            sim,
            sim.init(),
            100_000,
            checkpoint=policy,
            callback=_interrupt_at(1000),
            callback_every=1000,
            **kwargs,
        )
    resumed = run(sim, sim.init(), 100_000, checkpoint=policy, **kwargs)
    assert resumed.stats.resumed_from == 1000 and resumed.stats.stopped
    assert int(resumed.state.t) == int(straight.state.t) > 1000
    chex.assert_trees_all_equal(resumed.state, straight.state)
    # a finished run resumes to its end at once
    again = run(sim, sim.init(), 100_000, checkpoint=policy, **kwargs)
    assert again.stats.steps == 0 and again.stats.stopped


def _edit_header(path, edit):
    """Rewrite a checkpoint with its header changed by ``edit(header)``."""
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    header = json.loads(arrays["header"].tobytes())
    edit(header)
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), np.uint8)
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)


#: Ways a checkpoint file becomes unreadable.
DAMAGES = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[:-100]),
    "foreign format": lambda p: _edit_header(
        p, lambda h: h.update(format="lbm_jax.checkpoint/2")
    ),
    "header without leaves": lambda p: _edit_header(p, lambda h: h.pop("leaves")),
    "wrong leaf shape": lambda p: _edit_header(
        p, lambda h: h["leaves"][0].update(shape=[3, 1])
    ),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_unreadable_newest_checkpoint_falls_back_to_the_previous(sim, tmp_path, damage):
    straight = run(sim, _start(sim), 80).state
    policy = Checkpoint(tmp_path, every=20)
    with pytest.raises(_Interrupt):
        run(
            sim,
            _start(sim),
            80,
            checkpoint=policy,
            callback=_interrupt_at(60),
            callback_every=60,
        )
    newest = policy.files()[-1]
    DAMAGES[damage](newest)
    with pytest.warns(RuntimeWarning, match=r"Skipping checkpoint step_0000000060"):
        resumed = run(sim, _start(sim), 80, checkpoint=policy)
    assert resumed.stats.resumed_from == 40
    chex.assert_trees_all_equal(resumed.state, straight)


def test_resume_refuses_another_runs_checkpoint(sim, tmp_path):
    run(sim, _start(sim), 40, checkpoint=Checkpoint(tmp_path, 20, metadata={"n": 16}))
    other = Checkpoint(tmp_path, 20, metadata={"n": 32})
    with pytest.raises(ValueError, match=r"another run: n was 16, now 32"):
        run(sim, _start(sim), 40, checkpoint=other)
    same = Checkpoint(tmp_path, 20, metadata={"n": 16})
    with pytest.raises(ValueError, match="sample_every was 0, now 5"):
        run(
            sim,
            _start(sim),
            40,
            checkpoint=same,
            observe=lambda s: jnp.sum(s.f),
            sample_every=5,
        )
    for path in same.files():
        path.write_bytes(b"not a checkpoint")
    with pytest.warns(RuntimeWarning), pytest.raises(ValueError, match="readable"):
        run(sim, _start(sim), 40, checkpoint=same)


def test_a_failed_save_leaves_no_partial_file(sim, tmp_path, monkeypatch):
    write_npy = _files.write_npy
    calls = []

    def full(*args, **kwargs):  # the disk fills up after the first leaf
        calls.append(args[1])
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return write_npy(*args, **kwargs)

    monkeypatch.setattr(_files, "write_npy", full)
    with pytest.raises(OSError, match="No space left on device"):
        run(sim, _start(sim), 40, checkpoint=Checkpoint(tmp_path, every=20))
    assert calls == ["leaf_0", "leaf_1"]
    assert list(tmp_path.iterdir()) == []


def test_run_refuses_checkpoints_past_the_steps_asked_for(sim, tmp_path):
    policy = Checkpoint(tmp_path, every=50)
    run(sim, _start(sim), 100, checkpoint=policy)
    with pytest.raises(
        lbm_jax.ResumeError, match=r"at step 100, past the 30 steps asked for"
    ):
        run(sim, _start(sim), 30, checkpoint=policy)
    again = run(sim, _start(sim), 100, checkpoint=policy)
    assert again.stats.resumed_from == 100 and int(again.state.t) == 100


class _Marked(NamedTuple):
    fluid: lbm_jax.LBMState
    marker: jax.Array


def test_coupled_state_round_trips_through_a_checkpoint(sim, tmp_path):
    def step(s):
        fluid = sim.step(s.fluid)
        return _Marked(fluid, s.marker + lbm_jax.velocity(sim, fluid)[:, 4, 4])

    start = _Marked(_start(sim), jnp.array([4.0, 4.0]))
    straight = run(step, start, 30).state
    policy = Checkpoint(tmp_path, every=10)
    with pytest.raises(_Interrupt):
        run(
            step,
            _Marked(_start(sim), jnp.array([4.0, 4.0])),
            30,
            checkpoint=policy,
            callback=_interrupt,
            callback_every=20,
        )
    resumed = run(
        step, _Marked(_start(sim), jnp.array([4.0, 4.0])), 30, checkpoint=policy
    )
    assert resumed.stats.resumed_from == 20
    chex.assert_trees_all_equal(resumed.state, straight)


def test_checkpoint_policy_validation(tmp_path):
    with pytest.raises(ValueError, match="every must be at least 1"):
        Checkpoint(tmp_path, 0)
    with pytest.raises(ValueError, match="keep must be at least 1"):
        Checkpoint(tmp_path, 5, keep=0)
    with pytest.raises(TypeError, match="JSON-serialisable"):
        Checkpoint(tmp_path, 5, metadata={"x": object()})
    with pytest.raises(TypeError, match="lbm_jax.Checkpoint"):
        run(lambda s: s, jnp.zeros(2), 3, checkpoint=str(tmp_path))
    version = lbm_jax.code_version()
    assert version.count("+") == 1 and len(version.split("+")[1]) == 12


def test_code_version_covers_the_native_sources():
    # a change to the C++ steps changes results as much as one to the Python
    names = {f.name for f in source_files()}
    assert {"lbm_step.cc", "lbm_free_surface.cc", "lbm_codecs.h"} <= names
    assert {"_checkpoint.py", "_policy.py"} <= names


def test_split_run_resumes_bit_for_bit_on_its_devices(tmp_path, monkeypatch):
    # checkpoints stream slab by slab, and a resumed split state stays split
    monkeypatch.setattr(_transfer, "HOST_CHUNK_BYTES", 256)
    split = Simulation("D2Q9", (16, 12), tau=0.6, storage="fp16s", devices=2)
    policy = Checkpoint(tmp_path / "ck", every=3)
    with pytest.raises(_Interrupt):
        run(
            split,
            _start(split),
            9,
            checkpoint=policy,
            callback=_interrupt_at(6),
            callback_every=3,
        )
    resumed = run(split, _start(split), 9, checkpoint=policy)
    assert resumed.stats.resumed_from == 6
    whole = run(split, _start(split), 9)
    f = resumed.state.f
    np.testing.assert_array_equal(np.asarray(f), np.asarray(whole.state.f))
    assert f.sharding.is_equivalent_to(whole.state.f.sharding, f.ndim)
    assert len(f.sharding.device_set) == 2
