"""The step backends: one vocabulary, one choice, one layout.

A lattice Boltzmann step runs on one of three backends, all keeping the
populations in the layout of ``lbm_jax.step._layout``:

* ``"xla"``: the slab-tiled XLA step (``lbm_jax.step._xla``, in-place
  streaming in ``lbm_jax.step._xla_inplace``), the reference every other
  backend is tested against;
* ``"native"``: the fused C++ CPU step through ``jax.ffi``
  (``lbm_jax.step._native``, built by ``lbm_jax.step._native_build``), with
  its adjoint for reverse mode (``lbm_jax.step._native_adjoint``);
* ``"gpu"``: the fused Pallas GPU step (``lbm_jax.step._gpu``, its in-kernel
  cell arithmetic in ``lbm_jax.step._gpu_cells``).

``"auto"`` runs the fastest that covers a configuration on this machine.
:func:`choose` is the one rule that picks among them for a simulation
(:func:`plan_step`) and a free surface alike.
"""

from lbm_jax.step._backend import (
    BACKENDS,
    Backend,
    Candidate,
    Choice,
    choose,
    parse_backend,
    resolve_alias,
)
from lbm_jax.step._plan import StepPlan, plan_step

__all__ = [
    "BACKENDS",
    "Backend",
    "Candidate",
    "Choice",
    "StepPlan",
    "choose",
    "parse_backend",
    "plan_step",
    "resolve_alias",
]
