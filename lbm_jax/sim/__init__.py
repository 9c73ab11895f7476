"""The simulation: :class:`lbm_jax.Simulation`, its validated configuration,
its initial state and read-outs, the domain decomposition over a device mesh,
slab-wise read-outs and observables.

The public names are re-exported by :mod:`lbm_jax`.
"""
