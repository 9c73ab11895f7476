"""lbm_jax: a jit-compiled lattice Boltzmann solver with 16-bit population storage."""

__all__: list[str] = []
