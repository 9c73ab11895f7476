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
# # The number range of the LBM populations
#
# Every test case (Poiseuille, Taylor-Green, cavity, cylinder, capsule, raindrop; the
# quick scale, the default, runs the first three) runs
# with FP32 storage and DDF-shifting while an `mpjax.RangeProbe` records the exact
# histogram of binary exponents of the stored populations over time, inside the
# compiled run. The study draws them against every 16-bit format's precision and
# reports the share below each minifloat's smallest normal value and each format's
# median rounding error. The same code runs as `python -m experiments number_range`.
#
# Results go to `results/number_range/` in the directory the notebook runs in, as for
# the command line (the previous run is kept as `number_range.prev`).
# `MPJAX_EXPERIMENTS_OUT=<dir>` writes them to `<dir>/number_range/` instead;
# `MPJAX_EXPERIMENTS_FULL=1` runs paper-scale settings (a GPU). To run the notebook
# outside Jupyter (needs the `dev` extra), from the directory for the results:
#
#     jupytext --to ipynb -o number_range.ipynb \
#         <repo>/experiments/notebooks/number_range.py
#     jupyter execute --inplace number_range.ipynb

# %%
import json

from experiments._notebook import run_for_notebook, show_outcome

outcome = run_for_notebook("number_range")
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
