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
# # LBM accuracy of 16-bit population storage
#
# Poiseuille flow, Taylor-Green decay, the lid-driven cavity (against Ghia et al. 1982)
# and the Karman vortex street, for every storage policy of Lehmann et al. (2022), with
# and without DDF-shifting (the quick scale, the default, runs a few of them and no
# cylinder): errors against the analytic or published reference and
# against the reference run (FP64/FP64, or FP32/FP32 where a case has no FP64 run; the
# vortex-shedding cylinders by Strouhal number, drag and lift, since their shedding
# phase drifts between number formats). The same code runs as
# `python -m experiments lbm_accuracy`.
#
# Results go to `results/lbm_accuracy/` in the directory the notebook runs in, as for
# the command line (the previous run is kept as `lbm_accuracy.prev`).
# `MPJAX_EXPERIMENTS_OUT=<dir>` writes them to `<dir>/lbm_accuracy/` instead;
# `MPJAX_EXPERIMENTS_FULL=1` runs paper-scale settings (a GPU). To run the notebook
# outside Jupyter (needs the `dev` extra), from the directory for the results:
#
#     jupytext --to ipynb -o lbm_accuracy.ipynb \
#         <repo>/experiments/notebooks/lbm_accuracy.py
#     jupyter execute --inplace lbm_accuracy.ipynb

# %%
import json

from experiments._notebook import run_for_notebook, show_outcome

outcome = run_for_notebook("lbm_accuracy")
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
