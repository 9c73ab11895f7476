"""Bit-exact number formats in pure jax.numpy."""

__all__: list[str] = []
