# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Mixed-precision benchmark
#
# Speed, memory and accuracy of `mpjax` precision policies on a small training loop,
# and the dtypes XLA actually compiles (checked through the traced program, not through
# speed). The same code runs as `python -m experiments mixed_precision_bench`. On a CPU,
# XLA upcasts 16-bit matrix products to float32, so expect memory savings, not
# speed-ups; those appear on tensor-core GPUs.
#
# Results go to `results/mixed_precision_bench/` in the directory the notebook runs in,
# as for the command line (the previous run is kept as `mixed_precision_bench.prev`).
# `MPJAX_EXPERIMENTS_OUT=<dir>` writes them to `<dir>/mixed_precision_bench/` instead;
# `MPJAX_EXPERIMENTS_FULL=1` runs paper-scale settings (a GPU). To run the notebook
# outside Jupyter (needs the `dev` extra), from the directory for the results:
#
#     jupytext --to ipynb -o mixed_precision_bench.ipynb \
#         <repo>/experiments/notebooks/mixed_precision_bench.py
#     jupyter execute --inplace mixed_precision_bench.ipynb

# %%
import json

from experiments._notebook import run_for_notebook, show_outcome

outcome = run_for_notebook("mixed_precision_bench")
show_outcome(outcome)

# %% [markdown]
# The provenance of the run: package versions, backend, device, git commit, seed.

# %%
environment = json.loads((outcome.out_dir / "environment.json").read_text())
print(json.dumps(environment, indent=1))

# %% [markdown]
# The report written next to the figures:

# %%
print((outcome.out_dir / "REPORT.md").read_text())
