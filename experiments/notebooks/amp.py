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
# # Automatic mixed precision for four network archetypes
#
# A feed-forward net (in Flax NNX and in Equinox), a U-Net-style convolutional net and
# a BERT-style encoder (masked language modelling on Python source) trained under each
# precision policy (`mpjax.apply_policy`, loss scaling as an Optax wrapper): step time,
# compiled and device memory, and accuracy against float32. The same code runs as
# `python -m experiments amp`.
#
# Results go to `results/amp/` in the directory the notebook runs in, as for the command
# line (the previous run is kept as `amp.prev`). `MPJAX_EXPERIMENTS_OUT=<dir>` writes
# them to `<dir>/amp/` instead; `MPJAX_EXPERIMENTS_FULL=1` runs paper-scale settings (a
# GPU). To run the notebook outside Jupyter (needs the `dev` extra), from the directory
# for the results:
#
#     jupytext --to ipynb -o amp.ipynb \
#         <repo>/experiments/notebooks/amp.py
#     jupyter execute --inplace amp.ipynb

# %%
import json

from experiments._notebook import run_for_notebook, show_outcome

outcome = run_for_notebook("amp")
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
