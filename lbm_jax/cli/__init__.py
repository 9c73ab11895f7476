"""The command line (``python -m lbm_jax``): its parser and its commands (``run``,
``bench``, ``list``, ...). :mod:`lbm_jax.__main__` is the entry point.
"""
