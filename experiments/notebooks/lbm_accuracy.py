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
# and without DDF-shifting: errors against the analytic or published reference and
# against the FP64/FP64 run. The same code runs as `python -m experiments lbm_accuracy`.
#
# Environment variables: `MPJAX_EXPERIMENTS_FULL=1` for paper-scale settings (a GPU),
# `MPJAX_EXPERIMENTS_OUT=<dir>` to write the results somewhere other than
# `experiments/results/`.

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
