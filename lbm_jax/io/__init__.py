"""Files: states and fields to and from disk (``.npz``, VTK), host transfer slab by
slab, figures, and the output folder of a run (one writer, outputs written as a
set).

The public names are re-exported by :mod:`lbm_jax`.
"""
