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
# # A capsule in shear flow, per storage format
#
# The immersed-boundary capsule (Skalak membrane) relaxing in linear shear flow, run
# with FP64, FP32 and every DDF-shifted 16-bit storage format: the Taylor deformation
# D(t) per format, its deviation from FP64, the error against small-deformation theory,
# and the cost of the immersed-boundary part of a step. The same code runs as
# `python -m experiments lbm_capsule`; `--full` runs the benchmark's sizes and the
# radius-convergence study (r = 4, 6, 8, 12; Skalak and neo-Hookean; Ca 0.01-0.05),
# whose errors against theory must fall with r and meet 5 % at the default r = 12.
#
# Results go to `results/lbm_capsule/` in the directory the notebook runs in, as for the
# command line (the previous run is kept as `lbm_capsule.prev`).
# `MPJAX_EXPERIMENTS_OUT=<dir>` writes them to `<dir>/lbm_capsule/` instead;
# `MPJAX_EXPERIMENTS_FULL=1` runs paper-scale settings (a GPU). To run the notebook
# outside Jupyter (needs the `dev` extra), from the directory for the results:
#
#     jupytext --to ipynb -o lbm_capsule.ipynb \
#         <repo>/experiments/notebooks/lbm_capsule.py
#     jupyter execute --inplace lbm_capsule.ipynb

# %%
import json

from experiments._notebook import run_for_notebook, show_outcome

outcome = run_for_notebook("lbm_capsule")
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
