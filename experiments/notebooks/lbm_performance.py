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
# # LBM performance and the memory-bandwidth roofline
#
# Million lattice updates per second (MLUPs) per lattice, storage policy and grid size,
# bytes moved per cell, and the fraction of the bandwidth roofline measured in the same
# run. The same code runs as `python -m experiments lbm_performance`; with `--full` on a
# GPU it is compared with FluidX3D's published H200 figures.
#
# Results go to `results/lbm_performance/` in the directory the notebook runs in, as for
# the command line (the previous run is kept as `lbm_performance.prev`).
# `MPJAX_EXPERIMENTS_OUT=<dir>` writes them to `<dir>/lbm_performance/` instead;
# `MPJAX_EXPERIMENTS_FULL=1` runs paper-scale settings (a GPU). To run the notebook
# outside Jupyter (needs the `dev` extra), from the directory for the results:
#
#     jupytext --to ipynb -o lbm_performance.ipynb \
#         <repo>/experiments/notebooks/lbm_performance.py
#     jupyter execute --inplace lbm_performance.ipynb

# %%
import json

from experiments._notebook import run_for_notebook, show_outcome

outcome = run_for_notebook("lbm_performance")
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
