"""The AMP pipeline's tasks: four network archetypes with data and tolerances.

* ``mlp`` - a feed-forward classifier on scikit-learn's 8x8 digits;
* ``eqx_mlp`` - the same classifier written in Equinox (``eqx.nn.MLP``, one example
  at a time, mapped over the batch): the Equinox route of :func:`mpjax.apply_policy`
  and the train step, under the same checks;
* ``unet`` - a U-Net denoising the same digits (seeded Gaussian noise);
* ``bert`` - a BERT-style bidirectional encoder trained by masked language modelling
  on the source text of standard-library modules (15 % of the characters chosen,
  BERT's 80/10/10 replacement rule, loss on the chosen positions only).

Each :class:`Task` states the tolerance within which a mixed-precision run must
reach the float32 held-out loss (and held-out metric, where there is one).
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
from flax import nnx

from experiments import _data, _framework, _models

__all__ = ["SETTINGS", "Metric", "Settings", "Task", "make_tasks"]


@dataclasses.dataclass(frozen=True)
class Settings:
    """Sizes of the tasks at one scale (``bert_*`` for the encoder) and the
    networks the scale trains (each compiles a train step per policy)."""

    steps: int
    batch: int
    mlp_width: int
    unet_channels: int
    unet_levels: int
    bert_steps: int
    bert_dim: int
    bert_heads: int
    bert_layers: int
    bert_length: int
    bert_batch: int
    bert_learning_rate: float
    networks: tuple[str, ...] = ("mlp", "eqx_mlp", "unet", "bert")


#: Settings by scale.
SETTINGS: Mapping[str, Settings] = types.MappingProxyType(
    {
        "tiny": Settings(20, 32, 32, 4, 1, 20, 32, 4, 1, 16, 8, 3e-3),
        # Masked language modelling has few targets per step (15 % of the
        # characters), so the encoder gets more steps than the other networks.
        # the main job: the MLP alone under every policy (each network compiles a
        # train step per policy, about 15 s each for the encoder on a 2-core CPU;
        # the Equinox MLP, the U-Net and the encoder are the standard scale's)
        "quick": Settings(100, 64, 128, 8, 1, 250, 64, 4, 1, 32, 16, 3e-3, ("mlp",)),
        "standard": Settings(150, 128, 128, 8, 1, 400, 64, 4, 1, 32, 32, 3e-3),
        # A GPU: a 3.3-million-parameter encoder on 128-character windows, with a
        # smaller step size for its four blocks (no warm-up schedule).
        "full": Settings(3000, 512, 512, 64, 2, 3000, 256, 4, 4, 128, 64, 1e-3),
    }
)


@dataclasses.dataclass(frozen=True)
class Metric:
    """A held-out metric besides the loss and its tolerance against float32.

    Attributes:
        name: e.g. ``accuracy`` or ``masked-token accuracy``.
        fn: ``fn(model, batch) -> float32 scalar``.
        atol: largest accepted absolute difference from the float32 value.
    """

    name: str
    fn: Callable[[Any, Any], jax.Array]
    atol: float


@dataclasses.dataclass(frozen=True)
class Task:
    """A network, its loss, training batches and held-out evaluation.

    Attributes:
        name: short name (``mlp``, ``eqx_mlp``, ``unet``, ``bert``).
        model: the float32 Flax NNX or Equinox model (never modified).
        loss: ``loss(model, batch) -> float32 scalar``.
        batches: training batches stacked along a leading step axis.
        eval_batch: the held-out set as one batch.
        learning_rate: Adam learning rate.
        rtol: relative tolerance on the held-out loss against float32.
        atol: absolute tolerance on the held-out loss against float32.
        metric: the held-out metric besides the loss, if any.
    """

    name: str
    model: Any
    loss: Callable[[Any, Any], jax.Array]
    batches: tuple[np.ndarray, ...]
    eval_batch: tuple[np.ndarray, ...]
    learning_rate: float
    rtol: float
    atol: float
    metric: Metric | None = None


def _sample(
    split_x: np.ndarray, split_y: np.ndarray, *, steps: int, batch: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Seeded minibatches (with replacement) stacked as ``(steps, batch, ...)``."""
    rng = np.random.default_rng(seed)
    index = rng.integers(0, len(split_x), size=(steps, batch))
    return split_x[index], split_y[index]


def _masked_windows(
    codes: np.ndarray, *, length: int, count: int, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``count`` seeded windows of ``codes``, masked for masked language modelling."""
    windows, _ = _data.char_windows(codes, length=length, count=count, seed=seed)
    return _data.mask_tokens(windows, seed=seed)


def _equinox_mlp(width: int, seed: int) -> Any:
    """The Equinox archetype's float32 model: ``eqx.nn.MLP`` 64 -> 10 with two
    hidden ReLU layers of ``width``, as :class:`experiments._models.MLP`."""
    import equinox as eqx  # the dev extra installs it (pip install 'mpjax[equinox]')

    return eqx.nn.MLP(
        64, 10, width, 2, activation=jax.nn.relu, key=jax.random.key(seed)
    )


def _classifier(name: str, model: Any, digits: Any, s: Settings, seed: int) -> Task:
    """A digit-classification task; an Equinox model (one example at a time) gets
    its loss and accuracy mapped over the batch (:func:`_models.per_example`)."""
    wrap = _models.per_example if not isinstance(model, nnx.Module) else (lambda f: f)
    return Task(
        name,
        model,
        wrap(_models.classification_loss),
        _sample(
            digits.x_train, digits.y_train, steps=s.steps, batch=s.batch, seed=seed
        ),
        (digits.x_test, digits.y_test),
        learning_rate=3e-3,
        rtol=0.10,
        atol=0.02,
        metric=Metric("accuracy", wrap(_models.classification_accuracy), atol=0.03),
    )


def make_tasks(scale: str = "quick", *, seed: int = 0) -> dict[str, Task]:
    """Builds the tasks of a scale (``tiny``, ``quick``, ``standard``, ``full``).

    Args:
        scale: problem size; ``tiny`` is for tests, ``full`` for a GPU.
        seed: seed of the data splits, batch order, masks and initial parameters.

    Returns:
        ``{"mlp": Task, "eqx_mlp": Task, "unet": Task, "bert": Task}``, the scale's
        networks only.
    """
    s = _framework.settings_for(SETTINGS, scale)
    digits = _data.digits(seed=seed)
    noisy = _data.noisy_digits(seed=seed)
    codes = _data.python_text()
    n_eval = int(0.1 * len(codes))
    train_codes, eval_codes = codes[:-n_eval], codes[-n_eval:]
    mlm_train = _masked_windows(
        train_codes, length=s.bert_length, count=s.bert_steps * s.bert_batch, seed=seed
    )
    mlm_eval = _masked_windows(
        eval_codes, length=s.bert_length, count=8 * s.bert_batch, seed=seed + 1
    )
    rngs = nnx.Rngs(seed)
    # Builders, so that only the scale's networks are initialised (each layer's
    # initialiser compiles on first use: seconds per network on a CPU); they run
    # in this order and share ``rngs`` (a network's initial parameters depend on
    # which networks before it the scale trains).
    builders: dict[str, Callable[[], Task]] = {
        "mlp": lambda: _classifier(
            "mlp", _models.MLP(64, s.mlp_width, 10, rngs=rngs), digits, s, seed
        ),
        "eqx_mlp": lambda: _classifier(
            "eqx_mlp", _equinox_mlp(s.mlp_width, seed), digits, s, seed
        ),
        "unet": lambda: Task(
            "unet",
            _models.UNet(s.unet_channels, levels=s.unet_levels, rngs=rngs),
            _models.denoising_loss,
            _sample(
                noisy.x_train, noisy.y_train, steps=s.steps, batch=s.batch, seed=seed
            ),
            (noisy.x_test, noisy.y_test),
            learning_rate=3e-3,
            rtol=0.10,
            atol=0.002,
        ),
        "bert": lambda: Task(
            "bert",
            _models.BertMLM(
                _data.MLM_VOCAB,
                s.bert_dim,
                heads=s.bert_heads,
                layers=s.bert_layers,
                max_length=s.bert_length,
                rngs=rngs,
            ),
            _models.masked_lm_loss,
            tuple(
                a.reshape(s.bert_steps, s.bert_batch, s.bert_length) for a in mlm_train
            ),
            mlm_eval,
            learning_rate=s.bert_learning_rate,
            rtol=0.05,
            atol=0.05,
            metric=Metric(
                "masked-token accuracy", _models.masked_token_accuracy, atol=0.03
            ),
        ),
    }
    return {name: build() for name, build in builders.items() if name in s.networks}
