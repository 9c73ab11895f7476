"""Adopting mpjax in a standard Flax NNX training loop takes a few changed lines.

The plain loop below is what an NNX user writes; its bfloat16 and float16 (with
dynamic loss scaling) versions must differ from it in at most 3 and 5 lines, and
all three must train.
"""

from __future__ import annotations

import difflib

import jax
import numpy as np
import pytest

PLAIN = """\
import jax.numpy as jnp
import optax
from flax import nnx


class MLP(nnx.Module):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(8, 32, rngs=rngs)
        self.l2 = nnx.Linear(32, 1, rngs=rngs)

    def __call__(self, x):
        return self.l2(nnx.relu(self.l1(x)))


model = MLP(nnx.Rngs(0))
optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)


def loss_fn(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


@nnx.jit
def train_step(model, optimizer, x, y):
    loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
    optimizer.update(model, grads)
    return loss


losses = [float(train_step(model, optimizer, x, y)) for _ in range(60)]
"""

BFLOAT16 = PLAIN.replace("import optax\n", "import mpjax\nimport optax\n").replace(
    "model = MLP(nnx.Rngs(0))",
    'model = mpjax.apply_policy(MLP(nnx.Rngs(0)), "mixed_bfloat16")',
)

FLOAT16 = (
    PLAIN.replace("import optax\n", "import mpjax\nimport optax\n")
    .replace(
        "model = MLP(nnx.Rngs(0))",
        'model = mpjax.apply_policy(MLP(nnx.Rngs(0)), "mixed_float16")',
    )
    .replace(
        "nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)",
        "nnx.Optimizer(model, mpjax.dynamic_loss_scaling(optax.adam(1e-2)), "
        "wrt=nnx.Param)",
    )
    .replace(
        "nnx.value_and_grad(loss_fn)(model, x, y)",
        "mpjax.nnx_value_and_grad(loss_fn, optimizer)(model, x, y)",
    )
)


def _changed_lines(a: str, b: str) -> int:
    diff = difflib.ndiff(a.splitlines(), b.splitlines())
    return sum(line.startswith("+ ") for line in diff)


def _train(source: str) -> dict:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 8)).astype(np.float32)
    y = np.sum(x[:, :3], axis=1, keepdims=True).astype(np.float32)
    namespace = {"x": x, "y": y}
    exec(source, namespace)
    return namespace


def test_changed_lines_within_the_budget():
    assert _changed_lines(PLAIN, BFLOAT16) <= 3
    assert _changed_lines(PLAIN, FLOAT16) <= 5


@pytest.mark.standard_promotion
def test_each_version_trains_and_float16_keeps_a_loss_scale():
    import mpjax

    runs = {name: _train(src) for name, src in (("f32", PLAIN), ("f16", FLOAT16))}
    runs["bf16"] = _train(BFLOAT16)
    for name, ns in runs.items():
        losses = ns["losses"]
        assert np.all(np.isfinite(losses)), name
        assert losses[-1] < 0.25 * losses[0], (name, losses[0], losses[-1])
    f16 = runs["f16"]
    scale = mpjax.get_loss_scale(f16["optimizer"])
    assert isinstance(scale, jax.Array) and float(scale) >= 1.0
    kernel = f16["model"].l1.kernel[...]
    assert kernel.dtype == np.float32  # float32 master weights
    assert runs["f16"]["losses"][-1] < 2.0 * runs["f32"]["losses"][-1] + 1e-3


def test_nnx_value_and_grad_refuses_a_non_optimizer():
    import mpjax

    with pytest.raises(TypeError, match="nnx.Optimizer"):
        mpjax.nnx_value_and_grad(lambda m: m, object())


@pytest.mark.standard_promotion
def test_guide_nnx_example_runs(capsys):
    from tests._docs import DOCS, block_after

    code = block_after(DOCS / "mixed_precision/flax.md", "## Flax NNX training loop")
    assert code.count("# changed") == 4
    exec(code, {})
    assert capsys.readouterr().out.strip() == "True True"
