"""Runs: the driver (:func:`lbm_jax.run`, its health check and statistics), the
loop that advances a state and samples it on the device, stop criteria and
checkpoints.

The public names are re-exported by :mod:`lbm_jax`.
"""
