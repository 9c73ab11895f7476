"""mpjax: functional mixed precision for JAX."""

from mpjax import formats
from mpjax._autocast import autocast
from mpjax._autocast_rules import AutocastRules
from mpjax._flax import apply_policy, policy_apply
from mpjax._fp8 import Fp8Config, Fp8Meta, Fp8MetaValue, fp8_loss
from mpjax._fp8_optim import (
    Fp8DelayedScalingState,
    fp8_delayed_scaling,
    update_fp8_meta,
)
from mpjax._loss_scale_readers import get_loss_scale, get_skipped_steps
from mpjax._loss_scaling import (
    DynamicLossScaleState,
    NoLossScaleState,
    StaticLossScaleState,
    dynamic_loss_scaling,
    no_loss_scaling,
    static_loss_scaling,
)
from mpjax._parallel import batch_sharding, shard_batch, shard_state, state_shardings
from mpjax._policy import Policy, get_policy, list_policies
from mpjax._profile import profile, profile_program
from mpjax._profile_report import ProfileReport, RangeFractions, Record
from mpjax._range import RangeProbe
from mpjax._scaled_grad import nnx_value_and_grad, scaled_value_and_grad
from mpjax._train import PrecisionWarning, TrainState, make_train_step

__all__ = [
    "AutocastRules",
    "autocast",
    "Fp8Config",
    "Fp8DelayedScalingState",
    "Fp8Meta",
    "Fp8MetaValue",
    "fp8_delayed_scaling",
    "fp8_loss",
    "update_fp8_meta",
    "DynamicLossScaleState",
    "NoLossScaleState",
    "Policy",
    "PrecisionWarning",
    "ProfileReport",
    "RangeFractions",
    "RangeProbe",
    "Record",
    "StaticLossScaleState",
    "TrainState",
    "apply_policy",
    "batch_sharding",
    "dynamic_loss_scaling",
    "formats",
    "get_loss_scale",
    "get_policy",
    "get_skipped_steps",
    "list_policies",
    "make_train_step",
    "no_loss_scaling",
    "policy_apply",
    "profile",
    "profile_program",
    "nnx_value_and_grad",
    "scaled_value_and_grad",
    "shard_batch",
    "shard_state",
    "state_shardings",
    "static_loss_scaling",
]
