"""The solver's core: units and input checks, velocity sets, storage policies,
collision operators and boundaries (pure functions and their constants).

Nothing here knows of a grid's decomposition, a backend or a run; every other
part of :mod:`lbm_jax` builds on these modules. The public names are
re-exported by :mod:`lbm_jax`.
"""
