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
# # Free-surface test systems (the raindrop), per storage format
#
# The volume-of-fluid cases run with FP32/FP32, FP32/FP16S and FP32/FP16C storage
# (DDF-shifted): the paper's raindrop (crown radius and height, cavity depth, droplets,
# mass drift, and the fill-level difference to FP32 over time), the static drop
# (Laplace law, spurious currents) and the capillary wave (frequency and damping
# against Lamb's normal mode). The same code runs as
# `python -m experiments lbm_raindrop`; `--full` runs the paper's resolution.
#
# Results go to `results/lbm_raindrop/` in the directory the notebook runs in, as for
# the command line (the previous run is kept as `lbm_raindrop.prev`).
# `MPJAX_EXPERIMENTS_OUT=<dir>` writes them to `<dir>/lbm_raindrop/` instead;
# `MPJAX_EXPERIMENTS_FULL=1` runs paper-scale settings (a GPU). To run the notebook
# outside Jupyter (needs the `dev` extra), from the directory for the results:
#
#     jupytext --to ipynb -o lbm_raindrop.ipynb \
#         <repo>/experiments/notebooks/lbm_raindrop.py
#     jupyter execute --inplace lbm_raindrop.ipynb

# %%
import json

from experiments._notebook import run_for_notebook, show_outcome

outcome = run_for_notebook("lbm_raindrop")
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
