"""One spelling per name across the packages.

A format is named alike wherever one is named (formats, policies, storage), in
any case; the ``backend`` of a simulation is matched in any case like its
``collision`` and ``streaming``; ``shift`` has one default (``None``: on for a
name, a storage policy's own flag) in every entry point; every named registry
lists its names.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import lbm_jax
import mpjax
from lbm_jax.cases import prepare_case, run_case
from mpjax import formats
from mpjax._policy import parse_dtype

# Spellings a user may write -> the format they name (written out, not derived).
SPELLINGS = {
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "BF16": "bfloat16",
    "BFloat16": "bfloat16",
    "float16": "float16",
    "f16": "float16",
    "fp16": "float16",
    "float32": "float32",
    "f32": "float32",
    "FP32": "float32",
}
# The storage policy each of those formats is stored in.
STORAGE_OF = {
    "bfloat16": "FP32/bfloat16",
    "float16": "FP32/FP16",
    "float32": "FP32/FP32",
}


@pytest.mark.parametrize("spelling", list(SPELLINGS))
def test_a_format_is_named_alike_in_formats_policies_and_storage(spelling):
    name = SPELLINGS[spelling]
    assert formats.get_format(spelling).name == name
    assert parse_dtype(spelling) == np.dtype(name)
    assert mpjax.get_policy(spelling).compute_dtype == np.dtype(name)
    assert lbm_jax.get_storage(spelling).name == STORAGE_OF[name]


def test_every_alias_names_a_registered_format():
    aliases = formats.format_aliases()
    assert aliases["bf16"] == "bfloat16"
    for alias, name in aliases.items():
        assert name in formats.list_formats()
        assert formats.get_format(alias) is formats.get_format(name)


def test_storage_accepts_the_name_of_every_stored_format():
    for canonical in lbm_jax.list_storages():
        fmt = lbm_jax.get_storage(canonical).format.name
        assert lbm_jax.get_storage(fmt).name == canonical
        assert lbm_jax.get_storage(fmt.upper()).name == canonical


def test_unknown_names_are_still_refused_with_the_known_ones():
    with pytest.raises(ValueError, match=r"'bf17'.*bfloat16"):
        formats.get_format("bf17")
    with pytest.raises(ValueError, match=r"'bf17'.*FP32/bfloat16.*bfloat16"):
        lbm_jax.get_storage("bf17")


def test_list_policies_names_policies_get_policy_accepts():
    names = mpjax.list_policies()
    assert {"float32", "bfloat16", "float16", "half", "mixed_bfloat16"} <= set(names)
    assert "mixed_float16" in names and "mixed_float32" not in names
    for name in names:
        if "float64" in name:
            continue  # needs 64-bit types
        policy = mpjax.get_policy(name)
        if name.startswith("mixed_"):
            assert policy.param_dtype == np.dtype(np.float32)
            assert policy.compute_dtype.name == name.removeprefix("mixed_")


@pytest.mark.parametrize("spelling", ["XLA", "Xla", " xla "])
def test_simulation_backend_in_any_case(spelling):
    sim = lbm_jax.Simulation("D2Q9", (8, 8), tau=0.8, backend=spelling)
    assert sim.backend == "xla"


def test_shift_has_one_default_everywhere():
    defaults = {
        fn.__name__: inspect.signature(fn).parameters["shift"].default
        for fn in (lbm_jax.Simulation, lbm_jax.get_storage, prepare_case, run_case)
    }
    assert set(defaults.values()) == {None}, defaults


def test_shift_none_is_on_for_a_name_and_a_policys_own_flag():
    assert prepare_case("taylor_green", n=16, storage="fp16s").storage.shift is True
    unshifted = lbm_jax.get_storage("fp16s", shift=False)
    assert prepare_case("taylor_green", n=16, storage=unshifted).storage.shift is False
    assert prepare_case(
        "taylor_green", n=16, storage=unshifted, shift=True
    ).storage.shift
